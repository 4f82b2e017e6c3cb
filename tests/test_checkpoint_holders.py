"""Which processes hold a checkpoint's files open for writing (storwatch/checkpoints/holders.py), with real processes:
one writing, one only reading, one in a mount namespace of its own that sees the checkpoint under another path, and
the look taken as a user who cannot read root's processes. Plus the two fdinfo and status lines it parses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from storwatch.checkpoints.holders import writers_of
from storwatch.paths import HostPaths
from storwatch.procfs.pidio import fd_inode, status_uids
from tests.agentproc import REPO_ROOT

OTHER_UID = 4242


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"pos:\t0\nflags:\t0100001\nmnt_id:\t24\nino:\t3\n", 3),
        (b"pos:\t0\nflags:\t0100001\nmnt_id:\t24\n", None),  # before Linux 5.14
        (b"ino:\t12345678901234567890\n", 12345678901234567890),
        (b"ino:\t123456789012345678901\n", None),  # past 64 bits: not a number the kernel writes
        (b"ino:\tx1\n", None),
        (b"", None),
    ],
    ids=["ino", "none", "largest", "too-long", "not-a-number", "empty"],
)
def test_fd_inode(text: bytes, expected: int | None) -> None:
    assert fd_inode(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"Name:\tpython\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\n", (1000, 1000, 1000, 1000)),
        (b"Uid:\t0\t1000\t0\t1000\n", (0, 1000, 0, 1000)),
        (b"Uid:\t0\t0\t0\n", None),
        (b"Uid:\t0\t0\tx\t0\n", None),
        (b"Name:\tpython\n", None),
    ],
    ids=["user", "setuid", "three-fields", "not-a-number", "no-line"],
)
def test_status_uids(text: bytes, expected: tuple[int, ...] | None) -> None:
    assert status_uids(text) == expected


_HOLD = """
import sys
f = open(sys.argv[1], sys.argv[2])
print("open", flush=True)
sys.stdin.read()
"""


@contextmanager
def holding(path: Path, mode: str, prefix: tuple[str, ...] = ()) -> Iterator[subprocess.Popen[str]]:
    """A process that holds ``path`` open (``ab``: for writing, ``rb``: for reading) until the block ends."""
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", _HOLD, str(path), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == "open\n"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def _checkpoint(tmp_path: Path) -> Path:
    ckpt = tmp_path / "run" / "checkpoint-5"
    ckpt.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
        (ckpt / name).write_bytes(b"x")
    return ckpt


def test_a_process_writing_a_file_of_the_checkpoint_holds_it(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    other = tmp_path / "run" / "checkpoint-10"
    other.mkdir()
    paths = HostPaths()
    with holding(ckpt / "optimizer.pt", "ab") as proc:
        found = writers_of(paths, [str(ckpt), str(other), str(ckpt / "optimizer.pt"), str(ckpt / "model.safetensors")])
    held = found[str(ckpt)]
    assert [(h.pid, h.command, h.path) for h in held.holders] == [(proc.pid, "python", str(ckpt / "optimizer.pt"))]
    assert not held.closed
    assert [h.pid for h in found[str(ckpt / "optimizer.pt")].holders] == [proc.pid]  # the file on its own, too
    assert found[str(other)].closed and found[str(ckpt / "model.safetensors")].closed
    # Closed: nothing holds it.
    assert writers_of(paths, [str(ckpt)])[str(ckpt)].closed


def test_a_process_only_reading_it_does_not_hold_it(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    with holding(ckpt / "model.safetensors", "rb"):
        found = writers_of(HostPaths(), [str(ckpt)])[str(ckpt)]
    assert found.holders == () and found.closed


@pytest.mark.realpart
def test_a_writer_in_another_mount_namespace_is_known_by_the_file_it_holds(tmp_path: Path) -> None:
    """A trainer in a container sees the checkpoint under its own path: its fd link names that path, which this side
    does not have; the checkpoint's name and the member's path below it, with fdinfo's inode, tie it. The same names
    over another file (another inode) tie nothing."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a mount namespace")
    ckpt = _checkpoint(tmp_path)
    seen_as = tmp_path / "pod-volume" / "checkpoint-5"
    seen_as.mkdir(parents=True)
    decoy = tmp_path / "elsewhere" / "checkpoint-5"
    decoy.mkdir(parents=True)
    (decoy / "optimizer.pt").write_bytes(b"y")
    # In its own mount namespace the writer finds the checkpoint at seen_as (a bind mount nobody else sees).
    script = f"mount --bind {ckpt} {seen_as} && exec {sys.executable} -c '{_HOLD}' {seen_as}/optimizer.pt ab"
    prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c")
    proc = subprocess.Popen([*prefix, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == "open\n"
        assert not (seen_as / "optimizer.pt").exists()  # the control: this side does not see the writer's path
        with holding(decoy / "optimizer.pt", "ab") as decoy_writer:
            found = writers_of(HostPaths(), [str(ckpt), str(decoy)])
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert [(h.pid, h.path) for h in found[str(ckpt)].holders] == [(proc.pid, f"{seen_as}/optimizer.pt")]
    assert [h.pid for h in found[str(decoy)].holders] == [decoy_writer.pid]


_AS_USER = """
import json, sys
from storwatch.checkpoints.holders import writers_of
from storwatch.paths import HostPaths
found = writers_of(HostPaths(), sys.argv[1:])
print(json.dumps({p: [w.unseen, w.closed] for p, w in found.items()}))
"""


@pytest.mark.realpart
def test_as_a_user_only_processes_that_could_have_written_it_keep_the_answer_open(reachable: Path) -> None:
    """A user cannot read root's open files. A checkpoint whose files are all the user's was made by the user's
    processes (a file is owned by whoever creates it), which the user can read: root's unseen ones leave it closed.
    One that root owns files of stays open while root's processes cannot be seen."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to look as another user")
    mine = _checkpoint(reachable)
    for p in (mine, *mine.iterdir()):
        os.chown(p, OTHER_UID, OTHER_UID)
    roots = reachable / "root-run" / "checkpoint-5"
    roots.mkdir(parents=True)
    (roots / "model.safetensors").write_bytes(b"x")
    # The package as the user can read it: a checkout may lie below a directory only root can enter (a 0700 home).
    code = reachable / "code"
    shutil.copytree(REPO_ROOT / "storwatch", code / "storwatch", ignore=shutil.ignore_patterns("__pycache__"))
    as_user = [setpriv, f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", sys.executable, "-c"]
    proc = subprocess.run(
        [*as_user, _AS_USER, str(mine), str(roots), str(reachable / "gone")],
        cwd=reachable,
        env={**os.environ, "PYTHONPATH": str(code)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found[str(mine)] == [0, True]
    unseen, closed = found[str(roots)]
    assert unseen >= 1 and closed is False  # PID 1 at least runs as root, and this user cannot read its files
    unseen, closed = found[str(reachable / "gone")]  # what cannot be stat'ed rules no process out
    assert unseen >= 1 and closed is False


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory another user can reach (pytest's own is below a root-only one)."""
    path = Path(tempfile.mkdtemp(prefix="storwatch-holders-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
