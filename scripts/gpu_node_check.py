#!/usr/bin/env python3
"""Check storwatch on a node with a real NVIDIA driver and a real torch training loop; exit 0 when every check holds.

What CI cannot run (it has no GPU): this starts

1. a torch training loop on GPU 0 (a stack of linear layers, AdamW, bf16 autocast) that saves its state with
   ``storwatch.training.atomic_save`` every ``--save-every`` seconds into ``<tmp>/ckpt/run1`` and polls
   ``checkpoint_requested`` every step, keeping the newest three checkpoints;
2. the agent (``python -m storwatch agent``) with its checkpoint root at ``<tmp>/ckpt``;

then compares what the agent reports with ``nvidia-smi`` and with the loop's own account, touches the checkpoint
request file the way the policy engine will and waits for the loop's answer, runs ``storwatch verify --deep`` on the
run, and times ``GPUSource.collect()`` against the real driver. Every reading is printed and, with ``--out DIR``,
written as JSON beside the agent's last /metrics and /api/status.

Needs: an NVIDIA driver, torch with CUDA, and storwatch's dependencies (the Kubernetes client only on a cluster).
Usage (from the repository root): PYTHONPATH=. python3 scripts/gpu_node_check.py [--seconds 60] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRAINER = textwrap.dedent(
    """
    import os, sys, time, json
    import torch
    from storwatch.training import atomic_save, checkpoint_requested, REQUEST_NAME

    run_dir, seconds, save_every, report = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    width, depth = 4096, 6
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8192, width, device=dev)
    saves, answered, step = [], [], 0
    start = last_save = time.time()
    while time.time() - start < seconds:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        requested = checkpoint_requested(run_dir)
        if requested or time.time() - last_save >= save_every:
            torch.cuda.synchronize()
            ev = atomic_save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                             os.path.join(run_dir, f"step-{step:06d}.pt"), step=step)
            saves.append({"path": ev.path, "start": ev.start, "end": ev.end, "bytes": ev.bytes, "step": step})
            if requested:
                answered.append({"step": step, "at": ev.end})
            last_save = time.time()
            names = sorted(n for n in os.listdir(run_dir) if n.startswith("step-") and n.endswith(".pt"))
            for old in names[:-3]:
                os.unlink(os.path.join(run_dir, old))
    torch.cuda.synchronize()
    with open(report, "w") as f:
        json.dump({"pid": os.getpid(), "steps": step, "saves": saves, "answered": answered,
                   "reserved_bytes": torch.cuda.memory_reserved(dev)}, f)
    """
)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def smi(query: str, kind: str = "gpu") -> list[list[str]]:
    flag = "--query-gpu" if kind == "gpu" else "--query-compute-apps"
    out = subprocess.run(
        ["nvidia-smi", f"{flag}={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def metric(text: str, name: str, **labels: str) -> list[float]:
    out = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            out.append(float(line.rsplit(" ", 1)[1]))
    return out


class Checks:
    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def check(self, ok: bool, what: str, seen: Any) -> None:
        self.results.append({"ok": bool(ok), "check": what, "seen": seen})
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {seen}", flush=True)

    @property
    def failed(self) -> int:
        return sum(not r["ok"] for r in self.results)


def time_collect(ticks: int, spacing: float = 0.5, samples_interval: float | None = None) -> dict[str, Any]:
    """CPU of GPUSource.collect() (every thread of this process) over ``ticks`` collects ``spacing`` s apart; the mean
    includes the buffered reads that come once per samples interval."""
    from storwatch.sources.gpu import BUFFERED_READ_SECONDS, GPUSource

    interval = BUFFERED_READ_SECONDS if samples_interval is None else samples_interval
    src = GPUSource(interval_seconds=1.0, samples_interval_seconds=interval)
    t0 = time.process_time()
    first = src.collect()
    first_cpu = time.process_time() - t0
    cpu = []
    for _ in range(ticks):
        time.sleep(spacing)
        t = time.process_time()
        facts = src.collect()
        cpu.append(time.process_time() - t)
    src.close()
    mean = sum(cpu) / len(cpu)
    cpu.sort()
    return {
        "samples_interval_seconds": interval,
        "collect_cpu_ms_mean": round(mean * 1e3, 3),
        "gpus": len(facts.gpus),
        "nvml_up": first.nvml_up,
        "driver": first.driver_version,
        "first_collect_cpu_ms": round(first_cpu * 1e3, 3),
        "collect_cpu_ms_p50": round(cpu[len(cpu) // 2] * 1e3, 3),
        "collect_cpu_ms_p99": round(cpu[min(len(cpu) - 1, int(len(cpu) * 0.99))] * 1e3, 3),
        "ticks": ticks,
    }


def profile_calls(ticks: int) -> list[dict[str, Any]]:
    """Wall and CPU time of each NVML function over ``ticks`` collects, sample buffers read every tick: what each
    call costs on a real driver."""
    import pynvml

    from storwatch.sources.gpu import GPUSource

    totals: dict[str, list[float]] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            w, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                t = totals.setdefault(name, [0, 0.0, 0.0])
                t[0] += 1
                t[1] += time.perf_counter() - w
                t[2] += time.thread_time() - c

        return wrapper

    originals = {n: getattr(pynvml, n) for n in dir(pynvml) if n.startswith("nvml") and callable(getattr(pynvml, n))}
    for n, fn in originals.items():
        setattr(pynvml, n, timed(n, fn))
    try:
        src = GPUSource(interval_seconds=1.0, samples_interval_seconds=0.0)
        src.collect()
        totals.clear()
        for _ in range(ticks):
            time.sleep(0.2)
            src.collect()
        src.close()
    finally:
        for n, fn in originals.items():
            setattr(pynvml, n, fn)
    rows = [
        {
            "fn": n,
            "calls_per_tick": t[0] / ticks,
            "wall_us": round(t[1] / t[0] * 1e6, 1),
            "cpu_us": round(t[2] / t[0] * 1e6, 1),
        }
        for n, t in totals.items()
    ]
    return sorted(rows, key=lambda r: -r["wall_us"] * r["calls_per_tick"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long the training loop runs (default 60)")
    p.add_argument("--save-every", type=float, default=6.0, help="seconds between the loop's saves (default 6)")
    p.add_argument("--out", metavar="DIR", help="write readings.json, metrics.prom and status.json here")
    args = p.parse_args()
    if shutil.which("nvidia-smi") is None:
        print("gpu-node-check: nvidia-smi not found; this check needs a node with an NVIDIA driver", file=sys.stderr)
        return 2
    checks = Checks()
    readings: dict[str, Any] = {"smi_driver": smi("driver_version,name,uuid")}
    print("driver/name/uuid (nvidia-smi):", readings["smi_driver"], flush=True)

    readings["collect_idle"] = time_collect(30)
    print("GPUSource.collect() on the real driver, idle:", readings["collect_idle"], flush=True)
    readings["collect_idle_every_tick"] = time_collect(30, samples_interval=0.0)
    print("  the same, sample buffers read every tick:", readings["collect_idle_every_tick"], flush=True)
    readings["nvml_calls_idle"] = profile_calls(20)
    for row in readings["nvml_calls_idle"]:
        print("  NVML call, idle:", row, flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="storwatch-gpu-check-"))
    run_dir = tmp / "ckpt" / "run1"
    run_dir.mkdir(parents=True)
    (tmp / "config.yaml").write_text(
        "tick_seconds: 1.0\n"
        "checkpoints:\n"
        f"  roots: [{json.dumps(str(tmp / 'ckpt'))}]\n"
        "  interval_seconds: 2.0\n  settle_seconds: 5.0\n  deep_per_scan: 1\n"
        "  deep_max_bytes: 4294967296\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    agent_log = open(tmp / "agent.log", "w")  # noqa: SIM115 (the agent writes it until the end)
    agent = subprocess.Popen(
        [sys.executable, "-m", "storwatch", "agent", "--config", str(tmp / "config.yaml"), "--listen", "127.0.0.1:0"],
        stderr=agent_log,
        stdout=agent_log,
        env=env,
        cwd=tmp,
    )
    report = tmp / "trainer.json"
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(run_dir), str(args.seconds), str(args.save_every), str(report)], env=env
    )
    port = None
    for _ in range(100):
        m = re.search(r"serving on \S+ \(port (\d+)\)", (tmp / "agent.log").read_text())
        if m:
            port = int(m.group(1))
            break
        time.sleep(0.1)
    if port is None:
        print((tmp / "agent.log").read_text(), file=sys.stderr)
        raise SystemExit("gpu-node-check: the agent did not log its port")
    base = f"http://127.0.0.1:{port}"

    samples: list[dict[str, Any]] = []
    requested_at = None
    t_end = time.time() + args.seconds - 2
    while time.time() < t_end:
        time.sleep(2.0)
        status = json.loads(scrape(base + "/api/status"))
        util, mem = smi("utilization.gpu,memory.used")[0]
        apps = smi("pid,used_memory", kind="apps")
        gpus = status["gpus"]
        if gpus:
            g = gpus[0]
            samples.append(
                {
                    "t": round(time.time(), 1),
                    "agent_util": g["utilization_ratio"],
                    "smi_util": float(util) / 100,
                    "agent_mem_mib": None if g["memory_used_bytes"] is None else g["memory_used_bytes"] / 2**20,
                    "smi_mem_mib": float(mem),
                    "agent_procs": [(p["pid"], p["used_memory_bytes"]) for p in g["processes"]],
                    "smi_procs": apps,
                }
            )
            print("sample:", samples[-1], flush=True)
        if "nvml_calls_busy" not in readings and samples and samples[-1]["smi_util"] >= 0.5:
            readings["collect_busy"] = time_collect(20)
            readings["collect_busy_every_tick"] = time_collect(20, samples_interval=0.0)
            readings["nvml_calls_busy"] = profile_calls(10)
            print("GPUSource.collect() while training:", readings["collect_busy"], flush=True)
            print("  the same, sample buffers read every tick:", readings["collect_busy_every_tick"], flush=True)
            for row in readings["nvml_calls_busy"]:
                print("  NVML call, training:", row, flush=True)
        if requested_at is None and time.time() > t_end - args.seconds / 2:
            requested_at = time.time()
            (run_dir / ".storwatch-checkpoint-request").write_text("gpu-node-check: emergency checkpoint\n")
            print("touched the checkpoint request file", flush=True)

    trainer.wait(timeout=120)
    time.sleep(4.0)  # one more checkpoint scan and deep check after the last save
    metrics = scrape(base + "/metrics")
    status = json.loads(scrape(base + "/api/status"))
    trained = json.loads(report.read_text())
    readings.update(
        samples=samples,
        trainer={k: v for k, v in trained.items() if k != "saves"},
        saves=trained["saves"],
        requested_at=requested_at,
    )

    checks.check(
        metric(metrics, "storwatch_nvml_up") == [1.0], "storwatch_nvml_up is 1", metric(metrics, "storwatch_nvml_up")
    )
    smi_uuids = [row[2] for row in readings["smi_driver"]]
    agent_uuids = [g["uuid"] for g in status["gpus"]]
    checks.check(agent_uuids == smi_uuids, "the agent's GPUs are nvidia-smi's, in order", agent_uuids)
    busy = [s for s in samples if s["smi_util"] >= 0.5]
    checks.check(
        bool(busy) and max(s["agent_util"] or 0 for s in busy) >= 0.5,
        "utilization >= 50% while training (nvidia-smi agrees)",
        [(s["agent_util"], s["smi_util"]) for s in samples],
    )
    # Steady samples only: the agent's figure is up to one tick old, so it lags while torch is still allocating.
    mem_pairs = [
        (b["agent_mem_mib"], b["smi_mem_mib"])
        for a, b in itertools.pairwise(samples)
        if b["agent_mem_mib"] is not None and a["smi_mem_mib"] == b["smi_mem_mib"] > 0
    ]
    checks.check(
        bool(mem_pairs) and all(abs(a - b) <= max(0.05 * b, 600) for a, b in mem_pairs),
        "memory used within 5% (or 600 MiB: the v2 struct leaves the driver's reservation out) of nvidia-smi",
        mem_pairs[-3:],
    )
    seen_pid = [s for s in samples if any(pid == trained["pid"] for pid, _ in s["agent_procs"])]
    checks.check(
        len(seen_pid) >= len(samples) // 2,
        f"trainer pid {trained['pid']} among the GPU's processes",
        f"{len(seen_pid)}/{len(samples)} samples",
    )
    proc_mem = [m for s in seen_pid for pid, m in s["agent_procs"] if pid == trained["pid"] and m]
    checks.check(
        bool(proc_mem) and max(proc_mem) >= trained["reserved_bytes"],
        "trainer's GPU memory >= torch.cuda.memory_reserved",
        (max(proc_mem or [0]), trained["reserved_bytes"]),
    )

    runs = [r for r in status["checkpoints"] if r["path"] == str(run_dir)]
    checks.check(len(runs) == 1, "the run directory is found", [r["path"] for r in status["checkpoints"]])
    if runs:
        run = runs[0]
        newest = Path(trained["saves"][-1]["path"]).name
        checks.check(
            run["newest_complete"] is not None and run["newest_complete"].endswith(newest),
            "newest complete checkpoint is the loop's last save",
            (run["newest_complete"], newest),
        )
        checks.check(run["kept"] == min(3, len(trained["saves"])), "kept = the loop's three newest", run["kept"])
        checks.check(
            run["incomplete"] == 0 and run["corrupt"] == 0,
            "nothing incomplete or corrupt",
            (run["incomplete"], run["corrupt"]),
        )
        by_path = {s["path"]: s for s in trained["saves"]}
        timed = [
            (c["write_seconds"], by_path[c["path"]]["end"] - by_path[c["path"]]["start"])
            for c in run["checkpoints"]
            if c["path"] in by_path and c["write_seconds"] is not None
        ]
        checks.check(
            bool(timed) and all(abs(a - b) < 1e-3 for a, b in timed),
            "write seconds are the loop's own (event log)",
            timed,
        )
        checks.check(
            any(c["deep_checked"] for c in run["checkpoints"]),
            "a checkpoint was deep-checked",
            [(Path(c["path"]).name, c["deep_checked"], c["verdict"]) for c in run["checkpoints"]],
        )
        interval = run["interval_seconds"]
        ends = sorted(s["end"] for s in trained["saves"])
        gaps = sorted(b - a for a, b in itertools.pairwise(ends))
        loop_gap = gaps[len(gaps) // 2] if gaps else None
        checks.check(
            interval is not None and loop_gap is not None and abs(interval - loop_gap) <= 1.0,
            "interval within 1 s of the loop's median gap between saves",
            (interval, loop_gap),
        )
    answered = trained["answered"]
    checks.check(
        requested_at is not None and bool(answered) and answered[0]["at"] - requested_at < 10,
        "the loop answered the checkpoint request within 10 s",
        None if not answered or requested_at is None else round(answered[0]["at"] - requested_at, 3),
    )

    verify = subprocess.run(
        [sys.executable, "-m", "storwatch", "verify", "--deep", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    verdicts = (
        [(Path(v["path"]).name, v["verdict"]) for v in json.loads(verify.stdout or "[]")]
        if verify.stdout.strip().startswith("[")
        else verify.stdout[-500:]
    )
    checks.check(verify.returncode == 0, "storwatch verify --deep exits 0", verdicts)
    readings["verify"] = verdicts

    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(timeout=10)
    except subprocess.TimeoutExpired:
        agent.kill()
    checks.check(agent.returncode == 0, "the agent stops cleanly on SIGTERM", agent.returncode)
    readings["checks"] = checks.results
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "readings.json").write_text(json.dumps(readings, indent=1))
        (out / "metrics.prom").write_text(metrics)
        (out / "status.json").write_text(json.dumps(status, indent=1))
        shutil.copy(tmp / "agent.log", out / "agent.log")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(checks.results) - checks.failed}/{len(checks.results)} checks hold", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
