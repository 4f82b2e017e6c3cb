"""``storwatch plan``: throughput measured on real mounts (tmpfs, the root disk, an ext4 loop mount) and the plan's
arithmetic. Its figures beside dd's are in bench/plan_vs_dd.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from storwatch.analysis.rpo import daly_interval
from tests.realmounts import loop_ext4_mount, tmpfs_mount

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


@pytest.mark.realpart
def test_plan_measures_tmpfs_root_and_loop_and_leaves_nothing(real_mounts: Enter[Any], tmp_path: Path) -> None:
    """Each mount measured with the bytes asked for (a test file is at most a tenth of the free space), with direct
    I/O where the filesystem takes it, its class and filesystem named, and nothing left behind. How its figures
    compare with dd's is bench/plan_vs_dd.py's to say: a speed ratio moves with the machine's load."""
    tmpfs = real_mounts(tmpfs_mount(tmp_path / "tmpfs", size="1g"))
    loop = real_mounts(loop_ext4_mount(tmp_path / "loop", size_mb=1024, losetup_args=("--direct-io=on",)))
    mounts = (str(tmpfs.mountpoint), str(loop.mountpoint), "/")
    for mp in mounts:
        out = run_plan("--mount", mp, "--size", str(SIZE), "--json")
        assert out.returncode == 0, out.stderr
        (row,) = json.loads(out.stdout)["mounts"]
        assert row["test_bytes"] == SIZE, row
        assert math.isfinite(row["throughput_bytes_per_second"]) and row["throughput_bytes_per_second"] > 0, row
    out = run_plan(*(a for mp in mounts for a in ("--mount", mp)), "--json", "--checkpoint-bytes", "10G")
    assert out.returncode == 0, out.stderr
    rows = {r["mountpoint"]: r for r in json.loads(out.stdout)["mounts"]}
    assert set(rows) == set(mounts)
    assert rows[str(tmpfs.mountpoint)]["durability"] == "volatile"
    assert rows[str(loop.mountpoint)]["fstype"] == "ext4"
    assert all(r["direct_io"] for r in rows.values())
    assert not any(p.name.startswith(".storwatch-plan-") for mp in mounts for p in Path(mp).iterdir())


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
