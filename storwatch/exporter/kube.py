"""The Kubernetes area: whether the API answers, whether this node is cordoned, draining or announced for removal,
and how long each pod being deleted here has left (storwatch_kube_api_up, storwatch_node_*,
storwatch_pod_deletion_seconds_left)."""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.analysis.view import View
from storwatch.exporter import catalog
from storwatch.exporter.area import ExportState
from storwatch.exporter.text import Family


def families(view: View | None, state: ExportState) -> Iterator[Family]:
    kube = view.kube if view is not None else None
    if view is None or kube is None or not kube.enabled:
        # Off (no cluster on this node): no API server to be up or down, so no up-series that could page.
        return
    up = catalog.KUBE_API_UP.family()
    up.add((), 1 if kube.api_up else 0)
    yield up
    if kube.node is not None:
        cordoned = catalog.NODE_CORDONED.family()
        cordoned.add((), 1 if kube.node.cordoned else 0)
        draining = catalog.NODE_DRAINING.family()
        draining.add((), 1 if kube.node.draining else 0)
        taints = catalog.NODE_REMOVAL_TAINT.family()
        for key in kube.node.removal_taints:
            taints.add((key,), 1)
        yield from (cordoned, draining, taints)
    left = catalog.POD_DELETION_SECONDS_LEFT.family()
    for pod, seconds in kube.terminating_pods(view.timestamp):
        left.add((pod.namespace, pod.name), max(0.0, seconds))
    yield left
