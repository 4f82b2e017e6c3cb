"""End to end, for the jobs that never import storwatch: a real CPU torch training loop saves with plain
``torch.save`` (then fsync), as a Hugging Face Trainer does (a ``checkpoint-N/`` directory of safetensors, torch and
JSON files, each fsynced here) or with ``dcp.save``, onto an ext4 loop mount whose image sits on a FUSE filesystem
that delays every write, while its "GPU" (the fake NVML library, driven by the loop) is busy while it computes and
idle while it saves. Nothing in the loop tells the agent anything: the agent must find the writer by its open files,
time each write from the kernel's birth times and the files seen closed, charge the GPU's idle time to
``checkpoint_write`` on the checkpoint's mount, and count the run's GPU-seconds at risk.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agentproc import running_agent, wait_until
from tests.nvml import FakeNVMLUnavailable, build_fake_nvml
from tests.realmounts import fuse_mount, loop_ext4_mount

T = TypeVar("T")
Enter = Callable[[ContextManager[T]], T]
REPO_ROOT = Path(__file__).resolve().parents[1]
SAVES = 4
TOLERANCE = 0.25


def samples(agent: Any, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(agent.fetch("/metrics").body.decode())
        for s in family.samples
        if s.name == name
    ]


@pytest.mark.realpart
@pytest.mark.parametrize("writer", ["plain", "trainer", "dcp"])
def test_a_job_that_never_imports_storwatch_is_timed_and_charged(
    writer: str, real_mounts: Enter[Any], tmp_path: Path
) -> None:
    pytest.importorskip("torch", reason="torch==2.13.0 is installed by make test")
    if writer == "trainer":
        pytest.importorskip("safetensors", reason="safetensors is installed by make test (with transformers)")
    try:
        lib = build_fake_nvml(tmp_path / "nvml")
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))
    slow = real_mounts(fuse_mount(tmp_path / "slow", write_delay_ms=8))
    disk = real_mounts(loop_ext4_mount(tmp_path / "ckpt", size_mb=512, image_dir=slow.mountpoint))
    run_dir = disk.mountpoint / "jobs" / writer
    run_dir.mkdir(parents=True)
    script = tmp_path / "nvml-script.txt"
    script.write_text("gpu 0 uuid=GPU-e2e-0000 name=Fake_Trainer util=0 mem_used=0 mem_total=85899345920\n")
    cfg = tmp_path / "storwatch.yaml"
    # The access source at its defaults (a whole pass every 5 s): a save is found by the writer's write counter
    # between passes, and its end by the look at its open file, every WATCH_SECONDS. Ticks every 0.1 s with no CPU
    # budget: the default budget (0.15 % of a core) would stretch them, and those looks, by what a tick costs, which
    # on a busy machine comes near a save's fsync (then no longer seen open, or its end too vague to time).
    cfg.write_text(
        "tick_seconds: 0.1\ntick_cpu_share: 0\nplatform: generic\n"
        "mounts: {interval_seconds: 1}\nkube: {enabled: false}\n"
        "gpu: {interval_seconds: 0.1, samples_interval_seconds: 0}\n"
        f"checkpoints: {{roots: [{json.dumps(str(disk.mountpoint))}], interval_seconds: 0.5, kubelet: false, "
        "deep_per_scan: 0, settle_seconds: 0}\n"
    )
    result = tmp_path / "result.json"
    env = {"LD_LIBRARY_PATH": str(lib.parent), "FAKE_NVML_SCRIPT": str(script)}
    go = tmp_path / "go"
    with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=env, timeout=30) as agent:
        loop = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.training_loop",
                str(run_dir),
                str(script),
                str(result),
                *("--saves", str(SAVES), "--compute", "2", "--mib", "48", "--writer", writer),
                *("--start-file", str(go)),
            ],
            cwd=REPO_ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )

        # A real job saves minutes after it starts, long after the agent has found its process: the first save of a
        # job the agent has not found yet is timed by birth and mtime alone, which leave out the fsync. So the job
        # computes until the agent lists it as a workload (its open files then looked at every 0.25 s).
        def found() -> bool:
            workloads = json.loads(agent.fetch("/api/status").body).get("workloads", ())
            return loop.poll() is None and any(w["pid"] == loop.pid for w in workloads)

        try:
            wait_until(found, timeout=60, interval=0.2, what="the job's process known to the agent")
        finally:
            go.touch()
        # While the job runs, its run is tied to the GPU its process holds: GPU-seconds at risk (node-local mount).
        risk_seen: list[tuple[dict[str, Any], list[tuple[dict[str, str], float]]]] = []
        deadline = time.monotonic() + 300
        while loop.poll() is None and time.monotonic() < deadline:
            data = json.loads(agent.fetch("/api/status").body)
            runs = [r for r in data.get("checkpoints", ()) if r["path"] == str(run_dir)]
            if runs and runs[0]["gpus"] and not risk_seen:
                risk_seen.append((runs[0], samples(agent, "storwatch_gpu_seconds_at_risk")))
            time.sleep(0.5)
        _, err = loop.communicate(timeout=30)
        assert loop.returncode == 0, err[-3000:]
        measured = json.loads(result.read_text())
        blocked = measured["blocked_seconds"]
        assert blocked > 0.3 * SAVES, measured  # the FUSE delay made the saves slow: there is something to measure
        last_end = max(s["end"] for s in measured["saves"])

        def settled() -> dict[str, Any] | None:
            data = json.loads(agent.fetch("/api/status").body)
            st = data["stalls"]
            runs = [r for r in data["checkpoints"] if r["path"] == str(run_dir)]
            timed = runs and sum(c["write_seconds"] is not None for c in runs[0]["checkpoints"]) >= SAVES
            return data if st and timed and time.time() - last_end > st["settle_seconds"] + 1.0 else None

        status = wait_until(settled, timeout=90, interval=0.5, what="every save timed and its stalls settled")
        stalls = {
            (labels["cause"], labels["mountpoint"]): value
            for labels, value in samples(agent, "storwatch_gpu_stall_seconds_total")
        }
    (run,) = [r for r in status["checkpoints"] if r["path"] == str(run_dir)]
    saves = [s["end"] - s["start"] for s in measured["saves"]]
    timed = [c for c in run["checkpoints"] if c["write_seconds"] is not None]
    print(f"{writer}: loop blocked {blocked:.2f} s, saves {saves}; agent: {[c['write_seconds'] for c in timed]}")
    print(f"{writer}: stalls {stalls}; timed by {[c['write_timed_by'] for c in timed]}")
    # Each save timed by what the kernel showed, within the tolerance of the loop's own median save.
    assert len(timed) == SAVES and {c["write_timed_by"] for c in timed} <= {"file_events", "open_files"}, run
    assert "file_events" in {c["write_timed_by"] for c in timed}, run
    agent_median, loop_median = statistics.median(c["write_seconds"] for c in timed), statistics.median(saves)
    assert abs(agent_median - loop_median) <= TOLERANCE * loop_median, (agent_median, loop_median)
    # The GPU's idle time in the saves is checkpoint_write on the checkpoint's mount, nowhere else.
    charged = stalls.get(("checkpoint_write", str(disk.mountpoint)), 0.0)
    assert abs(charged - blocked) <= TOLERANCE * blocked, (charged, blocked, stalls)
    elsewhere = sum(v for (cause, mp), v in stalls.items() if (cause, mp) != ("checkpoint_write", str(disk.mountpoint)))
    assert elsewhere <= TOLERANCE * blocked, stalls
    assert measured["imported"] == [], measured["imported"]  # the job never imported storwatch
    # While it ran, the run was tied to the GPU its writer held, with GPU-seconds at risk (its mount is node-local).
    assert risk_seen, "the run was never tied to the writer's GPU"
    (seen, at_risk) = risk_seen[0]
    assert seen["gpus"] == 1 and seen["workload"] == f"pid:{measured['pid']}", seen
    assert any(labels.get("run") == seen["run"] and value > 0 for labels, value in at_risk), at_risk
    assert not run["write_in_progress"], run  # the job has ended: nothing writes
