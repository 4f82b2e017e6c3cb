"""Findings: important data sitting on storage that does not survive losing this node, each with a sentence a person
can act on and the durable place the data should go.

Today the important data is what the checkpoint scan finds: every run whose complete checkpoints are on a ``volatile``
or ``node`` mount. A run made only of model weights (safetensors files, sharded or not, GGUF files, Hugging Face's
``pytorch_model*.bin``) is of kind ``model``; any other is of kind ``checkpoint``, and so is a run whose safetensors
files are named as its steps (``step-N``, ``model-step-N``, ``epoch_N``..., or several names that differ only in their
last number): a run's checkpoints, not weights published to be downloaded. Directories of dataset shards
(Parquet, Arrow, TFRecord, WebDataset tars...) of at least ``checkpoints.dataset_min_bytes`` are of kind ``dataset``,
always warnings. A finding counts the run's bytes
there, exact to the byte (the sizes the scan measured), and names where they should go: a ``cluster`` or ``region``
mount of the same pod (a PVC beside its scratch volume), else the node's own such mount, else a pod's durable volume
on the node, else says none is known. Data already on ``cluster`` or ``region`` storage is never a finding. The id
is stable (a hash of what the finding is about), so an alert or an Event about it is not repeated as its figures
change.

Severity ranks (:func:`severity`): a run is critical when the training only this node's storage holds (its newest
checkpoint there less its newest durable copy; without one, at least the span of its checkpoints there) is past the
recovery-point budget (``findings.rpo_budget_seconds``), or while the node drains; a warning otherwise. Datasets are
always warnings. Findings come most severe first, then largest first.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storwatch import words
from storwatch.analysis.recovery import checkpoint_age_seconds
from storwatch.analysis.view import MountView, RunView
from storwatch.config import FindingsConfig
from storwatch.sources.kubevolumes import parse_kubelet_volume_path
from storwatch.vocabulary import Finding, Severity
from storwatch.words import span

if TYPE_CHECKING:
    from storwatch.checkpoints.scan import DatasetDir


def _age(seconds: float | None) -> str:
    """An age in words, with "old"; a time in the future is said to be so (its age is unknown)."""
    if seconds is None:
        return "dated in the future (age unknown)"
    return f"{span(seconds)} old"


def severity(
    exposed_seconds: float | None, at_least: bool, draining: bool, rules: FindingsConfig
) -> tuple[Severity, str]:
    """A checkpoint or model finding's severity and why: critical while the node drains (where
    ``rules.critical_while_draining``), or when the training only this node holds (``exposed_seconds``; a lower
    bound where ``at_least``) is past ``rules.rpo_budget_seconds``; a warning otherwise, an unknown span included
    (a date in the future is past no budget). ``draining``: whatever the caller knows of the node being drained."""
    budget = rules.rpo_budget_seconds
    words = f"the {span(budget)} recovery-point budget (findings.rpo_budget_seconds)"
    if draining and rules.critical_while_draining:
        return "critical", "the node is draining, and its storage goes with it"
    if exposed_seconds is None:
        return "warning", f"how much training only this node holds is unknown (a date in the future); {words}"
    if at_least and exposed_seconds < 1:
        return "warning", (
            "no span of training is known to be only on this node (no durable copy, and its checkpoints here were "
            f"written at one time: how long it trained before them is unknown); within {words}"
        )
    held = ("at least " if at_least else "") + span(exposed_seconds)
    if exposed_seconds > budget:
        return "critical", f"{held} of training only on this node, past {words}"
    return "warning", f"{held} of training only on this node, within {words}"


@dataclass(frozen=True)
class _Dated:
    mtime: float


COVERED_SLACK_SECONDS = 0.001
"""A checkpoint whose newest change is no later than this after the save a copy protects is that save."""

MODEL_FORMATS = frozenset({"safetensors", "safetensors-sharded", "gguf"})
"""Formats in which model weights are published and downloaded (not training state)."""


# ASCII digits, few of them (as the scan's own step patterns): a tenant names these files.
_STEP_WORD = re.compile(
    r"(?:^|[-_.])(?:global_step|step|steps|iter|iteration|epoch|ckpt|checkpoint)[-_]?\d{1,18}(?:$|[-_.])",
    re.ASCII | re.IGNORECASE,
)
_LAST_NUMBER = re.compile(r"^(.*?)(\d{1,18})(\D*)$", re.ASCII)
_SHARD = re.compile(r"\d{1,18}-of-\d{1,18}", re.ASCII)


def names_steps(names: Iterable[str]) -> bool:
    """The files are named as steps of a run: one name says so (``step-100``, ``model-step-100``, ``epoch_3``,
    ``iter_0000500``), or two or more names differ only in their last number (``run-1``, ``run-2``); shards of one
    model (``model-00001-of-00003``) are not steps."""
    stems = [os.path.splitext(n)[0] for n in names]
    if any(_STEP_WORD.search(stem) for stem in stems):
        return True
    numbered: dict[tuple[str, str], set[str]] = {}
    for stem in stems:
        m = _LAST_NUMBER.match(stem)
        if m is not None and not _SHARD.search(stem):
            numbered.setdefault((m.group(1), m.group(3)), set()).add(m.group(2).lstrip("0") or "0")
    return any(len(numbers) >= 2 for numbers in numbered.values())


def kind_of(formats_and_names: Iterable[tuple[str | None, str]]) -> str:
    """``model`` when every checkpoint is model weights, else ``checkpoint``. Safetensors files named as steps of a
    run (names_steps) are the run's checkpoints; GGUF files are always weights (an inference format: no trainer
    saves its steps in it)."""
    items = list(formats_and_names)
    model = all(f in MODEL_FORMATS or (f == "torch-zip" and n.startswith("pytorch_model")) for f, n in items)
    if model and names_steps(n for f, n in items if f != "gguf"):
        return "checkpoint"
    return "model" if items and model else "checkpoint"


def _pod_of(path: str) -> str | None:
    where = parse_kubelet_volume_path(path)
    return where.pod_uid if where is not None else None


def _durable_places(mounts: Iterable[MountView]) -> Callable[[str | None], str | None]:
    """Where a pod's important data belongs (by its pod's UID, None for no pod): a durable volume of the same pod;
    off the pod, the node's own durable mounts (network storage) first, then any pod's durable volume (on Together's
    Kubernetes nodes, data written to the node's /home belongs beside the PVC the same team's pods mount). The
    mounts are sorted out once for a View's findings, not once per run."""
    durable = [mv for mv in mounts if not mv.verdict.durability.ephemeral and not mv.mount.readonly]
    by_pod: dict[str, str] = {}
    off_pod: str | None = None
    for mv in durable:
        pod = _pod_of(mv.mount.mountpoint)
        if pod is not None:
            by_pod.setdefault(pod, mv.mount.mountpoint)
        elif off_pod is None and mv.mount.fstype not in ("proc", "sysfs"):
            off_pod = mv.mount.mountpoint
    fallback = off_pod if off_pod is not None else next((mv.mount.mountpoint for mv in durable), None)

    def place(pod_uid: str | None) -> str | None:
        mine = by_pod.get(pod_uid) if pod_uid is not None else None
        return mine if mine is not None else fallback

    return place


