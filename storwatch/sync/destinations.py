"""Where copies may go: the allowlisted roots (``sync.destinations``), and a copy's path below one filled from
template fields that can never lead out of it. Nothing here touches a file."""

from __future__ import annotations

import os
import string
import unicodedata
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import xxhash

from storwatch.checkpoints.manifest import MANIFEST_SUFFIX, NAME_MAX, TEMP_TAG, is_ours
from storwatch.sync.result import SyncRefused

if TYPE_CHECKING:  # the copy's helper process never reads the configuration: its start-up is the copy's time
    from storwatch.config import SyncConfig


def field_problem(name: str, value: object) -> str | None:
    if not isinstance(value, str):
        return f"field {name!r} is not text"
    if value == "":
        return f"field {name!r} is empty"
    if value in (".", ".."):
        return f"field {name!r} is {value!r}, which would leave its directory"
    if "/" in value:
        return f"field {name!r} holds '/' ({value!r}): a field is one path component"
    for char in value:
        if char < " " or "\x7f" <= char <= "\x9f" or unicodedata.category(char) in ("Cs", "Zl", "Zp"):
            return f"field {name!r} holds the control character {char!r} (NUL, a control or a line separator)"
    if is_ours(value):
        return f"field {name!r} ({value!r}) could be taken for storwatch's own temporaries or manifests"
    if len(os.fsencode(value)) > NAME_MAX:
        return f"field {name!r} is longer than {NAME_MAX} bytes"
    return None


def safe_field(value: str) -> str:
    """``value`` made into one valid path component for a template field, reversibly (percent-encoding): ``%``,
    ``/``, control characters and a leading ``.`` as ``%XX``; empty as ``%00``; past NAME_MAX bytes cut and ended
    by a hash of the whole, so two values never meet on a name. For fields that are paths (a run below its root)."""
    if value == "":
        return "%00"
    out = []
    for i, char in enumerate(value):
        bad = char in "%/" or char < " " or "\x7f" <= char <= "\x9f"
        bad = bad or unicodedata.category(char) in ("Cs", "Zl", "Zp") or (i == 0 and char == ".")
        out.append("".join(f"%{b:02X}" for b in os.fsencode(char)) if bad else char)
    text = "".join(out)
    if TEMP_TAG in text:
        text = text.replace(TEMP_TAG, TEMP_TAG.replace(".", "%2E", 1))
    if text.endswith(MANIFEST_SUFFIX):
        text = text[: -len(MANIFEST_SUFFIX)] + "%2E" + MANIFEST_SUFFIX[1:]
    if len(os.fsencode(text)) > NAME_MAX:
        digest = xxhash.xxh3_64_hexdigest(os.fsencode(value))
        raw = os.fsencode(text)[: NAME_MAX - len(digest) - 1]
        text = raw.decode("utf-8", "ignore") + "~" + digest
    return text


class Destinations:
    """The allowlisted roots copies may be made under (``sync.destinations``), and the path of a copy below one.

    Nothing here touches a file: a root may sit on a mount that hangs, and the caller must not. The copy itself opens
    every component from the root down with ``O_NOFOLLOW`` (:func:`copy_verified` with ``root``)."""

    def __init__(self, roots: Iterable[str]) -> None:
        normal: list[str] = []
        for root in roots:
            if not os.path.isabs(root) or "\0" in root:
                raise ValueError(f"sync destination {root!r} is not an absolute path")
            root = "/" + os.path.normpath(root).strip("/")
            if root == "/":
                raise ValueError("sync destination '/' would allow every path on the host")
            if root not in normal:
                normal.append(root)
        self.roots: tuple[str, ...] = tuple(normal)

    @classmethod
    def from_config(cls, section: SyncConfig) -> Destinations:
        return cls(section.destinations)

    def root_of(self, path: str) -> str | None:
        """The allowlisted root ``path`` lies strictly below, by its text; None when none does, or when the path is
        not absolute, or holds ``.``, ``..``, an empty component or NUL (a path is never normalised into a root)."""
        if not os.path.isabs(path) or "\0" in path:
            return None
        parts = path.split("/")[1:]
        if any(p in ("", ".", "..") for p in parts):
            return None
        for root in self.roots:
            if path.startswith(root + "/") and len(path) > len(root) + 1:
                return root
        return None

    def check(self, path: str) -> str:
        """The root ``path`` lies below; :class:`SyncRefused` when it lies below none."""
        root = self.root_of(path)
        if root is None:
            allowed = ", ".join(self.roots) or "none configured (sync.destinations)"
            raise SyncRefused(f"{path!r} is not below an allowlisted sync destination ({allowed})")
        return root

    def resolve(self, template: str, fields: Mapping[str, str], *, root: str | None = None) -> str:
        """The copy's path: ``template`` filled from ``fields`` below ``root`` (default: the first root).

        Every field the template names must be one path component: :class:`SyncRefused`, naming the field, for one
        missing, empty, ``.`` or ``..``, holding ``/``, NUL or another control character, or longer than NAME_MAX
        (:func:`safe_field` makes any text such a component)."""
        if not self.roots:
            raise SyncRefused("no sync destination is configured (sync.destinations)")
        if root is None:
            root = self.roots[0]
        elif "/" + os.path.normpath(root).strip("/") not in self.roots:
            raise SyncRefused(f"{root!r} is not an allowlisted sync destination ({', '.join(self.roots)})")
        root = "/" + os.path.normpath(root).strip("/")
        from storwatch.config import sync_template_problem

        problem = sync_template_problem(template)
        if problem is not None:
            raise SyncRefused(f"sync template: {problem}")
        out: list[str] = []
        for literal, name, _spec, _conversion in string.Formatter().parse(template):
            out.append(literal)
            if name is None:
                continue
            if name not in fields:
                raise SyncRefused(f"field {name!r} has no value (the template {template!r} names it)")
            problem = field_problem(name, fields[name])
            if problem is not None:
                raise SyncRefused(problem)
            out.append(fields[name])
        rel = "".join(out)
        for component in rel.split("/"):
            if len(os.fsencode(component)) > NAME_MAX:
                raise SyncRefused(f"the path component {component[:40]!r}... is longer than {NAME_MAX} bytes")
            if is_ours(component):
                raise SyncRefused(f"the path component {component!r} could be taken for storwatch's own files")
        path = f"{root}/{rel}"
        if self.root_of(path) != root:  # pragma: no cover - the checks above make this impossible
            raise SyncRefused(f"{path!r} would leave {root}")
        return path
