"""The Alertmanager route of docs/alertmanager.md, as it is printed there, through Debian's ``amtool`` (``config
routes test``) for every shipped alert with the labels it fires with: the alerts the node's agent can act on
(``storwatch_action``) reach the agent's receiver (and go on to ``default``), every other alert goes to ``default``
alone, and another node's alerts never reach this node's agent."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from mixin.rules import SEVERITY_FROM_LABEL, alerts
from mixin.thresholds import DETECTIONS
from tests.agentproc import REPO_ROOT
from tests.docs_text import section, yaml_blocks

pytestmark = pytest.mark.realpart

NODE = "gpu-node-7"
"""The node the documented route is written for."""
AGENT_RECEIVER = f"storwatch-{NODE}"


@pytest.fixture(scope="module")
def amtool() -> str:
    path = shutil.which("amtool")
    if path is None:
        pytest.skip("amtool not found on PATH (Debian package 'prometheus-alertmanager')")
    return path


@pytest.fixture(scope="module")
def documented_config(tmp_path_factory: pytest.TempPathFactory, amtool: str) -> Path:
    """The documented Alertmanager configuration (the yaml block of docs/alertmanager.md's "Routing alerts to the
    agent" that starts with ``route:``), checked by amtool."""
    text = section(REPO_ROOT / "docs" / "alertmanager.md", "## Routing alerts to the agent")
    (block,) = [b for b in yaml_blocks(text) if b.startswith("route:")]
    path = tmp_path_factory.mktemp("am") / "alertmanager.yml"
    path.write_text(block, encoding="utf-8")
    check = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    return path


def receivers(amtool: str, config: Path, labels: dict[str, str]) -> list[str]:
    run = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={config}", *(f"{k}={v}" for k, v in labels.items())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.strip().split(",")


def fired_labels(node: str) -> dict[str, dict[str, str]]:
    """Each shipped alert's labels as it fires for ``node``: its rule's labels (a severity taken from the series as a
    warning), its alert name, and the node's label, which every alert about a node keeps (the one about no agent
    anywhere, an ``absent()``, has none)."""
    out = {}
    for a in alerts():
        labels = {"alertname": a.name, "severity": "warning" if a.severity == SEVERITY_FROM_LABEL else a.severity}
        labels.update(a.labels)
        if not a.expr.startswith("absent("):
            labels["node"] = node
        out[a.name] = labels
    return out


def test_every_shipped_alert_goes_where_the_documented_route_says(amtool: str, documented_config: Path) -> None:
    acting = {d.alert for d in DETECTIONS if d.acts}
    fired = fired_labels(NODE)
    assert len(fired) == 13 and acting < set(fired)
    routed = {name: receivers(amtool, documented_config, labels) for name, labels in fired.items()}
    assert {name for name, to in routed.items() if AGENT_RECEIVER in to} == acting, routed
    for name, to in routed.items():
        assert to == ([AGENT_RECEIVER, "default"] if name in acting else ["default"]), (name, to)


def test_another_nodes_alerts_never_reach_this_nodes_agent(amtool: str, documented_config: Path) -> None:
    for name, labels in fired_labels("gpu-node-8").items():
        assert receivers(amtool, documented_config, labels) == ["default"], name


def test_the_route_is_live(amtool: str, documented_config: Path) -> None:
    """The old documented label (action="checkpoint", which no alert carries) routes nothing to the agent; the action
    label does."""
    labels = {"alertname": "StorwatchRecoveryPointOverBudget", "severity": "critical", "node": NODE}
    assert receivers(amtool, documented_config, {**labels, "action": "checkpoint"}) == ["default"]
    assert receivers(amtool, documented_config, {**labels, "storwatch_action": "sync"}) == [AGENT_RECEIVER, "default"]
