#!/usr/bin/env python3
"""storwatch's HTTP server under load, next to node_exporter's in the same run on the same machine.

Three phases (``--phases``, all by default):

* ``fresh``: ``--concurrency`` (50) scrapers, each opening a new connection for every scrape of ``/metrics``
  (``Connection: close``), for ``--seconds`` (20) per server. The two servers take turns in ``--segments`` (4)
  stretches each, so that whatever else the machine does falls on both. Scrapers run in ``--client-processes`` (2)
  processes of asyncio each. Printed: scrapes, errors (refused, reset, timed out after 10 s, wrong status or
  length) and p50/p90/p99/max latency (connect to last byte) per server, the p99 ratio, each server's CPU time.
  TARGET: storwatch 0 errors, and p99 <= 2 x node_exporter's p99.
* ``slow``: ``--slow-clients`` (1,000) connections that send half a request head and wait, reconnecting whenever
  the server drops them (slowloris), against each server in turn, both started with a file descriptor limit of
  ``--nofile`` (256). Meanwhile one normal client scrapes ``/metrics`` every 0.1 s over a new connection for
  ``--slow-seconds`` (20). Printed: that client's latency and errors, the server's most open fds and threads.
  TARGET: storwatch answers every normal scrape, the slowest in < 100 ms.
* ``poll``: a node of ``--mounts`` (2,000) mounts (a generated procfs and root: ext4 pod volumes on one disk, no real
  mounts made) where ``--pollers`` (20) keep-alive clients fetch ``/api/status`` back to back for ``--poll-seconds``
  (20) while one client scrapes ``/metrics`` every 0.2 s. Printed: /metrics latency before and during the polling,
  the agent's RSS before, at the end of the polling and 10 s after. No peer (node_exporter has no such page): the
  figures compare the agent with itself, and with the code of ``--agent-root`` when given.

``--agent-root DIR`` runs the storwatch package found in DIR (another checkout, e.g. ``git archive`` of an older
commit) instead of this one, with this checkout's virtual environment, to put a before and after side by side.

Usage: .venv/bin/python bench/http_load.py [--phases fresh,slow,poll] [--seconds 20] [--concurrency 50]
       [--prometheus-headers] [--agent-root DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import resource
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (
    ROOT,
    VENV_BIN,
    HarnessError,
    children,
    cpu_seconds,
    fmt_ms,
    free_port,
    kill_pid_if_alive,
    machine_info,
    quiet_machine_warnings,
    rss_kib,
    summary,
    terminate,
    verdict,
    write_json,
)
from scrape_latency import PROMETHEUS_HEADERS, find_node_exporter

HOST = "127.0.0.1"
TIMEOUT = 10.0  # Prometheus's default scrape timeout
TARGET_P99_RATIO = 2.0
TARGET_SLOW_MAX_SECONDS = 0.1


# -- clients


def _request(path: str, headers: dict[str, str], close: bool) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {HOST}", *(f"{k}: {v}" for k, v in headers.items())]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _check(data: bytes) -> str | None:
    """None for a whole 200 response, else what is wrong with it."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return "no response head"
    status = head.split(b" ", 2)[1:2]
    if status != [b"200"]:
        return f"status {status[0].decode() if status else '?'}"
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and int(value) != len(body):
            return "short body"
    return None


async def _fresh_scraper(port: int, request: bytes, until: float, latencies: list[float], errors: Counter[str]) -> None:
    while time.monotonic() < until:
        t0 = time.perf_counter()
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), TIMEOUT)
            writer.write(request)
            data = await asyncio.wait_for(reader.read(-1), TIMEOUT - (time.perf_counter() - t0))
            problem = _check(data)
        except asyncio.TimeoutError:
            problem = "timed out"
        except OSError as err:
            problem = type(err).__name__
        finally:
            if writer is not None:
                writer.close()
        if problem is None:
            latencies.append(time.perf_counter() - t0)
        else:
            errors[problem] += 1


def fresh_load(port: int, path: str, headers: dict[str, str], seconds: float, scrapers: int) -> dict[str, Any]:
    """In a client process: ``scrapers`` concurrent fresh-connection scrapers for ``seconds``."""
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    request = _request(path, headers, close=True)

    async def main() -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(*(_fresh_scraper(port, request, until, latencies, errors) for _ in range(scrapers)))

    asyncio.run(main())
    return {"latencies": latencies, "errors": dict(errors)}


