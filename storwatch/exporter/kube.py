"""The Kubernetes area: whether the API answers, whether this node is cordoned, draining or announced for removal,
and how long each pod being deleted here has left (storwatch_kube_api_up, storwatch_node_*,
storwatch_pod_deletion_seconds_left)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.spec import Label, gauge
from storwatch.exporter.text import Family

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

# -- kube

KUBE_API_UP = gauge("kube", "storwatch_kube_api_up", "1 when the Kubernetes API answered the agent's watches.")
NODE_CORDONED = gauge("kube", "storwatch_node_cordoned", "1 when this node is cordoned (unschedulable).")
NODE_DRAINING = gauge("kube", "storwatch_node_draining", "1 when this node is being drained or announced for removal.")
NODE_REMOVAL_TAINT = gauge(
    "kube",
    "storwatch_node_removal_taint",
    "A taint that announces this node's removal.",
    Label(
        "taint",
        "one per removal taint on this node: the known keys and the cloud handlers' prefixes "
        "(sources/kubevolumes.py REMOVAL_TAINTS)",
    ),
)
POD_DELETION_SECONDS_LEFT = gauge(
    "kube",
    "storwatch_pod_deletion_seconds_left",
    "Seconds before a pod on this node that is being deleted is killed.",
    Label("namespace", "one per pod on this node being deleted"),
    Label("pod", "one per pod on this node being deleted"),
)


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    kube = view.kube if view is not None else None
    if view is None or kube is None or not kube.enabled:
        # Off (no cluster on this node): no API server to be up or down, so no up-series that could page.
        return
    up = KUBE_API_UP.family()
    up.add((), 1 if kube.api_up else 0)
    yield up
    if kube.node is not None:
        cordoned = NODE_CORDONED.family()
        cordoned.add((), 1 if kube.node.cordoned else 0)
        draining = NODE_DRAINING.family()
        draining.add((), 1 if kube.node.draining else 0)
        taints = NODE_REMOVAL_TAINT.family()
        for key in kube.node.removal_taints:
            taints.add((key,), 1)
        yield from (cordoned, draining, taints)
    left = POD_DELETION_SECONDS_LEFT.family()
    for pod, seconds in kube.terminating_pods(view.timestamp):
        left.add((pod.namespace, pod.name), max(0.0, seconds))
    yield left
