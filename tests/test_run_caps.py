"""The bound on runs with series of their own never changes a total: 500 runs of real safetensors files on a real
tmpfs, scanned by the real checkpoint source, export their important bytes exact to the byte (against os.stat) and
count the runs and findings left without series; /api/status and /status say the same. Which runs keep their series
(those with GPU-seconds at risk first), and files named as a run's steps being checkpoints, not model weights."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from storwatch.analysis.build import build_view
from storwatch.analysis.checkpoints import MAX_RUNS, keep_runs
from storwatch.analysis.findings import find, kind_of, names_steps
from storwatch.analysis.recovery import RunRecovery
from storwatch.classify import Classifier
from storwatch.exporter import Exporter
from storwatch.paths import HostPaths
from storwatch.registry import exporter_areas
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import CheckpointSource
from storwatch.vocabulary import Durability, FsUsage, Mount, Platform
from storwatch.web.page import render_status_page
from tests.builders import NOW, ckpt, on, run
from tests.realmounts import find_mount, tmpfs_mount

RUNS, STEPS = 500, 3


def safetensors_file(path: Path, floats: int) -> int:
    """A real safetensors file of one F32 tensor; its size on disk."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [floats], "data_offsets": [0, 4 * floats]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * (4 * floats))
    return os.stat(path).st_size


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_500_runs_on_tmpfs_keep_every_byte_and_count_the_runs_left_out(
    tmp_path: Path, make_source: Callable[..., CheckpointSource]
) -> None:
    with tmpfs_mount(tmp_path / "scratch", size="64m") as tmpfs:
        root = tmpfs.mountpoint / "runs"
        total = 0
        for i in range(RUNS):
            d = root / f"run-{i:03d}"
            d.mkdir(parents=True)
            for step in range(1, STEPS + 1):
                f = d / f"step-{step}.safetensors"
                total += safetensors_file(f, floats=1 + (i + step) % 7)  # sizes differ: a wrong sum shows
                when = 1_700_000_000.0 + i * 10 + step
                os.utime(f, (when, when))
        facts = make_source([str(root)], deep_per_scan=0).collect()
        assert len(facts.runs) == RUNS
        info = find_mount(tmpfs.mountpoint)
        assert info is not None and info.fstype == "tmpfs"  # the kernel's word, not the test's
        usage = FsUsage(64 << 20, 32 << 20, 32 << 20, 1000, 500)
        mounts = (
            Mount(1, "/", "/dev/vda1", "ext4", "/", 259, 1, False, (), (), usage, False, 0.0),
            Mount(
                2,
                info.mountpoint,
                info.source,
                info.fstype,
                "/",
                info.major,
                info.minor,
                False,
                (),
                (),
                usage,
                False,
                0.0,
            ),
        )
        view = build_view(
            Snapshot(timestamp=1_700_010_000.0, mounts=mounts, checkpoints=facts),
            Classifier("generic"),
            Platform("generic", "test"),
            paths=HostPaths(),
        )
    mountpoint = str(tmpfs.mountpoint)
    text = Exporter(exporter_areas(), process_metrics=False).render(view).decode()
    samples = _samples(text)
    important = {(lb["mountpoint"], lb["kind"]): v for lb, v in samples["storwatch_ephemeral_important_bytes"]}
    # Exact to the byte, over every run; step-N files in a run are its checkpoints, not model weights.
    assert important == {(mountpoint, "checkpoint"): total}
    dropped = {labels["label"]: v for labels, v in samples["storwatch_checkpoint_series_dropped"]}
    assert dropped == {"run": RUNS - MAX_RUNS, "finding": RUNS - MAX_RUNS}
    assert len(samples["storwatch_checkpoint_kept"]) == MAX_RUNS
    assert len(samples["storwatch_finding"]) == MAX_RUNS
    # No series of a run left out: the newest runs (highest numbers) keep theirs.
    runs = {labels["run"] for labels, _ in samples["storwatch_checkpoint_kept"]}
    assert runs == {f"run-{i:03d}" for i in range(RUNS - MAX_RUNS, RUNS)}
    assert samples["storwatch_checkpoint_dropped_gpu_seconds_at_risk"] == [({}, 0.0)]

    # /api/status: the findings listed plus what was left out are the whole, and the page says runs were left out.
    data = view_to_dict(view)
    assert len(data["checkpoints"]) == MAX_RUNS and len(data["findings"]) == MAX_RUNS
    left = data["left_out"]
    assert left["runs"] == RUNS - MAX_RUNS and left["findings"] == RUNS - MAX_RUNS
    assert sum(f["bytes"] for f in data["findings"]) + sum(b["bytes"] for b in left["important_bytes"]) == total
    assert {f["kind"] for f in data["findings"]} == {"checkpoint"}
    page = render_status_page(data)
    assert f"{RUNS - MAX_RUNS} more runs are not listed ({RUNS - MAX_RUNS} findings" in page


