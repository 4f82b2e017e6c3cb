"""``storwatch scan``: a one-shot report of this node, collected synchronously from every source the registry lets
`scan` collect (:func:`scan_view`, which ``plan`` and ``policy explain`` look through too), as a table or JSON."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import logging

    from storwatch.config import Config
from storwatch.commands.common import (
    EXIT_OK,
    MAX_SCAN_SAMPLE_SECONDS,
    MAX_SCAN_TIMEOUT_SECONDS,
    add_common,
    load,
    seconds_arg,
    setup_logging,
)


def add_parser(sub: Any) -> None:
    """The ``scan`` command's arguments."""
    scan = sub.add_parser("scan", help="print a one-shot report of this node's mounts")
    add_common(scan)
    scan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    scan.add_argument(
        "--timeout",
        type=seconds_arg(0.0, MAX_SCAN_TIMEOUT_SECONDS, zero_ok=False),
        default=0.3,
        metavar="SECONDS",
        help=f"deadline for each mount's statvfs, above 0 and at most {MAX_SCAN_TIMEOUT_SECONDS:g} (default 0.3)",
    )
    scan.add_argument(
        "--sample",
        type=seconds_arg(0.0, MAX_SCAN_SAMPLE_SECONDS, zero_ok=True),
        default=0.0,
        metavar="SECONDS",
        help="read block and NFS I/O counters twice this far apart to show the latency of that one interval "
        "(default 0: no latency)",
    )


def scan_view(config: Config, timeout: float, sample_seconds: float = 0.0, first_mounts: Iterable[str] = ()) -> Any:
    """Collect every source the registry lets `scan` collect, once and synchronously, and build the View.

    With ``sample_seconds`` > 0 the sampled sources (diskstats, NFS) are read twice that far apart, so the View has
    the latency of that one interval (view_to_dict labels it ``sample``, not as the agent's minute and hour windows).
    ``first_mounts``: mountpoints whose statvfs goes out before the others' (plan's --mount: MountSource.first).
    """
    import logging

    from storwatch.analysis.build import build_view
    from storwatch.analysis.io import WindowFeeder
    from storwatch.analysis.latency import LatencyWindows
    from storwatch.classify import Classifier, resolve_platform
    from storwatch.registry import SOURCES, SourceContext
    from storwatch.snapshot import Snapshot
    from storwatch.sources.kubevolumes import KubeVolumeEvidence
    from storwatch.sources.mounts import MountSource
    from storwatch.vocabulary import CollectorStatus

    log = logging.getLogger("storwatch")
    config = dataclasses.replace(config, mounts=dataclasses.replace(config.mounts, statvfs_timeout_seconds=timeout))
    platform = resolve_platform(config.platform, config.host_paths())
    paths = config.host_paths()
    facts: dict[str, Any] = {}
    statuses = []
    classifier = Classifier(platform.name, config.overrides())
    ctx = SourceContext(
        paths, time.time, lambda key: facts.get(key.name), lambda consumer: None, classifier=lambda: classifier
    )
    sampled = [spec for spec in SOURCES if spec.scan == "sampled"] if sample_seconds > 0 else []
    first: dict[str, Any] = {}
    for spec in sampled:  # the first reads of the sampled sources, the second after the interval below
        section = spec.section_of(config)
        if spec.off_reason(section) is None:
            first[spec.name] = spec.make(ctx, section)
            _collect(first[spec.name], log)
    if sampled:
        time.sleep(sample_seconds)
    for spec in SOURCES:
        section = spec.section_of(config)
        if spec.off_reason(section) is not None or spec.scan == "never" or (spec.scan == "sampled" and not sampled):
            continue
        off = spec.scan_off(ctx, section) if spec.scan_off is not None else None
        if off is not None:
            # Said as the agent says it (the report's empty tables read it: "no place searched for checkpoints...").
            statuses.append(CollectorStatus(spec.name, False, 0.0, None, None, off_reason=off))
            continue
        started = time.monotonic()
        try:
            if spec.scan_once is not None:
                value = spec.scan_once(ctx, section)
            else:
                source = first.get(spec.name) or spec.make(ctx, section)
                if isinstance(source, MountSource) and first_mounts:
                    source.first = frozenset(os.path.normpath(m) for m in first_mounts)
                try:
                    value = source.collect()
                finally:
                    source.close()
        except OSError as err:  # an unreadable or unusable kernel file: said, and the rest of the scan goes on
            log.error("%s", err)
            statuses.append(CollectorStatus(spec.name, False, time.monotonic() - started, None, str(err)))
            continue
        facts[spec.facts.name] = value
        # Facts that answer and still say they failed (a mount the statvfs pool left unmeasured, NVML not up) fail
        # the collection, as in the agent.
        failure = getattr(value, "failure", None)
        ok = failure is None
        statuses.append(
            CollectorStatus(spec.name, ok, time.monotonic() - started, time.time() if ok else None, failure)
        )
    snap = Snapshot(time.time(), collectors=tuple(statuses), facts=facts)
    windows: LatencyWindows | None = None
    if sampled:
        windows = LatencyWindows(capacity=4)
        WindowFeeder(windows).feed(snap)
    if snap.kube is not None:
        classifier.add_provider(KubeVolumeEvidence(snap.kube))
    return build_view(
        snap,
        classifier,
        platform,
        windows=windows,
        paths=paths,
        mtbf_seconds=config.checkpoints.mtbf_seconds,
        findings=config.findings,
    )


