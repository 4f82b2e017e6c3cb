"""Join GPU processes to their pods: the container and pod UID their cgroup names (the processes source) with the
pod's namespace, name and owner (the Kubernetes source), once for every consumer of the View."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from storwatch.procfs.cgroup import ContainerRef, Runtime, SlurmJob
from storwatch.sources.kubevolumes import KubeFacts


@dataclass(frozen=True)
class ProcessPod:
    """Where a GPU process runs: its container, and the pod around it as far as the cgroup and the API know it."""

    container_id: str
    """Full container ID, as the cgroup path names it."""
    runtime: Runtime | None
    """The runtime that made the container's cgroup, when its path says."""
    pod_uid: str | None
    """The pod's UID from the cgroup path; None for a container outside Kubernetes."""
    namespace: str | None = None
    """The pod's namespace; None when the Kubernetes source does not know the pod (or is off)."""
    name: str | None = None
    """The pod's name; None when the Kubernetes source does not know the pod (or is off)."""
    owner: str | None = None
    """The pod's controller as ``Kind/name`` (``ReplicaSet/trainer-5f9c``); None without one, or unknown."""


def process_pods(containers: Mapping[int, ContainerRef | None], kube: KubeFacts | None) -> dict[int, ProcessPod]:
    """GPU process PID -> its container and pod, for the processes that run in a container."""
    out: dict[int, ProcessPod] = {}
    for pid, ref in containers.items():
        if ref is None:
            continue
        pod = kube.pod_for_uid(ref.pod_uid) if kube is not None and ref.pod_uid else None
        if pod is None:
            out[pid] = ProcessPod(ref.container_id, ref.runtime, ref.pod_uid)
            continue
        owner = f"{pod.owner_kind}/{pod.owner_name}" if pod.owner_kind else None
        out[pid] = ProcessPod(ref.container_id, ref.runtime, ref.pod_uid, pod.namespace, pod.name, owner)
    return out


def workload_name(pid: int, pods: Mapping[int, ProcessPod], jobs: Mapping[int, SlurmJob]) -> str:
    """What a GPU process's work is called: its pod (``namespace/name``, or ``pod:<uid>`` before the API names it),
    its Slurm job (``job:<id>``), or the process itself (``pid:<pid>``)."""
    pod = pods.get(pid)
    if pod is not None and pod.namespace and pod.name:
        return f"{pod.namespace}/{pod.name}"
    if pod is not None and pod.pod_uid:
        return f"pod:{pod.pod_uid}"
    job = jobs.get(pid)
    if job is not None:
        return f"job:{job.job_id}"
    return f"pid:{pid}"
