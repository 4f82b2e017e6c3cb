"""Join checkpoint runs with the mounts they are on: a run's durability is its mount's."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable

from storwatch.analysis.view import MountView, RunView
from storwatch.checkpoints.record import RunId
from storwatch.paths import HostPaths
from storwatch.sources.checkpoints import CheckpointFacts, RunState

MAX_RUNS = 100
"""Runs exported and shown, newest first: the run label stays bounded whatever the node holds."""


def run_label(path: str, root: str) -> str:
    """A run's path below its root (the root's own name for the root itself), as text fit for a label."""
    rel = os.path.relpath(path, root) if path != root else os.path.basename(path)
    return _text(rel)


def _text(name: str) -> str:
    return os.fsencode(name).decode("utf-8", "backslashreplace")[-160:]


def run_labels(runs: Iterable[RunState]) -> dict[RunId, str]:
    """A label for each run, unique on the node: its path below its root, or, where runs below different roots
    share that path, its whole path."""
    runs = list(runs)
    short = {r.id: run_label(r.path, r.root) for r in runs}
    taken = Counter(short.values())
    return {rid: label if taken[label] == 1 else _text(rid.path) for rid, label in short.items()}


def mount_locator(mounts: tuple[MountView, ...], paths: HostPaths) -> Callable[[str], MountView | None]:
    """The mount a path (as this process reaches it, under the host root) is on: the longest mountpoint that is a
    prefix of it."""
    local = sorted(((paths.root(mv.mount.mountpoint).rstrip("/"), mv) for mv in mounts), key=lambda t: -len(t[0]))

    def mount_of(path: str) -> MountView | None:
        for prefix, mv in local:
            if path == prefix or path.startswith(prefix + "/") or prefix == "":
                return mv
        return None

    return mount_of


def run_views(facts: CheckpointFacts | None, mounts: tuple[MountView, ...], paths: HostPaths) -> tuple[RunView, ...]:
    if facts is None or not facts.runs:
        return ()
    mount_of = mount_locator(mounts, paths)

    runs = sorted(facts.runs, key=lambda r: max((c.mtime for c in r.checkpoints), default=0.0), reverse=True)
    labels = run_labels(facts.runs)
    return tuple(RunView(r, labels[r.id], mount_of(r.path)) for r in runs[:MAX_RUNS])
