"""Command line: ``storwatch agent`` runs the node agent; ``storwatch scan`` prints a one-shot report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any

from storwatch import __version__
from storwatch.classify import PLATFORMS
from storwatch.config import Config, ConfigError, load_config, parse_listen

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML configuration file (every field has a default)")
    p.add_argument("--platform", choices=("auto", *PLATFORMS), help="platform preset (default: auto-detect)")
    p.add_argument("--path.procfs", dest="procfs", metavar="DIR", help="procfs mount point (default /proc)")
    p.add_argument("--path.sysfs", dest="sysfs", metavar="DIR", help="sysfs mount point (default /sys)")
    p.add_argument("--path.rootfs", dest="rootfs", metavar="DIR", help="the host's root filesystem (default /)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="log level (default info)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="storwatch", description=__doc__)
    parser.add_argument("--version", action="version", version=f"storwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    agent = sub.add_parser("agent", help="run the node agent and serve /metrics, /status and /api/status")
    _add_common(agent)
    agent.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (default :9477)")
    scan = sub.add_parser("scan", help="print a one-shot report of this node's mounts")
    _add_common(scan)
    scan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    scan.add_argument(
        "--timeout", type=float, default=0.3, metavar="SECONDS", help="deadline for each mount's statvfs (default 0.3)"
    )
    scan.add_argument(
        "--sample",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="read block and NFS I/O counters twice this far apart to show latency (default 0: no latency)",
    )
    verify = sub.add_parser("verify", help="check checkpoint files or directories: complete, incomplete or corrupt")
    verify.add_argument("paths", nargs="+", metavar="PATH", help="checkpoint file or directory")
    verify.add_argument("--deep", action="store_true", help="read every byte (CRC32s) and load with torch if present")
    verify.add_argument("--json", action="store_true", help="print JSON instead of lines")
    return parser


def cmd_verify(args: argparse.Namespace) -> int:
    missing = [p for p in args.paths if not os.path.lexists(p)]
    if missing:
        print(f"storwatch verify: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return EXIT_USAGE
    results = []
    for path in args.paths:
        results.extend(_verify_path(path, args.deep))
    if args.json:
        keys = ("path", "format", "verdict", "reason", "size_bytes", "deep")
        json.dump([{k: r.to_dict()[k] for k in keys} for r in results], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in results:
            print(f"{r.verdict.upper():<10}  {r.format or 'unknown':<19}  {r.path}\n            {r.reason}")
    return EXIT_OK if all(r.verdict == "complete" for r in results) else EXIT_FINDINGS


def _verify_path(path: str, deep: bool) -> list[Any]:
    """The check of ``path``; for a directory that is no checkpoint itself (a run directory, a scan root), the check of
    every checkpoint found below it, oldest first, by the agent's own scanner and bounds."""
    from storwatch.checkpoints import check, identify
    from storwatch.checkpoints.scan import CheckpointScanner

    if not os.path.isdir(path) or os.path.islink(path) or identify(path) is not None:
        return [check(path, deep=deep)]
    result = CheckpointScanner([path]).scan()
    if result.truncated_detail:
        print(f"storwatch verify: {path}: scan stopped early: {result.truncated_detail}", file=sys.stderr)
    found = sorted(result.candidates, key=lambda c: (c.newest_mtime, c.path))
    if not found:
        r = check(path, deep=deep)
        return [dataclasses.replace(r, reason=f"{r.reason}, and none was found below it")]
    print(f"storwatch verify: {path}: {len(found)} checkpoints found below it", file=sys.stderr)
    return [check(c.path, deep=deep) for c in found]


def apply_flags(args: argparse.Namespace) -> Any:
    """A function that lays the command-line flags over a Config: flags win over the file, on reload too."""

    def transform(config: Config) -> Config:
        paths = config.paths
        for name in ("procfs", "sysfs", "rootfs"):
            value = getattr(args, name, None)
            if value:
                paths = dataclasses.replace(paths, **{name: value})
        changes: dict[str, Any] = {"paths": paths}
        if getattr(args, "listen", None):
            changes["listen"] = args.listen
        if args.platform:
            changes["platform"] = args.platform
        if args.log_level:
            changes["log_level"] = args.log_level
        return dataclasses.replace(config, **changes)

    return transform


