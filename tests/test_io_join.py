"""The I/O join: WindowFeeder feeding latency windows once per source read, the windows' statistics, and mount_io."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from storwatch.analysis.io import FORGET_EVERY_SECONDS, WindowFeeder, mount_io
from storwatch.analysis.latency import (
    EMPTY,
    GONE_MARGIN_SECONDS,
    GRAIN_SECONDS,
    HOUR,
    MINUTE,
    LatencySummary,
    LatencyWindows,
    MountLatency,
    WindowStats,
)
from storwatch.procfs.diskstats import DiskStats, diskstats_delta, parse_line
from storwatch.procfs.mountstats import NFSMount, parse_mountstats
from storwatch.snapshot import Snapshot
from storwatch.sources.diskio import DiskIO
from storwatch.sources.nfs import NFSStats, OpDelta
from storwatch.sources.probe import ProbeResult
from storwatch.vocabulary import CollectorStatus, Mount, MountDevice

GPU_NODE = Path(__file__).parent / "fixtures" / "gpu-node"
PVC = (
    "/var/lib/kubelet/pods/81742e8f-be31-4219-bac3-e2ed48dd4123/volumes/kubernetes.io~csi/"
    "pvc-07397231-7729-49b7-8e49-313542c11b05/mount"
)
T = 1_700_000_000.0


def _mount(mountpoint: str, device: str, fstype: str, block: MountDevice | None = None) -> Mount:
    return Mount(
        mount_id=100,
        mountpoint=mountpoint,
        device=device,
        fstype=fstype,
        root="/",
        major=0,
        minor=0,
        readonly=False,
        options=("rw",),
        super_options=("rw",),
        usage=None,
        stuck=False,
        stuck_seconds=0.0,
        block=block,
    )


DATA = _mount("/mnt/data", "/dev/nvme1n1", "xfs", MountDevice("nvme1n1", ("nvme1n1",)))
DATA_BIND = _mount("/mnt/data/shared", "/dev/nvme1n1", "xfs", MountDevice("nvme1n1", ("nvme1n1",)))
ROOT = _mount("/", "/dev/nvme0n1p1", "ext4", MountDevice("nvme0n1p1", ("nvme0n1",), partition=True))
HOME = _mount("/home", "10.0.0.5:/home", "nfs4")
SHM = _mount("/dev/shm", "tmpfs", "tmpfs")

# diskstats lines (20 fields): nvme1n1 did 100 reads in 50 ms, 40 writes in 80 ms and 10 flushes in 30 ms between
# the two; nvme0n1p1 (a partition: flushes always 0) 20 reads in 10 ms and no writes; sdb nothing any mount uses.
BEFORE = {
    "nvme1n1": " 259 4 nvme1n1 1000 0 8000 500 400 0 3200 800 0 900 1300 0 0 0 0 100 300",
    "nvme0n1p1": " 259 2 nvme0n1p1 2000 0 16000 1000 300 0 2400 600 0 1500 1600 0 0 0 0 0 0",
    "sdb": "   8 16 sdb 5 0 40 1 0 0 0 0 0 1 1 0 0 0 0 0 0",
}
AFTER = {
    "nvme1n1": " 259 4 nvme1n1 1100 0 8800 550 440 0 3520 880 0 1000 1460 0 0 0 0 110 330",
    "nvme0n1p1": " 259 2 nvme0n1p1 2020 0 16160 1010 300 0 2400 600 0 1510 1610 0 0 0 0 0 0",
    "sdb": "   8 16 sdb 6 0 48 7 0 0 0 0 0 7 7 0 0 0 0 0 0",
}


def _disk_io(timestamp: float, before: dict[str, str] | None, after: dict[str, str]) -> DiskIO:
    counters = {name: parse_line(line) for name, line in after.items()}
    deltas = {}
    if before is not None:
        deltas = {name: diskstats_delta(parse_line(before[name]), cur, 1.0) for name, cur in counters.items()}
    return DiskIO(timestamp, counters, deltas)


def _nfs(
    timestamp: float, deltas: dict[str, dict[str, OpDelta]], mounts: dict[str, NFSMount] | None = None
) -> NFSStats:
    return NFSStats(timestamp, mounts or {}, deltas)


def _probe(mountpoint: str, timestamp: float, seconds: dict[str, float] | None) -> ProbeResult:
    return ProbeResult(mountpoint, timestamp, seconds, False, 0.0, None if seconds else "failed", {})


def _stats(windows: LatencyWindows, mountpoint: str, op: str, now: float) -> tuple[WindowStats, WindowStats]:
    summary = windows.summary(mountpoint, op, now)
    return summary.minute, summary.hour


# -- WindowFeeder


def test_feeder_feeds_each_source_read_once_however_often_the_snapshot_is_fed() -> None:
    windows = LatencyWindows()
    feeder = WindowFeeder(windows)
    snapshot = Snapshot(
        timestamp=T + 0.5,
        mounts=(DATA, DATA_BIND, ROOT, HOME, SHM),
        disks=_disk_io(T, BEFORE, AFTER),
        nfs=_nfs(T, {"/home": {"READ": OpDelta(8, 0.4, 0.3, 0), "COMMIT": OpDelta(2, 0.2, 0.1, 0)}}),
        probes=(_probe("/mnt/data", T - 2, {"write": 0.004, "fsync": 0.01, "read": 0.001}),),
    )
    for _ in range(3):
        feeder.feed(snapshot)
    now = T + 1
    minute, _ = _stats(windows, "/mnt/data", "read", now)
    assert (minute.samples, minute.ops) == (1, 100)
    assert minute.mean_seconds == pytest.approx(0.050 / 100)
    assert windows.summary("/mnt/data", "write", now).minute.ops == 40
    assert windows.summary("/mnt/data", "fsync", now).minute.mean_seconds == pytest.approx(0.030 / 10)
    # A bind of the same device gets the device's latency too.
    assert windows.summary("/mnt/data/shared", "read", now).minute.ops == 100
    # The partition: 20 reads; no writes in the interval and no flushes ever (the kernel counts them on the disk).
    assert windows.summary("/", "read", now).minute.ops == 20
    assert windows.summary("/", "write", now) == LatencySummary(EMPTY, EMPTY)
    assert windows.summary("/", "fsync", now) == LatencySummary(EMPTY, EMPTY)
    # NFS: READ is the mount's read, COMMIT its fsync; RTT is not what the windows hold, execute time is.
    home_read = windows.summary("/home", "read", now).minute
    assert (home_read.samples, home_read.ops, home_read.mean_seconds) == (1, 8, pytest.approx(0.05))
    assert windows.summary("/home", "fsync", now).minute.mean_seconds == pytest.approx(0.1)
    assert windows.summary("/home", "write", now) == LatencySummary(EMPTY, EMPTY)
    # The probe: one sample per operation, one operation each.
    probe_fsync = windows.summary("/mnt/data", "probe_fsync", now).minute
    assert (probe_fsync.samples, probe_fsync.ops, probe_fsync.max_seconds) == (1, 1, 0.01)
    assert set(windows.summaries_for("/mnt/data", now)) == {
        "read", "write", "fsync", "probe_write", "probe_fsync", "probe_read",
    }  # fmt: skip
    assert windows.summaries_for("/dev/shm", now) == {}


def test_feeder_feeds_a_new_read_of_one_source_without_refeeding_the_others() -> None:
    windows = LatencyWindows()
    feeder = WindowFeeder(windows)
    nfs = _nfs(T, {"/home": {"WRITE": OpDelta(4, 0.2, 0.1, 0)}})
    probe = _probe("/home", T, {"write": 0.02, "fsync": 0.05, "read": 0.003})
    feeder.feed(Snapshot(T + 0.5, (DATA, HOME), disks=_disk_io(T, BEFORE, AFTER), nfs=nfs, probes=(probe,)))
    # The next tick: diskstats was read again (a second later), NFS and the probe were not.
    feeder.feed(Snapshot(T + 1.5, (DATA, HOME), disks=_disk_io(T + 1, AFTER, AFTER), nfs=nfs, probes=(probe,)))
    feeder.feed(Snapshot(T + 2.5, (DATA, HOME), disks=_disk_io(T + 2, BEFORE, AFTER), nfs=nfs, probes=(probe,)))
    now = T + 3
    read = windows.summary("/mnt/data", "read", now).minute
    # The read at T+1 was idle (no reads: skipped); T and T+2 each had 100.
    assert (read.samples, read.ops) == (2, 200)
    assert windows.summary("/home", "write", now).minute.samples == 1
    assert windows.summary("/home", "probe_fsync", now).minute.samples == 1
    # A later NFS read and probe round are fed.
    feeder.feed(
        Snapshot(
            T + 3.5,
            (DATA, HOME),
            nfs=_nfs(T + 3, {"/home": {"WRITE": OpDelta(6, 0.6, 0.5, 0)}}),
            probes=(_probe("/home", T + 3, {"write": 0.03, "fsync": 0.07, "read": 0.004}),),
        )
    )
    write = windows.summary("/home", "write", T + 4).minute
    assert (write.samples, write.ops, write.mean_seconds) == (2, 10, pytest.approx(0.08))
    assert windows.summary("/home", "probe_fsync", T + 4).minute.max_seconds == 0.07


def test_feeder_skips_first_reads_failed_probes_and_devices_no_mount_uses() -> None:
    windows = LatencyWindows()
    feeder = WindowFeeder(windows)
    # A first read has counters but no deltas; a failed or stuck probe has no seconds.
    feeder.feed(
        Snapshot(
            T,
            (DATA, HOME),
            disks=_disk_io(T, None, BEFORE),
            nfs=_nfs(T, {}),
            probes=(_probe("/mnt/data", T, None),),
        )
    )
    assert windows.summaries(T) == {}
    # The second read is fed although the first (with the same source) was not.
    feeder.feed(Snapshot(T + 1.5, (DATA, HOME), disks=_disk_io(T + 1, BEFORE, AFTER)))
    summaries = windows.summaries(T + 2)
    assert set(summaries) == {"/mnt/data"}  # sdb changed too, but no mount is on it
    assert summaries["/mnt/data"]["read"].minute.ops == 100


def test_feeder_returns_the_samples_of_the_mounts_asked_for_and_feeds_every_mount() -> None:
    """The stall tracker judges only the mounts a GPU's work touches: the feeder hands it those samples, while every
    mount's windows are fed."""
    snapshot = Snapshot(
        T + 0.5,
        (DATA, ROOT, HOME),
        disks=_disk_io(T, BEFORE, AFTER),
        nfs=_nfs(T, {"/home": {"READ": OpDelta(8, 0.4, 0.3, 0), "COMMIT": OpDelta(2, 0.2, 0.1, 0)}}),
        probes=(_probe("/mnt/data", T - 2, {"write": 0.004, "fsync": 0.01, "read": 0.001}),),
    )
    everything = WindowFeeder(LatencyWindows()).feed(snapshot)
    windows = LatencyWindows()
    kept = WindowFeeder(windows).feed(snapshot, keep={"/home", "/mnt/data"})
    assert kept == [s for s in everything if s[0] in {"/home", "/mnt/data"}]
    assert {(mp, op) for mp, op, *_ in kept} == {
        ("/home", "read"), ("/home", "fsync"), ("/mnt/data", "read"), ("/mnt/data", "write"), ("/mnt/data", "fsync"),
        ("/mnt/data", "probe_write"), ("/mnt/data", "probe_fsync"), ("/mnt/data", "probe_read"),
    }  # fmt: skip
    assert {mp for mp, *_ in everything} == {"/", "/home", "/mnt/data"}
    assert windows.summary("/", "read", T + 1).minute.ops == 20  # not returned, still fed
    assert WindowFeeder(LatencyWindows()).feed(snapshot, keep=set()) == []


