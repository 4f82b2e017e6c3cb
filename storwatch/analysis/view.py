"""Build the View from a Snapshot: each mount gets its durability verdict and its I/O."""

from __future__ import annotations

from storwatch.analysis.checkpoints import run_views
from storwatch.analysis.io import mount_io
from storwatch.analysis.latency import LatencyWindows
from storwatch.classify import Classifier
from storwatch.model import MountView, Platform, Snapshot, View
from storwatch.paths import HostPaths


def build_view(
    snapshot: Snapshot,
    classifier: Classifier,
    platform: Platform,
    ready: bool = True,
    windows: LatencyWindows | None = None,
    paths: HostPaths | None = None,
) -> View:
    mounts = tuple(MountView(m, classifier.classify(m), mount_io(m, snapshot, windows)) for m in snapshot.mounts)
    checkpoints = run_views(snapshot.checkpoints, mounts, paths or HostPaths())
    return View(
        timestamp=snapshot.timestamp,
        platform=platform,
        mounts=mounts,
        collectors=snapshot.collectors,
        disks=snapshot.disks,
        nfs=snapshot.nfs,
        gpus=snapshot.gpus,
        containers=snapshot.containers,
        checkpoints=checkpoints,
        kube=snapshot.kube,
        ready=ready,
    )
