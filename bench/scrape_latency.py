#!/usr/bin/env python3
"""Scrape latency, CPU and memory of ``storwatch agent`` next to node_exporter's, in one run on one machine.

Both servers are started here on free loopback ports (node_exporter with only its diskstats and filesystem
collectors, the nearest thing it has to what storwatch exports), both are waited for and warmed up, then the
scrapes alternate storwatch, node_exporter, storwatch, ... so that whatever else the machine does falls on both:

* ``fresh``: one new TCP connection per scrape with ``Connection: close``, as Prometheus does with keep-alive off
  (the target figure);
* ``paced``: one persistent connection per server, rounds ``--gap`` apart (0.1 s), as Prometheus scrapes by default:
  one request per connection per scrape interval;
* ``keepalive``: one persistent connection per server, back to back, as a client that polls without pause does.
  The pause matters: the client's kernel delays its ACKs (by up to about 40 ms) only while the connection is in
  interactive "ping-pong" use, so a server that sends a response in two writes with Nagle's algorithm on stalls
  back to back but not 0.1 s apart.

``--floor`` adds a third server to the fresh-connection phase: a minimal Python server (one thread, blocking
``accept``, ``recv``, one ``sendmsg``, ``close``) answering every request with the bytes storwatch answered (its
response head and body, as fetched once after start-up). It does nothing else, so its time is the floor of a scrape
of those bytes from Python on this machine: what storwatch's time could come down to without a faster language.

Each scrape is timed from before ``connect()`` to the last byte of the body (http.client, the same client code for
both, so its own cost is in both figures alike). Printed: p50/p90/p99 per server and mode, the ratio storwatch /
node_exporter, CPU time per scrape of each process (utime+stime from /proc/PID/stat, also net of what it burns
idle), and resident memory after the scrapes (VmRSS, the agent and its helper process separately).

Targets (PASS/MISS is printed; a miss does not change the exit status, only a harness error does):
  storwatch p50 / node_exporter p50 <= 0.3 (fresh connections: storwatch serves bytes made once per View, so a
  scrape costs it the connection and the copy of the bytes, where node_exporter reads /proc and calls statfs);
  a looser bound of 1.0 is checked, as CHECK, for the two keep-alive modes
  storwatch agent RSS <= 60 MiB (the agent process; its helper is reported beside it)

Usage: .venv/bin/python bench/scrape_latency.py [--scrapes 500] [--paced-scrapes 100] [--prometheus-headers]
                                                [--floor] [--json FILE]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (
    ROOT,
    VENV_BIN,
    HarnessError,
    children,
    cmdline,
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

HOST = "127.0.0.1"
TARGET_P50_RATIO = 0.3
"""storwatch's fresh-connection scrape p50 over node_exporter's, at most."""
CHECK_P50_RATIO = 1.0
"""The same, at most, for the keep-alive modes (printed as CHECK)."""
TARGET_AGENT_RSS_MIB = 60.0

# The --floor server: argv PORT FILE, FILE holding a whole response (head and body); answers every connection's
# first request with it and closes. Prints "ready" once listening.
FLOOR_SERVER = r"""
import socket, sys
port, path = int(sys.argv[1]), sys.argv[2]
with open(path, "rb") as f:
    answer = f.read()
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(128)
print("ready", flush=True)
while True:
    conn, _ = listener.accept()
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = b""
        while b"\r\n\r\n" not in head:
            more = conn.recv(65536)
            if not more:
                break
            head += more
        conn.sendall(answer)
    except OSError:
        pass
    finally:
        conn.close()
