"""The agent's quiet pace in the real agent (storwatch/pace.py): a node with a GPU but no GPU process goes quiet
after ``quiet_after_seconds`` (Views and diskstats reads every ``quiet_seconds``), and the first GPU process the fake
NVML library names brings full pace back at once, with the process attributed to its pod.

The agent runs as a subprocess on a fixture procfs (tests/fixtures/gpu-node) with the scripted fake
libnvidia-ml.so.1 (tests/nvml); the script is rewritten to start the GPU process.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agentproc import AgentProcess, running_agent, wait_until
from tests.nvml import FakeNVML, FakeNVMLUnavailable, build_fake_nvml

pytestmark = pytest.mark.realpart

FIXTURES = Path(__file__).parent / "fixtures"
TICK, QUIET, QUIET_AFTER = 0.2, 2.0, 1.0
GPU = "gpu 0 uuid=GPU-00000000-aaaa-bbbb-cccc-000000000000 name=NVIDIA_H100_80GB_HBM3 util=0 mem_total=85899345920\n"
POD_UID = "17fdde9d-3dd3-4c7b-a4cb-601d19e3597e"  # tests/fixtures/cgroup/containerd-cgroupfs-v1


def _config(tmp_path: Path, more: str = "tick_cpu_share: 0\nview_cpu_share: 0\n") -> Path:
    """The agent's config; ``more`` is added to it (by default neither the second's work nor the View has a CPU
    budget, so full pace is a tick and a View every TICK however busy the machine is)."""
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    shutil.copy(FIXTURES / "gpu-node" / "proc" / "1" / "mountinfo", proc / "1" / "mountinfo")
    shutil.copy(FIXTURES / "gpu-node" / "proc" / "diskstats", proc / "diskstats")
    (proc / "4103").mkdir()
    shutil.copy(FIXTURES / "cgroup" / "containerd-cgroupfs-v1", proc / "4103" / "cgroup")
    (tmp_path / "root").mkdir()
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        f"tick_seconds: {TICK}\nview_seconds: {TICK}\nquiet_seconds: {QUIET}\nquiet_after_seconds: {QUIET_AFTER}\n"
        f"paths: {{procfs: {proc}, sysfs: {FIXTURES / 'gpu-node' / 'sys'}, rootfs: {tmp_path / 'root'}}}\n"
        "mounts: {interval_seconds: 5, statvfs_timeout_seconds: 0.2}\n"
        f"diskio: {{interval_seconds: {TICK}}}\n"
        f"gpu: {{interval_seconds: {TICK}, call_timeout_seconds: 1.0}}\n"
        "kube: {enabled: false}\n" + more
    )
    return cfg


def _tick_interval(agent: AgentProcess) -> float | None:
    for family in text_string_to_metric_families(agent.fetch("/metrics").body.decode()):
        for s in family.samples:
            if s.name == "storwatch_tick_interval_seconds":
                return float(s.value)
    return None


def _seen_over(agent: AgentProcess, seconds: float) -> tuple[list[float], list[float]]:
    """The distinct View times, and the distinct diskstats success times, that /api/status showed over ``seconds``
    (polled every 0.05 s)."""
    views: list[float] = []
    reads: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        data = json.loads(agent.fetch("/api/status").body)
        read = next(c["last_success_timestamp"] for c in data["collectors"] if c["name"] == "diskstats")
        for seen, value in ((views, data["generated_at"]), (reads, read)):
            if value is not None and (not seen or value != seen[-1]):
                seen.append(value)
        time.sleep(0.05)
    return views, reads


def _fake_nvml(tmp_path: Path, script: str) -> FakeNVML:
    try:
        lib = build_fake_nvml(tmp_path / "nvml")
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))
    fake = FakeNVML(lib.parent, tmp_path)
    fake.write_script(script)
    return fake


def _assert_apart(agent: AgentProcess, seconds: float, over: float) -> None:
    """Views, and diskstats reads, at least ``seconds`` apart over ``over`` seconds (the clock is the agent's own).
    The first value seen may come from before the pace changed, and one wait begun then may still end a tick later:
    the gaps are counted from the second value on."""
    views, reads = _seen_over(agent, over)
    assert len(views) >= 3 and len(reads) >= 3, (views, reads)
    for times in (views, reads):
        gaps = [b - a for a, b in itertools.pairwise(times[1:])]
        assert min(gaps) >= seconds - 0.15, (times, gaps)


def test_a_node_without_gpu_processes_goes_quiet_and_the_first_process_wakes_it(tmp_path: Path) -> None:
    fake = _fake_nvml(tmp_path, GPU)
    with running_agent("--config", str(_config(tmp_path)), "--listen", "127.0.0.1:0", env=fake.env()) as agent:
        agent.wait_for_stderr("quiet: no GPU process", timeout=30)
        wait_until(lambda: _tick_interval(agent) == QUIET, timeout=10, what="the quiet tick interval exported")
        _assert_apart(agent, QUIET, 3 * QUIET + 2)  # quiet: a View, and a diskstats read, every quiet_seconds

        mark = agent.stderr_mark()
        fake.write_script(GPU + "proc 0 pid=4103 used=1073741824\n")
        agent.wait_for_stderr("full pace again", timeout=15, since=mark)
        wait_until(lambda: _tick_interval(agent) == TICK, timeout=10, what="the full-pace tick interval exported")

        def attributed() -> bool:
            data = json.loads(agent.fetch("/api/status").body)
            procs = [p for g in data["gpus"] for p in g["processes"]]
            return any(p["pid"] == 4103 and p["pod_uid"] == POD_UID for p in procs)

        wait_until(attributed, timeout=10, what="the GPU process attributed to its pod")
        views, reads = _seen_over(agent, 3.0)
        # Full pace: Views, and diskstats reads, far closer together than the quiet interval.
        for times in (views, reads):
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert gaps and min(gaps) < QUIET / 2, (times, gaps)


def test_the_seconds_work_over_its_budget_stretches_ticks_and_paced_reads(tmp_path: Path) -> None:
    """A node at work (a GPU process) whose second-by-second work costs more than tick_cpu_share of a core (here a
    share no round fits in): ticks, Views and the diskstats reads come tick_max_seconds apart, not every TICK, and
    the exported tick interval says so."""
    fake = _fake_nvml(tmp_path, GPU + "proc 0 pid=4103 used=1073741824\n")
    stretched = 1.0
    cfg = _config(tmp_path, f"tick_cpu_share: 0.000000001\ntick_max_seconds: {stretched}\n")
    with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=fake.env()) as agent:
        wait_until(lambda: _tick_interval(agent) == stretched, timeout=30, what="the stretched tick interval")
        _assert_apart(agent, stretched, 4 * stretched + 1)
        assert "quiet:" not in agent.stderr_text()
