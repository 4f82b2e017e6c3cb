"""The Kubernetes area: whether the API answers, whether this node is cordoned, draining or announced for removal,
and how long each pod being deleted here has left (storwatch_kube_api_up, storwatch_node_*,
storwatch_pod_deletion_seconds_left)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    kube = view.kube if view is not None else None
    if view is None or kube is None or not kube.enabled:
        # Off (no cluster on this node): no API server to be up or down, so no up-series that could page.
        return
    up = Family("storwatch_kube_api_up", "1 when the Kubernetes API answered the agent's watches.")
    up.add((), 1 if kube.api_up else 0)
    yield up
    if kube.node is not None:
        cordoned = Family("storwatch_node_cordoned", "1 when this node is cordoned (unschedulable).")
        cordoned.add((), 1 if kube.node.cordoned else 0)
        draining = Family("storwatch_node_draining", "1 when this node is being drained or announced for removal.")
        draining.add((), 1 if kube.node.draining else 0)
        taints = Family(
            "storwatch_node_removal_taint", "A taint that announces this node's removal.", labels=("taint",)
        )
        for key in kube.node.removal_taints:
            taints.add((key,), 1)
        yield from (cordoned, draining, taints)
    left = Family(
        "storwatch_pod_deletion_seconds_left",
        "Seconds before a pod on this node that is being deleted is killed.",
        labels=("namespace", "pod"),
    )
    for pod, seconds in kube.terminating_pods(view.timestamp):
        left.add((pod.namespace, pod.name), max(0.0, seconds))
    yield left
