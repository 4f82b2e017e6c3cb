#!/usr/bin/env python3
"""``storwatch sync`` (hashed, written, read back past the page cache and compared, fsynced, renamed) next to the
same work done with standard tools one after another, ``cp -r; sync; read back`` (the target's peer), and next to
``cp -r`` followed by ``sync`` (of the copied files, and of the whole machine) and ``dd oflag=direct conv=fsync``,
on the same data in the same run: one 2 GiB file, and a directory of 64 shards of 32 MiB. A speed ratio belongs
here, not in a test.

The peer ``cp -r; sync; read back`` is ``cp -r SRC DEST``, then ``sync`` of the copied files, their directories and
DEST's parent (what the copy fsyncs), then every file read back past the page cache as ``dd if=FILE of=/dev/null
bs=16M iflag=direct`` reads it, in one process for all the files (a ``dd`` per file would add a process per shard),
timed as one from ``cp``'s start to the read-back's end. It reads back without hashing or comparing: the least a
verification with standard tools can do, so a peer that hashed (``sha256sum``; this machine has no ``xxhsum`` or
``b3sum``) would only be slower.

The source is written once in ``--dir`` and read before every copy (a checkpoint to sync was just written: it is in
the page cache); each copy goes to a fresh path in the same directory, is timed from the command's start to its end
(storwatch's helper process included) and removed; they take turns going first. ``cp -r + sync`` gives ``sync`` the
copied files and directories (an fsync of each, what the copy needs to survive a crash); ``cp -r; sync`` runs a plain
``sync``, which also waits for the rest of the machine's dirty pages. dd copies each file in turn, one process per
file. Medians of ``--runs``, with the ratios, the spread of the ratio to the target's peer (in each round, the
peer's time over storwatch's: lowest, median, highest), the CPU time each way used (user and system time of its
processes, median) and a PASS/MISS line per target; ``--hashes`` also measures the hashes a copy could use, on one
core. ``--cgroup`` (root) then runs storwatch sync once more on each source in a memory cgroup of its own with the
DaemonSet's 256 MiB limit, and prints its peak (the command, its helper, and the page cache they charge: what the
copy writes and reads back, and any of the source not already cached) and OOM kills.

Targets: storwatch sync >= 1.0x ``cp -r; sync; read back`` (ratio of the medians); >= 0.7x ``dd oflag=direct``.

``--baseline DIR`` adds a sixth way, ``storwatch sync`` with the storwatch of another checkout (``DIR/storwatch``, on
``PYTHONPATH``), taking turns with the others: a change to the copy measured against the code before it in one run.

Usage: .venv/bin/python bench/sync_vs_cp.py [--dir DIR] [--runs 3] [--hashes] [--cgroup] [--baseline DIR] [--json F]
(about 4 GiB in DIR)
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MB = 1e6


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def write_data(top: Path, big: int, shards: int, shard_bytes: int) -> tuple[Path, Path]:
    """The two sources: one file of ``big`` bytes, and a directory of ``shards`` files (distinct random blocks)."""
    block = bytearray(os.urandom(8 << 20))
    n = 0

    def fill(path: Path, size: int) -> None:
        nonlocal n
        with open(path, "wb") as f:
            left = size
            while left:
                block[:8] = n.to_bytes(8, "little")
                n += 1
                chunk = memoryview(block)[: min(left, len(block))]
                f.write(chunk)
                left -= len(chunk)
            os.fsync(f.fileno())

    single = top / "model.pt"
    fill(single, big)
    directory = top / "step-1000"
    directory.mkdir()
    for i in range(shards):
        fill(directory / f"__{i}_0.distcp", shard_bytes)
    return single, directory


def files_of(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def warm(path: Path) -> None:
    for f in files_of(path):
        with open(f, "rb") as fh:
            while fh.read(8 << 20):
                pass


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    manifest = Path(str(path) + ".storwatch-sync.json")
    if manifest.exists():
        manifest.unlink()
    os.sync()  # the removal's own writes, out of the next copy's time


COPY_SECONDS: dict[str, list[float]] = {}
"""The copy's own time in each storwatch run (its result's ``seconds``: without the command's start-up), by way."""


