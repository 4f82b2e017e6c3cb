"""Durable copies are evidence (analysis/copies.py, sources/copies.py): a verified copy storwatch made of a run's newest
checkpoint, found on the durable root by the copies source, makes the run safe: its recovery point is the age of the
save the copy protects, it has no finding, and a newer save brings the finding back for what is only on the node.
Real copies (storwatch.sync), a real walk in the source's helper process; the mounts are declared (their durability is
what the test is about, not their classification)."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from storwatch.analysis.checkpoints import run_views
from storwatch.analysis.findings import find
from storwatch.analysis.rpo import run_recovery
from storwatch.analysis.view import MountView
from storwatch.checkpoints.manifest import MANIFEST_SUFFIX
from storwatch.checkpoints.record import Checkpoint
from storwatch.config import SyncConfig
from storwatch.paths import HostPaths
from storwatch.sources.checkpoints import CheckpointFacts, RunState
from storwatch.sources.copies import CopiesFacts, CopiesSource
from storwatch.sync import copy_verified
from storwatch.vocabulary import Durability, Mount, Verdict


def _mount(mountpoint: Path, durability: str) -> MountView:
    m = Mount(1, str(mountpoint), "dev", "ext4", "/", 8, 1, False, (), (), None, False, 0.0)
    return MountView(m, Verdict(Durability(durability), "declared by the test", ()))


def _checkpoint(path: Path) -> Checkpoint:
    mtime = max(p.stat().st_mtime for p in [path, *path.rglob("*")]) if path.is_dir() else path.stat().st_mtime
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
    return Checkpoint(str(path), "torch-dcp", "complete", "complete", size, mtime, kind="dir", files=2)


def _save(run: Path, name: str, mtime: float) -> Path:
    ck = run / name
    ck.mkdir(parents=True)
    (ck / "__0_0.distcp").write_bytes(os.urandom(4096))
    (ck / ".metadata").write_bytes(name.encode() * 10)
    for p in (ck / "__0_0.distcp", ck / ".metadata", ck):
        os.utime(p, (mtime, mtime))
    return ck


@pytest.fixture
def source(tmp_path: Path) -> Iterator[CopiesSource]:
    (tmp_path / "durable").mkdir()
    made = CopiesSource(HostPaths(), SyncConfig(destinations=(str(tmp_path / "durable"),)))
    yield made
    made.close()


def _views(tmp_path: Path, cks: list[Path], copies: CopiesFacts, roots: tuple[str, ...] = ()) -> tuple:  # type: ignore[type-arg]
    scratch, durable = _mount(tmp_path / "scratch", "node"), _mount(tmp_path / "durable", "cluster")
    run = RunState(str(tmp_path / "scratch" / "run"), str(tmp_path / "scratch"), tuple(_checkpoint(c) for c in cks))
    extra = []
    for root in roots:  # a durable root that is a checkpoint root too: what the scan finds there
        for manifest in Path(root).rglob("*" + MANIFEST_SUFFIX):
            copy = manifest.with_name(manifest.name[: -len(MANIFEST_SUFFIX)])
            extra.append(RunState(str(copy.parent), root, (_checkpoint(copy),)))
    facts = CheckpointFacts(
        time.time(),
        runs=(run, *extra),
        truncated=False,
        truncated_reason=None,
        scan_seconds=0.0,
        roots=(str(tmp_path / "scratch"), *roots),
    )
    return run_views(facts, (scratch, durable), HostPaths(), copies=copies), (scratch, durable)


def test_a_verified_copy_of_the_newest_save_makes_the_run_safe(tmp_path: Path, source: CopiesSource) -> None:
    now = time.time()
    run = tmp_path / "scratch" / "run"
    first = _save(run, "step-100", now - 600)
    views, mounts = _views(tmp_path, [first], CopiesFacts())
    (rv,) = views
    assert run_recovery(rv, now).recovery_point_seconds == math.inf
    (finding,) = find(views, mounts, now)
    assert "no durable copy" in finding.sentence
    # The copy, as the sync action makes it, found by the source's walk.
    dest = tmp_path / "durable" / "ns" / "pod" / "run" / "step-100"
    assert copy_verified(str(first), str(dest), root=str(tmp_path / "durable"), run=str(run)).ok
    facts = source.collect()
    (found,) = facts.copies
    assert (found.dest, found.source, found.run) == (str(dest), str(first), str(run))
    views, mounts = _views(tmp_path, [first], facts)
    (rv,) = views
    assert rv.newest_copy is not None and rv.newest_copy.how == "verified" and rv.newest_copy.where == str(dest)
    point = run_recovery(rv, now).recovery_point_seconds
    assert point is not None and 599 <= point <= 601 + (time.time() - now)
    assert find(views, mounts, now) == ()  # covered: nothing only on the node
    # A newer save: the finding comes back for it alone, naming the copy that still protects the older one.
    second = _save(run, "step-200", now - 60)
    views, mounts = _views(tmp_path, [first, second], facts)
    (finding,) = find(views, mounts, now)
    assert finding.count == 1 and finding.bytes == _checkpoint(second).size_bytes
    assert "newest durable copy 10 min old (step-100: storwatch's verified copy at " in finding.sentence
    assert finding.exposed_seconds == pytest.approx(540, abs=1)


def test_a_durable_root_that_is_also_a_checkpoint_root_holds_no_run_of_its_own(
    tmp_path: Path, source: CopiesSource
) -> None:
    now = time.time()
    run = tmp_path / "scratch" / "run"
    ck = _save(run, "step-100", now - 60)
    dest = tmp_path / "durable" / "ns" / "run" / "step-100"
    assert copy_verified(str(ck), str(dest), root=str(tmp_path / "durable"), run=str(run)).ok
    views, _ = _views(tmp_path, [ck], source.collect(), roots=(str(tmp_path / "durable"),))
    assert [rv.run.path for rv in views] == [str(run)]  # the copy joined to its source run, not a run of its own
    assert views[0].newest_copy is not None


@pytest.mark.parametrize("forgery", ["other-owner", "group-writable", "not-describing"])
def test_a_manifest_storwatch_did_not_write_protects_nothing(
    tmp_path: Path, source: CopiesSource, forgery: str
) -> None:
    """A tenant who can write below a durable root forges a manifest naming another's run: it protects nothing."""
    now = time.time()
    run = tmp_path / "scratch" / "run"
    ck = _save(run, "step-100", now - 60)
    dest = tmp_path / "durable" / "them" / "step-100"
    assert copy_verified(str(ck), str(dest), root=str(tmp_path / "durable"), run=str(run)).ok
    manifest = dest.with_name(dest.name + MANIFEST_SUFFIX)
    if forgery == "other-owner":
        os.chown(manifest, 1000, 1000)
    elif forgery == "group-writable":
        os.chmod(manifest, 0o664)
    else:
        data = json.loads(manifest.read_text())
        data["inode"] += 1
        manifest.write_text(json.dumps(data, indent=1))
    assert source.collect().copies == ()


@pytest.mark.realpart
def test_a_durable_root_that_hangs_is_reported_stuck_not_waited_on(tmp_path: Path, real_mounts) -> None:  # type: ignore[no-untyped-def]
    """The walk runs in the source's helper process: a durable root on a mount whose readdir never answers (a dead NFS
    server) makes the collection fail naming it, within the source's deadline, and the agent's thread returns."""
    from tests.realmounts import fuse_mount

    hung = real_mounts(fuse_mount(tmp_path / "hung", block_readdir=True))
    made = CopiesSource(HostPaths(), SyncConfig(destinations=(str(hung.mountpoint),)))
    try:
        with pytest.raises(OSError, match="no durable root answered in time"):
            made.collect()
    finally:
        made.close()
