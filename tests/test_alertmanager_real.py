"""A real Alertmanager (Debian's ``prometheus-alertmanager``) posting to a real agent (``python -m storwatch agent``):
its webhook receiver points at ``/api/v1/alertmanager`` with the bearer token in a ``credentials_file``, alerts are
posted to Alertmanager's own API, and the agent's /api/status shows this node's alert (and its resolution), never
another node's; a request without the token gets 401.

Both run on loopback ports picked free, their files in the test's temporary directory; Alertmanager's clustering is
off (it would listen on 9094) and it is stopped at the end, failed test or not.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.agentproc import AgentProcess, running_agent, wait_until

pytestmark = pytest.mark.realpart

T = TypeVar("T")
TOKEN = "am-to-storwatch-0123456789"
NODE = "gpu-node-7"
OTHER_NODE = "gpu-node-8"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Alertmanager:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=json.dumps(alerts).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200

    def alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=10) as resp:
            data: list[dict[str, Any]] = json.load(resp)
            return data

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait(self, probe: Callable[[], T | None], what: str, agent: AgentProcess) -> T:
        """wait_until, with both logs as they are at the deadline in the failure."""
        try:
            return wait_until(probe, timeout=60.0, what=what)
        except AssertionError as err:
            raise AssertionError(
                f"{err}\n-- alertmanager:\n{self.log_text()}\n-- agent:\n{agent.stderr_text()[-4000:]}"
            ) from err


def alertmanager_binary() -> str:
    for name in ("prometheus-alertmanager", "alertmanager"):
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.skip("alertmanager not found on PATH (Debian package 'prometheus-alertmanager')")


@contextlib.contextmanager
def running_alertmanager(binary: str, directory: Path, agent_port: int, token_file: Path) -> Iterator[Alertmanager]:
    config = directory / "alertmanager.yml"
    config.write_text(
        f"""\
