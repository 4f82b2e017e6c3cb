"""Build the View from a Snapshot: each mount gets its durability verdict and its I/O, each checkpoint run its mount."""

from __future__ import annotations

from storwatch.analysis.checkpoints import host_path, keep_runs, mount_locator, run_views
from storwatch.analysis.findings import find
from storwatch.analysis.io import mount_io
from storwatch.analysis.latency import LatencyWindows
from storwatch.analysis.pods import process_pods
from storwatch.analysis.rpo import DEFAULT_MTBF_SECONDS, recoveries
from storwatch.analysis.view import MountView, View
from storwatch.classify import Classifier
from storwatch.config import FindingsConfig
from storwatch.paths import HostPaths
from storwatch.snapshot import Snapshot
from storwatch.sources.access import ACCESS
from storwatch.sources.copies import COPIES
from storwatch.sources.fileevents import FILE_EVENTS
from storwatch.vocabulary import Mount, Platform, Verdict


class VerdictCache:
    """Verdicts kept from one View to the next while nothing they depend on changed: the same Mount objects (the mount
    source makes new ones when it reads the mounts again), the same classifier and the same Kubernetes facts (from
    which the volume evidence comes). Classifying a hundred mounts every tick was most of the tick's cost."""

    def __init__(self) -> None:
        self._basis: tuple[Classifier, object] | None = None
        self._verdicts: dict[int, tuple[Mount, Verdict]] = {}

    def verdicts(self, classifier: Classifier, snapshot: Snapshot) -> list[Verdict]:
        basis = self._basis
        kept = self._verdicts if basis is not None and basis[0] is classifier and basis[1] is snapshot.kube else {}
        fresh: dict[int, tuple[Mount, Verdict]] = {}
        out = []
        for m in snapshot.mounts:
            hit = kept.get(id(m))
            verdict = hit[1] if hit is not None and hit[0] is m else classifier.classify(m)
            fresh[id(m)] = (m, verdict)  # holding the mount keeps its id from being reused while it is a key
            out.append(verdict)
        self._basis, self._verdicts = (classifier, snapshot.kube), fresh
        return out


def build_view(
    snapshot: Snapshot,
    classifier: Classifier,
    platform: Platform,
    ready: bool = True,
    windows: LatencyWindows | None = None,
    paths: HostPaths | None = None,
    verdicts: VerdictCache | None = None,
    mtbf_seconds: float = DEFAULT_MTBF_SECONDS,
    findings: FindingsConfig | None = None,
) -> View:
    """The View of one Snapshot: a function of its arguments (``verdicts`` only saves classifying again what did not
    change). The stall state and the last hour's picture are the agent's to add, from its stall tracker.
    ``findings``: how severe a finding is (the defaults where None); the node drains when the Kubernetes facts say
    so (off Kubernetes nothing tells a drain yet)."""
    found = (verdicts or VerdictCache()).verdicts(classifier, snapshot)
    mounts = tuple(
        MountView(m, verdict, mount_io(m, snapshot, windows)) for m, verdict in zip(snapshot.mounts, found, strict=True)
    )
    paths = paths or HostPaths()
    copies = snapshot.get(COPIES)
    runs = run_views(snapshot.checkpoints, mounts, paths, snapshot.get(ACCESS), copies, snapshot.get(FILE_EVENTS))
    locate = mount_locator(mounts, paths)
    facts = snapshot.checkpoints
    pods = process_pods(snapshot.containers, snapshot.kube)
    # Findings and recovery figures over every run; only then the bound on what gets series and rows of its own,
    # so the sums (important bytes, GPU-seconds at risk) stay whole.
    kept = keep_runs(
        runs,
        recoveries(runs, snapshot.timestamp, mtbf_seconds, snapshot.gpus, pods, snapshot.jobs),
        find(
            runs,
            mounts,
            snapshot.timestamp,
            [(d, locate(d.path), host_path(paths, d.path)) for d in (facts.datasets if facts is not None else ())],
            findings,
            snapshot.kube is not None and snapshot.kube.draining,
            () if copies is None else tuple(host_path(paths, r) for r in copies.roots),
        ),
    )
    return View(
        snapshot=snapshot,
        platform=platform,
        mounts=mounts,
        checkpoints=kept.runs,
        checkpoint_roots=None if facts is None else tuple(host_path(paths, r) for r in facts.roots),
        ready=ready,
        pods=pods,
        findings=kept.findings,
        recovery=kept.recovery,
        left_out=kept.left_out,
    )
