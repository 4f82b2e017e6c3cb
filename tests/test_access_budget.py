"""The access source's budget per pass, on a real process tree heavy in open files (tests/fdtree.py): a GPU process
with 200 children that each inherit 2,000 open files on a tmpfs mount. Every pass reads at most its budget of
processes and open files, reads the GPU process first, says it sampled, and covers the whole tree over a few passes;
in the running agent (a fake NVML naming the tree's parent as a GPU process) the access collector reports success
with the sampling shown in /metrics and /api/status, and the workload's counters are exported by name, without a
PID."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from storwatch.paths import HostPaths
from storwatch.sources.access import AccessConfig, AccessSource
from tests.agentproc import running_agent, wait_until
from tests.builders import host_mounts
from tests.fdtree import fd_tree
from tests.nvml import FakeNVMLUnavailable, build_fake_nvml
from tests.realmounts import tmpfs_mount

T = TypeVar("T")
Enter = Callable[[ContextManager[T]], T]
CHILDREN, FDS = 200, 2_000
BUDGET = {"max_processes": 1_000, "max_fds": 300, "max_processes_per_pass": 50, "max_fds_per_pass": 500}


def budget_config(cpu_seconds: float) -> AccessConfig:
    """BUDGET, and a CPU time per pass."""
    return AccessConfig(
        max_processes=BUDGET["max_processes"],
        max_fds=BUDGET["max_fds"],
        max_processes_per_pass=BUDGET["max_processes_per_pass"],
        max_fds_per_pass=BUDGET["max_fds_per_pass"],
        max_cpu_seconds_per_pass=cpu_seconds,
    )


@pytest.mark.realpart
def test_each_pass_keeps_to_its_budget_and_the_tree_is_covered_over_passes(
    real_mounts: Enter[Any], tmp_path: Path
) -> None:
    mount = real_mounts(tmpfs_mount(tmp_path / "data", size="8m"))
    with fd_tree(mount.mountpoint / "shard", CHILDREN, FDS) as gpu_pid:
        config = budget_config(60.0)
        source = AccessSource(HostPaths(), config, lambda: [gpu_pid], host_mounts, time.time)
        passes = math.ceil((CHILDREN + 1) / BUDGET["max_processes_per_pass"]) + 1
        for n in range(1, passes + 1):
            facts = source.collect()
            w = facts.workloads[gpu_pid]
            assert facts.processes_read <= BUDGET["max_processes_per_pass"], facts
            assert facts.fds_read <= BUDGET["max_fds_per_pass"], facts
            assert set(facts.sampled) == {"processes", "fds"} and w.sampled, facts
            assert str(mount.mountpoint) in w.mounts_read and str(mount.mountpoint) in w.mounts_written, w
            # the GPU process is read in every pass, and the rest in turns: the processes read add up
            assert w.processes == min(CHILDREN + 1, n * (BUDGET["max_processes_per_pass"] - 1) + 1), (n, w)
        assert w.processes == CHILDREN + 1 and w.processes_known == CHILDREN + 1
        assert w.io.syscr > 0 and w.within is None
        # a CPU budget too small for even one process: the GPU process's counters are still read
        tight_config = budget_config(0.001)
        tight = AccessSource(HostPaths(), tight_config, lambda: [gpu_pid], host_mounts, time.time)
        facts = tight.collect()
        assert "cpu" in facts.sampled and facts.workloads[gpu_pid].sampled
        assert 1 <= facts.processes_read < BUDGET["max_processes_per_pass"]


def test_a_small_tree_within_the_budget_is_read_whole(tmp_path: Path) -> None:
    with fd_tree(tmp_path / "f", 3, 10) as gpu_pid:
        source = AccessSource(HostPaths(), AccessConfig(), lambda: [gpu_pid], host_mounts, time.time)
        facts = source.collect()
        w = facts.workloads[gpu_pid]
        assert facts.sampled == () and not w.sampled and w.processes == 4
        assert facts.processes_read == 4 and facts.fds_read >= 4 * 10


@pytest.mark.realpart
def test_the_agent_reports_every_interval_with_the_sampling_shown(real_mounts: Enter[Any], tmp_path: Path) -> None:
    try:
        lib = build_fake_nvml(tmp_path / "nvml")
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))
    mount = real_mounts(tmpfs_mount(tmp_path / "data", size="8m"))
    with fd_tree(mount.mountpoint / "shard", CHILDREN, FDS) as gpu_pid:
        script = tmp_path / "nvml-script.txt"
        script.write_text(
            "gpu 0 uuid=GPU-access-0000 name=Fake util=50 mem_used=1073741824 mem_total=85899345920\n"
            f"proc 0 pid={gpu_pid} used=1073741824\n"
        )
        cfg = tmp_path / "storwatch.yaml"
        budget = ", ".join(f"{k}: {v}" for k, v in BUDGET.items())
        cfg.write_text(
            "tick_seconds: 0.2\nplatform: generic\nmounts: {interval_seconds: 1}\nkube: {enabled: false}\n"
            "gpu: {interval_seconds: 0.2, samples_interval_seconds: 0}\n"
            f"access: {{interval_seconds: 0.5, {budget}}}\n"
        )
        env = {"LD_LIBRARY_PATH": str(lib.parent), "FAKE_NVML_SCRIPT": str(script)}
        with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=env, timeout=30) as agent:

            def sampled_workload() -> dict[str, Any] | None:
                status = json.loads(agent.fetch("/api/status").body)
                rows = [w for w in status["workloads"] if w["pid"] == gpu_pid]
                return rows[0] if rows and rows[0]["processes"] == CHILDREN + 1 else None

            row = wait_until(sampled_workload, 30, what="the whole tree read over the passes")
            assert row["sampled"] is True and str(mount.mountpoint) in row["mounts_read"], row
            text = agent.fetch("/metrics").text()
            values = dict(re.findall(r"^(storwatch_(?:collector_success|workload_scan_\w+)\S*) (\S+)$", text, re.M))
            assert values['storwatch_collector_success{collector="access"}'] == "1.0", values
            assert float(values["storwatch_workload_scan_processes"]) <= BUDGET["max_processes_per_pass"]
            assert float(values["storwatch_workload_scan_fds"]) <= BUDGET["max_fds_per_pass"]
            assert values['storwatch_workload_scan_budget_reached{budget="processes"}'] == "1.0", values
            # the workload's counters, named by the GPU process's command (it is in no pod or job), never by PID
            assert 'pid="' not in text, text
            comm = Path(f"/proc/{gpu_pid}/comm").read_text().strip()
            assert f'storwatch_workload_read_calls_total{{workload="process:{comm}"}} ' in text, text
