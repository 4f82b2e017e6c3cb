"""Where the checkpoint source files its facts in a Snapshot, and where it looks. A module of its own, so that the
Snapshot and the registry name them without importing the source (its helper-process client, the format checks, the
pickle reader), which `storwatch scan` loads only where there is somewhere to look; ``storwatch.sources.checkpoints``
gives the key its facts type."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from storwatch.paths import HostPaths
from storwatch.sources import FactsKey

CHECKPOINTS: FactsKey[Any] = FactsKey("checkpoints")
KUBELET_PODS = "/var/lib/kubelet/pods"


def default_roots(paths: HostPaths, configured: Sequence[str], kubelet: bool) -> list[str]:
    """Configured roots (host paths), plus the kubelet's pod volumes when this is a Kubernetes node."""
    roots = [paths.root(r) for r in configured]
    pods = paths.root(KUBELET_PODS)
    if kubelet and os.path.isdir(pods) and pods not in roots:
        roots.append(pods)
    return roots
