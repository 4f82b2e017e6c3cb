"""Liveness that means alive: a reload on a quiet node, /healthz when the tick stops, SIGTERM whatever a thread does.

- A reload on a quiet node (no GPU process for ``quiet_after_seconds``) took the collectors' lock twice: the
  driver-upgrade steps of docs/gpus.md (``gpu: {enabled: false}`` and SIGHUP, on a node drained of its jobs) locked
  the agent up, its Views stopped, /healthz kept answering 200 and only SIGKILL ended it.
- /healthz answers 503, saying why, once the tick has not run for three of its intervals (the interval in force: a
  quiet node ticks every ``quiet_seconds``, and is not dead for it); the DaemonSet's liveness probe asks /healthz.
- SIGTERM ends the agent within 5 s (docs/agent.md, "Signals and reloading"), whatever a thread is doing: a reload
  runs off the main thread, and stop() closes the parts against one deadline.

The agents run as subprocesses at their defaults, on the fixture procfs of a GPU node, with the scripted fake
libnvidia-ml.so.1 (tests/nvml) loaded by the real bindings. ``quiet_after_seconds: 1`` is the one default changed
where a test needs the quiet node: what is under test is the reload on such a node, not how long a node takes to go
quiet. A stuck NVML call is the fake library's ``slow`` rule: the call sleeps in the library as a driver's would.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from storwatch.agent import PACED_SOURCES, Agent
from storwatch.agent.tick import LIVENESS_INTERVALS, TickerLiveness
from storwatch.config import Config
from tests.agentproc import AgentProcess, running_agent, wait_until
from tests.nvml import FakeNVML, FakeNVMLUnavailable, build_fake_nvml

FIXTURES = Path(__file__).parent / "fixtures"
GPU = "gpu 0 uuid=GPU-00000000-aaaa-bbbb-cccc-000000000000 name=NVIDIA_H100_80GB_HBM3 util=0 mem_total=85899345920\n"
AT_WORK = GPU + "proc 0 pid=4103 used=1073741824\n"
"""The GPU with a process on it: the node is never quiet."""
STUCK_POWER = "slow nvmlDeviceGetPowerUsage ms=600000 gpu=0 times=1\n"
"""The next power reading does not return for ten minutes (a GPU fallen off the bus)."""
SIGTERM_SECONDS = 5.0
"""docs/agent.md, "Signals and reloading": SIGTERM stops the agent within seconds; this file holds it to 5 s."""


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml"))
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))


def _config(tmp_path: Path, gpu: str = "", more: str = "") -> Path:
    """The fixture GPU node's procfs (process 4103 in a pod) and sysfs, an empty root; everything else at defaults
    but what the test adds (``gpu``: inside the ``gpu`` section; ``more``: top-level lines)."""
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    shutil.copy(FIXTURES / "gpu-node" / "proc" / "1" / "mountinfo", proc / "1" / "mountinfo")
    shutil.copy(FIXTURES / "gpu-node" / "proc" / "diskstats", proc / "diskstats")
    (proc / "4103").mkdir()
    shutil.copy(FIXTURES / "cgroup" / "containerd-cgroupfs-v1", proc / "4103" / "cgroup")
    (tmp_path / "root").mkdir()
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        f"paths: {{procfs: {proc}, sysfs: {FIXTURES / 'gpu-node' / 'sys'}, rootfs: {tmp_path / 'root'}}}\n"
        "kube: {enabled: false}\n"  # no Kubernetes API here: the source would only say so
        f"gpu: {{{gpu}}}\n" + more
    )
    return cfg


def _generated_at(agent: AgentProcess) -> float | None:
    value = json.loads(agent.fetch("/api/status").body)["generated_at"]
    return None if value is None else float(value)


def _views_after(agent: AgentProcess, after: float | None, count: int, timeout: float) -> list[float]:
    """Wait for ``count`` Views newer than the one generated at ``after``; /healthz must answer 200 all along (at the
    quiet pace the tick comes every quiet_seconds, far more than three tick_seconds)."""
    seen: list[float] = []
    deadline = time.monotonic() + timeout
    while len(seen) < count:
        health = agent.fetch("/healthz")
        assert (health.status, health.body) == (200, b"ok\n"), health.body
        at = _generated_at(agent)
        if at is not None and (after is None or at > after) and (not seen or at > seen[-1]):
            seen.append(at)
        assert time.monotonic() < deadline, f"{len(seen)} of {count} Views within {timeout} s: {seen}"
        time.sleep(0.25)
    return seen


def _ends_within(agent: AgentProcess, seconds: float) -> int:
    """Send SIGTERM; the agent's exit status, which must come within ``seconds`` of the signal."""
    agent.send_signal(signal.SIGTERM)
    try:
        return agent.proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the agent still runs {seconds:.0f} s after SIGTERM; stderr:\n{agent.stderr_text()[-4000:]}")


