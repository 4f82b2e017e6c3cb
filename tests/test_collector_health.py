"""Honest collector health in the real agent: inputs that cannot be read or parsed, and sources that are off.

The agent runs as a process on fixture trees (``--path.procfs`` through its config): a mount table, diskstats and
mountstats that are garbage, empty or missing must each give ``storwatch_collector_success 0`` with an error naming
the file, on /metrics, /api/status and /status, and success again once the file is good. A node without Kubernetes
(and a config without GPUs or probes) exports no up-series for those collectors: they are off, not failing.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agentproc import AgentProcess, running_agent, wait_until

FIXTURES = Path(__file__).parent / "fixtures"
GPU_NODE = FIXTURES / "gpu-node"
MALFORMED_MOUNTINFO = FIXTURES / "malformed" / "proc" / "1" / "mountinfo"
FILE_COLLECTORS = {"mounts": "1/mountinfo", "diskstats": "diskstats", "nfs": "1/mountstats"}
"""The collectors that read one procfs file each, and that file."""
GOOD_FILES = {"1/mountinfo": GPU_NODE / "proc" / "1" / "mountinfo", "diskstats": GPU_NODE / "proc" / "diskstats",
              "1/mountstats": GPU_NODE / "proc" / "1" / "mountstats"}  # fmt: skip
GARBAGE = b"\x00\xde\xad\xbe\xef a torn read\nnothing here is a record\n\tnor this\n"
# No cluster credentials: the Kubernetes source is off, whatever the machine running the tests has.
NO_CLUSTER = {"KUBECONFIG": None, "KUBERNETES_SERVICE_HOST": None}


def write_config(tmp_path: Path, proc: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        "tick_seconds: 0.2\nplatform: generic\n"
        f"paths: {{procfs: {proc}, sysfs: {GPU_NODE / 'sys'}, rootfs: {root}}}\n"
        "mounts: {interval_seconds: 0.5, statvfs_timeout_seconds: 0.5}\n"
        "diskio: {interval_seconds: 0.2}\nnfs: {interval_seconds: 0.2}\n"
        "gpu: {enabled: false}\n"
    )
    return cfg


def scrape(agent: AgentProcess) -> dict[tuple[str, str], float]:
    """(metric, collector label or "") -> value, for the metrics this file looks at."""
    out = {}
    for family in text_string_to_metric_families(agent.fetch("/metrics").body.decode()):
        for s in family.samples:
            if s.name.startswith(
                ("storwatch_collector_", "storwatch_parse_errors", "storwatch_kube_", "storwatch_nvml")
            ):
                out[(s.name, s.labels.get("collector", ""))] = s.value
    return out


def collectors(agent: AgentProcess) -> dict[str, dict[str, Any]]:
    resp = agent.fetch("/api/status")
    if resp.status != 200:
        return {}
    return {c["name"]: c for c in json.loads(resp.body)["collectors"]}


def wait_states(agent: AgentProcess, states: dict[str, str], timeout: float = 15.0) -> dict[str, dict[str, Any]]:
    def probe() -> dict[str, dict[str, Any]] | None:
        now = collectors(agent)
        return now if all(now.get(name, {}).get("state") == state for name, state in states.items()) else None

    return wait_until(probe, timeout=timeout, what=f"collector states {states}")


def write_inputs(proc: Path, kind: str) -> None:
    for relative in FILE_COLLECTORS.values():
        path = proc / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        if kind == "garbage":
            path.write_bytes(GARBAGE)
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "good":
            shutil.copy(GOOD_FILES[relative], path)


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("garbage", "could be parsed, {n} malformed; the first: line 1"),
        ("empty", ": empty: no "),
        ("missing", "cannot read "),
    ],
)
def test_inputs_that_cannot_be_read_or_parsed_fail_their_collectors_until_they_can(
    tmp_path: Path, kind: str, error: str
) -> None:
    proc = tmp_path / "proc"
    write_inputs(proc, kind)
    with running_agent(
        "--config", str(write_config(tmp_path, proc)), "--listen", "127.0.0.1:0", env=NO_CLUSTER
    ) as agent:
        status = wait_states(agent, dict.fromkeys(FILE_COLLECTORS, "failed"))
        metrics = scrape(agent)
        page = agent.fetch("/status").body.decode()
        for name, relative in FILE_COLLECTORS.items():
            assert metrics[("storwatch_collector_success", name)] == 0, name
            assert metrics[("storwatch_collector_enabled", name)] == 1, name
            assert ("storwatch_collector_last_success_timestamp_seconds", name) not in metrics  # never succeeded
            message = status[name]["error"]
            assert str(proc / relative) in message, message  # the file is named
            bad_lines = GARBAGE.count(b"\n") if kind == "garbage" else 0
            assert error.format(n=bad_lines) in message, message
            assert metrics[("storwatch_parse_errors_total", name)] >= bad_lines
            assert f"{name}: FAILED" in page and str(proc / relative) in page
        if kind == "garbage":  # counted at every read: the counters go on rising while the files stay bad
            before = metrics[("storwatch_parse_errors_total", "diskstats")]
            wait_until(
                lambda: scrape(agent)[("storwatch_parse_errors_total", "diskstats")] >= before + 2 * bad_lines or None,
                timeout=10.0,
                what="more bad diskstats lines counted",
            )

        write_inputs(proc, "good")
        wait_states(agent, dict.fromkeys(FILE_COLLECTORS, "ok"))

        def recovered() -> dict[tuple[str, str], float] | None:
            m = scrape(agent)
            return m if all(m[("storwatch_collector_success", name)] == 1 for name in FILE_COLLECTORS) else None

        metrics = wait_until(recovered, timeout=10.0, what="the recovery on /metrics")
        for name in FILE_COLLECTORS:
            assert metrics[("storwatch_collector_success", name)] == 1, name
            assert metrics[("storwatch_collector_last_success_timestamp_seconds", name)] > time.time() - 60


@pytest.fixture(scope="module")
def quiet_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    """An agent on a node without Kubernetes, GPUs or probes, whose mount table has one line with ``\\000``."""
    tmp_path = tmp_path_factory.mktemp("quiet-node")
    proc = tmp_path / "proc"
    write_inputs(proc, "good")
    shutil.copy(MALFORMED_MOUNTINFO, proc / "1" / "mountinfo")
    with running_agent(
        "--config", str(write_config(tmp_path, proc)), "--listen", "127.0.0.1:0", env=NO_CLUSTER
    ) as agent:
        wait_states(agent, dict.fromkeys(FILE_COLLECTORS, "ok"))
        yield agent


def test_a_mountinfo_line_with_an_escaped_nul_fails_only_itself(quiet_node: AgentProcess) -> None:
    text = quiet_node.fetch("/metrics").body.decode()
    infos = {
        s.labels["mountpoint"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "storwatch_mount_info"
    }
    # The good lines of the malformed fixture (but /sys, a pseudo filesystem) are reported; the three bad ones not.
    assert infos == {"/", "/run", "/mnt/local-nvme", "/home", "/lustre"}
    assert 'mountpoint="/mnt/torn' not in text
    metrics = scrape(quiet_node)
    assert metrics[("storwatch_collector_success", "mounts")] == 1
    errors = metrics[("storwatch_parse_errors_total", "mounts")]
    assert errors >= 3 and errors % 3 == 0  # three bad lines at each read of the table
    wait_until(
        lambda: scrape(quiet_node)[("storwatch_parse_errors_total", "mounts")] > errors or None,
        timeout=5.0,
        what="the next read of the mount table counted",
    )
    assert "mountinfo: skipping malformed line 9: mount point holds a NUL byte" in quiet_node.stderr_text()


def test_collectors_that_are_off_export_no_up_series_and_say_off(quiet_node: AgentProcess) -> None:
    metrics = scrape(quiet_node)
    for name in ("kube", "gpu", "processes", "probe", "checkpoints"):
        assert metrics[("storwatch_collector_enabled", name)] == 0, name
        assert ("storwatch_collector_success", name) not in metrics, name
    assert ("storwatch_kube_api_up", "") not in metrics  # no cluster here: nothing to page about
    assert ("storwatch_nvml_up", "") not in metrics
    for name in ("mounts", "diskstats", "nfs"):
        assert metrics[("storwatch_collector_enabled", name)] == 1, name

    status = collectors(quiet_node)
    assert status["kube"]["state"] == "off" and "kubeconfig" in status["kube"]["off_reason"]
    assert status["kube"]["success"] is False and status["kube"]["error"] is None
    assert status["gpu"]["off_reason"] == "gpu.enabled is false in the configuration"
    assert status["probe"]["off_reason"] == "no probes.classes or probes.mountpoints chosen"
    # The fixture's /home is NFS (durable) and its NVMe mount is not under this test's root: nowhere to look.
    assert status["checkpoints"]["off_reason"].startswith(
        "no place searched for checkpoints, so nothing is known of what this node would lose: checkpoints.roots is "
        "empty, and this node has no node-local home directories, scratch or data mounts and no kubelet pod volumes"
    )
    page = quiet_node.fetch("/status").body.decode()
    assert "kube: off (no in-cluster service account token and no kubeconfig" in page
    assert "kube: ok" not in page and "gpu: ok" not in page
    assert "The GPU collector is off: gpu.enabled is false in the configuration." in page


def test_status_page_says_ok_failed_or_off_and_escapes_what_the_input_said() -> None:
    from storwatch.analysis.view import View
    from storwatch.report import view_to_dict
    from storwatch.snapshot import Snapshot
    from storwatch.vocabulary import CollectorStatus, Platform
    from storwatch.web import render_status_page

    # A bad line is quoted in the error, and a mount path (under a tenant's control) can hold markup.
    bad = "/proc/1/mountinfo: no mount could be parsed, 1 malformed; the first: line 1: '<img src=x onerror=alert(1)>'"
    view = View(
        Snapshot(
            timestamp=1.0,
            collectors=(
                CollectorStatus("mounts", False, 0.01, None, bad, parse_errors=1),
                CollectorStatus("diskstats", True, 0.001, 1.0, parse_errors=0),
                CollectorStatus("kube", False, 0.0, None, off_reason="kube.enabled is false in the configuration"),
            ),
        ),
        platform=Platform("generic", "config"),
        mounts=(),
    )
    data = view_to_dict(view)
    assert [(c["name"], c["state"], c["enabled"], c["parse_errors"]) for c in data["collectors"]] == [
        ("mounts", "failed", True, 1),
        ("diskstats", "ok", True, 0),
        ("kube", "off", False, None),
    ]
    page = render_status_page(data)
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "mounts: FAILED /proc/1/mountinfo: no mount could be parsed" in page
    assert "diskstats: ok" in page
    assert "kube: off (kube.enabled is false in the configuration)" in page
    # No GPU source at all in this View: NVML was never asked, and the page says why the table is empty.
    assert "no GPUs: NVML not available" in page