# -- LatencyWindows


def _add_series(windows: LatencyWindows, mountpoint: str, op: str, samples: list[tuple[float, float, float]]) -> None:
    for t, ops, seconds in samples:
        windows.add(mountpoint, op, t, ops, seconds)


def test_window_stats_on_known_samples() -> None:
    windows = LatencyWindows()
    # Ten one-second intervals with per-operation averages of 1..10 ms; the last one had 91 operations.
    samples = [(T + i, 1.0, (i + 1) / 1000) for i in range(9)] + [(T + 9, 91.0, 91 * 0.010)]
    _add_series(windows, "/mnt/data", "read", samples)
    minute, hour = _stats(windows, "/mnt/data", "read", T + 9)
    assert minute.samples == 10
    assert minute.ops == 100
    # Nearest rank: the p-th percentile of n values is the ceil(p * n)-th smallest, always one of the values.
    assert minute.p50_seconds == pytest.approx(0.005)  # ceil(5.0) = 5th, not the interpolated 5.5 ms
    assert minute.p95_seconds == pytest.approx(0.010)  # ceil(9.5) = 10th
    assert minute.max_seconds == pytest.approx(0.010)
    # The mean weights by operations: (1 + ... + 9 ms + 91 * 10 ms) / 100, not the average of the ten averages.
    assert minute.mean_seconds == pytest.approx((0.045 + 0.91) / 100)
    # The hour has the same samples, operations, mean and max; its percentiles are of its 15 s grains' averages, and
    # T .. T+9 is one grain (the clock's multiples of 15 fall at T-5 and T+10).
    assert (hour.samples, hour.ops, hour.max_seconds) == (minute.samples, minute.ops, minute.max_seconds)
    assert hour.mean_seconds == pytest.approx(minute.mean_seconds)
    assert hour.p50_seconds == hour.p95_seconds == pytest.approx(minute.mean_seconds)


