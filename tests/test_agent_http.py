"""The agent as a real process: its HTTP endpoints, the once-per-tick /metrics, signals, and configuration files."""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from storwatch.registry import BY_NAME, SOURCES
from tests.agentproc import (
    REPO_ROOT,
    AgentProcess,
    AgentStartError,
    Response,
    fetch,
    running_agent,
    start_agent,
    wait_until,
)

LISTEN = ("--listen", "127.0.0.1:0")

MOUNT_KEYS = {"mountpoint", "device", "fstype", "durability", "reason", "stuck", "size_bytes", "avail_bytes"}


def samples(exposition: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called ``name`` in an exposition text, as (labels, value)."""
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == name
    ]


def api_status(agent: AgentProcess) -> dict[str, Any] | None:
    """/api/status as data once the agent has a View (None while it answers 503)."""
    resp = agent.fetch("/api/status")
    if resp.status != 200:
        return None
    data: dict[str, Any] = json.loads(resp.body)
    return data


def wait_for_status(agent: AgentProcess, timeout: float = 10.0) -> dict[str, Any]:
    return wait_until(lambda: api_status(agent), timeout, what="/api/status answering 200")


def status_when(
    agent: AgentProcess, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str
) -> dict[str, Any]:
    """/api/status once ``predicate`` holds for it."""

    def probe() -> dict[str, Any] | None:
        data = api_status(agent)
        return data if data is not None and predicate(data) else None

    return wait_until(probe, timeout, what=what)


def root_mount(data: dict[str, Any]) -> dict[str, Any]:
    roots: list[dict[str, Any]] = [m for m in data["mounts"] if m["mountpoint"] == "/"]
    assert len(roots) == 1, f"expected exactly one '/' in /api/status, got {[m['mountpoint'] for m in data['mounts']]}"
    return roots[0]


def write_config(path: Path, text: str) -> None:
    # Write and rename, so the agent never reads a half-written file on reload.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


@pytest.fixture(scope="module")
def default_agent() -> Iterator[tuple[AgentProcess, str]]:
    """An agent with no config; yields it and its first full /metrics body."""
    # No cluster credentials, whatever the machine running the tests has: the kube collector is off.
    with running_agent(*LISTEN, env={"KUBECONFIG": None, "KUBERNETES_SERVICE_HOST": None}) as agent:

        def full_scrape() -> str | None:
            resp = agent.fetch("/metrics")
            text = resp.text()
            if resp.status == 200 and "storwatch_mount_info{" in text and "storwatch_collector_success{" in text:
                return text
            return None

        body = wait_until(full_scrape, timeout=60.0, what="/metrics with storwatch_mount_info")
        yield agent, body


def test_metrics_served_after_start(default_agent: tuple[AgentProcess, str]) -> None:
    agent, body = default_agent
    assert 'storwatch_collector_success{collector="mounts"} 1.0' in body.splitlines()
    success = dict((labels["collector"], value) for labels, value in samples(body, "storwatch_collector_success"))
    [(_, nvml_up)] = samples(body, "storwatch_nvml_up")
    expected = {
        "mounts": 1.0,
        "diskstats": 1.0,
        "nfs": 1.0,
        "gpu": nvml_up,  # a machine without NVML: the GPU collector fails, with the reason
        "processes": 1.0,
    }
    assert {name: success.get(name) for name in expected} == expected
    # Off without a config choosing probes, or cluster credentials: neither succeeds nor fails.
    enabled = dict((labels["collector"], value) for labels, value in samples(body, "storwatch_collector_enabled"))
    off = {"probe", "kube"}
    assert {name: enabled.get(name) for name in off} == dict.fromkeys(off, 0.0)
    assert not off & success.keys()
    # Checkpoints: the default places of this machine (a node-local /home, data mounts) are searched, and the
    # collector reports; with none of them (and no kubelet), it is off, saying so.
    search = wait_until(
        lambda: json.loads(agent.fetch("/api/status").body)["checkpoint_search"], 30.0, what="the checkpoint scan"
    )
    now = agent.fetch("/metrics").text()
    scanned = {labels["collector"]: v for labels, v in samples(now, "storwatch_collector_enabled")}["checkpoints"]
    reported = {labels["collector"] for labels, _ in samples(now, "storwatch_collector_success")}
    assert (scanned, "checkpoints" in reported) == ((1.0, True) if search["searched"] else (0.0, False)), search
    assert set(enabled) == set(BY_NAME)  # every source reports
    for name in set(BY_NAME) - expected.keys() - off - {"checkpoints"}:  # the rest succeed, or are off with a reason
        assert success.get(name) == 1.0 or (enabled[name] == 0.0 and name not in success), name
    roots = [labels for labels, value in samples(body, "storwatch_mount_info") if labels["mountpoint"] == "/"]
    assert len(roots) == 1, body
    # The root of any machine this suite runs on is a local disk (or a container's overlay): lost with the node.
    assert roots[0]["durability"] == "node", roots[0]
    assert roots[0]["fstype"] and roots[0]["reason"]
    resp = agent.fetch("/metrics")
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


def test_healthz_and_readyz(default_agent: tuple[AgentProcess, str]) -> None:
    agent, _ = default_agent
    health = agent.fetch("/healthz")
    assert (health.status, health.body) == (200, b"ok\n")

    def readyz() -> Response | None:
        resp = agent.fetch("/readyz")
        return resp if resp.status == 200 else None

    assert wait_until(readyz, timeout=10.0, what="/readyz 200").body == b"ready\n"


def test_api_status_lists_mounts(default_agent: tuple[AgentProcess, str]) -> None:
    agent, _ = default_agent
    resp = agent.fetch("/api/status")
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/json"
    data = json.loads(resp.body)
    assert data["ready"] is True
    assert isinstance(data["mounts"], list) and data["mounts"]
    for m in data["mounts"]:
        missing = MOUNT_KEYS - m.keys()
        assert not missing, f"{m.get('mountpoint')}: missing {missing}"
        assert isinstance(m["stuck"], bool)
    root = root_mount(data)
    assert root["durability"] == "node", root  # as in test_metrics_served_after_start
    assert isinstance(root["size_bytes"], int) and root["size_bytes"] > 0
    assert isinstance(root["avail_bytes"], int) and 0 <= root["avail_bytes"] <= root["size_bytes"]
    assert [c["name"] for c in data["collectors"]] == [spec.name for spec in SOURCES]


def test_unknown_path_is_404(default_agent: tuple[AgentProcess, str]) -> None:
    agent, _ = default_agent
    for path in ("/nope", "/metrics/extra", "/api/status/x"):
        assert agent.fetch(path).status == 404, path


def test_head_sends_headers_and_no_body(default_agent: tuple[AgentProcess, str]) -> None:
    agent, _ = default_agent
    conn = http.client.HTTPConnection(agent.host, agent.port, timeout=5)
    try:
        # HEAD then GET on one keep-alive connection: a HEAD that wrote a body would garble the GET's response.
        conn.request("HEAD", "/healthz")
        head = conn.getresponse()
        assert head.status == 200
        assert head.getheader("Content-Length") == "3"
        assert head.read() == b""
        conn.request("HEAD", "/metrics")
        head = conn.getresponse()
        assert head.status == 200
        assert int(head.getheader("Content-Length") or 0) > 100
        head.read()
        conn.request("HEAD", "/nope")
        head = conn.getresponse()
        assert head.status == 404
        head.read()
        conn.request("GET", "/healthz")
        get = conn.getresponse()
        assert (get.status, get.read()) == (200, b"ok\n")
    finally:
        conn.close()


@pytest.mark.slow
def test_metrics_rendered_once_per_tick(tmp_path: Path) -> None:
    config = tmp_path / "storwatch.yaml"
    write_config(config, "tick_seconds: 5\nmounts:\n  interval_seconds: 60\n")
    with running_agent(*LISTEN, "--config", str(config)) as agent:
        wait_for_status(agent)
        for _ in range(3):
            before = wait_for_status(agent)["generated_at"]
            bodies = [agent.fetch("/metrics").body for _ in range(25)]
            after = wait_for_status(agent)["generated_at"]
            if before == after:  # no tick between the scrapes (the served state only moves forward)
                break
        else:
            pytest.fail("a tick fell between the scrapes three times in a row with tick_seconds 5")
        assert all(b == bodies[0] for b in bodies), "two scrapes within one tick returned different bodies"
        first = bodies[0].decode()
        assert ({"collector": "mounts"}, 1.0) in samples(first, "storwatch_collector_success")

        # The next tick re-renders: the agent's own CPU time can only have grown.
        status_when(agent, lambda d: d["generated_at"] > after, timeout=30.0, what="the next tick")
        later = agent.fetch("/metrics").text()
        assert any(labels["mountpoint"] == "/" for labels, _ in samples(later, "storwatch_mount_info"))
        cpu_before = samples(first, "process_cpu_seconds_total")
        cpu_later = samples(later, "process_cpu_seconds_total")
        assert cpu_before and cpu_later
        assert cpu_later[0][1] >= cpu_before[0][1]


def test_sigterm_exits_zero() -> None:
    with running_agent(*LISTEN) as agent:
        wait_for_status(agent)
        agent.proc.send_signal(signal.SIGTERM)
        code = agent.proc.wait(timeout=STOP_WAIT_SECONDS)  # a bound against a hang, not a speed asked for
        assert code == 0, agent.stderr_text()
        agent.stop()
        assert "received SIGTERM, stopping" in agent.stderr_text()


STOP_WAIT_SECONDS = 60.0
"""How long a test waits for agents to exit after a signal before it calls them hung: a bound against a deadlock,
generous for a loaded machine."""

LIGHT_CONFIG = "gpu: {enabled: false}\nkube: {enabled: false}\ncheckpoints: {kubelet: false, default_roots: false}\n"
"""The sources that cost most to start left out: the signal tests start many agents at once on a small machine."""


def _twice(pid: int, sig: int, gap: float = 0.0005) -> None:
    """Send ``sig`` to ``pid`` twice, ``gap`` seconds apart (a busy wait: sleep() is far coarser)."""
    sent = time.monotonic()
    os.kill(pid, sig)
    while time.monotonic() - sent < gap:
        pass
    os.kill(pid, sig)


@pytest.fixture
def forty_agents(tmp_path: Path) -> Iterator[list[AgentProcess]]:
    """40 agents, started together and each serving, stopped (SIGKILL if need be) when the test ends."""
    config = tmp_path / "light.yaml"
    write_config(config, LIGHT_CONFIG)
    agents = [start_agent(*LISTEN, "--config", str(config)) for _ in range(40)]
    try:
        for agent in agents:
            agent.wait_serving(timeout=60.0)
        yield agents
    finally:
        for agent in agents:
            agent.kill()
            agent.stop()


@pytest.mark.slow
def test_two_sigterms_close_together_stop_every_agent(forty_agents: list[AgentProcess]) -> None:
    """`timeout 5 storwatch agent` sends SIGTERM to the agent and to its group: two signals a moment apart. A handler
    that took a lock (logging, threading.Event) deadlocked about one agent in twenty on the second one (a deadlocked
    agent never exits: the wait's bound only keeps the test from hanging with it)."""
    for agent in forty_agents:
        _twice(agent.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    hung, failed = [], []
    for agent in forty_agents:
        left = deadline - time.monotonic()
        try:
            code = agent.proc.wait(max(left, 0.0))
        except subprocess.TimeoutExpired:
            hung.append(agent.pid)
            continue
        if code != 0 or "received SIGTERM, stopping" not in agent.stderr_text():
            failed.append((agent.pid, code, agent.stderr_text()[-2000:]))
    assert not hung, f"{len(hung)} of 40 agents still running {STOP_WAIT_SECONDS:.0f} s after two SIGTERMs: {hung}"
    assert not failed, failed


@pytest.mark.slow
def test_two_sighups_close_together_reload_and_leave_every_agent_serving(
    forty_agents: list[AgentProcess],
) -> None:
    marks = {agent.pid: agent.stderr_mark() for agent in forty_agents}
    for agent in forty_agents:
        _twice(agent.pid, signal.SIGHUP)
    for agent in forty_agents:
        agent.wait_for_stderr(r"configuration reloaded from ", timeout=10.0, since=marks[agent.pid])
        assert agent.fetch("/healthz").status == 200
    for agent in forty_agents:
        _twice(agent.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    for agent in forty_agents:
        assert agent.proc.wait(max(deadline - time.monotonic(), 0.0)) == 0, agent.stderr_text()


def test_a_busy_port_is_one_line_and_exit_2() -> None:
    """The port is bound before any source starts: nothing but the one line about the port is printed."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "storwatch", "agent", "--listen", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO_ROOT,
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"storwatch: cannot serve on 127.0.0.1:{port}: Address already in use\n"
    assert proc.stdout == ""


def _override_config(durability: str, reason: str) -> str:
    return (
        "tick_seconds: 1\n"
        "mounts:\n"
        "  interval_seconds: 60\n"
        "  overrides:\n"
        f'    - {{mountpoint: "/", durability: {durability}, reason: "{reason}"}}\n'
    )


def test_sighup_reloads_and_keeps_last_good_config(tmp_path: Path) -> None:
    config = tmp_path / "storwatch.yaml"
    write_config(config, _override_config("cluster", "pinned by test"))
    with running_agent(*LISTEN, "--config", str(config)) as agent:
        root = root_mount(wait_for_status(agent))
        assert root["durability"] == "cluster"
        assert "pinned by test" in root["reason"]

        # Invalid YAML: logged with the file's name, the agent goes on with what it had.
        write_config(config, "mounts:\n  overrides: [unclosed\n")
        mark = agent.stderr_mark()
        agent.send_signal(signal.SIGHUP)
        agent.wait_for_stderr(r"ERROR .*reload failed", timeout=5.0, since=mark)
        # On a line of its own, indented as every further line of a log record is (storwatch.printable)
        agent.wait_for_stderr(rf"^    {re.escape(str(config))}:\d+: invalid YAML", timeout=2.0, since=mark)
        time.sleep(0.5)
        assert agent.running(), agent.stderr_text()
        root = root_mount(wait_for_status(agent))
        assert (root["durability"], "pinned by test" in root["reason"]) == ("cluster", True)

        # Valid YAML with a bad value: the error names file:line and the field.
        write_config(config, "tick_seconds: 1\nmounts:\n  interval_seconds: -3\n")
        mark = agent.stderr_mark()
        agent.send_signal(signal.SIGHUP)
        agent.wait_for_stderr(
            rf"^    {re.escape(str(config))}:3: mounts\.interval_seconds: must be 0\.1 to 3600, got -3\.0$", since=mark
        )
        assert agent.running(), agent.stderr_text()
        assert root_mount(wait_for_status(agent))["durability"] == "cluster"

        write_config(config, _override_config("region", "moved by test"))
        mark = agent.stderr_mark()
        agent.send_signal(signal.SIGHUP)
        root = root_mount(
            status_when(
                agent,
                lambda d: root_mount(d)["durability"] == "region",
                timeout=30.0,
                what="'/' to become region after SIGHUP",
            )
        )
        assert "moved by test" in root["reason"]
        agent.wait_for_stderr(rf"configuration reloaded from {re.escape(str(config))}$", timeout=2.0, since=mark)
        assert agent.running()


# Files that used to crash the agent at start (a traceback) or on SIGHUP (it exited), or that passed and then broke
# it: a complex key (TypeError), 5,000 levels (RecursionError), a huge integer (OverflowError), NaN and infinity.
HARMFUL_CONFIGS = [
    pytest.param("mounts:\n  ? [a, b]\n  : 1\n", ":2: mounts: a key must be a field name", id="complex-key"),
    pytest.param("mounts: " + "[" * 5000 + "]" * 5000 + "\n", ":1: invalid YAML: nested deeper than", id="5000-deep"),
    pytest.param("history_size: 1e20\n", ":1: history_size: expected a whole number, got '1e20'", id="1e20"),
    pytest.param("history_size: 100000000000000000000\n", ":1: history_size: must be 1 to 86400", id="huge-int"),
    pytest.param("tick_seconds: .nan\n", ":1: tick_seconds: must be 0.1 to 3600, got nan", id="nan-tick"),
    pytest.param("mounts:\n  statvfs_timeout_seconds: .nan\n", ":2: mounts.statvfs_timeout_seconds: must be 0.01 "
                 "to 600, got nan", id="nan-statvfs-timeout"),
    pytest.param("mounts:\n  interval_seconds: .inf\n", ":2: mounts.interval_seconds: must be 0.1 to 3600, got inf",
                 id="inf-interval"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "location"),
    [
        pytest.param("tick_seconds: 1\nmounts:\n  interval_seconds: abc\n", ":3: mounts.interval_seconds:", id="type"),
        pytest.param("listen: '127.0.0.1:0'\ntick_seconds: 0\n", ":2: tick_seconds: must be 0.1 to", id="range"),
        pytest.param("mounts:\n  overrides:\n    - {mountpoint: /, durability: forever}\n", ":3: mounts.overrides[0]."
                     "durability: 'forever' is not one of", id="enum"),
        pytest.param("log_level: info\nmonuts: {}\n", ":2: monuts: unknown field", id="unknown-field"),
        pytest.param("mounts: [\n", ":2: invalid YAML", id="yaml"),
        *HARMFUL_CONFIGS,
    ],
)  # fmt: skip
def test_bad_config_at_start_exits_2_naming_file_line_and_field(tmp_path: Path, text: str, location: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "storwatch", "agent", *LISTEN, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{config}{location}" in proc.stderr
    assert "serving on" not in proc.stderr
    assert "Traceback" not in proc.stderr


def reload_metrics(agent: AgentProcess) -> tuple[float, float]:
    """(storwatch_config_reload_errors_total, storwatch_config_last_reload_success) from a scrape."""
    body = agent.fetch("/metrics").text()
    (errors,) = samples(body, "storwatch_config_reload_errors_total")
    (success,) = samples(body, "storwatch_config_last_reload_success")
    return errors[1], success[1]


def test_harmful_configs_on_sighup_leave_the_last_good_one_serving(tmp_path: Path) -> None:
    config = tmp_path / "storwatch.yaml"
    write_config(config, _override_config("cluster", "pinned by test"))
    with running_agent(*LISTEN, "--config", str(config)) as agent:
        assert root_mount(wait_for_status(agent))["durability"] == "cluster"
        assert reload_metrics(agent) == (0.0, 1.0)
        for count, param in enumerate(HARMFUL_CONFIGS, start=1):
            text, location = param.values
            write_config(config, str(text))
            mark = agent.stderr_mark()
            agent.send_signal(signal.SIGHUP)
            agent.wait_for_stderr(r"ERROR .*reload failed, keeping the last good configuration", since=mark)
            agent.wait_for_stderr(f"^    {re.escape(str(config) + str(location))}", timeout=2.0, since=mark)
            # Counted: a failed reload makes a tick, and the next scrape shows it.
            wait_until(
                lambda count=count: reload_metrics(agent) == (float(count), 0.0),
                timeout=5.0,
                what=f"reload errors {count} after {param.id}",
            )
            assert agent.running(), agent.stderr_text()
            root = root_mount(wait_for_status(agent))
            assert (root["durability"], "pinned by test" in root["reason"]) == ("cluster", True), param.id
        assert "Traceback" not in agent.stderr_text()
        # A good file again: reloaded, and the gauge says so; the count stays.
        write_config(config, _override_config("region", "moved by test"))
        agent.send_signal(signal.SIGHUP)
        status_when(agent, lambda d: root_mount(d)["durability"] == "region", timeout=5.0, what="region after SIGHUP")
        wait_until(
            lambda: reload_metrics(agent) == (float(len(HARMFUL_CONFIGS)), 1.0), timeout=5.0, what="reload success"
        )


def test_platform_flag_wins_over_config(tmp_path: Path) -> None:
    config = tmp_path / "storwatch.yaml"
    write_config(config, "platform: together-k8s\n")
    with running_agent(*LISTEN, "--config", str(config), "--platform", "gradient") as agent:
        data = wait_for_status(agent)
        assert data["platform"] == {"name": "gradient", "detected_by": "configured"}
        body = fetch(agent.url("/metrics")).text()
        assert samples(body, "storwatch_platform_info") == [
            ({"platform": "gradient", "detected_by": "configured"}, 1.0)
        ]


def test_running_agent_reports_an_agent_that_exits_before_serving(tmp_path: Path) -> None:
    """The harness itself: an agent that dies at start gives AgentStartError with its exit status and stderr (it
    saw the exit, rather than waiting for a port that never comes)."""
    config = tmp_path / "bad.yaml"
    config.write_text("tick_seconds: -1\n", encoding="utf-8")
    with pytest.raises(AgentStartError) as info, running_agent(*LISTEN, "--config", str(config)):
        pytest.fail("running_agent yielded for an agent that cannot start")
    assert "exited with 2" in str(info.value)
    assert f"{config}:1: tick_seconds: must be 0.1 to 3600, got -1.0" in str(info.value)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def thread_count(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return int(next(line.split()[1] for line in f if line.startswith("Threads:")))


@pytest.mark.slow
def test_a_thousand_slow_clients_leave_fds_bounded_and_scrapes_answered(tmp_path: Path) -> None:
    """Slowloris: 1,000 clients that each send half a request head and wait, reconnecting when dropped, against an
    agent whose fd limit is 256. Its connections stay under the cap (a quarter of the limit), its threads do not
    grow, a normal client is answered, and the collectors, which read files every second, keep succeeding (with a
    thread and fd per connection they failed with "Too many open files")."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    clients = min(1000, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 100)
    assert clients >= 900, "this test needs about 1,100 file descriptors of its own"
    config = tmp_path / "storwatch.yaml"
    write_config(config, "tick_seconds: 0.5\nmounts: {interval_seconds: 1}\n" + LIGHT_CONFIG)
    with running_agent(*LISTEN, "--config", str(config), nofile=256) as agent:
        wait_for_status(agent)
        fds_before, threads_before = open_fds(agent.pid), thread_count(agent.pid)

        def slow_client() -> socket.socket:
            s = socket.create_connection((agent.host, agent.port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: storwatch\r\nX-Slow: ")
            s.setblocking(False)
            return s

        slow = [slow_client() for _ in range(clients)]
        try:
            most_fds = most_threads = reconnects = 0
            answered = []
            until = time.monotonic() + 4.0
            while time.monotonic() < until:
                # Reconnect the ones the agent dropped (it closes the longest-waiting at its cap), as an attacker would.
                for i, s in enumerate(slow):
                    try:
                        dropped = s.recv(1) == b""
                    except BlockingIOError:
                        dropped = False
                    except OSError:
                        dropped = True
                    if dropped:
                        s.close()
                        slow[i] = slow_client()
                        reconnects += 1
                most_fds = max(most_fds, open_fds(agent.pid))
                most_threads = max(most_threads, thread_count(agent.pid))
                answered.append(agent.fetch("/metrics", timeout=5.0).status)
            assert reconnects >= clients - 64, f"only {reconnects} reconnects: the agent did not drop idle clients"
            assert set(answered) == {200}, answered
            body = agent.fetch("/metrics", timeout=5.0).text()
            succeeded = {labels["collector"]: v for labels, v in samples(body, "storwatch_collector_success")}
            # probe and checkpoints: off, with no probes chosen and no roots (no success series either way)
            assert {"mounts": 1.0, "diskstats": 1.0, "nfs": 1.0}.items() <= succeeded.items()
            assert set(succeeded.values()) == {1.0} and not {"probe", "checkpoints"} & succeeded.keys()
            # The connection cap is 256 // 4 = 64; a few more fds are the scrapes of this test and files being read.
            assert most_fds <= fds_before + 64 + 8, (fds_before, most_fds)
            assert most_threads <= threads_before + 2, (threads_before, most_threads)
            assert "Too many open files" not in agent.stderr_text()
        finally:
            for s in slow:
                s.close()


@pytest.mark.slow
def test_sighup_applies_checkpoint_roots(tmp_path: Path) -> None:
    """A root added by a reload is scanned, and one taken away is no longer (no restart)."""
    import zipfile

    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        (root / "run").mkdir(parents=True)
        with zipfile.ZipFile(root / "run" / "step-1.pt", "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
            z.writestr("archive/version", b"3\n")

    def roots(*paths: Path) -> str:
        return (
            "tick_seconds: 0.2\nkube: {enabled: false}\n"
            # No deep checks: each loads torch in a subprocess, seconds on a busy machine, which the new root's walk
            # would wait behind.
            f"checkpoints: {{roots: {json.dumps([str(p) for p in paths])}, kubelet: false, interval_seconds: 0.3, "
            "deep_per_scan: 0}\n"
        )

    def paths(data: dict[str, Any]) -> set[str]:
        return {r["path"] for r in data["checkpoints"]}

    config = tmp_path / "storwatch.yaml"
    write_config(config, roots(first))
    with running_agent(*LISTEN, "--config", str(config)) as agent:
        status_when(agent, lambda d: paths(d) == {str(first / "run")}, timeout=10.0, what="the first root's run")
        write_config(config, roots(first, second))
        agent.send_signal(signal.SIGHUP)
        both = {str(first / "run"), str(second / "run")}
        status_when(agent, lambda d: paths(d) == both, timeout=10.0, what="the added root scanned after SIGHUP")
        write_config(config, roots(second))
        agent.send_signal(signal.SIGHUP)
        status_when(agent, lambda d: paths(d) == {str(second / "run")}, timeout=10.0, what="the removed root gone")
        assert "takes effect on restart" not in agent.stderr_text()
