#!/usr/bin/env python3
"""``storwatch plan``'s measured write throughput next to ``dd oflag=direct conv=fsync`` on the same mounts, in one
run: a speed ratio belongs here, not in a test (a busy machine moves it).

Each mount: dd and storwatch plan write where each other does (a fresh directory at the mount's top), files of the
same size (``--size``: plan runs with ``--size`` and one round, which writes such files, each fsynced, for about a
second; dd writes one), taking turns going first (freeing the other's file, a discard on some disks, slows the next
write), and the median of ``--runs`` is printed for each with the ratio. dd's own cost of reading /dev/zero
(measured alone, to /dev/null, right after) is taken off its time. The loop device and tmpfs to compare on are the
caller's: mount them first (see docs/testing.md); the root disk wanders by 20 % minute to minute, so give it a
larger ``--size`` (plan writes at most a tenth of the free space: give the mount ten times ``--size``). How
steady plan is on its own, run after run, is bench/plan_spread.py's to say.

Usage: .venv/bin/python bench/plan_vs_dd.py --mount / --mount /mnt/loop [--size 1073741824] [--runs 6]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BLOCK = 4 << 20


def dd_seconds(*args: str) -> float:
    out = subprocess.run(
        [shutil.which("dd") or "dd", "bs=4M", "iflag=fullblock", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stderr
    m = re.search(r"^(\d+) bytes .* copied, ([0-9.e-]+) s", out, re.M)
    if m is None:
        raise RuntimeError(f"dd said: {out}")
    return float(m.group(2))


def dd_direct(directory: str, size: int) -> float:
    """dd's bytes per second for ``size`` bytes written with oflag=direct and flushed (conv=fsync, as plan does)."""
    with tempfile.TemporaryDirectory(dir=directory, prefix=".dd-") as d:
        total = dd_seconds("if=/dev/zero", f"of={d}/dd", f"count={size // BLOCK}", "oflag=direct", "conv=fsync")
    reading = dd_seconds("if=/dev/zero", "of=/dev/null", f"count={size // BLOCK}")
    return size / (total - reading)


def plan(mount: str, size: int) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "storwatch", "plan", "--mount", mount, "--size", str(size), "--rounds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
        check=True,
    )
    (row,) = json.loads(out.stdout)["mounts"]
    return float(row["throughput_bytes_per_second"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mount", action="append", required=True)
    parser.add_argument("--size", type=int, default=1 << 30)
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    for mount in args.mount:
        ours, theirs = [], []
        for i in range(args.runs):
            if i % 2:
                ours.append(plan(mount, args.size))
            theirs.append(dd_direct(mount, args.size))
            if not i % 2:
                ours.append(plan(mount, args.size))
        mine, dd = statistics.median(ours), statistics.median(theirs)
        print(f"{mount}: storwatch plan {mine / 1e6:,.0f} MB/s, dd {dd / 1e6:,.0f} MB/s, ratio {mine / dd:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
