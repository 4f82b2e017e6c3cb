"""A tick records what the sources saw; the View is made when a consumer first asks, and the exposition when /metrics
first asks, each at most once per tick, whatever asks how often (probes of /healthz and /readyz included)."""

from __future__ import annotations

import dataclasses
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import storwatch.agent as agent_module
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


def test_ticks_nobody_looks_at_make_no_view(counted: tuple[Agent, FixedMounts, Counts]) -> None:
    agent, _, counts = counted
    assert agent.current_view() is None  # before the first tick
    for _ in range(5):
        agent.advance()
    assert (counts.views, counts.renders) == (0, 0)
    view = agent.current_view()
    assert view is not None and [mv.mount.mountpoint for mv in view.mounts] == ["/data"]
    assert agent.current_view() is view and counts.views == 1


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
    from storwatch.agent import ClockWatch

    watch = ClockWatch()
    assert watch.check(1000.0, 50.0) is None
    assert watch.check(1001.0, 51.0) is None  # both moved a second
    with caplog.at_level("WARNING", logger="storwatch.agent"):
        assert watch.check(1002.0 - 7200.0, 52.0) == pytest.approx(-7200.0)  # stepped back 2 h
        assert watch.check(1003.0 - 7200.0, 53.0) is None  # the next tick: no new step, nothing logged
    assert [r.getMessage() for r in caplog.records] == [
        "the wall clock stepped back by 7200.0 s; ages and recovery points now follow the new time"
    ]