# -- the lock taken twice


class _PacedSource:
    """A source filed under a paced collector's name (the reload wakes those on a quiet node); it counts its reads."""

    interval_seconds = 3600.0

    def __init__(self, name: str) -> None:
        self.name = name
        self.reads = 0
        self.read = threading.Event()

    def collect(self) -> None:
        self.reads += 1
        self.read.set()

    def close(self) -> None:
        pass


def test_a_reload_on_a_quiet_node_applies_and_wakes_the_paced_sources() -> None:
    """In process: quiet_after_seconds 0 makes the node quiet at once; the reload must return (it waited on the
    collectors' lock it held) and have the paced source read again at once, not an hour later at its interval."""
    config = dataclasses.replace(Config(), listen="127.0.0.1:0", platform="generic", quiet_after_seconds=0.0)
    source = _PacedSource(PACED_SOURCES[0])
    agent = Agent(config, sources=[source], process_metrics=False)
    agent.start(serve=False)
    try:
        assert source.read.wait(10.0) and agent.pace.quiet
        source.read.clear()
        new = dataclasses.replace(config, history_size=7)
        reload = threading.Thread(target=agent.apply_config, args=(new,), name="test-reload", daemon=True)
        reload.start()
        reload.join(10.0)
        assert not reload.is_alive(), "the reload of a quiet node never returned"
        assert agent.config is new and agent.history.capacity == 7
        assert source.read.wait(10.0), f"{source.name} not read again after the reload"
        assert source.reads == 2
    finally:
        agent.stop()


@pytest.mark.realpart
def test_the_documented_driver_upgrade_steps_on_a_quiet_node(tmp_path: Path, fake_lib: Path) -> None:
    """docs/gpus.md, "The NVIDIA driver": ``gpu: {enabled: false}`` and SIGHUP release the driver; ``enabled:
    true`` and another SIGHUP take it back. On a quiet node (a node drained for the upgrade is one), each reload is
    logged as done, Views keep coming, /healthz answers 200 throughout the quiet ticks, and SIGTERM ends the agent."""
    fake = FakeNVML(fake_lib.parent, tmp_path)
    fake.write_script(GPU)  # a GPU and no process on it
    cfg = _config(tmp_path, more="quiet_after_seconds: 1\n")
    text = cfg.read_text()
    with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=fake.env()) as agent:
        agent.wait_for_stderr("quiet: no GPU process", timeout=30)
        wait_until(lambda: fake.counts()["init"] == 1, timeout=10, what="NVML initialised")

        mark = agent.stderr_mark()
        before = _generated_at(agent)
        cfg.write_text(text.replace("gpu: {}", "gpu: {enabled: false}"))
        agent.send_signal(signal.SIGHUP)
        agent.wait_for_stderr(r"configuration reloaded from ", timeout=10, since=mark)
        wait_until(lambda: fake.counts()["shutdown"] == 1, timeout=10, what="nvmlShutdown (the driver released)")
        views = _views_after(agent, before, 2, timeout=60)
        # Quiet again (a reload is work: full pace for quiet_after_seconds), so the second reload meets a quiet node.
        agent.wait_for_stderr("quiet: no GPU process", timeout=30, since=mark)

        mark = agent.stderr_mark()
        cfg.write_text(text)
        agent.send_signal(signal.SIGHUP)
        agent.wait_for_stderr(r"configuration reloaded from ", timeout=10, since=mark)
        wait_until(lambda: fake.counts()["init"] == 2, timeout=15, what="NVML initialised again")
        _views_after(agent, views[-1], 2, timeout=60)

        assert _ends_within(agent, SIGTERM_SECONDS) == 0
    assert fake.counts()["shutdown"] == 2  # SIGTERM shut NVML down too
    log = agent.stderr_text()
    assert "received SIGTERM, stopping" in log
    assert "without waiting any longer" not in log  # nothing was stuck: every part closed


# -- /healthz


