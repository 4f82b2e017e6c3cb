"""A tick records what the sources saw; the View is made when a consumer first asks, and the exposition when /metrics
first asks, each at most once per tick, whatever asks how often (probes of /healthz and /readyz included)."""

from __future__ import annotations

import dataclasses
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import storwatch.agent.tick as agent_module
from storwatch.agent import Agent
from storwatch.analysis.view import View
from storwatch.config import Config
from storwatch.web import StatusHTTPServer
from tests.builders import FixedMounts, mount


class Counts:
    def __init__(self) -> None:
        self.views = 0
        self.renders = 0


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Agent, FixedMounts, Counts]]:
    counts = Counts()
    real_build = agent_module.build_view

    def build_view(*args: Any, **kwargs: Any) -> View:
        counts.views += 1
        return real_build(*args, **kwargs)

    monkeypatch.setattr(agent_module, "build_view", build_view)
    source = FixedMounts()
    config = dataclasses.replace(Config(), listen="127.0.0.1:0", platform="generic")
    agent = Agent(config, sources=[source], process_metrics=False)
    real_render = agent.exporter.render

    def render(view: View | None) -> bytes:
        counts.renders += 1
        return real_render(view)

    monkeypatch.setattr(agent.exporter, "render", render)
    agent.collect_now()
    try:
        yield agent, source, counts
    finally:
        agent.stop()


def test_views_are_made_by_the_tick_alone_whoever_reads_them(counted: tuple[Agent, FixedMounts, Counts]) -> None:
    """A View per tick, made on the tick (never by a reader), pushed to subscribers; the exposition is rendered at
    most once per View, by the first scrape that asks."""
    agent, _, counts = counted
    told: list[View] = []
    agent.subscribe(told.append)
    assert agent.current_view() is None  # before the first tick
    for _ in range(5):
        agent.advance()
    assert (counts.views, counts.renders) == (5, 0)  # nobody scraped: no exposition, but every tick has its View
    view = agent.current_view()
    assert view is not None and [mv.mount.mountpoint for mv in view.mounts] == ["/data"]
    assert told[-1] is view and len(told) == 5
    assert agent.current_view() is view and agent.cached_view() is view and counts.views == 5


def test_each_tick_gets_its_own_view_and_exposition_once(counted: tuple[Agent, FixedMounts, Counts]) -> None:
    agent, source, counts = counted
    agent.advance()
    first = agent.metrics()
    assert agent.metrics() is first and (counts.views, counts.renders) == (1, 1)
    assert b'storwatch_mount_info{device="/dev/nvme0n1"' in first
    source.mounts = (*source.mounts, mount("/scratch", "tmpfs", "tmpfs"))
    agent.collect_now()
    agent.advance()
    second = agent.metrics()
    assert b'mountpoint="/scratch"' in second and b'mountpoint="/scratch"' not in first
    assert (counts.views, counts.renders) == (2, 2)


