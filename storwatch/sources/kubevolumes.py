"""Kubernetes volumes behind mounts: kubelet mount paths -> pod, volume, PVC, PV, StorageClass -> durability evidence.

Pure: no Kubernetes client here. ``sources/kube.py`` fills the snapshot types below from the API; everything else
(the classifier, GPU attribution, exporter, policy) reads them without importing ``kubernetes``.

Why one file: the snapshot types and the rules that read durability from them (volume kinds, CSI
drivers and provisioners, PV sources) are one table of Kubernetes storage facts; splitting the types from the rules
would leave each half unreadable alone.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from storwatch.sources import FactsKey
from storwatch.vocabulary import Durability, Evidence, EvidenceSource, Mount

# Volume kinds, as the pod spec names the volume source (emptyDir with medium Memory is its own kind: it is tmpfs).
EMPTY_DIR = "emptyDir"
EMPTY_DIR_MEMORY = "emptyDirMemory"
HOST_PATH = "hostPath"
PVC = "pvc"
EPHEMERAL = "ephemeral"
CONFIG_MAP = "configMap"
SECRET = "secret"
PROJECTED = "projected"
DOWNWARD_API = "downwardAPI"
OTHER = "other"
API_PROJECTED_KINDS = frozenset({CONFIG_MAP, SECRET, PROJECTED, DOWNWARD_API})

# Provisioners and CSI drivers whose volumes are a directory or disk of one node (a PV with node affinity): the data
# is lost with the node even though the pod asked for a PVC.
NODE_LOCAL_DRIVERS = frozenset(
    {
        "rancher.io/local-path",
        "openebs.io/local",
        "kubernetes.io/no-provisioner",
        "microk8s.io/hostpath",
        "k8s.io/minikube-hostpath",
        "hostpath.csi.k8s.io",
        "local.csi.openebs.io",
        "lvm.csi.openebs.io",
        "zfs.csi.openebs.io",
        "rawfile.csi.openebs.io",
        "topolvm.io",
        "topolvm.cybozu.com",
        "lvm.csi.metal-stack.io",
        "local.csi.aliyun.com",
        "hostpath.csi.kubevirt.io",
        "kubevirt.io.hostpath-provisioner",
    }
)
# Shared file systems served from other machines: readable from any node, survive losing this one.
NETWORK_FILE_DRIVERS = frozenset(
    {
        "nfs.csi.k8s.io",
        "smb.csi.k8s.io",
        "efs.csi.aws.com",
        "fsx.csi.aws.com",
        "filestore.csi.storage.gke.io",
        "file.csi.azure.com",
        "cephfs.csi.ceph.com",
        "rook-ceph.cephfs.csi.ceph.com",
        "lustre.csi.azure.com",
        "csi.weka.io",
        "juicefs.csi.juicefs.com",
        "spectrumscale.csi.ibm.com",
        "beegfs.csi.netapp.com",
        "csi.trident.netapp.io",
        "nfs.csi.vastdata.com",
        "csi.vastdata.com",
        "kubernetes.io/nfs",
        "cluster.local/nfs-subdir-external-provisioner",
        "k8s-sigs.io/nfs-subdir-external-provisioner",
    }
)
# Network block devices: attached to one node at a time, but the disk lives in the cloud or storage cluster and is
# re-attached wherever the pod is rescheduled, so node loss does not lose it (EBS, PD, Azure Disk, Ceph RBD...).
NETWORK_BLOCK_DRIVERS = frozenset(
    {
        "ebs.csi.aws.com",
        "pd.csi.storage.gke.io",
        "disk.csi.azure.com",
        "rbd.csi.ceph.com",
        "rook-ceph.rbd.csi.ceph.com",
        "cinder.csi.openstack.org",
        "csi.vsphere.vmware.com",
        "driver.longhorn.io",
        "pxd.portworx.com",
        "kubernetes.io/aws-ebs",
        "kubernetes.io/gce-pd",
        "kubernetes.io/azure-disk",
        "kubernetes.io/rbd",
        "kubernetes.io/cinder",
    }
)
# Object storage through a CSI FUSE driver: the bucket outlives the cluster.
OBJECT_STORE_DRIVERS = frozenset(
    {"gcsfuse.csi.storage.gke.io", "s3.csi.aws.com", "blob.csi.azure.com", "ru.yandex.s3.csi", "csi.s3.yandex.ru"}
)

# <kubelet root>/pods/<uid>/volumes/<plugin>/<dir>[/mount]: the kubelet root is /var/lib/kubelet by default and moved
# by --root-dir (microk8s, some distros), so only the part from "pods/" on is fixed. A UID is a UUID; a static pod's
# is the 32-hex-digit config hash. CSI publishes into a "mount" directory below the PV's directory.
PARSED_PATHS_KEPT = 2048
"""Paths whose answer parse_kubelet_volume_path keeps (a few hundred KB at a path's usual length)."""
_KUBELET_VOLUME = re.compile(
    r"(?:^|/)pods/(?P<uid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})"
    r"/(?P<area>volumes|volume-subpaths)/(?P<plugin>[^/]+)/(?P<dir>[^/]+)(?P<rest>/.*)?$"
)


@dataclass(frozen=True)
class KubeletVolumePath:
    """What a kubelet volume path names."""

    pod_uid: str
    """``metadata.uid`` of the pod (or a static pod's config hash)."""
    plugin: str
    """Volume plugin directory, ``kubernetes.io~empty-dir``, ``kubernetes.io~csi``...; for a subPath mount (under
    ``volume-subpaths/``) the volume's name, which is the only thing that path records."""
    volume_dir_name: str
    """The volume's name in the pod spec, or for PV-backed volumes (CSI, in-tree network plugins) the PV's name."""
    subpath: bool = False
    """Under ``volume-subpaths/<volume>/<container>/<index>``: a subPath bind mount of the volume."""


@functools.lru_cache(maxsize=PARSED_PATHS_KEPT)
def parse_kubelet_volume_path(path: str) -> KubeletVolumePath | None:
    """The pod and volume a kubelet volume path belongs to, or ``None`` when the path is not one. Kept for the last
    PARSED_PATHS_KEPT paths: every View asks it of each run, mount and finding again."""
    m = _KUBELET_VOLUME.search(path)
    if m is None:
        return None
    uid, area, plugin, name = m.group("uid"), m.group("area"), m.group("plugin"), m.group("dir")
    if area == "volume-subpaths":
        return KubeletVolumePath(uid, "", plugin, subpath=True)
    return KubeletVolumePath(uid, plugin, name)


@dataclass(frozen=True)
class VolumeDirectory:
    """A path inside a pod's volume, found below the kubelet's own pods directory."""

    volume: KubeletVolumePath
    directory: str
    """The volume's own directory (a CSI volume's ``mount``), as the caller reached the path: what the pod sees as
    its mount."""
    below: tuple[str, ...]
    """The path's components below that directory."""


_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")


def volume_directory(kubelet_pods: str, path: str) -> VolumeDirectory | None:
    """The pod volume ``path`` lies in, when it lies below ``kubelet_pods`` (the kubelet's pods directory as the
    caller reaches it: ``/var/lib/kubelet/pods`` below ``--path.rootfs``) as ``<uid>/volumes/<plugin>/<name>``; None
    otherwise. Anchored there, never found by searching a path: a tenant's directory named like a kubelet path
    anywhere else names no pod."""
    root, full = os.path.normpath(kubelet_pods), os.path.normpath(path)
    if not full.startswith(root.rstrip("/") + "/"):
        return None
    parts = full[len(root.rstrip("/")) + 1 :].split("/")
    if len(parts) < 4 or _POD_UID.fullmatch(parts[0]) is None or parts[1] != "volumes":
        return None
    uid, plugin, name, rest = parts[0], parts[2], parts[3], parts[4:]
    directory = os.path.join(root, uid, "volumes", plugin, name)
    if plugin == "kubernetes.io~csi":
        if not rest or rest[0] != "mount":
            return None  # the CSI volume's own files (vol_data.json), not its data
        directory, rest = os.path.join(directory, "mount"), rest[1:]
    return VolumeDirectory(KubeletVolumePath(uid, plugin, name), directory, tuple(rest))


@dataclass(frozen=True)
class VolumeInfo:
    """One ``spec.volumes[]`` entry of a pod."""

    name: str
    kind: str
    """emptyDir, emptyDirMemory, hostPath, pvc, ephemeral, configMap, secret, projected, downwardAPI or other."""
    claim_name: str | None = None
    """The PVC it uses: ``persistentVolumeClaim.claimName``, or for a generic ephemeral volume the PVC the
    ephemeral-volume controller creates, ``<pod name>-<volume name>``."""
    path: str | None = None
    """A hostPath volume's path on the node."""
    csi_driver: str | None = None
    """An inline CSI volume's driver."""


@dataclass(frozen=True)
class PodInfo:
    uid: str
    name: str
    namespace: str
    node_name: str
    owner_kind: str | None = None
    """``metadata.ownerReferences[controller=true].kind`` (ReplicaSet, StatefulSet, Job, ...)."""
    owner_name: str | None = None
    deletion_timestamp: float | None = None
    """``metadata.deletionTimestamp`` as a UNIX time: set when deletion (eviction, drain) began."""
    grace_seconds: float | None = None
    """``metadata.deletionGracePeriodSeconds``: SIGTERM to SIGKILL, set once deletion began."""
    termination_grace_seconds: float | None = None
    """``spec.terminationGracePeriodSeconds``: the grace its deletion will give (the API's default, 30, when the
    spec omits it and the server filled it in; None where the object holds none)."""
    volumes: tuple[VolumeInfo, ...] = ()
    phase: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def volume(self, name: str) -> VolumeInfo | None:
        for v in self.volumes:
            if v.name == name:
                return v
        return None

    def seconds_left(self, now: float) -> float | None:
        """Seconds until the kubelet kills the pod (deletionTimestamp + grace - now); None when not being deleted."""
        if self.deletion_timestamp is None:
            return None
        # The API server sets deletionTimestamp to the time of the request plus the grace period already.
        return max(0.0, self.deletion_timestamp - now)


@dataclass(frozen=True)
class PVCInfo:
    namespace: str
    name: str
    volume_name: str | None
    """``spec.volumeName``: the bound PV, None while pending."""
    storage_class: str | None


@dataclass(frozen=True)
class PVInfo:
    name: str
    local_or_hostpath: bool
    """``spec.local`` or ``spec.hostPath``: a directory or disk of one node."""
    csi_driver: str | None
    nfs: bool
    """``spec.nfs``: an in-tree NFS volume."""
    storage_class: str | None
    claim: tuple[str, str] | None = None
    """``spec.claimRef`` (namespace, name)."""


@dataclass(frozen=True)
class StorageClassInfo:
    name: str
    provisioner: str


@dataclass(frozen=True)
class NodeInfo:
    """This node's lifecycle as the API shows it."""

    name: str
    cordoned: bool
    """``spec.unschedulable``: kubectl cordon / drain."""
    taints: tuple[tuple[str, str], ...] = ()
    """Every ``spec.taints[]`` as (key, effect)."""
    removal_taints: tuple[str, ...] = ()
    """Taint keys that announce the node is going away (autoscaler scale-down, spot reclaim, maintenance)."""

    @property
    def draining(self) -> bool:
        """Pods are being, or are about to be, evicted: cordoned with a removal taint, or a removal taint other than
        the one cordoning itself adds (autoscaler scale-down, spot reclaim, out-of-service)."""
        if not self.removal_taints:
            return False
        return self.cordoned or any(k != "node.kubernetes.io/unschedulable" for k in self.removal_taints)


# Taints that say the node is about to go. Prefix matches for the cloud handlers, which encode the event in the key.
REMOVAL_TAINTS = frozenset(
    {
        "ToBeDeletedByClusterAutoscaler",
        "DeletionCandidateOfClusterAutoscaler",
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/out-of-service",
        "node.cloudprovider.kubernetes.io/shutdown",
        "karpenter.sh/disrupted",
        "karpenter.sh/disruption",
        "cloud.google.com/impending-node-termination",
        "aws-node-termination-handler/spot-itn",
        "aws-node-termination-handler/rebalance-recommendation",
        "aws-node-termination-handler/scheduled-maintenance",
        "aws-node-termination-handler/asg-lifecycle-termination",
        "kubernetes.azure.com/scalesetpriority-evicted",
    }
)
REMOVAL_TAINT_PREFIXES = ("aws-node-termination-handler/", "azure-scheduled-event", "scheduledevents.azure.com/")


def is_removal_taint(key: str) -> bool:
    return key in REMOVAL_TAINTS or key.startswith(REMOVAL_TAINT_PREFIXES)


@dataclass(frozen=True)
class ClusterObjects:
    """A consistent copy of the cluster objects the mapping needs, indexed for lookups."""

    pods: Mapping[str, PodInfo] = field(default_factory=dict)
    """By UID."""
    pvcs: Mapping[tuple[str, str], PVCInfo] = field(default_factory=dict)
    """By (namespace, name)."""
    pvs: Mapping[str, PVInfo] = field(default_factory=dict)
    storage_classes: Mapping[str, StorageClassInfo] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        pods: Iterable[PodInfo] = (),
        pvcs: Iterable[PVCInfo] = (),
        pvs: Iterable[PVInfo] = (),
        storage_classes: Iterable[StorageClassInfo] = (),
    ) -> ClusterObjects:
        return cls(
            {p.uid: p for p in pods},
            {(c.namespace, c.name): c for c in pvcs},
            {v.name: v for v in pvs},
            {s.name: s for s in storage_classes},
        )

    def pod_for_uid(self, uid: str) -> PodInfo | None:
        """The pod with this UID (GPU process attribution: cgroup pod UID -> name, namespace, owner)."""
        return self.pods.get(uid.lower())

    @functools.cached_property
    def host_paths(self) -> Mapping[str, tuple[PodInfo, VolumeInfo]]:
        """hostPath volumes by their path on the node (no trailing slash), the first pod by namespace and name where
        several use one path. ``/`` is left out: a pod that mounts the whole host (this agent, a node debugger)
        looks at the node's mounts, it does not store data in them."""
        found: dict[str, tuple[PodInfo, VolumeInfo]] = {}
        for pod in sorted(self.pods.values(), key=lambda p: (p.namespace, p.name)):
            for vol in pod.volumes:
                path = (vol.path or "").rstrip("/")
                if vol.kind == HOST_PATH and path:
                    found.setdefault(path, (pod, vol))
        return found