route:
  receiver: storwatch
  group_by: [alertname, node]   # one notification per node: each agent gets its own alerts
  group_wait: 100ms
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: storwatch
    webhook_configs:
      - url: http://127.0.0.1:{agent_port}/api/v1/alertmanager
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials_file: {token_file}
""",
        encoding="utf-8",
    )
    port = free_port()
    log = directory / "alertmanager.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",  # no gossip port (9094 by default)
                "--log.level=debug",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    am = Alertmanager(proc, port, log)
    try:

        def ready() -> bool:
            assert proc.poll() is None, f"alertmanager exited with {proc.returncode}:\n{am.log_text()}"
            with urllib.request.urlopen(f"{am.url}/-/ready", timeout=2) as resp:
                return resp.status == 200

        wait_until(ready, timeout=30.0, what="alertmanager ready")
        yield am
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def status_alerts(agent: AgentProcess) -> list[dict[str, Any]]:
    resp = agent.fetch("/api/status")
    assert resp.status == 200
    alerts: list[dict[str, Any]] = json.loads(resp.body)["alerts"]
    return alerts


def metric(agent: AgentProcess, name: str, result: str) -> float:
    prefix = f'{name}{{result="{result}"}} '
    lines = [line for line in agent.fetch("/metrics").text().splitlines() if line.startswith(prefix)]
    return float(lines[0][len(prefix) :]) if lines else 0.0


def am_alert(node: str, **extra: Any) -> dict[str, Any]:
    return {
        "labels": {"alertname": "CheckpointStorageDegraded", "severity": "critical", "node": node},
        "annotations": {"summary": f"checkpoint storage degraded for {node}"},
        "generatorURL": "http://prometheus.example/graph",
        **extra,
    }


def test_a_real_alertmanager_posts_this_nodes_alert_to_the_agent(tmp_path: Path) -> None:
    binary = alertmanager_binary()
    token_file = tmp_path / "am-token"
    token_file.write_text(TOKEN + "\n", encoding="utf-8")
    config = tmp_path / "storwatch.yaml"
    # A rule on the alerts Alertmanager posts: each becomes an entity, and the rule's action runs for it.
    rules = tmp_path / "alerts-policy.yaml"
    rules.write_text(
        "rules:\n  - name: storage-alert-seen\n    on: alert\n"
        "    when: alertname == 'CheckpointStorageDegraded' && status == 'firing'\n"
        "    severity: critical\n    message: '{alertname} for this node: {annotations}'\n"
        "    actions: [{action: log}]\n",
        encoding="utf-8",
    )
    config.write_text(
        f"alertmanager: {{enabled: true, token_file: {token_file}}}\n"
        f"policy: {{default_set: false, files: [{json.dumps(str(rules))}]}}\n",
        encoding="utf-8",
    )
    # The node's name from NODE_NAME, as the DaemonSet sets it from spec.nodeName.
    with (
        running_agent("--listen", "127.0.0.1:0", "--config", str(config), env={"NODE_NAME": NODE}) as agent,
        running_alertmanager(binary, tmp_path, agent.port, token_file) as am,
    ):
        agent.wait_for_stderr(rf"alertmanager: taking alerts at /api/v1/alertmanager for node='{NODE}'")
        am.post_alerts([am_alert(NODE), am_alert(OTHER_NODE)])
        held = {a["labels"]["node"]: a for a in am.alerts()}
        assert set(held) == {NODE, OTHER_NODE}
        fingerprints = {node: a["fingerprint"] for node, a in held.items()}

        def shown() -> list[dict[str, Any]] | None:
            return status_alerts(agent) or None

        (alert,) = am.wait(shown, "the alert in /api/status", agent)
        assert alert["fingerprint"] == fingerprints[NODE]
        assert (alert["status"], alert["ends_at"]) == ("firing", None)
        assert alert["labels"] == am_alert(NODE)["labels"]
        assert alert["annotations"] == am_alert(NODE)["annotations"]
        assert abs(alert["starts_at"] - time.time()) < 600

        # The alert is an entity of the policy: its rule fires for it and its action runs.
        def acted() -> list[dict[str, Any]] | None:
            data = json.loads(agent.fetch("/api/status").body)["policy"]
            return [a for a in data["actions"] if a["rule"] == "storage-alert-seen"] or None

        (action,) = am.wait(acted, "the alert rule's action", agent)
        assert (action["kind"], action["key"], action["outcome"]) == ("alert", fingerprints[NODE], "ok"), action
        agent.wait_for_stderr(r"storage-alert-seen.*CheckpointStorageDegraded for this node")

        # The other node's alert went out in its own notification (group_by node) and was ignored.
        am.wait(
            lambda: metric(agent, "storwatch_alertmanager_alerts_total", "ignored") >= 1,
            "the other node's alert posted and ignored",
            agent,
        )
        assert [a["fingerprint"] for a in status_alerts(agent)] == [fingerprints[NODE]]
        assert metric(agent, "storwatch_alertmanager_requests_total", "unauthorized") == 0

        # Resolved as Prometheus resolves it (the alert again, its startsAt and an endsAt now): the resolution
        # reaches the agent, on the same alert.
        now = datetime.datetime.now(datetime.timezone.utc).isoformat()
        am.post_alerts([am_alert(NODE, startsAt=held[NODE]["startsAt"], endsAt=now)])

        def resolved() -> list[dict[str, Any]] | None:
            now = status_alerts(agent)
            return now if now and now[0]["status"] == "resolved" else None

        (alert,) = am.wait(resolved, "the resolution in /api/status", agent)
        assert alert["fingerprint"] == fingerprints[NODE] and alert["ends_at"] is not None

        # Straight to the agent without the token: 401, and nothing taken.
        request = urllib.request.Request(
            agent.url("/api/v1/alertmanager"),
            data=json.dumps({"version": "4", "alerts": []}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == 401
        assert info.value.headers["WWW-Authenticate"] == 'Bearer realm="storwatch"'
        agent.wait_for_stderr(r"alertmanager: refused a request with 401: a bearer token is required")
        assert metric(agent, "storwatch_alertmanager_requests_total", "unauthorized") == 1
        assert metric(agent, "storwatch_alertmanager_requests_total", "accepted") >= 2
        assert metric(agent, "storwatch_alertmanager_requests_total", "bad_request") == 0