def storwatch_sync(src: Path, dest: Path, way: str = "storwatch sync", tree: str | None = None) -> float:
    """``storwatch sync SRC DEST`` timed whole; ``tree``: another checkout's storwatch (``--baseline``), else the one
    on the caller's path, run from this repository."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": tree}
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "storwatch", "sync", str(src), str(dest), "--json"],
        capture_output=True,
        text=True,
        cwd=tree or REPO_ROOT,
        env=env,
        timeout=1800,
        check=False,
    )
    seconds = time.monotonic() - t0
    (result,) = json.loads(out.stdout)
    if result["outcome"] != "verified":
        raise RuntimeError(f"{way}: {result['outcome']}: {result['error']}")
    COPY_SECONDS.setdefault(way, []).append(result["seconds"])
    return seconds


CGROUP_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")


def sync_in_cgroup(src: Path, dest: Path, limit: int) -> tuple[int, int]:
    """storwatch sync in a new memory cgroup limited to ``limit`` bytes: its peak bytes and OOM kills."""
    controllers = CGROUP_V2 / "cgroup.controllers"
    v2 = controllers.exists() and "memory" in controllers.read_text().split()
    parent = CGROUP_V2 if v2 else CGROUP_V1
    group = parent / f"storwatch-bench-{os.getpid()}"
    group.mkdir()
    try:
        (group / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
        subprocess.run(
            [sys.executable, "-m", "storwatch", "sync", str(src), str(dest), "--json"],
            cwd=REPO_ROOT,
            timeout=1800,
            check=True,
            capture_output=True,
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
        peak = int((group / ("memory.peak" if v2 else "memory.max_usage_in_bytes")).read_text())
        events = (group / ("memory.events" if v2 else "memory.oom_control")).read_text().splitlines()
        kills = int(dict(line.split() for line in events).get("oom_kill", 0))
        return peak, kills
    finally:
        for _ in range(100):  # the kernel refuses while the last process is still leaving
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def children_cpu_seconds() -> float:
    """User and system time of every child process ended and waited for so far (their own children's included when
    they waited for them, as storwatch sync does for its helper)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cp_and_sync(src: Path, dest: Path) -> float:
    t0 = time.monotonic()
    subprocess.run(["cp", "-r", str(src), str(dest)], check=True, timeout=1800)
    targets = [str(p) for p in files_of(dest)] + ([str(dest)] if dest.is_dir() else []) + [str(dest.parent)]
    subprocess.run(["sync", *targets], check=True, timeout=1800)
    return time.monotonic() - t0


def cp_and_sync_all(src: Path, dest: Path) -> float:
    """``cp -r`` then a plain ``sync``, as the issue names it (and docs/testing.md's baseline ran): it also waits
    for every other dirty page on the machine, which others' work here adds to."""
    t0 = time.monotonic()
    subprocess.run(["cp", "-r", str(src), str(dest)], check=True, timeout=1800)
    subprocess.run(["sync"], check=True, timeout=1800)
    return time.monotonic() - t0


READ_BACK = r"""
import mmap, os, sys
buf = mmap.mmap(-1, 16 << 20)
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        while os.readv(fd, [buf]):
            pass
    finally:
        os.close(fd)
"""
"""What ``dd if=FILE of=/dev/null bs=16M iflag=direct`` does for each file, in one process: 16 MiB reads (the copy's
own chunk, storwatch.sync.pipeline.CHUNK) that bypass the page cache."""

PEER_STEPS: dict[str, list[float]] = {"cp -r": [], "sync": [], "read back": []}
"""Each step's time in each run of ``cp -r; sync; read back``."""


def read_back_direct(path: Path) -> None:
    """Every file of ``path`` read back past the page cache (``O_DIRECT`` reads come from the device even where the
    file's pages are still cached), in one process: a ``dd`` per file took 0.3 to 0.9 s longer on 64 shards here."""
    subprocess.run([sys.executable, "-c", READ_BACK, *map(str, files_of(path))], check=True, timeout=1800)