@dataclass(frozen=True)
class KubeFacts:
    """What the Kubernetes source knows: the latest snapshot, kept (with ``api_up`` False) while the API is away."""

    enabled: bool
    api_up: bool
    last_error: str | None = None
    cluster: ClusterObjects = field(default_factory=ClusterObjects)
    node: NodeInfo | None = None
    timestamp: float = 0.0
    """When the source built this snapshot."""
    last_sync_timestamp: float | None = None
    """When every watch was last in sync with the API server."""

    @property
    def failure(self) -> str | None:
        """Why this collection is a failure of the source (``storwatch_collector_success`` 0): a source that watches
        an API server which does not answer (its last known objects are kept). None when off or in sync."""
        if not self.enabled or self.api_up:
            return None
        return f"the Kubernetes API is not answering: {self.last_error or 'watches not in sync yet'}"

    @property
    def pods(self) -> tuple[PodInfo, ...]:
        return tuple(self.cluster.pods.values())

    @property
    def pvcs(self) -> tuple[PVCInfo, ...]:
        return tuple(self.cluster.pvcs.values())

    @property
    def pvs(self) -> tuple[PVInfo, ...]:
        return tuple(self.cluster.pvs.values())

    @property
    def storage_classes(self) -> tuple[StorageClassInfo, ...]:
        return tuple(self.cluster.storage_classes.values())

    @property
    def cordoned(self) -> bool:
        return self.node is not None and self.node.cordoned

    @property
    def draining(self) -> bool:
        return self.node is not None and self.node.draining

    def terminating_pods(self, now: float | None = None) -> tuple[tuple[PodInfo, float], ...]:
        """Pods being deleted, with the seconds left before they are killed."""
        at = self.timestamp if now is None else now
        out = []
        for pod in self.cluster.pods.values():
            left = pod.seconds_left(at)
            if left is not None:
                out.append((pod, left))
        return tuple(sorted(out, key=lambda pl: pl[1]))

    def pod_for_uid(self, uid: str) -> PodInfo | None:
        return self.cluster.pod_for_uid(uid)


