"""Policy files: YAML data (rules, macros, lists, overrides), loaded in order and checked whole, every problem named
as ``FILE:LINE: FIELD: message``.

A file is composed with PyYAML's SafeLoader, bounded in size, depth and nodes, and never constructed as Python
objects: only the plain tags (strings, numbers, booleans, null, lists, mappings) are taken, any other tag
(``!!python/object``...) is refused where it stands. Unknown fields and keys given twice are errors. A rule's
condition is checked by storwatch.policy.cel against the fields of its entity kind (storwatch.policy.schema); its
actions' names and params by checks passed in (``ActionChecks``: the actions package's, once the agent wires it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from storwatch import words
from storwatch.actions.base import ACTION_NAMES, ENTITY_KINDS, SEVERITIES, Entity, EntityKind, FieldValue, Severity
from storwatch.config import bounded_loader
from storwatch.policy.cel import (
    DEFAULT_BOUNDS,
    RESERVED,
    Bounds,
    CelError,
    Expression,
    compile_expression,
    expand,
    size_of,
)
from storwatch.policy.schema import SCHEMA, SEVERITY_FIELDS

if TYPE_CHECKING:
    import yaml

ActionCheck = Callable[[Mapping[str, object]], list[str]]
"""An action's check of a rule's params: the problems, each naming the field (storwatch.actions.base.Action.check)."""
ActionChecks = Mapping[str, ActionCheck]


def _names_only(params: Mapping[str, object]) -> list[str]:
    """Takes any params: the action's own check, wired by the agent, judges them."""
    return []


ACTION_NAMES_ONLY: ActionChecks = {name: _names_only for name in ACTION_NAMES}
"""The actions a policy may name, their params not checked here: what ``policy check`` uses until the actions
package's checks are passed in (the agent passes each action's ``check``)."""

MAX_FILE_BYTES = 1 << 20
MAX_YAML_DEPTH = 16
MAX_YAML_NODES = 100_000
MAX_RULES = 256
"""Rules in a policy, all files together: each is a value of the ``rule`` label of storwatch_policy_*."""
RULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
"""A rule's name: also a label value, so short and plain."""
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_LABELS = 16
MAX_LABEL_VALUE_CHARS = 256
MAX_MESSAGE_CHARS = 1024
MAX_ACTIONS = 8
MAX_MACROS = 256
MAX_LISTS = 256
MAX_REPEAT_ON = 8
"""Fields a rule's ``repeat_on`` may name."""
MAX_DURATION_SECONDS = 30 * 86400.0
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(ms|s|m|h|d|w))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map"))
RULE_FIELDS = (
    "name",
    "on",
    "when",
    "for",
    "keep_firing_for",
    "severity",
    "labels",
    "message",
    "actions",
    "cooldown",
    "repeat_on",
    "enabled",
    "dry_run",
)
APPENDABLE = frozenset({"when", "actions", "labels"})
"""What ``override: {FIELD: append}`` extends: ``when`` is and-ed, actions and labels added."""
REPLACEABLE = frozenset(RULE_FIELDS) - {"name", "on"}
"""What ``override: {FIELD: replace}`` may replace (a rule's kind stays: its condition reads that kind's fields)."""


