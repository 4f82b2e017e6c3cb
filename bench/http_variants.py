#!/usr/bin/env python3
"""Investigation, not a target: what changes to storwatch's HTTP request path would save, measured on the real agent.

Each variant is the real ``storwatch agent`` (same sources, same cached /metrics bytes) started in its own process
with one change patched into ``storwatch.web._Handler`` / ``StatusHTTPServer`` before it starts; storwatch/ itself
is not modified. All variants and node_exporter (for reference) are scraped in one run, interleaved, over fresh
connections and over one keep-alive connection each, back to back (scrape_latency.py's ``fresh`` and ``keepalive``
modes: the back-to-back keep-alive mode is where the shipped server stalls).

Variants:
  baseline   as shipped: headers in one send(), the body in a second send(), Nagle's algorithm on
  nodelay    ``_Handler.disable_nagle_algorithm = True`` (socketserver sets TCP_NODELAY on each connection)
  onewrite   ``_send`` writes status line, headers and body with a single send()
  both       nodelay + onewrite
  http10     ``_Handler.protocol_version = "HTTP/1.0"``: no keep-alive; the server closes after every response
  nothread   requests handled on the server thread (no thread per connection): the cost of thread-per-request

Usage: .venv/bin/python bench/http_variants.py [--scrapes 300] [--variants baseline,nodelay,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (
    ROOT,
    HarnessError,
    fmt_ms,
    free_port,
    kill_pid_if_alive,
    machine_info,
    quiet_machine_warnings,
    summary,
    terminate,
    write_json,
)
from scrape_latency import HOST, Scraper, Target, children, find_node_exporter, wait_serving

VARIANTS = ("baseline", "nodelay", "onewrite", "both", "http10", "nothread")


def patch(variant: str, body_bytes: int = 0) -> None:
    """Apply one variant to storwatch.web in this process (called in the server subprocess only)."""
    from storwatch import exporter, web

    if body_bytes > 0:
        # Pad /metrics with comment lines up to body_bytes: a node with many mounts has a larger exposition.
        original = exporter.Exporter.render

        def render(self: Any, view: Any) -> bytes:
            text = original(self, view)
            missing = body_bytes - len(text)
            if missing <= 0:
                return text
            line = b"# padding for a larger exposition (bench/http_variants.py --body-bytes)" + b"." * 27 + b"\n"
            pad = line * (missing // len(line) + 1)
            return text + pad[: missing - 1] + b"\n"

        exporter.Exporter.render = render  # type: ignore[method-assign]

    handler: Any = web._Handler
    if variant in ("nodelay", "both"):
        handler.disable_nagle_algorithm = True
    if variant in ("onewrite", "both"):

        def _send(self: Any, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            # end_headers() without its separate write: the blank line, then the body, then one write of it all.
            self._headers_buffer.append(b"\r\n")
            if self.command != "HEAD":
                self._headers_buffer.append(body)
            self.flush_headers()

        handler._send = _send
    if variant == "http10":
        handler.protocol_version = "HTTP/1.0"
    if variant == "nothread":
        server: Any = web.StatusHTTPServer
        server.process_request = socketserver.BaseServer.process_request
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant}")


def serve(variant: str, listen: str, body_bytes: int) -> int:
    patch(variant, body_bytes)
    from storwatch.cli import main as storwatch_main

    return storwatch_main(["agent", "--listen", listen, "--log-level", "warning"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            raise HarnessError(f"unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    workdir = Path(tempfile.mkdtemp(prefix="storwatch-variants-"))
    targets: list[Target] = []
    helpers: list[int] = []
    scraper = Scraper({})
    result: dict[str, Any] = {
        "benchmark": "http_variants",
        "machine": machine_info(),
        "scrapes": args.scrapes,
        "body_bytes": args.body_bytes,
    }
    result["warnings"] = quiet_machine_warnings()
    for w in result["warnings"]:
        print(f"WARNING: {w}")
    try:
        for v in variants:
            port = free_port()
            log = workdir / f"{v}.log"
            with open(log, "wb") as f:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--serve",
                        v,
                        "--listen",
                        f"{HOST}:{port}",
                        "--body-bytes",
                        str(args.body_bytes),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    cwd=workdir,
                )
            targets.append(Target(v, port, proc, log))
        if not args.no_node_exporter:
            port = free_port()
            log = workdir / "node_exporter.log"
            with open(log, "wb") as f:
                proc = subprocess.Popen(
                    [
                        find_node_exporter(None),
                        f"--web.listen-address={HOST}:{port}",
                        "--collector.disable-defaults",
                        "--collector.diskstats",
                        "--collector.filesystem",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    cwd=workdir,
                )
            targets.append(Target("node_exporter", port, proc, log))
        for t in targets:
            wait_serving(t, "/metrics" if t.name == "node_exporter" else "/readyz", args.startup_timeout)
        time.sleep(0.3)
        for t in targets:
            if t.name != "node_exporter":
                helpers.extend(children(t.proc.pid))
        # Fresh connections first, keep-alive after: the nothread variant cannot accept a second connection while
        # a keep-alive one is open.
        for _ in range(args.warmup):
            for t in targets:
                scraper.fresh(t)
        for t in targets:
            t.fresh.clear()
        for _ in range(args.scrapes):
            for t in targets:
                scraper.fresh(t)
        for _ in range(args.warmup):
            for t in targets:
                scraper.keepalive(t)
        for t in targets:
            t.keepalive.clear()
            t.reconnects = 0
        for _ in range(args.scrapes):
            for t in targets:
                scraper.keepalive(t)

        base = {m: summary(getattr(targets[0], m))["p50"] for m in ("fresh", "keepalive")}
        ne = next((t for t in targets if t.name == "node_exporter"), None)
        ne_p50 = {m: summary(getattr(ne, m))["p50"] for m in ("fresh", "keepalive")} if ne else None
        print(f"{args.scrapes} scrapes per variant per mode, interleaved; latency in ms; 'saves': vs {targets[0].name}")
        print("body bytes: " + ", ".join(f"{t.name} {t.body_bytes}" for t in targets))
        print(
            f"{'variant':14s} {'fresh p50':>10s} {'p99':>8s} {'saves':>8s} {'/ne':>6s}   "
            f"{'keep-alive p50':>14s} {'p99':>8s} {'saves':>8s} {'/ne':>6s}  reconnects"
        )
        rows: dict[str, Any] = {}
        for t in targets:
            row: dict[str, Any] = {"reconnects": t.reconnects}
            line = f"{t.name:14s}"
            for m, width in (("fresh", 10), ("keepalive", 14)):
                s = summary(getattr(t, m))
                row[m] = s
                row[f"{m}_saves_ms"] = (base[m] - s["p50"]) * 1000
                ratio = s["p50"] / ne_p50[m] if ne_p50 else float("nan")
                row[f"{m}_ratio_to_node_exporter"] = ratio
                saves = "" if t.name == "node_exporter" else f"{(base[m] - s['p50']) * 1000:8.3f}"
                line += f" {fmt_ms(s['p50']):>{width}s} {fmt_ms(s['p99']):>8s} {saves:>8s} {ratio:6.2f}   "
            line += f"{t.reconnects:>10d}"
            rows[t.name] = row
            print(line)
        print("(reconnects: connections the keep-alive client had to open because the server closed the last one)")
        result["variants"] = rows
        return result
    finally:
        for t in targets:
            if t.conn is not None:
                t.conn.close()
            terminate(t.proc)
        for pid in helpers:
            kill_pid_if_alive(pid)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--listen", help=argparse.SUPPRESS)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated (default {','.join(VARIANTS)})")
    p.add_argument("--scrapes", type=int, default=300, help="timed scrapes per variant and mode (default 300)")
    p.add_argument("--warmup", type=int, default=20, help="untimed scrapes per variant first (default 20)")
    p.add_argument(
        "--body-bytes", type=int, default=0, help="pad storwatch's /metrics to this size (default: as it is)"
    )
    p.add_argument("--no-node-exporter", action="store_true", help="leave node_exporter out")
    p.add_argument("--startup-timeout", type=float, default=30.0)
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    if args.serve:
        return serve(args.serve, args.listen, args.body_bytes)
    os.chdir(ROOT)
    try:
        result = run(args)
    except (HarnessError, OSError, http.client.HTTPException) as err:
        print(f"http_variants: harness error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
