"""One HTTP server: /metrics (cached bytes), /healthz, /readyz, /status (HTML) and /api/status (JSON)."""

from __future__ import annotations

import html
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from storwatch.classify import KERNEL_INTERFACE_DIRS
from storwatch.config import ConfigError, TLSConfig, parse_listen
from storwatch.model import View
from storwatch.report import (
    human_bytes,
    human_seconds,
    kube_cell,
    latency_cell,
    mount_state,
    no_checkpoints_line,
    no_gpus_line,
    usage_percent,
    view_to_dict,
)

log = logging.getLogger(__name__)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


ViewProvider = Callable[[], "View | None"]
"""The current View (None while the agent is starting)."""
MetricsProvider = Callable[[], bytes]
"""The current exposition text; rendered only when /metrics asks for it."""


def render_status_page(data: dict[str, Any]) -> str:
    e = html.escape
    # Mounts under the host's procfs and sysfs (a cgroup tmpfs...) are kernel interfaces, not storage: left off the
    # page, named in a line under the table, and kept in /api/status with "pseudo": true.
    storage = [m for m in data["mounts"] if not m["pseudo"]]
    pseudo = [m["mountpoint"] for m in data["mounts"] if m["pseudo"]]
    rows = []
    for m in storage:
        state = mount_state(m)
        rows.append(
            "<tr class='{cls}'><td class='mountpoint'>{mp}</td><td>{dev}</td><td>{fs}</td>"
            "<td class='durability'><span class='d-{dur}'>{dur}</span></td><td class='reason'>{reason}</td>"
            "<td class='kube'>{kube}</td>"
            "<td class='num'>{used}</td><td class='num'>{size}</td><td class='num'>{avail}</td>"
            "<td class='state'>{state}</td></tr>".format(
                cls="stuck" if m["stuck"] else "",
                mp=e(m["mountpoint"]),
                dev=e(m["device"]),
                fs=e(m["fstype"]),
                dur=e(m["durability"]),
                reason=e(m["reason"]),
                kube=e(kube_cell(m["kube"])),
                used=usage_percent(m),
                size=human_bytes(m["size_bytes"]),
                avail=human_bytes(m["avail_bytes"]),
                state=e(state),
            )
        )
    pseudo_note = (
        "<p class='note' id='pseudo'>Not shown: {} under {}: kernel interfaces rather than storage "
        '(listed in /api/status with "pseudo": true).</p>'.format(
            e(", ".join(pseudo)), " and ".join(KERNEL_INTERFACE_DIRS)
        )
        if pseudo
        else ""
    )
    io_rows = []
    for m in storage:
        cells = [latency_cell(m, op, win) for op in ("read", "write", "fsync") for win in ("1m", "1h")]
        probe = m["io"]["probe"]
        if probe is None:
            probe_cell = "-"
        elif probe["stuck"]:
            probe_cell = "STUCK"
        elif probe["seconds"] is None:
            probe_cell = "failed: " + (probe["error"] or "")
        else:
            probe_cell = "/".join(f"{probe['seconds'][k] * 1000:.2f}" for k in ("write", "fsync", "read"))
        if all(c == "-" for c in cells) and probe_cell == "-":
            continue
        io_rows.append(
            "<tr><td class='mountpoint'>{}</td><td>{}</td>{}<td class='num'>{}</td></tr>".format(
                e(m["mountpoint"]),
                e(m["io"]["device"] or ("nfs" if m["io"]["nfs"] else "-")),
                "".join(f"<td class='num'>{c}</td>" for c in cells),
                e(probe_cell),
            )
        )
    gpu_rows = []
    for g in data["gpus"]:

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v * 100:.0f}%"

        pods = sorted({p["pod_uid"] or "(host)" for p in g["processes"]})
        gpu_rows.append(
            "<tr class='{cls}'><td>{idx}</td><td>{name}</td><td>{up}</td><td class='num'>{util}</td>"
            "<td class='num'>{mem}</td><td class='num'>{used} / {total}</td><td class='num'>{power}</td>"
            "<td>{pods}</td></tr>".format(
                cls="" if g["up"] else "stuck",
                idx=g["index"],
                name=e(g["name"] or "?"),
                up="up" if g["up"] else "DOWN " + e(g["error"] or ""),
                util=pct(g["utilization_ratio"]),
                mem=pct(g["memory_utilization_ratio"]),
                used=human_bytes(g["memory_used_bytes"]),
                total=human_bytes(g["memory_total_bytes"]),
                power="-" if g["power_watts"] is None else f"{g['power_watts']:.0f} W",
                pods=e(", ".join(pods)),
            )
        )
    ckpt_rows = []
    for r in data["checkpoints"]:
        problems = []
        if r["incomplete"]:
            problems.append(f"{r['incomplete']} incomplete")
        if r["corrupt"]:
            bad = next((c for c in r["checkpoints"] if c["verdict"] == "corrupt"), None)
            problems.append(f"{r['corrupt']} corrupt" + (f": {bad['reason']}" if bad else ""))
        if r["orphaned_temps"]:
            problems.append(
                f"{r['orphaned_temps']} orphaned temporaries ({human_bytes(r['orphaned_temp_bytes'])}) left by killed "
                "saves; the run's next atomic_save removes them"
            )
        ckpt_rows.append(
            "<tr class='{cls}'><td class='mountpoint'>{run}</td>"
            "<td class='durability'><span class='d-{dur}'>{dur}</span></td><td class='num'>{age}</td>"
            "<td class='num'>{size}</td><td class='num'>{interval}</td>"
            "<td class='num'>{kept}</td><td>{state}</td></tr>".format(
                cls="stuck" if r["corrupt"] else "",
                run=e(r["run"]),
                dur=e(r["durability"] or "unknown"),
                age=human_seconds(r["newest_complete_age_seconds"]),
                size=human_bytes(r["newest_complete_size_bytes"]),
                interval=human_seconds(r["interval_seconds"]),
                kept=r["kept"],
                state=e("writing; " if r["write_in_progress"] else "") + e("; ".join(problems) or "ok"),
            )
        )
    if not io_rows:
        idle = "no latency: no mount did I/O in the last hour, and no probe ran"
        io_rows.append(f"<tr><td colspan='9' class='empty'>{idle}</td></tr>")
    if not gpu_rows:
        gpu_rows.append(f"<tr><td colspan='8' class='empty'>{e(no_gpus_line(data))}</td></tr>")
    if not ckpt_rows:
        ckpt_rows.append(f"<tr><td colspan='7' class='empty'>{e(no_checkpoints_line(data))}</td></tr>")
    nvml = data["nvml"]
    gpu_note = "" if nvml["nvml_up"] else f"<p>NVML not available: {e(nvml['error'] or 'unknown')}</p>"
    collectors = ", ".join(
        "{}: {}".format(e(c["name"]), "ok" if c["success"] else "FAILED " + e(c["error"] or ""))
        for c in data["collectors"]
    )
    plat = data["platform"]
    stuck_count = sum(1 for m in storage if m["stuck"])
    ephemeral = sum(1 for m in storage if m["ephemeral"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>storwatch status</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }} td.num {{ text-align: right; white-space: nowrap; }}