@pytest.mark.parametrize(
    ("n", "p50_rank", "p95_rank"),
    [(1, 1, 1), (2, 1, 2), (3, 2, 3), (19, 10, 19), (20, 10, 19), (21, 11, 20), (100, 50, 95), (101, 51, 96)],
    ids=lambda v: str(v),
)
def test_nearest_rank_percentiles(n: int, p50_rank: int, p95_rank: int) -> None:
    windows = LatencyWindows()
    # 1..n ms, four a second (all within the minute), added in shuffled order: the ranks are of the sorted values.
    values = list(range(1, n + 1))
    random.Random(n).shuffle(values)
    _add_series(windows, "m", "write", [(T + i / 4, 1.0, v / 1000) for i, v in enumerate(values)])
    minute = windows.summary("m", "write", T + n / 4).minute
    assert minute.samples == n
    assert minute.p50_seconds == pytest.approx(p50_rank / 1000)
    assert minute.p95_seconds == pytest.approx(p95_rank / 1000)
    assert minute.max_seconds == pytest.approx(n / 1000)


def test_an_hour_of_one_second_samples() -> None:
    windows = LatencyWindows()
    # Samples at T+1 ... T+3600, the one at T+k averaging k ms over one operation.
    _add_series(windows, "/mnt/data", "write", [(T + k, 1.0, k / 1000) for k in range(1, 3601)])
    minute, hour = _stats(windows, "/mnt/data", "write", T + 3600)
    # The minute is [now - 60, now]: T+3540 ... T+3600, 61 samples.
    assert minute.samples == 61
    assert minute.p50_seconds == pytest.approx(3.570)  # 31st of 3540..3600
    assert minute.p95_seconds == pytest.approx(3.597)  # ceil(0.95 * 61) = 58th
    assert minute.max_seconds == pytest.approx(3.600)
    assert minute.mean_seconds == pytest.approx(3.570)
    # The hour holds all 3600: its samples, operations, max and mean are theirs.
    assert hour.samples == 3600
    assert hour.ops == 3600
    assert hour.max_seconds == pytest.approx(3.600)
    assert hour.mean_seconds == pytest.approx(1.8005)
    # Its percentiles are of the 15 s grains' averages (the clock's multiples of 15 fall at T+10+15j): T+1..T+9
    # (5 ms), then T+10+15j..T+24+15j (17 + 15j ms) for j = 0..238, then T+3595..T+3600 (3597.5 ms), 241 values.
    # Nearest rank: the 121st is j = 119's, the 229th j = 227's.
    assert hour.p50_seconds == pytest.approx(1.802)
    assert hour.p95_seconds == pytest.approx(3.422)


