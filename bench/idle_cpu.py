#!/usr/bin/env python3
"""The cost of an agent on an idle node: storwatch at its defaults next to node_exporter with all its default
collectors, both scraped every 15 s, in one run on one machine.

Each server is started on a free loopback port with no configuration (storwatch: ``storwatch agent``; node_exporter: the
binary's built-in default collectors), warmed up (``--warmup`` seconds, past the agent's first mount and checkpoint
rounds and past ``quiet_after_seconds``, 60 s: an idle node is a quiet one, storwatch/pace.py), then scraped every
``--scrape-interval`` seconds (one ``GET /metrics`` each, as Prometheus does) for ``--seconds``.
Measured over that window for each process and its children (the agent's helper processes):
time on a CPU from ``/proc/PID/task/TID/schedstat`` (nanoseconds, finer than the 10 ms clock tick of
``/proc/PID/stat``, which matters at a few hundredths of a percent) as a share of one core, and wake-ups per second
(voluntary context switches: each a thread leaving a sleep). For the agent, per thread, by the name each thread gave
the OS (storwatch/threadname.py), so that the threads that wake without work show.

``--baseline DIR`` also runs the agent of another checkout (``git archive COMMIT | tar -x -C DIR``) in the same run,
so that a change is measured against what it changes on the same machine at the same time.

Target: storwatch (agent and helpers) at most node_exporter's CPU (ratio <= 1.0).

Usage: .venv/bin/python bench/idle_cpu.py [--seconds 300] [--scrape-interval 15] [--warmup 75] [--baseline DIR]
                                          [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    HarnessError,
    ThreadSample,
    children,
    free_port,
    machine_info,
    quiet_machine_warnings,
    terminate,
    threads,
    verdict,
    write_json,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def thread_usage(pids: list[int]) -> dict[tuple[int, int], ThreadSample]:
    """Every thread of these processes, by (pid, tid)."""
    return {(pid, tid): t for pid in pids for tid, t in threads(pid).items()}


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int

    def pids(self) -> list[int]:
        """The process and its descendants (the agent's helper processes)."""
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children(pid))
        return out


def wait_ready(server: Server, path: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise HarnessError(f"{server.name} exited with {server.proc.returncode} before it served")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as r,
        ):
            if r.status == 200:
                return
        time.sleep(0.2)
    raise HarnessError(f"{server.name} did not answer {path} within {seconds:g} s")


def scrape(server: Server) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
        body = r.read()
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def start_agent(name: str, checkout: Path, workdir: Path) -> Server:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(checkout))
    proc = subprocess.Popen(
        [sys.executable, "-m", "storwatch", "agent", "--listen", f"127.0.0.1:{port}"],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / f"{name}.log", "wb"),  # noqa: SIM115 (closed with the process)
    )
    return Server(name, proc, port)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--scrape-interval", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=75.0)
    ap.add_argument("--baseline", type=Path, help="another checkout's root, run beside this one")
    ap.add_argument("--node-exporter", default=shutil.which("prometheus-node-exporter") or "")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not args.node_exporter or not os.access(args.node_exporter, os.X_OK):
        raise HarnessError("prometheus-node-exporter not found (Debian package prometheus-node-exporter)")
    for w in quiet_machine_warnings():
        print(f"WARNING: {w}", flush=True)

    servers: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="idle-cpu-") as tmp:
        workdir = Path(tmp)
        try:
            servers.append(start_agent("storwatch", REPO_ROOT, workdir))
            if args.baseline is not None:
                servers.append(start_agent("baseline", args.baseline.resolve(), workdir))
            ne_port = free_port()
            ne = subprocess.Popen(
                [args.node_exporter, f"--web.listen-address=127.0.0.1:{ne_port}"],
                cwd=workdir,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            servers.append(Server("node_exporter", ne, ne_port))
            for s in servers:
                wait_ready(s, "/readyz" if s.name != "node_exporter" else "/metrics", 60)
            series = {s.name: scrape(s) for s in servers}
            time.sleep(args.warmup)
            before = {s.name: thread_usage(s.pids()) for s in servers}
            started = time.monotonic()
            scrapes = 0
            while time.monotonic() - started < args.seconds:
                for s in servers:
                    series[s.name] = scrape(s)
                scrapes += 1
                time.sleep(max(0.0, args.scrape_interval - (time.monotonic() - started) % args.scrape_interval))
            elapsed = time.monotonic() - started
            after = {s.name: thread_usage(s.pids()) for s in servers}
        finally:
            for s in servers:
                terminate(s.proc)

    results: dict[str, Any] = {"machine": machine_info(), "seconds": elapsed, "scrapes": scrapes, "servers": {}}
    print(f"{elapsed:.0f} s, {scrapes} scrapes each, every {args.scrape_interval:g} s")
    for s in servers:
        rows = []  # ((pid, tid), name, CPU seconds, wake-ups) in the window
        for (pid, tid), t in after[s.name].items():
            t0 = before[s.name].get((pid, tid))
            name = t.name if pid == s.proc.pid else f"helper {pid}: {t.name}"
            cpu0, wakeups0 = (t0.cpu_seconds, t0.wakeups) if t0 is not None else (0.0, 0)
            rows.append(((pid, tid), f"{name} ({tid})", t.cpu_seconds - cpu0, t.wakeups - wakeups0))
        cpu = sum(r[2] for r in rows) / elapsed
        wakeups = sum(r[3] for r in rows) / elapsed
        results["servers"][s.name] = {
            "cpu_share_of_core": cpu,
            "wakeups_per_second": wakeups,
            "series": series[s.name],
            "threads": {name: {"cpu_seconds": c, "wakeups_per_second": w / elapsed} for _, name, c, w in rows},
        }
        print(f"{s.name:14} {cpu * 100:7.3f} % of a core  {wakeups:6.1f} wake-ups/s  {series[s.name]:6} series")
        if s.name != "node_exporter":
            for _, name, c, w in sorted(rows, key=lambda r: -r[2]):
                if c > 0 or w > 0:
                    print(f"    {name:30} {c / elapsed * 100:7.3f} %  {w / elapsed:6.2f} wake-ups/s")
    ne_cpu = results["servers"]["node_exporter"]["cpu_share_of_core"]
    for name in ("storwatch", "baseline"):
        if name in results["servers"] and ne_cpu > 0:
            ratio = results["servers"][name]["cpu_share_of_core"] / ne_cpu
            results["servers"][name]["ratio_to_node_exporter"] = ratio
            print(f"{name} / node_exporter CPU: {ratio:.2f}  (target <= 1.0: {verdict(ratio <= 1.0)})")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HarnessError as err:
        print(f"idle_cpu: {err}", file=sys.stderr)
        sys.exit(2)
