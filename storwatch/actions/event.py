"""The ``event`` action: a Kubernetes Event for a rule's transition, through the Events writer of
:mod:`storwatch.kube.events` (which deduplicates repeats into a count and bounds its own rate). The Event is about the
pod when the entity names one (its ``namespace`` and ``pod`` fields), else about this Node.

Params: ``reason`` (UpperCamelCase, default: the rule's name in UpperCamelCase, ``Resolved`` appended when the rule
resolves, so a resolution never bumps the count of the firing Event), ``type`` (``Normal`` or ``Warning``, default
``Warning`` for warning and critical rules, ``Normal`` for info ones and for every resolution), ``about`` (``auto``,
``node``: always this Node).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from storwatch.actions.base import ActionRequest, ActionResult, Entity, acted_on
from storwatch.actions.params import Params
from storwatch.kube.events import KubeEvents

MAX_REASON = 128
"""The API's bound on an Event's reason (events.k8s.io/v1 validation)."""
MAX_MESSAGE = 1024
"""An Event's note is capped at 1 kB by events.k8s.io/v1; core/v1 takes more, but kubectl shows it on one line."""
_REASON = re.compile(r"[A-Z][A-Za-z0-9]*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True)
class EventParams:
    reason: str | None
    event_type: Literal["Normal", "Warning"] | None
    about: Literal["auto", "node"]


def _read(params: Mapping[str, object]) -> tuple[EventParams, list[str]]:
    p = Params(params, ("reason", "type", "about"))
    reason = p.string("reason", max_length=MAX_REASON)
    if reason is not None and not _REASON.fullmatch(reason):
        p.problem("reason", "must be UpperCamelCase letters and digits (as Kubernetes reasons are)")
        reason = None
    event_type = p.choice("type", ("Normal", "Warning", "auto"), "auto")
    about = p.choice("about", ("auto", "node"), "auto")
    return (
        EventParams(
            reason,
            None if event_type == "auto" else ("Normal" if event_type == "Normal" else "Warning"),
            "node" if about == "node" else "auto",
        ),
        p.errors,
    )


def reason_from_rule(rule: str) -> str:
    """A rule's name as an Event reason: its words in UpperCamelCase (``ephemeral-only`` -> ``EphemeralOnly``)."""
    words = re.findall(r"[A-Za-z0-9]+", rule)
    reason = "".join(w[:1].upper() + w[1:] for w in words) or "StorwatchPolicy"
    if not reason[0].isalpha():
        reason = "Rule" + reason
    return reason[:MAX_REASON]


def pod_of(entity: Entity) -> tuple[str, str] | str | None:
    """(namespace, pod) when the entity names a pod, None when it names none, or why its names are refused."""
    namespace, pod = entity.fields.get("namespace"), entity.fields.get("pod")
    if not namespace or not pod:
        return None
    if not isinstance(namespace, str) or not _DNS_LABEL.fullmatch(namespace):
        return "the entity's namespace is not a Kubernetes namespace name"
    if not isinstance(pod, str) or len(pod) > 253 or not _DNS_SUBDOMAIN.fullmatch(pod):
        return "the entity's pod is not a Kubernetes pod name"
    return namespace, pod


class EventAction:
    name = "event"

    def __init__(self, events: KubeEvents | None) -> None:
        """``events``: the agent's Events writer (on its shared client); None where the agent has no cluster."""
        self.events = events

    def check(self, params: Mapping[str, object]) -> list[str]:
        return _read(params)[1]

    def run(self, request: ActionRequest, timeout: float) -> ActionResult:
        params, errors = _read(request.params)
        if errors:
            return ActionResult("failed", "; ".join(errors))
        if self.events is None:
            return ActionResult("skipped", "no Kubernetes API: this agent has no cluster connection")
        resolved = request.transition == "resolved"
        reason = params.reason or reason_from_rule(request.rule)
        if resolved:
            reason = reason[: MAX_REASON - len("Resolved")] + "Resolved"
        event_type = params.event_type or ("Normal" if resolved or request.severity == "info" else "Warning")
        target = None if params.about == "node" else pod_of(acted_on(request.entity))  # an alert's: its run's
        if isinstance(target, str):
            return ActionResult("failed", target)
        message = request.message[:MAX_MESSAGE]
        if target is None:
            posted = self.events.post(reason, message, event_type=event_type)
            about = "Node"
        else:
            namespace, pod = target
            posted = self.events.post(reason, message, kind="Pod", name=pod, namespace=namespace, event_type=event_type)
            about = f"Pod {namespace}/{pod}"
        detail = f"{reason} about {about}: {posted}"
        if posted in ("created", "patched"):
            return ActionResult("ok", detail)
        if posted == "rate-limited":
            return ActionResult("rate_limited", detail)
        if posted == "disabled":
            off = self.events.client.off_reason or "no connection"
            return ActionResult("skipped", f"no Kubernetes API: {off}")
        return ActionResult("failed", detail + " (the agent's log has the API's answer)")
