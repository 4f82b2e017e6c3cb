"""``storwatch plan``: throughput measured on real mounts (tmpfs, an ext4 loop mount) in timed rounds, the checkpoint
size it plans for and where that came from (real torch.save files under the configured roots), and the plan's
arithmetic. No test here holds a throughput, a duration or a ratio to anything: how steady repeated runs are is
bench/plan_spread.py's to say, and how the figures compare with dd's bench/plan_vs_dd.py's (BENCHMARKS.md)."""

from __future__ import annotations

import json
import math
import os
import pty
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from storwatch.analysis.rpo import daly_interval
from storwatch.plan import BLOCK, CPU_BUSY, DEFAULT_CHECKPOINT_BYTES, MIN_SIZE, TierPlan, format_plan
from tests.realmounts import fuse_mount, loop_ext4_mount, tmpfs_mount

T = TypeVar("T")
Enter = Callable[[ContextManager[T]], T]
REPO_ROOT = Path(__file__).resolve().parents[1]
SIZE = 64 << 20


def run_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "storwatch", "plan", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        check=False,
    )


def assert_rounds_add_up(row: dict[str, Any], rounds: int) -> None:
    """A measured row's figures are those of its rounds: as many as asked, the median of them, their spread."""
    rates = row["round_throughputs"]
    assert row["error"] is None and row["rounds"] == rounds == len(rates), row
    assert all(math.isfinite(r) and r > 0 for r in rates), row
    assert row["throughput_bytes_per_second"] == pytest.approx(statistics.median(rates))
    assert row["spread"] == pytest.approx((max(rates) - min(rates)) / statistics.median(rates))
    # each round wrote whole test files, at least one
    assert row["bytes_written"] % row["test_bytes"] == 0 and row["bytes_written"] >= rounds * row["test_bytes"]
    # this kernel has PSI: how busy the CPU was while measuring, as a share of the time
    assert row["cpu_pressure"] is not None and 0 <= row["cpu_pressure"] <= 1, row


@pytest.mark.realpart
def test_plan_measures_tmpfs_and_loop_in_rounds_and_leaves_nothing(real_mounts: Enter[Any], tmp_path: Path) -> None:
    """Each mount measured in the rounds asked for, with test files of the bytes asked for (at most a tenth of the
    free space), with direct I/O where the filesystem takes it, its class and filesystem named, and nothing left
    behind. How steady and how close to dd its figures are is for the benchmarks: a speed moves with the load."""
    tmpfs = real_mounts(tmpfs_mount(tmp_path / "tmpfs", size="1g"))
    loop = real_mounts(loop_ext4_mount(tmp_path / "loop", size_mb=1024, losetup_args=("--direct-io=on",)))
    mounts = (str(tmpfs.mountpoint), str(loop.mountpoint))
    for mp in mounts:
        out = run_plan("--mount", mp, "--size", str(SIZE), "--rounds", "2", "--json")
        assert out.returncode == 0, out.stderr
        (row,) = json.loads(out.stdout)["mounts"]
        assert row["test_bytes"] == SIZE, row
        assert_rounds_add_up(row, 2)
    out = run_plan(
        *(a for mp in mounts for a in ("--mount", mp)), "--rounds", "1", "--json", "--checkpoint-bytes", "10G"
    )
    assert out.returncode == 0, out.stderr
    rows = {r["mountpoint"]: r for r in json.loads(out.stdout)["mounts"]}
    assert set(rows) == set(mounts)
    assert rows[str(tmpfs.mountpoint)]["durability"] == "volatile"
    assert rows[str(loop.mountpoint)]["fstype"] == "ext4"
    assert all(r["direct_io"] for r in rows.values())
    for row in rows.values():
        assert_rounds_add_up(row, 1)
        # sized by itself: whole blocks, at least the smallest test file, at most a tenth of the free space (each
        # mount holds 1 GiB)
        assert row["test_bytes"] % BLOCK == 0 and MIN_SIZE <= row["test_bytes"] <= (1 << 30) // 10, row
    assert not any(p.name.startswith(".storwatch-plan-") for mp in mounts for p in Path(mp).iterdir())


