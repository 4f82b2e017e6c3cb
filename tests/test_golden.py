"""The golden full scrape: the gpu-node fixture through the mount source, the classifier, the View and the exporter.

The rendered exposition is compared, as a whole text, with ``tests/fixtures/gpu-node/golden.prom``. After an
intended change to the metrics, rewrite the file with::

    STORWATCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_golden.py

and review the diff of golden.prom before committing it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from storwatch.analysis.view import build_view
from storwatch.blocking import CallOutcome
from storwatch.classify import Classifier
from storwatch.config import MountsConfig
from storwatch.exporter import Exporter
from storwatch.model import CollectorStatus, Platform, Snapshot
from storwatch.paths import HostPaths
from storwatch.sources.mounts import MountSource

FIXTURES = Path(__file__).parent / "fixtures"
GPU_NODE = FIXTURES / "gpu-node"
GOLDEN = GPU_NODE / "golden.prom"
PROMTOOL = "/usr/bin/promtool"
UPDATE = os.environ.get("STORWATCH_UPDATE_GOLDEN") == "1"

GiB = 1 << 30
TiB = 1 << 40

POD_A = "/var/lib/kubelet/pods/81742e8f-be31-4219-bac3-e2ed48dd4123/volumes"


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


def render_scrape() -> str:
    source = MountSource(HostPaths(procfs=str(GPU_NODE / "proc")), MountsConfig(), calls=FakeStatvfs())  # type: ignore[arg-type]
    mounts = source.collect()
    status = CollectorStatus("mounts", True, 0.0125, 1_700_000_000.0)
    snapshot = Snapshot(timestamp=1_700_000_000.5, mounts=mounts, collectors=(status,))
    platform = Platform("together-k8s", "configured")
    view = build_view(snapshot, Classifier(platform.name), platform)
    return Exporter(process_metrics=False).render(view).decode("utf-8")


def normalise(text: str) -> str:
    """The Python version in storwatch_build_info depends on the machine; nothing else in the scrape does."""
    return re.sub(r'(storwatch_build_info\{[^}]*python=")[^"]*(")', r"\1PYTHON_VERSION\2", text)


def test_golden_scrape() -> None:
    text = normalise(render_scrape())
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


def test_golden_scrape_says_what_the_fixture_means() -> None:
    """Spot checks that hold whatever the golden file says, so a careless rewrite of it cannot hide a regression."""
    text = render_scrape()
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
    infos = [line for line in text.splitlines() if line.startswith("storwatch_mount_info{")]
    assert len(infos) == 28
    # No process metrics were asked for.
    assert "process_" not in text


@pytest.mark.realpart
def test_promtool_check_metrics_is_clean_on_the_scrape() -> None:
    if not os.path.exists(PROMTOOL) or shutil.which(PROMTOOL) is None:
        pytest.skip(f"{PROMTOOL} not installed (Debian package prometheus)")
    text = render_scrape()
    result = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text.encode("utf-8"), capture_output=True, timeout=60, check=False
    )
    output = (result.stdout + result.stderr).decode("utf-8", "replace")
    assert output == ""
    assert result.returncode == 0
