"""Join checkpoint runs with the mounts they are on: a run's durability is its mount's."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from storwatch.analysis.view import MountView, RunView
from storwatch.paths import HostPaths

if TYPE_CHECKING:
    from storwatch.sources.checkpoints import CheckpointFacts

MAX_RUNS = 100
"""Runs exported and shown, newest first: the run label stays bounded whatever the node holds."""


def run_label(path: str, root: str) -> str:
    rel = os.path.relpath(path, root) if path != root else os.path.basename(path)
    return os.fsencode(rel).decode("utf-8", "backslashreplace")[-160:]


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
    return tuple(RunView(r, run_label(r.path, r.root), mount_of(r.path)) for r in runs[:MAX_RUNS])
