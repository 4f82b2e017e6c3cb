"""The golden full scrape's host: the gpu-node fixture read through the sources, the classifier, the View and the
exporter (tests/test_golden.py compares it with golden.prom; tests/test_exposition.py renders it twice).

The host is the fixture alone: its mount table, sysfs (block device topology), diskstats and mountstats. The I/O
sources read twice, 10 s apart on a fake clock (``proc/`` then ``10s-later/``), so deltas and latency windows exist;
one mount has a probe result.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from storwatch.analysis.build import build_view
from storwatch.analysis.io import WindowFeeder
from storwatch.analysis.latency import LatencyWindows
from storwatch.calls.blocking import CallOutcome
from storwatch.classify import Classifier
from storwatch.config import DiskIOConfig, MountsConfig, NFSConfig
from storwatch.exporter import Exporter
from storwatch.paths import HostPaths
from storwatch.registry import exporter_areas
from storwatch.snapshot import Snapshot
from storwatch.sources.diskio import DiskIOSource
from storwatch.sources.mounts import MountSource
from storwatch.sources.nfs import NFSSource
from storwatch.sources.probe import Histogram, ProbeResult
from storwatch.vocabulary import CollectorStatus, Platform

FIXTURES = Path(__file__).parent / "fixtures"
GPU_NODE = FIXTURES / "gpu-node"
LATER = GPU_NODE / "10s-later"

GiB = 1 << 30
TiB = 1 << 40

POD_A = "/var/lib/kubelet/pods/81742e8f-be31-4219-bac3-e2ed48dd4123/volumes"
PVC = f"{POD_A}/kubernetes.io~csi/pvc-07397231-7729-49b7-8e49-313542c11b05/mount"
RBD_PVC = (
    "/var/lib/kubelet/pods/1f9e5735-b8c7-40f1-ac81-51a60e82c99d/volumes/kubernetes.io~csi/"
    "pvc-b60b439b-5333-4d96-b219-7c3ee460b588/mount"
)

FIRST_READ = 1_699_999_990.0
"""When the I/O sources first read diskstats and mountstats (``proc/``)."""
SECOND_READ = 1_700_000_000.0
"""The second read, 10 s later (``10s-later/``)."""
PROBED = 1_699_999_997.0
"""When the PVC's last probe round ended."""
SNAPSHOT = 1_700_000_000.5