def cp_sync_read_back(src: Path, dest: Path) -> float:
    """The target's peer: ``cp -r``, ``sync`` of what it copied (as ``cp_and_sync``), then the copy read back past the
    page cache, timed as one."""
    t0 = time.monotonic()
    subprocess.run(["cp", "-r", str(src), str(dest)], check=True, timeout=1800)
    t1 = time.monotonic()
    targets = [str(p) for p in files_of(dest)] + ([str(dest)] if dest.is_dir() else []) + [str(dest.parent)]
    subprocess.run(["sync", *targets], check=True, timeout=1800)
    t2 = time.monotonic()
    read_back_direct(dest)
    t3 = time.monotonic()
    for step, seconds in zip(PEER_STEPS, (t1 - t0, t2 - t1, t3 - t2), strict=True):
        PEER_STEPS[step].append(seconds)
    return t3 - t0


def dd_direct(src: Path, dest: Path) -> float:
    t0 = time.monotonic()
    if src.is_dir():
        dest.mkdir()
    for f in files_of(src):
        out = dest if src.is_file() else dest / f.relative_to(src)
        subprocess.run(
            ["dd", f"if={f}", f"of={out}", "bs=8M", "oflag=direct", "conv=fsync", "status=none"],
            check=True,
            timeout=1800,
        )
    return time.monotonic() - t0