async def _keepalive_poller(port: int, request: bytes, until: float, counts: Counter[str]) -> None:
    reader = writer = None
    while time.monotonic() < until:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(HOST, port)
            assert reader is not None
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await asyncio.wait_for(reader.readexactly(length), TIMEOUT)
            counts["ok" if head.split(b" ", 2)[1] == b"200" else "not 200"] += 1
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, IndexError) as err:
            counts[type(err).__name__] += 1
            if writer is not None:
                writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


def poll_load(port: int, path: str, seconds: float, pollers: int) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    request = _request(path, {}, close=False)

    async def main() -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(*(_keepalive_poller(port, request, until, counts) for _ in range(pollers)))

    asyncio.run(main())
    return dict(counts)


def slow_clients(port: int, clients: int, seconds: float) -> dict[str, int]:
    """In a client process: ``clients`` connections that each send half a head and wait; a dropped one reconnects."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, clients + 200)), hard))
    sel = selectors.DefaultSelector()
    stats = Counter[str]()

    def open_one() -> None:
        # A short connect timeout: against a server whose listen queue is full, connect() waits for SYN retries.
        try:
            s = socket.create_connection((HOST, port), timeout=1.0)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: storwatch\r\nX-Slow: ")
        except OSError:
            stats["connect errors"] += 1
            return
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        stats["connections"] += 1

    until = time.monotonic() + seconds
    for _ in range(clients):
        if time.monotonic() >= until:
            break
        open_one()
    while time.monotonic() < until:
        for key, _ in sel.select(0.2):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:  # dropped by the server: come back, as an attacker would
                sel.unregister(s)
                s.close()
                stats["dropped"] += 1
                if time.monotonic() < until:
                    open_one()
    for key in list(sel.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    return dict(stats)


def scrape_once(port: int, path: str = "/metrics") -> tuple[float | None, str | None]:
    """One fresh-connection GET with http-level checks: (seconds, None) or (None, what went wrong)."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection((HOST, port), timeout=TIMEOUT) as s:
            s.sendall(_request(path, {}, close=True))
            chunks = []
            while True:
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError as err:
        return None, type(err).__name__
    problem = _check(b"".join(chunks))
    return (None, problem) if problem else (time.perf_counter() - t0, None)


# -- servers


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def threads(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith("Threads:")))
    except (OSError, StopIteration):
        return None


