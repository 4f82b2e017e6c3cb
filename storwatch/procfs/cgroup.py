"""Parse /proc/<pid>/cgroup (man 7 cgroups, "/proc/[pid]/cgroup") and decide which container, and which Kubernetes
pod, a process runs in from the cgroup path its runtime and the kubelet gave it.

A line is ``HIERARCHY-ID:CONTROLLERS:PATH``. Cgroup v1 prints one line per mounted hierarchy (``11:memory:/...``,
``4:cpu,cpuacct:/...``, ``1:name=systemd:/...``); cgroup v2 prints one line, ``0::/...``; a hybrid host prints both.
The path is relative to the reader's cgroup namespace and is not escaped. The kernel appends `` (deleted)`` to a v2
path whose cgroup was removed while a zombie still named it, and prints ``/`` for every v1 hierarchy of an exiting
task; a v1 hierarchy unmounted while the file is printed shows as ``N:CONTROLLERS: (deleted)``, with no path.

Container paths, by cgroup driver (kubelet and runtime must agree on it):

- systemd: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID with _>.slice/<scope>``, where
  ``<scope>`` is ``cri-containerd-<ID>.scope``, ``crio-<ID>.scope`` or ``docker-<ID>.scope``; guaranteed pods have no
  QoS slice (``kubepods-pod<UID>.slice``); a kubelet with ``--cgroup-root=/kubelet`` (kind) prefixes every slice name
  (``kubelet-kubepods-besteffort-pod<UID>.slice``); plain Docker uses ``/system.slice/docker-<ID>.scope``.
- cgroupfs: ``/kubepods[/burstable|/besteffort]/pod<UID with ->/<ID>`` (CRI-O: ``.../crio-<ID>``); plain Docker uses
  ``/docker/<ID>``.

The container is the deepest container-shaped component, so a sub-cgroup made inside the container (crun's
``crio-<ID>.scope/container``, a systemd container's ``init.scope``) and a cluster nested in a container (kind seen
from the host: ``/system.slice/docker-<node>.scope/kubelet.slice/...``) both resolve to the innermost container. Its pod
is the nearest pod slice or directory above it.

A reader in a private cgroup namespace, which is every pod on a cgroup v2 node (Kubernetes has no host cgroup namespace
option), sees other processes' paths relative to its own cgroup: ``0::/../../kubepods-besteffort-pod<UID>.slice/...``.
The ``..`` components are kept as printed; the container and pod still resolve as long as the path crosses their
cgroups, except that a cgroupfs pod directory reached by ``..`` has no QoS class, and a container in the reader's own
pod (``0::/../cri-containerd-<ID>.scope``) has no pod UID.

CRI-O's container monitor runs in ``crio-conmon-<ID>.scope`` beside the container it watches. Conmon is not the
container (it is part of the node's runtime and never opens a GPU), so such a process is reported as in no container:
``container_of`` gives ``None`` for it unless it sits inside an outer container, which is then the answer.

Slurm jobs (``slurm_job_of``): slurmstepd puts a job's processes in cgroups named for the job and step, at fixed
places below the root of the hierarchy, by cgroup version:

- cgroup v1 (cgroup/v1 plugin), in every controller it uses: ``/slurm/uid_<UID>/job_<JOB>/step_<STEP>/task_<N>``;
  with several slurmd on one host (``--enable-multiple-slurmd``) the root is ``/slurm_<NODENAME>`` (Slurm's built-in
  ``CgroupPrepend``, ``/slurm`` or ``/slurm_%n``, which cgroup.conf does not set);
- cgroup v2 (cgroup/v2 plugin, Slurm 22.05 and later): ``/system.slice/slurmstepd.scope/job_<JOB>/step_<STEP>/user/
  task_<N>`` (slurmstepd itself sits in ``slurmstepd.scope/system`` or the step's ``slurm`` leaf); with several
  slurmd, ``<NODENAME>_slurmstepd.scope``. The plugin builds the scope's path as the parent of PID 1's cgroup (the
  root, on a host) plus ``system.slice/<scope>``.

``<STEP>`` is a step number, ``batch``, ``extern`` or ``interactive``. A job running in a container (pyxis and enroot)
keeps these cgroups, so a process can have both a job and a container.

Only that layout, anchored at the root, names a job. Names below the root are not all root's to choose: systemd
delegates ``/user.slice/user-<UID>.slice/user@<UID>.service`` to the user it runs for (``Delegate=yes``), who may
make any cgroup below it, ``slurm/uid_0/job_42`` or ``app.slice/slurmstepd.scope/job_42`` included, and move her own
processes there; a container with a writable cgroup mount may do the same below its own cgroup. ``job_<N>`` under
any such subtree is the tenant's word, not Slurm's, and must never make job N's epilog walk her directories. Slurm
inside a container (slurmd in a pod) puts its scope below the container's cgroup, which is not recognised from the
host.

A path read from inside a cgroup namespace starts with ``..`` where it leaves the reader's namespace root: the kernel
climbs to the nearest common ancestor, then names each cgroup down from there. The first name after the ``..`` is
a child of an ancestor of the reader's own cgroup, made by whoever controls that ancestor (root, for the agent), never
by a tenant: so ``/../../system.slice/slurmstepd.scope/job_<N>`` is Slurm's. A path whose first name after
the ``..`` is not the layout's first (``/../slurmstepd.scope/job_<N>``, read from the namespace of a unit in
``/system.slice``) does not say which slice it is in, and names no job: run the agent in the host's cgroup namespace
(the systemd unit does).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from storwatch.procfs import LineError

Runtime = Literal["containerd", "cri-o", "docker"]
QoSClass = Literal["guaranteed", "burstable", "besteffort"]

_DELETED = " (deleted)"
_HIERARCHY_ID = re.compile(r"[0-9]+")

# Kubernetes pod UIDs are RFC 4122 UUIDs, except for static pods, whose UID is the MD5 of the manifest: 32 hex digits
# with no dashes. The kubelet's systemd driver turns "-" into "_" so the UID does not read as further slice levels.
_POD_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}|[0-9a-fA-F]{32}"
_SYSTEMD_POD = re.compile(rf"(?:[^/]*-)?kubepods(?:-(?P<qos>burstable|besteffort))?-pod(?P<uid>{_POD_UID})\.slice")
_CGROUPFS_POD = re.compile(rf"pod(?P<uid>{_POD_UID})")
# The kubelet files guaranteed pods straight under kubepods, the others under a directory (slice) named for the class.
_QOS_PARENT: dict[str, QoSClass] = {"kubepods": "guaranteed", "burstable": "burstable", "besteffort": "besteffort"}

# "crio-conmon-<ID>" does not match: "conmon-" is not hex. The scope suffix is optional because CRI-O's cgroupfs
# manager names the same directory "crio-<ID>". nerdctl is containerd's own CLI.
_PREFIXED_CONTAINER = re.compile(r"(?P<prefix>cri-containerd|crio|docker|nerdctl)-(?P<id>[0-9a-f]{64})(?:\.scope)?")
_BARE_CONTAINER = re.compile(r"[0-9a-f]{64}")
_PREFIX_RUNTIME: dict[str, Runtime] = {
    "cri-containerd": "containerd",
    "nerdctl": "containerd",
    "crio": "cri-o",
    "docker": "docker",
}

# Which line to read a container from: the unified line names the process's cgroup on v2 and on hybrid hosts under
# the systemd driver; of the v1 lines, these controllers are the ones every runtime joins.
_V1_PREFERENCE = ("memory", "pids", "cpu", "name=systemd")


@dataclass(frozen=True)
class CgroupEntry:
    """One line of /proc/<pid>/cgroup: the process's cgroup in one hierarchy."""

    hierarchy_id: int
    """Hierarchy ID: 0 for the cgroup v2 unified hierarchy, else the v1 hierarchy's number (matches the second column
    of /proc/cgroups)."""
    controllers: tuple[str, ...]
    """Controllers bound to the hierarchy (``("cpu", "cpuacct")``), with a named v1 hierarchy as ``name=NAME``
    (``("name=systemd",)``); empty for the v2 line."""
    path: str
    """Path of the process's cgroup within the hierarchy, relative to the reader's cgroup namespace root, without the
    `` (deleted)`` suffix; empty only for a hierarchy the kernel saw go away while it printed the file."""
    deleted: bool
    """The kernel marked the path `` (deleted)``: the cgroup was removed while this (zombie) process still named it.
    The path still tells which container the process was in."""

    @property
    def unified(self) -> bool:
        """This is the cgroup v2 line (``0::PATH``)."""
        return self.hierarchy_id == 0 and not self.controllers


