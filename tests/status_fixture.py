"""A fixture Kubernetes node for the status page's tests: a View built from tests/fixtures/k8s-node and the objects of
tests/kubeapi.py (:func:`fixture_view`), and the page's tables read back (:func:`table`, :func:`column`)."""

from __future__ import annotations

import dataclasses

from storwatch.analysis.build import build_view
from storwatch.analysis.view import View
from storwatch.classify import Classifier
from storwatch.paths import HostPaths
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import CheckpointFacts
from storwatch.sources.gpu import GPUFacts
from storwatch.sources.kube import pod_info, pv_info, pvc_info, storage_class_info
from storwatch.sources.kubevolumes import ClusterObjects, KubeFacts, KubeVolumeEvidence
from storwatch.sources.mounts import PSEUDO_FSTYPES
from storwatch.vocabulary import FsUsage, Platform
from tests.browser import TableParser
from tests.builders import fixture_mounts
from tests.kubeapi import PV_NFS, TRAINER_UID, k8s_node_objects

T = 1_800_000_000.0
NFS_PVC = f"/var/lib/kubelet/pods/{TRAINER_UID}/volumes/kubernetes.io~csi/{PV_NFS}/mount"


def kube_facts() -> KubeFacts:
    objects = k8s_node_objects()
    of = {kind: [o for o in objects if o["kind"] == kind] for kind in {o["kind"] for o in objects}}
    cluster = ClusterObjects.of(
        pods=[pod_info(o) for o in of["Pod"] if o["spec"].get("nodeName") == "gpu-node-1"],
        pvcs=[pvc_info(o) for o in of["PersistentVolumeClaim"]],
        pvs=[pv_info(o) for o in of["PersistentVolume"]],
        storage_classes=[storage_class_info(o) for o in of["StorageClass"]],
    )
    return KubeFacts(enabled=True, api_up=True, cluster=cluster, timestamp=T)


def fixture_view(
    gpus: GPUFacts | None = None, checkpoints: CheckpointFacts | None = None, paths: HostPaths | None = None
) -> View:
    # As the mount source keeps them: proc and sysfs themselves are dropped by type, /sys/fs/cgroup (tmpfs) is not.
    mounts = {mp: m for mp, m in fixture_mounts().items() if m.fstype not in PSEUDO_FSTYPES}
    # / as df would show it: 4 KiB blocks, 1000 of them, 100 free of which 40 are available to users.
    mounts["/"] = dataclasses.replace(mounts["/"], usage=FsUsage(4096 * 1000, 4096 * 100, 4096 * 40, 10, 5))
    facts = kube_facts()
    evidence = KubeVolumeEvidence(facts)
    classifier = Classifier("together-k8s")
    classifier.add_provider(evidence)
    snap = Snapshot(T, tuple(mounts.values()), gpus=gpus, checkpoints=checkpoints, kube=facts)
    return build_view(snap, classifier, Platform("together-k8s", "test"), paths=paths)


def table(page: str, table_id: str) -> tuple[list[str], list[list[str]]]:
    parser = TableParser(table_id)
    parser.feed(page)
    parser.close()
    assert parser.found, table_id
    (header,) = parser.head_rows
    return header, parser.body_rows


def column(header: list[str], rows: list[list[str]], name: str) -> dict[str, str]:
    i = header.index(name)
    return {row[0]: row[i] for row in rows}
