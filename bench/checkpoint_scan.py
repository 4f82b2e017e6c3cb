#!/usr/bin/env python3
"""Checkpoint discovery walk against ``find``, on a tree of 100,000 files, all measured in one run.

The tree: 1,000 directories (10 jobs x 100 parts) of 100 small files each, 101,010 entries in all; a few are
checkpoint-like (10 ``checkpoint-N`` directories with ``trainer_state.json``, 20 ``*.pt`` files, 5 torch DCP
directories). It is built once in the temporary directory with os.open/os.write, its mtimes set an hour back (a
node's checkpoints are mostly settled ones), and reused while present.

Measured (median of 3 each, in this order, after one unmeasured ``find`` to bring the tree into the caches):
  find ROOT -printf '%s %T@ %p\\n' > /dev/null   the peer: lists and stats every entry
  full scan                                     a fresh CheckpointScanner each time
  rescan, nothing changed                       one scanner, primed by a scan that is not counted
  source rescan, nothing changed                what the agent's checkpoint source pays per scan interval:
                                                CheckpointSource.collect() (cheap checks, runs, and wherever the
                                                source runs its walks: in this process, or in its helper process),
                                                primed by one collect that is not counted; wall time, and CPU time of
                                                this process and of its helper processes per collect (each the mean
                                                of a batch of 30 collects)
Caches are NOT dropped (the figures are for a warm dentry/inode cache, as the agent sees on its 30 s cadence).

Targets (PASS/MISS printed; a miss does not change the exit status, only a harness error does):
  full scan / find  <= 1.5
  rescan / find     <= 0.1

Usage: .venv/bin/python bench/checkpoint_scan.py [--tree DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import HarnessError, machine_info, quiet_machine_warnings, verdict, write_json

from storwatch.checkpoints.scan import CheckpointScanner
from storwatch.config import CheckpointsConfig
from storwatch.sources.checkpoints import CheckpointSource

JOBS = 10
PARTS_PER_JOB = 100
FILES_PER_DIR = 100
TARGET_FULL_RATIO = 1.5
TARGET_RESCAN_RATIO = 0.1
RUNS = 3
CPU_BATCH = 30
DONE_MARK = ".storwatch-bench-complete"


def build_tree(root: str) -> tuple[int, int]:
    """Builds the tree unless a complete one is there; returns (directories, files) below root."""
    dirs = files = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    payload = b"0123456789abcdef" * 4
    if not os.path.exists(os.path.join(root, DONE_MARK)):
        os.makedirs(root, exist_ok=True)
        for j in range(JOBS):
            for p in range(PARTS_PER_JOB):
                n = j * PARTS_PER_JOB + p
                if j == 0 and p < 10:
                    name = f"checkpoint-{(p + 1) * 500}"
                elif j == 1 and p < 5:
                    name = f"step_{p}"
                else:
                    name = f"part_{p:03}"
                d = os.path.join(root, f"job_{j:02}", name)
                os.makedirs(d, exist_ok=True)
                for f in range(FILES_PER_DIR):
                    if f == 0 and j == 0 and p < 10:
                        fname = "trainer_state.json"
                    elif f == 0 and j == 1 and p < 5:
                        fname = ".metadata"
                    elif f < 3 and j == 1 and p < 5:
                        fname = f"__{f}_0.distcp"
                    elif f == 0 and j == 2 and p < 20:
                        fname = f"model_{n}.pt"
                    else:
                        fname = f"file_{f:03}.dat"
                    fd = os.open(os.path.join(d, fname), flags, 0o644)
                    try:
                        os.write(fd, payload)
                    finally:
                        os.close(fd)
        # Checkpoints an hour old, as most are on a node: a checkpoint directory written within the scanner's
        # settle_seconds (60 s) is listed again on every scan until it settles, which is not the steady state.
        os.close(os.open(os.path.join(root, DONE_MARK), flags, 0o644))
        then = time.time() - 3600
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                os.utime(os.path.join(dirpath, name), (then, then), follow_symlinks=False)
        os.utime(root, (then, then))
    for _, dirnames, filenames in os.walk(root):
        dirs += len(dirnames)
        files += len(filenames)
    return dirs, files


def children_cpu() -> float:
    """User and system CPU seconds of this process's live child processes (the source's helpers)."""
    total = 0.0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids = f.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_find(root: str) -> None:
    proc = subprocess.run(
        ["find", root, "-printf", "%s %T@ %p\n"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    if proc.returncode != 0:
        raise HarnessError(f"find exited with {proc.returncode}: {proc.stderr.decode(errors='replace')[:300]}")


def run(root: str) -> dict[str, Any]:
    for w in quiet_machine_warnings():
        print(f"WARNING: {w}")
    t0 = time.perf_counter()
    dirs, files = build_tree(root)
    print(f"tree: {root}: {dirs} directories, {files} files (ready in {time.perf_counter() - t0:.1f} s)")
    print("caches: not dropped (warm dentry and inode caches); one unmeasured find first")
    run_find(root)

    find_s = [timed(lambda: run_find(root)) for _ in range(RUNS)]

    full_s: list[float] = []
    result = None
    for _ in range(RUNS):
        scanner = CheckpointScanner([root])
        t = time.perf_counter()
        result = scanner.scan()
        full_s.append(time.perf_counter() - t)
    assert result is not None
    full_stats = result.stats
    if result.truncated:
        raise HarnessError(f"the full scan was truncated: {result.truncated_detail}")

    scanner = CheckpointScanner([root])
    scanner.scan()
    rescan_s: list[float] = []
    for _ in range(RUNS):
        t = time.perf_counter()
        again = scanner.scan()
        rescan_s.append(time.perf_counter() - t)
    rescan_stats = again.stats

    source = CheckpointSource([root], CheckpointsConfig(deep_per_scan=0))
    try:
        source.collect()
        source_s: list[float] = []
        for _ in range(RUNS):
            t = time.perf_counter()
            facts = source.collect()
            source_s.append(time.perf_counter() - t)
        # CPU in clock ticks (10 ms) for the helpers: averaged over a batch of collects, RUNS batches.
        source_cpu: list[float] = []
        helper_cpu: list[float] = []
        for _ in range(RUNS):
            helpers0 = children_cpu()
            cpu0 = time.process_time()
            for _ in range(CPU_BATCH):
                source.collect()
            source_cpu.append((time.process_time() - cpu0) / CPU_BATCH)
            helper_cpu.append((children_cpu() - helpers0) / CPU_BATCH)
        if getattr(facts, "failure", None):
            raise HarnessError(f"the source failed: {facts.failure}")  # type: ignore[attr-defined]
    finally:
        source.close()

    find_med = statistics.median(find_s)
    full_med = statistics.median(full_s)
    rescan_med = statistics.median(rescan_s)
    full_ratio = full_med / find_med
    rescan_ratio = rescan_med / find_med
    print(f"\n{'wall time (ms), median of 3':34s} {'median':>9s}   runs")
    for name, vals in (
        ("find -printf '%s %T@ %p'", find_s),
        ("full scan", full_s),
        ("rescan, nothing changed", rescan_s),
        ("source rescan, nothing changed", source_s),
        ("  its CPU in this process", source_cpu),
        ("  its CPU in helper processes", helper_cpu),
    ):
        print(f"  {name:32s} {statistics.median(vals) * 1000:9.1f}   {' '.join(f'{v * 1000:.1f}' for v in vals)}")
    print(
        f"\nfull scan: {len(result.candidates)} candidates in {len(result.runs)} runs; listed "
        f"{full_stats.dirs_listed} dirs, {full_stats.entries_visited} entries, {full_stats.files_stated} file stats"
    )
    print(
        f"rescan:    listed {rescan_stats.dirs_listed} dirs, reused {rescan_stats.dirs_reused}, "
        f"{rescan_stats.files_stated} file stats"
    )
    print(f"\n{verdict(full_ratio <= TARGET_FULL_RATIO)}   full scan / find = {full_ratio:.2f} (target <= 1.5)")
    print(f"{verdict(rescan_ratio <= TARGET_RESCAN_RATIO)}   rescan / find    = {rescan_ratio:.3f} (target <= 0.1)")
    return {
        "machine": machine_info(),
        "tree": {"root": root, "dirs": dirs, "files": files},
        "caches_dropped": False,
        "find_seconds": find_s,
        "full_scan_seconds": full_s,
        "rescan_seconds": rescan_s,
        "source_rescan_seconds": source_s,
        "source_rescan_cpu_seconds": source_cpu,
        "source_rescan_helper_cpu_seconds": helper_cpu,
        "full_over_find": full_ratio,
        "rescan_over_find": rescan_ratio,
        "full_pass": full_ratio <= TARGET_FULL_RATIO,
        "rescan_pass": rescan_ratio <= TARGET_RESCAN_RATIO,
        "candidates": len(result.candidates),
        "runs": len(result.runs),
        "full_dirs_listed": full_stats.dirs_listed,
        "rescan_dirs_listed": rescan_stats.dirs_listed,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--tree", default=os.path.join(tempfile.gettempdir(), "storwatch-bench-checkpoint-tree"))
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    try:
        result = run(args.tree)
    except (HarnessError, OSError, subprocess.SubprocessError) as err:
        print(f"checkpoint_scan: harness error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