@dataclass(frozen=True)
class ContainerRef:
    """The container a process runs in, and its Kubernetes pod when it is in one, as its cgroup path names them."""

    runtime: Runtime | None
    """Runtime that created the container's cgroup, when the path says: the systemd driver's scope prefix
    (``cri-containerd-``, ``crio-``, ``docker-``) or Docker's ``/docker/`` parent. ``None`` under the kubelet's cgroupfs
    driver, where containerd, CRI-O with runc defaults and Docker all name the directory by the bare ID."""
    container_id: str
    """Full 64-hex-digit container ID, as the runtime and the Kubernetes API (``containerStatuses[].containerID`` after
    ``runtime://``) print it."""
    pod_uid: str | None
    """UID of the pod (``metadata.uid``), lowercase with dashes whichever driver wrote it; for a static pod, the
    32-hex-digit config hash the kubelet uses as its UID (the mirror pod's ``kubernetes.io/config.hash``). ``None``
    for a container outside Kubernetes."""
    qos_class: QoSClass | None
    """Pod QoS class from the slice or directory the kubelet put the pod in; ``None`` outside Kubernetes."""
    cgroup_path: str
    """The cgroup path this was read from."""


class CgroupError(LineError):
    """A line that is not a valid /proc/<pid>/cgroup record; ``lineno`` is 1-based."""