KUBE: FactsKey[KubeFacts] = FactsKey("kube")
"""The Kubernetes source's facts in a Snapshot."""


def _driver_durability(driver: str) -> tuple[Durability, str] | None:
    if driver in NODE_LOCAL_DRIVERS:
        return Durability.NODE, f"{driver} provisions a directory or disk on one node: lost with the node"
    if driver in NETWORK_FILE_DRIVERS:
        return Durability.CLUSTER, f"{driver} is a shared network filesystem: survives losing this node"
    if driver in NETWORK_BLOCK_DRIVERS:
        return (
            Durability.CLUSTER,
            f"{driver} is a network block volume: re-attached to another node when this one is lost",
        )
    if driver in OBJECT_STORE_DRIVERS:
        return Durability.REGION, f"{driver} mounts object storage: survives losing the node and the cluster"
    return None


def _pv_durability(pv: PVInfo, cluster: ClusterObjects) -> tuple[Durability, str] | None:
    if pv.local_or_hostpath:
        return Durability.NODE, f"PV {pv.name} is a local/hostPath volume on this node: lost with the node"
    if pv.nfs:
        return Durability.CLUSTER, f"PV {pv.name} is NFS: survives losing this node"
    if pv.csi_driver:
        found = _driver_durability(pv.csi_driver)
        if found is not None:
            return found[0], f"PV {pv.name}: {found[1]}"
    sc = cluster.storage_classes.get(pv.storage_class or "")
    if sc is not None:
        found = _driver_durability(sc.provisioner)
        if found is not None:
            return found[0], f"PV {pv.name} of StorageClass {sc.name}: {found[1]}"
    return None


