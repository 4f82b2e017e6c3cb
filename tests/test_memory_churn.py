"""Memory under mount churn: 10,000 pod volumes mounted and unmounted leave the agent's RSS where 100 left it.

The agent's own code runs in a child process (tests/mount_churn.py, which says how and why it drives the sources
directly on a fixture host rather than through 10,000 real mounts), so the RSS measured is the agent's alone. Before
the latency windows of unmounted volumes were forgotten, RSS went from 37 MB to 82 MB over these 10,000 cycles (and
with the windows' arrays allocated whole, about 86 KB per operation per volume, into gigabytes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CYCLES = 10_000


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rss_after_10000_mount_cycles_within_10_percent_of_after_100(tmp_path: Path) -> None:
    args = ["--root", str(tmp_path), "--cycles", str(CYCLES), "--at", "100", "--at", str(CYCLES)]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.mount_churn", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=840,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    rss = result["rss_bytes"]
    early, late = rss["100"], rss[str(CYCLES)]
    assert late <= 1.10 * early, f"RSS {early / 2**20:.1f} MB after 100 cycles, {late / 2**20:.1f} MB after {CYCLES}"
    # The churn reached every per-key table it is meant to: latency windows, probes, checkpoint runs, devices.
    seen = result["most_seen_at_once"]
    assert seen["latency"] >= 10 and seen["probed"] >= 10 and seen["runs"] >= 10, seen
    assert seen["devices"] > 3, seen  # the three base disks and the churning loop devices
    assert seen["usage_errors"] == 0, seen
    assert result["windows_at_end"] < 200 and result["max_windows"] < 500, result


def test_probe_histograms_of_unmounted_volumes_go_with_them(tmp_path: Path) -> None:
    from storwatch.config import ProbesConfig
    from storwatch.paths import HostPaths
    from storwatch.sources.probe import ProbeSource, ProbeTarget
    from storwatch.vocabulary import Durability

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    targets = [ProbeTarget("/a", Durability.NODE, False), ProbeTarget("/b", Durability.NODE, False)]
    source = ProbeSource(
        HostPaths(rootfs=str(tmp_path)),
        ProbesConfig(classes=(Durability.NODE,), timeout_seconds=5.0),
        lambda: targets,
        clock=lambda: 1_800_000_000.0,
    )
    try:
        first = {r.mountpoint: r for r in source.collect()}
        assert {mp for mp, r in first.items() if r.seconds is not None} == {"/a", "/b"}, first
        assert first["/b"].histograms["write"].count == 1
        del targets[1]  # /b is unmounted
        (second,) = source.collect()
        assert second.mountpoint == "/a" and second.histograms["write"].count == 2
        assert source.histogram_mountpoints == {"/a"}
        targets.append(ProbeTarget("/b", Durability.NODE, False))  # mounted again: counted from the start
        again = {r.mountpoint: r for r in source.collect()}
        assert again["/b"].histograms["write"].count == 1 and again["/a"].histograms["write"].count == 3
    finally:
        source.close()


def test_device_line_caches_are_bounded_by_the_mounts_in_the_file() -> None:
    from storwatch.sources.mountstats_reader import MountStatsReader, OperationLines

    reader, finder = MountStatsReader(lambda errors: None), OperationLines(("READ",))
    block = (
        "device 10.0.0.5:/v{i} mounted on /mnt/v{i} with fstype nfs4 statvers=1.1\n"
        "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)\n\tper-op statistics\n"
        "\t        READ: 1 1 0 128 4096 1 2 3\n\n"
    )
    most = 0
    for first in range(0, 2000, 5):  # five NFS mounts at a time, each replaced by new ones on the next read
        data = "".join(block.format(i=i) for i in range(first, first + 5)).encode()
        mounts, errors = reader.read(data)
        assert len(mounts) == 5 and not errors
        assert len(finder.find(data)) == 5
        most = max(most, len(reader._heads), len(finder._heads))
    assert most <= 2 * 6 + 64  # device_line_bound of a file of five mounts, not 4,096 lines of unmounted ones