def dataset_findings(
    datasets: Iterable[tuple[DatasetDir, MountView | None, str]], mounts: tuple[MountView, ...], now: float
) -> list[Finding]:
    """Directories of dataset shards on ``volatile`` or ``node`` storage, each (its directory, its mount, its name as
    the host calls it). A warning: a dataset can often be fetched again, but a node-local copy is lost with the node,
    and a processed one may exist nowhere else."""
    out = []
    durable_place = _durable_places(mounts)
    for d, mv, where_label in datasets:
        if mv is None or not mv.verdict.durability.ephemeral:
            continue
        where = mv.mount.mountpoint
        move_to = durable_place(_pod_of(d.path))
        sentence = (
            f"{d.files} dataset shard{'s' if d.files != 1 else ''}, {words.size(d.bytes)}, in {where_label}, only on "
            f"{mv.verdict.durability.value} storage {where}"
            + (
                f"; keep the source copy on {move_to}"
                if move_to
                else "; no durable destination known: this node has no cluster or region storage"
            )
        )
        out.append(
            Finding(
                id=hashlib.sha256(os.fsencode(f"dataset\0{where}\0{d.path}")).hexdigest()[:16],
                kind="dataset",
                severity="warning",
                mountpoint=where,
                durability=mv.verdict.durability.value,
                pod_uid=_pod_of(d.path),
                run=where_label,
                path=where_label,
                count=d.files,
                bytes=d.bytes,
                newest_age_seconds=checkpoint_age_seconds(_Dated(d.newest_mtime), now),
                durable_age_seconds=None,
                move_to=move_to,
                sentence=sentence,
                severity_reason="a dataset can often be fetched again, but this copy is lost with the node",
            )
        )
    return out


