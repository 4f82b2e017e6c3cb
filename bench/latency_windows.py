"""Cost of the per-mount latency windows after an hour of uptime, which a 30 s run of the agent never reaches.

Feeds LatencyWindows one sample a second for --mounts mounts x 3 operations (read, write, fsync) for an hour and
--extra seconds more, reading every mount's summaries every --scrape-interval seconds as a scrape does. Prints the
CPU time of the adds per tick and of the reads per scrape once the hour is full, next to the peer measured in the
same run on the same rings: the minute and hour summarised from scratch from the arrays on every read (what the
windows did before they kept the hour sorted between reads). Target: reads <= 0.25 x the peer.

Usage: .venv/bin/python bench/latency_windows.py [--mounts 64] [--extra 300] [--scrape-interval 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import summary, verdict, write_json
from storwatch.analysis.latency import HOUR, MINUTE, LatencyWindows

OPS = ("read", "write", "fsync")
T0 = 1_700_000_000.0


def run(mounts: int, extra: int, scrape_interval: int) -> dict[str, Any]:
    windows = LatencyWindows()
    rng = random.Random(1)
    mountpoints = [f"/mnt/nfs{m}" for m in range(mounts)]
    add_cpu: list[float] = []
    read_cpu: list[float] = []
    scratch_cpu: list[float] = []
    for second in range(int(HOUR) + extra):
        now = T0 + second
        t0 = time.process_time()
        for mp in mountpoints:
            for op in OPS:
                windows.add(mp, op, now, float(rng.randint(1, 40)), rng.random() / 50)
        add_cpu.append(time.process_time() - t0)
        if second % scrape_interval:
            continue
        t0 = time.process_time()
        kept = [windows.summaries_for(mp, now) for mp in mountpoints]
        t1 = time.process_time()
        rings = windows._rings  # the peer reads the same arrays from scratch
        fresh = [
            {op: (ring.stats(now - MINUTE, now), ring.stats(now - HOUR, now)) for op, ring in rings[mp].items()}
            for mp in mountpoints
        ]
        t2 = time.process_time()
        if second >= HOUR:
            read_cpu.append(t1 - t0)
            scratch_cpu.append(t2 - t1)
            for got, want in zip(kept, fresh, strict=True):  # the two must agree, or the figures mean nothing
                for op, (minute, hour) in want.items():
                    if (got[op].minute, got[op].hour.samples, got[op].hour.max_seconds) != (
                        minute,
                        hour.samples,
                        hour.max_seconds,
                    ):
                        raise SystemExit(f"windows disagree with the from-scratch summary for {op}")
    return {
        "mounts": mounts,
        "keys": mounts * len(OPS),
        "add_cpu_per_tick_s": summary(add_cpu),
        "read_cpu_per_scrape_s": summary(read_cpu),
        "from_scratch_cpu_per_scrape_s": summary(scratch_cpu),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mounts", type=int, default=64)
    ap.add_argument("--extra", type=int, default=300, help="seconds fed after the first hour (default 300)")
    ap.add_argument("--scrape-interval", type=int, default=15)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    result = run(args.mounts, args.extra, args.scrape_interval)
    add, read, scratch = (
        result["add_cpu_per_tick_s"],
        result["read_cpu_per_scrape_s"],
        result["from_scratch_cpu_per_scrape_s"],
    )
    ratio = read["p50"] / scratch["p50"]
    result["targets"] = {"read_ratio": {"value": ratio, "pass": ratio <= 0.25}}
    print(f"latency windows, {result['keys']} (mount, operation) keys, one sample a second, after an hour:")
    print(f"  add, per tick:                 p50 {add['p50'] * 1e3:.3f} ms")
    print(f"  read every mount, per scrape:  p50 {read['p50'] * 1e3:.2f} ms (p99 {read['p99'] * 1e3:.2f})")
    print(f"  peer, summarised from scratch: p50 {scratch['p50'] * 1e3:.2f} ms (p99 {scratch['p99'] * 1e3:.2f})")
    share = (read["p50"] / args.scrape_interval + add["p50"]) * 100
    print(f"  ratio read / from scratch: {ratio:.3f}  [{verdict(ratio <= 0.25)} target <= 0.25]")
    print(f"  windows' share of one core at 1 s samples and a {args.scrape_interval} s scrape: {share:.3f} %")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