def _statvfs(
    frsize: int, size: int, free: int, avail: int, files: int, files_free: int, readonly: bool = False
) -> tuple[int, ...]:
    return (frsize, size // frsize, free // frsize, avail // frsize, files, files_free, 1 if readonly else 0)


# Fixed answers per mountpoint (f_frsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree, f_flag).
SIZES: dict[str, tuple[int, ...]] = {
    "/": _statvfs(4096, 500 * GiB, 320 * GiB, 295 * GiB, 32_768_000, 31_000_000),
    "/run": _statvfs(4096, 201 * GiB, 200 * GiB, 200 * GiB, 52_825_121, 52_824_000),
    "/dev/shm": _statvfs(4096, 1007 * GiB, 1007 * GiB, 1007 * GiB, 264_125_603, 264_125_600),
    "/run/lock": _statvfs(4096, 5 * (1 << 20), 5 * (1 << 20), 5 * (1 << 20), 264_125_603, 264_125_600),
    "/snap/core20/2318": _statvfs(131072, 64 * (1 << 20), 0, 0, 12_000, 0, readonly=True),
    "/boot/efi": _statvfs(512, 105 * (1 << 20), 99 * (1 << 20), 99 * (1 << 20), 0, 0),
    "/mnt/local-nvme": _statvfs(4096, 7 * TiB, 3 * TiB, 3 * TiB, 750_000_000, 749_000_000),
    "/lustre": _statvfs(1 << 20, 2048 * TiB, 700 * TiB, 690 * TiB, 4_000_000_000, 3_100_000_000),
    "/mnt/s3-datasets": _statvfs(4096, 8 * (1 << 50), 8 * (1 << 50), 8 * (1 << 50), 0, 0),
    "/run/nvidia/driver": _statvfs(4096, 500 * GiB, 320 * GiB, 295 * GiB, 32_768_000, 31_000_000),
    f"{POD_A}/kubernetes.io~empty-dir/dshm": _statvfs(4096, 256 * GiB, 250 * GiB, 250 * GiB, 264_125_603, 264_125_590),
    f"{POD_A}/kubernetes.io~csi/pvc-07397231-7729-49b7-8e49-313542c11b05/mount": _statvfs(
        1 << 20, 100 * TiB, 40 * TiB, 40 * TiB, 1_000_000_000, 800_000_000
    ),
}
# Everything else (container rootfs overlays, projected tokens, binds of the data disk) gets the same small answer.
DEFAULT_SIZE = _statvfs(4096, 2 * GiB, 1 * GiB, 1 * GiB, 524_288, 524_000)
# The NFS /home is hung: its statvfs has been in flight past the deadline. The s3fs daemon died.
OUTCOMES: dict[str, CallOutcome] = {
    "/home": CallOutcome(stuck=True, in_flight_seconds=12.5),
    "/mnt/s3fs-checkpoints": CallOutcome(error="Transport endpoint is not connected"),
}


class FakeStatvfs:
    """Stands in for ``BlockingCalls`` doing statvfs: the fixture's mountpoints are not mounts on this machine."""

    max_inflight = 16

    def call_many(
        self, op: str, requests: Mapping[str, Sequence[bytes | str]], timeout: float
    ) -> dict[str, CallOutcome]:
        assert op == "statvfs"
        result = {}
        for key in requests:
            if key in OUTCOMES:
                result[key] = OUTCOMES[key]
            else:
                result[key] = CallOutcome(values=tuple(str(v) for v in SIZES.get(key, DEFAULT_SIZE)))
        return result

    def close(self) -> None:
        pass


# The PVC's probe, three of its 20 rounds so far: a slow one half an hour ago, one 33 s ago and the last, 3 s before
# the second read. The histograms count all 20 rounds, cumulative per bucket of storwatch.sources.probe.BUCKETS
# (0.0001 ... 10, +Inf); the slow round is the one between 0.25 and 0.5 s for write and fsync.
PROBE_HISTOGRAMS = {
    "write": Histogram((0, 0, 0, 0, 3, 17, 19, 19, 19, 19, 19, 20, 20, 20, 20, 20, 20), 0.375, 20),
    "fsync": Histogram((0, 0, 0, 0, 0, 2, 12, 19, 19, 19, 19, 20, 20, 20, 20, 20, 20), 0.5, 20),
    "read": Histogram((0, 0, 3, 18, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20), 0.015625, 20),
}
PROBE_ROUNDS = (
    (SECOND_READ - 1800, {"write": 0.3, "fsync": 0.3, "read": 0.002}),
    (SECOND_READ - 33, {"write": 0.0025, "fsync": 0.009, "read": 0.0006}),
    (PROBED, {"write": 0.004, "fsync": 0.012, "read": 0.0008}),
)


def probe_round(timestamp: float, seconds: dict[str, float]) -> ProbeResult:
    return ProbeResult(PVC, timestamp, seconds, False, 0.0, None, PROBE_HISTOGRAMS)


class FakeClock:
    """Wall clock and monotonic clock in one, moved by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def render_scrape(tmp: Path) -> str:
    """The whole scrape of the fixture host, with ``tmp`` as scratch space (a procfs copy and an empty rootfs)."""
    proc, rootfs = tmp / "proc", tmp / "rootfs"
    (proc / "1").mkdir(parents=True)
    rootfs.mkdir()
    for name in ("diskstats", "1/mountinfo", "1/mountstats"):
        shutil.copy(GPU_NODE / "proc" / name, proc / name)
    paths = HostPaths(procfs=str(proc), sysfs=str(GPU_NODE / "sys"), rootfs=str(rootfs))
    mount_source = MountSource(paths, MountsConfig(), calls=FakeStatvfs())  # type: ignore[arg-type]
    mounts = mount_source.collect()

    clock = FakeClock(FIRST_READ)
    disks = DiskIOSource(paths, DiskIOConfig(), clock=clock, monotonic=clock.monotonic)
    nfs = NFSSource(paths, NFSConfig(), clock=clock)
    disks_first, nfs_first = disks.collect(), nfs.collect()
    shutil.copy(LATER / "diskstats", proc / "diskstats")
    shutil.copy(LATER / "mountstats", proc / "1" / "mountstats")
    clock.now = SECOND_READ
    disks_second, nfs_second = disks.collect(), nfs.collect()

    windows = LatencyWindows()
    feeder = WindowFeeder(windows)
    *earlier, last = (probe_round(t, seconds) for t, seconds in PROBE_ROUNDS)
    for probe in earlier:
        feeder.feed(Snapshot(timestamp=probe.timestamp + 0.5, mounts=mounts, probes=(probe,)))
    feeder.feed(
        Snapshot(timestamp=FIRST_READ + 0.5, mounts=mounts, disks=disks_first, nfs=nfs_first, probes=earlier[-1:])
    )
    collectors = (
        CollectorStatus("mounts", True, 0.0125, 1_700_000_000.0, parse_errors=mount_source.parse_errors),
        CollectorStatus("diskstats", True, 0.0004, SECOND_READ, parse_errors=disks.parse_errors),
        CollectorStatus("nfs", True, 0.0021, SECOND_READ, parse_errors=nfs.parse_errors),
        CollectorStatus("probe", True, 0.017, PROBED),
        # Off: exported as collector_enabled 0 and nothing else (no success, no kube_api_up).
        CollectorStatus("kube", False, 0.0, None, off_reason="no in-cluster service account token and no kubeconfig"),
    )
    snapshot = Snapshot(
        timestamp=SNAPSHOT,
        mounts=mounts,
        collectors=collectors,
        disks=disks_second,
        nfs=nfs_second,
        probes=(last,),
    )
    feeder.feed(snapshot)
    platform = Platform("together-k8s", "configured")
    view = build_view(snapshot, Classifier(platform.name), platform, windows=windows)
    return Exporter(exporter_areas(), process_metrics=False).render(view).decode("utf-8")