def _claim_evidence(
    pod: PodInfo | None, vol: VolumeInfo | None, pvc: PVCInfo | None, pv: PVInfo | None, cluster: ClusterObjects
) -> Evidence | None:
    if pv is None and pvc is not None and pvc.volume_name:
        pv = cluster.pvs.get(pvc.volume_name)
    if pv is None:
        return None
    what = f"PVC {pvc.namespace}/{pvc.name}" if pvc is not None else f"PV {pv.name}"
    if vol is not None and pod is not None:
        what = f"volume '{vol.name}' of pod {pod.ref} ({what})"
    if vol is not None and vol.kind == EPHEMERAL:
        return Evidence(
            EvidenceSource.KUBERNETES,
            Durability.NODE,
            f"generic ephemeral {what}: the PVC is deleted with its pod, so a drain or node loss deletes the data",
        )
    found = _pv_durability(pv, cluster)
    if found is None:
        if pvc is not None and pvc.storage_class:
            sc = cluster.storage_classes.get(pvc.storage_class)
            prov = _driver_durability(sc.provisioner) if sc is not None else None
            if prov is not None:
                return Evidence(
                    EvidenceSource.KUBERNETES, prov[0], f"{what}: StorageClass {pvc.storage_class}: {prov[1]}"
                )
        return None
    durability, why = found
    return Evidence(EvidenceSource.KUBERNETES, durability, f"{what}: {why}")