def test_below_the_bound_nothing_is_left_out_and_the_page_says_nothing() -> None:
    where = on(Durability.NODE)
    runs = tuple(run(f"r{i}", where, ckpt(100.0 + i)) for i in range(3))
    findings = find(runs, (where,), NOW)
    kept = keep_runs(runs, (), findings)
    assert kept.runs == runs and kept.findings == findings and kept.left_out.runs == 0
    empty = build_view(Snapshot(timestamp=NOW), Classifier("generic"), Platform("g", "t"))
    assert view_to_dict(empty)["left_out"]["runs"] == 0
    assert "left-out" not in render_status_page(view_to_dict(empty))


def _recovery(rv: Any, gpus: int, point: float) -> RunRecovery:
    return RunRecovery(rv.label, point, point, None, None, None, None, gpus, None, {}, None, rv.id)


def test_runs_with_gpu_seconds_at_risk_keep_their_series_and_the_rest_is_summed() -> None:
    """The oldest run holds GPUs: it keeps its series over newer runs; runs left out add their GPU-seconds at risk
    and their findings' bytes to left_out, so each sum over series plus left_out is the whole."""
    local, shared = on(Durability.NODE, "/local"), on(Durability.CLUSTER, "/nfs")
    runs = tuple(run(f"r{i}", local if i % 2 else shared, ckpt(100.0 + i)) for i in range(10))
    recovery = tuple(_recovery(rv, 2 if i in (3, 9) else 0, 100.0 + i) for i, rv in enumerate(runs))
    recovery = (*recovery[:5], _recovery(runs[5], 1, math.inf), *recovery[6:])
    findings = find(runs, (local, shared), NOW)
    assert len(findings) == 5  # the runs on node storage
    kept = keep_runs(runs, recovery, findings, limit=4)
    labels = [rv.label for rv in kept.runs]
    # at risk first (r3, r5, r9), then a run with a finding (r1, the newest of those left), in the runs' order
    assert labels == ["r1", "r3", "r5", "r9"]
    assert [r.label for r in kept.recovery] == labels
    assert {f.run for f in kept.findings} == {"r1", "r3", "r5", "r9"}
    assert kept.left_out.runs == 6 and kept.left_out.findings == 1  # r7
    assert sum(f.bytes for f in kept.findings) + sum(kept.left_out.important_bytes.values()) == sum(
        f.bytes for f in findings
    )
    assert kept.left_out.gpu_seconds_at_risk == 0.0  # the dropped runs hold no GPU
    kept = keep_runs(runs, recovery, findings, limit=2)  # r9 and r3 at finite risk, r5 at +Inf: one must go
    assert [rv.label for rv in kept.runs] == ["r3", "r5"]
    assert kept.left_out.gpu_seconds_at_risk == 2 * 109.0


@pytest.mark.parametrize(
    ("names", "steps"),
    [
        (["step-1.safetensors"], True),
        (["model-step-300.safetensors"], True),
        (["epoch_3.safetensors"], True),
        (["iter_0000500.safetensors"], True),
        (["ckpt-7.safetensors"], True),
        (["run-1.safetensors", "run-2.safetensors"], True),
        (["model.safetensors"], False),
        (["stepfun.safetensors"], False),
        (["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"], False),
        (["llama-8b-q4_0.safetensors", "llama-8b-q8_0.safetensors"], False),
        (["run-1.safetensors", "run-01.safetensors"], False),
    ],
    ids=lambda v: v if isinstance(v, bool) else "+".join(v),
)
def test_files_named_as_steps(names: list[str], steps: bool) -> None:
    assert names_steps(names) is steps
    assert kind_of(("safetensors", n) for n in names) == ("checkpoint" if steps else "model")


def test_gguf_files_are_weights_whatever_their_numbers() -> None:
    assert kind_of([("gguf", "llama-7b.gguf"), ("gguf", "llama-13b.gguf")]) == "model"
    assert kind_of([("torch-zip", "pytorch_model.bin")]) == "model"
    assert kind_of([("torch-zip", "step-1.pt")]) == "checkpoint"
