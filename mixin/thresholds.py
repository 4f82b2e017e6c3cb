"""Every threshold, `for` duration, severity and selector of the alerts, the dashboards and the agent's default
policy, in one place: one table of detections (:data:`DETECTIONS`) says which alert and which policy rule watch for
each, so the two never disagree on how long a condition must hold or how urgent it is.

Change a value here and regenerate (``python -m mixin``: alerts/, dashboards/ and
storwatch/policies/default.yaml); the promtool tests in alerts/tests/ and the policy's own cases
(storwatch/policies/default_test.yaml) are written against these defaults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final, Literal

Severity = Literal["critical", "warning", "info"]
OWN: Final = "{severity}"
"""The severity of the entity a detection is about, not one of its own: a run's is its finding's (critical when the
training only this node's storage holds is past the recovery-point budget, or while the node drains), warning where
it has no finding. The policy's rule takes it from the entity (``severity: "{severity}"``), the alert from the
``severity`` label of ``storwatch_finding`` (warning for a run without one), so a run shows one severity in its
finding, in the policy's rules and in the alerts."""


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

    request_min_seconds: float = 10.0
    """The agent's drain rules ask a run for a checkpoint only while its pod has more than this (and twice its last
    save's time) left: less would not see it written and copied."""
    wait_for_requested_seconds: float = 20.0
    """How long the drain's copy waits for the checkpoint it asked for before copying the newest there is."""
    reserve_seconds: float = 10.0
    """It stops waiting once the run's pod has less than this left."""
    orphaned_temps: int = 3
    """atomic_save temporaries whose writer is gone, in one run, worth a word (or ``orphaned_temp_bytes`` of them)."""
    orphaned_temp_bytes: int = 10 << 30

    for_ephemeral_important: str = "10m"
    for_recovery_point: str = "5m"
    for_checkpoint_incomplete: str = "15m"
    for_checkpoint_corrupt: str = "5m"
    for_checkpoint_unsafe: str = "5m"
    for_mount_stuck: str = "5m"
    for_stall_share: str = "15m"
    for_headroom: str = "10m"
    for_draining: str = "0s"
    """At once: a drain can leave a pod 30 s before its volumes go."""
    for_leaving_request: str = "0s"
    for_leaving_sync: str = "0s"
    for_orphaned_temps: str = "30m"
    for_alert_sync: str = "0s"
    """Alertmanager waited for the alert's own ``for``."""
    for_collector_failing: str = "15m"
    for_agent_down: str = "5m"
    for_agent_absent: str = "15m"
    for_nvml_down: str = "10m"

    def with_every_for(self, duration: str) -> Thresholds:
        """The same thresholds with every ``for`` set to ``duration`` (the end-to-end test's short-for variant)."""
        fors: dict[str, Any] = {f.name: duration for f in dataclasses.fields(self) if f.name.startswith("for_")}
        return dataclasses.replace(self, **fors)

    def for_(self, detection: Detection) -> str:
        """How long ``detection``'s condition must hold before its alert and its rule fire."""
        value: str = getattr(self, f"for_{detection.name}")
        return value


@dataclass(frozen=True)
class Detection:
    """One condition watched for: by a Prometheus alert (alerts/), by a rule of the agent's default policy
    (storwatch/policies/default.yaml), or by both, with one ``for`` (``Thresholds.for_<name>``) and one severity."""

    name: str
    alert: str | None
    """The alert's name; None: the agent's alone (an action, or what only the agent sees at once)."""
    rule: str | None
    """The policy rule's name; None: Prometheus's alone (what an agent cannot say of itself: it is down, absent)."""
    severity: Severity | Literal["{severity}"]
    """Its one severity, or :data:`OWN`: the entity's."""
    cooldown: str = "0s"
    """The policy rule's: while it keeps firing, its actions run again at most this often (0: never)."""
    acts: bool = False
    """The alert carries ``Site.action_label``: routed to its node's agent (docs/alertmanager.md's route), whose
    ``alert-sync-checkpoint`` rule copies the newest checkpoint of the run it names."""


DETECTIONS: tuple[Detection, ...] = (
    Detection(
        "ephemeral_important",
        "StorwatchImportantDataOnlyOnEphemeralStorage",
        "important-data-only-on-ephemeral-storage",
        OWN,
        cooldown="6h",
        acts=True,
    ),
    Detection("recovery_point", "StorwatchRecoveryPointOverBudget", "recovery-point-over-budget", OWN, "1h", acts=True),
    Detection("checkpoint_incomplete", "StorwatchCheckpointIncomplete", "checkpoint-incomplete", OWN),
    Detection("checkpoint_corrupt", "StorwatchCheckpointCorrupt", "checkpoint-corrupt", OWN),
    Detection("checkpoint_unsafe", "StorwatchCheckpointUnsafe", "checkpoint-unsafe", OWN),
    Detection("mount_stuck", "StorwatchMountStuck", "mount-stuck", "warning", "1h"),
    Detection("stall_share", "StorwatchGPUStallShareHigh", "gpu-stalled-by-storage", "warning", "1h"),
    Detection("headroom", "StorwatchCheckpointWillNotFit", "next-checkpoint-will-not-fit", OWN, "6h"),
    Detection(
        "draining",
        "StorwatchNodeDrainingWithEphemeralCheckpoints",
        "leaving-with-checkpoints-only-on-ephemeral-storage",
        OWN,
        acts=True,
    ),
    Detection("leaving_request", None, "leaving-request-checkpoint", OWN),
    Detection("leaving_sync", None, "leaving-sync-checkpoint", OWN, "5s"),
    Detection("orphaned_temps", None, "orphaned-temporaries-piling-up", OWN, "24h"),
    Detection("alert_sync", None, "alert-sync-checkpoint", OWN),
    Detection("collector_failing", "StorwatchCollectorFailing", None, "warning"),
    Detection("agent_down", "StorwatchAgentDown", None, "warning"),
    Detection("agent_absent", "StorwatchAgentAbsent", None, "critical"),
    Detection("nvml_down", "StorwatchNVMLDown", None, "warning"),
)
"""Every detection: its alert, its policy rule, its ``for`` (in :class:`Thresholds`) and its severity."""


def detection(name: str) -> Detection:
    for d in DETECTIONS:
        if d.name == name:
            return d
    raise KeyError(name)


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
    action_label: str = "storwatch_action"
    """The label an alert the agent can act on carries (``Detection.acts``), with the value ``sync``: the
    Alertmanager route of docs/alertmanager.md sends the alerts with it to their node's agent, and the default policy's
    ``alert-sync-checkpoint`` rule acts on them."""
    action_value: str = "sync"

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_url}#{alert.lower()}"


THRESHOLDS = Thresholds()
SITE = Site()
