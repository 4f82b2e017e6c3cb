"""The parts of docs/ made from the code, and ``python -m storwatch.docs [--check]``, which writes them (or, with
``--check``, names each one that is stale and exits 1; tests/test_docs.py runs the check). A generated part is a
whole file (docs/policy.md, from the policy schema, as ``storwatch policy show`` prints it) or a block of a
hand-written file, between two markers that name it::

    <!-- generated: NAME by `python -m storwatch.docs`; do not edit -->
    ...
    <!-- end generated: NAME -->

The blocks: the metrics table of docs/metrics.md (from the exporter's catalog), the table of every configuration
field with its default and range of docs/configuration.md (from the configuration's dataclasses and the sections the
sources declare), and the table of the shipped policy rules of docs/policy-actions.md (from the default policy as
loaded, with a sentence per rule from :data:`RULE_SUMMARIES`). Adding a metric, a field or a shipped rule therefore
changes the docs by running this, never by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib.resources
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from storwatch.config import RANGE, Config, Range
from storwatch.exporter.catalog import CATALOG, markdown_rows
from storwatch.policy.load import Rule, parse_policy
from storwatch.policy.schema import markdown as policy_markdown
from storwatch.registry import extra_sections
from storwatch.vocabulary import PLATFORMS

REPO_ROOT = Path(__file__).resolve().parents[1]

RULE_SUMMARIES: Mapping[str, str] = {
    "important-data-only-on-ephemeral-storage": "a finding of checkpoints or model weights with no durable copy",
    "recovery-point-over-budget": (
        "a run with GPUs here whose newest durable checkpoint is more than an hour old (or missing)"
    ),
    "checkpoint-incomplete": "a run with an incomplete checkpoint nothing writes any more",
    "checkpoint-corrupt": "a run with a corrupt checkpoint",
    "checkpoint-unsafe": "a run with a checkpoint whose pickle runs code when loaded",
    "mount-stuck": "a mount whose statvfs or probe is past its deadline",
    "gpu-stalled-by-storage": "a GPU that lost more than a fifth of the last ten minutes to storage",
    "next-checkpoint-will-not-fit": "a run whose mount has less room than its next checkpoint needs",
    "leaving-with-checkpoints-only-on-ephemeral-storage": (
        "a run only on node-local storage while the node drains or its pod is being deleted"
    ),
    "leaving-request-checkpoint": (
        "the same run, while its pod has time to write a checkpoint (more than 10 s, and twice its last save): asks"
        " it for one"
    ),
    "leaving-sync-checkpoint": (
        "the same run with a complete checkpoint: copies the newest to durable storage (nothing while"
        " `sync.destinations` is empty), waiting up to 20 s for the one asked for; again every 5 s"
    ),
    "orphaned-temporaries-piling-up": "a run with three or more abandoned `atomic_save` temporaries, or 10 GiB of them",
    "alert-sync-checkpoint": (
        'an alert Alertmanager routed here with `storwatch_action="sync"` that names a run of this node: copies'
        " the run's newest complete checkpoint, and each newer one while the alert fires (`repeat_on: [checkpoint]`)"
    ),
}
"""What each shipped rule fires for, in a sentence; the table gives its kind, ``for``, severity and actions from the
rule itself. A shipped rule without a sentence here (or a sentence for no rule) fails the generation."""


TEXT_CHOICES: Mapping[str, tuple[str, ...]] = {
    "platform": ("auto", *PLATFORMS),
    "log_level": ("debug", "info", "warning", "error"),
}
"""Text fields whose values Config.problems checks against a fixed set."""


def _marker(name: str) -> tuple[str, str]:
    return (
        f"<!-- generated: {name} by `python -m storwatch.docs`; do not edit -->",
        f"<!-- end generated: {name} -->",
    )


# -- the metrics


def metrics_table() -> str:
    """Every metric of the catalog, by the exporter area that writes it (storwatch/exporter/AREA.py)."""
    out: list[str] = []
    areas = list(dict.fromkeys(spec.area for spec in CATALOG))
    for area in areas:
        specs = [spec for spec in CATALOG if spec.area == area]
        out += [f"### `{area}` (storwatch/exporter/{area}.py)", "", *markdown_rows(specs), ""]
    return "\n".join(out[:-1])


# -- the configuration


def _yaml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if value == "" or re.search(r"[:{}#\[\]]", value) else value
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    if isinstance(value, int) and value >= 1 << 20:
        return f"{value} ({_binary(value)})"
    return str(value)


def _binary(value: float) -> str:
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = {"TiB": 1 << 40, "GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10}[unit]
        if value >= size and value % size == 0:
            return f"{int(value // size)} {unit}"
    return f"{value:g}"


def _number(value: float, name: str) -> str:
    if name.endswith(("bytes", "_bytes_per_second")) and value >= 1 << 10 and value % (1 << 10) == 0:
        return _binary(value)
    return str(value) if isinstance(value, int) else f"{value:g}"


def _choices(tp: Any) -> tuple[str, ...]:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tuple(str(member.value) for member in tp)
    if typing.get_origin(tp) is typing.Literal:
        return tuple(str(c) for c in typing.get_args(tp))
    return ()


def _accepts(name: str, tp: Any, rng: Range | None) -> str:
    if name in TEXT_CHOICES:
        return ", ".join(TEXT_CHOICES[name])
    if rng is not None:
        why = f" ({rng.why})" if rng.why else ""
        return f"{_number(rng.minimum, name)} to {_number(rng.maximum, name)}{why}"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "text"
    origin = typing.get_origin(tp)
    if origin is tuple:
        (item, *_) = typing.get_args(tp)
        if dataclasses.is_dataclass(item):
            return "a list of {" + ", ".join(f.name for f in dataclasses.fields(item)) + "}"
        choices = _choices(item)
        return "a list of " + (", ".join(choices) if choices else "text")
    if _choices(tp):
        return ", ".join(_choices(tp))
    if isinstance(tp, types.UnionType):
        return " or ".join(_accepts(name, t, None) for t in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field[Any]) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _field_rows(tp: type, prefix: str) -> list[str]:
    rows: list[str] = []
    hints = typing.get_type_hints(tp)
    for f in dataclasses.fields(tp):
        if f.name == "extra_sections":  # not a key of the file: the sections sources declare
            continue
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            rows += _field_rows(hint, f"{prefix}{f.name}.")  # type: ignore[arg-type]
            continue
        accepts = _accepts(f.name, hint, f.metadata.get(RANGE))
        rows.append(f"| `{prefix}{f.name}` | `{_yaml_value(_default(f))}` | {accepts} |")
    return rows


def configuration_table() -> str:
    """Every field of the configuration file with its default and what it accepts: Config's own sections, then those
    the sources declare (storwatch/registry.py), in the order a file would list them."""
    rows = ["| field | default | accepts |", "|---|---|---|", *_field_rows(Config, "")]
    for name, section in extra_sections().items():
        rows += _field_rows(section, f"{name}.")
    return "\n".join(rows)


# -- the shipped policy


def _duration(seconds: float) -> str:
    if seconds == 0:
        return "at once"
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"


def shipped_rules() -> tuple[Rule, ...]:
    text = (importlib.resources.files("storwatch") / "policies" / "default.yaml").read_text(encoding="utf-8")
    return parse_policy([("storwatch/policies/default.yaml", text)]).rules


def shipped_rules_table(rules: Sequence[Rule] | None = None) -> str:
    """The shipped rules: what each fires for (:data:`RULE_SUMMARIES`), its kind, how long its condition must hold,
    its severity ("the run's": each entity's own), its actions and how often they repeat while it fires."""
    rules = shipped_rules() if rules is None else rules
    names = [rule.name for rule in rules]
    missing = [name for name in names if name not in RULE_SUMMARIES]
    extra = sorted(set(RULE_SUMMARIES) - set(names))
    if missing or extra:
        raise ValueError(
            f"storwatch/docs.py RULE_SUMMARIES: no sentence for {missing or 'none'}; a sentence for no shipped rule:"
            f" {extra or 'none'}"
        )
    rows = ["| rule | on | fires for | after | severity | actions | again |", "|---|---|---|---|---|---|---|"]
    for rule in rules:
        severity = "the run's" if rule.severity_field == "severity" else rule.severity_shown
        actions = ", ".join(f"`{a.action}`" for a in rule.actions)
        again = [f"every {_duration(rule.cooldown_seconds)}"] if rule.cooldown_seconds else []
        again += [f"each newer `{field}`" for field in rule.repeat_on]
        rows.append(
            f"| `{rule.name}` | {rule.on} | {RULE_SUMMARIES[rule.name]} | {_duration(rule.for_seconds)} | {severity}"
            f" | {actions} | {', '.join(again) or 'no'} |"
        )
    return "\n".join(rows)


# -- the files

BLOCKS: Mapping[str, tuple[str, Callable[[], str]]] = {
    "metrics": ("docs/metrics.md", metrics_table),
    "configuration-fields": ("docs/configuration.md", configuration_table),
    "shipped-rules": ("docs/policy-actions.md", shipped_rules_table),
}
"""Each generated block: its name (in its markers), the file that holds it and what makes it."""
WHOLE_FILES: Mapping[str, Callable[[], str]] = {"docs/policy.md": policy_markdown}
"""Files generated whole."""


class StaleMarkers(ValueError):
    """A file lacks the markers of a block it should hold, or holds them out of order."""


def with_block(text: str, name: str, block: str) -> str:
    """``text`` with the block ``name`` between its markers replaced by ``block``."""
    begin, end = _marker(name)
    head, found, rest = text.partition(begin + "\n")
    _, found_end, tail = rest.partition(end)
    if not found or not found_end or text.count(begin) != 1:
        raise StaleMarkers(f"no block {name!r} (or more than one): the file should hold\n{begin}\n...\n{end}")
    return f"{head}{begin}\n{block}\n{end}{tail}"


def generated(root: Path = REPO_ROOT) -> dict[str, str]:
    """Every file with a generated part, as it should read, by its path below ``root``."""
    files: dict[str, str] = {rel: make() for rel, make in WHOLE_FILES.items()}
    for name, (rel, make) in BLOCKS.items():
        text = files.get(rel)
        if text is None:
            text = (root / rel).read_text(encoding="utf-8")
        files[rel] = with_block(text, name, make())
    return files


def write_generated(root: Path, files: Mapping[str, str], *, check: bool) -> int:
    """Write each generated file (by its path below ``root``) that differs from what it should read, naming it; with
    ``check``, write nothing: the exit status, 1 when any differs. The mixin's build (``python -m mixin``) writes its
    files the same way."""
    stale = []
    for rel, text in files.items():
        path = root / rel
        try:
            current = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = None
        if current == text:
            continue
        stale.append(rel)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for rel in stale:
        print(f"{'differs' if check else 'wrote'}: {rel}", file=sys.stderr)
    return 1 if check and stale else 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m storwatch.docs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each file that differs")
    ap.add_argument("--root", type=Path, default=REPO_ROOT, help="the repository's root (default: this checkout)")
    args = ap.parse_args(argv)
    try:
        files = generated(args.root)
    except (OSError, StaleMarkers, ValueError) as err:
        print(f"python -m storwatch.docs: {err}", file=sys.stderr)
        return 1
    return write_generated(args.root, files, check=args.check)


if __name__ == "__main__":
    sys.exit(main())