"""

# What Prometheus 2.42 sends on a scrape (scrape.go), for --prometheus-headers.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/2.42.0",
    "X-Prometheus-Scrape-Timeout-Seconds": "10",
}


@dataclass
class Target:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    fresh: list[float] = field(default_factory=list)
    fresh_connect: list[float] = field(default_factory=list)
    fresh_ttfb: list[float] = field(default_factory=list)
    keepalive: list[float] = field(default_factory=list)
    paced: list[float] = field(default_factory=list)
    body_bytes: int = 0
    series: int = 0
    conn: http.client.HTTPConnection | None = None
    reconnects: int = 0


class Scraper:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers

    def fresh(self, t: Target) -> None:
        """One scrape over a new connection, closed afterwards."""
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection(HOST, t.port, timeout=10)
        try:
            conn.connect()
            t1 = time.perf_counter()
            conn.request("GET", "/metrics", headers={**self.headers, "Connection": "close"})
            resp = conn.getresponse()
            t2 = time.perf_counter()
            body = resp.read()
            t3 = time.perf_counter()
        finally:
            conn.close()
        self._check(t, resp, body)
        t.fresh.append(t3 - t0)
        t.fresh_connect.append(t1 - t0)
        t.fresh_ttfb.append(t2 - t0)

    def keepalive(self, t: Target, into: list[float] | None = None) -> None:
        """One scrape over the target's persistent connection; a reconnect, when the server closed it, is timed."""
        t0 = time.perf_counter()
        if t.conn is None:
            t.conn = http.client.HTTPConnection(HOST, t.port, timeout=10)
            t.conn.connect()
            t.reconnects += 1
        t.conn.request("GET", "/metrics", headers=self.headers)
        resp = t.conn.getresponse()
        body = resp.read()
        t1 = time.perf_counter()
        self._check(t, resp, body)
        if resp.will_close:
            t.conn.close()
            t.conn = None
        (t.keepalive if into is None else into).append(t1 - t0)

    @staticmethod
    def _check(t: Target, resp: http.client.HTTPResponse, body: bytes) -> None:
        if resp.status != 200 or not body:
            raise HarnessError(f"{t.name}: GET /metrics answered {resp.status} with {len(body)} bytes")
        t.body_bytes = len(body)


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=5)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_serving(t: Target, path: str, timeout: float) -> float:
    """Poll ``path`` until it answers 200; return the seconds it took. Fails fast when the process died."""
    started = time.monotonic()
    last = "no answer"
    attempts = 0
    while time.monotonic() - started < timeout:
        attempts += 1
        if t.proc.poll() is not None:
            raise HarnessError(f"{t.name} exited with {t.proc.returncode} before serving:\n{log_tail(t.log)}")
        try:
            status, _ = get(t.port, path)
            if status == 200:
                took = time.monotonic() - started
                if took > 2.0:
                    print(f"note: {t.name} took {took:.1f} s and {attempts} tries to answer {path} (last: {last})")
                return took
            last = f"HTTP {status}"
        except OSError as err:
            last = str(err)
        time.sleep(0.05)
    raise HarnessError(f"{t.name}: {path} did not answer 200 within {timeout:.0f} s ({last}):\n{log_tail(t.log)}")


