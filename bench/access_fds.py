"""The access source against a GPU process whose 2,000 children each inherit 19,500 open files: the agent's CPU.

Builds the fake NVML library (tests/nvml), starts the tree (tests/fdtree.py: a parent holding --fds open files on a
file under a temporary directory, --children ``sleep`` processes inheriting them), scripts the fake to name the
parent as a process on GPU 0, and runs the agent (access at its defaults: a pass every 5 s, the budgets of
``access.max_*_per_pass``) for --seconds after a warm-up of --warmup seconds. Prints the agent's CPU (itself and its
helper processes, utime+stime from /proc) as a share of one core, and from /metrics the access collector's success,
its passes seen (the number of distinct ``storwatch_workload_scan_cpu_seconds`` values read once a second), and the
last pass's processes, open files and CPU time. With ``--baseline DIR`` the same is measured for another checkout
(e.g. an older commit unpacked with ``git archive``), on the same tree, before this one. Target: <= 5 % of a core.

Usage: .venv/bin/python bench/access_fds.py [--children 2000] [--fds 19500] [--seconds 60] [--warmup 15]
       [--baseline DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, HarnessError, children, cpu_seconds, free_port, terminate, verdict, write_json
from tests.fdtree import fd_tree
from tests.nvml import build_fake_nvml

METRIC = re.compile(r"^(storwatch_(?:collector_success|collector_duration_seconds|workload_scan_\w+)\S*) (\S+)$", re.M)


def scrape(port: int) -> dict[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return dict(METRIC.findall(resp.read().decode()))


def family_cpu(pid: int) -> float:
    total = cpu_seconds(pid) or 0.0
    for child in children(pid):
        total += family_cpu(child)
    return total


def measure(tree: Path, work: Path, lib: Path, script: Path, seconds: float, warmup: float) -> dict[str, Any]:
    port = free_port()
    cfg = work / f"storwatch-{port}.yaml"
    cfg.write_text(
        "platform: generic\nkube: {enabled: false}\ngpu: {interval_seconds: 1.0}\n"
        f"paths: {{rootfs: {work / 'rootfs'}}}\n"
    )
    (work / "rootfs").mkdir(exist_ok=True)
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "FAKE_NVML_SCRIPT": str(script), "PYTHONPATH": str(tree)}
    agent = subprocess.Popen(
        [sys.executable, "-m", "storwatch", "agent", "--config", str(cfg), "--listen", f"127.0.0.1:{port}"],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape(port)
                break
            except OSError:
                if time.monotonic() > deadline or agent.poll() is not None:
                    raise HarnessError(f"the agent in {tree} did not serve") from None
                time.sleep(0.5)
        time.sleep(warmup)
        cpu0, t0 = family_cpu(agent.pid), time.monotonic()
        passes: set[str] = set()
        last: dict[str, str] = {}
        while time.monotonic() - t0 < seconds:
            time.sleep(1.0)
            last = scrape(port)
            if "storwatch_workload_scan_cpu_seconds" in last:
                passes.add(last["storwatch_workload_scan_cpu_seconds"])
        elapsed = time.monotonic() - t0
        cpu = family_cpu(agent.pid) - cpu0
    finally:
        terminate(agent)
    return {
        "cpu_share": cpu / elapsed,
        "seconds": elapsed,
        "access_success": last.get('storwatch_collector_success{collector="access"}'),
        "access_duration_seconds": last.get('storwatch_collector_duration_seconds{collector="access"}'),
        "passes_seen": len(passes),
        "last_pass": {k: v for k, v in last.items() if k.startswith("storwatch_workload_scan")},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--children", type=int, default=2000)
    ap.add_argument("--fds", type=int, default=19_500)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--baseline", type=Path)
    ap.add_argument("--json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lib = build_fake_nvml(work / "nvml")
        with fd_tree(work / "shard", args.children, args.fds) as gpu_pid:
            script = work / "nvml-script.txt"
            script.write_text(
                "gpu 0 uuid=GPU-bench-0000 name=Fake util=50 mem_used=1073741824 mem_total=85899345920\n"
                f"proc 0 pid={gpu_pid} used=1073741824\n"
            )
            print(f"tree: GPU process {gpu_pid}, {args.children} children x {args.fds} open files")
            trees = ({"baseline": args.baseline.resolve()} if args.baseline else {}) | {"this": ROOT}
            report: dict[str, Any] = {"children": args.children, "fds": args.fds}
            for name, tree in trees.items():
                result = report[name] = measure(tree, work, lib, script, args.seconds, args.warmup)
                print(
                    f"{name:9} agent CPU {100 * result['cpu_share']:.1f} % of a core over {result['seconds']:.0f} s; "
                    f"access success {result['access_success']}, last duration "
                    f"{result['access_duration_seconds']} s, passes seen {result['passes_seen']}; "
                    f"last pass {result['last_pass']}"
                )
    ok = report["this"]["cpu_share"] <= 0.05
    print(f"{verdict(ok)} this checkout: {100 * report['this']['cpu_share']:.1f} % of a core (target <= 5 %)")
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
