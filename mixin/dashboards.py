"""The Grafana dashboards (Node, Checkpoints, Fleet), built with grafana-foundation-sdk: timeseries and stat panels, a
unit on each, datasource, cluster and node variables, fixed uids, and links to the runbook (its sections, from the
panels an alert is about) and to the node's /status.

Every query names only metrics of the catalog (storwatch/exporter/catalog.py), the recording rules of
:mod:`mixin.rules`, and Prometheus's own ``up`` (tests/test_mixin.py holds them to it). Two rules shape the
panels:

- A figure the agent counts from nothing (stalls, findings, important bytes, runs without a durable checkpoint) reads
  0 on a healthy node, not "No data": where the agent writes no series for a zero, the query adds a 0 for each group
  the agent is known to watch (:func:`_or_zero`: a GPU it sees, a checkpoint scan that succeeded), and nothing where
  it is not watching, so unknown stays unknown.
- A series that may be ``+Inf`` (a run with no checkpoint that survives its node) is shown by a stat panel that maps
  it to words (:data:`NO_DURABLE`), or filtered (``< +Inf``) or counted (``== +Inf``) in a timeseries: a graph cannot
  draw +Inf, and would stay empty for exactly the run at risk.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
    VariableHide,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

from mixin.thresholds import SITE, THRESHOLDS, Site, Thresholds

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
NODE_UID = "storwatch-node"
CHECKPOINTS_UID = "storwatch-checkpoints"
FLEET_UID = "storwatch-fleet"
TAGS = ["storwatch"]
NODE_SEL = 'cluster=~"$cluster", node=~"$node"'
"""The selector every per-node query carries."""
RUN_SEL = f'{NODE_SEL}, run=~"$run"'
CLUSTER_SEL = 'cluster=~"$cluster"'
STALL_CAUSES = ("checkpoint_write", "io_contention", "data_read")
"""storwatch.analysis.stalls.CAUSES, copied (the mixin reads only the metric catalog and storwatch.words of the
package; tests/test_mixin.py holds them equal)."""
FINDING_SEVERITIES = ("warning", "critical")
"""The severity label of storwatch_finding (likewise)."""
IMPORTANT_KINDS = ("checkpoint", "model", "dataset")
"""The kind label of storwatch_ephemeral_important_bytes (likewise)."""
ACTION_RESULTS = ("ok", "dry_run", "skipped", "rate_limited", "failed")
"""The result label of storwatch_policy_actions_total (likewise)."""
NO_DURABLE = "no durable checkpoint"
"""What +Inf means in storwatch_recovery_point_seconds and storwatch_gpu_seconds_at_risk: none of the run's
checkpoints survives losing its node."""
INFINITY = "Infinity"
"""The key a Grafana value mapping matches +Inf by: Grafana looks a value up as ``String(value)``."""


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


def _or_zero(expr: str, watched: str, by: Sequence[str] = (), fill: tuple[str, Sequence[str]] | None = None) -> str:
    """``expr``, and 0 for each group ``by`` of the series of ``watched`` (with each value of ``fill``'s label) that
    ``expr`` has no series for. ``watched`` is a series the agent writes only while it watches what ``expr`` counts
    (a GPU's info, a scan that succeeded): there a count with nothing in it is 0; elsewhere it stays unknown."""
    group = f"max by ({', '.join(by)}) ({watched})" if by else f"max({watched})"
    zero = f"0 * {group}"
    on = list(by)
    if fill is not None:
        label, values = fill
        zero = " or ".join(f'label_replace({zero}, "{label}", "{value}", "", "")' for value in values)
        on.append(label)
    return f"{expr}\nor on ({', '.join(on)})\n({zero})"


def _scan_ok(sel: str) -> str:
    """The checkpoint scan read its roots: its runs, findings and bytes are known (0 where there are none)."""
    return f'storwatch_collector_success{{{sel}, collector="checkpoints"}} == 1'


def _target(q: Query, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(ref).datasource(DATASOURCE).range()


def _runbook_link(site: Site, alert: str) -> db.DashboardLink:
    """A panel's link to the runbook section of the alert it is about."""
    return db.DashboardLink(f"Runbook: {alert}").url(site.runbook(alert)).target_blank(True)


def _timeseries(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    width: int = 12,
    links: Sequence[db.DashboardLink] = (),
    min_value: float | None = None,
    runbook: Sequence[db.DashboardLink] = (),
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(8)
        .span(width)
        .legend(
            common_builder.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
    )
    if min_value is not None:
        panel = panel.min(min_value)
    for i, q in enumerate(queries):
        panel = panel.with_target(_target(q, chr(ord("A") + i)))
    if links:
        panel = panel.data_links(list(links))
    if runbook:
        panel = panel.links(list(runbook))
    return panel


def _stat(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    mappings: dict[str, ValueMappingResult] | None = None,
    red_from: float | None = None,
    width: int = 12,
    links: Sequence[db.DashboardLink] = (),
    runbook: Sequence[db.DashboardLink] = (),
) -> stat.Panel:
    """The last value of each series as a tile, words for the values in ``mappings`` (``+Inf`` under
    :data:`INFINITY`), red from ``red_from`` (green below it)."""
    steps = [Threshold(None, "green")]
    if red_from is not None:
        steps.append(Threshold(red_from, "red"))
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(6)
        .span(width)
        .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.NONE)
        .thresholds(db.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps))
    )
    if mappings:
        panel = panel.mappings([ValueMap(options=mappings)])
    for i, q in enumerate(queries):
        panel = panel.with_target(_target(q, chr(ord("A") + i)))
    if links:
        panel = panel.data_links(list(links))
    if runbook:
        panel = panel.links(list(runbook))
    return panel


def _no_durable(words: str = NO_DURABLE) -> dict[str, ValueMappingResult]:
    return {INFINITY: ValueMappingResult(text=words, color="red", index=0)}


YES_NO = {
    "0": ValueMappingResult(text="no", color="green", index=0),
    "1": ValueMappingResult(text="yes", color="red", index=1),
}


def _datasource_variable() -> db.DatasourceVariable:
    return db.DatasourceVariable("datasource").label("Data source").type("prometheus")


def _query_variable(
    name: str, label: str, query: str, include_all: bool, multi: bool, hide: VariableHide = VariableHide.DONT_HIDE
) -> db.QueryVariable:
    var = (
        db.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DATASOURCE)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(include_all)
        .hide(hide)
    )
    if include_all:
        # ".*" also matches a series without the label (a Prometheus that adds no cluster label).
        var = var.all_value(".*").current(VariableOption(selected=True, text="All", value="$__all"))
    return var


