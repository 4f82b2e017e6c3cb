"""Kubernetes enrichment: kubelet path parsing, volume -> durability evidence, and the watch source driven through the
official client against the local API server (tests/kubeapi.py): drains, deletions, outages, 410 Gone. (The Events
action: tests/test_kube_events.py.)"""

from __future__ import annotations

import calendar
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from storwatch.classify import Classifier
from storwatch.kube.client import parse_time
from storwatch.sources.kube import KubeSource, pod_info
from storwatch.sources.kubevolumes import (
    ClusterObjects,
    KubeFacts,
    KubeletVolumePath,
    KubeVolumeEvidence,
    PodInfo,
    VolumeInfo,
    VolumeRef,
    parse_kubelet_volume_path,
    volume_evidence,
    volume_ref,
)
from storwatch.vocabulary import GENERIC, Durability, EvidenceSource
from tests.builders import fixture_mounts
from tests.kubeapi import (
    LOADER_UID,
    NODE,
    PV_EPHEMERAL,
    PV_LOCAL,
    PV_NFS,
    TRAINER_UID,
    FakeKubeAPI,
    fake_kube_api,
    k8s_node_objects,
)

POD_DIR = f"/var/lib/kubelet/pods/{TRAINER_UID}/volumes"
V, N, C = Durability.VOLATILE, Durability.NODE, Durability.CLUSTER
WAIT_SECONDS = 30.0
"""How long a test waits for something the source should see before it fails: a bound against hanging, generous
for a loaded machine; nothing here asks for a speed."""


def wait_for(what: Callable[[], bool], timeout: float = WAIT_SECONDS) -> None:
    """Wait until ``what()`` holds; fail after ``timeout`` (a bound against hanging, not a speed asked for)."""
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s")
        time.sleep(0.02)


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with fake_kube_api() as server:
        for obj in k8s_node_objects():
            server.add(obj)
        yield server


@pytest.fixture
def source(api: FakeKubeAPI, tmp_path: Path) -> Iterator[KubeSource]:
    src = KubeSource(environ={}, kubeconfig=str(api.kubeconfig(tmp_path)), node_name=NODE)
    src.start()
    wait_for(lambda: src.collect().api_up)
    yield src
    src.close()


# --- kubelet paths ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param(
            f"{POD_DIR}/kubernetes.io~empty-dir/scratch",
            KubeletVolumePath(TRAINER_UID, "kubernetes.io~empty-dir", "scratch"),
            id="empty-dir",
        ),
        pytest.param(
            f"{POD_DIR}/kubernetes.io~csi/{PV_NFS}/mount",
            KubeletVolumePath(TRAINER_UID, "kubernetes.io~csi", PV_NFS),
            id="csi",
        ),
        pytest.param(
            f"/host/root{POD_DIR}/kubernetes.io~local-volume/{PV_LOCAL}",
            KubeletVolumePath(TRAINER_UID, "kubernetes.io~local-volume", PV_LOCAL),
            id="under-rootfs",
        ),
        pytest.param(
            f"/var/snap/microk8s/common/var/lib/kubelet/pods/{TRAINER_UID}/volumes/kubernetes.io~nfs/data",
            KubeletVolumePath(TRAINER_UID, "kubernetes.io~nfs", "data"),
            id="moved-root-dir",
        ),
        pytest.param(
            f"/var/lib/kubelet/pods/{TRAINER_UID}/volume-subpaths/shared/trainer/0",
            KubeletVolumePath(TRAINER_UID, "", "shared", subpath=True),
            id="subpath",
        ),
        pytest.param(
            "/var/lib/kubelet/pods/0123456789abcdef0123456789abcdef/volumes/kubernetes.io~host-path/etc",
            KubeletVolumePath("0123456789abcdef0123456789abcdef", "kubernetes.io~host-path", "etc"),
            id="static-pod-hash",
        ),
        pytest.param(f"/var/lib/kubelet/pods/{TRAINER_UID}/etc-hosts", None, id="not-a-volume"),
        pytest.param(f"/var/lib/kubelet/pods/{TRAINER_UID}/volumes/kubernetes.io~csi", None, id="plugin-dir-only"),
        pytest.param("/var/lib/kubelet/pods/not-a-uid/volumes/kubernetes.io~empty-dir/x", None, id="bad-uid"),
        pytest.param("/mnt/local-nvme", None, id="host-mount"),
    ],
)
def test_parse_kubelet_volume_path(path: str, expected: KubeletVolumePath | None) -> None:
    assert parse_kubelet_volume_path(path) == expected