def test_samples_older_than_the_window_are_left_out() -> None:
    windows = LatencyWindows()
    _add_series(windows, "/home", "read", [(T, 1.0, 2.0), (T + 100, 4.0, 0.004)])
    minute, hour = _stats(windows, "/home", "read", T + 130)
    assert (minute.samples, minute.ops, minute.max_seconds, minute.mean_seconds) == (1, 4, 0.001, 0.001)
    assert (hour.samples, hour.ops, hour.max_seconds) == (2, 5, 2.0)
    assert hour.mean_seconds == pytest.approx(2.004 / 5)
    # A minute and a bit after the last sample, the minute is empty; the hour still has both.
    minute, hour = _stats(windows, "/home", "read", T + 100 + MINUTE + 1)
    assert minute == EMPTY
    assert hour.samples == 2
    # An hour and a bit after the first, it has left the hour.
    minute, hour = _stats(windows, "/home", "read", T + HOUR + 1)
    assert minute == EMPTY
    assert (hour.samples, hour.max_seconds) == (1, 0.001)
    # And after the last too: nothing, with no statistics at all.
    minute, hour = _stats(windows, "/home", "read", T + 100 + HOUR + 1)
    assert hour == EMPTY
    assert (hour.p50_seconds, hour.p95_seconds, hour.max_seconds, hour.mean_seconds) == (None, None, None, None)


def test_idle_intervals_and_impossible_samples_are_not_recorded() -> None:
    windows = LatencyWindows()
    windows.add("/", "read", T, 0, 0.0)
    windows.add("/", "read", T, 5, -1.0)
    assert windows.summaries_for("/", T) == {}
    windows.add("/", "read", T, 5, 0.0)
    assert windows.summary("/", "read", T).minute.mean_seconds == 0.0


def test_a_full_ring_keeps_the_newest_samples() -> None:
    windows = LatencyWindows(capacity=10)
    _add_series(windows, "/", "read", [(T + k, 1.0, k / 1000) for k in range(1, 26)])
    minute = windows.summary("/", "read", T + 25).minute
    assert (minute.samples, minute.max_seconds) == (10, 0.025)
    assert minute.mean_seconds == pytest.approx(sum(range(16, 26)) / 10 / 1000)


def test_forget_idle_drops_only_keys_idle_for_an_hour() -> None:
    windows = LatencyWindows()
    windows.add("/old", "read", T, 1, 0.001)
    windows.add("/old", "write", T + 2000, 1, 0.001)
    windows.add("/busy", "read", T + 3000, 1, 0.001)
    windows.forget_idle(T + HOUR)  # /old read is exactly an hour old: kept
    assert set(windows.summaries_for("/old", T + HOUR)) == {"read", "write"}
    windows.forget_idle(T + HOUR + 1)
    assert set(windows.summaries_for("/old", T + HOUR + 1)) == {"write"}
    assert set(windows.summaries_for("/busy", T + HOUR + 1)) == {"read"}
    windows.forget_idle(T + 3000 + HOUR + 1)
    assert windows.summaries_for("/old", T + 3000 + HOUR + 1) == {}
    assert windows.summaries_for("/busy", T + 3000 + HOUR + 1) == {}
    # A forgotten key starts afresh when its mount does I/O again.
    windows.add("/old", "read", T + 9000, 2, 0.010)
    assert windows.summary("/old", "read", T + 9000).hour.samples == 1