def _cluster_variable() -> db.QueryVariable:
    return _query_variable("cluster", "Cluster", "label_values(storwatch_build_info, cluster)", True, True)


def _node_variable(multi: bool) -> db.QueryVariable:
    return _query_variable(
        "node", "Node", f"label_values(storwatch_build_info{{{CLUSTER_SEL}}}, node)", include_all=multi, multi=multi
    )


def _instance_variable() -> db.QueryVariable:
    """The agents' scrape addresses on the chosen nodes: the link to their /status."""
    return _query_variable(
        "instance",
        "Agent",
        f"label_values(storwatch_build_info{{{NODE_SEL}}}, instance)",
        include_all=False,
        multi=False,
        hide=VariableHide.HIDE_VARIABLE,
    )


def _links(site: Site, status: bool) -> list[db.DashboardLink]:
    links = [
        db.DashboardLink("Runbook").type(DashboardLinkType.LINK).url(site.runbook_url).icon("doc").target_blank(True),
        db.DashboardLink("storwatch dashboards")
        .type(DashboardLinkType.DASHBOARDS)
        .tags(TAGS)
        .as_dropdown(True)
        .include_vars(True)
        .keep_time(True),
    ]
    if status:
        # The scrape address is the agent's own listener: its /status page says what each figure is made of.
        links.append(
            db.DashboardLink("Node /status")
            .type(DashboardLinkType.LINK)
            .url("http://${instance}/status")
            .target_blank(True)
        )
    return links


def _to_node() -> db.DashboardLink:
    """A data link from a series carrying node (and cluster) to that node's dashboard."""
    return db.DashboardLink("Node ${__field.labels.node}").url(
        f"/d/{NODE_UID}?var-cluster=${{__field.labels.cluster}}&var-node=${{__field.labels.node}}&${{__url_time_range}}"
    )


def _dashboard(uid: str, title: str, description: str) -> db.Dashboard:
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("1m")
        .timezone("browser")
    )