tr.stuck {{ background: #fde2e2; }} .mountpoint {{ font-family: monospace; }}
.d-volatile {{ color: #b00020; font-weight: bold; }} .d-node {{ color: #b36b00; font-weight: bold; }}
.d-cluster {{ color: #1b5e20; font-weight: bold; }} .d-region {{ color: #0d47a1; font-weight: bold; }}
.summary span {{ margin-right: 2em; }} .note {{ color: #555; }} td.empty {{ color: #555; font-style: italic; }}
td.kube {{ font-size: 12px; }}
</style></head><body>
<h1>storwatch</h1>
<p class="summary"><span>platform: <b id="platform">{e(plat["name"])}</b> ({e(plat["detected_by"])})</span>
<span>mounts: <b id="mount-count">{len(storage)}</b></span>
<span>ephemeral (volatile or node): <b id="ephemeral-count">{ephemeral}</b></span>
<span>stuck: <b id="stuck-count">{stuck_count}</b></span></p>
<h2>Mounts</h2>
<table id="mounts"><thead><tr><th>Mountpoint</th><th>Device</th><th>Type</th><th>Durability</th><th>Reason</th>
<th>Kubernetes</th><th>Used</th><th>Size</th><th>Avail</th><th>State</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
{pseudo_note}
<p class="note" id="legend">Durability, how long data on a mount survives:
<span class="d-volatile">volatile</span> is lost on a reboot or a pod restart (memory);
<span class="d-node">node</span> survives pod restarts and is lost with the node;
<span class="d-cluster">cluster</span> survives losing this node;
<span class="d-region">region</span> survives losing the cluster.
<b>Ephemeral</b> means volatile or node: data there is gone when this node is.
Used is counted as df counts it, used / (used + available): space reserved for root is neither.</p>
<h2>GPUs</h2>
{gpu_note}
<table id="gpus"><thead><tr><th>GPU</th><th>Name</th><th>State</th><th>Util</th><th>Mem util</th>
<th>Memory</th><th>Power</th><th>Pods</th></tr></thead>
<tbody>
{chr(10).join(gpu_rows)}
</tbody></table>
<h2>Checkpoints</h2>
<table id="checkpoints"><thead><tr><th>Run</th><th>Durability</th><th>Newest complete, age</th><th>Size</th>
<th>Interval</th><th>Kept</th><th>State</th></tr></thead>
<tbody>
{chr(10).join(ckpt_rows)}
</tbody></table>
<h2>Latency</h2>
<p>Milliseconds, p50/p95/max of per-second averages, over the last minute and hour; probe: write/fsync/read of
its last round.</p>
<table id="latency"><thead><tr><th>Mountpoint</th><th>Device</th><th>Read 1m</th><th>Read 1h</th>
<th>Write 1m</th><th>Write 1h</th><th>Fsync 1m</th><th>Fsync 1h</th><th>Probe</th></tr></thead>
<tbody>
{chr(10).join(io_rows)}
</tbody></table>
<p>Collectors: {collectors}</p>
<p><a href="/metrics">/metrics</a> · <a href="/api/status">/api/status</a></p>
</body></html>
"""


class _Handler(BaseHTTPRequestHandler):
    server: StatusHTTPServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 15  # a client that stops mid-request frees its thread after this

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s " + format, self.client_address[0], *args)

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        # Status line, headers and body in one write: in two, Nagle's algorithm holds the body back until the
        # client acknowledges the headers, which a keep-alive client delays by ~40 ms.
        self.log_request(code)
        head = (
            f"{self.protocol_version} {code} {self.responses[code][0]}\r\n"
            f"Server: {self.version_string()}\r\nDate: {self.date_time_string()}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        self.wfile.write(head if self.command == "HEAD" else head + body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.server.metrics(), METRICS_CONTENT_TYPE)
        elif path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/readyz":
            view = self.server.view()
            ready = view is not None and view.ready
            self._send(200 if ready else 503, b"ready\n" if ready else b"not ready\n", "text/plain; charset=utf-8")
        elif path in ("/status", "/"):
            view = self.server.view()
            if view is None:
                self._send(503, b"storwatch is starting; no data yet\n", "text/plain; charset=utf-8")
                return
            page = render_status_page(view_to_dict(view))
            self._send(200, page.encode("utf-8"), "text/html; charset=utf-8")
        elif path == "/api/status":
            view = self.server.view()
            if view is None:
                self._send(503, b'{"error": "starting"}\n', "application/json")
                return
            self._send(200, json.dumps(view_to_dict(view)).encode(), "application/json")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    do_HEAD = do_GET


class StatusHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, listen: str, view: ViewProvider, metrics: MetricsProvider, tls: TLSConfig | None = None) -> None:
        host, port = parse_listen(listen)
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.view = view
        self.metrics = metrics
        self._tls = _tls_context(tls) if tls is not None and tls.cert_file else None
        super().__init__((host, port), _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        if self._tls is not None:
            # The handshake happens on the request's own thread, so a slow client never blocks accept().
            sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            request.settimeout(_Handler.timeout)
            request.do_handshake()
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("http: error serving %s", client_address, exc_info=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.5}, name="http", daemon=True)
        thread.start()
        return thread


def _tls_context(tls: TLSConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as err:
        why = _why(err)
        raise ConfigError(f"tls: cannot load cert_file {tls.cert_file} / key_file {tls.key_file}: {why}") from None
    if tls.client_ca_file:
        try:
            ctx.load_verify_locations(tls.client_ca_file)
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(f"tls: cannot load client_ca_file {tls.client_ca_file}: {_why(err)}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _why(err: Exception) -> str:
    return getattr(err, "strerror", None) or getattr(err, "reason", None) or str(err)
