"""Build the View from a Snapshot: each mount gets its durability verdict."""

from __future__ import annotations

from storwatch.classify import Classifier
from storwatch.model import MountView, Platform, Snapshot, View


def build_view(snapshot: Snapshot, classifier: Classifier, platform: Platform, ready: bool = True) -> View:
    mounts = tuple(MountView(m, classifier.classify(m)) for m in snapshot.mounts)
    return View(
        timestamp=snapshot.timestamp,
        platform=platform,
        mounts=mounts,
        collectors=snapshot.collectors,
        ready=ready,
    )
