"""The running agent in a 256 MiB memory cgroup (the DaemonSet's limit) while three checkpoint roots each hold a
legal safetensors file whose 14.6 MB header lists 250,000 tensors, rewritten every few seconds so each scan checks
all three again at once: no OOM kill for a minute, the checkpoints collector succeeds, and every file is judged."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.agentproc import AgentProcess, running_agent, wait_until
from tests.builders import release_cgroup
from tests.wide_headers import wide_safetensors

MIB = 1 << 20
CGROUP_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")
SUCCESS = re.compile(r'^storwatch_collector_success\{collector="checkpoints"\} (\S+)$', re.MULTILINE)


class MemoryCgroup:
    """A child memory cgroup with a limit (v2 where the unified hierarchy has the memory controller, else v1)."""

    def __init__(self, path: Path, v2: bool) -> None:
        self.path = path
        self.v2 = v2

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> set[int]:
        return {int(p) for p in (self.path / "cgroup.procs").read_text().split()}

    def oom_kills(self) -> int:
        name = "memory.events" if self.v2 else "memory.oom_control"
        fields = dict(line.split() for line in (self.path / name).read_text().splitlines())
        return int(fields.get("oom_kill", 0))

    def peak(self) -> int:
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        return int((self.path / name).read_text())


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[MemoryCgroup]:
    """The cgroup, removed at the end (its processes moved back to the parent first)."""
    controllers = CGROUP_V2 / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        parent, v2 = CGROUP_V2, True
    elif (CGROUP_V1 / "cgroup.procs").exists():
        parent, v2 = CGROUP_V1, False
    else:
        pytest.skip("no memory cgroup controller (v2 or v1) under /sys/fs/cgroup")
    group = parent / f"storwatch-test-{os.getpid()}-{secrets.token_hex(3)}"
    group.mkdir()
    try:
        (group / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))
        if v2:
            (group / "memory.swap.max").write_text("0")
        yield MemoryCgroup(group, v2)
    finally:
        release_cgroup(group, parent)


def _status(agent: AgentProcess) -> dict[str, Any]:
    resp = agent.fetch("/api/status")
    assert resp.status == 200
    data: dict[str, Any] = json.loads(resp.body)
    return data


def _verdicts(agent: AgentProcess) -> dict[str, str]:
    return {c["path"]: c["verdict"] for run in _status(agent)["checkpoints"] for c in run["checkpoints"]}


def _success(agent: AgentProcess) -> float | None:
    m = SUCCESS.search(agent.fetch("/metrics").text())
    return float(m.group(1)) if m else None


@pytest.mark.realpart
def test_three_roots_of_wide_headers_in_a_256_mib_cgroup(tmp_path: Path) -> None:
    roots = [tmp_path / f"root{i}" for i in range(3)]
    for root in roots:
        (root / "run").mkdir(parents=True)
    staging = tmp_path / "staging"
    staging.mkdir()
    wide = wide_safetensors(staging / "model.safetensors")
    config = tmp_path / "storwatch.yaml"
    config.write_text(
        "tick_seconds: 0.5\ngpu: {enabled: false}\nmounts: {interval_seconds: 5}\n"
        f"checkpoints:\n  roots: {json.dumps([str(r) for r in roots])}\n  kubelet: false\n"
        "  interval_seconds: 2\n  settle_seconds: 1\n  deep_per_scan: 3\n"
    )
    targets = [root / "run" / "model.safetensors" for root in roots]
    with (
        memory_cgroup(256 * MIB) as group,
        running_agent("--config", str(config), "--listen", "127.0.0.1:0", timeout=20) as agent,
    ):
        # The agent and the helpers it started: every process of it, inside the limit. The agent first, then its
        # children as listed after that (one forked while the agent moved may have stayed behind), until none is left.
        group.add(agent.pid)
        for _ in range(5):
            outside = {c.pid for c in psutil.Process(agent.pid).children(recursive=True)} - group.pids()
            for pid in outside:
                group.add(pid)
            if not outside:
                break
            time.sleep(0.2)
        # The files arrive once the agent is inside the cgroup, each a hard link of the one written.
        for target in targets:
            os.link(wide, target)

        def judged() -> bool:
            verdicts = _verdicts(agent)
            return all(verdicts.get(str(t)) == "complete" for t in targets)

        wait_until(judged, 60, what="the three wide headers judged complete")
        # A minute of scans that each check all three again: a new mtime (in the past, so settled) every 3 s.
        ends = time.monotonic() + 60
        base = time.time() - 3600
        rounds = 0
        while time.monotonic() < ends:
            rounds += 1
            for target in targets:
                os.utime(target, (base + rounds, base + rounds))
            time.sleep(3)
            assert agent.running(), agent.stderr_text()[-3000:]
            assert group.oom_kills() == 0, agent.stderr_text()[-3000:]
        wait_until(judged, 30, what="the three wide headers judged complete after the minute")
        success = wait_until(lambda: _success(agent) == 1.0 or None, 20, what="checkpoints collector success 1")
        helpers = psutil.Process(agent.pid).children(recursive=True)
        print(
            f"3 roots x 250,000-tensor headers, {rounds} rewrites: cgroup peak {group.peak() / MIB:.0f} MiB, "
            f"oom_kill {group.oom_kills()}, agent RSS {psutil.Process(agent.pid).memory_info().rss / MIB:.0f} MiB, "
            f"helpers {[round(h.memory_info().rss / MIB) for h in helpers]} MiB"
        )
        assert success and group.oom_kills() == 0 and agent.running()
        assert group.pids() >= {agent.pid, *(h.pid for h in helpers)}