def _collect(source: Any, log: logging.Logger) -> None:
    try:
        source.collect()
    except OSError as err:
        log.error("%s", err)


def format_table(data: dict[str, Any], width: int) -> str:
    from storwatch.printable import printable
    from storwatch.report import (
        GPU_OFF,
        human_bytes,
        latency_cell,
        mount_state,
        no_gpus_line,
        search_summary,
        usage_percent,
    )

    # Kernel interfaces under /proc and /sys are not storage: named under the table, in --json with "pseudo": true.
    mounts = [m for m in data["mounts"] if not m["pseudo"]]
    window = "sample" if data["latency_windows"] == ["sample"] else "1m"
    with_io = any(m["io"]["latency"] for m in mounts)
    headers: tuple[str, ...] = ("MOUNTPOINT", "TYPE", "DURABILITY", "USED", "SIZE", "AVAIL", "STATE")
    if with_io:
        headers += ("READ ms", "WRITE ms", "FSYNC ms")
    headers += ("REASON",)
    # Every cell escaped (printable): a mountpoint, a device or an error holding ESC or a newline would otherwise
    # move the cursor or break the table into rows that are not there.
    rows = [
        tuple(
            printable(cell)
            for cell in (
                m["mountpoint"],
                m["fstype"],
                m["durability"],
                usage_percent(m),
                human_bytes(m["size_bytes"]),
                human_bytes(m["avail_bytes"]),
                mount_state(m),
                *(
                    (
                        latency_cell(m, "read", window),
                        latency_cell(m, "write", window),
                        latency_cell(m, "fsync", window),
                    )
                    if with_io
                    else ()
                ),
                m["reason"],
            )
        )
        for m in mounts
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
    out = [printable(f"platform: {plat['name']} ({plat['detected_by']})"), "", line(headers)]
    out.extend(line(r) for r in rows)
    stuck = sum(1 for m in mounts if m["stuck"])
    eph = sum(1 for m in mounts if m["ephemeral"])
    out += ["", f"{len(rows)} mounts, {eph} ephemeral (volatile or node: lost with this node), {stuck} stuck"]
    pseudo = [m["mountpoint"] for m in data["mounts"] if m["pseudo"]]
    if pseudo:
        out.append(f"not shown: {printable(', '.join(pseudo))} (kernel interfaces, not storage; listed by --json)")
    # Where the checkpoint scan looked (or why nowhere): runs and findings are in --json.
    search = search_summary(data)
    runs = len(data["checkpoints"]) + data["left_out"]["runs"]
    findings = len(data["findings"]) + data["left_out"]["findings"]
    said = f"{search.searched}." if search.searched is not None else search.unsearched or ""
    found = (
        f"{runs} checkpoint run{'' if runs == 1 else 's'}, {findings} finding{'' if findings == 1 else 's'} "
        "(listed by --json). "
        if search.searched
        else ""
    )
    out.append(printable(f"checkpoints: {found}{' '.join((said, *search.caveats))}"))
    if with_io:
        if window == "sample":
            out.append(f"latency: the average of one {data['sample_seconds']:g} s interval, in milliseconds")
        else:
            out.append("latency: p50/p95/max of the per-interval averages, in milliseconds")
    gpus = data["gpus"]
    if gpus:
        driver = data["nvml"]["driver_version"]
        out.append(f"GPUs: {len(gpus)}" + (f" (driver {printable(driver)})" if driver else ""))
    elif data["nvml"]["error"] != GPU_OFF:
        out.append(printable(no_gpus_line(data)))
    return "\n".join(out)


def cmd_scan(args: argparse.Namespace) -> int:
    import shutil

    from storwatch.report import strict_json, view_to_dict

    config, _ = load(args)
    setup_logging(config.log_level if args.log_level else "warning")
    data = view_to_dict(scan_view(config, args.timeout, args.sample), sample_seconds=args.sample or None)
    if args.json:
        sys.stdout.write(strict_json(data, indent=2) + "\n")
    else:
        width = shutil.get_terminal_size((200, 24)).columns if sys.stdout.isatty() else 10_000
        print(format_table(data, width))
    sys.stdout.flush()
    # A statvfs may still be stuck in the helper; nothing of ours waits on it.
    return EXIT_OK
