"""The whole agent on a node at fleet scale: its CPU (helpers included) as a share of one core, and its RSS.

The acceptance line: at scale (64 busy mounts, 8 GPUs, 100,000 checkpoint files, 200 pods in the API server, the
default policies loaded) the agent takes under 1 % of a core and 150 MB RSS, helper processes included.

The node, built in one run in a temporary directory in ``--dir`` (default /dev/shm, a tmpfs, where it has 2 GiB
free, else the system's temporary directory; the 100,000 files take about 400 MB there):
  * the synthetic procfs of bench/io_sources.py: 64 NVMe devices in ``diskstats`` and 64 NFSv4.2 mounts in
    ``mountstats``/``mountinfo``, every counter moving every second. The NFS mounts are the checkpoint volumes of the
    first 64 pods (``/var/lib/kubelet/pods/UID/volumes/kubernetes.io~csi/PV/mount``), so the agent joins each to its
    pod, PVC and PV as on a Kubernetes node;
  * 8 GPUs on the fake libnvidia-ml.so.1 (tests/nvml, built with gcc), utilisation, memory and power moving every
    second; each GPU runs one process, a real ``sleep`` child of this bench whose ``<procfs>/PID`` links every entry
    to the real ``/proc/PID`` except ``cgroup``, which places it in the container of pod i (so the access source
    reads a real process, and the GPU is attributed to its pod);
  * checkpoint files (real files, in the tree's host root) below the pods' volumes, as Hugging Face Trainer runs
    lay them out: runs of 5 ``checkpoint-N`` directories of 40 files each (a sharded safetensors model with its
    index, optimizer, scheduler, 8 ranks' RNG states, trainer state, configs and tokenizer files; small but
    well-formed, so every check passes), ``--files`` / 200 runs (500 by default: 100,000 files). Four runs in five
    are on the pods' NFS volumes, one in five in a pod's emptyDir (node-local: a finding). Every file and directory
    is dated an hour back (settled, as most checkpoints on a node are);
  * the test Kubernetes API server (tests/kubeapi.py) holding this node, ``--pods`` pods on it (200: each with an
    emptyDir, a memory emptyDir, a configMap and the projected API token; the first 64 with a PVC on NFS, its PV
    and StorageClass); the agent reaches it through a kubeconfig, NODE_NAME naming the node.

The agent runs with that tree as its procfs, sysfs and host root and otherwise its defaults (the default policy set,
storwatch/policies/default.yaml, loaded; every source at its own cadence), but for one setting: the shipped image has
no torch (Dockerfile), so its deep checks never start a torch.load child, while a development environment may well have
torch; ``checkpoints.deep_torch_load: false`` makes the agent here do what the image does (``--torch-load`` leaves
it on: then each deep check of a Trainer checkpoint starts a child that imports torch, for each of its 11 torch.save
files). The pods' volumes are directories on one filesystem here, not mounts of the agent's own mount table, so the
kubelet root is walked as one unit (on a node, each volume mounted is a unit of its own).

Start-up is left out: after /readyz the bench waits (asking /api/status every 10 s, up to ``--settle-timeout``)
until the agent has found every run and checked every checkpoint (its first walk checks all 100,000 files once;
later walks re-list only what changed), then ``--warmup`` seconds more. Then it is scraped every 15 s
(``--scrape-interval``) for ``--seconds`` while the CPU of the agent and its helper processes (live ones, and any
that ended within the window) is measured as a share of one core, in all and by process. The RSS of the agent and
its helpers together is sampled twice a second from start-up on (the first walk included), and its maximum is the
figure. Afterwards it checks that the agent saw the node (GPUs and their pods, the API, the NFS volumes joined to
their PVCs, every run and checkpoint, the rules): a harness error otherwise.

Targets (PASS/MISS printed; a miss does not change the exit status, only a harness error does, with 2):
  CPU of the agent and its helpers < 1 % of one core;  RSS max of the agent and its helpers < 150 MB (10^6 bytes)

Usage: python bench/at_scale.py [--seconds 120] [--warmup 40] [--scrape-interval 15] [--files 100000] [--pods 200]
       [--devices 64] [--nfs 64] [--settle-timeout 900] [--torch-load] [--dir DIR] [--json FILE]
Run it with the project's virtual environment's Python (it needs the kubernetes client and nvidia-ml-py, as the
agent does) and gcc, on a quiet machine. BENCH_EXTRA_CONFIG (YAML text) is appended to the agent's config, as in
io_sources.py (but no ``checkpoints`` section unless --torch-load is given: the agent refuses a section given twice).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ROOT,
    HarnessError,
    descendants,
    free_port,
    get,
    kill_pid_if_alive,
    machine_info,
    measure_agent,
    quiet_machine_warnings,
    reference_cpu_ms,
    terminate,
    verdict,
    write_json,
)
from bench.io_sources import make_tree, write_tick
from tests.builders import torch_like_zip
from tests.kubeapi import NODE, FakeKubeAPI, Obj
from tests.nvml import FakeNVML, FakeNVMLUnavailable, build_fake_nvml

TARGET_CPU_SHARE = 0.01
TARGET_RSS_BYTES = 150_000_000
GPUS = 8
GIB = 1 << 30
LUSTRE_STATS = ROOT / "tests/fixtures/lustre/v2.15/sys/kernel/debug/lustre/llite/scratch-ffff9bc043537800/stats"

CHECKPOINTS_PER_RUN = 5
SHARDS = 22
RANKS = 8
FILES_PER_CHECKPOINT = SHARDS + RANKS + 10  # the shards, the RNG states, and the 10 files of checkpoint_files()
FILES_PER_RUN = CHECKPOINTS_PER_RUN * FILES_PER_CHECKPOINT  # 200
EPHEMERAL_EVERY = 5
"""One run in this many is in a pod's emptyDir (node-local), the others on the pods' NFS volumes."""


# -- the pods


@dataclass(frozen=True)
class Pod:
    index: int
    uid: str
    name: str
    namespace: str
    pv: str | None
    """The PV behind its checkpoint PVC (NFS), for the first --nfs pods; None for the others."""

    @property
    def volumes_dir(self) -> str:
        return f"/var/lib/kubelet/pods/{self.uid}/volumes"

    @property
    def nfs_mountpoint(self) -> str:
        return f"{self.volumes_dir}/kubernetes.io~csi/{self.pv}/mount"

    @property
    def scratch(self) -> str:
        return f"{self.volumes_dir}/kubernetes.io~empty-dir/scratch"


def make_pods(count: int, nfs: int) -> list[Pod]:
    return [
        Pod(
            index=i,
            uid=f"{i:08x}-be7c-4a11-8000-{i:012x}",
            name=f"train-{i:03d}-0",
            namespace=f"team-{i % 8}",
            pv=f"pvc-{i:08x}-5eed-4b0b-9000-{i:012x}" if i < nfs else None,
        )
        for i in range(count)
    ]


def kube_objects(pods: list[Pod]) -> list[Obj]:
    """This node, the pods on it, and the claims, volumes and StorageClass behind their NFS volumes."""
    objects: list[Obj] = [
        {"kind": "Node", "metadata": {"name": NODE}, "spec": {}},
        {"kind": "StorageClass", "metadata": {"name": "nfs"}, "provisioner": "nfs.csi.k8s.io"},
    ]
    for pod in pods:
        volumes: list[Obj] = [
            {"name": "scratch", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
            {"name": "config", "configMap": {"name": "train-config"}},
            {"name": "kube-api-access", "projected": {"sources": []}},
        ]
        if pod.pv is not None:
            claim = f"ckpt-{pod.name}"
            volumes.append({"name": "ckpt", "persistentVolumeClaim": {"claimName": claim}})
            objects.append(
                {
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim, "namespace": pod.namespace},
                    "spec": {"volumeName": pod.pv, "storageClassName": "nfs", "accessModes": ["ReadWriteMany"]},
                    "status": {"phase": "Bound"},
                }
            )
            objects.append(
                {
                    "kind": "PersistentVolume",
                    "metadata": {"name": pod.pv},
                    "spec": {
                        "storageClassName": "nfs",
                        "csi": {"driver": "nfs.csi.k8s.io", "volumeHandle": f"10.0.0.5#exports#{pod.pv}"},
                        "claimRef": {"namespace": pod.namespace, "name": claim},
                    },
                }
            )
        objects.append(
            {
                "kind": "Pod",
                "metadata": {
                    "name": pod.name,
                    "namespace": pod.namespace,
                    "uid": pod.uid,
                    "ownerReferences": [
                        {"kind": "Job", "name": f"train-{pod.index:03d}", "uid": f"job-{pod.index}", "controller": True}
                    ],
                },
                "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 30, "volumes": volumes},
                "status": {"phase": "Running"},
            }
        )
    return objects


# -- the checkpoints


def safetensors_bytes(name: str) -> bytes:
    """A well-formed safetensors file holding one float32 tensor of 4 values."""
    header = json.dumps(
        {"__metadata__": {"format": "pt"}, name: {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    )
    return struct.pack("<Q", len(header)) + header.encode() + bytes(16)


def checkpoint_files(step: int, torch_zip: bytes) -> list[tuple[str, bytes]]:
    """The files of one Hugging Face Trainer checkpoint, FILES_PER_CHECKPOINT of them."""
    shard = "model-{:05d}-of-{:05d}.safetensors"
    weights = {f"layers.{k}.weight": shard.format(k + 1, SHARDS) for k in range(SHARDS)}
    state = {"global_step": step, "epoch": step / 1000, "log_history": [{"step": step, "loss": 2.0 - step / 10_000}]}
    files = [
        ("config.json", b'{"model_type": "llama", "num_hidden_layers": 22}'),
        ("generation_config.json", b'{"do_sample": true}'),
        ("trainer_state.json", json.dumps(state).encode()),
        ("training_args.bin", torch_zip),
        ("optimizer.pt", torch_zip),
        ("scheduler.pt", torch_zip),
        (
            "model.safetensors.index.json",
            json.dumps({"metadata": {"total_size": 16 * SHARDS}, "weight_map": weights}).encode(),
        ),
        ("tokenizer.json", b'{"version": "1.0", "model": {"type": "BPE"}}'),
        ("tokenizer_config.json", b'{"model_max_length": 4096}'),
        ("special_tokens_map.json", b'{"bos_token": "<s>"}'),
    ]
    files += [(f"rng_state_{r}.pth", torch_zip) for r in range(RANKS)]
    files += [(shard.format(k + 1, SHARDS), safetensors_bytes(f"layers.{k}.weight")) for k in range(SHARDS)]
    assert len(files) == FILES_PER_CHECKPOINT
    return files


def run_dirs(pods: list[Pod], nfs: int, runs: int) -> list[str]:
    """Where each run writes (host paths): most on the pods' NFS volumes, one in EPHEMERAL_EVERY in an emptyDir of a
    pod without one."""
    out = []
    for r in range(runs):
        if r % EPHEMERAL_EVERY == EPHEMERAL_EVERY - 1 and len(pods) > nfs:
            pod = pods[nfs + (r // EPHEMERAL_EVERY) % (len(pods) - nfs)]
            out.append(f"{pod.scratch}/run-{r:03d}")
        else:
            out.append(f"{pods[r % nfs].nfs_mountpoint}/checkpoints/run-{r:03d}")
    return out


def default_parent() -> str | None:
    """/dev/shm where it has room (a tmpfs: the files are written in seconds, where a busy disk takes a minute and
    more), else None: the system's temporary directory."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 << 30:
        return shm
    return None