def find(
    runs: Iterable[RunView],
    mounts: Iterable[MountView],
    now: float,
    datasets: Iterable[tuple[DatasetDir, MountView | None, str]] = (),
    rules: FindingsConfig | None = None,
    draining: bool = False,
    destinations: Sequence[str] = (),
) -> tuple[Finding, ...]:
    """The findings of the View's checkpoint runs and dataset directories at ``now``, most severe first, then by
    bytes. ``rules``: the severity settings (the defaults where None); ``draining``: the node is being drained;
    ``destinations``: the durable roots copies go to (sync.destinations, as the host names them), the first the
    place a run's checkpoints are told to go before any durable mount."""
    rules = rules or FindingsConfig()
    runs, mounts = tuple(runs), tuple(mounts)
    out: list[Finding] = []
    places = _durable_places(mounts)

    def durable_place(pod_uid: str | None) -> str | None:
        return destinations[0] if destinations else places(pod_uid)

    for rv in runs:
        mv = rv.mount
        if mv is None or not rv.run.complete or not mv.verdict.durability.ephemeral:
            continue
        copy = rv.newest_copy  # the newest save with a durable copy: what protects the run
        # What is only on this node: the complete checkpoints newer than the save its newest durable copy protects.
        # None left: the run is covered, and no finding (what protects it is on /status and in /api/status).
        complete = [c for c in rv.run.complete if copy is None or c.mtime > copy.covers + COVERED_SLACK_SECONDS]
        if not complete:
            continue
        size = sum(c.size_bytes for c in complete)
        newest = max(complete, key=lambda c: c.mtime)
        newest_age = checkpoint_age_seconds(newest, now)
        durable_age = None if copy is None else checkpoint_age_seconds(_Dated(copy.covers), now)
        pod_uid = _pod_of(rv.run.path)
        move_to = durable_place(pod_uid)
        # The training only this node holds. A date in the future (newest here, or the copy) makes it unknown: it
        # counts neither as fresh nor as stale. Without a durable copy the run's work before its oldest checkpoint
        # here is unknown, so the span of those here is a lower bound.
        exposed: float | None
        if newest_age is None or (copy is not None and durable_age is None):
            exposed = None
        elif copy is not None:
            exposed = max(0.0, newest.mtime - copy.covers)
        else:
            exposed = max(0.0, newest.mtime - min(c.mtime for c in complete))
        level, why = severity(exposed, copy is None, draining, rules)
        where = mv.mount.mountpoint
        kind = kind_of((c.format, os.path.basename(c.path)) for c in complete)
        noun = "model file" if kind == "model" else "checkpoint"
        count = f"{len(complete)} {noun}{'s' if len(complete) != 1 else ''}"
        if copy is None:
            copied = "no durable copy"
        else:
            by = "storwatch's verified copy" if copy.how == "verified" else "a copy at the same path"
            copied = f"newest durable copy {_age(durable_age)} ({copy.checkpoint}: {by} at {copy.where})"
        sentence = (
            f"{rv.label} ({rv.directory}): {count}, {words.size(size)}, newest {_age(newest_age)}, only on "
            f"{mv.verdict.durability.value} storage {where}; {copied}; "
            + (
                f"copy them to {move_to}"
                if move_to
                else "no durable destination known: set sync.destinations (or checkpoints.roots on durable storage), "
                "as this node has no cluster or region storage mounted"
            )
        )
        key = os.fsencode(f"checkpoint\0{where}\0{rv.run.path}")  # the id stays what it was before kinds
        out.append(
            Finding(
                id=hashlib.sha256(key).hexdigest()[:16],
                kind=kind,
                severity=level,
                mountpoint=where,
                durability=mv.verdict.durability.value,
                pod_uid=pod_uid,
                run=rv.label,
                path=rv.directory,
                count=len(complete),
                bytes=size,
                newest_age_seconds=newest_age,
                durable_age_seconds=durable_age,
                move_to=move_to,
                sentence=sentence,
                exposed_seconds=exposed,
                exposed_at_least=copy is None,
                severity_reason=why,
            )
        )
    out.extend(dataset_findings(datasets, mounts, now))
    out.sort(key=lambda f: (f.severity != "critical", -f.bytes, f.id))
    return tuple(out)