# --- the six volumes, through the real client and the classifier ------------------------------------------------


@pytest.mark.parametrize(
    ("mountpoint", "durability", "words"),
    [
        pytest.param(
            f"{POD_DIR}/kubernetes.io~empty-dir/scratch",
            N,
            ["emptyDir", "'scratch'", "train/trainer-0", "deleted with the pod", "lost with the node"],
            id="emptyDir",
        ),
        pytest.param(
            f"{POD_DIR}/kubernetes.io~empty-dir/dshm",
            V,
            ["emptyDir", "'dshm'", "train/trainer-0", "Memory"],
            id="emptyDir-memory",
        ),
        pytest.param(
            f"{POD_DIR}/kubernetes.io~csi/{PV_NFS}/mount",
            C,
            ["'shared'", "train/trainer-0", "PVC train/ckpt-shared", "nfs.csi.k8s.io", "survives"],
            id="pvc-nfs-csi",
        ),
        pytest.param(
            f"{POD_DIR}/kubernetes.io~local-volume/{PV_LOCAL}",
            N,
            ["'local'", "train/trainer-0", "PVC train/ckpt-local", PV_LOCAL, "lost with the node"],
            id="pvc-local-path",
        ),
        pytest.param(
            f"{POD_DIR}/kubernetes.io~csi/{PV_EPHEMERAL}/mount",
            N,
            ["generic ephemeral", "'cache'", "train/trainer-0", "PVC train/trainer-0-cache", "deleted with its pod"],
            id="generic-ephemeral",
        ),
    ],
)
def test_volume_classified(source: KubeSource, mountpoint: str, durability: Durability, words: list[str]) -> None:
    provider = KubeVolumeEvidence()
    provider.update(source.collect())
    classifier = Classifier(GENERIC)
    classifier.add_provider(provider)
    verdict = classifier.classify(fixture_mounts()[mountpoint])
    assert verdict.durability is durability, verdict
    assert verdict.evidence[0].source is EvidenceSource.KUBERNETES
    missing = [w for w in words if w.lower() not in verdict.reason.lower()]
    assert not missing, f"reason {verdict.reason!r} lacks {missing}"


@pytest.mark.parametrize(
    ("mountpoint", "durability", "source_of_evidence", "words"),
    [
        pytest.param("/mnt/local-nvme", N, EvidenceSource.DEVICE, ["xfs", "/dev/nvme1n1"], id="hostPath-local-disk"),
        pytest.param("/fsx", C, EvidenceSource.FILESYSTEM, ["lustre", "survives"], id="hostPath-lustre"),
        pytest.param("/shared", C, EvidenceSource.FILESYSTEM, ["nfs4", "10.0.0.5:/shared"], id="hostPath-nfs"),
        pytest.param("/", N, EvidenceSource.DEVICE, ["ext4", "/dev/nvme0n1p1"], id="agent-hostPath-root"),
    ],
)
def test_host_path_volume_leaves_the_class_to_its_filesystem(
    source: KubeSource, mountpoint: str, durability: Durability, source_of_evidence: EvidenceSource, words: list[str]
) -> None:
    # The trainer mounts /mnt/local-nvme, /fsx and /shared as hostPaths and the agent's own pod mounts / : where a pod
    # sees a host directory says nothing of how long it lives, so no pod is the reason and no pod decides.
    provider = KubeVolumeEvidence()
    provider.update(source.collect())
    classifier = Classifier(GENERIC)
    classifier.add_provider(provider)
    verdict = classifier.classify(fixture_mounts()[mountpoint])
    assert verdict.durability is durability, verdict
    assert [e.source for e in verdict.evidence] == [source_of_evidence], verdict.evidence
    missing = [w for w in words if w not in verdict.reason]
    assert not missing, f"reason {verdict.reason!r} lacks {missing}"
    for pod in ("trainer-0", "storwatch", "hostPath"):
        assert pod not in verdict.reason