def lay_out_checkpoints(rootfs: Path, runs: list[str]) -> int:
    """Write every run's checkpoints under ``rootfs``, files and directories dated an hour back; the files written."""
    with tempfile.TemporaryDirectory() as tmp:
        torch_like_zip(Path(tmp) / "t.pt")
        torch_zip = (Path(tmp) / "t.pt").read_bytes()
    then = time.time() - 3600
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    written = 0
    dirs: set[str] = set()
    for run in runs:
        run_dir = str(rootfs) + run
        for c in range(CHECKPOINTS_PER_RUN):
            step = 500 * (c + 1)
            ckpt = f"{run_dir}/checkpoint-{step}"
            os.makedirs(ckpt)
            dirs.add(ckpt)
            for name, data in checkpoint_files(step, torch_zip):
                fd = os.open(f"{ckpt}/{name}", flags, 0o644)
                try:
                    os.write(fd, data)
                    os.utime(fd, (then, then))
                finally:
                    os.close(fd)
                written += 1
        up = run_dir
        while up != str(rootfs) and up not in dirs:
            dirs.add(up)
            up = os.path.dirname(up)
    for d in sorted(dirs, key=len, reverse=True):  # deepest first: dating a directory's entries moves its mtime
        os.utime(d, (then, then))
    return written


