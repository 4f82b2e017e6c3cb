"""One tenant against another, through a verified copy made as root: a copy is never more readable than its source,
two sources never share one destination, a link that leaves the checkpoint through another link is refused, and a
copy never copies itself. Real files, real modes, and a real read attempted as another user."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from storwatch.sync import MANIFEST_SUFFIX, Destinations, SyncWorker, copy_verified
from tests.builders import sync_tree as tree

REPO_ROOT = Path(__file__).resolve().parents[1]
WAIT = 60.0
"""A bound against a helper that hangs; never what is asserted."""
OTHER_UID = 1000
"""Another tenant: not root, not the source's owner."""


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A directory every user may enter (tmp_path is 0700 all the way up: nobody but root could read anything)."""
    base = Path(tempfile.mkdtemp(prefix="storwatch-tenants-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base)


def _home(base: Path, mode: int) -> Path:
    """alice's home (``mode``) with a run holding a 0644 checkpoint file and a 0755 checkpoint directory."""
    home = base / "home" / "alice"
    home.mkdir(parents=True)
    os.chmod(base / "home", 0o755)
    run = home / "run"
    run.mkdir()
    os.chmod(run, 0o755)
    (run / "model.pt").write_bytes(b"weights" * 1000)
    os.chmod(run / "model.pt", 0o644)
    ck = run / "step-10"
    ck.mkdir()
    (ck / "shard.distcp").write_bytes(b"shard" * 1000)
    os.chmod(ck, 0o755)
    os.chmod(ck / "shard.distcp", 0o644)
    for path in (home, run, run / "model.pt", ck, ck / "shard.distcp"):
        os.chown(path, OTHER_UID + 1, OTHER_UID + 1)
    os.chmod(home, mode)
    return run


def _durable(base: Path) -> Path:
    root = base / "durable"
    root.mkdir()
    os.chmod(root, 0o755)
    return root


def _can_read_as_another_user(path: Path) -> bool:
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to read as another user")
    done = subprocess.run(
        [setpriv, f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", "cat", str(path)],
        capture_output=True,
        timeout=WAIT,
        check=False,
    )
    return done.returncode == 0


def _modes(root: Path, dest: Path) -> dict[str, int]:
    out = {}
    here = dest.parent
    while here != root:
        out[str(here.relative_to(root))] = stat.S_IMODE(here.stat().st_mode)
        here = here.parent
    out["top"] = stat.S_IMODE(dest.lstat().st_mode)
    out["manifest"] = stat.S_IMODE((dest.parent / (dest.name + MANIFEST_SUFFIX)).stat().st_mode)
    return out


@pytest.mark.parametrize(
    ("home_mode", "dirs", "top_file", "top_dir", "manifest_file", "manifest_dir", "readable"),
    [
        pytest.param(0o700, 0o700, 0o600, 0o700, 0o600, 0o600, False, id="private-home"),
        pytest.param(0o750, 0o750, 0o640, 0o750, 0o640, 0o640, False, id="group-home"),
        pytest.param(0o711, 0o711, 0o644, 0o755, 0o644, 0o644, True, id="enterable-home"),
        pytest.param(0o755, 0o755, 0o644, 0o755, 0o644, 0o644, True, id="open-home"),
    ],
)
def test_a_copy_is_never_more_readable_than_its_source(
    open_base: Path,
    home_mode: int,
    dirs: int,
    top_file: int,
    top_dir: int,
    manifest_file: int,
    manifest_dir: int,
    readable: bool,
) -> None:
    """A 0644 checkpoint private only because its home is 0700: the directories the copy makes, its top and its
    manifest keep every other user out, and another user's read fails for real. An open path stays open."""
    run = _home(open_base, home_mode)
    root = _durable(open_base)
    assert _can_read_as_another_user(run / "model.pt") is readable  # the source, as the other user finds it
    for name, top, manifest in (("model.pt", top_file, manifest_file), ("step-10", top_dir, manifest_dir)):
        dest = root / "alice" / "job-1" / "run" / name
        result = copy_verified(str(run / name), str(dest), root=str(root))
        assert result.outcome == "verified", result.error
        assert _modes(root, dest) == {
            "alice": dirs,
            "alice/job-1": dirs,
            "alice/job-1/run": dirs,
            "top": top,
            "manifest": manifest,
        }
        assert dest.stat().st_uid == OTHER_UID + 1  # the copy keeps its owner; what the copy made above it is root's
        assert (root / "alice").stat().st_uid == 0
        manifest_path = dest.parent / (dest.name + MANIFEST_SUFFIX)
        assert _can_read_as_another_user(manifest_path) is readable
        inner = dest / "shard.distcp" if dest.is_dir() else dest
        assert _can_read_as_another_user(inner) is readable


def test_the_helper_and_the_command_line_copy_no_more_openly(open_base: Path) -> None:
    """The sync action's path (a SyncWorker's helper process) and `storwatch sync` apply the same rule."""
    run = _home(open_base, 0o700)
    root = _durable(open_base)
    worker = SyncWorker(Destinations([str(root)]))
    try:
        job = worker.wait(worker.submit(str(run / "model.pt"), str(root / "ns" / "model.pt")), WAIT)
    finally:
        worker.close()
    assert job is not None and job.result is not None and job.result.outcome == "verified", job
    assert _modes(root, root / "ns" / "model.pt") == {"ns": 0o700, "top": 0o600, "manifest": 0o600}
    (open_base / "mine").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "storwatch", "sync", str(run / "step-10"), str(open_base / "mine" / "step-10")],
        capture_output=True,
        text=True,
        timeout=WAIT,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    copy = open_base / "mine" / "step-10"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o700
    assert stat.S_IMODE((open_base / "mine" / ("step-10" + MANIFEST_SUFFIX)).stat().st_mode) == 0o600


