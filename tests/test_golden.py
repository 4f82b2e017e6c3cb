"""The golden full scrape: the gpu-node fixture through the sources, the classifier, the View and the exporter.

The host is the fixture alone: its mount table, sysfs (block device topology), diskstats and mountstats. The I/O
sources read twice, 10 s apart on a fake clock (``proc/`` then ``10s-later/``), so deltas and latency windows exist;
one mount has a probe result. The rendered exposition is compared, as a whole text, with
``tests/fixtures/gpu-node/golden.prom``. After an intended change to the metrics, rewrite the file with::

    STORWATCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_golden.py

and review the diff of golden.prom before committing it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.golden_scrape import GPU_NODE, POD_A, PROBED, PVC, RBD_PVC, GiB, TiB, render_scrape

GOLDEN = GPU_NODE / "golden.prom"
PROMTOOL = "/usr/bin/promtool"
UPDATE = os.environ.get("STORWATCH_UPDATE_GOLDEN") == "1"


def normalise(text: str) -> str:
    """The Python version in storwatch_build_info depends on the machine; nothing else in the scrape does."""
    return re.sub(r'(storwatch_build_info\{[^}]*python=")[^"]*(")', r"\1PYTHON_VERSION\2", text)


def test_golden_scrape(tmp_path: Path) -> None:
    text = normalise(render_scrape(tmp_path))
    if UPDATE:
        GOLDEN.write_text(text, encoding="utf-8")
    assert GOLDEN.exists(), f"{GOLDEN} is missing; run with STORWATCH_UPDATE_GOLDEN=1 to create it"
    golden = GOLDEN.read_text(encoding="utf-8")
    assert text == golden, (
        "the scrape differs from the golden file; if the change is intended, rewrite it with "
        "STORWATCH_UPDATE_GOLDEN=1 and review the diff"
    )


def _sample(text: str, name: str, labels: dict[str, str]) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_golden_scrape_says_what_the_fixture_means(tmp_path: Path) -> None:
    """Spot checks that hold whatever the golden file says, so a careless rewrite of it cannot hide a regression."""
    text = render_scrape(tmp_path)
    assert _sample(text, "storwatch_platform_info", {"platform": "together-k8s", "detected_by": "configured"}) == 1
    assert _sample(text, "storwatch_mount_stuck", {"mountpoint": "/home"}) == 1
    assert _sample(text, "storwatch_mount_stuck_seconds", {"mountpoint": "/home"}) == 12.5
    assert _sample(text, "storwatch_mount_size_bytes", {"mountpoint": "/home"}) is None
    assert _sample(text, "storwatch_mount_size_bytes", {"mountpoint": "/mnt/s3fs-checkpoints"}) is None
    assert _sample(text, "storwatch_mount_stuck", {"mountpoint": "/mnt/s3fs-checkpoints"}) == 0
    assert _sample(text, "storwatch_mount_size_bytes", {"mountpoint": "/"}) == 500 * GiB
    assert _sample(text, "storwatch_mount_avail_bytes", {"mountpoint": "/mnt/local-nvme"}) == 3 * TiB
    assert _sample(text, "storwatch_mount_readonly", {"mountpoint": "/snap/core20/2318"}) == 1
    assert _sample(text, "storwatch_mount_readonly", {"mountpoint": "/"}) == 0
    # The bind with "ro" in its mount options, on a non-UTF-8 path shown as a \xNN escape.
    assert _sample(text, "storwatch_mount_readonly", {"mountpoint": "/mnt/local-nvme/users/jos\\xe9"}) == 1
    assert _sample(text, "storwatch_mount_durability", {"mountpoint": "/home", "durability": "cluster"}) == 1
    assert _sample(text, "storwatch_mount_durability", {"mountpoint": "/home", "durability": "node"}) == 0
    assert _sample(text, "storwatch_mount_info", {"mountpoint": "/mnt/s3-datasets", "durability": "region",
                                                  "fstype": "fuse", "device": "mountpoint-s3"}) == 1  # fmt: skip
    assert _sample(text, "storwatch_mount_info", {"mountpoint": f"{POD_A}/kubernetes.io~empty-dir/dshm",
                                                  "durability": "volatile"}) == 1  # fmt: skip
    assert _sample(text, "storwatch_mount_info", {"mountpoint": "/mnt/local-nvme/shared data"}) == 1
    assert _sample(text, "storwatch_mount_info", {"mountpoint": "/mnt/local-nvme/exp\ttabbed"}) == 1
    assert _sample(text, "storwatch_mount_info", {"mountpoint": "/mnt/local-nvme/users/CORP\\alice"}) == 1
    assert _sample(text, "storwatch_mount_info", {"mountpoint": "/proc"}) is None
    assert _sample(text, "storwatch_collector_success", {"collector": "mounts"}) == 1
    assert _sample(text, "storwatch_collector_duration_seconds", {"collector": "mounts"}) == 0.0125
    assert _sample(text, "storwatch_collector_last_success_timestamp_seconds", {"collector": "mounts"}) == 1.7e9
    assert _sample(text, "storwatch_collector_enabled", {"collector": "mounts"}) == 1
    assert _sample(text, "storwatch_collector_enabled", {"collector": "kube"}) == 0
    assert _sample(text, "storwatch_collector_success", {"collector": "kube"}) is None
    assert "storwatch_kube_api_up" not in text
    # The fixture's files parse whole; probes parse no lines, so they have no parse error series.
    assert _sample(text, "storwatch_parse_errors_total", {"collector": "mounts"}) == 0
    assert _sample(text, "storwatch_parse_errors_total", {"collector": "nfs"}) == 0
    assert _sample(text, "storwatch_parse_errors_total", {"collector": "probe"}) is None
    infos = [line for line in text.splitlines() if line.startswith("storwatch_mount_info{")]
    assert len(infos) == 28
    # No process metrics were asked for.
    assert "process_" not in text


def test_golden_scrape_io_says_what_the_fixture_means(tmp_path: Path) -> None:
    """Spot checks of the I/O part against the fixture's numbers (diskstats and mountstats of the second read)."""
    samples = [s for family in text_string_to_metric_families(render_scrape(tmp_path)) for s in family.samples]

    def sample(name: str, **labels: str) -> float | None:
        found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
        return found[0] if found else None

    # Block devices come from the fixture's sysfs, not this machine's.
    assert sample("storwatch_mount_device_info", mountpoint="/", device="nvme0n1p1", physical="nvme0n1") == 1
    assert sample("storwatch_mount_device_info", mountpoint="/boot/efi", device="nvme0n1p15", physical="nvme0n1") == 1
    assert sample("storwatch_mount_device_info", mountpoint="/snap/core20/2318", device="loop0", physical="loop0") == 1
    assert sample("storwatch_mount_device_info", mountpoint=RBD_PVC, device="rbd0", physical="rbd0") == 1
    assert sample("storwatch_mount_device_info", mountpoint="/mnt/local-nvme/shared data", device="nvme1n1") == 1
    assert sample("storwatch_mount_device_info", mountpoint="/home") is None  # NFS on top of the ext4 /home
    assert sample("storwatch_mount_device_info", mountpoint=PVC) is None

    # Disk counters: times in seconds, bytes = 512-byte sectors * 512, gauges of the second read.
    assert sample("storwatch_disk_reads_completed_total", device="nvme1n1") == 912_873_402
    assert sample("storwatch_disk_read_bytes_total", device="nvme1n1") == 466_220_584_010 * 512
    assert sample("storwatch_disk_written_bytes_total", device="nvme0n1p15") == 2 * 512
    assert sample("storwatch_disk_read_time_seconds_total", device="rbd0") == pytest.approx(90_116.382)
    assert sample("storwatch_disk_flush_requests_total", device="nvme0n1") == 812_983
    assert sample("storwatch_disk_flush_requests_time_seconds_total", device="nvme1n1") == pytest.approx(201.387)
    assert sample("storwatch_disk_discarded_bytes_total", device="nvme0n1p1") == 3_844_210_816 * 512
    assert sample("storwatch_disk_io_time_weighted_seconds_total", device="dm-0") == pytest.approx(8_631.343)
    assert sample("storwatch_disk_io_now", device="nvme1n1") == 17
    assert sample("storwatch_disk_reads_completed_total", device="loop2") is None  # never used: no series
    # Busy time over the 10 s between the reads.
    assert sample("storwatch_disk_utilization_ratio", device="nvme0n1p1") == pytest.approx(0.09)
    assert sample("storwatch_disk_utilization_ratio", device="nvme1n1") == pytest.approx(0.999)
    assert sample("storwatch_disk_utilization_ratio", device="rbd0") == pytest.approx(0.8)
    assert sample("storwatch_disk_utilization_ratio", device="dm-0") == 0

    # A mount's counters are its device's; every bind of the data disk shares them.
    for mp in ("/mnt/local-nvme", "/mnt/local-nvme/users/jos\\xe9", f"{POD_A}/kubernetes.io~empty-dir/cache"):
        assert sample("storwatch_mount_reads_completed_total", mountpoint=mp) == 912_873_402
        assert sample("storwatch_mount_written_bytes_total", mountpoint=mp) == 162_716_825_984 * 512
        assert sample("storwatch_mount_flushes_completed_total", mountpoint=mp) == 402_213
    assert sample("storwatch_mount_write_time_seconds_total", mountpoint="/") == pytest.approx(19_303.876)
    # NFS mounts: READ, WRITE and COMMIT per-op counters (execute time, WRITE's bytes sent).
    assert sample("storwatch_mount_reads_completed_total", mountpoint=PVC) == 813_044
    assert sample("storwatch_mount_written_bytes_total", mountpoint=PVC) == 3_466_527_956_880
    assert sample("storwatch_mount_flush_time_seconds_total", mountpoint=PVC) == pytest.approx(112.404)
    assert sample("storwatch_mount_flushes_completed_total", mountpoint="/home") == 1_203

    # NFS per-op and transport counters.
    assert sample("storwatch_nfs_operations_total", mountpoint=PVC, operation="WRITE") == 3_305_220
    assert sample("storwatch_nfs_transmissions_total", mountpoint=PVC, operation="WRITE") == 3_305_223
    assert sample("storwatch_nfs_rtt_seconds_total", mountpoint=PVC, operation="READ") == pytest.approx(3_609.612)
    assert sample("storwatch_nfs_errors_total", mountpoint="/home", operation="LOOKUP") == 3_011
    assert sample("storwatch_nfs_operations_total", mountpoint="/home", operation="RENAME") is None  # never used
    assert sample("storwatch_nfs_transport_connects_total", mountpoint="/home", transport="0", protocol="tcp") == 4
    assert sample("storwatch_nfs_transport_sends_total", mountpoint=PVC, transport="7", protocol="tcp") == 528_670
    assert sample("storwatch_nfs_bytes_total", mountpoint=PVC, kind="server_write") == 3_305_220 * (1 << 20)

    # Latency windows from the deltas: one 10 s interval each (p50 = p95 = max = mean).
    def latency(mp: str, op: str, window: str, stat: str) -> float | None:
        return sample("storwatch_mount_latency_seconds", mountpoint=mp, op=op, window=window, stat=stat)

    assert latency("/", "read", "1m", "p50") == pytest.approx(0.100 / 200)
    assert latency("/", "write", "1h", "mean") == pytest.approx(1.000 / 500)
    assert latency("/", "fsync", "1m", "mean") is None  # the kernel counts flushes on the whole disk only
    assert latency("/mnt/local-nvme/shared data", "read", "1m", "max") == pytest.approx(12.0 / 40_000)
    assert latency(RBD_PVC, "fsync", "1m", "p95") == pytest.approx(3.0 / 60)
    assert latency(PVC, "write", "1m", "mean") == pytest.approx(60.0 / 4_000)
    assert latency(PVC, "fsync", "1h", "p50") == pytest.approx(0.400 / 20)
    assert latency("/home", "read", "1m", "mean") is None  # hung: nothing completed between the reads
    assert latency("/snap/core20/2318", "read", "1m", "mean") is None  # idle between the reads
    # The probe's rounds: 0.0025 and 0.004 s in the last minute; 0.3 s half an hour ago, in the hour only.
    assert latency(PVC, "probe_write", "1m", "p50") == pytest.approx(0.0025)
    assert latency(PVC, "probe_write", "1m", "p95") == pytest.approx(0.004)
    assert latency(PVC, "probe_write", "1m", "mean") == pytest.approx(0.00325)
    assert latency(PVC, "probe_write", "1h", "p50") == pytest.approx(0.004)
    assert latency(PVC, "probe_write", "1h", "max") == pytest.approx(0.3)
    assert latency(PVC, "probe_fsync", "1h", "mean") == pytest.approx((0.3 + 0.009 + 0.012) / 3)

    # The probe histogram as the source gave it.
    assert sample("storwatch_probe_duration_seconds_bucket", mountpoint=PVC, op="fsync", le="0.025") == 19
    assert sample("storwatch_probe_duration_seconds_bucket", mountpoint=PVC, op="write", le="+Inf") == 20
    assert sample("storwatch_probe_duration_seconds_count", mountpoint=PVC, op="read") == 20
    assert sample("storwatch_probe_duration_seconds_sum", mountpoint=PVC, op="write") == 0.375
    assert sample("storwatch_probe_success", mountpoint=PVC) == 1
    assert sample("storwatch_probe_last_timestamp_seconds", mountpoint=PVC) == PROBED
    assert sample("storwatch_probe_success", mountpoint="/") is None


@pytest.mark.realpart
def test_promtool_check_metrics_is_clean_on_the_scrape(tmp_path: Path) -> None:
    if not os.path.exists(PROMTOOL) or shutil.which(PROMTOOL) is None:
        pytest.skip(f"{PROMTOOL} not installed (Debian package prometheus)")
    text = render_scrape(tmp_path)
    result = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text.encode("utf-8"), capture_output=True, timeout=60, check=False
    )
    output = (result.stdout + result.stderr).decode("utf-8", "replace")
    assert output == ""
    assert result.returncode == 0
