"""`storwatch verify` on a legal safetensors file whose 14.6 MB header lists 250,000 tensors: wall time and peak RSS
of the verify process, next to a run of another checkout (``--baseline DIR``, e.g. an older commit unpacked with
``git archive``) alternated with it in the same run, and next to `verify` of a one-tensor file (the floor: the
interpreter and storwatch's imports).

Each run is a fresh ``storwatch verify FILE`` (``storwatch.cli.main``) with the checkout first on its path; its peak
RSS is its own VmHWM, read as it ends (not ``ru_maxrss``: Linux keeps that across execve, so it would report this
script's own peak). Target: peak RSS <= 3 x the header's size over the floor.

Usage: .venv/bin/python bench/wide_header.py [--runs 5] [--tensors 250000] [--baseline DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, HarnessError, summary, verdict, write_json
from tests.wide_headers import wide_safetensors

MIB = 1 << 20
VERIFY = (
    "import sys\n"
    "from storwatch.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "sys.stdout.flush()\n"
    "hwm = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
    "sys.stderr.write(f'PEAK {hwm}\\n')\n"
    "sys.exit(rc)\n"
)


def verify_once(tree: Path, path: Path) -> tuple[float, int, str]:
    """Wall seconds, peak RSS in bytes and the verdict line of one ``storwatch verify``."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", VERIFY, "verify", str(path)],
        cwd=tree,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=False,
    )
    seconds = time.monotonic() - started
    peak = [line for line in proc.stderr.splitlines() if line.startswith("PEAK ")]
    if not peak:
        raise HarnessError(f"verify in {tree} failed: {proc.stderr[-2000:]}")
    return seconds, int(peak[-1].split()[1]) * 1024, proc.stdout.split(maxsplit=1)[0] if proc.stdout else "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tensors", type=int, default=250_000)
    ap.add_argument("--baseline", type=Path, help="another checkout to time beside this one")
    ap.add_argument("--json")
    args = ap.parse_args()
    trees = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    with tempfile.TemporaryDirectory() as tmp:
        wide = wide_safetensors(Path(tmp) / "wide.safetensors", tensors=args.tensors)
        floor = wide_safetensors(Path(tmp) / "one.safetensors", tensors=1, stored=1)
        header = struct.unpack("<Q", wide.read_bytes()[:8])[0]
        print(f"header {header / 1e6:.1f} MB, {args.tensors:,} tensors; runs {args.runs} per case, alternated")
        results: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.runs):
            for name, tree in trees.items():
                for case, path in (("wide", wide), ("floor", floor)):
                    seconds, rss, said = verify_once(tree, path)
                    row = results.setdefault(f"{name}/{case}", {"seconds": [], "rss": [], "verdict": []})
                    row["seconds"].append(seconds)
                    row["rss"].append(rss)
                    row["verdict"].append(said)  # type: ignore[arg-type]
    report: dict[str, Any] = {"header_bytes": header, "tensors": args.tensors}
    for key, row in results.items():
        s, r = summary(row["seconds"]), summary(row["rss"])
        report[key] = {"seconds": s, "rss_bytes": r, "verdicts": sorted(set(map(str, row["verdict"])))}
        print(
            f"{key:16} wall p50 {s['p50']:.2f} s (min {s['min']:.2f}, max {s['max']:.2f}); peak RSS p50 "
            f"{r['p50'] / MIB:.0f} MiB; verdict {report[key]['verdicts']}"
        )
    over = report["this/wide"]["rss_bytes"]["p50"] - report["this/floor"]["rss_bytes"]["p50"]
    ok = over <= 3 * header
    print(f"{verdict(ok)} this checkout: {over / MIB:.0f} MiB over the floor for a {header / MIB:.1f} MiB header")
    if "baseline/wide" in report:
        b = report["baseline/wide"]
        print(
            f"baseline / this: wall {b['seconds']['p50'] / report['this/wide']['seconds']['p50']:.1f}x, "
            f"peak RSS {b['rss_bytes']['p50'] / report['this/wide']['rss_bytes']['p50']:.1f}x"
        )
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