def _ref(
    pod_uid: str | None,
    namespace: str | None,
    pod: str | None,
    volume: str | None,
    kind: str | None,
    pvc: str | None = None,
    pv: str | None = None,
    storage_class: str | None = None,
    provisioner: str | None = None,
) -> VolumeRef:
    return VolumeRef(pod_uid, namespace, pod, volume, kind, pvc, pv, storage_class, provisioner)


def _expected_refs() -> dict[str, VolumeRef | None]:
    t = (TRAINER_UID, "train", "trainer-0")
    return {
        "/": None,
        "/run": None,
        "/mnt/local-nvme": _ref(*t, "nvme", "hostPath"),
        "/fsx": _ref(*t, "fsx", "hostPath"),
        "/shared": _ref(*t, "datasets", "hostPath"),
        f"{POD_DIR}/kubernetes.io~empty-dir/scratch": _ref(*t, "scratch", "emptyDir"),
        f"{POD_DIR}/kubernetes.io~empty-dir/dshm": _ref(*t, "dshm", "emptyDirMemory"),
        f"{POD_DIR}/kubernetes.io~projected/kube-api-access-x2k9p": _ref(*t, "kube-api-access-x2k9p", "projected"),
        f"{POD_DIR}/kubernetes.io~csi/{PV_NFS}/mount": _ref(
            *t, "shared", "pvc", "ckpt-shared", PV_NFS, "nfs", "nfs.csi.k8s.io"
        ),
        f"{POD_DIR}/kubernetes.io~local-volume/{PV_LOCAL}": _ref(
            *t, "local", "pvc", "ckpt-local", PV_LOCAL, "local-path", "rancher.io/local-path"
        ),
        f"{POD_DIR}/kubernetes.io~csi/{PV_EPHEMERAL}/mount": _ref(
            *t, "cache", "ephemeral", "trainer-0-cache", PV_EPHEMERAL, "ebs-gp3", "ebs.csi.aws.com"
        ),
        f"/var/lib/kubelet/pods/{LOADER_UID}/volumes/kubernetes.io~projected/kube-api-access-7hq2m": _ref(
            LOADER_UID, "data", "loader-7d9f", "kube-api-access-7hq2m", "projected"
        ),
    }


def test_volume_ref_names_pod_volume_pvc_pv_storage_class(source: KubeSource) -> None:
    cluster = source.collect().cluster
    mounts = fixture_mounts()
    expected = _expected_refs()
    assert set(expected) <= set(mounts)
    got = {mp: volume_ref(mounts[mp], cluster) for mp in expected}
    assert got == expected


def test_volume_ref_from_the_kubelet_path_alone_while_the_api_is_away() -> None:
    mounts = fixture_mounts()
    empty = ClusterObjects()
    assert volume_ref(mounts[f"{POD_DIR}/kubernetes.io~empty-dir/dshm"], empty) == _ref(
        TRAINER_UID, None, None, "dshm", "emptyDirMemory"
    )
    assert volume_ref(mounts[f"{POD_DIR}/kubernetes.io~csi/{PV_NFS}/mount"], empty) == _ref(
        TRAINER_UID, None, None, None, None
    )
    assert volume_ref(mounts["/fsx"], empty) is None  # a hostPath is known only from a pod spec


