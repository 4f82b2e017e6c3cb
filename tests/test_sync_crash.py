"""Every row of the copy's crash table (``storwatch.sync.commit.CRASH_TABLE``), walked with a real SIGKILL of a
real copy at that point, on a destination with ``renameat2``'s flags (tmpfs) and on one without them (a FUSE mount
that answers EINVAL to them, as NFS does): after the kill DEST is absent, the earlier verified copy or the new one,
never part of either; then, with the source gone (its pod deleted), the next copy into the same directory (another
checkpoint) makes good what the killed one left before it removes anything: the last good copy is never lost.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash

from storwatch.sync import CRASH_TABLE, MANIFEST_SUFFIX, copy_verified
from tests.builders import SYNC_LEFTOVER as LEFTOVER
from tests.realmounts import fuse_mount, tmpfs_mount

pytestmark = [pytest.mark.realpart, pytest.mark.timeout(300)]

REPO_ROOT = Path(__file__).resolve().parents[1]
WAIT = 60.0
"""A bound against a copy that never ends; never what is asserted."""

CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from storwatch.sync import commit, copy_verified
commit.kill_at = sys.argv[5]
r = copy_verified(sys.argv[2], sys.argv[3], root=sys.argv[4], keep=int(sys.argv[6]))
print(r.outcome, r.error, flush=True)
sys.exit(0 if r.ok else 1)
"""

# What DEST holds once the next copy into its directory has run, by the point the copy was killed at and whether it
# replaced an earlier copy: "absent", "earlier" (the verified copy that was there) or "new".
AFTER: dict[tuple[str, bool], str] = {
    ("writing", False): "absent",
    ("writing", True): "earlier",
    ("verified", False): "absent",
    ("verified", True): "earlier",
    ("manifest_written", False): "new",
    ("manifest_written", True): "earlier",
    ("renamed", False): "new",
    ("exchanged", True): "new",
    ("moved_aside", True): "new",
    ("renamed_over", True): "new",
    ("manifest_in_place", False): "new",
    ("manifest_in_place", True): "new",
}
EXCHANGE_ONLY = {"exchanged"}
NO_FLAGS_ONLY = {"moved_aside", "renamed_over"}


def _digests(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): xxhash.xxh3_128_hexdigest(p.read_bytes())
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def _checkpoint(top: Path, version: int) -> Path:
    """A small directory checkpoint; each version differs in one shard."""
    top.mkdir(parents=True)
    (top / "shards").mkdir()
    for i in range(3):
        (top / "shards" / f"__{i}_0.distcp").write_bytes(bytes([version, i]) * 40_000)
    (top / ".metadata").write_bytes(b"meta" * 100)
    return top


def _kill_at(src: Path, dest: Path, root: Path, point: str, keep: int = 0) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(REPO_ROOT), str(src), str(dest), str(root), point, str(keep)],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert proc.returncode == -9, f"the copy was not killed at {point}: {proc.returncode} {proc.stdout} {proc.stderr}"


def _ours(dest: Path) -> bool:
    """DEST is a copy its manifest describes (the inode the manifest names)."""
    import json

    manifest = json.loads((dest.parent / (dest.name + MANIFEST_SUFFIX)).read_text())
    return bool(manifest["inode"] == os.lstat(dest).st_ino)


