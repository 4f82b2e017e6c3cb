"""The policy's area: the rules in force, how many entities each fires for, its evaluation errors, whether it was
disabled, how the last policy load went, and the actions run (storwatch_policy_*).

It renders a :class:`PolicyMetrics`, plain figures the policy engine (``storwatch.policy.engine.PolicyStatus.metrics``)
and the action runner's counts make: the exporter sits below the policy and the actions, and imports neither.
"""

from __future__ import annotations

from collections.abc import Iterator

from storwatch.exporter.area import PolicyMetrics, RuleMetrics
from storwatch.exporter.spec import Label, counter, gauge
from storwatch.exporter.text import Family

# -- the metrics this area writes (storwatch/exporter/catalog.py assembles them)

# -- policy: the rules in force, what fires, the actions run (storwatch/policy, storwatch/actions)

POLICY_SEVERITIES = ("info", "warning", "critical")
"""A rule's severities (storwatch.actions.base.SEVERITIES; the exporter sits below the actions, a test holds them
equal)."""
ACTION_OUTCOMES = ("ok", "dry_run", "skipped", "rate_limited", "failed")
"""An action's outcomes (storwatch.actions.base.OUTCOMES; likewise)."""
MAX_POLICY_RULES = 256
"""storwatch.policy.load.MAX_RULES (held equal by a test)."""
RULE = Label(
    "rule",
    f"one per rule of the policy in force, at most {MAX_POLICY_RULES} (storwatch/policy/load.py MAX_RULES), each "
    "name at most 64 letters, digits and _.:- (checked when the policy is loaded)",
)
POLICY_RULE_FIRING = gauge(
    "policy",
    "storwatch_policy_rule_firing",
    "Entities for which the rule fires now (its condition held for its for, or within its keep_firing_for), by the "
    "severity each fires with.",
    RULE,
    Label(
        "severity",
        "the rule's severity; every severity for a rule that takes each entity's own (severity: \"{severity}\")",
        POLICY_SEVERITIES,
    ),
)
POLICY_RULE_ERRORS = counter(
    "policy",
    "storwatch_policy_rule_errors_total",
    "Evaluations of the rule that gave no bool (a null compared, a missing key, a type with no such operator).",
    RULE,
)
POLICY_RULE_DISABLED = gauge(
    "policy",
    "storwatch_policy_rule_disabled",
    "1 when the engine stopped evaluating the rule: its evaluations over one View took longer than its time budget.",
    RULE,
)
POLICY_LAST_RELOAD_SUCCESS = gauge(
    "policy",
    "storwatch_policy_last_reload_success",
    "1 when the last policy load succeeded, 0 when it failed (the policy in force before stays).",
)
POLICY_ACTIONS = counter(
    "policy",
    "storwatch_policy_actions_total",
    "Actions the rules asked for, by rule, action and result.",
    RULE,
    Label("action", "one per action the agent has (log, event, webhook, request_checkpoint, sync; storwatch/actions)"),
    Label("result", "the outcomes of an action", ACTION_OUTCOMES),
)


def families(metrics: PolicyMetrics) -> Iterator[Family]:
    firing = POLICY_RULE_FIRING.family()
    errors = POLICY_RULE_ERRORS.family()
    disabled = POLICY_RULE_DISABLED.family()
    for name, rule in sorted(metrics.rules.items()):
        for severity, count in sorted(rule.firing.items()):
            firing.add((name, severity), count)
        errors.add((name,), rule.errors_total)
        disabled.add((name,), 1 if rule.disabled else 0)
    reload = POLICY_LAST_RELOAD_SUCCESS.family()
    reload.add((), 1 if metrics.last_reload_success else 0)
    actions = POLICY_ACTIONS.family()
    for (rule_name, action, result), count in sorted(metrics.actions.items()):
        actions.add((rule_name, action, result), count)
    yield from (firing, errors, disabled, reload, actions)


__all__ = ["PolicyMetrics", "RuleMetrics", "families"]