class PolicyError(ValueError):
    """A policy that cannot be loaded: every problem found, each ``FILE:LINE: FIELD: message``."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


@dataclass(frozen=True)
class ActionSpec:
    action: str
    params: Mapping[str, object]


@dataclass(frozen=True, eq=False)
class Rule:
    """A rule as loaded: its condition compiled (macros expanded), its overrides applied."""

    name: str
    on: EntityKind
    when: str
    """The condition as compiled: macros expanded, appended conditions and-ed."""
    expression: Expression
    for_seconds: float = 0.0
    keep_firing_for_seconds: float = 0.0
    severity: Severity = "warning"
    """Its severity, unless ``severity_field`` takes each entity's own."""
    severity_field: str | None = None
    """``severity: "{FIELD}"``: each entity's severity is that field's value (storwatch.policy.schema
    SEVERITY_FIELDS), warning where it is no severity."""
    labels: Mapping[str, str] = field(default_factory=dict)
    message: str = ""
    """The template: ``{field}`` filled from the entity (render with :func:`render_message`)."""
    actions: tuple[ActionSpec, ...] = ()
    cooldown_seconds: float = 0.0
    """While firing, the actions run again at most this often; a new firing within it of the last run is not
    announced again. 0: only when it starts firing and when it resolves."""
    repeat_on: tuple[str, ...] = ()
    """Fields of its kind: while it fires, the actions run again whenever one of them changes (a run's newest
    ``checkpoint``), whatever the cooldown."""
    enabled: bool = True
    dry_run: bool = False
    where: str = ""
    """``FILE:LINE`` of its definition."""

    @property
    def severity_shown(self) -> str:
        """Its severity as a person reads it in a list of rules: the severity, or ``{FIELD}`` (each entity's own)."""
        return self.severity if self.severity_field is None else f"{{{self.severity_field}}}"

    def severity_of(self, entity: Entity) -> Severity:
        """The severity of its firing for ``entity``."""
        if self.severity_field is None:
            return self.severity
        value = entity.fields.get(self.severity_field)
        return next((s for s in SEVERITIES if s == value), "warning")

    def definition(self) -> tuple[object, ...]:
        """Everything that decides what the rule does: a reload keeps the state of a rule whose name and definition
        are the same."""
        return (
            self.name,
            self.on,
            self.when,
            self.for_seconds,
            self.keep_firing_for_seconds,
            self.severity,
            self.severity_field,
            tuple(sorted(self.labels.items())),
            self.message,
            tuple((a.action, _frozen(a.params)) for a in self.actions),
            self.cooldown_seconds,
            self.repeat_on,
            self.enabled,
            self.dry_run,
        )


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...] = ()
    lists: Mapping[str, tuple[FieldValue, ...]] = field(default_factory=dict)
    """Each list by name, a variable of every condition."""
    files: tuple[str, ...] = ()

    def rule(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)


def _frozen(value: object) -> object:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


# -- reading YAML with its lines


def _loader() -> type[yaml.SafeLoader]:
    """The configuration's bounded SafeLoader, at a policy file's bounds."""
    return bounded_loader(MAX_YAML_DEPTH, MAX_YAML_NODES)


class _Errors:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, node: yaml.Node | None, path: str, message: str, line: int | None = None) -> None:
        if line is None:
            line = node.start_mark.line + 1 if node is not None else 0
        at = f"{where}:{line}" if line else where
        self.items.append(f"{at}: {path or '(top level)'}: {message}")


def _tag_problems(node: yaml.Node, where: str, path: str, errors: _Errors) -> None:
    """Every node whose tag is not plain data, named where it is."""
    import yaml

    if node.tag not in _PLAIN_TAGS:
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        why = "a date: quote it" if tag == "!!timestamp" else "a policy file is plain data"
        errors.add(where, node, path, f"the tag {tag} is refused ({why})")
        return
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if k.tag not in _PLAIN_TAGS:
                _tag_problems(k, where, path, errors)
                continue
            name = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
            _tag_problems(v, where, f"{path}.{name}" if path else name, errors)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _tag_problems(item, where, f"{path}[{i}]", errors)


def _scalar(node: yaml.Node) -> object:
    import yaml

    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)


def _plain(node: yaml.Node) -> object:
    """A node of plain tags as Python data (checked by _tag_problems first)."""
    return _scalar(node)


def _mapping(
    node: yaml.Node, where: str, path: str, errors: _Errors, known: Sequence[str] | None
) -> dict[str, tuple[yaml.Node, yaml.Node]] | None:
    """A mapping's entries by key (key node, value node); None (and an error) when it is no mapping. ``known``: the
    only keys allowed."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        errors.add(where, node, path, "expected a mapping")
        return None
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for k, v in node.value:
        if not isinstance(k, yaml.ScalarNode):
            errors.add(where, k, path, "a key must be a name")
            continue
        # A key is read as written: YAML 1.1 would make the key ``on`` (a rule's entity kind) the boolean true.
        key = str(k.value)
        sub = f"{path}.{key}" if path else key
        if known is not None and key not in known:
            errors.add(where, k, sub, f"unknown field; known: {', '.join(known)}")
            continue
        if key in out:
            errors.add(where, k, sub, f"given twice (first on line {out[key][0].start_mark.line + 1})")
            continue
        out[key] = (k, v)
    return out


def parse_duration(value: object) -> float:
    """Seconds from a number of seconds or a string such as ``90s``, ``5m``, ``1h30m``; a ValueError says why not."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration (seconds, or such as 5m), got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION.fullmatch(value.strip()):
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value.strip()))
    else:
        raise ValueError(f"expected a duration (seconds, or such as 90s, 5m, 1h30m), got {value!r}")
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"must be from 0 to {MAX_DURATION_SECONDS:g} seconds (30 days), got {value!r}")
    return seconds