def _volume_evidence(pod: PodInfo, vol: VolumeInfo, mount: Mount, cluster: ClusterObjects) -> Evidence | None:
    where = f"'{vol.name}' of pod {pod.ref}"
    if vol.kind == EMPTY_DIR_MEMORY or (vol.kind == EMPTY_DIR and mount.fstype in ("tmpfs", "ramfs")):
        return Evidence(
            EvidenceSource.KUBERNETES,
            Durability.VOLATILE,
            f"emptyDir {where} has medium Memory (tmpfs): lost when the pod restarts or is deleted",
        )
    if vol.kind == EMPTY_DIR:
        return Evidence(
            EvidenceSource.KUBERNETES, Durability.NODE, f"emptyDir {where}: deleted with the pod, lost with the node"
        )
    if vol.kind == HOST_PATH:
        # A hostPath says where the pod sees a directory of the host, not how long it lives: a hostPath onto a
        # Lustre /fsx or an NFS /shared survives the node like the filesystem under it, so that filesystem decides.
        return None
    if vol.kind in API_PROJECTED_KINDS:
        return Evidence(
            EvidenceSource.KUBERNETES,
            Durability.VOLATILE,
            f"{vol.kind} {where}: written by the kubelet from the API into memory, nothing to keep",
        )
    if vol.kind in (PVC, EPHEMERAL) and vol.claim_name:
        pvc = cluster.pvcs.get((pod.namespace, vol.claim_name))
        return _claim_evidence(pod, vol, pvc, None, cluster)
    if vol.csi_driver:
        found = _driver_durability(vol.csi_driver)
        if found is not None:
            return Evidence(EvidenceSource.KUBERNETES, found[0], f"inline CSI volume {where}: {found[1]}")
    return None


