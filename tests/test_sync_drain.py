"""Issue 24's drain end to end, in the real agent: a CPU torch training loop (tests/request_loop.py) writes its
checkpoints in the trainer pod's scratch emptyDir on a Together-like node (tests/fixtures/k8s-node: the volume on a
local NVMe disk); the test's Kubernetes API (tests/kubeapi.py) marks the node draining and gives the pod a
deletionTimestamp with a 30 s grace period. The shipped default policy asks the loop for a checkpoint (the loop answers
it), then copies the checkpoint it wrote to the durable root (sync.destinations), verified, and the copy is checked
here byte for byte, before the pod's grace period ends; /status then shows the drain (its node-state section) and the
copy (the checkpoints table's "Done about it"). The agent keeps its default pace (ticks, Views, the Kubernetes source,
the mount table; only a statvfs deadline is short, for the fixture's mounts), and the checkpoint scan its default
30 s interval: the sync action, waiting for the checkpoint it asked for, has the scan look again sooner.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import REPO_ROOT, running_agent, wait_until
from tests.kubeapi import NODE, TRAINER_UID, fake_kube_api, k8s_node_objects
from tests.status_fixture import column
from tests.status_fixture import table as table_rows

pytestmark = pytest.mark.realpart

FIXTURES = Path(__file__).parent / "fixtures"
SCRATCH = f"var/lib/kubelet/pods/{TRAINER_UID}/volumes/kubernetes.io~empty-dir/scratch"
GRACE_SECONDS = 30


def _status(agent: Any) -> dict[str, Any] | None:
    resp = agent.fetch("/api/status")
    return json.loads(resp.body) if resp.status == 200 else None  # type: ignore[no-any-return]


def _rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_drain_asks_for_a_checkpoint_and_copies_it_verified_within_the_grace_period(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    shutil.copy(FIXTURES / "k8s-node" / "proc" / "1" / "mountinfo", proc / "1" / "mountinfo")
    root = tmp_path / "root"
    run = root / SCRATCH / "run1"
    run.mkdir(parents=True)
    (root / "durable").mkdir()
    result = tmp_path / "loop.json"
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        "platform: together-k8s\n"
        f"paths: {{procfs: {proc}, sysfs: {FIXTURES / 'gpu-node' / 'sys'}, rootfs: {root}}}\n"
        "mounts: {statvfs_timeout_seconds: 0.2}\n"
        "gpu: {enabled: false}\n"
        # The scan's default interval (30 s, as long as the grace period); no deep reads on a loaded test machine.
        "checkpoints: {deep_per_scan: 0}\n"
        "sync: {destinations: [/durable]}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    loop = subprocess.Popen(
        [sys.executable, "-m", "tests.request_loop", str(run), str(result), "--answers", "1", "--seconds", "240"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert loop.stdout is not None and loop.stdout.readline().strip() == "ready"
        with fake_kube_api() as api:
            for obj in k8s_node_objects():
                api.add(obj)
            agent_env = {"KUBECONFIG": str(api.kubeconfig(tmp_path)), "NODE_NAME": NODE}
            with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=agent_env, timeout=60) as agent:
                # The run, seen in the pod's scratch volume (node-local) with the loop's first save.
                def seen() -> dict[str, Any] | None:
                    s = _status(agent)
                    runs = [r for r in (s or {}).get("checkpoints", []) if r["path"].endswith("/scratch/run1")]
                    return runs[0] if runs and runs[0]["newest_complete"] else None

                first = wait_until(seen, timeout=90, interval=0.5, what="the run's first checkpoint")
                assert first["durability"] == "node" and first["newest_complete"].endswith("step-0.pt"), first
                # The node drains: cordoned with the drain's taint, the trainer pod given its grace period.
                deleted = time.time()
                deadline = deleted + GRACE_SECONDS
                api.cordon(NODE)
                api.modify(
                    "Pod",
                    "trainer-0",
                    "train",
                    metadata={
                        "deletionTimestamp": _rfc3339(deadline),
                        "deletionGracePeriodSeconds": GRACE_SECONDS,
                    },
                )
                # The loop answers the agent's request with a save of its own (and ends, after one answer)...
                assert loop.wait(timeout=GRACE_SECONDS) == 0
                (answer,) = json.loads(result.read_text())["answers"]
                assert answer["poll"] >= deleted and answer["step"] > 0, answer
                saved = run / f"step-{answer['step']}.pt"

                # ...and the agent copies that checkpoint to the durable root, verified.
                def copied() -> dict[str, Any] | None:
                    s = _status(agent)
                    jobs = [j for j in (s or {"policy": {}})["policy"].get("syncs", []) if j["source"] == str(saved)]
                    return jobs[0] if jobs and jobs[0]["state"] in ("done", "failed") else None

                job = wait_until(copied, timeout=GRACE_SECONDS + 30, interval=0.25, what="the copy of the answer")
                assert job["state"] == "done", job
                assert job["rule"] == "leaving-sync-checkpoint" and "verified" in job["detail"], job
                # Within the pod's grace period, by the agent's own record of when the copy ended.
                assert job["finished_at"] is not None and job["finished_at"] <= deadline, (job, deadline)
                dest = Path(job["destination"])
                # sync.template's default: {namespace}/{pod}/{run}/{checkpoint}, {run} the volume and the run below it.
                assert dest == root / "durable" / "train" / "trainer-0" / "scratch%2Frun1" / saved.name, dest
                assert dest.read_bytes() == saved.read_bytes()
                manifest = json.loads((dest.parent / (dest.name + ".storwatch-sync.json")).read_text())
                assert (manifest["source"], manifest["bytes"]) == (str(saved), saved.stat().st_size), manifest
                left = [p.name for p in dest.parent.iterdir() if ".storwatch-sync-" in p.name]
                assert not left, left
                # What made it and what it did: /status, and storwatch_sync_* in the scrape.
                page = agent.fetch("/status").body.decode()
                table = page.split('<table id="policy-syncs">')[1].split("</table>")[0]
                assert "leaving-sync-checkpoint" in table and saved.name in table, table

                # /status shows the drain as a state of its own, and the copy as what was done about the run (once
                # the durable root's walk, which the copy's end starts at once, has found it).
                def shows_copy() -> tuple[str, dict[str, str]] | None:
                    page = agent.fetch("/status").body.decode()
                    header, rows = table_rows(page, "checkpoints")
                    done = column(header, rows, "Done about it")
                    return (page, done) if any(f"verified copy of {saved.name} " in d for d in done.values()) else None

                page, done = wait_until(shows_copy, timeout=30, interval=0.5, what="/status showing the copy")
                (about,) = [d for d in done.values() if saved.name in d]
                # The copy where the host has it (the agent reaches the host's root at paths.rootfs), the request and
                # the save that answered it.
                host_dest = "/" + str(dest.relative_to(root))
                copy_words, asked_words = about.split("; ", 1)
                copy_said = rf"verified copy of {re.escape(saved.name)} \(a save \d+ s old\) at {re.escape(host_dest)}"
                assert re.fullmatch(copy_said, copy_words), about
                assert asked_words.startswith("checkpoint asked ") and "; answered by a save " in asked_words, about
                node_state = page.split("<section id='node-state' class='leaving'>", 1)[1].split("</section>", 1)[0]
                assert "<b>draining</b>: cordoned, with the removal taint node.kubernetes.io/unschedulable" in (
                    node_state
                ), node_state
                assert "<b>pods being deleted</b>: train/trainer-0 (" in node_state, node_state
                metrics = agent.fetch("/metrics").text()
                copied_bytes = [
                    float(line.split()[-1])
                    for line in metrics.splitlines()
                    if line.startswith("storwatch_sync_bytes_total ")
                ]
                assert copied_bytes and copied_bytes[0] >= saved.stat().st_size, copied_bytes
                assert "storwatch_sync_last_success_timestamp_seconds{run=" in metrics
    finally:
        if loop.poll() is None:
            loop.kill()
        loop.wait()