# -- message templates

_TEMPLATE_PART = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def template_problems(template: str, names: frozenset[str]) -> list[str]:
    """What is wrong with a message template: a ``{name}`` that is no field, anything else in braces, a lone brace."""
    out = []
    for m in _TEMPLATE_PART.finditer(template):
        token = m.group(0)
        if token in ("{{", "}}"):
            continue
        if m.group(1) is None:
            out.append(f"a lone {token!r} (write {token * 2} for a brace)")
        elif not IDENTIFIER.fullmatch(m.group(1)):
            out.append(f"{{{m.group(1)}}}: only a field's name may stand in braces")
        elif m.group(1) not in names:
            out.append(f"{{{m.group(1)}}}: not a field of the entity")
    return out


def field_text(value: FieldValue, name: str = "") -> str:
    """A field's value as a message shows it, in words (storwatch.words) by the unit its name carries: ``*_seconds``
    a length of time, ``bytes`` and ``*_bytes`` a size, ``*_ratio`` and ``*_share*`` a percentage; null is
    "unknown" and an infinite figure "unbounded", never ``null`` or ``inf``."""
    if value is None:
        return words.UNKNOWN
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if name.endswith("_seconds"):
            return words.span(float(value))
        if name == "bytes" or name.endswith("_bytes"):
            return words.size(value)
        if name.endswith("_ratio") or "_share" in name:
            return words.share(float(value))
        return words.number(float(value))
    if isinstance(value, (tuple, list)):
        return ", ".join(field_text(v) for v in value) or "none"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={field_text(v)}" for k, v in value.items()) or "none"
    return str(value)


def render_message(template: str, fields: Mapping[str, FieldValue]) -> str:
    """The template with each ``{field}`` replaced by the field's value (a checked template names only fields), made
    printable (fields hold tenants' text) and bounded."""
    from storwatch.printable import printable

    def one(m: re.Match[str]) -> str:
        token = m.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        name = m.group(1)
        return field_text(fields.get(name), name) if name is not None else token

    text = printable(_TEMPLATE_PART.sub(one, template))
    return text if len(text) <= 4 * MAX_MESSAGE_CHARS else text[: 4 * MAX_MESSAGE_CHARS - 3] + "..."


# -- the loader


@dataclass
class _Draft:
    """A rule between the files: its fields as given (the condition not compiled yet)."""

    name: str
    on: EntityKind
    when: str
    when_line: int
    when_offset_line: int | None
    """Where the condition's first character is, for a column mapped to a line (literal block scalars); None when
    lines cannot be mapped (an override and-ed to it, a folded scalar)."""
    where: str
    line: int
    path: str
    """Where its condition was last given: ``rules[N]`` of ``where``."""
    values: dict[str, Any] = field(default_factory=dict)


