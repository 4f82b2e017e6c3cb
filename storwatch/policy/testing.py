"""``storwatch policy test``: test files of cases, as ``promtool test rules`` has for alerting rules. A case gives
entities over time (each present from a time until another, its fields changing at given times) and what is expected
at given times: the (rule, key) pairs firing then, and the actions the evaluation at that time requested.

A test file names its policy files (relative to itself) and is read as they are: YAML data only, every problem as
``FILE:LINE: FIELD: message``. Fields a case does not give are null where the schema allows it, else false, 0, an
empty string or list: a case names only what its rules read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from storwatch.actions.base import ENTITY_KINDS, Entity, EntityKind, FieldValue
from storwatch.policy.engine import Engine
from storwatch.policy.load import (
    ACTION_NAMES_ONLY,
    ActionChecks,
    PolicyError,
    _Errors,
    _loader,
    _mapping,
    _plain,
    _tag_problems,
    load_policy,
    parse_duration,
    read_policy_file,
)
from storwatch.policy.schema import SCHEMA, type_problem

if TYPE_CHECKING:
    import yaml

MAX_STEPS = 100_000
"""Evaluations in one case (its duration over its interval)."""
START = 1_800_000_000.0
"""The clock of a case: its time 0 (a View's time is seconds since the epoch)."""


@dataclass
class _Input:
    kind: EntityKind
    key: str
    fields: dict[str, FieldValue]
    start: float
    until: float
    changes: list[tuple[float, dict[str, FieldValue]]] = field(default_factory=list)

    def at(self, t: float) -> Entity | None:
        if not (self.start <= t < self.until):
            return None
        fields = dict(self.fields)
        for when, change in self.changes:
            if when <= t:
                fields.update(change)
        return Entity(self.kind, self.key, fields)


@dataclass
class _Expect:
    at: float
    line: int
    path: str
    firing: set[tuple[str, str]] | None
    actions: list[tuple[str, str, str, str]] | None


@dataclass
class _Case:
    name: str
    interval: float
    duration: float
    inputs: list[_Input]
    expects: list[_Expect]


def _default(kind: EntityKind, name: str) -> FieldValue:
    f = SCHEMA[kind].field(name)
    if f.nullable:
        return None
    zero: dict[str, FieldValue] = {"bool": False, "int": 0, "double": 0.0, "string": ""}
    if f.type in zero:
        return zero[f.type]
    return () if f.type == "list<string>" else {}


def _key_of(kind: EntityKind, fields: Mapping[str, FieldValue]) -> str | None:
    source = {
        "mount": "mountpoint",
        "run": "run",
        "gpu": "uuid",
        "finding": "id",
        "alert": "fingerprint",
    }
    if kind == "node":
        return "node"
    if kind == "workload":
        return f"pid:{fields.get('pid')}"
    value = fields.get(source[kind])
    return value if isinstance(value, str) and value else None


def _seconds(text: float) -> str:
    return f"{text:g}s"


class _Reader:
    def __init__(self, where: str) -> None:
        self.where = where
        self.errors = _Errors()

    def fields(self, kind: EntityKind, node: yaml.Node, path: str) -> dict[str, FieldValue] | None:
        entries = _mapping(node, self.where, path, self.errors, None)
        if entries is None:
            return None
        out: dict[str, FieldValue] = {}
        spec = SCHEMA[kind]
        ok = True
        for name, (k, v) in entries.items():
            if name not in spec.names:
                self.errors.add(self.where, k, f"{path}.{name}", f"not a field of {kind}")
                ok = False
                continue
            f = spec.field(name)
            value = _plain(v)
            if f.type == "double" and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # 3600 in a case means 3600.0
            if isinstance(value, list):
                value = tuple(value)
            problem = type_problem(f, value)
            if problem:
                self.errors.add(self.where, v, f"{path}.{name}", problem)
                ok = False
                continue
            out[name] = cast(FieldValue, value)
        return out if ok else None

    def duration(self, node: yaml.Node, path: str) -> float | None:
        try:
            return parse_duration(_plain(node))
        except ValueError as err:
            self.errors.add(self.where, node, path, str(err))
            return None

    def case(self, node: yaml.Node, path: str, interval: float) -> _Case | None:
        import yaml

        known = ("name", "interval", "duration", "entities", "expect")
        entries = _mapping(node, self.where, path, self.errors, known)
        if entries is None:
            return None
        before = len(self.errors.items)
        for required in ("name", "duration", "expect"):
            if required not in entries:
                self.errors.add(self.where, node, path, f"missing required field: {required}")
        if len(self.errors.items) > before:
            return None
        name = str(_plain(entries["name"][1]))
        if "interval" in entries:
            interval = self.duration(entries["interval"][1], f"{path}.interval") or interval
        duration = self.duration(entries["duration"][1], f"{path}.duration")
        if duration is None:
            return None
        if interval <= 0 or duration / interval > MAX_STEPS:
            self.errors.add(
                self.where, node, path, f"interval must be above 0 and duration/interval at most {MAX_STEPS}"
            )
            return None
        inputs: list[_Input] = []
        ents = entries.get("entities")
        if ents is not None:
            if not isinstance(ents[1], yaml.SequenceNode):
                self.errors.add(self.where, ents[1], f"{path}.entities", "expected a list")
                return None
            for i, item in enumerate(ents[1].value):
                one = self.entity(item, f"{path}.entities[{i}]", duration)
                if one is not None:
                    inputs.append(one)
        expects: list[_Expect] = []
        exp = entries["expect"][1]
        if not isinstance(exp, yaml.SequenceNode):
            self.errors.add(self.where, exp, f"{path}.expect", "expected a list")
            return None
        for i, item in enumerate(exp.value):
            one_exp = self.expect(item, f"{path}.expect[{i}]", interval, duration)
            if one_exp is not None:
                expects.append(one_exp)
        if len(self.errors.items) > before:
            return None
        return _Case(name, interval, duration, inputs, expects)

    def entity(self, node: yaml.Node, path: str, duration: float) -> _Input | None:
        import yaml

        entries = _mapping(node, self.where, path, self.errors, ("kind", "key", "fields", "from", "until", "changes"))
        if entries is None:
            return None
        if "kind" not in entries:
            self.errors.add(self.where, node, path, "missing required field: kind")
            return None
        kind = _plain(entries["kind"][1])
        if kind not in ENTITY_KINDS:
            self.errors.add(
                self.where, entries["kind"][1], f"{path}.kind", f"{kind!r} is not one of {', '.join(ENTITY_KINDS)}"
            )
            return None
        given = self.fields(kind, entries["fields"][1], f"{path}.fields") if "fields" in entries else {}
        if given is None:
            return None
        fields = {f.name: given.get(f.name, _default(kind, f.name)) for f in SCHEMA[kind].fields}
        key = _plain(entries["key"][1]) if "key" in entries else _key_of(kind, fields)
        if not isinstance(key, str) or not key:
            self.errors.add(self.where, node, path, f"give a key (a string), or the field that keys a {kind}")
            return None
        start = self.duration(entries["from"][1], f"{path}.from") if "from" in entries else 0.0
        until = self.duration(entries["until"][1], f"{path}.until") if "until" in entries else math.inf
        if start is None or until is None:
            return None
        one = _Input(kind, key, fields, start, until)
        if "changes" in entries:
            changes = entries["changes"][1]
            if not isinstance(changes, yaml.SequenceNode):
                self.errors.add(self.where, changes, f"{path}.changes", "expected a list of {at, fields}")
                return None
            for i, item in enumerate(changes.value):
                sub = f"{path}.changes[{i}]"
                c = _mapping(item, self.where, sub, self.errors, ("at", "fields"))
                if c is None or "at" not in c or "fields" not in c:
                    if c is not None:
                        self.errors.add(self.where, item, sub, "give at and fields")
                    return None
                at = self.duration(c["at"][1], f"{sub}.at")
                changed = self.fields(kind, c["fields"][1], f"{sub}.fields")
                if at is None or changed is None:
                    return None
                one.changes.append((at, changed))
            one.changes.sort(key=lambda c: c[0])
        return one

    def expect(self, node: yaml.Node, path: str, interval: float, duration: float) -> _Expect | None:
        import yaml

        entries = _mapping(node, self.where, path, self.errors, ("at", "firing", "actions"))
        if entries is None:
            return None
        if "at" not in entries:
            self.errors.add(self.where, node, path, "missing required field: at")
            return None
        at = self.duration(entries["at"][1], f"{path}.at")
        if at is None:
            return None
        steps = at / interval
        if at > duration or abs(steps - round(steps)) > 1e-9:
            self.errors.add(
                self.where,
                entries["at"][1],
                f"{path}.at",
                f"not an evaluation time (a multiple of {_seconds(interval)} up to {_seconds(duration)})",
            )
            return None
        firing: set[tuple[str, str]] | None = None
        actions: list[tuple[str, str, str, str]] | None = None
        if "firing" in entries:
            items = entries["firing"][1]
            firing = set()
            if not isinstance(items, yaml.SequenceNode):
                self.errors.add(self.where, items, f"{path}.firing", "expected a list of {rule, key}")
                return None
            for i, item in enumerate(items.value):
                m = _mapping(item, self.where, f"{path}.firing[{i}]", self.errors, ("rule", "key"))
                if m is None or set(m) != {"rule", "key"}:
                    if m is not None:
                        self.errors.add(self.where, item, f"{path}.firing[{i}]", "give rule and key")
                    return None
                firing.add((str(_plain(m["rule"][1])), str(_plain(m["key"][1]))))
        if "actions" in entries:
            items = entries["actions"][1]
            actions = []
            if not isinstance(items, yaml.SequenceNode):
                self.errors.add(
                    self.where, items, f"{path}.actions", "expected a list of {rule, action, key, transition}"
                )
                return None
            for i, item in enumerate(items.value):
                sub = f"{path}.actions[{i}]"
                m = _mapping(item, self.where, sub, self.errors, ("rule", "action", "key", "transition"))
                if m is None or not {"rule", "action", "key"} <= set(m):
                    if m is not None:
                        self.errors.add(self.where, item, sub, "give rule, action and key (and transition)")
                    return None
                transition = str(_plain(m["transition"][1])) if "transition" in m else "firing"
                if transition not in ("firing", "repeat", "resolved"):
                    self.errors.add(self.where, m["transition"][1], f"{sub}.transition", "firing, repeat or resolved")
                    return None
                actions.append(
                    (str(_plain(m["rule"][1])), str(_plain(m["action"][1])), str(_plain(m["key"][1])), transition)
                )
        return _Expect(at, node.start_mark.line + 1, path, firing, actions)


@dataclass(frozen=True)
class TestResult:
    file: str
    cases: int
    failures: tuple[str, ...]
    """Each failed expectation, ``FILE:LINE: FIELD: what differs``."""


def run_test_file(path: str, checks: ActionChecks = ACTION_NAMES_ONLY) -> TestResult:
    """Run every case of a test file against its policy files; a PolicyError when the file or its policy cannot be
    loaded."""
    import yaml

    text = read_policy_file(path)
    reader = _Reader(path)
    try:
        node = yaml.compose(text, Loader=_loader())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        reader.errors.add(
            path,
            None,
            "",
            f"invalid YAML: {getattr(err, 'problem', None) or err}",
            line=mark.line + 1 if mark else None,
        )
        raise PolicyError(reader.errors.items) from None
    if node is None:
        raise PolicyError([f"{path}: empty: a test file gives rule_files and tests"])
    _tag_problems(node, path, "", reader.errors)
    if reader.errors.items:
        raise PolicyError(reader.errors.items)
    top = _mapping(node, path, "", reader.errors, ("rule_files", "interval", "tests"))
    if top is None or reader.errors.items:
        raise PolicyError(reader.errors.items)
    for required in ("rule_files", "tests"):
        if required not in top:
            reader.errors.add(path, node, "", f"missing required field: {required}")
    if reader.errors.items:
        raise PolicyError(reader.errors.items)
    files = _plain(top["rule_files"][1])
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        reader.errors.add(path, top["rule_files"][1], "rule_files", "expected a list of policy files")
        raise PolicyError(reader.errors.items)
    interval = 60.0
    if "interval" in top:
        interval = reader.duration(top["interval"][1], "interval") or interval
    tests = top["tests"][1]
    cases: list[_Case] = []
    if not isinstance(tests, yaml.SequenceNode):
        reader.errors.add(path, tests, "tests", "expected a list of cases")
    else:
        for i, item in enumerate(tests.value):
            one = reader.case(item, f"tests[{i}]", interval)
            if one is not None:
                cases.append(one)
    if reader.errors.items:
        raise PolicyError(reader.errors.items)
    here = os.path.dirname(path)
    policy = load_policy([os.path.join(here, f) for f in cast(list[str], files)], checks)
    failures: list[str] = []
    for case in cases:
        failures += _run_case(path, policy, case)
    return TestResult(path, len(cases), tuple(failures))


def _run_case(path: str, policy: Any, case: _Case) -> list[str]:
    # The time budget is not what a case tests: a slow machine must not disable a rule mid-case.
    engine = Engine(policy, budget_seconds=math.inf)
    expects: dict[int, list[_Expect]] = {}
    for e in case.expects:
        expects.setdefault(round(e.at / case.interval), []).append(e)
    failures: list[str] = []
    steps = round(case.duration / case.interval)
    for step in range(steps + 1):
        t = step * case.interval
        ents: dict[EntityKind, list[Entity]] = {kind: [] for kind in ENTITY_KINDS}
        for one in case.inputs:
            entity = one.at(t)
            if entity is not None:
                ents[entity.kind].append(entity)
        requests = engine.evaluate(ents, START + t)
        for e in expects.get(step, ()):
            where = f"{path}:{e.line}: {e.path}"
            if e.firing is not None:
                got = {(a.rule, a.key) for a in engine.status().active if a.state == "firing"}
                if got != e.firing:
                    failures.append(
                        f"{where}: case {case.name!r} at {_seconds(t)}: firing: expected {_pairs(e.firing)}, got "
                        f"{_pairs(got)}"
                    )
            if e.actions is not None:
                got_actions = sorted((r.rule, r.action, r.entity.key, r.transition) for r in requests)
                if got_actions != sorted(e.actions):
                    failures.append(
                        f"{where}: case {case.name!r} at {_seconds(t)}: actions: expected {_quads(e.actions)}, got "
                        f"{_quads(got_actions)}"
                    )
    return failures


def _pairs(pairs: set[tuple[str, str]]) -> str:
    return "[" + ", ".join(f"{r} {k}" for r, k in sorted(pairs)) + "]"


def _quads(quads: Sequence[tuple[str, str, str, str]]) -> str:
    return "[" + ", ".join(f"{r} {a} {k} {t}" for r, a, k, t in sorted(quads)) + "]"


__all__ = ["START", "TestResult", "run_test_file"]
