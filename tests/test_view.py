"""Building the View: verdicts are kept from tick to tick only while what they depend on is the same."""

from __future__ import annotations

import dataclasses

from storwatch.analysis.build import VerdictCache, build_view
from storwatch.classify import Classifier
from storwatch.snapshot import Snapshot
from storwatch.sources.kubevolumes import KubeFacts
from storwatch.vocabulary import Mount, Platform, Verdict
from tests.builders import mount


class CountingClassifier(Classifier):
    def __init__(self) -> None:
        super().__init__("generic")
        self.calls: list[str] = []

    def classify(self, m: Mount) -> Verdict:
        self.calls.append(m.mountpoint)
        return super().classify(m)


def test_verdicts_are_kept_while_mounts_classifier_and_kube_facts_stay_the_same() -> None:
    data, scratch = mount("/data", "ext4", "/dev/nvme0n1"), mount("/scratch", "tmpfs", "tmpfs")
    classifier, cache, platform = CountingClassifier(), VerdictCache(), Platform("generic", "test")

    def view(snapshot: Snapshot, c: Classifier = classifier) -> list[str]:
        return [mv.verdict.durability.value for mv in build_view(snapshot, c, platform, verdicts=cache).mounts]

    snap = Snapshot(timestamp=1.0, mounts=(data, scratch))
    assert view(snap) == ["node", "volatile"] and classifier.calls == ["/data", "/scratch"]
    assert view(dataclasses.replace(snap, timestamp=2.0)) == ["node", "volatile"]
    assert classifier.calls == ["/data", "/scratch"]  # the same Mount objects: nothing classified again

    read_again = dataclasses.replace(data, stuck_seconds=0.0)  # the mount source read the mounts again
    assert view(Snapshot(timestamp=3.0, mounts=(read_again, scratch))) == ["node", "volatile"]
    assert classifier.calls[2:] == ["/data"]

    kube = KubeFacts(enabled=True, api_up=True)  # new Kubernetes facts: the volume evidence may have changed
    assert view(Snapshot(timestamp=4.0, mounts=(read_again, scratch), kube=kube)) == ["node", "volatile"]
    assert classifier.calls[3:] == ["/data", "/scratch"]

    other = Classifier("generic", ())  # a reload made a new classifier
    view(Snapshot(timestamp=5.0, mounts=(read_again, scratch), kube=kube), other)
    assert view(Snapshot(timestamp=6.0, mounts=(read_again, scratch), kube=kube)) == ["node", "volatile"]
    assert classifier.calls[5:] == ["/data", "/scratch"]  # back to the first: its verdicts were dropped
