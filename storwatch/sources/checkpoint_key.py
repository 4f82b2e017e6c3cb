"""Where the checkpoint source files its facts in a Snapshot, and where it looks. A module of its own, so that the
Snapshot and the registry name them without importing the source (its helper-process client, the format checks, the
pickle reader), which `storwatch scan` loads only where there is somewhere to look; ``storwatch.sources.checkpoints``
gives the key its facts type.

Where it looks is a ``SearchPlan``: the roots named in ``checkpoints.roots``, then the default places the platform
preset and the mount table choose (``storwatch.classify.default_places``: home directories where they are
node-local, node-local scratch and data mounts), then the kubelet's pod volumes; each root with why it was chosen,
and each place a preset names that is on this node and is not searched, with why not.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from storwatch.config import CheckpointsConfig
from storwatch.paths import HostPaths
from storwatch.sources import FactsKey

CHECKPOINTS: FactsKey[Any] = FactsKey("checkpoints")
KUBELET_PODS = "/var/lib/kubelet/pods"
CONFIGURED = "named in checkpoints.roots"
"""Why a configured root is searched."""
KUBELET_WHY = "the kubelet's pod volumes"
"""Why the kubelet's pods directory is searched."""
HOW_TO_ADD = "name the directories to search in checkpoints.roots"


@dataclass(frozen=True)
class SearchRoot:
    """A directory the checkpoint scan searches (or a place it considered and passed over), and why."""

    path: str
    """As the host names it."""
    why: str
    """Why it is searched ("home directories, node-local on together-k8s"), or why not."""


@dataclass(frozen=True)
class DefaultPlaces:
    """What the platform preset and the mount table choose to search when nothing is configured."""

    roots: tuple[SearchRoot, ...] = ()
    passed_over: tuple[SearchRoot, ...] = ()
    """Places a preset names that are on this node and are not searched (durable, stuck...), each with why not."""


@dataclass(frozen=True)
class SearchPlan:
    """Where one collection of the checkpoint source searches, and why."""

    roots: tuple[SearchRoot, ...] = ()
    """Configured roots first, then the default places, then the kubelet's pod volumes; none at or inside an earlier
    one."""
    passed_over: tuple[SearchRoot, ...] = ()
    defaults: bool = True
    """``checkpoints.default_roots``: the default places are searched as well as the configured roots."""
    pending: str | None = None
    """Why the default places could not be chosen (the mount table could not be read); None when they were."""

    def local_roots(self, paths: HostPaths) -> list[str]:
        """The roots as this process reaches them (below ``--path.rootfs``)."""
        return [paths.root(r.path) for r in self.roots]

    def nowhere(self) -> str:
        """Why nothing is searched, and how to have something searched (for a plan with no roots)."""
        if not self.defaults:
            why = (
                "checkpoints.default_roots is false, checkpoints.roots is empty and this node has no kubelet pod "
                "volumes"
            )
        elif self.pending is not None:
            why = f"the default places could not be chosen ({self.pending}) and checkpoints.roots is empty"
        else:
            why = (
                "checkpoints.roots is empty, and this node has no node-local home directories, scratch or data mounts "
                "and no kubelet pod volumes"
            )
        passed = "; ".join(f"{p.path}: {p.why}" for p in self.passed_over)
        return (
            f"no place searched for checkpoints, so nothing is known of what this node would lose: {why}"
            + (f" (not searched: {passed})" if passed else "")
            + f"; {HOW_TO_ADD}"
        )


def search_plan(
    paths: HostPaths, section: CheckpointsConfig, defaults: DefaultPlaces | None, pending: str | None = None
) -> SearchPlan:
    """The configured roots, the default places (where ``checkpoints.default_roots``; ``defaults`` None while they
    cannot be chosen, ``pending`` saying why) and the kubelet's pod volumes when this is a Kubernetes node. A root
    at or inside an earlier one is left out: that one's walk covers it."""
    found = [SearchRoot(os.path.normpath(r), CONFIGURED) for r in section.roots]
    passed: tuple[SearchRoot, ...] = ()
    if section.default_roots and defaults is not None:
        found += defaults.roots
        passed = defaults.passed_over
    if section.kubelet and os.path.isdir(paths.root(KUBELET_PODS)):
        found.append(SearchRoot(KUBELET_PODS, KUBELET_WHY))
    return SearchPlan(
        tuple(_outermost(found)),
        passed,
        section.default_roots,
        pending if section.default_roots and defaults is None else None,
    )


def _inside(path: str, other: str) -> bool:
    return path == other or path.startswith(other.rstrip("/") + "/")


def _outermost(roots: Sequence[SearchRoot]) -> list[SearchRoot]:
    """The roots in their order, less those at or inside an earlier one (its walk covers them). One that holds an
    earlier one stays: the earlier is walked on its own, and the outer walk leaves it out."""
    kept: list[SearchRoot] = []
    for root in roots:
        if not any(_inside(root.path, r.path) for r in kept):
            kept.append(root)
    return kept


def default_roots(paths: HostPaths, configured: Sequence[str], kubelet: bool) -> list[str]:
    """Configured roots (host paths), plus the kubelet's pod volumes when this is a Kubernetes node, as this process
    reaches them: the roots that need no mount table (``search_plan`` adds the default places)."""
    section = CheckpointsConfig(roots=tuple(configured), kubelet=kubelet, default_roots=False)
    return search_plan(paths, section, None).local_roots(paths)