def _pvc_for_pv(pv_name: str, cluster: ClusterObjects) -> PVCInfo | None:
    for pvc in cluster.pvcs.values():
        if pvc.volume_name == pv_name:
            return pvc
    return None


def kubelet_path_of(mount: Mount) -> KubeletVolumePath | None:
    """The kubelet volume a mount is: by its mount point (the host's view), else by its root (a container's view,
    where a volume's bind mount names the kubelet directory it came from as its root)."""
    return parse_kubelet_volume_path(mount.mountpoint) or parse_kubelet_volume_path(mount.root)


def volume_evidence(mount: Mount, cluster: ClusterObjects) -> Evidence | None:
    """Durability evidence from the Kubernetes volume behind ``mount``, or None when it is not a known volume."""
    kp = kubelet_path_of(mount)
    if kp is None:
        return None  # a host mount, perhaps some pod's hostPath: its filesystem decides (see _volume_evidence)
    pod = cluster.pod_for_uid(kp.pod_uid)
    if pod is not None:
        vol = pod.volume(kp.volume_dir_name)
        if vol is not None:
            return _volume_evidence(pod, vol, mount, cluster)
        # PV-backed plugins name the directory after the PV: find the pod's claim bound to it.
        pv = cluster.pvs.get(kp.volume_dir_name)
        if pv is not None:
            for v in pod.volumes:
                if v.claim_name is None:
                    continue
                pvc = cluster.pvcs.get((pod.namespace, v.claim_name))
                if pvc is not None and pvc.volume_name == pv.name:
                    return _claim_evidence(pod, v, pvc, pv, cluster)
    pv = cluster.pvs.get(kp.volume_dir_name)
    if pv is not None:
        return _claim_evidence(None, None, _pvc_for_pv(pv.name, cluster), pv, cluster)
    # Unknown pod (deleted, or not yet listed): the plugin directory alone still says what an emptyDir is.
    if kp.plugin == "kubernetes.io~empty-dir":
        memory = mount.fstype in ("tmpfs", "ramfs")
        return Evidence(
            EvidenceSource.KUBERNETES,
            Durability.VOLATILE if memory else Durability.NODE,
            f"emptyDir '{kp.volume_dir_name}' of pod UID {kp.pod_uid} (not known to the API): "
            + ("in memory, lost when the pod restarts" if memory else "deleted with the pod, lost with the node"),
        )
    return None