def test_forget_drops_mountpoints_gone_from_the_mount_table() -> None:
    windows = LatencyWindows()
    windows.add("/gone", "read", T, 1, 0.001)
    windows.add("/gone", "write", T + 30, 1, 0.001)
    windows.add("/new-nfs", "read", T + 30, 1, 0.001)  # NFS statistics name a new mount before the table does
    windows.add("/mounted-idle", "read", T, 1, 0.001)
    mounted = {"/mounted-idle"}
    # The table read at T+35 lacks /gone, whose last I/O was 5 s before: not yet (the margin for a read's length).
    windows.forget(T + 40, mounted, table_time=T + 30 + GONE_MARGIN_SECONDS)
    assert set(windows.summaries(T + 40)) == {"/gone", "/new-nfs", "/mounted-idle"}
    windows.forget(T + 40, mounted, table_time=T + 30 + GONE_MARGIN_SECONDS + 1)
    assert set(windows.summaries(T + 40)) == {"/mounted-idle"}  # /new-nfs, not in a table read after its I/O: gone
    assert len(windows) == 1
    # One whose I/O is newer than the last read of the table is kept however long ago that read was.
    windows.add("/newer", "read", T + 100, 1, 0.001)
    windows.forget(T + 500, mounted, table_time=T + 90)
    assert set(windows.summaries(T + 500)) == {"/mounted-idle", "/newer"}
    # Without a table read, nothing is taken for gone.
    windows.forget(T + 1000, set(), table_time=None)
    assert len(windows) == 2
    # A mounted mountpoint is kept until it has been idle for an hour, as forget_idle does.
    windows.forget(T + HOUR + 1, {"/mounted-idle", "/newer"}, table_time=T + HOUR)
    assert set(windows.summaries(T + HOUR + 1)) == {"/newer"}


def test_forget_keeps_at_most_max_mountpoints_the_most_recently_busy() -> None:
    windows = LatencyWindows(max_mountpoints=3)
    for i in range(6):
        windows.add(f"/m{i}", "read", T + (i * 7) % 6, 1, 0.001)  # newest samples at T+0, 1, 2, 3, 4, 5 shuffled
    assert len(windows) == 6
    windows.forget(T + 6, None)
    kept = set(windows.summaries(T + 6))
    assert kept == {f"/m{i}" for i in range(6) if (i * 7) % 6 >= 3}


def test_an_hours_window_holds_its_samples_in_flat_arrays() -> None:
    """A window full of an hour of one-a-second samples, read every 15 s as the View does, holds under 32 KB: the
    minute's samples one by one, and the hour's 15 s grains (each 40 bytes in flat arrays, its latency 8 more while it
    is in the hour). Every sample of the hour kept one by one took 115 KB a window, 35 to 44 MB after an hour on
    bench/at_scale.py's node of 384 busy windows; a list of floats for the sorted latencies had taken 202 KB."""
    import tracemalloc

    tracemalloc.start()
    try:
        windows = LatencyWindows()
        for k in range(1, 3601):
            windows.add("/mnt/data", "write", T + k, 1.0, (k % 97) / 1000)
            if k % 15 == 0:
                windows.summary("/mnt/data", "write", T + k)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert windows.summary("/mnt/data", "write", T + 3600).hour.samples == 3600
    assert held < 24 * 1024


def test_a_short_lived_window_holds_only_its_own_samples() -> None:
    windows = LatencyWindows()
    _add_series(windows, "/pod-volume", "write", [(T + k, 1.0, 0.002) for k in range(3)])
    window = windows._rings["/pod-volume"]["write"]
    ring = window.minute
    assert [len(a) for a in (ring.t, ring.ops, ring.secs)] == [3, 3, 3]  # not the capacity's each from the start
    assert len(window.hour.t) == 0  # its one grain is still open: nothing closed, nothing stored
    full = LatencyWindows(capacity=5)
    _add_series(full, "/", "read", [(T + k, 1.0, k / 1000) for k in range(1, 13)])
    ring = full._rings["/"]["read"].minute
    assert [len(a) for a in (ring.t, ring.ops, ring.secs)] == [5, 5, 5]
    assert list(ring.t) == [T + k for k in (11, 12, 8, 9, 10)]  # wrapped: the oldest overwritten first
    assert full.summary("/", "read", T + 12).minute.max_seconds == 0.012


def _mounts_read(at: float, success: bool = True) -> CollectorStatus:
    return CollectorStatus("mounts", success, 0.01, at if success else None)


