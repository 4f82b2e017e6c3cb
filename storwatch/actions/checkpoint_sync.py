"""The ``sync`` action: copies a run's newest complete checkpoint, while the run lives only on storage lost with the
node, to a durable root of ``sync.destinations``, verified, by the copy worker (``storwatch.sync.SyncWorker``: a child
process that holds each copy to a deadline). The action only queues the copy and returns; the copy goes on in the
worker, so a slow or hung destination never holds the runner's lane, and /status, /api/status and storwatch_sync_*
say what became of it (:mod:`.sync_jobs`).

The destination is ``sync.template`` (or the rule's ``template``) under the root, filled from the run's fields
(``{namespace}``, ``{pod}``, ``{run}`` as :func:`run_name` says, ``{node}``, ``{checkpoint}``), each made safe and
checked by ``Destinations.resolve`` so that no field can lead out of the root. A checkpoint already copied, or being
copied, is not copied again (outcome ``skipped``).

Each copy has a deadline: ``sync.deadline_seconds``, or the seconds the run's pod has left when it is being deleted
(its files go with it), whichever is shorter; a copy still queued or running when its pod's time is up is stopped,
and a later request for the same checkpoint tightens the deadline of the copy already under way. While the action
waits for the checkpoint it asked for, it asks the checkpoint source for a scan now (``rescan``), so that a
checkpoint written in answer is seen within the rule's cooldown rather than at the next scan interval.

An alert's rule copies the run the alert names (its ``run`` label: ``Entity.subject``), as a run's rule would.

Params: ``destination`` (one of ``sync.destinations``; default the first), ``template`` (default ``sync.template``),
``wait_for_requested_seconds`` (default 0: after this agent asked the run for a checkpoint, how long to wait for one
newer than the request before copying the newest there is), ``reserve_seconds`` (default 10: stop waiting once the
run's pod has less than this left). A resolution asks for nothing (``skipped``).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from storwatch.actions.base import ActionRequest, ActionResult, Entity, acted_on
from storwatch.actions.checkpoint_request import AskedRuns
from storwatch.actions.params import Params
from storwatch.actions.sync_jobs import SyncJobs
from storwatch.paths import HostPaths
from storwatch.printable import printable
from storwatch.sources.checkpoint_key import KUBELET_PODS
from storwatch.sources.kubevolumes import VolumeDirectory, volume_directory

TEMPLATE_FIELDS = ("namespace", "pod", "run", "node", "checkpoint")
"""What a destination template may name."""
UNKNOWN = "_"
"""A template field the run does not have (no pod off Kubernetes): a name of its own, never an empty component."""
MAX_WAIT_SECONDS = 3600.0


@dataclass(frozen=True)
class SyncParams:
    destination: str | None
    template: str | None
    wait_for_requested_seconds: float
    reserve_seconds: float


def template_problem(template: str) -> str | None:
    """Why ``template`` is no destination template (None: it is one): only ``{field}`` of TEMPLATE_FIELDS, no format
    spec, conversion, attribute or index."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as err:
        return f"not a template: {err}"
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in TEMPLATE_FIELDS or spec or conversion:
            return f"{{{name}}} is not one of {', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}"
    return None


def _read(params: Mapping[str, object], roots: tuple[str, ...] | None) -> tuple[SyncParams, list[str]]:
    """``roots``: the configured destinations to hold ``destination`` to (None: not known here, as for ``storwatch
    policy check``)."""
    p = Params(params, ("destination", "template", "wait_for_requested_seconds", "reserve_seconds"))
    destination = p.string("destination")
    if destination is not None and roots is not None and destination not in roots:
        p.problem("destination", f"{printable(destination)} is not one of sync.destinations")
    template = p.string("template", max_length=1024)
    if template is not None and (why := template_problem(template)) is not None:
        p.problem("template", why)
    wait = p.number("wait_for_requested_seconds", 0.0, 0.0, MAX_WAIT_SECONDS)
    reserve = p.number("reserve_seconds", 10.0, 0.0, MAX_WAIT_SECONDS)
    return SyncParams(destination, template, wait, reserve), p.errors


def run_name(entity: Entity, volume: VolumeDirectory | None) -> str:
    """What ``{run}`` names: for a run in a pod's volume (``volume``, found below the kubelet's own pods directory),
    the volume's name and the path below it (``scratch/run1``; ``{namespace}`` and ``{pod}`` name the pod, and its
    UID is left out so that a StatefulSet's pod, rescheduled, copies into the same directory); else the run's label,
    its path below its scan root (``alice/run1``), unique on the node."""
    if volume is not None:
        return "/".join((volume.volume.volume_dir_name, *volume.below))
    label = entity.fields.get("run")
    return label if isinstance(label, str) and label else entity.key


def template_fields(entity: Entity, node: str, volume: VolumeDirectory | None = None) -> dict[str, str]:
    """The run's fields a destination template may name, as text. ``{run}`` (:func:`run_name`) is a path: one
    component of the destination holds it, its ``/`` written ``%2F`` (and ``%`` as ``%25``, so two runs never give
    one name)."""
    fields = entity.fields

    def text(name: str) -> str:
        value = fields.get(name)
        return value if isinstance(value, str) and value else UNKNOWN

    return {
        "namespace": text("namespace"),
        "pod": text("pod"),
        "run": (run_name(entity, volume) or UNKNOWN).replace("%", "%25").replace("/", "%2F"),
        "node": node or UNKNOWN,
        "checkpoint": text("checkpoint"),
    }


