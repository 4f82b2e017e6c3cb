"""The Prometheus rules: recording rules for the fleet aggregates the Fleet dashboard and the alerts read, and the
alerts, each with its ``for``, ``severity``, ``summary``, a ``description`` naming the labels' values, and a
``runbook_url`` to its section of docs/runbook.md. Rendered as a rules file and as a PrometheusRule resource. Each
alert's ``for`` and severity are its detection's (thresholds.DETECTIONS), shared with the agent's default policy.

Severity, as kubernetes-mixin uses it: ``critical`` pages a person (training is about to be lost), ``warning`` goes to a
work queue, ``info`` helps troubleshooting. An alert about a run carries the run's own severity (``severity`` is
``{{ $labels.severity }}``, from ``storwatch_finding`` through ``cluster_node_run:storwatch_run_severity:max``), as its
finding and the policy's rules about it do. Every alert keeps the ``node`` label where it is about one node, so
Alertmanager can route it to that node's agent (the agent ignores alerts for other nodes); those it can act on carry
``storwatch_action="sync"`` and the ``run`` label, which docs/alertmanager.md's route and the default policy's
``alert-sync-checkpoint`` rule match.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from mixin.thresholds import DETECTIONS, OWN, SITE, THRESHOLDS, Detection, Site, Thresholds

RECORDING_GROUP = "storwatch.rules"
ALERT_GROUP = "storwatch.alerts"


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    """critical, warning or info; or ``{{ $labels.severity }}``: the severity of the run the series is about."""
    summary: str
    description: str
    """A Go template: ``{{ $labels.x }}`` and ``{{ $value }}`` of the firing series."""
    labels: Mapping[str, str]
    """Its other labels: the action label of an alert the agent can act on."""


RUN_SEVERITY = "cluster_node_run:storwatch_run_severity:max"
"""Each run's severity as the ``severity`` label of a series at 1, per (cluster, node, run): its finding's (a critical
one first), else warning. The alerts about a run take their severity from it (``run_severity()`` of
storwatch/policy/schema.py is the same for the agent's rules; a test holds them equal)."""
SEVERITY_FROM_LABEL = "{{ $labels.severity }}"


def _with_run_severity(expr: str) -> str:
    """``expr`` (series with a ``run`` label) with the run's severity label joined in."""
    return f"(\n{_indent(expr)}\n)\n* on (cluster, node, run) group_left (severity)\n{RUN_SEVERITY}"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _seconds(value: float) -> str:
    """A threshold in seconds as a person reads it in a description (3600 -> 1h)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value:g}s"


def recording_rules(th: Thresholds = THRESHOLDS) -> tuple[Recording, ...]:
    """The fleet aggregates, named level:metric:operations; each is kept by (cluster, node) or coarser."""
    w = th.stall_window
    return (
        # The dropped runs' share is always written (0 when none), so every node has a series, runs or not.
        Recording(
            "cluster_node:storwatch_gpu_seconds_at_risk:sum",
            "sum by (cluster, node) (\n"
            "  storwatch_gpu_seconds_at_risk or storwatch_checkpoint_dropped_gpu_seconds_at_risk\n"
            ")",
        ),
        Recording(
            "cluster:storwatch_gpu_seconds_at_risk:sum",
            "sum by (cluster) (cluster_node:storwatch_gpu_seconds_at_risk:sum)",
        ),
        Recording(
            "cluster_node_kind:storwatch_ephemeral_important_bytes:sum",
            "sum by (cluster, node, kind) (storwatch_ephemeral_important_bytes)",
        ),
        Recording("cluster_node:storwatch_mount_stuck:sum", "sum by (cluster, node) (storwatch_mount_stuck)"),
        Recording(
            f"cluster_node_gpu_cause:storwatch_gpu_stall_seconds:rate{w}",
            f"sum by (cluster, node, gpu, cause) (rate(storwatch_gpu_stall_seconds_total[{w}]))",
        ),
        Recording(
            f"cluster_node_gpu:storwatch_gpu_stall_share:rate{w}",
            f"sum by (cluster, node, gpu) (cluster_node_gpu_cause:storwatch_gpu_stall_seconds:rate{w})",
        ),
        # Stalled GPU time over all GPU time of the cluster, by cause.
        Recording(
            f"cluster_cause:storwatch_gpu_stall_share:ratio_rate{w}",
            f"sum by (cluster, cause) (cluster_node_gpu_cause:storwatch_gpu_stall_seconds:rate{w})\n"
            "/ on (cluster) group_left\n"
            "count by (cluster) (storwatch_gpu_info)",
        ),
        Recording(
            "cluster_node:storwatch_collectors_failing:sum",
            "sum by (cluster, node) (storwatch_collector_success == bool 0)",
        ),
        # A run's severity: its finding's, a critical one first, else warning (every run has its kept count).
        Recording(
            RUN_SEVERITY,
            'max by (cluster, node, run, severity) (storwatch_finding{kind!="dataset", severity="critical"})\n'
            "or on (cluster, node, run)\n"
            'max by (cluster, node, run, severity) (storwatch_finding{kind!="dataset"})\n'
            "or on (cluster, node, run)\n"
            'label_replace(count by (cluster, node, run) (storwatch_checkpoint_kept), "severity", "warning", "", "")',
        ),
    )


def _alert(d: Detection, expr: str, summary: str, description: str, th: Thresholds, site: Site) -> Alert:
    """An alert of detection ``d``: its ``for`` and severity (an alert about a run: the run's, joined into ``expr``),
    and the action label where its node's agent can act on it."""
    labels = {site.action_label: site.action_value} if d.acts else {}
    if d.severity == OWN:
        return Alert(d.alert or "", expr, th.for_(d), SEVERITY_FROM_LABEL, summary, description, labels)
    return Alert(d.alert or "", expr, th.for_(d), d.severity, summary, description, labels)


def alerts(th: Thresholds = THRESHOLDS, site: Site = SITE) -> tuple[Alert, ...]:
    budget = f"{th.rpo_budget_seconds:g}"
    w = th.stall_window
    d = {x.alert: x for x in DETECTIONS if x.alert is not None}

    def alert(name: str, expr: str, summary: str, description: str) -> Alert:
        return _alert(d[name], expr, summary, description, th, site)

    return (
        alert(
            "StorwatchImportantDataOnlyOnEphemeralStorage",
            # One per finding (a run's checkpoints or weights on one mount), its severity the finding's; a run with a
            # durable copy (one whose save is not dated in the future) is the recovery point's to judge.
            'storwatch_finding{kind=~"checkpoint|model"} > 0\n'
            "unless on (cluster, node, run)\n"
            "(storwatch_checkpoint_durable_copy_timestamp_seconds <= time())",
            "Checkpoints or model weights only on storage lost with the node.",
            "Run {{ $labels.run }} on node {{ $labels.node }} has {{ $labels.kind }} data on {{ $labels.mountpoint }}, "
            "storage that does not survive losing the node (volatile or node-local), with no durable copy the agent "
            "knows of.",
        ),
        alert(
            "StorwatchRecoveryPointOverBudget",
            # Only runs whose GPUs are here now: a finished run's last checkpoint ages forever and is nobody's loss.
            _with_run_severity(f"storwatch_recovery_point_seconds > {budget}\nand\nstorwatch_gpu_seconds_at_risk > 0"),
            "A training run would lose more than its recovery-point budget if its node died.",
            # $value is +Inf for a run with no checkpoint there: said in words, not as "+Inf old".
            "Run {{ $labels.run }} on node {{ $labels.node }} is training, and {{ if gt $value 1e300 }}no checkpoint "
            "of it is on storage that survives losing the node{{ else }}its newest checkpoint on storage that "
            "survives losing the node is {{ $value | humanizeDuration }} old{{ end }}; the budget is "
            f"{_seconds(th.rpo_budget_seconds)}.",
        ),
        alert(
            "StorwatchCheckpointIncomplete",
            _with_run_severity(
                "storwatch_checkpoint_incomplete > 0\nunless\nstorwatch_checkpoint_write_in_progress == 1"
            ),
            "A checkpoint was abandoned mid-write.",
            "Run {{ $labels.run }} on node {{ $labels.node }} has {{ $value }} incomplete checkpoint(s) that nothing "
            "is writing any more (a save cut short: truncated files, missing shards); resuming from one fails.",
        ),
        alert(
            "StorwatchCheckpointCorrupt",
            _with_run_severity("storwatch_checkpoint_corrupt > 0"),
            "A finished checkpoint is corrupt.",
            "Run {{ $labels.run }} on node {{ $labels.node }} has {{ $value }} corrupt checkpoint(s): finished, then "
            "damaged, or never valid (a bad CRC, a broken header); resuming from one fails.",
        ),
        alert(
            "StorwatchCheckpointUnsafe",
            _with_run_severity("storwatch_checkpoint_unsafe > 0"),
            "A checkpoint runs code when loaded.",
            "Run {{ $labels.run }} on node {{ $labels.node }} has {{ $value }} checkpoint(s) whose pickle names a "
            "global that runs code when loaded; do not load them with torch.load(weights_only=False).",
        ),
        alert(
            "StorwatchMountStuck",
            "storwatch_mount_stuck_seconds\nand\nstorwatch_mount_stuck == 1",
            "A mount does not answer.",
            "A statvfs on {{ $labels.mountpoint }} of node {{ $labels.node }} has not returned for "
            "{{ $value | humanizeDuration }}; every process touching the mount blocks, checkpoint writes included.",
        ),
        alert(
            "StorwatchGPUStallShareHigh",
            f"cluster_node_gpu:storwatch_gpu_stall_share:rate{w} > {th.stall_share:g}",
            "A GPU spends much of its time waiting on storage.",
            "GPU {{ $labels.gpu }} of node {{ $labels.node }} spent {{ $value | humanizePercentage }} of the last "
            f"{w} stalled on storage (checkpoint writes, slow data reads or I/O contention; over "
            f"{th.stall_share:.0%} alerts).",
        ),
        alert(
            "StorwatchCheckpointWillNotFit",
            _with_run_severity("-storwatch_checkpoint_headroom_bytes > 0"),
            "The next checkpoint of a run will not fit on its mount.",
            "The next checkpoint of run {{ $labels.run }} on node {{ $labels.node }} (its last one's size plus a "
            "quarter) needs {{ $value | humanize1024 }}B more than its mount has free.",
        ),
        alert(
            "StorwatchNodeDrainingWithEphemeralCheckpoints",
            # One per finding of checkpoints: it names the run, for the agent's copy.
            'storwatch_finding{kind="checkpoint"} > 0\nand on (cluster, node)\nstorwatch_node_draining == 1',
            "A node is draining while checkpoints exist only on its own storage.",
            "Node {{ $labels.node }} is being drained or removed, and the checkpoints of run {{ $labels.run }} on "
            "{{ $labels.mountpoint }} live only on storage lost with it.",
        ),
        alert(
            "StorwatchCollectorFailing",
            # A gpu collector failing because NVML is down is StorwatchNVMLDown's alone.
            "storwatch_collector_success == 0\n"
            "unless on (cluster, node, instance, collector)\n"
            '(\n  storwatch_collector_success{collector="gpu"} == 0\n'
            "  and on (cluster, node, instance)\n"
            "  storwatch_nvml_up == 0\n)",
            "A storwatch collector keeps failing.",
            "The {{ $labels.collector }} collector of the agent on node {{ $labels.node }} has failed for "
            f"{th.for_collector_failing}: what it reads is missing from the node's figures (the error is on the "
            "agent's /status).",
        ),
        alert(
            "StorwatchAgentDown",
            f'up{{job="{site.job}"}} == 0',
            "A storwatch agent cannot be scraped.",
            "Prometheus has not scraped the storwatch agent {{ $labels.instance }} on node {{ $labels.node }} for "
            f"{th.for_agent_down}: nothing watches that node's checkpoints and mounts.",
        ),
        alert(
            "StorwatchAgentAbsent",
            f'absent(up{{job="{site.job}"}} == 1)',
            "No storwatch agent is scraped anywhere.",
            f'No target of job "{site.job}" has been up for {th.for_agent_absent}: no node\'s checkpoints, mounts or '
            "GPU stalls are watched, and no storwatch alert can fire.",
        ),
        alert(
            "StorwatchNVMLDown",
            "storwatch_nvml_up == 0",
            "NVML does not answer on a node.",
            "The agent on node {{ $labels.node }} cannot reach the NVIDIA driver through NVML: GPU utilisation, "
            "processes and stall attribution are missing for that node.",
        ),
    )


def rule_groups(th: Thresholds = THRESHOLDS, site: Site = SITE) -> list[dict[str, Any]]:
    """The rule groups as Prometheus reads them (``groups:`` of a rules file, ``spec.groups`` of a PrometheusRule)."""
    return [
        {"name": RECORDING_GROUP, "rules": [{"record": r.record, "expr": r.expr} for r in recording_rules(th)]},
        {
            "name": ALERT_GROUP,
            "rules": [
                {
                    "alert": a.name,
                    "expr": a.expr,
                    "for": a.for_,
                    "labels": {"severity": a.severity, **a.labels},
                    "annotations": {
                        "summary": a.summary,
                        "description": a.description,
                        "runbook_url": site.runbook(a.name),
                    },
                }
                for a in alerts(th, site)
            ],
        },
    ]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (expressions) as literal blocks, so the files read as they were written."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(doc: Mapping[str, Any], header: str) -> str:
    body = yaml.dump(dict(doc), Dumper=_Dumper, sort_keys=False, width=100_000, allow_unicode=True)
    return header + body


HEADER = "# Generated by `python -m mixin` from mixin/; edit there, not here.\n"


def rules_file(th: Thresholds = THRESHOLDS, site: Site = SITE) -> str:
    """alerts/storwatch.rules.yaml: for Prometheus's ``rule_files``."""
    return _dump({"groups": rule_groups(th, site)}, HEADER)


def prometheus_rule(th: Thresholds = THRESHOLDS, site: Site = SITE) -> str:
    """alerts/prometheusrule.yaml: the same groups for the Prometheus Operator."""
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "storwatch",
            "namespace": "storwatch",
            "labels": {"app.kubernetes.io/name": "storwatch", "role": "alert-rules"},
        },
        "spec": {"groups": rule_groups(th, site)},
    }
    return _dump(doc, HEADER)