@dataclass(frozen=True)
class VolumeRef:
    """The Kubernetes objects behind a mount, as far as the mount path and the API show them (None where unknown)."""

    pod_uid: str | None
    """From the kubelet path; for a hostPath, the pod's."""
    namespace: str | None
    pod: str | None
    volume: str | None
    """The volume's name in the pod spec (for a PV-backed mount the API is needed to learn it)."""
    volume_kind: str | None
    """emptyDir, emptyDirMemory, hostPath, pvc, ephemeral, ... as in ``VolumeInfo.kind``."""
    pvc: str | None
    """The claim's name (in the pod's namespace)."""
    pv: str | None
    storage_class: str | None
    """The claim's StorageClass, else the PV's."""
    provisioner: str | None
    """The StorageClass's provisioner; without a known StorageClass, the CSI driver of the PV or inline volume."""


def volume_ref(mount: Mount, cluster: ClusterObjects) -> VolumeRef | None:
    """The pod, volume, PVC, PV and StorageClass behind ``mount``; None when it is neither a kubelet volume nor a
    pod's hostPath. A kubelet path alone gives the pod UID (and an emptyDir's name) while the API is away."""
    kp = kubelet_path_of(mount)
    if kp is None:
        hit = cluster.host_paths.get(mount.mountpoint.rstrip("/"))
        if hit is None:
            return None
        user, host_vol = hit
        return VolumeRef(user.uid, user.namespace, user.name, host_vol.name, HOST_PATH, None, None, None, None)
    pod = cluster.pod_for_uid(kp.pod_uid)
    vol = pod.volume(kp.volume_dir_name) if pod is not None else None
    pvc: PVCInfo | None = None
    pv = cluster.pvs.get(kp.volume_dir_name) if vol is None else None
    if pod is not None and vol is None and pv is not None:
        # PV-backed plugins name the directory after the PV: the pod's claim bound to it is the volume.
        for v in pod.volumes:
            claim = cluster.pvcs.get((pod.namespace, v.claim_name)) if v.claim_name else None
            if claim is not None and claim.volume_name == pv.name:
                vol, pvc = v, claim
                break
    if pvc is None and vol is not None and vol.claim_name and pod is not None:
        pvc = cluster.pvcs.get((pod.namespace, vol.claim_name))
    if pvc is None and pv is not None:
        pvc = _pvc_for_pv(pv.name, cluster)
    if pv is None and pvc is not None and pvc.volume_name:
        pv = cluster.pvs.get(pvc.volume_name)
    storage_class = (pvc.storage_class if pvc is not None else None) or (pv.storage_class if pv is not None else None)
    sc = cluster.storage_classes.get(storage_class) if storage_class else None
    provisioner: str | None
    if sc is not None:
        provisioner = sc.provisioner
    else:
        provisioner = (pv.csi_driver if pv is not None else None) or (vol.csi_driver if vol is not None else None)
    volume: str | None
    kind: str | None
    if vol is not None:
        volume, kind = vol.name, vol.kind
    elif kp.plugin == "kubernetes.io~empty-dir":
        volume, kind = kp.volume_dir_name, EMPTY_DIR_MEMORY if mount.fstype in ("tmpfs", "ramfs") else EMPTY_DIR
    else:
        volume, kind = (kp.volume_dir_name, None) if kp.subpath else (None, None)
    return VolumeRef(
        kp.pod_uid,
        pod.namespace if pod is not None else (pvc.namespace if pvc is not None else None),
        pod.name if pod is not None else None,
        volume,
        kind,
        pvc.name if pvc is not None else None,
        pv.name if pv is not None else None,
        storage_class,
        provisioner or None,
    )


class KubeVolumeEvidence:
    """An evidence provider for ``Classifier.add_provider`` that reads the latest ``KubeFacts`` it was given."""

    def __init__(self, facts: KubeFacts | None = None) -> None:
        self._cluster = facts.cluster if facts is not None else ClusterObjects()

    def update(self, facts: KubeFacts) -> None:
        self._cluster = facts.cluster

    def __call__(self, mount: Mount) -> Evidence | None:
        return volume_evidence(mount, self._cluster)