class _Loader:
    def __init__(self, checks: ActionChecks, bounds: Bounds) -> None:
        self.checks = checks
        self.bounds = bounds
        self.errors = _Errors()
        self.drafts: dict[str, _Draft] = {}
        self.macros: dict[str, str] = {}
        self.macro_where: dict[str, tuple[str, int]] = {}
        self.lists: dict[str, tuple[FieldValue, ...]] = {}
        self.list_where: dict[str, tuple[str, int]] = {}

    def file(self, where: str, text: str) -> None:
        import yaml

        try:
            node = yaml.compose(text, Loader=_loader())
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            problem = getattr(err, "problem", None) or str(err)
            self.errors.add(where, None, "", f"invalid YAML: {problem}", line=mark.line + 1 if mark else None)
            return
        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
            return  # an empty file: nothing in it
        before = len(self.errors.items)
        _tag_problems(node, where, "", self.errors)
        if len(self.errors.items) > before:
            return
        top = _mapping(node, where, "", self.errors, ("rules", "macros", "lists"))
        if top is None:
            return
        if "lists" in top:
            self._lists(where, top["lists"][1])
        if "macros" in top:
            self._macros(where, top["macros"][1])
        if "rules" in top:
            rules = top["rules"][1]
            if not isinstance(rules, yaml.SequenceNode):
                self.errors.add(where, rules, "rules", "expected a list of rules")
                return
            for i, item in enumerate(rules.value):
                self._rule(where, item, f"rules[{i}]")

    def _name(self, where: str, key: yaml.Node, path: str, kind: str) -> str | None:
        name = str(key.value)
        if not IDENTIFIER.fullmatch(name) or name in RESERVED or name in ("true", "false", "null", "in"):
            self.errors.add(where, key, path, f"{name!r} is not a name a {kind} can have (letters, digits, _)")
            return None
        fields = {f for spec in SCHEMA.values() for f in spec.names}
        if name in fields:
            self.errors.add(where, key, path, f"{name!r} is the name of an entity's field")
            return None
        if name in self.macros or name in self.lists:
            first = self.macro_where.get(name) or self.list_where.get(name)
            at = f" (first at {first[0]}:{first[1]})" if first else ""
            self.errors.add(where, key, path, f"{name!r} is already defined{at}")
            return None
        return name

    def _lists(self, where: str, node: yaml.Node) -> None:
        import yaml

        entries = _mapping(node, where, "lists", self.errors, None)
        for name_text, (key, value) in (entries or {}).items():
            path = f"lists.{name_text}"
            if len(self.lists) >= MAX_LISTS:
                self.errors.add(where, key, path, f"more than {MAX_LISTS} lists")
                return
            name = self._name(where, key, path, "list")
            if name is None:
                continue
            if not isinstance(value, yaml.SequenceNode):
                self.errors.add(where, value, path, "expected a list of strings, numbers or booleans")
                continue
            items = []
            ok = True
            for i, item in enumerate(value.value):
                v = _plain(item) if isinstance(item, yaml.ScalarNode) else None
                if v is None or not isinstance(v, (str, int, float, bool)):
                    self.errors.add(where, item, f"{path}[{i}]", "expected a string, number or boolean")
                    ok = False
                    continue
                items.append(cast(FieldValue, v))
            if len(items) > self.bounds.max_list_items:
                self.errors.add(where, value, path, f"{len(items)} items, more than {self.bounds.max_list_items}")
                ok = False
            if ok:
                self.lists[name] = tuple(items)
                self.list_where[name] = (where, key.start_mark.line + 1)

    def _macros(self, where: str, node: yaml.Node) -> None:
        import yaml

        entries = _mapping(node, where, "macros", self.errors, None)
        for name_text, (key, value) in (entries or {}).items():
            path = f"macros.{name_text}"
            if len(self.macros) >= MAX_MACROS:
                self.errors.add(where, key, path, f"more than {MAX_MACROS} macros")
                return
            name = self._name(where, key, path, "macro")
            if name is None:
                continue
            text = _plain(value) if isinstance(value, yaml.ScalarNode) else None
            if not isinstance(text, str) or not text.strip():
                self.errors.add(where, value, path, "expected a CEL expression (a string)")
                continue
            try:
                # Its syntax and bounds alone: the names it reads, and what an evaluation can hold and cost, are
                # checked in each rule that uses it, with the sizes of that rule's fields.
                from storwatch.policy.cel import analyse

                analyse(text, None, self.bounds, estimated=False)
            except CelError as err:
                self.errors.add(where, value, path, f"CEL: {err}")
                continue
            self.macros[name] = text
            self.macro_where[name] = (where, key.start_mark.line + 1)

    def _rule(self, where: str, node: yaml.Node, path: str) -> None:
        entries = _mapping(node, where, path, self.errors, (*RULE_FIELDS, "override"))
        if entries is None:
            return
        if "name" not in entries:
            self.errors.add(where, node, path, "missing required field: name")
            return
        name_node = entries["name"][1]
        name = _plain(name_node)
        if not isinstance(name, str) or not RULE_NAME.fullmatch(name):
            self.errors.add(
                where, name_node, f"{path}.name", "a name of 1 to 64 letters, digits and _.:- (a label value)"
            )
            return
        if "override" in entries:
            self._override(where, name, entries, path)
            return
        if name in self.drafts:
            first = self.drafts[name]
            self.errors.add(
                where,
                name_node,
                f"{path}.name",
                f"rule defined twice (first at {first.where}:{first.line}); to change it, give override",
            )
            return
        for required in ("on", "when"):
            if required not in entries:
                self.errors.add(where, node, path, f"missing required field: {required}")
                return
        on_node = entries["on"][1]
        on = _plain(on_node)
        if on not in ENTITY_KINDS:
            self.errors.add(where, on_node, f"{path}.on", f"{on!r} is not one of {', '.join(ENTITY_KINDS)}")
            return
        when_node = entries["when"][1]
        when = _plain(when_node)
        if not isinstance(when, str) or not when.strip():
            self.errors.add(where, when_node, f"{path}.when", "expected a CEL expression (a string)")
            return
        offset = when_node.start_mark.line + 2 if getattr(when_node, "style", None) == "|" else None
        if getattr(when_node, "style", None) is None and "\n" not in when:
            offset = when_node.start_mark.line + 1
        draft = _Draft(
            name,
            on,
            when,
            when_node.start_mark.line + 1,
            offset,
            where,
            node.start_mark.line + 1,
            path,
        )
        values = self._fields(where, entries, path, draft.on, exclude=("name", "on", "when"))
        if values is None:
            return
        draft.values = values
        if len(self.drafts) >= MAX_RULES:
            self.errors.add(where, node, path, f"more than {MAX_RULES} rules (each is a value of a metric's label)")
            return
        self.drafts[name] = draft

    def _fields(
        self,
        where: str,
        entries: Mapping[str, tuple[yaml.Node, yaml.Node]],
        path: str,
        on: EntityKind,
        exclude: Sequence[str],
    ) -> dict[str, Any] | None:
        """The rule's other fields, checked; None when one is wrong (its error added)."""
        out: dict[str, Any] = {}
        before = len(self.errors.items)
        for key, (_k, v) in entries.items():
            if key in exclude or key == "override":
                continue
            sub = f"{path}.{key}"
            value = _plain(v)
            if key in ("for", "keep_firing_for", "cooldown"):
                try:
                    out[key] = parse_duration(value)
                except ValueError as err:
                    self.errors.add(where, v, sub, str(err))
            elif key == "severity":
                own = SEVERITY_FIELDS.get(on)
                if value in SEVERITIES or (own is not None and value == f"{{{own}}}"):
                    out[key] = value
                else:
                    also = f', or "{{{own}}}" (each {on}\'s own)' if own else ""
                    self.errors.add(where, v, sub, f"{value!r} is not one of {', '.join(SEVERITIES)}{also}")
            elif key == "repeat_on":
                names = SCHEMA[on].names
                if (
                    not isinstance(value, list)
                    or not value
                    or len(value) > MAX_REPEAT_ON
                    or not all(isinstance(n, str) for n in value)
                ):
                    self.errors.add(where, v, sub, f"expected a list of 1 to {MAX_REPEAT_ON} fields of {on}")
                elif unknown := [n for n in value if n not in names]:
                    self.errors.add(where, v, sub, f"{', '.join(map(repr, unknown))}: not a field of {on}")
                elif len(set(value)) != len(value):
                    self.errors.add(where, v, sub, "a field is named twice")
                else:
                    out[key] = tuple(value)
            elif key in ("enabled", "dry_run"):
                if not isinstance(value, bool):
                    self.errors.add(where, v, sub, f"expected true or false, got {value!r}")
                else:
                    out[key] = value
            elif key == "message":
                if not isinstance(value, str) or len(value) > MAX_MESSAGE_CHARS:
                    self.errors.add(where, v, sub, f"expected a string of at most {MAX_MESSAGE_CHARS} characters")
                else:
                    for problem in template_problems(value, SCHEMA[on].names):
                        self.errors.add(where, v, sub, problem)
                    out[key] = value
            elif key == "labels":
                labels = self._labels(where, v, sub)
                if labels is not None:
                    out[key] = labels
            elif key == "actions":
                actions = self._actions(where, v, sub)
                if actions is not None:
                    out[key] = actions
        return out if len(self.errors.items) == before else None

    def _labels(self, where: str, node: yaml.Node, path: str) -> dict[str, str] | None:
        value = _plain(node)
        if not isinstance(value, dict):
            self.errors.add(where, node, path, "expected a mapping of label names to strings")
            return None
        ok = True
        if len(value) > MAX_LABELS:
            self.errors.add(where, node, path, f"more than {MAX_LABELS} labels")
            ok = False
        for k, v in value.items():
            if not isinstance(k, str) or not LABEL_NAME.fullmatch(k):
                self.errors.add(where, node, f"{path}.{k}", "not a label name (letters, digits, _)")
                ok = False
            elif not isinstance(v, str) or len(v) > MAX_LABEL_VALUE_CHARS:
                self.errors.add(where, node, f"{path}.{k}", f"expected a string of at most {MAX_LABEL_VALUE_CHARS}")
                ok = False
        return cast(dict[str, str], value) if ok else None

    def _actions(self, where: str, node: yaml.Node, path: str) -> tuple[ActionSpec, ...] | None:
        import yaml

        if not isinstance(node, yaml.SequenceNode):
            self.errors.add(where, node, path, "expected a list of {action, params}")
            return None
        if len(node.value) > MAX_ACTIONS:
            self.errors.add(where, node, path, f"more than {MAX_ACTIONS} actions")
            return None
        out = []
        ok = True
        for i, item in enumerate(node.value):
            sub = f"{path}[{i}]"
            entries = _mapping(item, where, sub, self.errors, ("action", "params"))
            if entries is None:
                ok = False
                continue
            if "action" not in entries:
                self.errors.add(where, item, sub, "missing required field: action")
                ok = False
                continue
            name_node = entries["action"][1]
            name = _plain(name_node)
            if not isinstance(name, str) or name not in self.checks:
                self.errors.add(
                    where, name_node, f"{sub}.action", f"unknown action {name!r}; known: {', '.join(self.checks)}"
                )
                ok = False
                continue
            params: object = {}
            if "params" in entries:
                params_node = entries["params"][1]
                params = _plain(params_node)
                if params is None:
                    params = {}
                if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
                    self.errors.add(where, params_node, f"{sub}.params", "expected a mapping")
                    ok = False
                    continue
            line_node = entries["params"][1] if "params" in entries else item
            try:
                problems = self.checks[name](cast(dict[str, object], params))
            except Exception as err:  # a check that raises is a bug there; the file is still judged, not crashed
                problems = [f"the {name} action's check failed: {type(err).__name__}: {err}"]
            for problem in problems:
                self.errors.add(where, line_node, f"{sub}.params", problem)
                ok = False
            out.append(ActionSpec(name, cast(dict[str, object], params)))
        return tuple(out) if ok else None

    def _override(self, where: str, name: str, entries: Mapping[str, tuple[yaml.Node, yaml.Node]], path: str) -> None:
        key_node, modes_node = entries["override"]
        draft = self.drafts.get(name)
        if draft is None:
            self.errors.add(where, key_node, f"{path}.override", f"no rule {name!r} defined before to override")
            return
        modes = _mapping(modes_node, where, f"{path}.override", self.errors, None)
        if modes is None:
            return
        ok = True
        for field_name, (k, v) in modes.items():
            mode = _plain(v)
            allowed = ("append", "replace") if field_name in APPENDABLE else ("replace",)
            if field_name not in REPLACEABLE:
                self.errors.add(where, k, f"{path}.override.{field_name}", "cannot be overridden")
                ok = False
            elif mode not in allowed:
                self.errors.add(where, v, f"{path}.override.{field_name}", f"expected {' or '.join(allowed)}")
                ok = False
            elif field_name not in entries:
                self.errors.add(where, k, f"{path}.override.{field_name}", "the rule gives no value for it")
                ok = False
        for given, (k, _v) in entries.items():
            if given not in ("name", "override") and given not in modes:
                self.errors.add(where, k, f"{path}.{given}", "give it in override as append or replace")
                ok = False
        if not ok:
            return
        values = self._fields(where, entries, path, draft.on, exclude=("name", "on", "when"))
        if values is None:
            return
        for field_name, (_k, v) in modes.items():
            append = _plain(v) == "append"
            if field_name == "when":
                when_node = entries["when"][1]
                when = _plain(when_node)
                if not isinstance(when, str) or not when.strip():
                    self.errors.add(where, when_node, f"{path}.when", "expected a CEL expression (a string)")
                    return
                draft.when = f"({draft.when}) && ({when})" if append else when
                draft.when_line = when_node.start_mark.line + 1
                draft.when_offset_line = None
                draft.where = where
                draft.path = path
            elif field_name == "actions" and append:
                draft.values["actions"] = (*draft.values.get("actions", ()), *values["actions"])
            elif field_name == "labels" and append:
                old = dict(draft.values.get("labels", {}))
                for label, value in values["labels"].items():
                    if label in old:
                        self.errors.add(
                            where, entries["labels"][1], f"{path}.labels.{label}", "already set: use replace"
                        )
                        return
                    old[label] = value
                draft.values["labels"] = old
            else:
                draft.values[field_name] = values[field_name]

    def finish(self) -> Policy:
        rules = []
        for draft in self.drafts.values():
            spec = SCHEMA[draft.on]
            names = spec.names | set(self.lists)
            sizes = {**spec.sizes, **{name: size_of(items) for name, items in self.lists.items()}}
            source = draft.when
            try:
                source = expand(draft.when, self.macros)
                expression = compile_expression(
                    source, names, self.bounds, what=f"a field of {draft.on} or a list", sizes=sizes
                )
            except CelError as err:
                line = draft.when_line
                text = str(err)
                if draft.when_offset_line is not None and err.column and source == draft.when:
                    before = draft.when[: err.column - 1]
                    line = draft.when_offset_line + before.count("\n")
                    text = f"{err.message} (column {len(before) - before.rfind(chr(10))})"
                expanded = "" if source == draft.when else " (macros expanded)"
                self.errors.add(draft.where, None, f"{draft.path}.when", f"CEL{expanded}: {text}", line=line)
                continue
            severity: str = draft.values.get("severity", "warning")
            rules.append(
                Rule(
                    name=draft.name,
                    on=draft.on,
                    when=source,
                    expression=expression,
                    for_seconds=draft.values.get("for", 0.0),
                    keep_firing_for_seconds=draft.values.get("keep_firing_for", 0.0),
                    severity=severity if severity in SEVERITIES else "warning",
                    severity_field=None if severity in SEVERITIES else severity.strip("{}"),
                    labels=draft.values.get("labels", {}),
                    message=draft.values.get("message", ""),
                    actions=draft.values.get("actions", ()),
                    cooldown_seconds=draft.values.get("cooldown", 0.0),
                    repeat_on=draft.values.get("repeat_on", ()),
                    enabled=draft.values.get("enabled", True),
                    dry_run=draft.values.get("dry_run", False),
                    where=f"{draft.where}:{draft.line}",
                )
            )
        if self.errors.items:
            raise PolicyError(self.errors.items)
        return Policy(tuple(rules), dict(self.lists))


