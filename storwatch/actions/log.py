"""The ``log`` action: one line in the agent's log for a rule's transition, at the level of the rule's severity,
naming the rule, the entity and the message, every piece of data in it made printable."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from storwatch.actions.base import ActionRequest, ActionResult, Severity
from storwatch.actions.params import Params
from storwatch.printable import printable

log = logging.getLogger("storwatch.policy.actions")
"""The logger of every policy action line, so an operator can route them apart from the agent's own."""

LEVELS: Mapping[Severity, int] = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.CRITICAL}


def describe(request: ActionRequest) -> str:
    """The request in one printable line: rule, transition, entity and message (also what a dry run logs). A message
    that already begins by naming its entity ("run llama (...)") is not preceded by the name a second time."""
    entity = request.entity
    named = f"{entity.kind} {entity.key}"
    message = request.message
    head = f"rule {printable(request.rule)} {request.transition}: "
    if message == named or message.startswith((named + " ", named + ":")):
        return head + printable(message)
    return head + f"{entity.kind} {printable(entity.key)}: {printable(message)}"


class LogAction:
    name = "log"

    def check(self, params: Mapping[str, object]) -> list[str]:
        return Params(params, ()).errors

    def run(self, request: ActionRequest, timeout: float) -> ActionResult:
        # A resolution is news, not a problem: it is logged at INFO whatever the rule's severity.
        level = logging.INFO if request.transition == "resolved" else LEVELS[request.severity]
        # Made printable here as well as by the agent's formatter: a handler with another formatter (a test's, a
        # library user's) must not get a message that moves a terminal's cursor.
        log.log(level, "%s", describe(request))
        return ActionResult("ok")