@pytest.mark.realpart
def test_max_seconds_bounds_the_rounds(real_mounts: Enter[Any], tmp_path: Path) -> None:
    """Each round spends at least a second writing, and none starts that would end past --max-seconds: 20 rounds
    asked for within 2.5 s give one or two (at least one is always timed)."""
    tmpfs = real_mounts(tmpfs_mount(tmp_path / "tmpfs", size="256m"))
    out = run_plan("--mount", str(tmpfs.mountpoint), "--rounds", "20", "--max-seconds", "2.5", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["mounts"]
    assert 1 <= row["rounds"] <= 2, row
    assert_rounds_add_up(row, row["rounds"])


def torch_checkpoints(run: Path) -> dict[str, Path]:
    """A run's real torch.save files: two complete ones of different sizes, and a third, larger than both, cut
    short as a save that died on the way (torch's ZIP loses its central directory)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0, CPU wheel)")
    run.mkdir(parents=True)
    files = {"small": run / "ckpt-1.pt", "large": run / "ckpt-2.pt", "cut": run / "ckpt-3.pt"}
    torch.save({"w": torch.zeros(256, 256), "step": 1}, files["small"])
    torch.save({"w": torch.zeros(1024, 1024), "step": 2}, files["large"])
    torch.save({"w": torch.zeros(2048, 1024), "step": 3}, files["cut"])
    with open(files["cut"], "r+b") as fh:
        fh.truncate(6 << 20)
    then = time.time() - 3600  # written an hour ago: settled, nothing writes them any more
    for path in files.values():
        os.utime(path, (then, then))
    return files


def plan_config(tmp_path: Path, roots: list[Path]) -> Path:
    config = tmp_path / "storwatch.yaml"
    config.write_text(
        "kube: {enabled: false}\ngpu: {enabled: false}\n"
        # The configured roots alone: not this machine's own default places (its /home).
        f"checkpoints: {{roots: {json.dumps([str(r) for r in roots])}, kubelet: false, default_roots: false}}\n"
    )
    return config


@pytest.mark.realpart
def test_the_default_size_is_the_largest_complete_checkpoint_and_says_so(
    real_mounts: Enter[Any], tmp_path: Path
) -> None:
    """With checkpoint roots in --config, the plan is for the largest complete checkpoint under them, not for a
    larger one that was cut short; the JSON and the table both say where the size came from."""
    from storwatch.checkpoints import check

    root = tmp_path / "ckpt"
    files = torch_checkpoints(root / "run")
    assert check(str(files["cut"])).verdict == "incomplete"  # the premise: the largest file is no checkpoint
    assert files["cut"].stat().st_size > files["large"].stat().st_size > files["small"].stat().st_size
    config = plan_config(tmp_path, [root])
    tmpfs = real_mounts(tmpfs_mount(tmp_path / "tmpfs", size="256m"))
    common = ("--config", str(config), "--mount", str(tmpfs.mountpoint), "--rounds", "1")

    out = run_plan(*common, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    size = files["large"].stat().st_size
    assert data["checkpoint"]["source"] == "checkpoint"
    assert data["checkpoint"]["bytes"] == size
    assert data["checkpoint"]["path"] == str(files["large"])
    assert data["checkpoint"]["roots"] == [str(root)]
    assert str(files["large"]) in data["checkpoint"]["says"] and "largest complete" in data["checkpoint"]["says"]
    assert [r["checkpoint_bytes"] for r in data["mounts"]] == [size]

    out = run_plan(*common)
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("checkpoint size ") and "largest complete checkpoint" in first, out.stdout
    assert str(files["large"]) in first and str(root) in first and str(files["cut"]) not in first


@pytest.mark.realpart
def test_checkpoint_bytes_overrides_what_the_roots_hold(real_mounts: Enter[Any], tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    torch_checkpoints(root / "run")
    tmpfs = real_mounts(tmpfs_mount(tmp_path / "tmpfs", size="256m"))
    args = ("--config", str(plan_config(tmp_path, [root])), "--mount", str(tmpfs.mountpoint), "--rounds", "1")
    out = run_plan(*args, "--checkpoint-bytes", "3G", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["checkpoint"]["source"], data["checkpoint"]["bytes"]) == ("flag", 3 << 30)
    assert data["checkpoint"]["path"] is None and "from --checkpoint-bytes" in data["checkpoint"]["says"]
    assert [r["checkpoint_bytes"] for r in data["mounts"]] == [3 << 30]
    out = run_plan(*args, "--checkpoint-bytes", "3G")
    assert out.stdout.splitlines()[0] == "checkpoint size 3.0 GiB: from --checkpoint-bytes", out.stdout


@pytest.mark.realpart
def test_without_a_complete_checkpoint_the_default_is_named_as_the_default(
    real_mounts: Enter[Any], tmp_path: Path
) -> None:
    """Roots holding only a cut-short checkpoint, and no roots at all: the plan is for the default size, and says
    it is the default and why."""
    root = tmp_path / "ckpt"
    (root / "run").mkdir(parents=True)
    torch_checkpoints(tmp_path / "elsewhere")
    os.replace(tmp_path / "elsewhere" / "ckpt-3.pt", root / "run" / "ckpt-3.pt")
    tmpfs = real_mounts(tmpfs_mount(tmp_path / "tmpfs", size="256m"))
    for roots, says in (
        ([root], f"checkpoint size 10.0 GiB: default, no complete checkpoint found under {root}"),
        ([], "checkpoint size 10.0 GiB: default, no checkpoint roots to search"),
    ):
        config = plan_config(tmp_path, roots)
        out = run_plan("--config", str(config), "--mount", str(tmpfs.mountpoint), "--rounds", "1", "--json")
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        assert (data["checkpoint"]["source"], data["checkpoint"]["bytes"]) == ("default", DEFAULT_CHECKPOINT_BYTES)
        assert data["checkpoint"]["says"].startswith(says), data["checkpoint"]
        assert data["checkpoint"]["roots"] == [str(r) for r in roots]
        assert [r["checkpoint_bytes"] for r in data["mounts"]] == [DEFAULT_CHECKPOINT_BYTES]
        table = run_plan("--config", str(config), "--mount", str(tmpfs.mountpoint), "--rounds", "1")
        assert table.stdout.startswith(says), table.stdout


def run_on_a_terminal(*args: str) -> tuple[int, str, str]:
    """``storwatch plan`` with its stderr on a pseudo-terminal (stdout a pipe): exit status, stdout, what the
    terminal showed."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "storwatch", "plan", *args],
        stdout=subprocess.PIPE,
        stderr=terminal,
        cwd=REPO_ROOT,
    )
    os.close(terminal)
    shown = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    os.close(controller)
    stdout = proc.stdout.read().decode() if proc.stdout else ""
    return proc.wait(timeout=60), stdout, shown.decode(errors="replace")