def test_two_runs_never_share_a_destination(tmp_path: Path) -> None:
    """The later copy of another run into the same destination is refused, naming both; the first stays whole."""
    first = tmp_path / "victim" / "run" / "ck"
    second = tmp_path / "them" / "var/lib/kubelet/pods/x/volumes/y" / "victim" / "run" / "ck"
    for path, data in ((first, b"victim"), (second, b"attacker")):
        path.mkdir(parents=True)
        (path / "model.pt").write_bytes(data * 1000)
    root = tmp_path / "durable"
    root.mkdir()
    dest = root / "_" / "_" / "run" / "ck"
    assert copy_verified(str(first), str(dest), root=str(root)).outcome == "verified"
    result = copy_verified(str(second), str(dest), root=str(root))
    assert result.outcome == "refused" and not result.ok
    assert "holds the verified copy of another run" in (result.error or "")
    assert str(first.parent) in (result.error or "") and str(second.parent) in (result.error or "")
    assert tree(dest) == tree(first)
    manifest = json.loads((root / "_" / "_" / "run" / ("ck" + MANIFEST_SUFFIX)).read_text())
    assert manifest["run"] == str(first.parent) and manifest["source"] == str(first)
    # The same run's newer save replaces its own copy.
    (first / "model.pt").write_bytes(b"newer" * 1000)
    assert copy_verified(str(first), str(dest), root=str(root)).outcome == "verified"
    assert tree(dest) == tree(first)


@pytest.mark.parametrize(
    "links",
    [
        pytest.param({"a": ".", "b": "a/a/../../secret"}, id="dot-link-then-up"),
        pytest.param({"sub/up": "..", "b": "sub/up/../secret"}, id="up-link-then-up"),
        pytest.param({"a": "sub", "sub/deeper": "..", "b": "a/deeper/../secret"}, id="through-two-links"),
        pytest.param({"loop1": "loop2", "loop2": "loop1", "b": "loop1/x"}, id="a-loop"),
    ],
)
def test_a_link_that_leaves_the_checkpoint_through_another_link_is_refused(
    tmp_path: Path, links: dict[str, str]
) -> None:
    """Resolved as the kernel would: each link on the way replaced by its target before the next component."""
    (tmp_path / "secret").write_text("another tenant's")
    src = tmp_path / "ck"
    (src / "sub").mkdir(parents=True)
    (src / "model.pt").write_bytes(b"x" * 100)
    for name, target in links.items():
        os.symlink(target, src / name)
    (tmp_path / "dst").mkdir()
    result = copy_verified(str(src), str(tmp_path / "dst" / "ck"))
    assert result.outcome == "refused", result
    error = result.error or ""
    assert "/b" in error and ("out of the checkpoint" in error or "symbolic links in a row" in error), error
    assert not (tmp_path / "dst" / "ck").exists()


def test_links_that_stay_inside_through_other_links_are_copied(tmp_path: Path) -> None:
    src = tmp_path / "ck"
    (src / "sub").mkdir(parents=True)
    (src / "model.pt").write_bytes(b"x" * 100)
    os.symlink(".", src / "a")
    os.symlink("a/a/model.pt", src / "b")
    os.symlink("..", src / "sub" / "up")
    os.symlink("sub/up/sub/up/model.pt", src / "c")
    os.symlink("missing/../../../x", src / "dangling")  # ENOENT at "missing": the rest is never reached
    (tmp_path / "dst").mkdir()
    result = copy_verified(str(src), str(tmp_path / "dst" / "ck"))
    assert result.outcome == "verified", result.error
    assert tree(tmp_path / "dst" / "ck") == tree(src)


def test_a_destination_inside_the_source_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    src = tmp_path / "ck"
    (src / "sub").mkdir(parents=True)
    (src / "model.pt").write_bytes(b"x" * 100)
    before = tree(src)
    for dest in (src / "copy", src / "sub" / "copy"):
        result = copy_verified(str(src), str(dest))
        assert result.outcome == "refused", result
        assert "inside the source" in (result.error or "")
    os.symlink(src / "sub", tmp_path / "elsewhere")  # the same directory, reached by another path
    result = copy_verified(str(src), str(tmp_path / "elsewhere" / "copy"))
    assert result.outcome == "refused" and "inside the source" in (result.error or ""), result
    assert tree(src) == before


def test_a_source_inside_the_destination_or_the_destination_itself_is_refused(tmp_path: Path) -> None:
    """Replacing an earlier copy at DEST would remove a source inside it: refused up front, the source kept (the
    sync action and the epilog copy through copy_verified as the command line does)."""
    src = tmp_path / "ck"
    (src / "shards").mkdir(parents=True)
    (src / "shards" / "a.distcp").write_bytes(b"x" * 100)
    (tmp_path / "dst").mkdir()
    dest = tmp_path / "dst" / "ck"
    assert copy_verified(str(src), str(dest)).outcome == "verified"
    inner = dest / "shards"
    result = copy_verified(str(inner), str(dest))
    assert (
        result.outcome == "refused" and "inside" in (result.error or "") and "remove the source" in (result.error or "")
    ), result
    assert (inner / "a.distcp").read_bytes() == b"x" * 100
    os.symlink(src, tmp_path / "same")
    result = copy_verified(str(src), str(tmp_path / "same"))  # DEST names the source through a link
    assert result.outcome == "refused", result
    assert tree(src) == tree(dest)