class Server:
    def __init__(self, name: str, cmd: list[str], port: int, workdir: Path, env: dict[str, str] | None = None,
                 nofile: int | None = None, ready_path: str = "/metrics") -> None:  # fmt: skip
        self.name, self.port = name, port
        self.log = workdir / f"{name}.log"

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, cwd=workdir,
                env=env, preexec_fn=limit if nofile is not None else None,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while scrape_once(port, ready_path)[0] is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise HarnessError(f"{name} did not serve {ready_path}; log:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        self.helpers: list[int] = []

    def stop(self) -> None:
        self.helpers = self.helpers or children(self.proc.pid)
        print(f"  {self.name} (pid {self.proc.pid}): {terminate(self.proc)}")
        for pid in self.helpers:
            kill_pid_if_alive(pid)


def storwatch_cmd(args: argparse.Namespace, *extra: str) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if args.agent_root:
        env["PYTHONPATH"] = str(Path(args.agent_root).resolve())
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return [str(VENV_BIN / "python"), "-m", "storwatch", "agent", *extra], env


def node_exporter_cmd(args: argparse.Namespace, port: int) -> list[str]:
    return [
        find_node_exporter(args.node_exporter),
        f"--web.listen-address={HOST}:{port}",
        "--collector.disable-defaults",
        "--collector.diskstats",
        "--collector.filesystem",
        # No cap on requests in flight (its default of 40 answers 503 beyond it): every scrape is a whole scrape.
        "--web.max-requests=0",
    ]


def start_pair(args: argparse.Namespace, workdir: Path, nofile: int | None = None) -> tuple[Server, Server]:
    sw_port, ne_port = free_port(), free_port()
    cmd, env = storwatch_cmd(args, "--listen", f"{HOST}:{sw_port}")
    sw = Server("storwatch", cmd, sw_port, workdir, env, nofile, "/readyz")
    try:
        ne = Server("node_exporter", node_exporter_cmd(args, ne_port), ne_port, workdir, None, nofile)
    except BaseException:
        sw.stop()
        raise
    return sw, ne


# -- phases


def phase_fresh(args: argparse.Namespace, workdir: Path, pool: Any) -> dict[str, Any]:
    headers = dict(PROMETHEUS_HEADERS) if args.prometheus_headers else {}
    sw, ne = start_pair(args, workdir)
    servers = [sw, ne]
    try:
        for s in servers:  # warm up: the first scrapes render and fill caches
            for _ in range(20):
                scrape_once(s.port)
        lat: dict[str, list[float]] = {s.name: [] for s in servers}
        errors: dict[str, Counter[str]] = {s.name: Counter() for s in servers}
        cpu = dict.fromkeys(lat, 0.0)
        per_proc = [args.concurrency // args.client_processes] * args.client_processes
        per_proc[0] += args.concurrency - sum(per_proc)
        stretch = args.seconds / args.segments
        for seg in range(args.segments):
            for s in servers if seg % 2 == 0 else servers[::-1]:
                before = cpu_seconds(s.proc.pid) or 0.0
                jobs = [(s.port, "/metrics", headers, stretch, n) for n in per_proc]
                for out in pool.starmap(fresh_load, jobs):
                    lat[s.name].extend(out["latencies"])
                    errors[s.name].update(out["errors"])
                cpu[s.name] += (cpu_seconds(s.proc.pid) or 0.0) - before
        result: dict[str, Any] = {"headers": "prometheus" if headers else "plain"}
        print(f"\nfresh: {args.concurrency} scrapers, a new connection per scrape, {args.seconds:g} s per server in "
              f"{args.segments} turns; {'Prometheus' if headers else 'plain'} request headers")  # fmt: skip
        print(f"  {'server':14s} {'scrapes':>8s} {'errors':>7s} {'p50':>8s} {'p90':>8s} {'p99':>8s} {'max':>8s} "
              f"{'CPU ms/scrape':>14s}")  # fmt: skip
        for s in servers:
            sm = summary(lat[s.name]) if lat[s.name] else dict.fromkeys(("n", "p50", "p90", "p99", "max"), 0.0)
            n_err = sum(errors[s.name].values())
            per_scrape = cpu[s.name] / max(1, len(lat[s.name])) * 1000
            result[s.name] = {**sm, "errors": n_err, "error_kinds": dict(errors[s.name]), "cpu_seconds": cpu[s.name]}
            print(f"  {s.name:14s} {len(lat[s.name]):8d} {n_err:7d} {fmt_ms(sm['p50']):>8s} {fmt_ms(sm['p90']):>8s} "
                  f"{fmt_ms(sm['p99']):>8s} {fmt_ms(sm['max']):>8s} {per_scrape:14.3f}"
                  + (f"  {dict(errors[s.name])}" if n_err else ""))  # fmt: skip
        ratio = result["storwatch"]["p99"] / result["node_exporter"]["p99"]
        result["p99_ratio"] = ratio
        ok = result["storwatch"]["errors"] == 0 and ratio <= TARGET_P99_RATIO
        result["pass"] = ok
        print(f"TARGET storwatch 0 errors and p99 <= {TARGET_P99_RATIO:g} x node_exporter's: "
              f"{result['storwatch']['errors']} errors, p99 ratio {ratio:.2f}  {verdict(ok)}")  # fmt: skip
        return result
    finally:
        for s in servers:
            s.stop()


def phase_slow(args: argparse.Namespace, workdir: Path, pool: Any) -> dict[str, Any]:
    sw, ne = start_pair(args, workdir, nofile=args.nofile)
    servers = [sw, ne]
    result: dict[str, Any] = {"clients": args.slow_clients, "nofile": args.nofile}
    print(f"\nslow: {args.slow_clients} slow clients (half a head each, reconnecting when dropped) for "
          f"{args.slow_seconds:g} s per server, both with {args.nofile} file descriptors; one normal scrape every "
          "0.1 s")  # fmt: skip
    print(f"  {'server':14s} {'scrapes':>8s} {'errors':>7s} {'p50':>8s} {'p99':>8s} {'max':>8s} {'fds max':>8s} "
          f"{'threads max':>12s} {'slow dropped':>13s}")  # fmt: skip
    try:
        for s in servers:
            fds0, threads0 = open_fds(s.proc.pid), threads(s.proc.pid)
            flood = pool.apply_async(slow_clients, (s.port, args.slow_clients, args.slow_seconds + 2.0))
            time.sleep(2.0)  # the flood connects
            lat: list[float] = []
            errors: Counter[str] = Counter()
            most_fds = most_threads = 0
            until = time.monotonic() + args.slow_seconds
            while time.monotonic() < until:
                seconds, problem = scrape_once(s.port)
                if seconds is None:
                    errors[problem or "?"] += 1
                else:
                    lat.append(seconds)
                most_fds = max(most_fds, open_fds(s.proc.pid) or 0)
                most_threads = max(most_threads, threads(s.proc.pid) or 0)
                time.sleep(0.1)
            stats = flood.get(timeout=args.slow_seconds + 60)
            sm = summary(lat) if lat else dict.fromkeys(("n", "p50", "p99", "max"), float("nan"))
            n_err = sum(errors.values())
            result[s.name] = {**sm, "errors": n_err, "error_kinds": dict(errors), "fds_before": fds0,
                              "fds_max": most_fds, "threads_before": threads0, "threads_max": most_threads,
                              "slow": stats}  # fmt: skip
            print(f"  {s.name:14s} {len(lat):8d} {n_err:7d} {fmt_ms(sm['p50']):>8s} {fmt_ms(sm['p99']):>8s} "
                  f"{fmt_ms(sm['max']):>8s} {most_fds:8d} {most_threads:12d} {stats.get('dropped', 0):13d}"
                  + (f"  {dict(errors)}" if n_err else ""))  # fmt: skip
        r = result["storwatch"]
        ok = r["errors"] == 0 and r["max"] < TARGET_SLOW_MAX_SECONDS
        result["pass"] = ok
        bound = f"{TARGET_SLOW_MAX_SECONDS * 1000:.0f} ms"
        print(f"TARGET storwatch answers every normal scrape, the slowest in < {bound}: "
              f"{r['errors']} errors, max {fmt_ms(r['max'])} ms  {verdict(ok)}")  # fmt: skip
        return result
    finally:
        for s in servers:
            s.stop()


def make_node(root: Path, mounts: int) -> None:
    """A procfs and a root of ``mounts`` ext4 pod volumes on one NVMe partition, plus '/'."""
    proc = root / "proc"
    (proc / "1").mkdir(parents=True)
    os.symlink("1", proc / "self")
    lines = ["1 0 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n"]
    for i in range(mounts):
        uid = f"{i:08x}-0000-4000-8000-{i:012x}"
        mountpoint = f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/data"
        lines.append(f"{100 + i} 1 259:1 /pods/{i} {mountpoint} rw,relatime shared:{i + 2} - ext4 /dev/nvme0n1p1 rw\n")
        (root / "rootfs" / mountpoint.lstrip("/")).mkdir(parents=True)
    (proc / "1" / "mountinfo").write_text("".join(lines))
    (proc / "1" / "mountstats").write_text("")
    (proc / "diskstats").write_text(" 259       1 nvme0n1p1 100 0 800 10 200 0 1600 20 0 30 30 0 0 0 0 0 0\n")
    (root / "sys").mkdir()


def phase_poll(args: argparse.Namespace, workdir: Path, pool: Any) -> dict[str, Any]:
    node = workdir / "node"
    make_node(node, args.mounts)
    config = workdir / "poll.yaml"
    config.write_text("gpu: {enabled: false}\nkube: {enabled: false}\ncheckpoints: {kubelet: false}\n")
    port = free_port()
    cmd, env = storwatch_cmd(
        args, "--listen", f"{HOST}:{port}", "--config", str(config), "--platform", "generic",
        "--path.procfs", str(node / "proc"), "--path.sysfs", str(node / "sys"), "--path.rootfs", str(node / "rootfs"),
    )  # fmt: skip
    sw = Server("storwatch", cmd, port, workdir, env, None, "/readyz")
    result: dict[str, Any] = {"mounts": args.mounts, "pollers": args.pollers}
    try:
        body = b""
        while body.count(b"storwatch_mount_info{") < args.mounts:
            time.sleep(0.5)
            with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=TIMEOUT) as s:
                s.sendall(_request("/metrics", {}, close=True))
                body = b"".join(iter(lambda: s.recv(1 << 20), b""))

        def scrapes(seconds: float) -> list[float]:
            out: list[float] = []
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                took, _ = scrape_once(port)
                if took is not None:
                    out.append(took)
                time.sleep(0.2)
            return out

        idle = scrapes(args.poll_seconds / 2)
        rss_before = rss_kib(sw.proc.pid) or 0
        per_proc = [args.pollers // args.client_processes] * args.client_processes
        per_proc[0] += args.pollers - sum(per_proc)
        polling = [pool.apply_async(poll_load, (port, "/api/status", args.poll_seconds, n)) for n in per_proc]
        busy = scrapes(args.poll_seconds)
        counts: Counter[str] = Counter()
        for p in polling:
            counts.update(p.get(timeout=args.poll_seconds + 60))
        rss_end = rss_kib(sw.proc.pid) or 0
        time.sleep(10)
        rss_after = rss_kib(sw.proc.pid) or 0
        si, sb = summary(idle), summary(busy)
        result.update(idle=si, busy=sb, polls=dict(counts), rss_kib={"before": rss_before, "end": rss_end,
                      "after_10s": rss_after}, body_bytes=len(body))  # fmt: skip
        print(f"\npoll: {args.mounts} mounts ({len(body)} bytes of /metrics); {args.pollers} keep-alive clients fetch "
              f"/api/status back to back for {args.poll_seconds:g} s ({counts.get('ok', 0)} answered, "
              f"{sum(v for k, v in counts.items() if k != 'ok')} errors)")  # fmt: skip
        print(f"  /metrics while idle:   p50 {fmt_ms(si['p50'])} ms, p99 {fmt_ms(si['p99'])} ms ({si['n']} scrapes)")
        print(f"  /metrics while polled: p50 {fmt_ms(sb['p50'])} ms, p99 {fmt_ms(sb['p99'])} ms ({sb['n']} scrapes); "
              f"p50 ratio {sb['p50'] / si['p50']:.2f}")  # fmt: skip
        print(f"  agent RSS: {rss_before / 1024:.1f} MiB before, {rss_end / 1024:.1f} MiB at the end of the polling, "
              f"{rss_after / 1024:.1f} MiB 10 s later")  # fmt: skip
        return result
    finally:
        sw.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phases", default="fresh,slow,poll", help="which phases, comma-separated (default all)")
    p.add_argument("--seconds", type=float, default=20.0, help="fresh: seconds of load per server (default 20)")
    p.add_argument("--segments", type=int, default=4, help="fresh: turns per server (default 4)")
    p.add_argument("--concurrency", type=int, default=50, help="fresh: parallel scrapers (default 50)")
    p.add_argument("--client-processes", type=int, default=2, help="processes the clients run in (default 2)")
    p.add_argument("--prometheus-headers", action="store_true", help="fresh: Prometheus's Accept and gzip headers")
    p.add_argument("--slow-clients", type=int, default=1000, help="slow: slow clients (default 1000)")
    p.add_argument("--slow-seconds", type=float, default=20.0, help="slow: seconds per server (default 20)")
    p.add_argument("--nofile", type=int, default=256, help="slow: the servers' fd limit (default 256)")
    p.add_argument("--mounts", type=int, default=2000, help="poll: mounts on the generated node (default 2000)")
    p.add_argument("--pollers", type=int, default=20, help="poll: /api/status clients (default 20)")
    p.add_argument("--poll-seconds", type=float, default=20.0, help="poll: seconds of polling (default 20)")
    p.add_argument("--agent-root", metavar="DIR", help="run the storwatch package in DIR instead of this checkout's")
    p.add_argument("--node-exporter", help="node_exporter executable (default prometheus-node-exporter on PATH)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    unknown = set(phases) - {"fresh", "slow", "poll"}
    if unknown or not phases or args.client_processes < 1 or args.concurrency < args.client_processes:
        p.error(f"--phases: fresh, slow, poll (got {sorted(unknown)}); --concurrency >= --client-processes >= 1")
    os.chdir(ROOT)
    result: dict[str, Any] = {"benchmark": "http_load", "machine": machine_info(), "warnings": quiet_machine_warnings()}
    result["agent_root"] = str(Path(args.agent_root).resolve()) if args.agent_root else str(ROOT)
    print(f"storwatch from {result['agent_root']}")
    for w in result["warnings"]:
        print(f"WARNING: {w}")
    workdir = Path(tempfile.mkdtemp(prefix="storwatch-bench-http-"))
    run = {"fresh": phase_fresh, "slow": phase_slow, "poll": phase_poll}
    try:
        with multiprocessing.get_context("fork").Pool(max(args.client_processes, 1) + 1) as pool:
            for name in phases:
                result[name] = run[name](args, workdir, pool)
    except HarnessError as err:
        print(f"http_load: harness error: {err}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
