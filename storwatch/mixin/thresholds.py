"""Every threshold, `for` duration and selector the alerts and dashboards use, in one place.

Change a value here and regenerate (``python -m storwatch.mixin``); the promtool tests in alerts/tests/ are written
against these defaults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    """What makes each alert fire, and how long it must hold first."""

    rpo_budget_seconds: float = 3600.0
    """Training a live run may have only on storage lost with its node; the agent's ``findings.rpo_budget_seconds``
    (a test holds them equal, so the alert and the agent's critical findings agree)."""
    stall_share: float = 0.2
    """Share of a GPU's time spent stalled on storage (all causes) over ``stall_window`` that is worth a look."""
    stall_window: str = "10m"
    """Rate window for stall shares: longer than the checkpoint scan interval, as stalls are counted once settled."""

    for_ephemeral_important: str = "30m"
    for_recovery_point: str = "10m"
    for_checkpoint_incomplete: str = "15m"
    for_checkpoint_corrupt: str = "5m"
    for_checkpoint_unsafe: str = "5m"
    for_mount_stuck: str = "5m"
    for_stall_share: str = "15m"
    for_headroom: str = "10m"
    for_draining: str = "1m"
    """Short: a drain leaves minutes before the pods' volumes go."""
    for_collector_failing: str = "15m"
    for_agent_down: str = "5m"
    for_agent_absent: str = "15m"
    for_nvml_down: str = "10m"

    def with_every_for(self, duration: str) -> Thresholds:
        """The same thresholds with every ``for`` set to ``duration`` (the end-to-end test's short-for variant)."""
        fors: dict[str, Any] = {f.name: duration for f in dataclasses.fields(self) if f.name.startswith("for_")}
        return dataclasses.replace(self, **fors)


@dataclass(frozen=True)
class Site:
    """Where things are: the scrape job and the runbook. The rules and dashboards also expect two target labels that
    Prometheus adds to every series of an agent: ``node`` (relabelled from ``__meta_kubernetes_pod_node_name``; the
    agent's Alertmanager receiver takes only alerts whose ``node`` is its own) and ``cluster`` (optional: where it is
    missing the dashboards' cluster variable matches the empty value)."""

    job: str = "storwatch"
    """The scrape job of the agents (``up{job=...}`` for the agent-down alerts)."""
    runbook_url: str = "https://github.com/storwatch/storwatch/blob/main/docs/runbook.md"
    """The runbook; each alert links to its own section (``#alertname`` in lower case)."""
    agent_port: int = 9477
    """The agent's port, for links to a node's /status."""

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_url}#{alert.lower()}"


THRESHOLDS = Thresholds()
SITE = Site()