def _load(args: argparse.Namespace) -> tuple[Config, Any]:
    flags = apply_flags(args)
    config = flags(load_config(args.config))
    config.validate(args.config or "command line")
    return config, flags


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def cmd_agent(args: argparse.Namespace) -> int:
    from storwatch.agent import Agent
    from storwatch.web import StatusHTTPServer

    config, flags = _load(args)
    _setup_logging(config.log_level)
    # The port first: a busy port is one line and exit 2, before any source has started or said anything.
    try:
        server = StatusHTTPServer(config.listen, tls=config.tls)
    except OSError as err:
        host, port = parse_listen(config.listen)
        print(f"storwatch: cannot serve on {host or '*'}:{port}: {err.strerror or err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        agent = Agent(config, config_path=args.config, flags=flags, server=server)
    except ValueError as err:
        server.server_close()
        print(f"storwatch: {err}", file=sys.stderr)
        return EXIT_USAGE
    agent.run_until_signalled(exiting=True)
    return EXIT_OK


def scan_view(config: Config, timeout: float, sample_seconds: float = 0.0) -> Any:
    """Collect every source once, synchronously, and build the View.

    With ``sample_seconds`` > 0, diskstats and mountstats are read twice that far apart, so the View has latency.
    """
    from storwatch.analysis.io import WindowFeeder
    from storwatch.analysis.latency import LatencyWindows
    from storwatch.analysis.view import build_view
    from storwatch.classify import Classifier, resolve_platform
    from storwatch.model import CollectorStatus, Snapshot
    from storwatch.sources.diskio import DiskIOSource
    from storwatch.sources.mounts import MountSource
    from storwatch.sources.nfs import NFSSource

    log = logging.getLogger("storwatch")
    platform = resolve_platform(config.platform, config.host_paths())
    paths = config.host_paths()
    mounts_cfg = dataclasses.replace(config.mounts, statvfs_timeout_seconds=timeout)
    source = MountSource(paths, mounts_cfg)
    started = time.monotonic()
    try:
        mounts = source.collect()
        status = CollectorStatus(source.name, True, time.monotonic() - started, time.time())
    except OSError as err:
        log.error("%s", err)
        mounts = ()
        status = CollectorStatus(source.name, False, time.monotonic() - started, None, str(err))
    finally:
        source.close()
    disks = nfs = None
    windows: LatencyWindows | None = None
    if sample_seconds > 0:
        disk_source, nfs_source = DiskIOSource(paths, config.diskio), NFSSource(paths, config.nfs)
        try:
            disk_source.collect()
            nfs_source.collect()
            time.sleep(sample_seconds)
            disks, nfs = disk_source.collect(), nfs_source.collect()
        except OSError as err:
            log.error("%s", err)
        windows = LatencyWindows(capacity=4)
    gpus, containers = None, {}
    if config.gpu.enabled:
        from storwatch.sources.gpu import GPUSource
        from storwatch.sources.processes import ProcessSource

        gpu_source = GPUSource(call_timeout_seconds=min(config.gpu.call_timeout_seconds, 2.0))
        try:
            gpus = gpu_source.collect()
        finally:
            gpu_source.close()
        pids = [p.pid for g in gpus.gpus for p in g.processes]
        containers = ProcessSource(paths, lambda: pids).collect()
    snap = Snapshot(
        timestamp=time.time(),
        mounts=mounts,
        collectors=(status,),
        disks=disks,
        nfs=nfs,
        gpus=gpus,
        containers=containers,
    )
    if windows is not None:
        WindowFeeder(windows).feed(snap)
    return build_view(snap, Classifier(platform.name, config.overrides()), platform, windows=windows)


def format_table(data: dict[str, Any], width: int) -> str:
    from storwatch.report import human_bytes, latency_cell, mount_state, usage_percent

    with_io = any(m["io"]["latency"] for m in data["mounts"])
    headers: tuple[str, ...] = ("MOUNTPOINT", "TYPE", "DURABILITY", "USED", "SIZE", "AVAIL", "STATE")
    if with_io:
        headers += ("READ ms", "WRITE ms", "FSYNC ms")
    headers += ("REASON",)
    rows = [
        (
            m["mountpoint"],
            m["fstype"],
            m["durability"],
            usage_percent(m),
            human_bytes(m["size_bytes"]),
            human_bytes(m["avail_bytes"]),
            mount_state(m),
            *((latency_cell(m, "read"), latency_cell(m, "write"), latency_cell(m, "fsync")) if with_io else ()),
            m["reason"],
        )
        for m in data["mounts"]
    ]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers[:-1])]
    right = {3, 4, 5, 7, 8, 9}

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells[:-1], widths, strict=True))
        ]
        text = "  ".join(parts) + "  " + cells[-1]
        return text if len(text) <= width else text[: max(width - 1, 20)] + "…"

    plat = data["platform"]
    out = [f"platform: {plat['name']} ({plat['detected_by']})", "", line(headers)]
    out.extend(line(r) for r in rows)
    stuck = sum(1 for m in data["mounts"] if m["stuck"])
    eph = sum(1 for m in data["mounts"] if m["ephemeral"])
    out += ["", f"{len(rows)} mounts, {eph} ephemeral (volatile or node), {stuck} stuck"]
    if with_io:
        out.append("latency: p50/p95/max of the per-interval averages over the sample, in milliseconds")
    return "\n".join(out)


def cmd_scan(args: argparse.Namespace) -> int:
    from storwatch.report import view_to_dict

    config, _ = _load(args)
    _setup_logging(config.log_level if args.log_level else "warning")
    data = view_to_dict(scan_view(config, args.timeout, args.sample))
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        width = shutil.get_terminal_size((200, 24)).columns if sys.stdout.isatty() else 10_000
        print(format_table(data, width))
    sys.stdout.flush()
    # A statvfs may still be stuck in the helper; nothing of ours waits on it.
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "agent":
            return cmd_agent(args)
        if args.command == "verify":
            return cmd_verify(args)
        return cmd_scan(args)
    except ConfigError as err:
        print(f"storwatch: configuration error:\n{err}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