def test_network_block_pvc_survives_node_loss() -> None:
    # The ephemeral volume's EBS disk would survive node loss as an ordinary PVC: only the ephemeral lifecycle
    # (deleted with its pod) makes it node-scoped.
    from storwatch.sources.kubevolumes import PVCInfo, PVInfo

    pod = PodInfo(TRAINER_UID, "trainer-0", "train", NODE, volumes=(VolumeInfo("cache", "pvc", claim_name="c"),))
    cluster = ClusterObjects.of(
        pods=[pod],
        pvcs=[PVCInfo("train", "c", PV_EPHEMERAL, None)],
        pvs=[PVInfo(PV_EPHEMERAL, False, "ebs.csi.aws.com", False, None)],
    )
    ev = volume_evidence(fixture_mounts()[f"{POD_DIR}/kubernetes.io~csi/{PV_EPHEMERAL}/mount"], cluster)
    assert ev is not None and ev.durability is C and "network block" in ev.reason


def test_unknown_pod_emptydir_and_foreign_mounts() -> None:
    mounts = fixture_mounts()
    empty = ClusterObjects()
    ev = volume_evidence(mounts[f"{POD_DIR}/kubernetes.io~empty-dir/scratch"], empty)
    assert ev is not None and ev.durability is N and TRAINER_UID in ev.reason
    assert volume_evidence(mounts["/"], empty) is None
    assert volume_evidence(mounts[f"{POD_DIR}/kubernetes.io~csi/{PV_NFS}/mount"], empty) is None


def test_pod_for_uid(source: KubeSource) -> None:
    facts = source.collect()
    trainer = facts.pod_for_uid(TRAINER_UID.upper())
    assert trainer is not None
    assert (trainer.namespace, trainer.name, trainer.owner_kind, trainer.owner_name) == (
        "train",
        "trainer-0",
        "StatefulSet",
        "trainer",
    )
    loader = facts.pod_for_uid(LOADER_UID)
    assert loader is not None and loader.owner_kind == "ReplicaSet"
    # Only this node's pods are watched.
    assert {p.name for p in facts.pods} == {"trainer-0", "loader-7d9f", "storwatch-x7k2p"}
    assert facts.pod_for_uid("00000000-0000-4000-8000-0000000000ff") is None


# --- lifecycle: drain, deletion ------------------------------------------------------------------------------------


def test_drain_comes_through_the_node_watch(api: FakeKubeAPI, source: KubeSource) -> None:
    assert not source.collect().draining
    lists = api.count_requests("/api/v1/nodes", watch=False)
    api.modify(
        "Node",
        NODE,
        spec={
            "unschedulable": True,
            "taints": [
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                {"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000", "effect": "NoSchedule"},
            ],
        },
    )
    wait_for(lambda: source.collect().draining)
    facts = source.collect()
    assert facts.cordoned and facts.node is not None
    assert facts.node.removal_taints == ("ToBeDeletedByClusterAutoscaler", "node.kubernetes.io/unschedulable")
    assert api.count_requests("/api/v1/nodes", watch=False) == lists  # a watch event, not a relist


