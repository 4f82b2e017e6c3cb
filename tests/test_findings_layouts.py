"""Findings on nodes laid out like the platforms storwatch is built for, end to end: the real agent, given a host
root with real checkpoint and model files and a mount table like the platform's (through ``--path.rootfs`` and
``--path.procfs``, as in its DaemonSet), finds every checkpoint and model file at risk, names where each should go,
finds nothing on durable storage, and exports their bytes exact to the byte.

- Together's Kubernetes nodes: /home and a local NVMe disk are node-local; a pod's PVC (NFS) beside them survives.
- Paperspace Gradient: /home/paperspace (the workspace) and /artifacts do not survive the machine; /storage does.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.agentproc import running_agent, wait_until
from tests.builders import gguf_bytes, torch_like_zip

POD = "5d0c2b0e-7f1a-4c55-8e2f-1a2b3c4d5e6f"
PVC = f"/var/lib/kubelet/pods/{POD}/volumes/kubernetes.io~csi/pvc-8f3e/mount"
HOUR_AGO = time.time() - 3600


def safetensors_bytes(n: int = 1024) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * (4 * n)


def mountinfo(mounts: list[tuple[str, str, str]]) -> str:
    lines = []
    for i, (mountpoint, fstype, source) in enumerate(mounts, start=20):
        lines.append(
            f"{i} 1 {8 if fstype != 'nfs4' else 0}:{i} / {mountpoint} rw,relatime shared:{i} - {fstype} {source} rw"
        )
    return "\n".join(lines) + "\n"


def write(root: Path, path: str, data: bytes | None = None, *, torch_zip: bool = False, payload: int = 0) -> int:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    if torch_zip:
        torch_like_zip(p, os.urandom(payload))
    else:
        p.write_bytes(data or b"")
    os.utime(p, (HOUR_AGO, HOUR_AGO))
    return p.stat().st_size


def start(tmp_path: Path, platform: str, mounts: list[tuple[str, str, str]], roots: list[str]):  # type: ignore[no-untyped-def]
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "mountinfo").write_text(mountinfo(mounts))
    (proc / "diskstats").write_text("")
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        f"tick_seconds: 0.2\nplatform: {platform}\n"
        f"paths: {{procfs: {proc}, rootfs: {tmp_path / 'host'}}}\n"
        "mounts: {interval_seconds: 0.5}\n"
        "gpu: {enabled: false}\nkube: {enabled: false}\n"
        f"checkpoints: {{roots: {json.dumps(roots)}, interval_seconds: 0.5, kubelet: false, deep_per_scan: 0, "
        "dataset_min_bytes: 100000}\n"
    )
    return running_agent("--config", str(cfg), "--listen", "127.0.0.1:0")


def findings_and_bytes(agent) -> tuple[list[dict], dict[tuple[str, str], float]]:  # type: ignore[no-untyped-def]
    def ready() -> list[dict] | None:
        data = json.loads(agent.fetch("/api/status").body)
        return data["findings"] if data.get("checkpoints") else None

    findings = wait_until(ready, timeout=30, what="a checkpoint scan with findings")
    exported: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(agent.fetch("/metrics").body.decode()):
        for s in family.samples:
            if s.name == "storwatch_ephemeral_important_bytes":
                exported[(s.labels["mountpoint"], s.labels["kind"])] = s.value
    return findings, exported


def test_together_kubernetes_node(tmp_path: Path) -> None:
    host = tmp_path / "host"
    sizes: dict[tuple[str, str], int] = defaultdict(int)
    for step in (100, 200):
        sizes[("/home", "checkpoint")] += write(
            host, f"/home/alice/llama-ft/step-{step}.pt", torch_zip=True, payload=5000 + step
        )
    sizes[("/mnt/local-nvme", "checkpoint")] += write(
        host, "/mnt/local-nvme/runs/gpt/step-1000.pt", torch_zip=True, payload=7777
    )
    sizes[("/home", "model")] += write(host, "/home/alice/models/llama-8b/model.safetensors", safetensors_bytes(3000))
    sizes[("/mnt/local-nvme", "model")] += write(host, "/mnt/local-nvme/models/llama-8b-q8_0.gguf", gguf_bytes())
    write(host, f"{PVC}/ckpt/llama-ft/step-100.pt", torch_zip=True, payload=5100)  # durable: no finding
    for i in range(3):  # dataset shards: on the local disk a finding, on the PVC none
        sizes[("/mnt/local-nvme", "dataset")] += write(
            host, f"/mnt/local-nvme/data/c4/part-{i:05d}.parquet", b"P" * 70_000
        )
        write(host, f"{PVC}/data/c4/shard-{i:06d}.tar", b"T" * 70_000)
    mounts = [
        ("/", "ext4", "/dev/vda1"),
        ("/home", "ext4", "/dev/nvme0n1p2"),
        ("/mnt/local-nvme", "xfs", "/dev/nvme1n1"),
        (PVC, "nfs4", "10.0.0.5:/exports/pvc-8f3e"),
    ]
    with start(tmp_path, "together-k8s", mounts, ["/home", "/mnt/local-nvme", "/var/lib/kubelet/pods"]) as agent:
        findings, exported = findings_and_bytes(agent)
    by_where = defaultdict(list)
    for f in findings:
        by_where[(f["mountpoint"], f["kind"])].append(f)
    assert set(by_where) == set(sizes), findings  # nothing on the PVC
    for key, size in sizes.items():
        (f,) = by_where[key]
        assert f["bytes"] == size and f["move_to"] == PVC, f
        assert PVC in f["sentence"] and key[0] in f["sentence"]
        # Each run's files written at one time, no durable copy, no drain: no training is known to be only here past
        # the recovery-point budget, so each is a warning (test_findings ranks by the budget).
        assert f["severity"] == "warning" and f["path"].startswith(key[0] + "/"), f
        assert exported[key] == size  # exact to the byte
    assert by_where[("/home", "checkpoint")][0]["count"] == 2
    model = by_where[("/home", "model")][0]
    assert model["path"] == "/home/alice/models/llama-8b"
    assert model["sentence"].startswith(f"{model['run']} (/home/alice/models/llama-8b): 1 model file, ")


def test_gradient_machine(tmp_path: Path) -> None:
    host = tmp_path / "host"
    sizes: dict[tuple[str, str], int] = defaultdict(int)
    for step in (1, 2, 3):
        sizes[("/home/paperspace", "checkpoint")] += write(
            host, f"/home/paperspace/run/step-{step}.pt", torch_zip=True, payload=999 * step
        )
    sizes[("/artifacts", "model")] += write(host, "/artifacts/model.safetensors", safetensors_bytes(5000))
    sizes[("/artifacts", "checkpoint")] += write(host, "/artifacts/final/step-3.pt", torch_zip=True, payload=4242)
    write(host, "/storage/ckpt/step-0.pt", torch_zip=True, payload=100)  # durable: no finding
    mounts = [
        ("/", "overlay", "overlay"),
        ("/home/paperspace", "ext4", "/dev/vdb"),
        ("/artifacts", "ext4", "/dev/vdc"),
        ("/storage", "nfs4", "fs-team.paperspace:/storage"),
    ]
    with start(tmp_path, "gradient", mounts, ["/home/paperspace", "/artifacts", "/storage"]) as agent:
        findings, exported = findings_and_bytes(agent)
    by_where = {(f["mountpoint"], f["kind"]): f for f in findings}
    assert set(by_where) == set(sizes), findings
    for key, size in sizes.items():
        f = by_where[key]
        assert f["bytes"] == size and f["move_to"] == "/storage", f
        assert exported[key] == size
