"""Every action declared once, by name: the objects the runner runs (:func:`registry`) and the checks of a rule's
params the policy loader calls (:func:`checks`), which need none of the agent's connections."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from storwatch.actions.base import ACTION_NAMES, Action
from storwatch.actions.checkpoint_request import AskedRuns, RequestCheckpointAction
from storwatch.actions.checkpoint_sync import Resolver, SyncAction
from storwatch.actions.event import EventAction
from storwatch.actions.log import LogAction
from storwatch.actions.sync_jobs import SyncJobs
from storwatch.actions.webhook import WebhookAction
from storwatch.kube.events import KubeEvents
from storwatch.paths import HostPaths

__all__ = ["ACTION_NAMES", "checks", "registry"]

Check = Callable[[Mapping[str, object]], list[str]]


def registry(
    *,
    events: KubeEvents | None = None,
    node_name: str = "",
    paths: HostPaths | None = None,
    sync: tuple[Resolver, SyncJobs] | None = None,
    rescan: Callable[[], object] = lambda: None,
    clock: Callable[[], float] = time.time,
) -> dict[str, Action]:
    """The actions by name. ``events``: the agent's Events writer (None: no cluster, ``event`` is skipped);
    ``node_name``: this node, as the webhook body names it; ``paths``: the host's procfs (for the writer check behind
    a signal); ``sync``: the durable roots and the copy jobs (None: no copy engine, ``sync`` is skipped);
    ``rescan``: asks the checkpoint source for a scan now (the sync action, waiting for a checkpoint it asked for).
    Making them starts nothing: request_checkpoint starts its helper process, and sync its copy worker, on
    first use."""
    asked = AskedRuns(clock)
    resolver, jobs = sync if sync is not None else (None, None)
    actions: list[Action] = [
        LogAction(),
        EventAction(events),
        WebhookAction(node_name),
        RequestCheckpointAction(paths, asked=asked),
        SyncAction(resolver, jobs, asked, node_name, clock, rescan, paths),
    ]
    return {action.name: action for action in actions}


def checks() -> dict[str, Check]:
    """Each action's check of a rule's params (problems as ``params.FIELD: message``), by name."""
    return {name: action.check for name, action in registry().items()}
