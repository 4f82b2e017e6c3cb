#!/usr/bin/env python3
"""How far repeated ``storwatch plan`` runs on one mount stray from each other: an ext4 image made here (written
through with zeros first, and made with its inode tables and journal initialised at once, so that neither a hole in
the image nor ext4's lazy initialisation in the background moves the figures), on its own loop device
(``--direct-io=on``: its writes cost what the disk under the image costs), measured ``--runs`` times one after
another with the same arguments. Prints each run's throughput and the spread, (max - min) / median; the
target is at most 10 %. A spread is a property of the machine as much as of the code, so it lives here and in
BENCHMARKS.md, never in a test.

With ``--mount DIR`` an existing mount is measured instead of a fresh loop mount (the root disk, a tmpfs). Arguments
after ``--`` go to ``storwatch plan`` as they are (e.g. ``-- --size 64M``). With ``--baseline DIR`` the same runs are
made with another checkout's code too (e.g. an older commit unpacked with ``git archive``), on the same mount, the
two taking turns.

Usage (as root): .venv/bin/python bench/plan_spread.py [--runs 5] [--image-mb 4096] [--mount DIR]
       [--baseline DIR] [-- PLAN ARGS...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT
from tests.realmounts import loop_ext4_mount

TARGET_SPREAD = 0.10
"""Repeated runs on one mount should agree within this: (max - min) / median."""


@contextlib.contextmanager
def mount_to_measure(existing: str | None, image_mb: int) -> Iterator[str]:
    if existing is not None:
        yield existing
        return
    with (
        tempfile.TemporaryDirectory(prefix="storwatch-plan-spread-") as tmp,
        loop_ext4_mount(
            Path(tmp, "mnt"),
            size_mb=image_mb,
            mkfs_args=("-E", "lazy_itable_init=0,lazy_journal_init=0"),
            losetup_args=("--direct-io=on",),
            preallocate=True,
        ) as loop,
    ):
        yield str(loop.mountpoint)


def one_plan(code: Path, mount: str, extra: Sequence[str]) -> tuple[dict[str, Any], float]:
    """One ``storwatch plan --json`` run of the checkout at ``code``: its row for ``mount`` and its wall time."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "storwatch", "plan", "--mount", mount, "--json", *extra],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=code,
        env=env,
        check=False,
    )
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"storwatch plan failed ({out.returncode}): {out.stderr}")
    (row,) = json.loads(out.stdout)["mounts"]
    return row, wall


def show_run(label: str, i: int, row: dict[str, Any], wall: float) -> float:
    rate = float(row["throughput_bytes_per_second"])
    each = ", ".join(f"{r / 1e6:,.0f}" for r in row.get("round_throughputs", ()))
    busy = row.get("cpu_pressure")
    print(
        f"{label} run {i + 1}: {rate / 1e6:,.0f} MB/s (rounds: {each or '-'}; test files of {row['test_bytes']} "
        f"bytes, direct {row['direct_io']}, {wall:.1f} s, "
        f"cpu pressure {'-' if busy is None else format(busy, '.0%')}, load {os.getloadavg()[0]:.2f})",
        flush=True,
    )
    return rate


def summary(label: str, rates: list[float]) -> None:
    mid = statistics.median(rates)
    print(
        f"{label}: median {mid / 1e6:,.0f} MB/s, min {min(rates) / 1e6:,.0f}, max {max(rates) / 1e6:,.0f}, "
        f"spread (max - min) / median {(max(rates) - min(rates)) / mid:.1%}, "
        f"largest from median {max(abs(r - mid) for r in rates) / mid:.1%}",
        flush=True,
    )
    spread = (max(rates) - min(rates)) / mid
    verdict = "PASS" if spread <= TARGET_SPREAD else "MISS"
    print(f"{verdict} {label}: spread {spread:.1%} (target <= {TARGET_SPREAD:.0%})", flush=True)


def main() -> int:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--image-mb", type=int, default=4096)
    parser.add_argument("--mount", default=None, help="an existing mount to measure instead of a fresh loop mount")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout to measure in turn")
    args = parser.parse_args(argv)
    with mount_to_measure(args.mount, args.image_mb) as mount:
        print(f"measuring {mount}, plan arguments: {' '.join(extra) or '(none)'}", flush=True)
        # Interleaved with the baseline, taking turns to go first, so that both see the machine as it was
        checkouts = [("this checkout", ROOT)]
        if args.baseline is not None:
            checkouts.append(("baseline", args.baseline.resolve()))
        rates: dict[str, list[float]] = {label: [] for label, _ in checkouts}
        for i in range(args.runs):
            for label, code in checkouts if i % 2 else checkouts[::-1]:
                rates[label].append(show_run(label, i, *one_plan(code, mount, extra)))
        for label, _ in checkouts:
            summary(label, rates[label])
    return 0


if __name__ == "__main__":
    sys.exit(main())