def parse_policy(
    files: Sequence[tuple[str, str]], checks: ActionChecks = ACTION_NAMES_ONLY, bounds: Bounds = DEFAULT_BOUNDS
) -> Policy:
    """A policy from ``(name, text)`` pairs, in order; a PolicyError lists every problem."""
    loader = _Loader(checks, bounds)
    for where, text in files:
        loader.file(where, text)
    policy = loader.finish()
    return replace(policy, files=tuple(w for w, _ in files))


def read_policy_file(path: str) -> str:
    """A policy file's text; a PolicyError naming the file when it cannot be read, is too large or is not UTF-8."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise PolicyError([f"{path}: cannot read: {err.strerror or err}"]) from None
    if len(data) > MAX_FILE_BYTES:
        raise PolicyError([f"{path}: larger than {MAX_FILE_BYTES} bytes; not a policy file"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PolicyError([f"{path}: not UTF-8 text: {err}"]) from None


def load_policy(
    paths: Sequence[str], checks: ActionChecks = ACTION_NAMES_ONLY, bounds: Bounds = DEFAULT_BOUNDS
) -> Policy:
    """The policy of these files, loaded in order; a PolicyError lists every problem (the files that cannot be read
    first)."""
    texts: list[tuple[str, str]] = []
    errors: list[str] = []
    for path in paths:
        try:
            texts.append((path, read_policy_file(path)))
        except PolicyError as err:
            errors += err.errors
    if errors:
        raise PolicyError(errors)
    return parse_policy(texts, checks, bounds)


__all__ = [
    "ACTION_NAMES_ONLY",
    "MAX_RULES",
    "ActionCheck",
    "ActionChecks",
    "ActionSpec",
    "Policy",
    "PolicyError",
    "Rule",
    "field_text",
    "load_policy",
    "parse_duration",
    "parse_policy",
    "render_message",
    "template_problems",
]
