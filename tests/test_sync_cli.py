"""``storwatch sync SRC DEST`` as a user runs it: its exit statuses, its JSON, its progress line on a terminal (a real
pseudo-terminal) and none when not on one, and what the command imports."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from storwatch.sync import MANIFEST_SUFFIX
from tests.builders import sync_checkpoint as make_checkpoint
from tests.builders import sync_tree as tree
from tests.realmounts import fuse_mount, require_root, unmount

REPO_ROOT = Path(__file__).resolve().parents[1]
WAIT = 120.0


def storwatch(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "storwatch", *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        cwd=cwd or REPO_ROOT,
        check=False,
    )


def test_a_verified_copy_exits_0_and_a_second_run_is_unchanged(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=2, shard_bytes=1 << 20)
    (tmp_path / "dst").mkdir()
    first = storwatch("sync", str(src), str(tmp_path / "dst" / "ck"), "--json")
    assert first.returncode == 0, first.stderr
    (result,) = json.loads(first.stdout)
    assert result["ok"] is True and result["outcome"] == "verified" and result["manifest"].endswith(MANIFEST_SUFFIX)
    assert first.stderr == ""  # no progress line: stderr is not a terminal
    assert tree(tmp_path / "dst" / "ck") == tree(src)
    # Relative paths, from where the command runs; the line form.
    again = storwatch("sync", "src", "dst/ck", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.startswith("UNCHANGED  "), again.stdout + again.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("{tmp}/src",), "SRC and DEST are both needed", id="no-dest"),
        pytest.param(("{tmp}/missing", "{tmp}/dst/x"), "no such file or directory", id="no-src"),
        pytest.param(("{tmp}/gone/src", "{tmp}/dst/x"), "'{tmp}/gone/src': no such file or directory", id="no-src-dir"),
        pytest.param(("{tmp}/src", "{tmp}/nodir/x"), "no such directory", id="no-dest-dir"),
        pytest.param(("{tmp}/src", "{tmp}/dst/theirs"), "is not a copy storwatch made", id="not-ours"),
        pytest.param(
            ("{tmp}/src", "{tmp}/dst/x", "--config", "{tmp}/c.yaml"), "not below an allowlisted", id="outside"
        ),
        pytest.param(("{tmp}/src", "{tmp}/durable/../dst/x", "--config", "{tmp}/c.yaml"), "not below", id="dotdot"),
        pytest.param(("{tmp}/src", "{tmp}/dst/x", "--keep", "-1"), "must be a whole number", id="bad-keep"),
        pytest.param(("{tmp}/src", "{tmp}/dst/x", "--config", "{tmp}/bad.yaml"), "sync.template", id="bad-config"),
    ],
)
def test_usage_errors_and_refusals_exit_2_with_nothing_written(
    args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    for name in ("dst", "durable", "dst/theirs"):
        (tmp_path / name).mkdir()
    (tmp_path / "c.yaml").write_text(f"sync:\n  destinations: [{tmp_path / 'durable'}]\n")
    (tmp_path / "bad.yaml").write_text("sync:\n  template: '../{pod}'\n")
    out = storwatch("sync", *(a.format(tmp=tmp_path) for a in args))
    assert out.returncode == 2, out.stdout + out.stderr
    assert message.format(tmp=tmp_path) in out.stdout + out.stderr
    assert sorted(os.listdir(tmp_path / "dst")) == ["theirs"] and os.listdir(tmp_path / "durable") == []


@pytest.mark.parametrize(
    ("dest", "resolved"),
    [
        pytest.param("{tmp}/src/copy", None, id="in-it"),
        pytest.param("{tmp}/src/shards/copy", None, id="deeper"),
        pytest.param("{tmp}/src", None, id="src-itself"),
        pytest.param("{tmp}/dst/../src/copy", "{tmp}/src/copy", id="dotdot"),
        pytest.param("{tmp}/link/copy", "{tmp}/src/copy", id="through-a-symlink"),
    ],
)
def test_a_dest_inside_src_is_refused_before_any_copy(dest: str, resolved: str | None, tmp_path: Path) -> None:
    """The copy's temporary and manifest go beside DEST: inside SRC they would change the source (and the copy, seeing
    its own temporary, ended ``source_changed``). Refused up front, naming both, SRC left exactly as it was."""
    src = make_checkpoint(tmp_path / "src", shards=2, shard_bytes=1 << 20)
    (tmp_path / "dst").mkdir()
    (tmp_path / "link").symlink_to(src)
    before = tree(src)
    given = dest.format(tmp=tmp_path)
    out = storwatch("sync", str(src), given, "--json")
    assert out.returncode == 2, out.stdout + out.stderr
    (result,) = json.loads(out.stdout)
    assert (result["ok"], result["outcome"], result["bytes"]) == (False, "refused", 0)
    shown = f"DEST {given!r}" + (f" ({resolved.format(tmp=tmp_path)!r})" if resolved else "")
    if given == str(src):
        assert result["error"] == f"{shown} is SRC {str(src)!r} itself: name a DEST outside SRC"
    else:
        assert result["error"].startswith(f"{shown} lies inside SRC {str(src)!r}: "), result["error"]
    assert tree(src) == before
    assert os.listdir(tmp_path / "dst") == []


def test_a_src_inside_an_earlier_copy_at_dest_is_refused_and_kept(tmp_path: Path) -> None:
    """Copying a directory of an earlier copy of ours over that copy replaced it, and the source went with the old
    copy (the source is never modified): refused up front, both left as they are."""
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    (src / "shards" / "up.link").unlink()  # the shards directory alone is then a checkpoint a copy can take
    (tmp_path / "dst").mkdir()
    dest = tmp_path / "dst" / "ck"
    assert storwatch("sync", str(src), str(dest)).returncode == 0
    inner = dest / "shards"
    before = tree(dest)
    out = storwatch("sync", str(inner), str(dest), "--json")
    assert out.returncode == 2, out.stdout + out.stderr
    (result,) = json.loads(out.stdout)
    assert result["outcome"] == "refused"
    assert result["error"].startswith(f"SRC {str(inner)!r} lies inside DEST {str(dest)!r}: "), result["error"]
    assert tree(dest) == before


@pytest.mark.realpart
def test_a_dest_inside_src_through_a_bind_mount_is_refused(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    """A bind mount of SRC elsewhere is SRC by its identity (device and inode), whatever its path says."""
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    bound = real_mounts(bind_mount(src, tmp_path / "bound"))
    before = tree(src)
    out = storwatch("sync", str(src), f"{bound}/copy")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout.startswith(f"REFUSED    {bound}/copy: refused: DEST '{bound}/copy' lies inside SRC '{src}'")
    assert tree(src) == before


@contextlib.contextmanager
def bind_mount(source: Path, target: Path) -> Iterator[Path]:
    """``source`` bind-mounted at ``target`` (made), unmounted at the end."""
    require_root()
    target.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True, timeout=30, capture_output=True)
    try:
        yield target
    finally:
        unmount(target, lazy=True)


@pytest.mark.realpart
def test_a_dest_on_a_hung_mount_leaves_the_command_to_its_deadline(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    """SRC and DEST are resolved for the check above in a helper process: a DEST whose every lookup hangs in the kernel
    (a FUSE daemon that never answers getattr, as a dead NFS server) holds neither the check nor the command, which
    ends at the copy's --deadline as before (abandoned, exit 1)."""
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    backing = tmp_path / "backing"
    backing.mkdir()
    hung = real_mounts(fuse_mount(tmp_path / "hung", backing=backing, block_getattr=True))
    proc = subprocess.Popen(
        [sys.executable, "-m", "storwatch", "sync", str(src), f"{hung.mountpoint}/ck", "--deadline", "2", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        out, err = proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        # Killed, never waited for: a command stuck in the kernel on the mount ends only once the mount is aborted
        # (the fixture's teardown does it).
        proc.kill()
        pytest.fail(f"storwatch sync did not end within {WAIT:.0f} s of a 2 s deadline: held by the hung DEST")
    assert proc.returncode == 1, out + err
    (result,) = json.loads(out)
    assert result["outcome"] == "abandoned", result


def test_a_copy_allowed_below_a_configured_root_makes_the_directories(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", shards=1, shard_bytes=1000)
    (tmp_path / "durable").mkdir()
    (tmp_path / "c.yaml").write_text(f"sync:\n  destinations: [{tmp_path / 'durable'}]\n  keep: 1\n")
    dest = tmp_path / "durable" / "ns" / "pod" / "step-1"
    out = storwatch("sync", "--config", str(tmp_path / "c.yaml"), str(src), str(dest))
    assert out.returncode == 0 and out.stdout.startswith("VERIFIED   "), out.stdout + out.stderr
    (src / "latest").write_text("global_step2\n")
    out = storwatch("sync", "--config", str(tmp_path / "c.yaml"), str(src), str(dest.with_name("step-2")))
    assert out.returncode == 0 and "removed (keep-N): " + str(dest) in out.stdout, out.stdout
    assert sorted(os.listdir(dest.parent)) == ["step-2", "step-2" + MANIFEST_SUFFIX]


def test_a_source_changing_under_the_copy_exits_1(tmp_path: Path) -> None:
    """A writer still appending to the source while the copy reads it (paced slow with --bandwidth)."""
    src = tmp_path / "growing.bin"
    src.write_bytes(os.urandom(8 << 20))
    (tmp_path / "dst").mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "storwatch",
            "sync",
            str(src),
            str(tmp_path / "dst" / "g"),
            "--bandwidth",
            "2M",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        while proc.poll() is None:
            with open(src, "ab") as f:
                f.write(b"x" * 4096)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        proc.kill()
    assert proc.returncode == 1, out + err
    (result,) = json.loads(out)
    assert result["outcome"] == "source_changed"
    assert os.listdir(tmp_path / "dst") == []


def test_the_progress_line_shows_on_a_terminal(tmp_path: Path) -> None:
    src = tmp_path / "model.pt"
    src.write_bytes(os.urandom(12 << 20))
    (tmp_path / "dst").mkdir()
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "storwatch", "sync", str(src), str(tmp_path / "dst" / "m"), "--bandwidth", "6M"],
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
        cwd=REPO_ROOT,
    )
    os.close(slave)
    shown = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], WAIT)
            if not ready:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal's other end closed: the command is done
                break
            if not chunk:
                break
            shown += chunk
        out = proc.communicate(timeout=WAIT)[0]
    finally:
        proc.kill()
        os.close(master)
    assert proc.returncode == 0 and out.startswith("VERIFIED"), out
    text = shown.decode(errors="replace")
    assert "\r" in text and "MiB / 12.00 MiB" in text and "MB/s" in text and "ETA 0:00:" in text, text