def count_series(body: bytes) -> int:
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def raw_response(port: int, headers: dict[str, str]) -> bytes:
    """The whole response (head and body, as sent) to ``GET /metrics`` with ``headers`` and ``Connection: close``."""
    lines = ["GET /metrics HTTP/1.1", f"Host: {HOST}:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    request = ("\r\n".join([*lines, "Connection: close"]) + "\r\n\r\n").encode("latin-1")
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall(request)
        parts = []
        while more := sock.recv(1 << 20):
            parts.append(more)
    return b"".join(parts)


def start_floor(sw_port: int, workdir: Path, headers: dict[str, str]) -> Target:
    """The --floor server on a free port, answering what storwatch answered to ``headers`` (head and body)."""
    answer = raw_response(sw_port, headers)
    if not answer.startswith(b"HTTP/1.1 200 "):
        raise HarnessError(f"storwatch answered {answer[:40]!r} to GET /metrics")
    path, log = workdir / "floor-response", workdir / "floor.log"
    path.write_bytes(answer)
    port = free_port()
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", FLOOR_SERVER, str(port), str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        raise HarnessError(f"the --floor server did not start:\n{log_tail(log)}")
    print(f"python floor  on {HOST}:{port}: answers storwatch's answer, {len(answer)} bytes, to every request")
    target = Target("python floor", port, proc, log)
    head, _, body = answer.partition(b"\r\n\r\n")
    target.series = count_series(gzip.decompress(body) if b"content-encoding: gzip" in head.lower() else body)
    return target


def find_storwatch(arg: str | None) -> list[str]:
    if arg:
        return [arg]
    local = VENV_BIN / "storwatch"
    if local.exists():
        return [str(local)]
    found = shutil.which("storwatch")
    if found:
        return [found]
    return [sys.executable, "-m", "storwatch"]


def find_node_exporter(arg: str | None) -> str:
    if arg:
        if os.access(arg, os.X_OK):
            return arg
        raise HarnessError(f"--node-exporter {arg}: not an executable")
    for cand in (shutil.which("prometheus-node-exporter"), "/usr/bin/prometheus-node-exporter"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise HarnessError("prometheus-node-exporter not found (Debian package prometheus-node-exporter; make system-deps)")


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, pid in pids.items():
        v = cpu_seconds(pid)
        if v is None:
            raise HarnessError(f"{name} (pid {pid}) is gone")
        out[name] = v
    return out


def timed_phase(pids: dict[str, int], work: Callable[[], None]) -> tuple[float, dict[str, float]]:
    before, t0 = cpu_of(pids), time.monotonic()
    work()
    wall, after = time.monotonic() - t0, cpu_of(pids)
    return wall, {k: after[k] - before[k] for k in pids}


@dataclass
class Phase:
    key: str
    label: str
    scrapes: int
    wall: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)


def run(args: argparse.Namespace) -> dict[str, Any]:
    ne_bin = find_node_exporter(args.node_exporter)
    sw_cmd = find_storwatch(args.storwatch)
    headers = dict(PROMETHEUS_HEADERS) if args.prometheus_headers else {}
    scraper = Scraper(headers)
    workdir = Path(tempfile.mkdtemp(prefix="storwatch-bench-"))
    targets: list[Target] = []
    floor: Target | None = None
    helper_pids: list[int] = []
    result: dict[str, Any] = {"benchmark": "scrape_latency", "machine": machine_info(), "scrapes": args.scrapes}
    result["warnings"] = quiet_machine_warnings()
    for w in result["warnings"]:
        print(f"WARNING: {w}")
    try:
        started_at = time.monotonic()
        sw_port, ne_port = free_port(), free_port()
        while ne_port == sw_port:
            ne_port = free_port()
        sw_log, ne_log = workdir / "storwatch.log", workdir / "node_exporter.log"
        with open(sw_log, "wb") as f:
            sw = subprocess.Popen(
                [*sw_cmd, "agent", "--listen", f"{HOST}:{sw_port}"],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )
        targets.append(Target("storwatch", sw_port, sw, sw_log))
        with open(ne_log, "wb") as f:
            ne = subprocess.Popen(
                [
                    ne_bin,
                    f"--web.listen-address={HOST}:{ne_port}",
                    "--collector.disable-defaults",
                    "--collector.diskstats",
                    "--collector.filesystem",
                ],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )
        targets.append(Target("node_exporter", ne_port, ne, ne_log))
        swt, net = targets

        # /readyz turns 200 once every source has reported and the View holds the mounts.
        ready_sw = wait_serving(swt, "/readyz", args.startup_timeout)
        ready_ne = wait_serving(net, "/metrics", args.startup_timeout)
        print(f"storwatch     {' '.join(sw_cmd)} agent on {HOST}:{sw_port}: ready after {ready_sw:.2f} s")
        print(f"node_exporter {ne_bin} on {HOST}:{ne_port}: serving after {ready_ne:.2f} s")
        for t in targets:
            _, body = get(t.port, "/metrics")
            t.series = count_series(body)

        time.sleep(0.3)  # let the agent find its helper process (started by the first mount collection)
        helper_pids = children(sw.pid)
        for pid in helper_pids:
            print(f"storwatch child process {pid}: {cmdline(pid)}")
        if not helper_pids:
            print("storwatch child process: none found")
        pids = {"storwatch": sw.pid, "node_exporter": ne.pid}
        for i, pid in enumerate(helper_pids):
            pids[f"storwatch_helper{'' if i == 0 else i}"] = pid
        for _ in range(args.warmup):
            for t in targets:
                scraper.fresh(t)
        for t in targets:
            t.fresh.clear()
            t.fresh_connect.clear()
            t.fresh_ttfb.clear()

        idle_wall, idle_cpu = timed_phase(pids, lambda: time.sleep(args.idle))
        fresh_targets = targets
        if args.floor:
            # Started now, with storwatch's answer of now: the node's series change as mounts come and go.
            floor = start_floor(sw_port, workdir, headers)
            for _ in range(args.warmup):
                scraper.fresh(floor)
            floor.fresh.clear()
            floor.fresh_connect.clear()
            floor.fresh_ttfb.clear()
            pids["python_floor"] = floor.proc.pid
            idle_cpu["python_floor"] = 0.0  # blocked in accept(): it burns nothing idle
            fresh_targets = [*targets, floor]
        phases = [Phase("fresh", "fresh connection", args.scrapes)]
        if args.keepalive:
            phases.append(Phase("paced", f"keep-alive, {args.gap * 1000:.0f} ms apart", args.paced_scrapes))
            phases.append(Phase("keepalive", "keep-alive, back to back", args.scrapes))

        def fresh_work() -> None:
            for _ in range(args.scrapes):
                for t in fresh_targets:
                    scraper.fresh(t)

        def paced_work() -> None:
            for _ in range(args.paced_scrapes):
                time.sleep(args.gap)
                for t in targets:
                    scraper.keepalive(t, t.paced)

        def keepalive_work() -> None:
            for _ in range(args.scrapes):
                for t in targets:
                    scraper.keepalive(t, t.keepalive)

        work = {"fresh": fresh_work, "paced": paced_work, "keepalive": keepalive_work}
        for ph in phases:
            if ph.key != "fresh":
                for _ in range(5):  # open the persistent connections outside the timing
                    for t in targets:
                        scraper.keepalive(t, [])
                for t in targets:
                    t.reconnects = 0
            ph.wall, ph.cpu = timed_phase(pids, work[ph.key])
            for t in targets:
                if t.conn is not None:
                    t.conn.close()
                    t.conn = None

        rss = {name: rss_kib(pid) for name, pid in pids.items()}
        hwm = {name: _status_kib(pid, "VmHWM") for name, pid in pids.items()}
        threads = {name: _status_kib(pid, "Threads") for name, pid in pids.items()}
        lifetime = cpu_of(pids)
        alive_for = time.monotonic() - started_at
        result.update(report(args, targets, floor, pids, rss, hwm, threads, idle_wall, idle_cpu, phases))
        print(f"\nCPU time of each process since it started ({alive_for:.1f} s ago; scrapes, idle and start included):")
        for name, used in lifetime.items():
            print(f"  {name:18s} {used:6.2f} s")
        result["lifetime_cpu_seconds"] = lifetime
        result["headers"] = "prometheus" if args.prometheus_headers else "plain"
        print_targets(result)
        return result
    finally:
        for t in targets:
            if t.conn is not None:
                t.conn.close()
        for t in reversed([*targets, *([floor] if floor is not None else [])]):
            how = terminate(t.proc)
            print(f"{t.name} (pid {t.proc.pid}): {how}")
        for pid in helper_pids:
            print(f"storwatch helper (pid {pid}): {kill_pid_if_alive(pid)}")
        shutil.rmtree(workdir, ignore_errors=True)


def _status_kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def report(
    args: argparse.Namespace,
    targets: list[Target],
    floor: Target | None,
    pids: dict[str, int],
    rss: dict[str, int | None],
    hwm: dict[str, int | None],
    threads: dict[str, int | None],
    idle_wall: float,
    idle_cpu: dict[str, float],
    phases: list[Phase],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    print()
    headers = "Prometheus's" if args.prometheus_headers else "plain GET"
    print(f"request headers: {headers}; the servers alternate scrape by scrape")
    for t in [*targets, *([floor] if floor is not None else [])]:
        print(f"  {t.name:13s} body {t.body_bytes} bytes, {t.series} series")
    print()
    print(f"{'latency (ms)':44s} {'n':>5s} {'p50':>8s} {'p90':>8s} {'p99':>8s} {'max':>8s}")
    for ph in phases:
        for t in targets:
            s = summary(getattr(t, ph.key))
            out[f"{t.name}_{ph.key}"] = s
            print(
                f"  {t.name:13s} {ph.label:28s} {ph.scrapes:5d} {fmt_ms(s['p50']):>8s} {fmt_ms(s['p90']):>8s} "
                f"{fmt_ms(s['p99']):>8s} {fmt_ms(s['max']):>8s}"
            )
        a, b = out[f"storwatch_{ph.key}"], out[f"node_exporter_{ph.key}"]
        ratios = {p: a[p] / b[p] for p in ("p50", "p90", "p99")}
        out[f"ratio_{ph.key}"] = ratios
        print(
            f"  {'ratio sw/ne':13s} {ph.label:28s} {'':5s} {ratios['p50']:8.2f} {ratios['p90']:8.2f} "
            f"{ratios['p99']:8.2f}"
        )
        if ph.key == "fresh" and floor is not None:
            f = out["python_floor_fresh"] = summary(floor.fresh)
            print(
                f"  {floor.name:13s} {ph.label:28s} {ph.scrapes:5d} {fmt_ms(f['p50']):>8s} {fmt_ms(f['p90']):>8s} "
                f"{fmt_ms(f['p99']):>8s} {fmt_ms(f['max']):>8s}"
            )
            floor_ratios = out["ratio_floor_fresh"] = {p: f[p] / b[p] for p in ("p50", "p90", "p99")}
            print(
                f"  {'ratio floor/ne':13s} {ph.label:28s} {'':5s} {floor_ratios['p50']:8.2f} "
                f"{floor_ratios['p90']:8.2f} {floor_ratios['p99']:8.2f}"
            )
    print()
    print("fresh-connection breakdown, p50 (ms): connect / response headers read / whole scrape")
    for t in [*targets, *([floor] if floor is not None else [])]:
        c, h, w = (summary(v)["p50"] for v in (t.fresh_connect, t.fresh_ttfb, t.fresh))
        out[f"{t.name}_fresh_breakdown_p50"] = {"connect": c, "headers": h, "total": w}
        print(f"  {t.name:13s} {fmt_ms(c)} / {fmt_ms(h)} / {fmt_ms(w)}")

    print()
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    print(f"CPU time per scrape, ms (utime+stime over the phase / its scrapes; clock tick {tick:.0f} ms)")
    print(f"  'net' subtracts the idle rate, measured over {idle_wall:.1f} s without scrapes")
    cpu: dict[str, Any] = {}
    for name in pids:
        idle_rate = idle_cpu[name] / idle_wall
        row: dict[str, float] = {"idle_cpu_percent": idle_rate * 100}
        line = f"  {name:17s} idle {idle_rate * 100:5.2f}% CPU;"
        for ph in phases:
            gross = ph.cpu[name] / ph.scrapes
            net = max(0.0, ph.cpu[name] - idle_rate * ph.wall) / ph.scrapes
            row[f"{ph.key}_gross_ms"] = gross * 1000
            row[f"{ph.key}_net_ms"] = net * 1000
            line += f"  {ph.key}: {net * 1000:.3f} net ({gross * 1000:.3f} gross)"
        cpu[name] = row
        print(line)
    for ph in phases:
        key = f"{ph.key}_net_ms"
        ne_net = cpu["node_exporter"][key]
        sw_net = sum(v[key] for k, v in cpu.items() if k.startswith("storwatch"))
        ratio = sw_net / ne_net if ne_net else float("nan")
        cpu[f"ratio_{ph.key}_net"] = ratio
        print(f"  ratio storwatch (agent + helper) / node_exporter, {ph.label}, net: {ratio:.2f}")
    out["cpu"] = cpu

    print()
    print("memory after the scrapes, MiB (VmRSS; peak = VmHWM)")
    mem: dict[str, Any] = {}
    for name in pids:
        r, h = rss[name], hwm[name]
        mem[name] = {"rss_kib": r, "hwm_kib": h, "threads": threads[name]}
        rs = f"{r / 1024:6.1f}" if r is not None else "  gone"
        hs = f"{h / 1024:6.1f}" if h is not None else "  gone"
        print(f"  {name:17s} RSS {rs}   peak {hs}   threads {threads[name]}")
    sw_rss = rss["storwatch"] or 0
    total = sum(v or 0 for k, v in rss.items() if k.startswith("storwatch"))
    ne_rss = rss["node_exporter"] or 0
    print(f"  storwatch agent + helper: {total / 1024:.1f} MiB; node_exporter: {ne_rss / 1024:.1f} MiB")
    out["memory"] = mem

    p50_ratio = out["ratio_fresh"]["p50"]
    targets_out: dict[str, Any] = {
        "p50_ratio": {"value": p50_ratio, "target": TARGET_P50_RATIO, "pass": p50_ratio <= TARGET_P50_RATIO},
        "agent_rss_mib": {
            "value": sw_rss / 1024,
            "target": TARGET_AGENT_RSS_MIB,
            "pass": sw_rss / 1024 <= TARGET_AGENT_RSS_MIB,
            "with_helper_mib": total / 1024,
        },
    }
    for key in ("paced", "keepalive"):
        if f"ratio_{key}" in out:
            v = out[f"ratio_{key}"]["p50"]
            targets_out[f"p50_ratio_{key}"] = {"value": v, "target": CHECK_P50_RATIO, "pass": v <= CHECK_P50_RATIO}
    out["targets"] = targets_out
    out["labels"] = {ph.key: ph.label for ph in phases}
    return out


def print_targets(result: dict[str, Any]) -> None:
    t = result["targets"]
    labels = result["labels"]
    print()
    r = t["p50_ratio"]
    print(
        f"TARGET scrape p50 storwatch / node_exporter, fresh connections, <= {r['target']:.1f}: {r['value']:.2f}  "
        f"{verdict(r['pass'])}"
    )
    if "p50_ratio_paced" in t:
        r = t["p50_ratio_paced"]
        print(
            f"CHECK  <= {r['target']:.1f}, {labels['paced']} (as Prometheus with keep-alive): {r['value']:.2f}  "
            f"{verdict(r['pass'])}"
        )
    if "p50_ratio_keepalive" in t:
        r = t["p50_ratio_keepalive"]
        print(
            f"CHECK  <= {r['target']:.1f}, {labels['keepalive']} (a client polling without pause): {r['value']:.2f}  "
            f"{verdict(r['pass'])}"
        )
    m = t["agent_rss_mib"]
    print(
        f"TARGET storwatch agent RSS <= {m['target']:.0f} MiB: {m['value']:.1f} MiB  {verdict(m['pass'])}"
        f"  (with its helper: {m['with_helper_mib']:.1f} MiB, "
        f"{'within' if m['with_helper_mib'] <= m['target'] else 'over'} the same bound)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scrapes", type=int, default=500, help="timed scrapes per server and mode (default 500)")
    p.add_argument("--warmup", type=int, default=50, help="untimed scrapes per server first (default 50)")
    p.add_argument(
        "--idle",
        type=float,
        default=10.5,
        help="seconds of idle CPU measurement; covers one 10 s mount-collection cycle of the agent (default 10.5)",
    )
    p.add_argument("--no-keepalive", dest="keepalive", action="store_false", help="skip the keep-alive modes")
    p.add_argument(
        "--paced-scrapes", type=int, default=100, help="keep-alive scrapes with a pause between rounds (default 100)"
    )
    p.add_argument(
        "--gap",
        type=float,
        default=0.1,
        help="pause between paced rounds, s (default 0.1; Prometheus scrapes a target every 1 s or more)",
    )
    p.add_argument(
        "--prometheus-headers",
        action="store_true",
        help="send Prometheus's scrape headers (Accept with OpenMetrics, Accept-Encoding: gzip) instead of a plain GET",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="also scrape, on fresh connections, a minimal Python server answering storwatch's bytes (the floor)",
    )
    p.add_argument("--storwatch", help="storwatch executable (default .venv/bin/storwatch)")
    p.add_argument("--node-exporter", help="node_exporter executable (default prometheus-node-exporter on PATH)")
    p.add_argument("--startup-timeout", type=float, default=30.0, help="seconds to wait for each server (default 30)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    if args.scrapes < 1 or args.warmup < 0 or args.idle <= 0:
        p.error("--scrapes must be >= 1, --warmup >= 0, --idle > 0")
    os.chdir(ROOT)
    try:
        result = run(args)
    except (HarnessError, OSError, http.client.HTTPException) as err:
        print(f"scrape_latency: harness error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