@pytest.mark.realpart
def test_progress_is_shown_on_a_terminal_and_not_in_a_pipe(real_mounts: Enter[Any], tmp_path: Path) -> None:
    tmpfs = real_mounts(tmpfs_mount(tmp_path / "tmpfs", size="256m"))
    args = ("--mount", str(tmpfs.mountpoint), "--rounds", "2", "--checkpoint-bytes", "1G")
    rc, stdout, shown = run_on_a_terminal(*args)
    assert rc == 0, (shown, stdout)
    assert f"measuring {tmpfs.mountpoint}: round 1 of 2" in shown and "round 2 of 2" in shown, shown
    assert shown.endswith("\r\x1b[K"), repr(shown[-200:])  # the progress line is cleared before the result
    assert stdout.startswith("checkpoint size 1.0 GiB")
    out = run_plan(*args)
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_the_table_says_when_the_cpu_was_busy_while_measuring() -> None:
    """A figure taken while tasks waited for a CPU is low and moves from run to run: the table says so for that
    mount, and only for it."""
    row = TierPlan("/busy", "ext4", "node", False, 1 << 30, 64 << 20, 0.1, 6.4e8, 5, 3 << 30, (6.4e8,) * 5, 0.0)
    busy, calm = replace(row, cpu_pressure=CPU_BUSY + 0.3), replace(row, mountpoint="/calm", cpu_pressure=0.01)
    text = format_plan([busy, calm, replace(row, mountpoint="/no-psi")], 0.05)
    notes = [line for line in text.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "/busy" in notes[0] and "50%" in notes[0], text


def test_bare_plan_writes_nothing_and_says_how_to_opt_in() -> None:
    out = run_plan()
    assert out.returncode == 2 and "--mount" in out.stderr and "--all" in out.stderr
    assert out.stdout == ""


def test_bad_arguments_are_refused_by_name() -> None:
    for args, word in ((("--size", "1K", "--mount", "/"), "size"), (("--budget", "2", "--mount", "/"), "ratio")):
        out = run_plan(*args)
        assert out.returncode == 2 and word in out.stderr, out.stderr


@pytest.mark.realpart
def test_the_plan_arithmetic_and_what_cannot_be_measured(real_mounts: Enter[Any], tmp_path: Path) -> None:
    small = real_mounts(tmpfs_mount(tmp_path / "small", size="40m"))  # a tenth of it is under 8 MiB
    ro = real_mounts(tmpfs_mount(tmp_path / "ro", size="64m"))
    subprocess.run(["mount", "-o", "remount,ro", str(ro.mountpoint)], check=True, timeout=30)
    ok = real_mounts(tmpfs_mount(tmp_path / "ok", size="512m"))
    out = run_plan(
        "--mount",
        str(ok.mountpoint),
        "--mount",
        str(small.mountpoint),
        "--mount",
        str(ro.mountpoint),
        "--mount",
        str(tmp_path / "not-a-mount"),
        "--size",
        "32M",
        "--checkpoint-bytes",
        "1G",
        "--budget",
        "0.1",
        "--rounds",
        "1",
        "--json",
    )
    assert out.returncode == 1, out.stderr  # some mounts could not be measured
    rows = {r["mountpoint"]: r for r in json.loads(out.stdout)["mounts"]}
    good = rows[str(ok.mountpoint)]
    assert good["error"] is None and good["test_bytes"] == 32 << 20 and good["checkpoint_bytes"] == 1 << 30
    write = (1 << 30) / good["throughput_bytes_per_second"]
    assert good["write_seconds"] == pytest.approx(write)
    assert good["min_interval_seconds"] == pytest.approx(write / 0.1)  # overhead = write / interval <= budget
    assert good["daly_interval_seconds"] == pytest.approx(daly_interval(write, 86_400.0))
    assert rows[str(small.mountpoint)]["error"] == "too little free space to measure"
    assert rows[str(ro.mountpoint)]["error"] == "read-only, stuck or not storage"
    assert rows[str(tmp_path / "not-a-mount")]["error"] == "not a mount"
    assert not any(ok.mountpoint.iterdir())  # its test file and directory are gone


@pytest.mark.realpart
def test_the_mounts_asked_for_are_measured_whatever_hangs_before_them_in_the_table(
    real_mounts: Enter[Any], tmp_path: Path
) -> None:
    """20 hung FUSE mounts listed before the one asked for (more than the statvfs pool's 16 working slots): its
    statvfs goes out first, so it is measured, not called stuck, within plan's one round (a neighbour's hung mounts
    once made this command skip the mount it was asked to measure)."""
    for i in range(20):
        real_mounts(fuse_mount(tmp_path / f"hung{i:02}", block_statfs=True))
    tmpfs = real_mounts(tmpfs_mount(tmp_path / "tmpfs", size="256m"))
    out = run_plan("--mount", str(tmpfs.mountpoint), "--rounds", "1", "--checkpoint-bytes", "1G", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["mounts"]
    assert row["mountpoint"] == str(tmpfs.mountpoint) and row["test_bytes"] > 0, row


def test_every_column_of_the_table_is_explained_under_it() -> None:
    """A reader who meets "SPREAD 11% of 5" or "DALY INTERVAL" finds what it means under the table, with the budget
    and the mean time between failures the figures were worked out for."""
    row = TierPlan("/scratch", "ext4", "node", False, 1 << 30, 64 << 20, 0.1, 6.4e8, 5, 3 << 30, (6.4e8,) * 5, 0.11)
    text = format_plan([row], 0.05, mtbf_seconds=7 * 86400.0)
    header = text.splitlines()[0].split("  ")
    columns = [c.strip() for c in header if c.strip()]
    legend_lines = text.split("\n\n", 1)[1]
    for column in columns:
        if column in ("MOUNTPOINT", "TYPE", "DURABILITY"):
            continue
        assert f"{column}:" in legend_lines, (column, legend_lines)
    assert "MIN INTERVAL (5%): the shortest time between two saves that keeps their write time under 5%" in text
    assert "a mean time between failures of 7 d (checkpoints.mtbf_seconds" in text