def test_feeder_forgets_gone_mounts_and_probe_timestamps_every_ten_seconds() -> None:
    windows = LatencyWindows()
    feeder = WindowFeeder(windows)
    pod = "/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/x"
    pod_mount = _mount(pod, "/dev/nvme1n1", "xfs", MountDevice("nvme1n1", ("nvme1n1",)))
    feeder.feed(
        Snapshot(T, (DATA, pod_mount), disks=_disk_io(T, BEFORE, AFTER), probes=(_probe(pod, T, {"write": 0.01}),))
    )
    assert set(windows.summaries(T)) == {"/mnt/data", pod}
    assert "probe:" + pod in feeder._fed
    feeder.forget(Snapshot(T, (DATA, pod_mount), collectors=(_mounts_read(T),)))
    assert set(windows.summaries(T)) == {"/mnt/data", pod}
    # The pod is deleted: the next read of the mount table lacks its volume, and its windows go.
    later = T + FORGET_EVERY_SECONDS
    feeder.forget(Snapshot(later, (DATA,), collectors=(_mounts_read(later),)))
    assert set(windows.summaries(later)) == {"/mnt/data"}
    assert "probe:" + pod not in feeder._fed
    # It looks again only ten seconds after it last looked.
    windows.add("/elsewhere", "read", T, 1, 0.001)
    feeder.forget(Snapshot(later + 9, (DATA,), collectors=(_mounts_read(later + 9),)))
    assert set(windows.summaries(later + 9)) == {"/mnt/data", "/elsewhere"}
    feeder.forget(Snapshot(later + 10, (DATA,), collectors=(_mounts_read(later + 10),)))
    assert set(windows.summaries(later + 10)) == {"/mnt/data"}
    # A failing mount source, or no mounts at all: nothing is taken for gone.
    windows.add("/elsewhere", "read", later + 11, 1, 0.001)
    feeder.forget(Snapshot(later + 100, (DATA,), collectors=(_mounts_read(later + 100, success=False),)))
    feeder.forget(Snapshot(later + 200, (), collectors=(_mounts_read(later + 200),)))
    assert set(windows.summaries(later + 200)) == {"/mnt/data", "/elsewhere"}


def test_summaries_forget_idle_keys_too() -> None:
    windows = LatencyWindows()
    windows.add("/old", "read", T, 1, 0.001)
    windows.add("/busy", "read", T + 3000, 1, 0.001)
    assert set(windows.summaries(T + 3000)) == {"/old", "/busy"}
    assert set(windows.summaries(T + HOUR + 1)) == {"/busy"}
    assert windows.summaries_for("/old", T + HOUR + 1) == {}


# -- mount_io


@pytest.fixture
def nfs_mounts() -> dict[str, NFSMount]:
    parsed, errors = parse_mountstats((GPU_NODE / "proc" / "1" / "mountstats").read_bytes())
    assert errors == []
    return {m.mountpoint: m for m in parsed}


def test_mount_io_joins_the_device_counters_nfs_stats_and_probe(nfs_mounts: dict[str, NFSMount]) -> None:
    pvc = _mount(PVC, "10.0.0.5:/exports/pvc-07397231-7729-49b7-8e49-313542c11b05", "nfs4")
    disks = _disk_io(T, BEFORE, AFTER)
    probe = _probe(PVC, T - 3, {"write": 0.004, "fsync": 0.012, "read": 0.0008})
    other_probe = _probe("/mnt/data", T - 1, {"write": 0.001, "fsync": 0.002, "read": 0.0001})
    snapshot = Snapshot(
        T + 0.5,
        (DATA, ROOT, HOME, pvc, SHM),
        disks=disks,
        nfs=_nfs(T, {}, nfs_mounts),
        probes=(other_probe, probe),
    )
    windows = LatencyWindows()
    WindowFeeder(windows).feed(snapshot)

    data = mount_io(DATA, snapshot, windows)
    assert data.device == "nvme1n1"
    assert data.counters is disks.counters["nvme1n1"]
    assert isinstance(data.counters, DiskStats) and data.counters.reads_completed == 1100
    assert data.nfs is None
    assert data.probe is other_probe
    assert set(data.latency) == {"read", "write", "fsync", "probe_write", "probe_fsync", "probe_read"}
    assert data.latency["read"].minute.ops == 100

    root = mount_io(ROOT, snapshot, windows)
    assert (root.device, root.counters, root.probe) == ("nvme0n1p1", disks.counters["nvme0n1p1"], None)
    assert set(root.latency) == {"read"}

    home = mount_io(HOME, snapshot, windows)
    assert home.device is None and home.counters is None
    assert home.nfs is nfs_mounts["/home"]
    read = home.nfs.operation("READ")
    assert read is not None and read.requests == 120_331
    assert home.probe is None
    assert home.latency == {}

    pvc_io = mount_io(pvc, snapshot, windows)
    assert pvc_io.nfs is nfs_mounts[PVC]
    assert pvc_io.probe is probe
    assert set(pvc_io.latency) == {"probe_write", "probe_fsync", "probe_read"}
    assert pvc_io.latency["probe_fsync"].minute.max_seconds == 0.012

    shm = mount_io(SHM, snapshot, windows)
    assert (shm.device, shm.counters, shm.nfs, shm.probe, shm.latency) == (None, None, None, None, {})


