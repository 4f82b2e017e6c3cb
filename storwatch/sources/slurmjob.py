"""Where a Slurm job keeps its checkpoints on this node, for ``storwatch sync --job`` in an epilog: the job's
processes, found by their cgroup (``procfs/cgroup.py``: ``job_<N>`` in Slurm's own layout from the hierarchy's
root, cgroup v1 or v2; never in a subtree a user or a container controls, where anyone may name a cgroup so), the
directories they work in and hold files open for writing in, and the scratch directories the site names for a job
(``{job}``, ``{user}`` and ``{uid}`` filled in), kept to those that exist. Which of them are node-local is the
classifier's to say (the Slurm preset: on Together's Slurm clusters /home is NFS), not this module's.

Read-only. A process's cgroup, cwd and fds are claims of the job only as far as the kernel shows them; a name a tenant
wrote (a directory under a scratch template) is only a place to look, never followed out of its scratch root.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from storwatch.paths import HostPaths
from storwatch.procfs.cgroup import parse_cgroup, slurm_job_of

MAX_CGROUP_BYTES = 64 * 1024
"""A process's cgroup file is a line per hierarchy; more is not read."""
MAX_PROCESSES = 100_000
"""/proc entries looked at, at most (a node's PID space)."""
MAX_FDS = 4096
"""Open files looked at per process, at most."""
MAX_DIRECTORIES = 256
"""Directories handed on to the checkpoint scan, at most."""
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR


@dataclass(frozen=True)
class JobPlaces:
    """A Slurm job on this node, and the directories its checkpoints may be in (host paths)."""

    job_id: int
    pids: tuple[int, ...]
    """Its processes still running (none, once the job has ended, as in an epilog)."""
    uid: int | None
    """Its owner: the cgroup v1 path's ``uid_<N>``, else the owner of one of its processes; None when neither is
    known (pass it from the epilog's SLURM_JOB_UID)."""
    user: str | None
    """That owner's name, where this node's password database has it."""
    directories: tuple[str, ...]
    """Where its processes work (cwd) and write, then its scratch directories, each once, in that order."""


def job_processes(paths: HostPaths, job_id: int) -> tuple[tuple[int, ...], int | None]:
    """The PIDs whose cgroup names Slurm job ``job_id``, and the job's owner as the cgroups or processes show it."""
    pids: list[int] = []
    uid: int | None = None
    try:
        entries = os.scandir(paths.proc())
    except OSError:
        return (), None
    with entries:
        for count, entry in enumerate(entries):
            if count >= MAX_PROCESSES:
                break
            if not entry.name.isdigit():
                continue
            try:
                with open(paths.proc(entry.name, "cgroup"), "rb") as f:
                    data = f.read(MAX_CGROUP_BYTES)
            except OSError:
                continue  # exited, or not ours to read
            job = slurm_job_of(parse_cgroup(data)[0])
            if job is None or job.job_id != job_id:
                continue
            pids.append(int(entry.name))
            if uid is None and job.uid is not None:
                uid = job.uid
            if uid is None:
                with contextlib.suppress(OSError):
                    uid = os.stat(paths.proc(entry.name)).st_uid
    return tuple(sorted(pids)), uid


def _written_dirs(paths: HostPaths, pid: int) -> list[str]:
    """The process's cwd and the directories of the regular files it holds open for writing, as the host names them
    (the links in procfs are in the process's own mount namespace: the host's, for a job that has no private one)."""
    found: list[str] = []
    with contextlib.suppress(OSError):
        found.append(os.readlink(paths.proc(str(pid), "cwd")))
    try:
        fds = os.listdir(paths.proc(str(pid), "fd"))
    except OSError:
        return found
    for fd in fds[:MAX_FDS]:
        try:
            with open(paths.proc(str(pid), "fdinfo", fd), "rb") as f:
                info = f.read(4096)
            flags = next((int(line.split()[1], 8) for line in info.splitlines() if line.startswith(b"flags:")), 0)
            if not flags & _WRITE_FLAGS:
                continue
            target = os.readlink(paths.proc(str(pid), "fd", fd))
        except (OSError, ValueError, IndexError):
            continue
        if target.startswith("/"):
            found.append(os.path.dirname(target))
    return found


def scratch_directories(templates: Sequence[str], job_id: int, uid: int | None, user: str | None) -> list[str]:
    """The site's scratch directories for the job: each template with ``{job}``, ``{uid}`` and ``{user}`` filled in;
    a template naming what is not known is left out."""
    known = {"job": str(job_id)}
    if uid is not None:
        known["uid"] = str(uid)
    if user is not None:
        known["user"] = user
    out: list[str] = []
    for template in templates:
        try:
            path = template.format(**known)
        except (KeyError, IndexError, ValueError):
            continue
        if os.path.isabs(path) and ".." not in path.split("/"):
            out.append(os.path.normpath(path))
    return out


def _user(uid: int | None) -> str | None:
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _real_directory(paths: HostPaths, host_path: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(paths.root(host_path), follow_symlinks=False).st_mode)
    except OSError:
        return False


def find_job(paths: HostPaths, job_id: int, scratch: Iterable[str] = (), uid: int | None = None) -> JobPlaces:
    """Job ``job_id`` on this node and where its checkpoints may be. ``scratch``: the site's scratch templates;
    ``uid``: the job's owner where the caller knows it (the epilog's SLURM_JOB_UID), else read from its cgroups."""
    pids, seen_uid = job_processes(paths, job_id)
    owner = uid if uid is not None else seen_uid
    user = _user(owner)
    candidates: list[str] = []
    for pid in pids:
        candidates.extend(_written_dirs(paths, pid))
    candidates.extend(scratch_directories(tuple(scratch), job_id, owner, user))
    directories: list[str] = []
    for path in candidates:
        path = os.path.normpath(path)
        if path == "/" or path in directories or not _real_directory(paths, path):
            continue
        directories.append(path)
        if len(directories) >= MAX_DIRECTORIES:
            break
    return JobPlaces(job_id, pids, owner, user, tuple(directories))