def _walk_row(base: Path, root: Path, point: str, replacing: bool) -> None:
    case = base / f"{point}-{'replacing' if replacing else 'fresh'}"
    earlier = _checkpoint(case / "v1" / "ck", 1)
    new = _checkpoint(case / "v2" / "ck", 2)
    src = case / "run" / "ck"  # the run's checkpoint as it is now: the killed copy's run is its directory
    shutil.copytree(new, src)
    dest = root / case.name / "run" / "ck"
    if replacing:
        first = copy_verified(str(earlier), str(dest), root=str(root), run=str(src.parent))
        assert first.outcome == "verified", first.error
    _kill_at(src, dest, root, point)
    right_after = _state(dest, earlier, new)
    assert right_after in (("absent", "earlier", "new") if replacing else ("absent", "new")), (
        f"{point}: DEST is {right_after} right after the kill"
    )
    # The pod is deleted: its checkpoint goes. The run's next checkpoint is copied into the same directory.
    shutil.rmtree(src)
    other = _checkpoint(case / "v3" / "ck-other", 3)
    nxt = copy_verified(str(other), str(dest.parent / "ck-other"), root=str(root), run=str(src.parent))
    assert nxt.outcome == "verified", nxt.error
    want = AFTER[(point, replacing)]
    assert _state(dest, earlier, new) == want, f"{point} ({'replacing' if replacing else 'fresh'})"
    if want != "absent":
        assert _ours(dest), f"{point}: DEST's manifest does not describe it"
    assert [n for n in os.listdir(dest.parent) if LEFTOVER.fullmatch(n)] == [], point


def _state(dest: Path, earlier: Path, new: Path) -> str:
    if not os.path.lexists(dest):
        return "absent"
    got = _digests(dest)
    if got == _digests(earlier):
        return "earlier"
    if got == _digests(new):
        return "new"
    return f"neither copy ({sorted(got)})"


def _walk_retention(base: Path, root: Path) -> None:
    run = base / "retained"
    dest_dir = root / "retained"
    for n in (1, 2):
        ck = _checkpoint(run / f"ck{n}", n)
        assert copy_verified(str(ck), str(dest_dir / f"ck{n}"), root=str(root), run=str(run)).outcome == "verified"
    ck3 = _checkpoint(run / "ck3", 3)
    _kill_at(ck3, dest_dir / "ck3", root, "retained_aside", keep=2)
    assert copy_verified(str(ck3), str(dest_dir / "ck3"), root=str(root), run=str(run), keep=2).ok
    names = sorted(os.listdir(dest_dir))
    assert names == ["ck2", "ck2" + MANIFEST_SUFFIX, "ck3", "ck3" + MANIFEST_SUFFIX], names


def _walk_table(base: Path, root: Path, exchange: bool) -> set[str]:
    walked: set[str] = set()
    for (point, replacing), _ in AFTER.items():
        if (point in EXCHANGE_ONLY and not exchange) or (point in NO_FLAGS_ONLY and exchange):
            continue
        _walk_row(base, root, point, replacing)
        walked.add(point)
    _walk_retention(base, root)
    walked.add("retained_aside")
    return walked


def test_every_row_of_the_crash_table_is_walked_by_a_kill(tmp_path: Path, real_mounts: Callable[..., object]) -> None:
    sources = tmp_path / "sources"
    sources.mkdir()
    with_flags = real_mounts(tmpfs_mount(tmp_path / "tmpfs", size="64m"))
    without = real_mounts(fuse_mount(tmp_path / "fuse", rename_flags=False))
    walked = _walk_table(sources / "a", Path(with_flags.mountpoint), exchange=True)  # type: ignore[attr-defined]
    walked |= _walk_table(sources / "b", Path(without.mountpoint), exchange=False)  # type: ignore[attr-defined]
    assert walked == {c.point for c in CRASH_TABLE}


def test_the_fuse_harness_refuses_rename_flags_and_a_copy_still_replaces(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    from storwatch.sync.commit import RENAME_EXCHANGE, renameat2

    mount = real_mounts(fuse_mount(tmp_path / "fuse", rename_flags=False))
    a, b = mount.mountpoint / "a", mount.mountpoint / "b"
    a.write_text("a")
    b.write_text("b")
    fd = os.open(mount.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as err:
            renameat2(fd, "a", "b", RENAME_EXCHANGE)
    finally:
        os.close(fd)
    assert err.value.errno == 22 and a.read_text() == "a" and b.read_text() == "b"