def hashes(seconds: float = 1.0) -> None:
    data = os.urandom(8 << 20)
    makers: dict[str, object] = {"sha256": hashlib.sha256}
    try:
        import xxhash

        makers["xxh3_128"] = xxhash.xxh3_128
    except ImportError:
        pass
    try:
        import blake3

        makers["blake3"] = blake3.blake3
    except ImportError:
        print("blake3: not installed (pip install blake3) - not measured")
    for name, make in makers.items():
        h = make()  # type: ignore[operator]
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            h.update(data)
            n += 1
        rate = n * len(data) / (time.perf_counter() - t0)
        print(f"hash {name:<9} {rate / (1 << 30):6.2f} GiB/s on one core")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=str(REPO_ROOT), help="where the data and the copies go (default: the repo)")
    parser.add_argument("--size", type=int, default=2 << 30, help="the single file's bytes (default 2 GiB)")
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--shard-size", type=int, default=32 << 20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hashes", action="store_true", help="also measure xxh3-128, BLAKE3 and SHA-256")
    parser.add_argument("--cgroup", action="store_true", help="also: storwatch sync's memory peak in a 256 MiB cgroup")
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also copy with the storwatch of another checkout (DIR holds its storwatch/), taking turns with the rest",
    )
    parser.add_argument("--json", metavar="F", help="also write the figures to this file (bench/run_all.py)")
    args = parser.parse_args()
    if args.hashes:
        hashes()
    ways = {
        "storwatch sync": storwatch_sync,
        "cp -r; sync; read back": cp_sync_read_back,
        "cp -r + sync": cp_and_sync,
        "cp -r; sync": cp_and_sync_all,
        "dd oflag=direct": dd_direct,
    }
    baseline = f"storwatch sync at {args.baseline}" if args.baseline else None
    if baseline is not None:
        ways[baseline] = functools.partial(storwatch_sync, way=baseline, tree=os.path.abspath(args.baseline))
    figures: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix=".sync-bench-") as d:
        top = Path(d)
        single, directory = write_data(top, args.size, args.shards, args.shard_size)
        for label, src in (
            (f"one file of {args.size >> 20} MiB", single),
            (f"{args.shards} shards of {args.shard_size >> 20} MiB", directory),
        ):
            size = sum(f.stat().st_size for f in files_of(src))
            times: dict[str, list[float]] = {w: [] for w in ways}
            cpu: dict[str, list[float]] = {w: [] for w in ways}
            COPY_SECONDS.clear()
            for steps in PEER_STEPS.values():
                steps.clear()
            for run in range(args.runs):
                order = list(ways)[run % len(ways) :] + list(ways)[: run % len(ways)]
                for way in order:
                    dest = top / f"copy-{list(ways).index(way)}"
                    warm(src)
                    before = children_cpu_seconds()
                    times[way].append(ways[way](src, dest))
                    cpu[way].append(children_cpu_seconds() - before)
                    remove(dest)
            rate = {w: size / statistics.median(t) for w, t in times.items()}
            ours, copy = rate["storwatch sync"], size / statistics.median(COPY_SECONDS["storwatch sync"])
            peer, cp, cp_all, dd = (
                rate[w] for w in ("cp -r; sync; read back", "cp -r + sync", "cp -r; sync", "dd oflag=direct")
            )
            # Each round's ratio, a speed ratio as the medians' is: the peer's time over storwatch's in that round.
            paired = sorted(
                p / s for s, p in zip(times["storwatch sync"], times["cp -r; sync; read back"], strict=True)
            )
            peer_steps = ", ".join(f"{step} {statistics.median(t):.2f} s" for step, t in PEER_STEPS.items())
            print(
                f"{label}: storwatch sync {ours / MB:,.0f} MB/s (the copy alone, without the command's start-up: "
                f"{copy / MB:,.0f} MB/s), cp -r; sync; read back {peer / MB:,.0f} MB/s (medians: {peer_steps}), "
                f"cp -r + sync of its files {cp / MB:,.0f} MB/s, cp -r then sync {cp_all / MB:,.0f} MB/s, "
                f"dd oflag=direct {dd / MB:,.0f} MB/s\n"
                f"  ratio to cp -r; sync; read back {ours / peer:.2f} (copy alone {copy / peer:.2f}; target >= 1.0; "
                f"round by round {paired[0]:.2f} / {statistics.median(paired):.2f} / {paired[-1]:.2f}: lowest / "
                f"median / highest)\n"
                f"  ratio to cp -r + sync of its files {ours / cp:.2f} (copy alone {copy / cp:.2f}), to cp -r then "
                f"sync {ours / cp_all:.2f} (copy alone {copy / cp_all:.2f}), to dd {ours / dd:.2f} "
                f"(copy alone {copy / dd:.2f}; target >= 0.7)\n  runs (s): "
                + "; ".join(f"{w} {' '.join(f'{t:.2f}' for t in ts)}" for w, ts in times.items())
                + f"; the copy alone {' '.join(f'{t:.2f}' for t in COPY_SECONDS['storwatch sync'])}\n"
                "  CPU (s, user + system of its processes, median): "
                + ", ".join(f"{w} {statistics.median(c):.2f}" for w, c in cpu.items()),
                flush=True,
            )
            if baseline is not None:
                base = rate[baseline]
                base_copy = size / statistics.median(COPY_SECONDS[baseline])
                print(
                    f"  {baseline}: {base / MB:,.0f} MB/s (copy alone {base_copy / MB:,.0f} MB/s), ratio to cp -r; "
                    f"sync; read back {base / peer:.2f} (copy alone {base_copy / peer:.2f}); this checkout / it "
                    f"{ours / base:.2f}; its copy alone {' '.join(f'{t:.2f}' for t in COPY_SECONDS[baseline])}"
                )
            print(f"  {verdict(ours >= peer)} storwatch sync >= 1.0x cp -r; sync; read back")
            print(f"  {verdict(ours >= 0.7 * dd)} storwatch sync >= 0.7x dd oflag=direct", flush=True)
            figures[label] = {
                "storwatch_sync": ours,
                "copy_alone": copy,
                "cp_sync_read_back": peer,
                "cp_sync_files": cp,
                "cp_then_sync": cp_all,
                "dd_direct": dd,
                "ratio_cp_sync_read_back": ours / peer,
                "ratio_cp_sync_read_back_rounds": paired,
                "ratio_cp_then_sync": ours / cp_all,
                "ratio_dd": ours / dd,
                "cpu_seconds": {w: statistics.median(c) for w, c in cpu.items()},
            }
            if baseline is not None:
                figures[label]["baseline"] = rate[baseline]
                figures[label]["ratio_baseline_cp_sync_read_back"] = rate[baseline] / peer
            if args.cgroup:
                warm(src)
                dest = top / "copy-cgroup"
                peak, kills = sync_in_cgroup(src, dest, 256 << 20)
                remove(dest)
                print(f"  in a 256 MiB memory cgroup: peak {peak / (1 << 20):.0f} MiB, {kills} OOM kills", flush=True)
                figures[label]["cgroup_peak_bytes"] = peak
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