# -- the GPUs


def nvml_script(pids: list[int], tick: int) -> str:
    """8 busy GPUs, one process each; utilisation, memory and power move with ``tick``."""
    lines = ["driver 550.54.15"]
    for i, pid in enumerate(pids):
        util = 55 + round(40 * math.sin(tick / 7 + i))
        lines.append(
            f"gpu {i} uuid=GPU-{i:08x}-0000-0000-0000-{i:012x} name=NVIDIA_H100_80GB_HBM3 util={util} "
            f"mem_util={util // 2} mem_used={40 * GIB + (tick % 64) * (GIB // 16)} mem_reserved={GIB // 2} "
            f"mem_total={80 * GIB} power_mw={300_000 + util * 3_000} temp={45 + util // 4} throttle=0 sample_ms=166"
        )
        lines.append(f"proc {i} pid={pid} used={30 * GIB} sm={util}")
    return "\n".join(lines) + "\n"


def gpu_processes(proc: Path, pods: list[Pod]) -> list[subprocess.Popen[bytes]]:
    """A sleeping child per GPU, each seen by the agent in pod i's container: ``<procfs>/PID`` holds a link to every
    entry of the real /proc/PID but ``cgroup``, which names the pod's container."""
    sleepers = []
    for i in range(GPUS):
        child = subprocess.Popen(["sleep", "100000"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        sleepers.append(child)
        entry = proc / str(child.pid)
        entry.mkdir()
        for name in os.listdir(f"/proc/{child.pid}"):
            if name != "cgroup":
                os.symlink(f"/proc/{child.pid}/{name}", entry / name)
        uid = pods[i].uid.replace("-", "_")
        (entry / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
            f"cri-containerd-{i:064x}.scope\n"
        )
    return sleepers


# -- what the agent saw


def add_lustre_stats(tree: Path) -> None:
    """The client counters of the GPU node's Lustre mount (``/lustre``, filesystem ``lustrefs``), as its kernel
    module keeps them: without them the Lustre collector fails on every round."""
    llite = tree / "sys" / "kernel" / "debug" / "lustre" / "llite" / "lustrefs-ffff9bc043537800"
    llite.mkdir(parents=True)
    shutil.copy(LUSTRE_STATS, llite / "stats")


def api_status(port: int) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(get(f"http://127.0.0.1:{port}/api/status", timeout=30))
    return status


def what_it_saw(status: dict[str, Any]) -> dict[str, Any]:
    """Counts from the agent's /api/status, to check that it saw the node the bench built."""
    runs = status.get("checkpoints") or []
    left_out = status.get("left_out") or {}
    mounts = status.get("mounts") or []
    return {
        "gpus": sum(1 for g in status.get("gpus") or [] if g.get("up")),
        "gpu_processes_in_pods": sum(1 for g in status.get("gpus") or [] for p in g["processes"] if p.get("pod")),
        "kube_api_up": bool((status.get("kubernetes") or {}).get("api_up")),
        "nfs_mounts_with_pvc": sum(1 for m in mounts if m["fstype"] == "nfs4" and (m.get("kube") or {}).get("pvc")),
        # The status lists 100 runs (the agent's bound on runs with rows and series of their own) and counts the rest.
        "checkpoint_runs": len(runs) + left_out.get("runs", 0),
        "listed_runs_not_whole": sum(
            1 for r in runs if r["kept"] != CHECKPOINTS_PER_RUN or r["corrupt"] or r["unsafe"] or r["incomplete"]
        ),
        "findings": len(status.get("findings") or []) + left_out.get("findings", 0),
        "policy_rules": sum(1 for r in (status.get("policy") or {}).get("rules") or [] if r.get("enabled")),
        "collectors_failing": sorted(c["name"] for c in status.get("collectors") or [] if c.get("state") == "failed"),
    }


def logged_within(line: str, window: list[float]) -> bool:
    """Whether a line of the agent's log (``2026-11-28 04:41:56,937 WARNING ...``, local time) falls in the window."""
    try:
        at = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return False
    return window[0] - 1 <= at <= window[1]


def check_saw(saw: dict[str, Any], expect: dict[str, Any]) -> list[str]:
    """What the agent did not see of what was built (empty: it saw everything)."""
    return [f"{key}: saw {saw.get(key)}, built {want}" for key, want in expect.items() if saw.get(key) != want]


# -- the run


@dataclass
class Node:
    """What the bench built: the tree, the fake NVML library and API server, and the GPU processes."""

    tree: Path
    pods: list[Pod]
    mountpoints: list[str]
    runs: int
    files: int
    checkpoint_seconds: float
    build_seconds: float
    nvml: FakeNVML
    api: FakeKubeAPI
    sleepers: list[subprocess.Popen[bytes]]

    @property
    def gpu_pids(self) -> list[int]:
        return [s.pid for s in self.sleepers]


@contextmanager
def built_node(args: argparse.Namespace) -> Iterator[Node]:
    """Build the node (see the docstring at the top); take it all down afterwards."""
    t0 = time.monotonic()
    runs = math.ceil(args.files / FILES_PER_RUN)
    pods = make_pods(args.pods, args.nfs)
    mountpoints = [p.nfs_mountpoint for p in pods[: args.nfs]]
    tree = make_tree(args.devices, args.nfs, mountpoints, parent=args.dir or default_parent())
    api = FakeKubeAPI()
    sleepers: list[subprocess.Popen[bytes]] = []
    try:
        add_lustre_stats(tree)
        for pod in pods:
            (tree / "root" / pod.scratch.lstrip("/")).mkdir(parents=True, exist_ok=True)
        t1 = time.monotonic()
        files = lay_out_checkpoints(tree / "root", run_dirs(pods, args.nfs, runs))
        checkpoint_seconds = time.monotonic() - t1
        try:
            nvml = FakeNVML(build_fake_nvml(tree / "nvml").parent, tree)
        except FakeNVMLUnavailable as err:
            raise HarnessError(str(err)) from err
        sleepers = gpu_processes(tree / "proc", pods)
        nvml.write_script(nvml_script([s.pid for s in sleepers], 0))
        api.start()
        for obj in kube_objects(pods):
            api.add(obj)
        yield Node(
            tree,
            pods,
            mountpoints,
            runs,
            files,
            checkpoint_seconds,
            time.monotonic() - t0,
            nvml,
            api,
            sleepers,
        )
    finally:
        for s in sleepers:
            terminate(s)
        api.stop()
        shutil.rmtree(tree, ignore_errors=True)


def measure(node: Node, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Run the agent on the node and measure it: the figures, what it saw, and what it logged."""
    cfg = node.tree / "storwatch.yaml"
    cfg.write_text(
        f"paths: {{procfs: {node.tree / 'proc'}, sysfs: {node.tree / 'sys'}, rootfs: {node.tree / 'root'}}}\n"
        + ("" if args.torch_load else "checkpoints: {deep_torch_load: false}\n")
        + os.environ.get("BENCH_EXTRA_CONFIG", "")
    )
    env = {**os.environ, **node.nvml.env(), "PYTHONPATH": str(ROOT), "NODE_NAME": NODE}
    env["KUBECONFIG"] = str(node.api.kubeconfig(node.tree))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    port = free_port()
    log_path = node.tree / "agent.log"
    with open(log_path, "wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "storwatch", "agent", "--config", str(cfg), "--listen", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )

    def tick(n: int) -> None:
        write_tick(node.tree / "proc", args.devices, args.nfs, n, node.mountpoints)
        node.nvml.write_script(nvml_script(node.gpu_pids, n))

    expect: dict[str, Any] = {
        "gpus": GPUS,
        "gpu_processes_in_pods": GPUS,
        "kube_api_up": True,
        "nfs_mounts_with_pvc": args.nfs,
        "checkpoint_runs": node.runs,
        "listed_runs_not_whole": 0,
    }
    last_seen: list[dict[str, Any]] = []

    def first_walk_done() -> bool:
        """Every run found and every checkpoint checked: the first walk of the tree is start-up (the cheap check of
        every file), not the steady state, and takes longer than the warm-up on a slow machine."""
        saw = what_it_saw(api_status(port))
        last_seen[:] = [saw]
        return (
            saw["checkpoint_runs"] == expect["checkpoint_runs"]
            and saw["listed_runs_not_whole"] == 0
            and "checkpoints" not in saw["collectors_failing"]
        )

    try:
        try:
            figures, body = measure_agent(
                agent,
                port,
                seconds=args.seconds,
                warmup=args.warmup,
                scrape_interval=args.scrape_interval,
                tick=tick,
                ready_timeout=120.0,
                settled=first_walk_done,
                settle_timeout=args.settle_timeout,
            )
        except HarnessError as err:
            raise HarnessError(f"{err}; it had seen: {last_seen[0] if last_seen else 'nothing'}") from None
        figures["pace_seconds"] = pace_of(body)
        saw = what_it_saw(api_status(port))
        missing = check_saw(saw, expect)
        if not saw["policy_rules"]:
            missing.append("policy_rules: no rule of the default policy set is enabled")
        if missing:
            raise HarnessError("the agent did not see the node the bench built: " + "; ".join(missing))
    except HarnessError as err:
        tail = log_path.read_text(errors="replace").splitlines()[-20:]
        raise HarnessError(f"{err}\nthe agent's log ends:\n  " + "\n  ".join(tail)) from None
    finally:
        helpers = descendants(agent.pid)
        terminate(agent)
        for pid in helpers:
            kill_pid_if_alive(pid)
    return figures, saw, log_path.read_text(errors="replace")


PACE_GAUGES = {"tick": "storwatch_tick_interval_seconds", "view": "storwatch_view_interval_seconds"}


def pace_of(body: str) -> dict[str, float | None]:
    """The agent's pace at the end, from its last scrape: seconds between ticks and between Views."""
    values = {}
    for line in body.splitlines():
        name, _, value = line.partition(" ")
        if name in PACE_GAUGES.values():
            values[name] = float(value)
    return {key: values.get(name) for key, name in PACE_GAUGES.items()}


THREADS_SHOWN = 8
"""The agent's threads named in the report, the busiest first (all of them are in --json)."""


def report(
    node: Node,
    args: argparse.Namespace,
    figures: dict[str, Any],
    saw: dict[str, Any],
    logged: str,
    warnings: list[str],
) -> None:
    share, rss = figures["cpu_share_of_one_core"], figures["family_rss_max_bytes"] or 0
    cpu_ok, rss_ok = share < TARGET_CPU_SHARE, rss < TARGET_RSS_BYTES
    scrape = figures["scrape_seconds"]
    complaints = [line for line in logged.splitlines() if " WARNING " in line or " ERROR " in line]
    in_window = [line for line in complaints if logged_within(line, figures["window_unix"])]
    print(
        f"the agent saw {saw['gpus']} GPUs ({saw['gpu_processes_in_pods']} processes in their pods), "
        f"{saw['nfs_mounts_with_pvc']} NFS mounts joined to their pods' PVCs, {saw['checkpoint_runs']} runs (those "
        f"listed with all {CHECKPOINTS_PER_RUN} checkpoints complete), {saw['findings']} findings, "
        f"{saw['policy_rules']} policy rules; it logged {len(complaints)} warnings or errors, "
        f"{len(in_window)} of them in the measured window"
        + (f"; failing at the end: {', '.join(saw['collectors_failing'])}" if saw["collectors_failing"] else "")
    )
    print(
        f"start-up: ready {figures['ready_seconds']:.1f} s after start, first walk of the checkpoints done after "
        f"{figures['settle_seconds']:.1f} s"
    )
    print(
        f"measured {figures['seconds']:.0f} s after {args.warmup:g} s of warm-up: {figures['series']:,} series, "
        + (
            f"{figures['scrapes']} scrapes, p50 {scrape['p50'] * 1e3:.1f} ms, max {scrape['max'] * 1e3:.1f} ms"
            if scrape
            else "no scrapes"
        )
        + (f", {len(figures['scrape_errors'])} failed" if figures["scrape_errors"] else "")
        + "; pace at the end: "
        + ", ".join(
            f"{key}s {'unknown' if v is None else f'{v:g} s'} apart" for key, v in figures["pace_seconds"].items()
        )
    )
    print(
        f"{verdict(cpu_ok)}  CPU {share * 100:.2f} % of one core (agent {figures['agent_cpu_share'] * 100:.2f} % + "
        f"helpers {figures['helper_cpu_share'] * 100:.2f} %), target < 1 %"
    )
    print(
        f"{verdict(rss_ok)}  RSS max, agent + helpers, from start-up on: {rss / 1e6:.1f} MB ({rss / 2**20:.1f} MiB); "
        f"the agent alone at the end {(figures['rss_bytes'] or 0) / 1e6:.1f} MB; target < 150 MB"
    )
    print(
        f"      in the measured window at most {(figures['family_rss_max_in_window_bytes'] or 0) / 1e6:.1f} MB; "
        f"start-up work done {figures['settled_at_seconds']:.0f} s after the agent started"
    )
    for name, proc in figures["processes"].items():
        print(
            f"      {name:28} {proc['cpu_share'] * 100:6.2f} % of a core, RSS max {proc['rss_max_bytes'] / 1e6:6.1f} MB"
        )
    busiest = [(name, share) for name, share in figures["agent_threads"].items() if share > 0][:THREADS_SHOWN]
    if busiest:
        print("      the agent's busiest threads: " + ", ".join(f"{n} {share * 100:.2f} %" for n, share in busiest))
    ref, steal = reference_cpu_ms(), figures["steal_share"]
    print(
        f"machine: a reference loop took {ref:.1f} ms of CPU; steal "
        f"{'unknown' if steal is None else f'{steal * 100:.1f}%'} of the CPUs during the run"
    )
    for line in (in_window or complaints)[:5]:
        print(f"  agent log{' (measured window)' if in_window else ''}: {line}")
    write_json(
        args.json,
        {
            "machine": machine_info(),
            "warnings": warnings,
            "reference_cpu_ms": ref,
            "node": {
                "deep_torch_load": args.torch_load,
                "block_devices": args.devices,
                "nfs_mounts": args.nfs,
                "gpus": GPUS,
                "pods": args.pods,
                "checkpoint_files": node.files,
                "checkpoint_runs": node.runs,
                "build_seconds": node.build_seconds,
                "checkpoint_files_seconds": node.checkpoint_seconds,
            },
            "agent": figures,
            "saw": saw,
            "agent_log_warnings_or_errors": len(complaints),
            "agent_log_warnings_or_errors_in_window": in_window,
            "targets": {
                "cpu_share": {"value": share, "target": TARGET_CPU_SHARE, "pass": cpu_ok},
                "rss_max_bytes": {"value": rss, "target": TARGET_RSS_BYTES, "pass": rss_ok},
            },
        },
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0, help="the measured window (default 120)")
    ap.add_argument("--warmup", type=float, default=40.0, help="seconds after the first walk before it (default 40)")
    ap.add_argument("--scrape-interval", type=float, default=15.0, help="seconds between scrapes (default 15)")
    ap.add_argument("--files", type=int, default=100_000, help=f"checkpoint files, {FILES_PER_RUN} a run")
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--devices", type=int, default=64, help="busy block devices (default 64)")
    ap.add_argument("--nfs", type=int, default=64, help="busy NFS mounts, the first pods' volumes (default 64)")
    ap.add_argument(
        "--settle-timeout", type=float, default=900.0, help="seconds the first walk of the checkpoints may take"
    )
    ap.add_argument(
        "--torch-load",
        action="store_true",
        help="leave checkpoints.deep_torch_load on (default: off, as in the shipped image, which has no torch)",
    )
    ap.add_argument("--dir", help="where the temporary tree goes (default /dev/shm where it has room)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    if not GPUS <= args.nfs <= args.pods:
        ap.error(f"need {GPUS} <= --nfs <= --pods (the GPU processes run in pods with an NFS volume)")
    warnings = quiet_machine_warnings()
    if importlib.util.find_spec("kubernetes_validate") is not None:
        # The Kubernetes client's dynamic module imports it whenever it is installed (with jsonschema and rpds).
        warnings.append(
            "kubernetes-validate is installed (the tests' manifest check): the agent imports it through the "
            "Kubernetes client, about 3 MB of RSS that the image (pip install .) does not have"
        )
    for w in warnings:
        print(f"WARNING: {w}")
    try:
        with built_node(args) as node:
            print(
                f"built in {node.build_seconds:.1f} s: {node.files:,} checkpoint files in {node.runs} runs "
                f"({node.checkpoint_seconds:.1f} s, {node.files / node.checkpoint_seconds:,.0f} files/s, under "
                f"{node.tree}), {args.devices} block devices and {args.nfs} NFS mounts busy every second, {GPUS} "
                f"GPUs, {args.pods} pods",
                flush=True,
            )
            print(
                f"agent started; waiting for its first walk of the checkpoints, then {args.warmup:g} s of warm-up, "
                f"then {args.seconds:g} s measured ...",
                flush=True,
            )
            figures, saw, logged = measure(node, args)
        report(node, args, figures, saw, logged, warnings)
    except HarnessError as err:
        print(f"harness error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