def test_health_and_readiness_probes_never_render_the_exposition(counted: tuple[Agent, FixedMounts, Counts]) -> None:
    agent, _, counts = counted
    agent.server = StatusHTTPServer("127.0.0.1:0", agent.current_view, agent.metrics)  # no workers: ticks by hand
    agent.server.start()
    base = f"http://127.0.0.1:{agent.server.port}"

    def get(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(base + path, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    agent.advance()
    for _ in range(3):
        assert get("/healthz") == (200, b"ok\n")
        # Ready: its one source reported (collect_now records it as the worker would).
        assert get("/readyz") == (200, b"ready\n")
    assert counts.renders == 0 and counts.views == 1  # /readyz made the View once, nobody rendered
    status, body = get("/metrics")
    assert status == 200 and b"storwatch_mount_info" in body
    assert get("/metrics") == (200, body) and counts.renders == 1


def test_a_wall_clock_step_is_noticed_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    from storwatch.agent.tick import ClockWatch

    watch = ClockWatch()
    assert watch.check(1000.0, 50.0) is None
    assert watch.check(1001.0, 51.0) is None  # both moved a second
    with caplog.at_level("WARNING", logger="storwatch.agent.tick"):
        assert watch.check(1002.0 - 7200.0, 52.0) == pytest.approx(-7200.0)  # stepped back 2 h
        assert watch.check(1003.0 - 7200.0, 53.0) is None  # the next tick: no new step, nothing logged
    assert [r.getMessage() for r in caplog.records] == [
        "the wall clock stepped back by 7200.0 s; ages and recovery points now follow the new time"
    ]


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class _Stub:
    """A source that reports what the test puts in ``facts`` (its name files them where the real one would)."""

    interval_seconds = 3600.0

    def __init__(self, name: str, facts: Any) -> None:
        self.name, self.facts = name, facts

    def collect(self) -> Any:
        return self.facts

    def close(self) -> None:
        pass


def _stalled_agent(clock: _Clock, scan_interval: float = 30.0) -> tuple[Agent, _Stub, _Stub]:
    """An agent whose GPU 0 (PID 4242) idles while its process writes a checkpoint to /scratch, 20 to 30 s in; its
    checkpoint scans ``scan_interval`` seconds apart (their source's interval, as the scans' CPU budget paces it)."""
    from storwatch.sources.checkpoints import Checkpoint, CheckpointFacts, RunState

    t0 = clock.t
    write = Checkpoint(
        "/scratch/run/step-1.pt",
        "torch-zip",
        "complete",
        "ok",
        1 << 30,
        t0 + 30,
        False,
        t0 + 31,
        10.0,
        1e8,
        write_start=t0 + 20,
        writer_pid=4242,
    )
    run = RunState("/scratch/run", "/scratch", (write,))
    checkpoints = _Stub("checkpoints", CheckpointFacts(t0, (run,), False, None, 0.0, ("/scratch",)))
    checkpoints.interval_seconds = scan_interval
    gpu = _Stub("gpu", None)
    mounts = FixedMounts()
    mounts.mounts = (mount("/scratch", "ext4", "/dev/nvme0n1"),)
    config = dataclasses.replace(Config(), listen="127.0.0.1:0", platform="generic")
    return Agent(config, sources=[mounts, gpu, checkpoints], clock=clock, process_metrics=False), gpu, checkpoints


def _gpu_facts(t: float, util: float) -> Any:
    from storwatch.sources.gpu.facts import GPUFacts, GPUProcess, GPUState

    state = GPUState(
        0, "GPU-a", "H100", True, utilization_samples=((t, util),), processes=(GPUProcess(4242, 1 << 30, None),)
    )
    return GPUFacts(t, True, "550", None, (state,))


def test_stall_totals_are_the_same_whether_scraped_every_tick_or_never() -> None:
    """GPU time is settled by the tick, whoever reads the Views: an agent scraped every second and one never
    scraped count the same stall seconds."""

    totals = []
    for scraped in (True, False):
        clock = _Clock(1_800_000_000.0)
        t0 = clock.t
        agent, gpu, _ = _stalled_agent(clock)
        try:
            for i in range(120):
                clock.t = t = t0 + i
                gpu.facts = _gpu_facts(t, 0.02 if 20 <= i < 30 else 0.95)
                agent.collect_now()
                agent.advance()
                if scraped:
                    agent.metrics()
            view = agent.current_view()
            assert view is not None and view.stalls is not None
            totals.append(dict(view.stalls.totals))
        finally:
            agent.stop()
    assert totals[0] == totals[1]
    ((key, seconds),) = totals[0].items()
    assert "checkpoint_write" in key and seconds == pytest.approx(10.0, abs=1.0)


def test_gpu_time_waits_for_scans_the_cpu_budget_spaced_out() -> None:
    """Scans paced 100 s apart (a busy node's checkpoints.scan_cpu_share): a save that ended at 30 s is first seen
    by the scan at 90 s, 60 s later, more than the 40 s a 30 s interval allows. Its GPU time must still wait for
    it, and be charged to the write."""
    from storwatch.sources.checkpoints import CheckpointFacts, RunState

    clock = _Clock(1_800_000_000.0)
    t0 = clock.t
    agent, gpu, checkpoints = _stalled_agent(clock, scan_interval=100.0)
    seen = checkpoints.facts
    checkpoints.facts = CheckpointFacts(
        t0, (RunState("/scratch/run", "/scratch", ()),), False, None, 0.0, ("/scratch",)
    )
    try:
        for i in range(200):
            clock.t = t = t0 + i
            if i == 90:
                checkpoints.facts = seen
            gpu.facts = _gpu_facts(t, 0.02 if 20 <= i < 30 else 0.95)
            agent.collect_now()
            agent.advance()
        view = agent.current_view()
        assert view is not None and view.stalls is not None
        assert view.stalls.settle_seconds == pytest.approx(111.0)  # the interval + 10 s + a tick
        ((key, seconds),) = view.stalls.totals.items()
        assert "checkpoint_write" in key and seconds == pytest.approx(10.0, abs=1.0)
    finally:
        agent.stop()


def test_views_are_made_on_the_ticker_thread_only(tmp_path: Any) -> None:
    """With every source on and its workers running, nobody scraping and then scrapes from another thread: every
    View is made by the ticker (a source or a scrape never makes one)."""
    import threading
    import time

    threads: list[str] = []
    real_build = agent_module.build_view

    def build_view(*args: Any, **kwargs: Any) -> View:
        threads.append(threading.current_thread().name)
        return real_build(*args, **kwargs)

    config = dataclasses.replace(Config(), listen="127.0.0.1:0", platform="generic", tick_seconds=0.1)
    agent = Agent(config, process_metrics=False)
    original, agent_module.build_view = agent_module.build_view, build_view
    try:
        agent.start(serve=False)
        deadline = time.monotonic() + 30
        while len(threads) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(5):
            agent.metrics()
            agent.current_view()
    finally:
        agent.stop()
        agent_module.build_view = original
    assert len(threads) >= 5 and set(threads) == {"ticker"}, threads


def test_views_come_every_view_seconds_while_every_tick_is_observed() -> None:
    """view_seconds sets the View's cadence apart from the tick's: many ticks observed, one View while the next is not
    due (counts, no durations)."""
    import threading
    import time

    observed: list[float] = []
    made: list[str] = []
    config = dataclasses.replace(
        Config(), listen="127.0.0.1:0", platform="generic", tick_seconds=0.05, view_seconds=3600.0
    )
    agent = Agent(config, sources=[FixedMounts()], process_metrics=False)
    real_observe, real_make = agent._views.observe, agent._views.make

    def observe(*args: Any) -> None:
        observed.append(time.monotonic())
        real_observe(*args)

    def make(*args: Any) -> View:
        made.append(threading.current_thread().name)
        return real_make(*args)

    agent._views.observe, agent._views.make = observe, make  # type: ignore[method-assign]
    try:
        agent.start(serve=False)
        deadline = time.monotonic() + 60
        while len(observed) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        agent.stop()
    assert len(observed) >= 10 and made == ["ticker"]  # the first View at once, the next an hour away