@pytest.mark.parametrize(
    ("ended_ago", "waited", "interval_now", "alive"),
    [
        pytest.param(2.5, 1.0, 1.0, True, id="full-pace-within-three-ticks"),
        pytest.param(3.5, 1.0, 1.0, False, id="full-pace-three-ticks-missed"),
        pytest.param(40.0, 15.0, 15.0, True, id="quiet-pace-slower-ticks-are-alive"),
        pytest.param(46.0, 15.0, 15.0, False, id="quiet-pace-three-ticks-missed"),
        # A GPU process ends quiet and wakes the ticker from its 15 s wait: until that tick comes, the wait counts.
        pytest.param(20.0, 15.0, 1.0, True, id="leaving-quiet-within-the-quiet-wait"),
        # The node went quiet while the ticker waited a second: the quiet interval is the one in force.
        pytest.param(20.0, 1.0, 15.0, True, id="going-quiet-the-new-interval"),
        pytest.param(12.0, 4.0, 4.0, True, id="budget-stretched-ticks"),
    ],
)
def test_the_ticker_is_alive_within_three_of_its_intervals(
    ended_ago: float, waited: float, interval_now: float, alive: bool
) -> None:
    liveness = TickerLiveness(0.0)
    liveness.round_ended(100.0, waited)
    problem = liveness.problem(100.0 + ended_ago, interval_now)
    assert (problem is None) is alive, problem
    if not alive:
        assert problem == (
            f"the tick has not run for {ended_ago:.1f} s, more than {LIVENESS_INTERVALS} of its intervals "
            f"({max(waited, interval_now):.1f} s each)"
        )


@pytest.mark.realpart
def test_healthz_fails_while_the_tick_is_held_and_sigterm_still_ends_the_agent(tmp_path: Path, fake_lib: Path) -> None:
    """A real wedge: the driver-upgrade reload switches the GPU source off while an NVML call is stuck; closing it
    waits out ``gpu.call_timeout_seconds`` (here a minute) with the collectors' lock held, which the tick needs.
    /healthz says so once three tick intervals have gone by (a GPU process keeps the node at full pace), and SIGTERM
    ends the agent at once, the reload still stuck."""
    fake = FakeNVML(fake_lib.parent, tmp_path)
    fake.write_script(AT_WORK)
    cfg = _config(tmp_path, gpu="call_timeout_seconds: 60")
    text = cfg.read_text()
    with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=fake.env()) as agent:
        wait_until(lambda: _generated_at(agent), timeout=30, what="the first View")
        assert agent.fetch("/healthz").status == 200
        fake.write_script(AT_WORK + STUCK_POWER)
        wait_until(lambda: fake.counts()["slow_entered"] == 1, timeout=15, what="an NVML call stuck")

        mark = agent.stderr_mark()
        cfg.write_text(text.replace("gpu: {", "gpu: {enabled: false, "))
        agent.send_signal(signal.SIGHUP)
        agent.wait_for_stderr("received SIGHUP, reloading", timeout=10, since=mark)

        def unhealthy() -> bytes | None:
            resp = agent.fetch("/healthz")
            return resp.body if resp.status == 503 else None

        # The tick is held for up to the minute the close waits; three of its intervals are at most 15 s.
        body = wait_until(unhealthy, timeout=45, what="/healthz 503 while the tick is held")
        assert body.startswith(b"not alive: the tick has not run for "), body
        assert b"more than 3 of its intervals" in body
        assert "configuration reloaded" not in agent.stderr_text()  # the reload is still stuck

        assert _ends_within(agent, SIGTERM_SECONDS) == 0
    assert fake.counts()["slow_returned"] == 0  # the call was still stuck when the agent ended
    assert "stopping without waiting any longer for: " in agent.stderr_text()


# -- SIGTERM


@pytest.mark.realpart
def test_sigterm_ends_the_agent_while_closing_a_source_waits_on_a_stuck_call(tmp_path: Path, fake_lib: Path) -> None:
    """Closing the GPU source waits up to ``gpu.call_timeout_seconds`` (here a minute) for a stuck NVML call before
    it gives up on nvmlShutdown; the agent's stop does not wait for it past its own deadline."""
    fake = FakeNVML(fake_lib.parent, tmp_path)
    fake.write_script(AT_WORK)
    cfg = _config(tmp_path, gpu="call_timeout_seconds: 60")
    with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=fake.env()) as agent:
        wait_until(lambda: _generated_at(agent), timeout=30, what="the first View")
        fake.write_script(AT_WORK + STUCK_POWER)
        wait_until(lambda: fake.counts()["slow_entered"] == 1, timeout=15, what="an NVML call stuck")
        assert _ends_within(agent, SIGTERM_SECONDS) == 0
    assert fake.counts()["shutdown"] == 0  # nvmlShutdown would wait on the stuck call or free NVML under it
    assert "stopping without waiting any longer for: stopping-sources" in agent.stderr_text()
