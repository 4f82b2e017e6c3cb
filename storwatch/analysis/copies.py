"""Durable copies joined to the runs they are copies of: what protects a run that lives on storage lost with this
node. A run's protection is the newest of its checkpoints that has a copy on durable storage:

- a **verified** copy storwatch made (sources/copies.py: a manifest, root's, that describes the copy beside it and
  names the source checkpoint, its run and the save it protects), joined by the run it names (its directory, as the
  copier reached it: under the agent's root, or as the host names it);
- a complete checkpoint at the **same path** below another scan root, on durable storage (a copy made by hand: the
  newest such checkpoint of that run).

A run the checkpoint scan finds whose checkpoints are all verified copies of ours (a durable root that is also a
checkpoint root) is not a run of its own: it is left out, and its copies count for their source run.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence

from storwatch.analysis.view import DurableCopy, RunView
from storwatch.checkpoints.manifest import FoundCopy
from storwatch.paths import HostPaths


def _forms(paths: HostPaths, path: str) -> set[str]:
    """A path as this process reaches it and as the host names it (a copy made by the agent names the first, one made
    by `storwatch sync` on the host the second)."""
    path = os.path.normpath(path)
    rootfs = os.path.normpath(paths.rootfs)
    forms = {path, paths.root(path)}
    if rootfs != "/" and (path == rootfs or path.startswith(rootfs + "/")):
        forms.add(path[len(rootfs) :] or "/")
    return forms


def copy_dests(copies: Iterable[FoundCopy], paths: HostPaths) -> set[str]:
    """Where each verified copy is, in both forms."""
    return {form for c in copies for form in _forms(paths, c.dest)}


def without_copies(runs: Sequence[RunView], dests: set[str]) -> list[RunView]:
    """The runs that are not made of verified copies of ours (a run with a checkpoint of its own stays)."""
    return [rv for rv in runs if not rv.run.checkpoints or any(c.path not in dests for c in rv.run.checkpoints)]


def join_copies(runs: Sequence[RunView], copies: Iterable[FoundCopy], paths: HostPaths) -> list[RunView]:
    """Each run with its durable copies (RunView.copies), the newest save first."""
    by_run: dict[str, list[DurableCopy]] = {}
    for c in copies:
        if c.covers is None:
            continue
        found = DurableCopy(_host(paths, c.dest), c.covers, "verified", os.path.basename(c.source), c.finished)
        for form in _forms(paths, c.run):
            by_run.setdefault(form, []).append(found)
    by_path: dict[str, DurableCopy] = {}
    for rv in runs:
        newest = rv.run.newest_complete
        if newest is None or rv.mount is None or rv.mount.verdict.durability.ephemeral:
            continue
        known = by_path.get(rv.id.below_root)
        if known is None or newest.mtime > known.covers:
            name = os.path.basename(newest.path)
            by_path[rv.id.below_root] = DurableCopy(rv.directory, newest.mtime, "same path", name)
    out = []
    for rv in runs:
        mine = [c for form in _forms(paths, rv.run.path) for c in by_run.get(form, ())]
        if rv.mount is not None and rv.mount.verdict.durability.ephemeral:
            by_hand = by_path.get(rv.id.below_root)
            if by_hand is not None:
                mine.append(by_hand)
        if mine:
            unique = {(c.where, c.covers): c for c in mine}
            rv = dataclasses.replace(rv, copies=tuple(sorted(unique.values(), key=lambda c: c.covers, reverse=True)))
        out.append(rv)
    return out


def _host(paths: HostPaths, path: str) -> str:
    rootfs = os.path.normpath(paths.rootfs)
    if rootfs != "/" and path.startswith(rootfs + "/"):
        return path[len(rootfs) :]
    return path
