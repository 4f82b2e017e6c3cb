"""History: bounded whatever the uptime, and what it keeps of each snapshot (deltas, not counter tables)."""

from __future__ import annotations

import shutil
from pathlib import Path

from bench.io_sources import BUSY, make_tree, write_tick  # the benchmark's busy node, small
from storwatch.config import DiskIOConfig, NFSConfig
from storwatch.history import History
from storwatch.paths import HostPaths
from storwatch.snapshot import Snapshot
from storwatch.sources.diskio import DiskIOSource
from storwatch.sources.nfs import NFSSource


def test_history_keeps_each_ticks_deltas_and_drops_the_counter_tables() -> None:
    busy, BUSY[0] = BUSY[0], 4
    root = make_tree(devices=4, mounts=4)
    try:
        check_history(root)
    finally:
        BUSY[0] = busy
        shutil.rmtree(root)


def check_history(root: Path) -> None:
    paths = HostPaths(procfs=str(root / "proc"), sysfs=str(root / "sys"), rootfs=str(root / "root"))
    disks, nfs = DiskIOSource(paths, DiskIOConfig()), NFSSource(paths, NFSConfig())
    history = History(3)
    snaps = []
    for tick in range(5):
        write_tick(root / "proc", 4, 4, tick)
        snap = Snapshot(timestamp=float(tick), disks=disks.collect(), nfs=nfs.collect())
        snaps.append(snap)
        history.append(snap.for_history())
    kept = history.snapshots()
    assert [s.timestamp for s in kept] == [2.0, 3.0, 4.0]  # bounded
    for full, light in zip(snaps[2:], kept, strict=True):
        assert light.disks is not None and light.nfs is not None and full.disks is not None and full.nfs is not None
        assert light.disks.counters == {} and light.nfs.mounts == {}
        assert light.disks.deltas == full.disks.deltas and len(light.disks.deltas) == 4
        assert light.nfs.deltas == full.nfs.deltas and set(light.nfs.deltas) == {f"/mnt/nfs{m}" for m in range(4)}
        assert {op for ops in light.nfs.deltas.values() for op in ops} == {"READ", "WRITE", "COMMIT"}
    # The newest snapshot, the one the View is built from, keeps everything.
    assert len(snaps[-1].nfs.mounts) == 4 and len(snaps[-1].disks.counters) == 4  # type: ignore[union-attr]