def parse_line(line: str, lineno: int = 1) -> CgroupEntry:
    """Parse one line (without its newline)."""
    hierarchy, _, rest = line.partition(":")
    controllers, sep, path = rest.partition(":")
    if not sep:
        raise CgroupError(lineno, "expected HIERARCHY-ID:CONTROLLERS:PATH", line)
    if not _HIERARCHY_ID.fullmatch(hierarchy):
        raise CgroupError(lineno, "hierarchy ID is not a decimal number", line)
    # The path is printed unescaped, so it may itself hold colons: everything after the second colon is the path.
    deleted = path.endswith(_DELETED)
    if deleted:
        path = path[: -len(_DELETED)]
    # Since 6.7 the kernel reads the hierarchy list under RCU, and a hierarchy unmounted meanwhile prints as
    # "N:name=X: (deleted)": no path at all. That is a real line, not a malformed one.
    if not path.startswith("/") and not (deleted and not path):
        raise CgroupError(lineno, "cgroup path is not absolute", line)
    return CgroupEntry(
        hierarchy_id=int(hierarchy),
        controllers=tuple(c for c in controllers.split(",") if c),
        path=path,
        deleted=deleted,
    )


def parse_cgroup(text: bytes | str) -> tuple[list[CgroupEntry], list[CgroupError]]:
    """Parse a whole /proc/<pid>/cgroup file. Bad lines are returned as errors; good lines are never lost to them."""
    # Paths are bytes to the kernel; surrogateescape keeps a non-UTF-8 one exact for os.fsencode.
    data = os.fsdecode(text) if isinstance(text, bytes) else text
    entries: list[CgroupEntry] = []
    errors: list[CgroupError] = []
    for lineno, line in enumerate(data.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            entries.append(parse_line(line, lineno))
        except CgroupError as err:
            errors.append(err)
    return entries, errors


def _preference(entry: CgroupEntry) -> int:
    if entry.unified:
        return 0
    for rank, controller in enumerate(_V1_PREFERENCE, start=1):
        if controller in entry.controllers:
            return rank
    return len(_V1_PREFERENCE) + 1


# The roots slurmstepd makes its job cgroups under (see the module docstring): v1's top-level directory, v2's scope in
# system.slice. A node name never holds "/".
_SLURM_V1_ROOT = re.compile(r"slurm(?:_[^/]+)?")
_SLURM_V2_SLICE = "system.slice"
_SLURM_V2_SCOPE = re.compile(r"(?:[^/]+_)?slurmstepd\.scope")
_SLURM_UID = re.compile(r"uid_([0-9]{1,10})")
_SLURM_JOB = re.compile(r"job_([0-9]{1,10})")
_SLURM_STEP = re.compile(r"step_([0-9]{1,10}|batch|extern|interactive)")


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm job (and step) whose cgroup a process is in."""

    job_id: int
    step: str | None
    """The step number as text, ``batch``, ``extern`` or ``interactive``; None for the job's own cgroup."""
    uid: int | None
    """The job owner's UID where the path says it (cgroup v1)."""


def slurm_job_of(entries: Iterable[CgroupEntry]) -> SlurmJob | None:
    """The Slurm job the process runs in, or ``None`` outside any job; lines tried in the order ``container_of``
    tries them."""
    for entry in sorted(entries, key=_preference):
        job = slurm_job_of_path(entry.path)
        if job is not None:
            return job
    return None


def slurm_job_of_path(path: str) -> SlurmJob | None:
    """The Slurm job named by one cgroup path, only where the path is Slurm's own layout from the root of the
    hierarchy (after any leading ``..``): ``/slurm[_<node>]/uid_<UID>/job_<N>/...`` (v1) or
    ``/system.slice/[<node>_]slurmstepd.scope/job_<N>/...`` (v2). ``job_<N>`` anywhere else (below
    ``user.slice``, a container, ``kubepods``) is a name someone else chose, and names no job."""
    components = [c for c in path.split("/") if c]
    start = 0
    while start < len(components) and components[start] == "..":
        start += 1
    rest = components[start:]
    # The kernel prints ".." only before the first name; a path with one later is not its own.
    if ".." in rest or "." in rest:
        return None
    uid: int | None = None
    if len(rest) >= 3 and rest[0] == _SLURM_V2_SLICE and _SLURM_V2_SCOPE.fullmatch(rest[1]):
        below = rest[2:]
    elif len(rest) >= 3 and _SLURM_V1_ROOT.fullmatch(rest[0]) and (m := _SLURM_UID.fullmatch(rest[1])):
        uid, below = int(m.group(1)), rest[2:]
    else:
        return None
    job = _SLURM_JOB.fullmatch(below[0])
    if job is None:
        return None
    step = _SLURM_STEP.fullmatch(below[1]) if len(below) > 1 else None
    return SlurmJob(int(job.group(1)), step.group(1) if step else None, uid)


def container_of(entries: Iterable[CgroupEntry]) -> ContainerRef | None:
    """The container the process is in, or ``None`` for a host process, a process whose cgroup namespace hides the
    path (``0::/``), or CRI-O's conmon.

    The unified line is read first, then the v1 ``memory``, ``pids``, ``cpu`` and ``name=systemd`` lines, then any
    other; the first that names a container wins. Falling through matters on hybrid hosts: a runtime that does not
    manage the unified hierarchy (older Docker and runc releases) leaves the process's v2 cgroup at its
    shim's (``0::/system.slice/containerd.service``) while every v1 line names the container.
    """
    for entry in sorted(entries, key=_preference):
        ref = container_of_path(entry.path)
        if ref is not None:
            return ref
    return None


def container_of_path(path: str) -> ContainerRef | None:
    """The container named by one cgroup path, or ``None`` when no component of it is a container."""
    components = [c for c in path.split("/") if c]
    for index in range(len(components) - 1, -1, -1):
        found = _container_component(components, index)
        if found is None:
            continue
        runtime, container_id = found
        pod_uid, qos_class = _pod_above(components, index)
        return ContainerRef(
            runtime=runtime,
            container_id=container_id,
            pod_uid=pod_uid,
            qos_class=qos_class,
            cgroup_path=path,
        )
    return None


def _container_component(components: list[str], index: int) -> tuple[Runtime | None, str] | None:
    component = components[index]
    prefixed = _PREFIXED_CONTAINER.fullmatch(component)
    if prefixed is not None:
        return _PREFIX_RUNTIME[prefixed.group("prefix")], prefixed.group("id")
    if _BARE_CONTAINER.fullmatch(component):
        # Docker's cgroupfs driver files containers under /docker; the kubelet's cgroupfs layout does not say which
        # runtime made the directory.
        parent = components[index - 1] if index > 0 else ""
        return ("docker" if parent == "docker" else None), component
    return None


def _pod_above(components: list[str], index: int) -> tuple[str | None, QoSClass | None]:
    for above in range(index - 1, -1, -1):
        component = components[above]
        systemd = _SYSTEMD_POD.fullmatch(component)
        if systemd is not None:
            return normalise_pod_uid(systemd.group("uid")), _QOS_PARENT[systemd.group("qos") or "kubepods"]
        cgroupfs = _CGROUPFS_POD.fullmatch(component)
        parent = components[above - 1] if above > 0 else ""
        if cgroupfs is not None and parent in _QOS_PARENT:
            return normalise_pod_uid(cgroupfs.group("uid")), _QOS_PARENT[parent]
        if cgroupfs is not None and parent == "..":
            # Seen from a sibling pod in the same QoS directory: the class is the reader's own, which the path omits.
            return normalise_pod_uid(cgroupfs.group("uid")), None
    return None, None


def normalise_pod_uid(raw: str) -> str:
    """A pod UID as the Kubernetes API prints it: lowercase, dashes where the systemd driver wrote underscores."""
    return raw.replace("_", "-").lower()
