"""Each source's worker inside the real Agent: whatever a source or the worker loop does, the collector reports it.

These run the Agent in this process with small stand-in sources, because the paths they take (a source that raises
BaseException, an interval no config would accept, a collect() that never returns) are bugs that no real source
shows on purpose. The real sources' failure paths on real inputs are in test_collector_health.py.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import storwatch.agent.collectors as agent_module
from storwatch.agent import GPU_OFF_REASON, KNOWN_COLLECTORS, Agent
from storwatch.config import Config, GPUConfig, KubeConfig
from storwatch.vocabulary import CollectorStatus, Mount
from tests.agentproc import wait_until
from tests.builders import mount


class Scripted:
    """A source whose next collect() does what ``script`` says: return facts, raise, or block until released."""

    def __init__(self, name: str = "mounts", interval_seconds: float = 0.02) -> None:
        self.name = name
        self.interval_seconds: Any = interval_seconds
        self.script: Callable[[], Any] = lambda: (mount("/data", "ext4", "/dev/nvme0n1"),)
        self.calls = 0
        self.closed = False

    def collect(self) -> Any:
        self.calls += 1
        return self.script()

    def close(self) -> None:
        self.closed = True


class Failing:
    """Facts whose ``failure`` says the source answered but failed; or, with ``broken``, whose failure raises."""

    def __init__(self, failure: str | None, broken: bool = False) -> None:
        self._failure, self._broken = failure, broken

    @property
    def failure(self) -> str | None:
        if self._broken:
            raise KeyError("no such field")
        return self._failure


@pytest.fixture
def run_agent() -> Iterator[Callable[..., Agent]]:
    agents: list[Agent] = []

    def start(*sources: Any, config: Config | None = None) -> Agent:
        cfg = config or dataclasses.replace(Config(), listen="127.0.0.1:0", platform="generic")
        agent = Agent(cfg, sources=list(sources), process_metrics=False)
        agents.append(agent)
        agent.start(serve=False)
        return agent

    yield start
    for agent in agents:
        agent.stop()


def status_of(agent: Agent, name: str) -> CollectorStatus | None:
    return next((c for c in agent.collector_statuses() if c.name == name), None)


def wait_status(agent: Agent, name: str, predicate: Callable[[CollectorStatus], bool], what: str) -> CollectorStatus:
    def probe() -> CollectorStatus | None:
        status = status_of(agent, name)
        return status if status is not None and predicate(status) else None

    return wait_until(probe, timeout=5.0, what=what)


def scrape(agent: Agent) -> dict[tuple[str, str], float]:
    """(metric, collector label) -> value of the agent's exposition after one more tick."""
    agent.advance()
    out = {}
    for family in text_string_to_metric_families(agent.metrics().decode()):
        for s in family.samples:
            if "collector" in s.labels:
                out[(s.name, s.labels["collector"])] = s.value
    return out


def boom() -> Any:
    raise RuntimeError("boom")


def test_a_raising_source_reports_failure_keeps_its_last_facts_and_recovers(run_agent: Callable[..., Agent]) -> None:
    source = Scripted()
    agent = run_agent(source)
    wait_status(agent, "mounts", lambda s: s.success, "a first success")
    good: tuple[Mount, ...] = agent.latest("mounts")
    source.script = boom
    status = wait_status(agent, "mounts", lambda s: not s.success, "the failure")
    assert status.error == "RuntimeError: boom" and status.state == "failed"
    assert agent.latest("mounts") == good  # the last good facts stay
    metrics = scrape(agent)
    assert metrics[("storwatch_collector_success", "mounts")] == 0
    assert metrics[("storwatch_collector_enabled", "mounts")] == 1
    source.script = lambda: good
    wait_status(agent, "mounts", lambda s: s.success, "the recovery")
    assert scrape(agent)[("storwatch_collector_success", "mounts")] == 1


class Fatal(BaseException):
    """Not an Exception: what a bare ``except Exception`` lets through and a thread dies of silently."""


def exits() -> Any:
    raise SystemExit(3)


def fatal() -> Any:
    raise Fatal("not an Exception")


@pytest.mark.parametrize(("script", "error"), [(exits, "SystemExit: 3"), (fatal, "Fatal: not an Exception")],
                         ids=["system-exit", "base-exception"])  # fmt: skip
def test_a_source_raising_a_base_exception_fails_and_its_worker_goes_on(
    run_agent: Callable[..., Agent], script: Callable[[], Any], error: str
) -> None:
    source = Scripted()
    source.script = script
    agent = run_agent(source)
    status = wait_status(agent, "mounts", lambda s: not s.success, "the failure")
    assert status.error == error
    calls = source.calls
    wait_until(lambda: source.calls > calls + 2 or None, timeout=5.0, what="the worker to run the source again")
    # This agent's own threads: a worker of an agent stopped by an earlier test may still be ending on a busy machine.
    assert [t.name for t in agent._threads if t.is_alive()].count("source-mounts") == 1


@pytest.mark.parametrize("interval", [float("inf"), float("nan"), 0.0, -1.0, "ten", None],
                         ids=["inf", "nan", "zero", "negative", "a-string", "none"])  # fmt: skip
def test_an_interval_that_cannot_be_waited_fails_the_collector_and_the_worker_goes_on(
    run_agent: Callable[..., Agent], monkeypatch: pytest.MonkeyPatch, interval: Any
) -> None:
    """``mounts.interval_seconds: .inf`` killed the worker (Event.wait raised OverflowError) while its collector
    still said success; NaN made it spin. The config refuses both; a source may still hold one."""
    monkeypatch.setattr(agent_module, "FALLBACK_INTERVAL_SECONDS", 0.05)
    source = Scripted(interval_seconds=interval)
    agent = run_agent(source)
    status = wait_status(agent, "mounts", lambda s: not s.success, "the failure")
    assert status.error is not None and f"interval_seconds {interval!r} is not a finite number" in status.error
    calls = source.calls
    wait_until(lambda: source.calls >= calls + 3 or None, timeout=5.0, what="collections at the fallback interval")
    assert scrape(agent)[("storwatch_collector_success", "mounts")] == 0
    source.interval_seconds = 0.02  # a reload that fixes it
    wait_status(agent, "mounts", lambda s: s.success, "the recovery")


