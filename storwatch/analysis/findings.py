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
on the node, else says there is none. Data already on ``cluster`` or ``region`` storage is never a finding. The id
is stable (a hash of what the finding is about), so an alert or an Event about it is not repeated as its figures
change.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storwatch.analysis.recovery import checkpoint_age_seconds
from storwatch.analysis.view import MountView, RunView
from storwatch.sources.kubevolumes import parse_kubelet_volume_path
from storwatch.vocabulary import Finding, Severity

if TYPE_CHECKING:
    from storwatch.checkpoints.scan import DatasetDir

CRITICAL_AGE_SECONDS = 3600.0
"""A run whose newest durable copy is older than this (or missing) while newer work sits on ephemeral storage is
critical: losing the node loses more than an hour of training."""


def _age(seconds: float | None) -> str:
    """An age in words, with "old"; a time in the future is said to be so (its age is unknown)."""
    if seconds is None:
        return "dated in the future (age unknown)"
    if seconds < 90:
        return f"{seconds:.0f} s old"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min old"
    if seconds < 172_800:
        return f"{seconds / 3600:.0f} h old"
    return f"{seconds / 86400:.0f} d old"


@dataclass(frozen=True)
class _Dated:
    mtime: float


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


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


def _durable_place(pod_uid: str | None, mounts: Iterable[MountView]) -> str | None:
    durable = [mv for mv in mounts if not mv.verdict.durability.ephemeral and not mv.mount.readonly]
    if pod_uid is not None:
        for mv in durable:
            if _pod_of(mv.mount.mountpoint) == pod_uid:
                return mv.mount.mountpoint
    # Off the pod: the node's own durable mounts (network storage) first, then a pod's durable volume (on Together's
    # Kubernetes nodes, data written to the node's /home belongs beside the PVC the same team's pods mount).
    for mv in durable:
        if _pod_of(mv.mount.mountpoint) is None and mv.mount.fstype not in ("proc", "sysfs"):
            return mv.mount.mountpoint
    return next((mv.mount.mountpoint for mv in durable), None)


def dataset_findings(
    datasets: Iterable[tuple[DatasetDir, MountView | None, str]], mounts: tuple[MountView, ...], now: float
) -> list[Finding]:
    """Directories of dataset shards on ``volatile`` or ``node`` storage, each (its directory, its mount, its name as
    the host calls it). A warning: a dataset can often be fetched again, but a node-local copy is lost with the node,
    and a processed one may exist nowhere else."""
    out = []
    for d, mv, where_label in datasets:
        if mv is None or not mv.verdict.durability.ephemeral:
            continue
        where = mv.mount.mountpoint
        move_to = _durable_place(_pod_of(d.path), mounts)
        sentence = (
            f"{d.files} dataset shard{'s' if d.files != 1 else ''}, {_gib(d.bytes)}, in {where_label}, only on "
            f"{mv.verdict.durability.value} storage {where}"
            + (f"; keep the source copy on {move_to}" if move_to else "; this node has no cluster or region storage")
        )
        out.append(
            Finding(
                id=hashlib.sha256(f"dataset\0{where}\0{d.path}".encode()).hexdigest()[:16],
                kind="dataset",
                severity="warning",
                mountpoint=where,
                durability=mv.verdict.durability.value,
                pod_uid=_pod_of(d.path),
                run=where_label,
                count=d.files,
                bytes=d.bytes,
                newest_age_seconds=checkpoint_age_seconds(_Dated(d.newest_mtime), now),
                durable_age_seconds=None,
                move_to=move_to,
                sentence=sentence,
            )
        )
    return out


def find(
    runs: Iterable[RunView],
    mounts: Iterable[MountView],
    now: float,
    datasets: Iterable[tuple[DatasetDir, MountView | None, str]] = (),
) -> tuple[Finding, ...]:
    """The findings of the View's checkpoint runs and dataset directories at ``now``, most severe first, then by
    bytes."""
    runs, mounts = tuple(runs), tuple(mounts)
    durable_newest: dict[str, _Dated] = {}
    for rv in runs:
        newest = rv.run.newest_complete
        if newest is not None and rv.mount is not None and not rv.mount.verdict.durability.ephemeral:
            known = durable_newest.get(rv.id.below_root)
            if known is None or newest.mtime > known.mtime:
                durable_newest[rv.id.below_root] = _Dated(newest.mtime)
    out: list[Finding] = []
    for rv in runs:
        mv = rv.mount
        complete = rv.run.complete
        if mv is None or not complete or not mv.verdict.durability.ephemeral:
            continue
        size = sum(c.size_bytes for c in complete)
        newest = max(complete, key=lambda c: c.mtime)
        newest_age = checkpoint_age_seconds(newest, now)
        durable = durable_newest.get(rv.id.below_root)  # a copy: the same path below another root
        durable_age = None if durable is None else checkpoint_age_seconds(durable, now)
        pod_uid = _pod_of(rv.run.path)
        move_to = _durable_place(pod_uid, mounts)
        # A copy dated in the future has an unknown age: it counts neither as fresh nor as stale.
        at_risk = durable is None or (
            durable_age is not None and newest_age is not None and durable_age - newest_age > CRITICAL_AGE_SECONDS
        )
        severity: Severity = "critical" if at_risk else "warning"
        where = mv.mount.mountpoint
        kind = kind_of((c.format, os.path.basename(c.path)) for c in complete)
        noun = "model file" if kind == "model" else "checkpoint"
        sentence = (
            f"{len(complete)} {noun}{'s' if len(complete) != 1 else ''}, {_gib(size)}, newest "
            f"{_age(newest_age)}, only on {mv.verdict.durability.value} storage {where}; "
            + ("no durable copy" if durable is None else f"newest durable copy {_age(durable_age)}")
            + ("; copy them to " + move_to if move_to else "; this node has no cluster or region storage to copy to")
        )
        key = f"checkpoint\0{where}\0{rv.run.path}".encode()  # the id stays what it was before kinds
        out.append(
            Finding(
                id=hashlib.sha256(key).hexdigest()[:16],
                kind=kind,
                severity=severity,
                mountpoint=where,
                durability=mv.verdict.durability.value,
                pod_uid=pod_uid,
                run=rv.label,
                count=len(complete),
                bytes=size,
                newest_age_seconds=newest_age,
                durable_age_seconds=durable_age,
                move_to=move_to,
                sentence=sentence,
            )
        )
    out.extend(dataset_findings(datasets, mounts, now))
    out.sort(key=lambda f: (f.severity != "critical", -f.bytes, f.id))
    return tuple(out)