def node_dashboard(th: Thresholds = THRESHOLDS, site: Site = SITE) -> db.Dashboard:
    rate = "$__rate_interval"
    s = NODE_SEL
    return (
        _dashboard(
            NODE_UID,
            "storwatch / Node",
            "One node: its mounts, disks and NFS, their latency, its GPUs' stalls, what is at risk, and what the agent "
            "did about it (copies, actions, received alerts), beside the node's drain and its workloads' I/O.",
        )
        .with_variable(_datasource_variable())
        .with_variable(_cluster_variable())
        .with_variable(_node_variable(multi=False))
        .with_variable(_instance_variable())
        .links(_links(site, status=True))
        .with_row(db.Row("Mounts"))
        .with_panel(
            _timeseries(
                "Mounts by durability",
                "How many mounts the node has of each durability class (volatile and node die with the node).",
                "short",
                [Query(f"count by (durability) (storwatch_mount_info{{{s}}})", "{{durability}}")],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Space available per mount",
                "Share of each mount's size still available to unprivileged writers.",
                "percentunit",
                [
                    Query(
                        f"storwatch_mount_avail_bytes{{{s}}} / (storwatch_mount_size_bytes{{{s}}} > 0)",
                        "{{mountpoint}}",
                    )
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Stuck mounts",
                "How long the oldest statvfs on each stuck mount has been in flight (0: answering).",
                "s",
                [Query(f"storwatch_mount_stuck_seconds{{{s}}}", "{{mountpoint}}")],
                width=24,
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchMountStuck")],
            )
        )
        .with_row(db.Row("Latency"))
        .with_panel(
            _timeseries(
                "Latency per mount (p95 over the last minute)",
                "The agent's own windows: the mount's reads, writes and flushes (block devices, NFS), and its probe's "
                "write, fsync and read back where probes run.",
                "s",
                [Query(f'storwatch_mount_latency_seconds{{{s}, window="1m", stat="p95"}}', "{{mountpoint}} {{op}}")],
            )
        )
        .with_panel(
            _timeseries(
                "Probe latency (p99)",
                "The active probe's write, fsync and read back of a small file, from its histogram.",
                "s",
                [
                    Query(
                        "histogram_quantile(0.99, sum by (mountpoint, op, le) "
                        f"(rate(storwatch_probe_duration_seconds_bucket{{{s}}}[{rate}])))",
                        "{{mountpoint}} {{op}}",
                    )
                ],
            )
        )
        .with_row(db.Row("Disks"))
        .with_panel(
            _timeseries(
                "Disk throughput",
                "Bytes read and written per second on each block device.",
                "Bps",
                [
                    Query(f"rate(storwatch_disk_read_bytes_total{{{s}}}[{rate}])", "{{device}} read"),
                    Query(f"rate(storwatch_disk_written_bytes_total{{{s}}}[{rate}])", "{{device}} write"),
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Disk operations",
                "Reads, writes and flushes completed per second on each block device.",
                "iops",
                [
                    Query(f"rate(storwatch_disk_reads_completed_total{{{s}}}[{rate}])", "{{device}} read"),
                    Query(f"rate(storwatch_disk_writes_completed_total{{{s}}}[{rate}])", "{{device}} write"),
                    Query(f"rate(storwatch_disk_flush_requests_total{{{s}}}[{rate}])", "{{device}} flush"),
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Disk time per operation",
                "Average time a read or a write took on each block device (none drawn while it does none).",
                "s",
                [
                    Query(
                        f"rate(storwatch_disk_read_time_seconds_total{{{s}}}[{rate}])\n"
                        f"/ (rate(storwatch_disk_reads_completed_total{{{s}}}[{rate}]) > 0)",
                        "{{device}} read",
                    ),
                    Query(
                        f"rate(storwatch_disk_write_time_seconds_total{{{s}}}[{rate}])\n"
                        f"/ (rate(storwatch_disk_writes_completed_total{{{s}}}[{rate}]) > 0)",
                        "{{device}} write",
                    ),
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Disk utilisation",
                "Share of the last interval each block device had I/O in flight.",
                "percentunit",
                [Query(f"storwatch_disk_utilization_ratio{{{s}}}", "{{device}}")],
                min_value=0,
            )
        )
        .with_row(db.Row("NFS"))
        .with_panel(
            _timeseries(
                "NFS operations",
                "RPC requests per second on each NFS mount, by operation (nfs.operations).",
                "reqps",
                [
                    Query(
                        f"sum by (mountpoint, operation) (rate(storwatch_nfs_operations_total{{{s}}}[{rate}]))",
                        "{{mountpoint}} {{operation}}",
                    )
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "NFS round trip per operation",
                "Average time from a request's transmission to its reply, on each NFS mount, by operation.",
                "s",
                [
                    Query(
                        f"rate(storwatch_nfs_rtt_seconds_total{{{s}}}[{rate}])\n"
                        f"/ (rate(storwatch_nfs_operations_total{{{s}}}[{rate}]) > 0)",
                        "{{mountpoint}} {{operation}}",
                    )
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "NFS errors, timeouts and retransmissions",
                "Per second on each NFS mount: requests that ended with an error, that hit a major timeout (server "
                "not responding), retransmissions, and reconnects of its transports.",
                "reqps",
                [
                    Query(
                        f"sum by (mountpoint) (rate(storwatch_nfs_errors_total{{{s}}}[{rate}]))",
                        "{{mountpoint}} errors",
                    ),
                    Query(
                        f"sum by (mountpoint) (rate(storwatch_nfs_major_timeouts_total{{{s}}}[{rate}]))",
                        "{{mountpoint}} major timeouts",
                    ),
                    Query(
                        f"sum by (mountpoint) (rate(storwatch_nfs_transmissions_total{{{s}}}[{rate}]))\n"
                        f"- sum by (mountpoint) (rate(storwatch_nfs_operations_total{{{s}}}[{rate}]))",
                        "{{mountpoint}} retransmissions",
                    ),
                    Query(
                        f"sum by (mountpoint) (rate(storwatch_nfs_transport_connects_total{{{s}}}[{rate}]))",
                        "{{mountpoint}} reconnects",
                    ),
                ],
                width=24,
                min_value=0,
            )
        )
        .with_row(db.Row("GPUs"))
        .with_panel(
            _timeseries(
                "GPU utilisation",
                "Share of the last sample period a kernel ran on each GPU.",
                "percentunit",
                [Query(f"storwatch_gpu_utilization_ratio{{{s}}}", "GPU {{gpu}}")],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "GPU time stalled on storage, by cause",
                "Stalled seconds per second of each GPU (1 = stalled all the time), by the cause and mount that "
                "explain them; counted once settled, about a checkpoint scan interval late. 0 for each GPU the agent "
                "sees and each cause it has not counted a stall of.",
                "percentunit",
                [
                    Query(
                        _or_zero(
                            f"sum by (gpu, cause, mountpoint) (rate(storwatch_gpu_stall_seconds_total{{{s}}}[{rate}]))",
                            f"storwatch_gpu_info{{{s}}}",
                            by=("gpu",),
                            fill=("cause", STALL_CAUSES),
                        ),
                        "GPU {{gpu}} {{cause}} {{mountpoint}}",
                    )
                ],
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchGPUStallShareHigh")],
            )
        )
        .with_row(db.Row("At risk"))
        .with_panel(
            _stat(
                "Recovery point per run",
                "Age of each run's newest checkpoint on storage that survives losing the node, now; "
                f"'{NO_DURABLE}' where it has none there; red past the budget ({th.rpo_budget_seconds:g} s).",
                "s",
                [Query(f"storwatch_recovery_point_seconds{{{s}}}", "{{run}}")],
                mappings=_no_durable(),
                red_from=th.rpo_budget_seconds,
                runbook=[_runbook_link(site, "StorwatchRecoveryPointOverBudget")],
            )
        )
        .with_panel(
            _stat(
                "GPU-seconds at risk per run",
                "GPU time each run would lose if the node died now: its recovery point times the GPUs it holds here; "
                f"'all: {NO_DURABLE}' where it has none that survives the node.",
                "s",
                [Query(f"storwatch_gpu_seconds_at_risk{{{s}}}", "{{run}}")],
                mappings=_no_durable(f"all: {NO_DURABLE}"),
                runbook=[_runbook_link(site, "StorwatchRecoveryPointOverBudget")],
            )
        )
        .with_panel(
            _timeseries(
                "Recovery point over time (runs with a durable checkpoint)",
                "Age of each run's newest checkpoint that survives losing the node, for the runs that have one "
                "(those without are counted beside).",
                "s",
                [Query(f"storwatch_recovery_point_seconds{{{s}}} < +Inf", "{{run}}")],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Runs with no durable checkpoint",
                "Runs none of whose checkpoints survives losing the node, and of those the ones training here now "
                "(GPU-seconds at risk without bound); 0 once the checkpoint scan has looked and found none.",
                "short",
                [
                    Query(_or_zero(f"count(storwatch_recovery_point_seconds{{{s}}} == +Inf)", _scan_ok(s)), "all runs"),
                    Query(
                        _or_zero(f"count(storwatch_gpu_seconds_at_risk{{{s}}} == +Inf)", _scan_ok(s)),
                        "training here now",
                    ),
                ],
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchRecoveryPointOverBudget")],
            )
        )
        .with_panel(
            _timeseries(
                "Important data on ephemeral storage",
                "Bytes of checkpoints, model weights and datasets on mounts lost with the node; 0 for each kind once "
                "the checkpoint scan has looked and found none.",
                "bytes",
                [
                    Query(
                        _or_zero(
                            f"storwatch_ephemeral_important_bytes{{{s}}}", _scan_ok(s), fill=("kind", IMPORTANT_KINDS)
                        ),
                        "{{mountpoint}} {{kind}}",
                    )
                ],
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchImportantDataOnlyOnEphemeralStorage")],
            )
        )
        .with_panel(
            _timeseries(
                "Findings by severity",
                "Open findings (important data only on this node's storage); each one's sentence is on /status.",
                "short",
                [
                    Query(
                        _or_zero(
                            f"count by (severity) (storwatch_finding{{{s}}})",
                            _scan_ok(s),
                            fill=("severity", FINDING_SEVERITIES),
                        ),
                        "{{severity}}",
                    )
                ],
                min_value=0,
            )
        )
        .with_row(db.Row("Drain"))
        .with_panel(
            _stat(
                "Drain state",
                "Whether the Kubernetes node is cordoned, being drained, and announced for removal (a cluster "
                "autoscaler or Karpenter taint); none of them on a node the agent sees no Kubernetes node for.",
                "short",
                [
                    Query(f"max(storwatch_node_cordoned{{{s}}})", "cordoned"),
                    Query(f"max(storwatch_node_draining{{{s}}})", "draining"),
                    Query(
                        _or_zero(f"max(storwatch_node_removal_taint{{{s}}})", f"storwatch_node_draining{{{s}}}"),
                        "removal announced",
                    ),
                ],
                mappings=YES_NO,
                red_from=1,
                runbook=[_runbook_link(site, "StorwatchNodeDrainingWithEphemeralCheckpoints")],
            )
        )
        .with_panel(
            _stat(
                "Pods being deleted",
                "Pods on this node with a deletion under way (their time left is beside).",
                "short",
                [
                    Query(
                        _or_zero(f"count(storwatch_pod_deletion_seconds_left{{{s}}})", f"storwatch_kube_api_up{{{s}}}"),
                        "pods",
                    )
                ],
            )
        )
        .with_panel(
            _timeseries(
                "Drain over time",
                "1 while the node is cordoned, draining, or announced for removal: to set beside the copies below.",
                "short",
                [
                    Query(f"max(storwatch_node_cordoned{{{s}}})", "cordoned"),
                    Query(f"max(storwatch_node_draining{{{s}}})", "draining"),
                    Query(
                        _or_zero(f"max(storwatch_node_removal_taint{{{s}}})", f"storwatch_node_draining{{{s}}}"),
                        "removal announced",
                    ),
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Time left for pods being deleted",
                "Seconds before each pod being deleted on this node is killed: what a copy of its checkpoints has.",
                "s",
                [Query(f"storwatch_pod_deletion_seconds_left{{{s}}}", "{{namespace}}/{{pod}}")],
                min_value=0,
            )
        )
        .with_row(db.Row("Copies and actions"))
        .with_panel(
            _timeseries(
                "Copies by outcome",
                "Checkpoint copies to durable storage (the sync action) that ended in each interval: verified, "
                "failed, or superseded by a newer checkpoint of the same run.",
                "short",
                [
                    Query(
                        f"sum by (result) (increase(storwatch_sync_copies_total{{{s}}}[{rate}]))",
                        "{{result}}",
                    ),
                    Query(f"max(storwatch_sync_in_progress{{{s}}})", "in progress"),
                ],
                min_value=0,
            )
        )
        .with_panel(
            _stat(
                "Age of the newest verified copy per run",
                "For each run with a durable copy (a verified copy storwatch made, or a checkpoint at the same path "
                "below a durable root): how old the save it protects is; and since the agent's last copy of the run "
                "completed, verified (runs it copied since it started).",
                "s",
                [
                    Query(f"time() - storwatch_checkpoint_durable_copy_timestamp_seconds{{{s}}}", "{{run}} save"),
                    Query(f"time() - storwatch_sync_last_success_timestamp_seconds{{{s}}}", "{{run}} copied"),
                ],
                red_from=th.rpo_budget_seconds,
            )
        )
        .with_panel(
            _timeseries(
                "Actions by result",
                "What the policy's actions (log, event, webhook, request_checkpoint, sync) did in each interval; 0 for "
                "each result none had while a policy is loaded.",
                "short",
                [
                    Query(
                        _or_zero(
                            f"sum by (action, result) (increase(storwatch_policy_actions_total{{{s}}}[{rate}]))",
                            f"storwatch_policy_last_reload_success{{{s}}}",
                            fill=("result", ACTION_RESULTS),
                        ),
                        "{{action}} {{result}}",
                    )
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Policy rules firing",
                "Entities each policy rule fires for now, by its severity.",
                "short",
                [Query(f"sum by (rule, severity) (storwatch_policy_rule_firing{{{s}}})", "{{rule}} ({{severity}})")],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Received alerts",
                "Alerts Alertmanager posted to the agent's receiver in each interval, by what became of them (stored, "
                "updated, stale, ignored: another node's, evicted), and refused requests.",
                "short",
                [
                    Query(
                        f"sum by (result) (increase(storwatch_alertmanager_alerts_total{{{s}}}[{rate}]))",
                        "{{result}}",
                    ),
                    Query(
                        f'sum by (result) (increase(storwatch_alertmanager_requests_total{{{s}, result!="accepted"}}'
                        f"[{rate}]))",
                        "request {{result}}",
                    ),
                ],
                width=24,
                min_value=0,
            )
        )
        .with_row(db.Row("Workloads"))
        .with_panel(
            _timeseries(
                "Workload I/O",
                "Bytes each GPU workload (pod, Slurm job or process) read from and sent to the storage layer per "
                "second, its data loaders included; page cache hits are not in it.",
                "Bps",
                [
                    Query(
                        f"sum by (workload) (rate(storwatch_workload_read_bytes_total{{{s}}}[{rate}]))",
                        "{{workload}} read",
                    ),
                    Query(
                        f"sum by (workload) (rate(storwatch_workload_written_bytes_total{{{s}}}[{rate}]))",
                        "{{workload}} write",
                    ),
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Workload read and write calls",
                "Read and write calls per second of each GPU workload (files, pipes and sockets alike).",
                "ops",
                [
                    Query(
                        f"sum by (workload) (rate(storwatch_workload_read_calls_total{{{s}}}[{rate}]))",
                        "{{workload}} read",
                    ),
                    Query(
                        f"sum by (workload) (rate(storwatch_workload_write_calls_total{{{s}}}[{rate}]))",
                        "{{workload}} write",
                    ),
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Workload average call size",
                "Bytes per read and per write call of each GPU workload (none drawn while it makes none).",
                "bytes",
                [
                    Query(
                        f"sum by (workload) (rate(storwatch_workload_read_call_bytes_total{{{s}}}[{rate}]))\n"
                        f"/ (sum by (workload) (rate(storwatch_workload_read_calls_total{{{s}}}[{rate}])) > 0)",
                        "{{workload}} read",
                    ),
                    Query(
                        f"sum by (workload) (rate(storwatch_workload_write_call_bytes_total{{{s}}}[{rate}]))\n"
                        f"/ (sum by (workload) (rate(storwatch_workload_write_calls_total{{{s}}}[{rate}])) > 0)",
                        "{{workload}} write",
                    ),
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Workload mounts",
                "Mounts each GPU workload has files open on, by access mode.",
                "short",
                [
                    Query(
                        f"count by (workload, mode) (storwatch_workload_mount{{{s}}})",
                        "{{workload}} {{mode}}",
                    )
                ],
                min_value=0,
            )
        )
        .with_row(db.Row("Agent"))
        .with_panel(
            _timeseries(
                "Collector success",
                "Share of the window each collector's runs succeeded (below 1: the error is on /status).",
                "percentunit",
                [Query(f"avg_over_time(storwatch_collector_success{{{s}}}[{rate}])", "{{collector}}")],
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchCollectorFailing")],
            )
        )
        .with_panel(
            _timeseries(
                "Collector duration",
                "How long each collector's last run took.",
                "s",
                [Query(f"storwatch_collector_duration_seconds{{{s}}}", "{{collector}}")],
                min_value=0,
            )
        )
    )


def checkpoints_dashboard(th: Thresholds = THRESHOLDS, site: Site = SITE) -> db.Dashboard:
    run_variable = _query_variable(
        "run", "Run", f"label_values(storwatch_checkpoint_kept{{{NODE_SEL}}}, run)", include_all=True, multi=True
    )
    return (
        _dashboard(
            CHECKPOINTS_UID,
            "storwatch / Checkpoints",
            "Each checkpoint run on a node: age, interval, write time and throughput, integrity, headroom.",
        )
        .with_variable(_datasource_variable())
        .with_variable(_cluster_variable())
        .with_variable(_node_variable(multi=False))
        .with_variable(_instance_variable())
        .with_variable(run_variable)
        .links(_links(site, status=True))
        .with_row(db.Row("Cadence"))
        .with_panel(
            _timeseries(
                "Age of the newest complete checkpoint",
                "Since the newest complete checkpoint of each run was written, wherever it is.",
                "s",
                [
                    Query(
                        f"time() - max by (run) (storwatch_checkpoint_last_complete_timestamp_seconds{{{RUN_SEL}}})",
                        "{{run}}",
                    )
                ],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Checkpoint interval",
                "Time between each run's two newest complete checkpoints, beside the interval its measured write "
                "time and checkpoints.mtbf_seconds call for.",
                "s",
                [
                    Query(f"storwatch_checkpoint_interval_seconds{{{RUN_SEL}}}", "{{run}}"),
                    Query(f"storwatch_checkpoint_recommended_interval_seconds{{{RUN_SEL}}}", "{{run}} recommended"),
                ],
                min_value=0,
            )
        )
        .with_row(db.Row("Writes"))
        .with_panel(
            _timeseries(
                "Write time",
                "How long each run's newest timed complete checkpoint took to write, and its share of the interval.",
                "s",
                [Query(f"storwatch_checkpoint_write_duration_seconds{{{RUN_SEL}}}", "{{run}}")],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Write throughput",
                "Each run's newest timed checkpoint's size over its write time.",
                "Bps",
                [Query(f"storwatch_checkpoint_write_bytes_per_second{{{RUN_SEL}}}", "{{run}}")],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Checkpoint overhead",
                "Write time over the current checkpoint interval: the share of training spent saving.",
                "percentunit",
                [Query(f"storwatch_checkpoint_overhead_ratio{{{RUN_SEL}}}", "{{run}}")],
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Checkpoint size",
                "Size of each run's newest complete checkpoint.",
                "bytes",
                [Query(f"storwatch_checkpoint_size_bytes{{{RUN_SEL}}}", "{{run}}")],
                min_value=0,
            )
        )
        .with_row(db.Row("Integrity and space"))
        .with_panel(
            _timeseries(
                "Integrity",
                "Checkpoints of each run that are incomplete (being written, or abandoned mid-write), corrupt, or "
                "unsafe to load.",
                "short",
                [
                    Query(f"storwatch_checkpoint_incomplete{{{RUN_SEL}}}", "{{run}} incomplete"),
                    Query(f"storwatch_checkpoint_corrupt{{{RUN_SEL}}}", "{{run}} corrupt"),
                    Query(f"storwatch_checkpoint_unsafe{{{RUN_SEL}}}", "{{run}} unsafe"),
                ],
                min_value=0,
                runbook=[
                    _runbook_link(site, "StorwatchCheckpointIncomplete"),
                    _runbook_link(site, "StorwatchCheckpointCorrupt"),
                    _runbook_link(site, "StorwatchCheckpointUnsafe"),
                ],
            )
        )
        .with_panel(
            _timeseries(
                "Headroom",
                "Space left on each run's mount once its next checkpoint (the last one's size plus a quarter) is "
                "written; below 0 it will not fit.",
                "bytes",
                [Query(f"storwatch_checkpoint_headroom_bytes{{{RUN_SEL}}}", "{{run}}")],
                runbook=[_runbook_link(site, "StorwatchCheckpointWillNotFit")],
            )
        )
        .with_panel(
            _timeseries(
                "Orphaned temporaries",
                "Bytes of atomic_save temporaries whose writer is gone (the run's next atomic_save removes them).",
                "bytes",
                [Query(f"storwatch_checkpoint_orphaned_temp_bytes{{{RUN_SEL}}}", "{{run}}")],
                min_value=0,
            )
        )
    )


def fleet_dashboard(th: Thresholds = THRESHOLDS, site: Site = SITE) -> db.Dashboard:
    w = th.stall_window
    rate = "$__rate_interval"
    c = CLUSTER_SEL
    to_node = [_to_node()]
    return (
        _dashboard(
            FLEET_UID,
            "storwatch / Fleet",
            "Every node: what is at risk, where, what the agents did about it, and which agents are blind.",
        )
        .with_variable(_datasource_variable())
        .with_variable(_cluster_variable())
        .links(_links(site, status=False))
        .with_row(db.Row("At risk"))
        .with_panel(
            _stat(
                "Worst recovery points",
                "The ten runs whose newest durable checkpoint is oldest, now; "
                f"'{NO_DURABLE}' where none of their checkpoints survives their node.",
                "s",
                [
                    Query(
                        f"topk(10, max by (cluster, node, run) (storwatch_recovery_point_seconds{{{c}}}))",
                        "{{node}} {{run}}",
                    )
                ],
                mappings=_no_durable(),
                red_from=th.rpo_budget_seconds,
                links=to_node,
                runbook=[_runbook_link(site, "StorwatchRecoveryPointOverBudget")],
            )
        )
        .with_panel(
            _stat(
                "GPU-seconds at risk",
                "GPU time lost if every node died now, summed per cluster (runs past the agent's bound included); "
                f"'all: a run has {NO_DURABLE}' where a run training has none that survives its node.",
                "s",
                [Query(f"cluster:storwatch_gpu_seconds_at_risk:sum{{{c}}}", "{{cluster}}")],
                mappings=_no_durable(f"all: a run has {NO_DURABLE}"),
            )
        )
        .with_panel(
            _timeseries(
                "Training runs with no durable checkpoint, by node",
                "Runs training on a node with none of their checkpoints on storage that survives it; 0 for each node "
                "whose checkpoint scan looked and found none.",
                "short",
                [
                    Query(
                        _or_zero(
                            f"count by (cluster, node) (storwatch_gpu_seconds_at_risk{{{c}}} == +Inf)",
                            _scan_ok(c),
                            by=("cluster", "node"),
                        ),
                        "{{node}}",
                    )
                ],
                links=to_node,
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchRecoveryPointOverBudget")],
            )
        )
        .with_panel(
            _timeseries(
                "Important data on ephemeral storage, by node",
                "Bytes of checkpoints, model weights and datasets on storage lost with its node.",
                "bytes",
                [
                    Query(
                        _or_zero(
                            f"cluster_node_kind:storwatch_ephemeral_important_bytes:sum{{{c}}}",
                            _scan_ok(c),
                            by=("cluster", "node"),
                            fill=("kind", IMPORTANT_KINDS),
                        ),
                        "{{node}} {{kind}}",
                    )
                ],
                links=to_node,
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchImportantDataOnlyOnEphemeralStorage")],
            )
        )
        .with_panel(
            _timeseries(
                "Stuck mounts, by node",
                "Mounts whose statvfs is past its deadline.",
                "short",
                [Query(f"cluster_node:storwatch_mount_stuck:sum{{{c}}}", "{{node}}")],
                links=to_node,
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchMountStuck")],
            )
        )
        .with_row(db.Row("Stalls"))
        .with_panel(
            _timeseries(
                "GPU time stalled on storage, by cause",
                f"Stalled GPU time over all GPU time of the cluster, over {w}; 0 for each cause not counted.",
                "percentunit",
                [
                    Query(
                        _or_zero(
                            f"cluster_cause:storwatch_gpu_stall_share:ratio_rate{w}{{{c}}}",
                            f"storwatch_gpu_info{{{c}}}",
                            by=("cluster",),
                            fill=("cause", STALL_CAUSES),
                        ),
                        "{{cluster}} {{cause}}",
                    )
                ],
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchGPUStallShareHigh")],
            )
        )
        .with_panel(
            _timeseries(
                "Most stalled GPUs",
                f"The ten GPUs with the largest share of time stalled on storage over {w}.",
                "percentunit",
                [
                    Query(
                        "topk(10, "
                        + _or_zero(
                            f"cluster_node_gpu:storwatch_gpu_stall_share:rate{w}{{{c}}}",
                            f"storwatch_gpu_info{{{c}}}",
                            by=("cluster", "node", "gpu"),
                        )
                        + ")",
                        "{{node}} GPU {{gpu}}",
                    )
                ],
                links=to_node,
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchGPUStallShareHigh")],
            )
        )
        .with_row(db.Row("Acting"))
        .with_panel(
            _timeseries(
                "Copies by outcome, by node",
                "Checkpoint copies to durable storage that ended in each interval on each node: verified, failed, "
                "or superseded by a newer checkpoint.",
                "short",
                [
                    Query(
                        f"sum by (cluster, node, result) (increase(storwatch_sync_copies_total{{{c}}}[{rate}]))",
                        "{{node}} {{result}}",
                    )
                ],
                links=to_node,
                min_value=0,
            )
        )
        .with_panel(
            _timeseries(
                "Nodes draining",
                "Nodes being drained or announced for removal, per cluster (nodes without Kubernetes are not in it).",
                "short",
                [Query(f"sum by (cluster) (storwatch_node_draining{{{c}}})", "{{cluster}}")],
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchNodeDrainingWithEphemeralCheckpoints")],
            )
        )
        .with_row(db.Row("Agents"))
        .with_panel(
            _timeseries(
                "Agents down",
                "Agents Prometheus cannot scrape: nothing watches those nodes.",
                "short",
                [Query(f'sum by (cluster) (up{{job="{site.job}", {c}}} == bool 0)', "{{cluster}}")],
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchAgentDown")],
            )
        )
        .with_panel(
            _timeseries(
                "Nodes with a failing collector",
                "Nodes whose agent has at least one collector failing (its error is on the node's /status).",
                "short",
                [
                    Query(
                        f"sum by (cluster) (cluster_node:storwatch_collectors_failing:sum{{{c}}} > bool 0)",
                        "{{cluster}}",
                    )
                ],
                min_value=0,
                runbook=[_runbook_link(site, "StorwatchCollectorFailing")],
            )
        )
    )


def dashboards(th: Thresholds = THRESHOLDS, site: Site = SITE) -> dict[str, str]:
    """Each dashboard's file name under dashboards/ and its JSON, as checked in."""
    built = {
        "storwatch-node.json": node_dashboard(th, site),
        "storwatch-checkpoints.json": checkpoints_dashboard(th, site),
        "storwatch-fleet.json": fleet_dashboard(th, site),
    }
    out = {}
    for name, d in built.items():
        doc = json.loads(JSONEncoder().encode(d.build()))
        # Fixed panel ids (the builder leaves rows at 0 and panels without one), so links to a panel keep working.
        for number, panel in enumerate(doc["panels"], start=1):
            panel["id"] = number
        out[name] = json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"
    return out
