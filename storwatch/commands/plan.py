"""``storwatch plan``: measure the write throughput of this node's mounts and plan checkpoint intervals for each
(storwatch/plan.py does the measuring)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from storwatch.commands.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    MAX_PLAN_BYTES,
    MAX_PLAN_ROUNDS,
    MAX_PLAN_SECONDS,
    MIN_PLAN_BYTES,
    add_common,
    bytes_arg,
    count_arg,
    load,
    ratio_arg,
    seconds_arg,
    setup_logging,
)
from storwatch.commands.scan import scan_view


def add_parser(sub: Any) -> None:
    """The ``plan`` command's arguments."""
    plan = sub.add_parser(
        "plan",
        help="measure the write throughput of this node's mounts and plan checkpoint intervals for each",
        description="Measure sequential write throughput (O_DIRECT where taken, then fsync; the median of several "
        "writes of about a second each) of the mounts named, "
        "and for a checkpoint size (default: the largest complete checkpoint the checkpoint scan finds, in its default "
        "places and the checkpoints.roots of --config, "
        "else 10G; the output says which) print the write time, whether it "
        "survives losing the node, and the shortest interval that keeps checkpoint overhead under the budget. "
        "It writes a test file on each mount measured (in a fresh hidden directory, removed after): name the mounts "
        "with --mount, or take every writable storage mount with --all.",
    )
    add_common(plan)
    which = plan.add_mutually_exclusive_group()
    which.add_argument("--mount", action="append", metavar="MOUNTPOINT", help="a mount to measure (repeatable)")
    which.add_argument("--all", action="store_true", help="measure every writable storage mount")
    plan.add_argument(
        "--size",
        type=bytes_arg(MIN_PLAN_BYTES, MAX_PLAN_BYTES),
        default=None,
        metavar="BYTES",
        help="bytes of each test file, at most a tenth of the mount's free space (K, M, G suffixes; default: grown "
        "until one write takes about a second, at most 8G)",
    )
    plan.add_argument(
        "--rounds",
        type=count_arg(1, MAX_PLAN_ROUNDS),
        default=5,
        metavar="N",
        help=f"test files written and timed on each mount, the median reported (1 to {MAX_PLAN_ROUNDS}, default 5)",
    )
    plan.add_argument(
        "--max-seconds",
        type=seconds_arg(0.0, MAX_PLAN_SECONDS, zero_ok=False),
        default=60.0,
        metavar="SECONDS",
        help="no further test write starts on a mount that would end past this (at least one is timed; "
        f"above 0 and at most {MAX_PLAN_SECONDS:g}, default 60)",
    )
    plan.add_argument(
        "--checkpoint-bytes",
        type=bytes_arg(1, 1 << 50),
        default=None,
        metavar="BYTES",
        help="the checkpoint size to plan for (default: the largest complete checkpoint under the checkpoint roots, "
        "else 10G)",
    )
    plan.add_argument(
        "--budget",
        type=ratio_arg,
        default=0.05,
        metavar="RATIO",
        help="the share of time checkpointing may take, above 0 and below 1 (default 0.05)",
    )
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")


def cmd_plan(args: argparse.Namespace) -> int:
    from storwatch.plan import as_dicts, checkpoint_size, cpu_stall_reader, format_plan, plan
    from storwatch.printable import printable
    from storwatch.report import NON_FINITE, finite_data, strict_json
    from storwatch.sources.checkpoint_key import default_roots

    config, _ = load(args)
    setup_logging(config.log_level if args.log_level else "warning")
    if not args.mount and not args.all:
        print(
            "storwatch plan writes a test file on each mount it measures: name them with --mount MOUNTPOINT "
            "(repeatable), or measure every writable storage mount with --all",
            file=sys.stderr,
        )
        return EXIT_USAGE
    # The same one-shot collection as `scan`: with checkpoint roots to search (configured, the default places, the
    # kubelet's pod volumes), their walk, whose complete checkpoints give the size to plan for. A mount's statvfs
    # gets what the agent gives it (mounts.statvfs_timeout_seconds, 1 s), not scan's quick 0.3 s: a mount called
    # stuck is not measured at all, and on a node whose CPUs are all busy a healthy statvfs can take longer than
    # 0.3 s to answer.
    view = scan_view(config, config.mounts.statvfs_timeout_seconds, 0.0, () if args.all else args.mount)
    paths = config.host_paths()
    roots = default_roots(paths, config.checkpoints.roots, config.checkpoints.kubelet)
    size = checkpoint_size(view, args.checkpoint_bytes, roots, paths)

    # Progress on a terminal only, one line rewritten in place (as scan's walk of the roots): a log or a pipe gets
    # the result alone.
    live = sys.stderr.isatty()

    def progress(line: str) -> None:
        if live:
            sys.stderr.write(f"\r\033[K{printable(line)}")
            sys.stderr.flush()

    rows = plan(
        view,
        None if args.all else args.mount,
        size.bytes,
        size=args.size,
        budget=args.budget,
        rounds=args.rounds,
        max_seconds=args.max_seconds,
        mtbf_seconds=config.checkpoints.mtbf_seconds,
        local=paths.root,
        progress=progress,
        cpu_stalled=cpu_stall_reader(paths),
    )
    if live:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()
    if args.json:
        data = {"budget": args.budget, "checkpoint": {**dataclasses.asdict(size), "says": size.sentence()}}
        plain, non_finite = finite_data({**data, "mounts": as_dicts(rows)})
        sys.stdout.write(strict_json({**plain, NON_FINITE: non_finite}, indent=2) + "\n")
    else:
        # The names in the table (mountpoints, types, errors quoting paths) escaped before it is laid out, so that
        # its columns are measured as printed.
        shown = [
            dataclasses.replace(
                r,
                mountpoint=printable(r.mountpoint),
                fstype=printable(r.fstype),
                error=None if r.error is None else printable(r.error),
            )
            for r in rows
        ]
        print(printable(size.sentence()))
        print(format_plan(shown, args.budget, config.checkpoints.mtbf_seconds))
    return EXIT_OK if all(r.error is None for r in rows) else EXIT_FINDINGS