class Resolver(Protocol):
    """What the action needs of the allowlisted roots (``storwatch.actions.sync_engine.EngineResolver`` wraps
    ``storwatch.sync.Destinations``)."""

    @property
    def roots(self) -> tuple[str, ...]:
        """``sync.destinations`` as configured (none: no copy is made)."""
        ...

    @property
    def template(self) -> str: ...

    @property
    def deadline_seconds(self) -> float: ...

    def resolve(self, root: str | None, template: str, fields: Mapping[str, str]) -> str:
        """The destination path, or raise ValueError naming why not."""
        ...


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class SyncAction:
    name = "sync"

    def __init__(
        self,
        resolver: Resolver | None,
        jobs: SyncJobs | None,
        asked: AskedRuns,
        node_name: str,
        clock: Callable[[], float],
        rescan: Callable[[], object] = lambda: None,
        paths: HostPaths | None = None,
    ) -> None:
        """``resolver`` and ``jobs``: None where there is no copy engine (``storwatch policy check``); with no roots
        configured every request is ``skipped``. ``rescan``: asks the checkpoint source for a scan now. ``paths``:
        where the host's root is (its kubelet's pods directory names the pod volumes)."""
        self.resolver = resolver
        self.jobs = jobs
        self.asked = asked
        self.node_name = node_name
        self.clock = clock
        self.rescan = rescan
        self.paths = paths or HostPaths()

    def _roots(self) -> tuple[str, ...] | None:
        """The roots a ``destination`` param is held to (None: not known here, or none configured)."""
        return (self.resolver.roots or None) if self.resolver is not None else None

    def check(self, params: Mapping[str, object]) -> list[str]:
        return _read(params, self._roots())[1]

    def close(self) -> None:
        if self.jobs is not None:
            self.jobs.close()

    def run(self, request: ActionRequest, timeout: float) -> ActionResult:
        params, errors = _read(request.params, self._roots())
        if errors:
            return ActionResult("failed", "; ".join(errors))
        if request.transition == "resolved":
            return ActionResult("skipped", "a resolved rule asks for no copy")
        entity = acted_on(request.entity)
        if self.resolver is None or self.jobs is None or not self.resolver.roots:
            return ActionResult("skipped", "no durable root to copy to: sync.destinations is empty")
        if entity.kind == "alert":
            return ActionResult(
                "skipped", "the alert names no run of this node (its run label, if any, is no run the agent sees)"
            )
        if entity.kind != "run":
            return ActionResult(
                "skipped", f"{entity.kind} {printable(entity.key)} is not a run: sync copies a run's newest checkpoint"
            )
        if entity.checkpoint_path is None or entity.checkpoint_mtime is None:
            return ActionResult("skipped", f"run {printable(entity.key)} has no complete checkpoint to copy")
        if entity.fields.get("ephemeral") is not True:
            return ActionResult("skipped", "its checkpoints are not only on storage lost with the node")
        source, mtime = entity.checkpoint_path, entity.checkpoint_mtime
        waiting = self._waiting(entity, params)
        if waiting is not None:
            self.rescan()  # the checkpoint asked for is seen at the next repeat, not at the next scan interval
            return ActionResult("skipped", waiting)
        # The pod's files go with it: a copy still going when it is killed would read a source being removed.
        left = _number(entity.fields.get("pod_seconds_left"))
        done = self.jobs.existing(source, mtime)
        if done is not None:
            if left is not None and done.state in ("queued", "copying"):
                self.jobs.limit(done.job_id, self.clock() + max(0.0, left))
            return ActionResult(
                "skipped", f"{printable(source)} is already {done.state} to {printable(done.destination)}"
            )
        if left is not None and left <= 0:
            return ActionResult("skipped", "its pod's grace period is over: a copy would not end before it is killed")
        deadline = self.resolver.deadline_seconds if left is None else min(self.resolver.deadline_seconds, left)
        template = params.template or self.resolver.template
        volume = volume_directory(self.paths.root(KUBELET_PODS), entity.run_dir) if entity.run_dir else None
        fields = template_fields(entity, self.node_name, volume)
        try:
            destination = self.resolver.resolve(params.destination, template, fields)
        except ValueError as err:
            return ActionResult("failed", f"refused: {printable(str(err))}")
        job = self.jobs.submit(
            request.rule,
            entity.key,
            request.message,
            source,
            destination,
            mtime,
            deadline,
            entity.run_root,
            run_dir=entity.run_dir,
            access_root=volume.directory if volume is not None else self.paths.root("/"),
        )
        return ActionResult(
            "ok",
            f"copy {job.job_id} queued: {printable(source)} to {printable(destination)}, within {deadline:.0f} s",
        )

    def _waiting(self, entity: Entity, params: SyncParams) -> str | None:
        """Why the copy waits for the checkpoint this agent asked for (None: copy the newest there is now)."""
        if params.wait_for_requested_seconds <= 0 or entity.run_dir is None or entity.checkpoint_mtime is None:
            return None
        asked = self.asked.asked_at(entity.run_dir)
        if asked is None or entity.checkpoint_mtime >= asked:
            return None
        since = self.clock() - asked
        if since >= params.wait_for_requested_seconds:
            return None
        left = _number(entity.fields.get("pod_seconds_left"))
        if left is not None and left <= params.reserve_seconds:
            return None
        return (
            f"waiting for the checkpoint asked for {since:.0f} s ago (up to {params.wait_for_requested_seconds:g} s); "
            f"its newest complete one, {printable(str(entity.fields.get('checkpoint')))}, is older"
        )