def test_facts_that_say_they_failed_and_facts_that_cannot_say(run_agent: Callable[..., Agent]) -> None:
    source = Scripted("gpu")
    source.script = lambda: Failing("nvmlDeviceGetCount has not returned after 2.0 s")
    agent = run_agent(source)
    status = wait_status(agent, "gpu", lambda s: not s.success, "the failure")
    assert status.error == "nvmlDeviceGetCount has not returned after 2.0 s"
    assert isinstance(agent.latest("gpu"), Failing)  # answered: its facts are kept
    source.script = lambda: Failing(None, broken=True)
    wait_status(agent, "gpu", lambda s: s.error == "KeyError: 'no such field'", "the broken facts")
    source.script = lambda: Failing(None)
    wait_status(agent, "gpu", lambda s: s.success, "the recovery")


def test_a_collect_that_never_returns_is_reported_after_its_limit(
    run_agent: Callable[..., Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_module, "STALLED_MIN_SECONDS", 0.3)
    release = threading.Event()
    source = Scripted()
    agent = run_agent(source)
    wait_status(agent, "mounts", lambda s: s.success, "a first success")
    source.script = lambda: release.wait(10) and (mount("/data", "ext4", "/dev/nvme0n1"),)
    status = wait_status(agent, "mounts", lambda s: not s.success, "the stall to be reported")
    assert status.error is not None and "collect() has not returned after" in status.error
    assert status.last_success_timestamp is not None
    assert scrape(agent)[("storwatch_collector_success", "mounts")] == 0
    release.set()
    wait_status(agent, "mounts", lambda s: s.success, "the recovery")


def test_an_off_source_is_reported_off_and_neither_succeeds_nor_fails(run_agent: Callable[..., Agent]) -> None:
    source = Scripted("kube")
    source.off_reason = "no in-cluster service account token and no kubeconfig"  # type: ignore[attr-defined]
    source.script = lambda: None
    agent = run_agent(source)
    status = wait_status(agent, "kube", lambda s: s.state == "off", "the off status")
    assert status.off_reason == "no in-cluster service account token and no kubeconfig"
    assert status.error is None and not status.enabled
    metrics = scrape(agent)
    assert metrics[("storwatch_collector_enabled", "kube")] == 0
    assert ("storwatch_collector_success", "kube") not in metrics
    assert ("storwatch_collector_duration_seconds", "kube") not in metrics


def test_every_known_collector_is_reported_running_or_off(run_agent: Callable[..., Agent]) -> None:
    config = dataclasses.replace(
        Config(), listen="127.0.0.1:0", platform="generic", gpu=GPUConfig(enabled=False), kube=KubeConfig(enabled=False)
    )
    source = Scripted()
    source.parse_errors = 7  # type: ignore[attr-defined]
    agent = run_agent(source, config=config)
    wait_status(agent, "mounts", lambda s: s.success, "a first success")
    statuses = {c.name: c for c in agent.collector_statuses()}
    assert sorted(statuses) == sorted(KNOWN_COLLECTORS)
    assert statuses["mounts"].state == "ok" and statuses["mounts"].parse_errors == 7
    assert statuses["gpu"].off_reason == statuses["processes"].off_reason == GPU_OFF_REASON
    assert statuses["kube"].off_reason == "kube.enabled is false in the configuration"
    assert statuses["nfs"].off_reason == "not started by this agent"
    metrics = scrape(agent)
    assert {name for (metric, name) in metrics if metric == "storwatch_collector_enabled"} == set(KNOWN_COLLECTORS)
    assert metrics[("storwatch_parse_errors_total", "mounts")] == 7
    assert ("storwatch_parse_errors_total", "gpu") not in metrics
    # A reload that turns the GPUs on finds no GPU source to resume (sources are made at start): it says so.
    agent.config = dataclasses.replace(config, gpu=GPUConfig(enabled=True))
    statuses = {c.name: c for c in agent.collector_statuses()}
    assert statuses["gpu"].off_reason == "gpu.enabled was false when the agent started; turning it on takes a restart"


def test_a_collection_that_ends_after_a_reload_paused_its_source_is_dropped(run_agent: Callable[..., Agent]) -> None:
    """gpu.enabled: false on reload drops the GPU facts; a sampling that was in flight then must not bring them
    back, nor its success (the scraper would see NVML series of a released driver)."""
    release = threading.Event()
    source = Scripted("gpu")
    source.script = lambda: Failing(None)
    agent = run_agent(source)
    wait_status(agent, "gpu", lambda s: s.success, "a first success")
    entered = threading.Event()

    def slow() -> Failing:
        entered.set()
        release.wait(10)
        return Failing(None)

    source.script = slow
    assert entered.wait(5)
    agent.apply_config(dataclasses.replace(agent.config, gpu=GPUConfig(enabled=False)))
    assert source.closed
    release.set()
    calls = source.calls
    time.sleep(0.2)  # the released collection returns and is looked at (a check that something does not happen)
    assert source.calls == calls  # paused: no new collection
    assert agent.latest("gpu") is None
    status = status_of(agent, "gpu")
    assert status is not None and status.off_reason == GPU_OFF_REASON
    assert ("storwatch_collector_success", "gpu") not in scrape(agent)
