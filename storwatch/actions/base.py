"""What the policy engine and the actions share: the entity a rule is about, the request to act on it, an action's
outcome, and the alert an Alertmanager posts to the agent. Plain, typed data: the policy engine (``storwatch.policy``)
makes requests, the actions (this package) carry them out on the policy's worker, and neither reaches into the
other's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

EntityKind = Literal["mount", "run", "gpu", "workload", "finding", "node", "alert"]
ENTITY_KINDS: tuple[EntityKind, ...] = ("mount", "run", "gpu", "workload", "finding", "node", "alert")
Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
Outcome = Literal["ok", "dry_run", "skipped", "rate_limited", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "dry_run", "skipped", "rate_limited", "failed")

ACTION_NAMES = ("log", "event", "webhook", "request_checkpoint", "sync")
"""Every action, by name (storwatch.actions.registry makes them): what a policy may name, and the bound on the
``action`` label of storwatch_policy_actions_total."""

FieldValue = None | bool | int | float | str | tuple["FieldValue", ...] | Mapping[str, "FieldValue"]
"""What an entity's field holds: the values a CEL expression reads (null, bool, int, double, string, list, map)."""


@dataclass(frozen=True)
class Entity:
    """One thing a rule can be about, as of one View: a mount, a checkpoint run, a GPU, a GPU workload, a finding,
    the node itself, or an alert Alertmanager posted."""

    kind: EntityKind
    key: str
    """Unique among this node's entities of its kind, stable from one View to the next (a mountpoint, a run's
    label, a GPU's UUID, a finding's id, an alert's fingerprint): a rule's state is kept per (rule, kind, key)."""
    fields: Mapping[str, FieldValue]
    """Its fields, by the names the policy schema declares (storwatch.policy.schema)."""
    run_dir: str | None = None
    """For a run: its directory as this process reaches it (where request_checkpoint writes), else None."""
    writer_pids: tuple[int, ...] = ()
    """For a run: the processes the kernel showed writing it (its checkpoint files open for writing)."""
    writers_seen: Mapping[int, float] = field(default_factory=dict)
    """For a run: of those, the ones whose work the agent's own looks saw holding a checkpoint file of the run open
    for writing, each with the newest such look (wall time): the only processes a signal may be sent to."""
    run_root: str | None = None
    """For a run: the scan root it was found under, as this process reaches it (the operator's, trusted). Every
    directory from there down to ``run_dir`` is opened without following a symbolic link, so a link a tenant plants
    in the run's path cannot lead an action elsewhere; None: only ``run_dir``'s own last component is held so."""
    checkpoint_path: str | None = None
    """For a run: its newest complete checkpoint as this process reaches it (what ``sync`` copies), else None."""
    checkpoint_mtime: float | None = None
    """That checkpoint's newest modification time (UNIX seconds): which save it is."""
    owner: str | None = None
    """Who it belongs to, as the kernel and the cluster say (never a name a tenant wrote): ``namespace:NS`` for the
    Kubernetes namespace of its pod, else ``uid:N`` (its directory's owner, or its Slurm job's user); None for what
    is the node's (a mount, a GPU). Each owner has its own budget of each action (storwatch.actions.runner)."""
    subject: Entity | None = None
    """For an alert: the run, mount or GPU of this node its labels name (``run``, else ``mountpoint``, else ``uuid``
    or ``gpu``), as of the same View; None when they name none here. The actions act on it (:func:`acted_on`)."""


def acted_on(entity: Entity) -> Entity:
    """What an action acts on: the entity an alert's labels name, where they name one of this node; else the entity
    itself (an alert naming nothing here stays the alert, and an action that needs a run says so)."""
    return entity.subject if entity.kind == "alert" and entity.subject is not None else entity


@dataclass(frozen=True)
class ActionRequest:
    """A rule asks an action to act on an entity: when the rule starts firing (``transition`` ``firing``), again
    while it fires past the rule's cooldown (``repeat``), and when it resolves (``resolved``)."""

    rule: str
    action: str
    params: Mapping[str, object]
    entity: Entity
    severity: Severity
    message: str
    """The rule's message, its templates filled from the entity's fields (printable text)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    transition: Literal["firing", "repeat", "resolved"] = "firing"
    dry_run: bool = False
    at: float = 0.0
    """When the engine decided (the View's time)."""
    cooldown: float = 0.0
    """The rule's cooldown in seconds: the runner runs a request at most once per (rule, action, entity, transition)
    within it, however often the same request is submitted."""
    deferred: bool = False
    """Asked again after the runner refused it for its rate (it was counted then, and is not again while refused)."""
    revision: str = ""
    """What the rule's ``repeat_on`` fields held when it was asked (empty without them): a request for a newer value
    is not the same request, whatever the cooldown (storwatch.actions.runner's idempotency)."""


@dataclass(frozen=True)
class ActionResult:
    outcome: Outcome
    detail: str = ""
    """What happened, for the log and /status (an HTTP status, the Event's name, the error)."""


class Action(Protocol):
    """One kind of action (``log``, ``event``, ``webhook``, ``request_checkpoint``...). One whose requests go to
    several destinations may also have ``lane(params) -> str``, naming a request's destination: the runner then gives
    each destination a lane of its own (the webhook's receivers)."""

    name: str

    def check(self, params: Mapping[str, object]) -> list[str]:
        """The problems with a rule's params for this action, each naming the field (empty: fine). Called when the
        policy is loaded, so a bad rule is refused before it ever fires."""
        ...

    def run(self, request: ActionRequest, timeout: float) -> ActionResult:
        """Carry the request out within ``timeout`` seconds; never raise (a failure is an outcome)."""
        ...


@dataclass(frozen=True)
class Alert:
    """One alert of an Alertmanager webhook payload (version 4), as the receiver accepted it."""

    fingerprint: str
    status: Literal["firing", "resolved"]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float
    """Seconds since the epoch."""
    ends_at: float | None
    """None where Alertmanager sent its zero time (still firing)."""
    received_at: float
