"""Every PromQL expression the checked-in alerts/ and dashboards/ hold, parsed with ``promql-parser``, and the series
selectors inside each: what tests/test_mixin.py checks against the metric catalog and tests/test_mixin_e2e.py
evaluates against a real Prometheus.

Grafana's variables are replaced by what they stand for when every value is chosen: ``$cluster``, ``$node`` and
``$run`` by ``.*`` (they only appear inside ``=~`` matchers), ``$__rate_interval`` by a fixed range.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import promql_parser
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
RULES_FILE = REPO_ROOT / "alerts" / "storwatch.rules.yaml"
DASHBOARDS = REPO_ROOT / "dashboards"
RATE_INTERVAL = "1m"
PROMETHEUS_OWN = frozenset({"up"})
"""Series Prometheus writes itself for each target, not the agent."""


@dataclass(frozen=True)
class Expression:
    where: str
    """Which file and rule, panel or variable holds it."""
    promql: str
    """As evaluated: Grafana's variables replaced."""
    kind: str
    """``record``, ``alert``, ``panel`` or ``variable``."""
    name: str = ""
    """The recording rule's or alert's name."""


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]
    """(label, operator, value) of each matcher but the name."""
    text: str


def grafana_to_promql(expr: str) -> str:
    out = expr.replace("$__rate_interval", RATE_INTERVAL)
    for var in ("cluster", "node", "run", "instance"):
        out = re.sub(rf"\$\{{?{var}\}}?", ".*", out)
    assert "$" not in out, f"a Grafana variable left in {expr!r}"
    return out


def rule_groups() -> list[dict[str, object]]:
    groups: list[dict[str, object]] = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))["groups"]
    return groups


def rule_expressions() -> list[Expression]:
    out = []
    for group in rule_groups():
        for rule in group["rules"]:  # type: ignore[attr-defined]
            kind = "record" if "record" in rule else "alert"
            name = rule[kind]
            out.append(Expression(f"{RULES_FILE.name}: {name}", rule["expr"], kind, name))
    return out


_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>\w+)\)$")


def dashboard_expressions() -> list[Expression]:
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for panel in doc["panels"]:
            for target in panel.get("targets", []):
                out.append(
                    Expression(
                        f"{path.name}: {panel['title']} ({target['refId']})", grafana_to_promql(target["expr"]), "panel"
                    )
                )
        for var in doc["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = _LABEL_VALUES.match(var["query"])
            assert m is not None, f"{path.name}: variable {var['name']}: not label_values(SELECTOR, LABEL)"
            out.append(Expression(f"{path.name}: ${var['name']}", grafana_to_promql(m["selector"]), "variable"))
    return out


def recorded_names() -> frozenset[str]:
    return frozenset(e.name for e in rule_expressions() if e.kind == "record")


def selectors(promql: str) -> list[Selector]:
    """Every series selector in the expression (those of range selectors included)."""
    found: list[Selector] = []

    def visit(node: promql_parser.Expr) -> None:
        vs = node.vector_selector if isinstance(node, promql_parser.MatrixSelector) else node
        if isinstance(vs, promql_parser.VectorSelector):
            assert vs.name, f"a selector without a metric name in {promql!r}"
            matchers = tuple((m.name, _OPS[str(m.op)], m.value) for m in vs.matchers.matchers if m.name != "__name__")
            sel = Selector(vs.name, matchers, str(vs))
            if sel not in found:
                found.append(sel)

    promql_parser.walk(promql_parser.parse(promql), visit)
    return found


_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}