def test_mount_io_without_facts_or_windows() -> None:
    snapshot = Snapshot(T, (DATA, HOME))
    for mount in (DATA, HOME):
        io = mount_io(mount, snapshot, None)
        assert (io.counters, io.nfs, io.probe, io.latency) == (None, None, None, {})
    assert mount_io(DATA, snapshot, None).device == "nvme1n1"
    # A device that has vanished from diskstats (a detached loop device) has no counters.
    gone = _mount("/mnt/img", "/dev/loop9", "ext4", MountDevice("loop9", ("loop9",), "/srv/img"))
    io = mount_io(gone, Snapshot(T, (gone,), disks=_disk_io(T, BEFORE, AFTER)), LatencyWindows())
    assert (io.device, io.counters, io.latency) == ("loop9", None, {})


def test_hour_window_shows_a_new_maximum_at_once() -> None:
    """The hour summary is cached for a while; a sample above its maximum must not wait for the refresh."""
    from storwatch.analysis.latency import LatencyWindows

    w = LatencyWindows()
    w.add("/m", "write", 100.0, 10, 0.01)  # 1 ms
    assert w.summary("/m", "write", 100.0).hour.max_seconds == pytest.approx(0.001)
    w.add("/m", "write", 101.0, 1, 0.5)  # 500 ms, one second later: well within the cache's lifetime
    summary = w.summary("/m", "write", 101.0)
    assert summary.minute.max_seconds == pytest.approx(0.5)
    assert summary.hour.max_seconds == pytest.approx(0.5)
    assert summary.hour.samples == 2


def test_a_wrapped_ring_finds_windows_in_either_half_or_across_both() -> None:
    windows = LatencyWindows(capacity=10)
    # Samples 20 s apart: the ring keeps k = 16..25; k = 21..25 sit at the front of its arrays, 16..20 behind them.
    _add_series(windows, "/", "read", [(T + 20 * k, 1.0, k / 1000) for k in range(1, 26)])
    ring_stats = windows.summary("/", "read", T + 500).minute  # [T+440, T+500]: k = 22..25, the newer half only
    assert (ring_stats.samples, ring_stats.max_seconds) == (4, 0.025)
    assert windows.summary("/", "read", T + 400).minute.samples == 4  # k = 17..20: the older half only
    across = windows.summary("/", "read", T + 440).minute  # k = 19..22: across both
    assert (across.samples, across.ops, across.max_seconds) == (4, 4, 0.022)
    assert across.mean_seconds == pytest.approx((19 + 20 + 21 + 22) / 4 / 1000)
    # The hour is kept apart from the minute's samples: k = 1..22, nothing newer than now.
    assert windows.summary("/", "read", T + 440).hour.samples == 22


def test_mount_latency_is_summarised_when_first_read_as_of_its_view() -> None:
    windows = LatencyWindows()
    windows.add("/data", "write", T, 2, 0.004)
    lazy = MountLatency(windows, "/data", T)
    windows.add("/data", "write", T + 1, 1, 0.5)  # after the View's time: not in it
    windows.add("/data", "read", T + 1, 1, 0.5)
    assert set(lazy) == {"write", "read"}
    assert lazy["write"].minute.samples == 1 and lazy["write"].minute.max_seconds == pytest.approx(0.002)
    assert lazy["read"] == LatencySummary(EMPTY, EMPTY)
    windows.add("/data", "fsync", T, 1, 0.001)  # once read, it stays as read
    assert len(lazy) == 2 and dict(lazy) == lazy


