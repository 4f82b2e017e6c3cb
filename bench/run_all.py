#!/usr/bin/env python3
"""Runs every benchmark (``make bench``) and prints a short summary of the targets.

Each benchmark runs as its own process with the same interpreter and writes its figures as JSON under bench/out/
(ignored by git). Exit status: 0 when every benchmark ran, whether or not its targets were met; 2 when one of them
could not run (a harness error).

Usage: .venv/bin/python bench/run_all.py [--scrapes 500] [--runs 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def run_one(script: str, args: list[str], out: Path, name: str = "") -> tuple[int, dict[str, Any] | None]:
    """Run one benchmark; its figures go to out/NAME.json (NAME: the script's stem unless given)."""
    json_path = out / ((name or Path(script).stem) + ".json")
    json_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(BENCH / script), *args, "--json", str(json_path)]
    print(f"\n=== {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    rc = subprocess.run(cmd, check=False).returncode
    print(f"=== {script}: exit {rc} after {time.monotonic() - t0:.1f} s", flush=True)
    if rc != 0 or not json_path.exists():
        return rc or 2, None
    return rc, json.loads(json_path.read_text())


def mark(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scrapes", type=int, default=500, help="scrapes per server and mode (default 500)")
    p.add_argument("--runs", type=int, default=20, help="runs of each command in scan_time.py (default 20)")
    p.add_argument("--out", default=str(BENCH / "out"), help="where the JSON figures go (default bench/out)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    u = os.uname()
    print(f"storwatch benchmarks, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, {u.sysname} {u.release}")

    failed: list[str] = []
    rc, scrape = run_one("scrape_latency.py", ["--scrapes", str(args.scrapes)], out)
    if scrape is None:
        failed.append(f"scrape_latency.py (exit {rc})")
    rc, scan = run_one("scan_time.py", ["--runs", str(args.runs)], out)
    if scan is None:
        failed.append(f"scan_time.py (exit {rc})")
    # The I/O sources, latency windows, NVML sampling and checkpoint scan print their own figures and PASS/MISS lines.
    others: dict[str, dict[str, Any] | None] = {}
    for name, script, extra in (
        ("io_sources", "io_sources.py", ["--seconds", "60"]),
        ("io_sources-busy8", "io_sources.py", ["--seconds", "60", "--busy-nfs", "8"]),
        ("latency_windows", "latency_windows.py", []),
        ("gpu_sampling", "gpu_sampling.py", ["--ticks", "20"]),
        ("checkpoint_scan", "checkpoint_scan.py", []),
        ("http_load", "http_load.py", []),
        ("policy_eval", "policy_eval.py", []),
        ("idle_cpu", "idle_cpu.py", ["--seconds", "120", "--warmup", "75"]),
        ("sync_vs_cp", "sync_vs_cp.py", ["--runs", "3"]),
    ):
        rc, others[name] = run_one(script, extra, out, name)
        if rc != 0:
            failed.append(f"{script} (exit {rc})")

    print("\n=== summary (figures are noisy; compare ratios taken in one run only)")
    if scrape is not None:
        t = scrape["targets"]
        sw, ne = scrape["storwatch_fresh"], scrape["node_exporter_fresh"]
        print(
            f"  scrape p50, {'fresh connections:':31s} storwatch {sw['p50'] * 1000:.3f} ms, node_exporter "
            f"{ne['p50'] * 1000:.3f} ms, ratio {t['p50_ratio']['value']:.2f} (target <= {t['p50_ratio']['target']:g})  "
            f"{mark(t['p50_ratio']['pass'])}"
        )
        for key, label in (("paced", "keep-alive, paced"), ("keepalive", "keep-alive, back to back")):
            if f"p50_ratio_{key}" not in t:
                continue
            ka_sw, ka_ne = scrape[f"storwatch_{key}"], scrape[f"node_exporter_{key}"]
            print(
                f"  scrape p50, {label + ':':31s} storwatch {ka_sw['p50'] * 1000:.3f} ms, node_exporter "
                f"{ka_ne['p50'] * 1000:.3f} ms, ratio {t[f'p50_ratio_{key}']['value']:.2f} "
                f"(a check: <= {t[f'p50_ratio_{key}']['target']:g})  "
                f"{mark(t[f'p50_ratio_{key}']['pass'])}"
            )
        m = t["agent_rss_mib"]
        print(
            f"  agent RSS {m['value']:.1f} MiB (with helper {m['with_helper_mib']:.1f} MiB; target agent <= 60 MiB)  "
            f"{mark(m['pass'])}"
        )
    if scan is not None:
        for name, t in scan["targets"].items():
            print(
                f"  {name}: p50 {t['p50_seconds']:.3f} s, max {t['max_seconds']:.3f} s "
                f"(target p50 <= {t['target']:g} s)  {mark(t['pass'])}"
            )
        print(f"  python -c pass p50: {scan['stats']['python -c pass']['p50']:.3f} s (floor)")
        for name, st in scan["stats"].items():
            if name.startswith("scan without"):
                print(f"  {name} (hung mounts left out): p50 {st['p50']:.3f} s")
    summarise_others(others)
    seen: set[str] = set()
    for r in (scrape, scan, others.get("http_load")):
        for w in (r or {}).get("warnings", []):
            if w not in seen:
                seen.add(w)
                print(f"  WARNING: {w}")
    if failed:
        print(f"  HARNESS ERROR in: {', '.join(failed)}")
        return 2
    return 0


def summarise_others(r: dict[str, dict[str, Any] | None]) -> None:
    for name, label in (("io_sources", "all busy"), ("io_sources-busy8", "8 busy")):
        if (io := r.get(name)) is not None:
            share = io["agent"]["cpu_share_of_one_core"] * 100
            print(
                f"  agent CPU at 1 s, 64 devices + 64 NFS mounts, {label}: {share:.2f} % of one core "
                f"(target <= 1 %)  {mark(share <= 1.0)}"
            )
    if (idle := r.get("idle_cpu")) is not None:
        sw, ne = idle["servers"]["storwatch"], idle["servers"]["node_exporter"]
        ratio = sw.get("ratio_to_node_exporter", float("inf"))
        print(
            f"  idle node at defaults, 15 s scrapes: storwatch {sw['cpu_share_of_core'] * 100:.3f} %, node_exporter "
            f"{ne['cpu_share_of_core'] * 100:.3f} % of one core, ratio {ratio:.2f} (target <= 1.0)  "
            f"{mark(ratio <= 1.0)}"
        )
    if (lw := r.get("latency_windows")) is not None:
        t = lw["targets"]["read_ratio"]
        print(f"  latency windows, read / from scratch: {t['value']:.3f} (target <= 0.25)  {mark(t['pass'])}")
    if (gpu := r.get("gpu_sampling")) is not None:
        print(
            f"  NVML sampling, 8 fake GPUs: p99 {gpu['cpu_seconds']['p99'] * 1000:.2f} ms CPU per collect "
            f"(target <= {gpu['target_p99_cpu_seconds'] * 1000:.0f} ms)  {mark(gpu['pass'])}"
        )
    if (hl := r.get("http_load")) is not None:
        if "fresh" in hl:
            f = hl["fresh"]
            print(
                f"  HTTP, 50 scrapers on new connections: storwatch {f['storwatch']['errors']} errors, p99 "
                f"{f['storwatch']['p99'] * 1000:.1f} ms, node_exporter {f['node_exporter']['p99'] * 1000:.1f} ms, "
                f"ratio {f['p99_ratio']:.2f} (target 0 errors, <= 2)  {mark(f['pass'])}"
            )
        if "slow" in hl:
            sl = hl["slow"]["storwatch"]
            print(
                f"  HTTP, 1,000 slow clients: a normal scrape max {sl['max'] * 1000:.1f} ms, {sl['errors']} errors, "
                f"{sl['fds_max']} fds at most (target < 100 ms, 0 errors)  {mark(hl['slow']['pass'])}"
            )
    for label, f in (r.get("sync_vs_cp") or {}).items():
        rounds = f["ratio_cp_sync_read_back_rounds"]
        print(
            f"  storwatch sync, {label}: {f['ratio_cp_sync_read_back']:.2f}x cp -r; sync; read back (rounds "
            f"{rounds[0]:.2f} to {rounds[-1]:.2f}; target >= 1.0)  {mark(f['ratio_cp_sync_read_back'] >= 1.0)}, "
            f"{f['ratio_cp_then_sync']:.2f}x cp -r then sync, {f['ratio_dd']:.2f}x dd oflag=direct (target >= 0.7)  "
            f"{mark(f['ratio_dd'] >= 0.7)}"
        )
    if (ck := r.get("checkpoint_scan")) is not None:
        print(
            f"  checkpoint scan / find: full {ck['full_over_find']:.2f} (target <= 1.5)  {mark(ck['full_pass'])}, "
            f"rescan {ck['rescan_over_find']:.3f} (target <= 0.1)  {mark(ck['rescan_pass'])}"
        )


if __name__ == "__main__":
    sys.exit(main())
