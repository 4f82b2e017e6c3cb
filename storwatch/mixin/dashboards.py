"""The Grafana dashboards (Node, Checkpoints, Fleet), built with grafana-foundation-sdk: timeseries panels, a unit on
each, datasource, cluster and node variables, fixed uids, and links to the runbook and to the node's /status.

Every query names only metrics of the catalog (storwatch/exporter/catalog.py), the recording rules of
:mod:`storwatch.mixin.rules`, and Prometheus's own ``up`` (tests/test_mixin.py holds them to it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    VariableHide,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

from storwatch.mixin.thresholds import SITE, THRESHOLDS, Site, Thresholds

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
NODE_UID = "storwatch-node"
CHECKPOINTS_UID = "storwatch-checkpoints"
FLEET_UID = "storwatch-fleet"
TAGS = ["storwatch"]
NODE_SEL = 'cluster=~"$cluster", node=~"$node"'
"""The selector every per-node query carries."""
RUN_SEL = f'{NODE_SEL}, run=~"$run"'
CLUSTER_SEL = 'cluster=~"$cluster"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


def _target(q: Query, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(ref).datasource(DATASOURCE).range()


def _panel(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    width: int = 12,
    links: Sequence[db.DashboardLink] = (),
    min_value: float | None = None,
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
    return panel


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
    return (
        _dashboard(
            NODE_UID, "storwatch / Node", "One node: its mounts, their latency, its GPUs' stalls, what is at risk."
        )
        .with_variable(_datasource_variable())
        .with_variable(_cluster_variable())
        .with_variable(_node_variable(multi=False))
        .with_variable(_instance_variable())
        .links(_links(site, status=True))
        .with_row(db.Row("Mounts"))
        .with_panel(
            _panel(
                "Mounts by durability",
                "How many mounts the node has of each durability class (volatile and node die with the node).",
                "short",
                [Query(f"count by (durability) (storwatch_mount_info{{{NODE_SEL}}})", "{{durability}}")],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Space available per mount",
                "Share of each mount's size still available to unprivileged writers.",
                "percentunit",
                [
                    Query(
                        f"storwatch_mount_avail_bytes{{{NODE_SEL}}} / (storwatch_mount_size_bytes{{{NODE_SEL}}} > 0)",
                        "{{mountpoint}}",
                    )
                ],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Stuck mounts",
                "How long the oldest statvfs on each stuck mount has been in flight (0: answering).",
                "s",
                [Query(f"storwatch_mount_stuck_seconds{{{NODE_SEL}}}", "{{mountpoint}}")],
                width=24,
                min_value=0,
            )
        )
        .with_row(db.Row("Latency"))
        .with_panel(
            _panel(
                "Latency per mount (p95 over the last minute)",
                "The agent's own windows: the mount's reads, writes and flushes (block devices, NFS), and its probe's "
                "write, fsync and read back where probes run.",
                "s",
                [
                    Query(
                        f'storwatch_mount_latency_seconds{{{NODE_SEL}, window="1m", stat="p95"}}',
                        "{{mountpoint}} {{op}}",
                    )
                ],
            )
        )
        .with_panel(
            _panel(
                "Probe latency (p99)",
                "The active probe's write, fsync and read back of a small file, from its histogram.",
                "s",
                [
                    Query(
                        "histogram_quantile(0.99, sum by (mountpoint, op, le) "
                        f"(rate(storwatch_probe_duration_seconds_bucket{{{NODE_SEL}}}[{rate}])))",
                        "{{mountpoint}} {{op}}",
                    )
                ],
            )
        )
        .with_row(db.Row("GPUs"))
        .with_panel(
            _panel(
                "GPU utilisation",
                "Share of the last sample period a kernel ran on each GPU.",
                "percentunit",
                [Query(f"storwatch_gpu_utilization_ratio{{{NODE_SEL}}}", "GPU {{gpu}}")],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "GPU time stalled on storage, by cause",
                "Stalled seconds per second of each GPU (1 = stalled all the time), by the cause and mount that "
                "explain them; counted once settled, about a checkpoint scan interval late.",
                "percentunit",
                [
                    Query(
                        "sum by (gpu, cause, mountpoint) "
                        f"(rate(storwatch_gpu_stall_seconds_total{{{NODE_SEL}}}[{rate}]))",
                        "GPU {{gpu}} {{cause}} {{mountpoint}}",
                    )
                ],
                min_value=0,
            )
        )
        .with_row(db.Row("At risk"))
        .with_panel(
            _panel(
                "Recovery point per run",
                "Age of each run's newest checkpoint on storage that survives losing the node (+Inf: none there); "
                f"the budget is {th.rpo_budget_seconds:g} s.",
                "s",
                [Query(f"storwatch_recovery_point_seconds{{{NODE_SEL}}}", "{{run}}")],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "GPU-seconds at risk per run",
                "GPU time each run would lose if the node died now: its recovery point times the GPUs it holds here.",
                "s",
                [Query(f"storwatch_gpu_seconds_at_risk{{{NODE_SEL}}}", "{{run}}")],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Important data on ephemeral storage",
                "Bytes of checkpoints, model weights and datasets on mounts lost with the node.",
                "bytes",
                [Query(f"storwatch_ephemeral_important_bytes{{{NODE_SEL}}}", "{{mountpoint}} {{kind}}")],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Findings by severity",
                "Open findings (important data only on this node's storage); each one's sentence is on /status.",
                "short",
                [Query(f"count by (severity) (storwatch_finding{{{NODE_SEL}}})", "{{severity}}")],
                min_value=0,
            )
        )
        .with_row(db.Row("Agent"))
        .with_panel(
            _panel(
                "Collector success",
                "Share of the window each collector's runs succeeded (below 1: the error is on /status).",
                "percentunit",
                [Query(f"avg_over_time(storwatch_collector_success{{{NODE_SEL}}}[{rate}])", "{{collector}}")],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Collector duration",
                "How long each collector's last run took.",
                "s",
                [Query(f"storwatch_collector_duration_seconds{{{NODE_SEL}}}", "{{collector}}")],
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
            _panel(
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
            _panel(
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
            _panel(
                "Write time",
                "How long each run's newest timed complete checkpoint took to write, and its share of the interval.",
                "s",
                [Query(f"storwatch_checkpoint_write_duration_seconds{{{RUN_SEL}}}", "{{run}}")],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Write throughput",
                "Each run's newest timed checkpoint's size over its write time.",
                "Bps",
                [Query(f"storwatch_checkpoint_write_bytes_per_second{{{RUN_SEL}}}", "{{run}}")],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Checkpoint overhead",
                "Write time over the current checkpoint interval: the share of training spent saving.",
                "percentunit",
                [Query(f"storwatch_checkpoint_overhead_ratio{{{RUN_SEL}}}", "{{run}}")],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Checkpoint size",
                "Size of each run's newest complete checkpoint.",
                "bytes",
                [Query(f"storwatch_checkpoint_size_bytes{{{RUN_SEL}}}", "{{run}}")],
                min_value=0,
            )
        )
        .with_row(db.Row("Integrity and space"))
        .with_panel(
            _panel(
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
            )
        )
        .with_panel(
            _panel(
                "Headroom",
                "Space left on each run's mount once its next checkpoint (the last one's size plus a quarter) is "
                "written; below 0 it will not fit.",
                "bytes",
                [Query(f"storwatch_checkpoint_headroom_bytes{{{RUN_SEL}}}", "{{run}}")],
            )
        )
        .with_panel(
            _panel(
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
    to_node = [_to_node()]
    return (
        _dashboard(FLEET_UID, "storwatch / Fleet", "Every node: what is at risk, where, and which agents are blind.")
        .with_variable(_datasource_variable())
        .with_variable(_cluster_variable())
        .links(_links(site, status=False))
        .with_row(db.Row("At risk"))
        .with_panel(
            _panel(
                "Worst recovery points",
                "The ten runs whose newest durable checkpoint is oldest (+Inf: none of their checkpoints survives "
                "their node).",
                "s",
                [
                    Query(
                        f"topk(10, max by (cluster, node, run) (storwatch_recovery_point_seconds{{{CLUSTER_SEL}}}))",
                        "{{node}} {{run}}",
                    )
                ],
                links=to_node,
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "GPU-seconds at risk",
                "GPU time lost if every node died now, summed per cluster (runs past the agent's bound included).",
                "s",
                [Query(f"cluster:storwatch_gpu_seconds_at_risk:sum{{{CLUSTER_SEL}}}", "{{cluster}}")],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Important data on ephemeral storage, by node",
                "Bytes of checkpoints, model weights and datasets on storage lost with its node.",
                "bytes",
                [
                    Query(
                        f"cluster_node_kind:storwatch_ephemeral_important_bytes:sum{{{CLUSTER_SEL}}}",
                        "{{node}} {{kind}}",
                    )
                ],
                links=to_node,
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Stuck mounts, by node",
                "Mounts whose statvfs is past its deadline.",
                "short",
                [Query(f"cluster_node:storwatch_mount_stuck:sum{{{CLUSTER_SEL}}}", "{{node}}")],
                links=to_node,
                min_value=0,
            )
        )
        .with_row(db.Row("Stalls"))
        .with_panel(
            _panel(
                "GPU time stalled on storage, by cause",
                f"Stalled GPU time over all GPU time of the cluster, over {w}.",
                "percentunit",
                [
                    Query(
                        f"cluster_cause:storwatch_gpu_stall_share:ratio_rate{w}{{{CLUSTER_SEL}}}",
                        "{{cluster}} {{cause}}",
                    )
                ],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Most stalled GPUs",
                f"The ten GPUs with the largest share of time stalled on storage over {w}.",
                "percentunit",
                [
                    Query(
                        f"topk(10, cluster_node_gpu:storwatch_gpu_stall_share:rate{w}{{{CLUSTER_SEL}}})",
                        "{{node}} GPU {{gpu}}",
                    )
                ],
                links=to_node,
                min_value=0,
            )
        )
        .with_row(db.Row("Agents"))
        .with_panel(
            _panel(
                "Agents down",
                "Agents Prometheus cannot scrape: nothing watches those nodes.",
                "short",
                [Query(f'sum by (cluster) (up{{job="{site.job}", {CLUSTER_SEL}}} == bool 0)', "{{cluster}}")],
                min_value=0,
            )
        )
        .with_panel(
            _panel(
                "Nodes with a failing collector",
                "Nodes whose agent has at least one collector failing (its error is on the node's /status).",
                "short",
                [
                    Query(
                        f"sum by (cluster) (cluster_node:storwatch_collectors_failing:sum{{{CLUSTER_SEL}}} > bool 0)",
                        "{{cluster}}",
                    )
                ],
                min_value=0,
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
