"""What ``storwatch sync --job JOBID`` copies, for a Slurm epilog: the job's directories on this node
(``sources/slurmjob.py``: where its processes work and write, and ``sync.job_scratch``), kept where the classifier
says they are lost with the node (the platform preset: on a Slurm cluster /home is NFS and stays), walked by the
checkpoint scan, and each run's newest complete checkpoint, with the path of its copy below a durable root
(``sync.destinations``, the template filled as the sync action fills it). Copying is the caller's (a SyncWorker).

A job has no namespace or pod: ``{namespace}`` is its owner (the user's name, else the UID) and ``{pod}`` is
``job-JOBID``, so the default template ``{namespace}/{pod}/{run}/{checkpoint}`` gives ``alice/job-4242/ckpt/step-100``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from storwatch.actions.base import Entity
from storwatch.actions.checkpoint_sync import template_fields
from storwatch.classify import Classifier, resolve_platform
from storwatch.config import Config
from storwatch.paths import HostPaths
from storwatch.sources.checkpoints import CheckpointFacts, CheckpointSource
from storwatch.sources.mounts import MountSource
from storwatch.sources.slurmjob import JobPlaces, find_job
from storwatch.sync import Destinations, SyncRefused
from storwatch.vocabulary import Mount, Platform, Verdict


@dataclass(frozen=True)
class Place:
    """One of the job's directories (a host path), and what the classifier says of the mount it is on."""

    directory: str
    mountpoint: str | None
    verdict: Verdict | None
    """None: on no mount the table shows (not kept)."""

    @property
    def ephemeral(self) -> bool:
        return self.verdict is not None and self.verdict.durability.ephemeral


@dataclass(frozen=True)
class JobCopy:
    """A run's newest complete checkpoint, and where its copy goes."""

    run: str
    """The run's directory below the job's directory it was found in (``ckpt``, ``.`` for that directory itself)."""
    source: str
    """The checkpoint, as this process reaches it."""
    source_root: str
    """The job's directory it was found in, as reached: opened down to the checkpoint without following links."""
    dest: str
    run_dir: str = ""
    """The run's directory, as reached: what the copy's manifest records as its run."""


@dataclass(frozen=True)
class JobPlan:
    job: JobPlaces
    platform: Platform
    places: tuple[Place, ...]
    copies: tuple[JobCopy, ...]
    skipped: tuple[str, ...]
    """Runs left out, each with why (no complete checkpoint, a name the template refuses)."""
    scan_failure: str | None = None
    """What the checkpoint scan could not read (a stuck mount, unreadable entries), when it could not."""


def _mount_of(mounts: Sequence[Mount], host_path: str) -> Mount | None:
    """The mount ``host_path`` lies on: the longest mountpoint above it (a later mount over the same point wins)."""
    best: Mount | None = None
    for mount in mounts:
        mp = mount.mountpoint
        below = host_path == mp or host_path.startswith(mp.rstrip("/") + "/")
        if below and (best is None or len(mp) >= len(best.mountpoint)):
            best = mount
    return best


def _outermost(directories: Sequence[str]) -> list[str]:
    """The directories without those below another of them (one walk each, no run found twice)."""
    out: list[str] = []
    for d in sorted(set(directories), key=len):
        if not any(d == o or d.startswith(o.rstrip("/") + "/") for o in out):
            out.append(d)
    return [d for d in directories if d in out]


def _label(root: str, run: str) -> str:
    rel = os.path.relpath(run, root)
    return os.path.basename(root.rstrip("/")) if rel == "." else rel


def _scan(roots: Sequence[str], config: Config) -> CheckpointFacts:
    """The directories walked by the checkpoint scan, with the agent's helper and limits (cheap checks only),
    collecting until every walk has answered or is stuck, as ``storwatch scan`` does."""
    settings = dataclasses.replace(config.checkpoints, deep_per_scan=0)
    source = CheckpointSource(roots, settings, mountpoints=lambda: [])
    try:
        deadline = time.monotonic() + settings.timeout_seconds
        facts = source.collect()
        while source.waiting and time.monotonic() < deadline:
            facts = source.collect()
        return facts
    finally:
        source.close()


def plan_job(
    config: Config,
    job_id: int,
    *,
    uid: int | None = None,
    destination: str | None = None,
    node: str | None = None,
    paths: HostPaths | None = None,
) -> JobPlan:
    """Find job ``job_id``'s directories, keep the node-local ones, walk them, and plan a copy of each run's newest
    complete checkpoint below ``destination`` (one of ``sync.destinations``; default the first). Raises ValueError
    when there is no durable root to copy to."""
    section = config.sync
    if not section.destinations:
        raise ValueError("sync.destinations is empty: there is no durable root to copy a job's checkpoints to")
    root = destination if destination is not None else section.destinations[0]
    if root not in section.destinations:
        raise ValueError(f"{root!r} is not one of sync.destinations ({', '.join(section.destinations)})")
    paths = paths or config.host_paths()
    platform = resolve_platform(config.platform, paths)
    job = find_job(paths, job_id, section.job_scratch, uid=uid)
    mount_source = MountSource(paths, config.mounts)
    try:
        mounts: Sequence[Mount] = mount_source.collect()
    finally:
        mount_source.close()
    classifier = Classifier(platform.name, config.overrides())
    places = []
    for directory in job.directories:
        mount = _mount_of(mounts, directory)
        places.append(
            Place(directory, mount.mountpoint if mount else None, classifier.classify(mount) if mount else None)
        )
    kept = _outermost([p.directory for p in places if p.ephemeral])
    copies: list[JobCopy] = []
    skipped: list[str] = []
    failure: str | None = None
    if kept:
        facts = _scan([paths.root(d) for d in kept], config)
        failure = facts.failure
        reached = Destinations([paths.root(root)]).roots[0]
        destinations = Destinations([reached])
        owner = job.user or (str(job.uid) if job.uid is not None else "")
        node_name = node if node is not None else socket.gethostname()
        labels = {run.path: _label(run.root, run.path) for run in facts.runs}
        taken = collections.Counter(labels.values())
        for run in facts.runs:
            label = labels[run.path]
            if taken[label] > 1:
                # Two of the job's directories hold a run of this name: each named by its whole path, so that two
                # runs never map to one destination.
                label = os.path.relpath(run.path, paths.root("/"))
            newest = run.newest_complete
            if newest is None:
                skipped.append(f"{label}: no complete checkpoint")
                continue
            fields = {
                "run": label,
                "path": run.path,
                "namespace": owner,
                "pod": f"job-{job_id}",
                "checkpoint": os.path.basename(newest.path.rstrip("/")),
            }
            try:
                dest = destinations.resolve(
                    section.template, template_fields(Entity("run", label, fields), node_name), root=reached
                )
            except SyncRefused as err:
                skipped.append(f"{label}: refused: {err}")
                continue
            copies.append(JobCopy(label, newest.path, run.root, dest, run.path))
    return JobPlan(job, platform, tuple(places), tuple(copies), tuple(skipped), failure)