def _hour_by_hand(samples: list[tuple[float, float, float]], now: float) -> WindowStats:
    grains: dict[float, list[tuple[float, float, float]]] = {}
    for sample in samples:
        grains.setdefault(sample[0] // GRAIN_SECONDS, []).append(sample)
    inside = [g for g in grains.values() if now - HOUR <= g[-1][0] <= now]
    if not inside:
        return EMPTY
    averages = sorted(math.fsum(s[2] for s in g) / math.fsum(s[1] for s in g) for g in inside)
    every = [s for g in inside for s in g]
    ops = math.fsum(s[1] for s in every)

    def rank(q: float) -> float:
        return averages[max(1, math.ceil(q * len(averages))) - 1]

    return WindowStats(
        len(every), ops, math.fsum(s[2] for s in every) / ops, rank(0.5), rank(0.95), max(s[2] / s[1] for s in every)
    )


@pytest.mark.parametrize("seed", range(12))
def test_the_hour_kept_sorted_between_reads_is_the_hour_computed_afresh(seed: int) -> None:
    """Random cadences (sub-second ones), pauses longer than the hour, reads seldom and often, and reads of an older
    View: every read equals the hour worked out by hand from every sample added: the 15 s grains (aligned to the
    clock) whose newest sample is within the hour, whole; their samples' count, operations, mean and max, and the
    nearest-rank percentiles of the grains' averages."""
    rng = random.Random(seed)
    capacity = rng.choice([10, 50, 3600])
    windows = LatencyWindows(capacity=capacity)
    added: list[tuple[float, float, float]] = []
    t = T
    for _ in range(600):
        t += rng.choice([0.25, 1.0, 1.0, 7.0, 400.0, HOUR + 5])
        sample = (t, float(rng.randint(1, 50)), rng.choice([0.0, rng.random() / 100]))
        windows.add("/m", "write", *sample)
        added.append(sample)
        if rng.random() < 0.3:
            now = t - rng.choice([0.0, 0.0, 0.5, 30.0]) if rng.random() < 0.2 else t + rng.choice([0.0, 10.0, 900.0])
            got = windows.summary("/m", "write", now).hour
            want = _hour_by_hand(added, now)
            assert (got.samples, got.max_seconds) == (want.samples, want.max_seconds)
            # A grain's sums are added up as its samples come, by hand in one go: equal but for the last bits.
            if want.p50_seconds is None:
                assert (got.p50_seconds, got.p95_seconds) == (None, None)
            else:
                assert (got.p50_seconds, got.p95_seconds) == (
                    pytest.approx(want.p50_seconds, rel=1e-12, abs=1e-18),
                    pytest.approx(want.p95_seconds, rel=1e-12, abs=1e-18),
                )
            assert got.ops == pytest.approx(want.ops)
            if want.mean_seconds is None:
                assert got.mean_seconds is None
            else:
                assert got.mean_seconds == pytest.approx(want.mean_seconds, rel=1e-9, abs=1e-15)


def test_feeder_loses_no_io_when_a_source_read_twice_between_two_ticks(tmp_path: Path) -> None:
    """The tick takes only each source's newest facts; a source's worker reads every second on a cadence of its own,
    so now and then two reads come between two ticks (a tick that takes a while). The change of the read never taken
    is still fed: the next sample is worked out from the counters of the facts fed last, and spans both seconds."""
    from storwatch.config import DiskIOConfig, NFSConfig
    from storwatch.paths import HostPaths
    from storwatch.sources.diskio import DiskIOSource
    from storwatch.sources.nfs import NFSSource

    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    clock = iter([T, T + 1, T + 2, T + 3])
    disks = DiskIOSource(HostPaths(procfs=str(proc)), DiskIOConfig(), clock=lambda: next(clock))
    nfs_clock = iter([T, T + 1, T + 2, T + 3])
    nfs_source = NFSSource(HostPaths(procfs=str(proc)), NFSConfig(), clock=lambda: next(nfs_clock))

    def nfs_block(write: int) -> str:  # each WRITE taking 25 ms to execute
        return (
            "device filer:/home mounted on /home with fstype nfs4 statvers=1.1\n\tage:\t100\n\tper-op statistics\n"
            f"\t        READ: 0 0 0 0 0 0 0 0 0\n\t       WRITE: {write} {write} 0 0 0 0 0 {write * 25} 0\n"
            "\t      COMMIT: 0 0 0 0 0 0 0 0 0\n"
        )

    reads = []
    for i, (reads_done, writes) in enumerate([(1000, 100), (1100, 140), (1150, 200)]):
        # nvme1n1: 50 ms of reads for each 100 reads; the NFS mount's writes go up with them
        line = f" 259 4 nvme1n1 {reads_done} 0 8000 {reads_done // 2} 400 0 3200 800 0 900 1300 0 0 0 0 100 300"
        (proc / "diskstats").write_text(line + "\n")
        (proc / "1" / "mountstats").write_text(nfs_block(writes))
        reads.append((disks.collect(), nfs_source.collect()))
        assert reads[-1][0].timestamp == T + i
    windows = LatencyWindows()
    feeder = WindowFeeder(windows)
    fed = []
    for disk_io, nfs_stats in (reads[0], reads[2]):  # the tick never took the second reads
        fed += feeder.feed(Snapshot(disk_io.timestamp + 0.5, (DATA, HOME), disks=disk_io, nfs=nfs_stats))
    now = T + 3
    read = windows.summary("/mnt/data", "read", now).minute
    assert (read.samples, read.ops, read.mean_seconds) == (1, 150, pytest.approx(0.075 / 150))
    write = windows.summary("/home", "write", now).minute
    assert (write.samples, write.ops, write.mean_seconds) == (1, 100, pytest.approx(0.025))
    # each sample spans both seconds: from the facts fed before to the newest
    assert sorted((mp, op, start, end, ops) for mp, op, start, end, ops, _ in fed if ops) == [
        ("/home", "write", T, T + 2, 100),
        ("/mnt/data", "read", T, T + 2, 150),
    ]
