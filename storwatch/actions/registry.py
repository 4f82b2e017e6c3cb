"""Every action declared once, by name: the objects the runner runs (:func:`registry`) and the checks of a rule's
params the policy loader calls (:func:`checks`), which need none of the agent's connections."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from storwatch.actions.base import Action
from storwatch.actions.checkpoint_request import RequestCheckpointAction
from storwatch.actions.event import EventAction
from storwatch.actions.kube_events import KubeEvents
from storwatch.actions.log import LogAction
from storwatch.actions.webhook import WebhookAction
from storwatch.paths import HostPaths

ACTION_NAMES = ("log", "event", "webhook", "request_checkpoint")
"""The bound on the ``action`` label of storwatch_policy_actions_total."""

Check = Callable[[Mapping[str, object]], list[str]]


def registry(
    *, events: KubeEvents | None = None, node_name: str = "", paths: HostPaths | None = None
) -> dict[str, Action]:
    """The actions by name. ``events``: the agent's Events writer (None: no cluster, ``event`` is skipped);
    ``node_name``: this node, as the webhook body names it; ``paths``: the host's procfs (for the writer check behind
    a signal). Making them starts nothing: request_checkpoint starts its helper process on first use."""
    actions: list[Action] = [
        LogAction(),
        EventAction(events),
        WebhookAction(node_name),
        RequestCheckpointAction(paths),
    ]
    return {action.name: action for action in actions}


def checks() -> dict[str, Check]:
    """Each action's check of a rule's params (problems as ``params.FIELD: message``), by name."""
    return {name: action.check for name, action in registry().items()}