def test_spot_taint_alone_is_draining(api: FakeKubeAPI, source: KubeSource) -> None:
    api.modify(
        "Node", NODE, spec={"taints": [{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]}
    )
    wait_for(lambda: source.collect().draining)
    assert not source.collect().cordoned


def test_pod_deletion_comes_through_the_pod_watch(api: FakeKubeAPI, tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    with_clock = KubeSource(environ={}, kubeconfig=str(api.kubeconfig(tmp_path)), node_name=NODE, clock=lambda: now[0])
    try:
        wait_for(lambda: with_clock.collect().api_up)
        assert with_clock.collect().terminating_pods() == ()
        api.modify(
            "Pod",
            "trainer-0",
            "train",
            metadata={"deletionTimestamp": "2027-01-15T08:00:30Z", "deletionGracePeriodSeconds": 30},
        )
        deleting_at = parse_time("2027-01-15T08:00:30Z")
        assert deleting_at is not None
        now[0] = deleting_at - 25
        wait_for(lambda: bool(with_clock.collect().terminating_pods()))
        ((pod, left),) = with_clock.collect().terminating_pods()
        assert pod.ref == "train/trainer-0" and pod.grace_seconds == 30 and left == pytest.approx(25)
        api.delete("Pod", "trainer-0", "train")
        wait_for(lambda: with_clock.collect().pod_for_uid(TRAINER_UID) is None)
    finally:
        with_clock.close()


# --- failures: outage, 410 Gone, no configuration ------------------------------------------------------------------


class BackoffWaits(threading.Event):
    """The source's stop event, recording the backoff each watch thread waits between failed attempts."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.by_thread: dict[int, list[float]] = {}

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            with self.lock:
                self.by_thread.setdefault(threading.get_ident(), []).append(timeout)
        return super().wait(timeout)

    def longest_run(self) -> int:
        with self.lock:
            return min((len(w) for w in self.by_thread.values()), default=0)


def test_api_outage_keeps_mapping_and_recovers(
    api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = KubeSource(
        environ={}, kubeconfig=str(api.kubeconfig(tmp_path)), node_name=NODE, backoff_initial=0.2, backoff_max=0.4
    )
    waits = source._stop = BackoffWaits()
    # Who calls the API: collect() answers from what the watches keep, so it never does, on the caller's thread.
    callers: set[int] = set()
    urlopen = urllib3.connectionpool.HTTPConnectionPool.urlopen

    def recorded_urlopen(self: Any, *args: Any, **kwargs: Any) -> Any:
        callers.add(threading.get_ident())
        return urlopen(self, *args, **kwargs)

    monkeypatch.setattr(urllib3.connectionpool.HTTPConnectionPool, "urlopen", recorded_urlopen)
    try:
        source.start()
        wait_for(lambda: source.collect().api_up)
        before = source.collect()
        assert before.api_up and len(before.pods) == 3
        assert before.failure is None and source.off_reason is None
        api.go_away(3600)
        wait_for(lambda: not source.collect().api_up)
        # every watch fails again and again, each waiting twice as long as before, up to the cap
        wait_for(lambda: len(waits.by_thread) == len(source._watchers) and waits.longest_run() >= 3)
        for _ in range(20):
            facts = source.collect()
            assert not facts.api_up
            assert facts.last_error
            # Its input could not be read: the collector fails (collector_success 0), the mapping is kept.
            assert facts.failure == f"the Kubernetes API is not answering: {facts.last_error}"
            assert facts.pod_for_uid(TRAINER_UID) is not None
            assert facts.cluster.pvs.keys() == before.cluster.pvs.keys()
        assert threading.get_ident() not in callers and callers  # the watches called, on their own threads
        with waits.lock:
            for backoffs in waits.by_thread.values():
                assert backoffs == [min(0.2 * 2**i, 0.4) for i in range(len(backoffs))]
        api.come_back()
        wait_for(lambda: source.collect().api_up)
        api.modify("Node", NODE, spec={"unschedulable": True})
        wait_for(lambda: source.collect().cordoned)
    finally:
        source.close()


def test_watch_410_gone_relists(api: FakeKubeAPI, source: KubeSource) -> None:
    lists_before = api.count_requests("/api/v1/pods", watch=False)
    api.gone_on_next_watch()  # the next watch of each kind
    api.drop_watches()
    # A pod added while the watches are answered 410 is found by the relist.
    api.add(
        {
            "kind": "Pod",
            "metadata": {"name": "late", "namespace": "train", "uid": "11111111-2222-4333-8444-555555555555"},
            "spec": {"nodeName": NODE, "volumes": []},
        }
    )
    wait_for(lambda: source.collect().pod_for_uid("11111111-2222-4333-8444-555555555555") is not None)
    assert api.count_requests("/api/v1/pods", watch=False) == lists_before + 1
    assert source.watch_stats()["pods"][0] == 2
    assert source.collect().api_up


def test_compacted_history_relists(api: FakeKubeAPI, source: KubeSource) -> None:
    api.drop_watches()
    api.compact()
    api.modify("Node", NODE, spec={"unschedulable": True})
    wait_for(lambda: source.collect().cordoned)


def test_no_kubeconfig_source_off_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="storwatch.sources.kube")
    src = KubeSource(environ={"HOME": str(tmp_path)})
    facts = [src.collect() for _ in range(3)]
    src.close()
    assert all(
        f == KubeFacts(enabled=False, api_up=False, last_error=f.last_error, timestamp=f.timestamp) for f in facts
    )
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "source off" in lines[0] and "kubeconfig" in lines[0]
    # Off, not failing: no API server to be down on a node without a cluster.
    assert src.off_reason is not None and "kubeconfig" in src.off_reason
    assert all(f.failure is None for f in facts)


def test_pod_info_parses_api_pod() -> None:
    pod = pod_info(
        {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "uid": "ABCDEF01-0000-4000-8000-000000000000",
                "deletionTimestamp": "2027-01-15T08:00:30.250Z",
                "deletionGracePeriodSeconds": 30,
            },
            "spec": {
                "nodeName": NODE,
                "terminationGracePeriodSeconds": 120,
                "volumes": [{"name": "x", "csi": {"driver": "efs.csi.aws.com"}}],
            },
        }
    )
    assert pod.uid == "abcdef01-0000-4000-8000-000000000000"
    assert (pod.grace_seconds, pod.termination_grace_seconds) == (30.0, 120.0)
    assert pod.deletion_timestamp == pytest.approx(calendar.timegm((2027, 1, 15, 8, 0, 30, 0, 0, 0)) + 0.25)
    assert pod.volumes == (VolumeInfo("x", "other", csi_driver="efs.csi.aws.com"),)


@pytest.mark.parametrize(
    "value, seconds",
    [(45, 45.0), (0, 0.0), (-1, None), (True, None), ("30", None), (float("nan"), None), (None, None)],
    ids=["whole", "zero", "negative", "bool", "text", "nan", "absent"],
)
def test_a_grace_period_is_a_number_of_seconds_or_unknown(value: object, seconds: float | None) -> None:
    pod = pod_info({"metadata": {"name": "p", "uid": "u"}, "spec": {"terminationGracePeriodSeconds": value}})
    assert pod.termination_grace_seconds == seconds


def test_the_watches_and_events_never_build_the_clients_generated_apis(api: FakeKubeAPI, tmp_path: Path) -> None:
    # The client's CoreV1Api and StorageV1Api import a model module for every kind the API has (about 20 MB in the
    # agent); the agent sends its requests through the client's ApiClient. In a process of its own, as the agent.
    script = f"""
import sys, time
from storwatch.kube.events import KubeEvents
from storwatch.sources.kube import KubeSource
src = KubeSource(environ={{}}, kubeconfig={str(api.kubeconfig(tmp_path))!r}, node_name={NODE!r})
src.start()
deadline = time.monotonic() + {WAIT_SECONDS}
while not (src.collect().api_up and src.collect().pods) and time.monotonic() < deadline:
    time.sleep(0.05)
print(" ".join(sorted(p.name for p in src.collect().pods)))
events = KubeEvents(src.client)
print(events.post("CheckpointOnEphemeral", "on node storage"))
print(events.post("CheckpointOnEphemeral", "again"))
print(sorted(m for m in sys.modules if m.startswith(("kubernetes.client.api.", "kubernetes.client.models."))))
src.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    pods, created, patched, generated = done.stdout.splitlines()
    assert pods.split() == ["loader-7d9f", "storwatch-x7k2p", "trainer-0"]
    assert (created, patched) == ("created", "patched")
    assert generated == "[]"
    assert [r.verb for r in api.recorded] == ["create", "patch"]
