"""Command line: ``storwatch agent`` runs the node agent, ``storwatch scan`` prints a one-shot report of this node's
mounts, ``storwatch verify`` checks checkpoint files, ``storwatch sync`` copies a checkpoint to durable storage,
verified, and ``storwatch policy`` checks, tests and documents policies.

Each command imports what it uses, inside its own function; the parser needs only the vocabulary, so ``--help`` loads
nothing else of storwatch (tests/test_command_imports.py holds each command to what it uses)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from storwatch import __version__
from storwatch.vocabulary import PLATFORMS

if TYPE_CHECKING:
    import logging

    from storwatch.config import Config

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_NOTHING_VERIFIED = 0, 1, 2, 3
EXIT_INTERRUPTED = 130

VERIFY_EPILOG = """\
verdicts:
  complete    the checkpoint is whole (every byte read and torch.load tried, with --deep)
  incomplete  a save that did not finish, or a file cut short
  corrupt     finished, then damaged, or never valid
  unsafe      a pickle in it names a global that runs code when loaded (os.system, builtins.exec, ...):
              never complete, whatever else holds; do not load it
  unknown     not a checkpoint, or a check stopped at a limit (the reason names it)
  writing     (an unknown verdict) a process on this node holds one of its files open for writing: the save is
              still running, which is no damage; verify it again once it has finished
A "note:" line says what is no damage: classes a pickle names that storwatch does not know (read as inert
records; checkpoints.allowed_globals in --config quiets it), bytes after a legacy file's last storage.

A checkpoint with no end marker (a Hugging Face Trainer or Accelerate directory) is judged at once when no process
holds any of its files open for writing (every process's open files in /proc; run as root, every process is seen);
while that cannot be seen, only once nothing in it changed for 60 s.

exit status:
  0  every path is a complete checkpoint
  1  some checkpoint is incomplete, corrupt or unsafe
  2  usage error (a path does not exist, a bad option or configuration)
  3  none incomplete, corrupt or unsafe, but something could not be verified: no checkpoint was found, a check
     stopped at a limit, or a checkpoint is still being written

Nothing is ever unpickled with the standard unpickler or executed: pickles are read by a restricted reader, and
torch.load (weights_only=True, with --deep) runs in a separate, resource-limited process.
"""


SYNC_EPILOG = """\
DEST is the copy's own path. When it does not exist, the copy is what `cp -r SRC DEST` makes (keeping modes and
times; owners too, as root). An earlier copy storwatch made at DEST is replaced, or left as it is when its manifest
matches SRC as it is now; anything else at DEST is refused. The copy is written under a temporary name beside DEST,
read back past the page cache and compared by hash, then renamed into place: DEST is never half a copy. Its manifest
(every file, size, mode and xxh3-128 hash; the source; when) is left beside it as DEST.storwatch-sync.json.

DEST may not be SRC, lie inside it (its temporary and manifest would be written into the source) or hold it
(replacing an earlier copy there would remove the source): refused before any copy starts, judged on the resolved
paths.

With sync.destinations in --config, DEST must lie below one of those roots (each directory below the root is opened
without following a symlink, and made where missing); without, DEST's directory must exist. Symlinks in SRC are
copied as symlinks when they stay inside it; one leading out of SRC is refused.

With --job JOBID (a Slurm epilog: see docs/slurm.md), the copies are a job's checkpoints on this node: the job
is found by its processes' cgroups (where they work and write files) and sync.job_scratch; of those directories the
ones the platform preset calls node-local are walked, and each run's newest complete checkpoint is copied below
sync.destinations (the first, or --destination) as sync.template says, {namespace} being the job's user and {pod}
job-JOBID. Where it looked, and what it left out and why, goes to stderr; nothing to copy is exit status 0.

exit status:
  0    DEST holds a verified copy of SRC (made now, or already there); with --job, every copy did
  1    failed or aborted, nothing new at DEST: an I/O error, a read-back that differed, too little space, SRC
       changed during the copy, past the deadline
  2    usage error or refused: bad options or configuration, SRC missing, DEST that is SRC, lies inside it or
       holds it, DEST outside sync.destinations, a symlink leading out of SRC, something at DEST that storwatch did
       not make
  130  interrupted (Ctrl-C): the copy stopped and removed its temporaries
"""


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML configuration file (every field has a default)")
    p.add_argument("--platform", choices=("auto", *PLATFORMS), help="platform preset (default: auto-detect)")
    p.add_argument("--path.procfs", dest="procfs", metavar="DIR", help="procfs mount point (default /proc)")
    p.add_argument("--path.sysfs", dest="sysfs", metavar="DIR", help="sysfs mount point (default /sys)")
    p.add_argument("--path.rootfs", dest="rootfs", metavar="DIR", help="the host's root filesystem (default /)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="log level (default info)")


MAX_SCAN_TIMEOUT_SECONDS = 60.0
MIN_PLAN_BYTES, MAX_PLAN_BYTES = 8 << 20, 8 << 30
MAX_PLAN_ROUNDS, MAX_PLAN_SECONDS = 20, 3600.0
MAX_SCAN_SAMPLE_SECONDS = 3600.0
MAX_SYNC_DEADLINE_SECONDS = 7 * 86400.0


def _seconds(minimum: float, maximum: float, zero_ok: bool) -> Any:
    """An argparse type: a finite number of seconds in range, else a message that says what is accepted."""
    lowest = f"0 to {maximum:g}" if zero_ok else f"greater than 0 and at most {maximum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value >= minimum if zero_ok else value > minimum) and value <= maximum):
            raise argparse.ArgumentTypeError(f"must be a number of seconds {lowest}, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="storwatch",
        description="A node agent for GPU clusters: mount durability, storage latency, GPUs and checkpoints. "
        "Commands: agent, scan, verify, plan, sync, policy (storwatch COMMAND --help describes each).",
    )
    parser.add_argument("--version", action="version", version=f"storwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    agent = sub.add_parser("agent", help="run the node agent and serve /metrics, /status and /api/status")
    _add_common(agent)
    agent.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (default :9477)")
    scan = sub.add_parser("scan", help="print a one-shot report of this node's mounts")
    _add_common(scan)
    scan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    scan.add_argument(
        "--timeout",
        type=_seconds(0.0, MAX_SCAN_TIMEOUT_SECONDS, zero_ok=False),
        default=0.3,
        metavar="SECONDS",
        help=f"deadline for each mount's statvfs, above 0 and at most {MAX_SCAN_TIMEOUT_SECONDS:g} (default 0.3)",
    )
    scan.add_argument(
        "--sample",
        type=_seconds(0.0, MAX_SCAN_SAMPLE_SECONDS, zero_ok=True),
        default=0.0,
        metavar="SECONDS",
        help="read block and NFS I/O counters twice this far apart to show the latency of that one interval "
        "(default 0: no latency)",
    )
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
    _add_common(plan)
    which = plan.add_mutually_exclusive_group()
    which.add_argument("--mount", action="append", metavar="MOUNTPOINT", help="a mount to measure (repeatable)")
    which.add_argument("--all", action="store_true", help="measure every writable storage mount")
    plan.add_argument(
        "--size",
        type=_bytes_arg(MIN_PLAN_BYTES, MAX_PLAN_BYTES),
        default=None,
        metavar="BYTES",
        help="bytes of each test file, at most a tenth of the mount's free space (K, M, G suffixes; default: grown "
        "until one write takes about a second, at most 8G)",
    )
    plan.add_argument(
        "--rounds",
        type=_count_arg(1, MAX_PLAN_ROUNDS),
        default=5,
        metavar="N",
        help=f"test files written and timed on each mount, the median reported (1 to {MAX_PLAN_ROUNDS}, default 5)",
    )
    plan.add_argument(
        "--max-seconds",
        type=_seconds(0.0, MAX_PLAN_SECONDS, zero_ok=False),
        default=60.0,
        metavar="SECONDS",
        help="no further test write starts on a mount that would end past this (at least one is timed; "
        f"above 0 and at most {MAX_PLAN_SECONDS:g}, default 60)",
    )
    plan.add_argument(
        "--checkpoint-bytes",
        type=_bytes_arg(1, 1 << 50),
        default=None,
        metavar="BYTES",
        help="the checkpoint size to plan for (default: the largest complete checkpoint under the checkpoint roots, "
        "else 10G)",
    )
    plan.add_argument(
        "--budget",
        type=_ratio_arg,
        default=0.05,
        metavar="RATIO",
        help="the share of time checkpointing may take, above 0 and below 1 (default 0.05)",
    )
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    verify = sub.add_parser(
        "verify",
        help="check checkpoint files or directories: complete, incomplete, corrupt, unsafe or unknown",
        description="Check checkpoint files or directories (a run directory: every checkpoint found below it).",
        epilog=VERIFY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verify.add_argument("paths", nargs="+", metavar="PATH", help="checkpoint file or directory")
    verify.add_argument(
        "--deep",
        action="store_true",
        help="read every byte (CRC32s) and load with torch, in a limited child, if present",
    )
    verify.add_argument("--json", action="store_true", help="print JSON instead of lines")
    verify.add_argument(
        "--config", metavar="FILE", help="YAML configuration whose checkpoints section sets the limits and allow-list"
    )
    sync = sub.add_parser(
        "sync",
        help="copy a checkpoint (file or directory) to durable storage, verified byte for byte",
        description="Copy SRC to DEST, its final path: hashed while read, written under a temporary name, read back "
        "past the page cache and compared, renamed into place only when identical. A progress line on a terminal.",
        epilog=SYNC_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sync.add_argument("source", nargs="?", metavar="SRC", help="the checkpoint file or directory to copy")
    sync.add_argument("dest", nargs="?", metavar="DEST", help="the copy's own final path")
    sync.add_argument(
        "--config", metavar="FILE", help="YAML configuration whose sync section gives destinations, keep, bandwidth"
    )
    sync.add_argument("--json", action="store_true", help="print the result as JSON instead of a line")
    sync.add_argument(
        "--bandwidth",
        type=_bytes_arg(0, 1 << 40),
        metavar="BYTES",
        help="read at most this many bytes a second (K, M, G suffixes; 0: unlimited; default "
        "sync.bandwidth_bytes_per_second)",
    )
    sync.add_argument(
        "--keep",
        type=_count_arg(0, 100_000),
        metavar="N",
        help="keep the N newest verified copies in DEST's directory, removing older ones storwatch made (0: keep "
        "every one; default sync.keep). Only copies storwatch made are ever removed, never the source",
    )
    sync.add_argument(
        "--deadline",
        type=_seconds(0.0, MAX_SYNC_DEADLINE_SECONDS, zero_ok=False),
        metavar="SECONDS",
        help="abandon the copy past this (default sync.deadline_seconds): a hung destination never holds the command",
    )
    sync.add_argument(
        "--job",
        type=_job_id_arg,
        metavar="JOBID",
        help="copy a Slurm job's checkpoints from this node's local storage (instead of SRC DEST)",
    )
    sync.add_argument(
        "--uid",
        type=_uid_arg,
        metavar="UID",
        help="with --job: the job's owner (default $SLURM_JOB_UID when $SLURM_JOB_ID is JOBID, else from its cgroups)",
    )
    sync.add_argument(
        "--destination", metavar="ROOT", help="with --job: which of sync.destinations to copy to (default the first)"
    )
    policy = sub.add_parser(
        "policy",
        help="check policy files, run their test cases, or show the fields rules can read",
        description="Policies are YAML files of rules over what the agent sees (docs/policy.md).",
    )
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    check = policy_sub.add_parser(
        "check", help="load policy files in order and print every problem as FILE:LINE: FIELD: message (exit 1)"
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="policy file, loaded in the order given")
    test = policy_sub.add_parser(
        "test", help="run the test cases of test files against the policy files they name (exit 1 on a failure)"
    )
    test.add_argument("files", nargs="+", metavar="FILE", help="policy test file (see docs/policy.md)")
    policy_sub.add_parser("show", help="print the policy language and every entity's fields (docs/policy.md)")
    explain = policy_sub.add_parser(
        "explain",
        help="the rules in force and what each would do on this node now, and why (a one-shot look; nothing is run)",
        description="Load the policy as the agent would (the shipped default set unless policy.default_set is false, "
        "then policy.files, then FILE...), look at this node once as `storwatch scan` does, and for each rule say "
        "which entities its condition holds for, with the values of the fields it reads, the message and the "
        "actions it would run.",
    )
    _add_common(explain)
    explain.add_argument("files", nargs="*", metavar="FILE", help="more policy files, loaded after the configured ones")
    explain.add_argument(
        "--timeout",
        type=_seconds(0.1, MAX_SCAN_TIMEOUT_SECONDS, zero_ok=False),
        default=5.0,
        help="seconds to wait for each mount's statvfs (default 5)",
    )
    return parser


def cmd_policy(args: argparse.Namespace) -> int:
    from storwatch.policy.load import PolicyError, load_policy
    from storwatch.printable import printable

    if args.policy_command == "show":
        from storwatch.policy.schema import markdown

        sys.stdout.write(markdown())
        return EXIT_OK
    if args.policy_command == "explain":
        return _policy_explain(args)
    if args.policy_command == "check":
        try:
            from storwatch.actions.registry import checks

            policy = load_policy(args.files, checks())
        except PolicyError as err:
            for line in err.errors:
                print(printable(line), file=sys.stderr)
            return EXIT_FINDINGS
        files = " ".join(map(printable, args.files))
        print(f"{files}: {len(policy.rules)} rules, {len(policy.lists)} lists: ok")
        return EXIT_OK
    from storwatch.policy.testing import run_test_file

    failed = False
    for path in args.files:
        try:
            result = run_test_file(path)
        except PolicyError as err:
            for line in err.errors:
                print(printable(line), file=sys.stderr)
            failed = True
            continue
        for line in result.failures:
            print(printable(line), file=sys.stderr)
        state = "FAILED" if result.failures else "passed"
        print(f"{printable(path)}: {result.cases} cases, {len(result.failures)} failures: {state}")
        failed = failed or bool(result.failures)
    return EXIT_FINDINGS if failed else EXIT_OK


def _sync_pairs(args: argparse.Namespace, config: Config) -> list[tuple[str, str, str | None]] | str:
    """What ``storwatch sync`` copies, as (SRC, DEST, a trusted directory above SRC or None), or the usage problem:
    SRC DEST, or a Slurm job's checkpoints (``--job``)."""
    if args.job is not None:
        if args.source or args.dest:
            return "storwatch sync: --job takes no SRC or DEST (storwatch sync --help)"
        return _job_copies(args, config)
    if args.uid is not None or args.destination is not None:
        return "storwatch sync: --uid and --destination go with --job"
    if not args.source or not args.dest:
        return "storwatch sync: SRC and DEST are both needed (storwatch sync --help)"
    # Relative to here, but not normalised: a '..' in DEST is judged against sync.destinations as written.
    return [(os.path.join(os.getcwd(), args.source), os.path.join(os.getcwd(), args.dest), None)]


def _job_copies(args: argparse.Namespace, config: Config) -> list[tuple[str, str, str | None]] | str:
    """A Slurm job's copies (storwatch/actions/job_sync.py); where it looked, and what it left out, on stderr."""
    import contextlib
    import functools

    from storwatch.actions.job_sync import plan_job
    from storwatch.printable import printable

    uid = args.uid
    if uid is None and os.environ.get("SLURM_JOB_ID") == str(args.job):
        with contextlib.suppress(ValueError):
            uid = _uid_arg(os.environ.get("SLURM_JOB_UID", ""))
    try:
        plan = plan_job(config, args.job, uid=uid, destination=args.destination)
    except ValueError as err:
        return f"storwatch sync --job: {printable(str(err))}"
    except OSError as err:
        return f"storwatch sync --job: cannot read the mount table: {printable(str(err.strerror or err))}"
    job = plan.job
    owner = job.user or (str(job.uid) if job.uid is not None else "unknown")
    say = functools.partial(print, file=sys.stderr)
    say(
        f"job {job.job_id}: {len(job.pids)} processes on this node, owner {printable(owner)}, platform "
        f"{plan.platform.name} ({printable(plan.platform.detected_by)})"
    )
    for place in plan.places:
        verdict = place.verdict
        what = f"{verdict.durability.value}: {verdict.reason}" if verdict else "on no mount this node shows"
        word = "walked" if place.ephemeral else "left out"
        say(f"  {word:<9} {printable(place.directory)} ({printable(what)})")
    if not plan.places:
        say("  no directory of the job found (no process of it runs here, and no sync.job_scratch matched)")
    for why in plan.skipped:
        say(f"  skipped   {printable(why)}")
    if plan.scan_failure:
        say(f"  the checkpoint scan could not read everything: {printable(plan.scan_failure)}")
    if not plan.copies:
        say("  nothing to copy")
    return [(c.source, c.dest, c.source_root) for c in plan.copies]


SYNC_PATH_CHECK_SECONDS = 10.0
"""How long ``storwatch sync`` waits for SRC's and DEST's paths to be resolved, in a helper process, before any copy
starts (a hung mount never holds the command); a path not resolved by then is not judged there, and its copy goes
ahead under its own deadline."""


def _sync_refusals(pairs: Sequence[tuple[str, str, str | None]], timeout: float) -> dict[int, str]:
    """Why copies are refused before any starts, by their index in ``pairs``: SRC is not there; DEST is SRC or lies
    inside it (the copy's temporary and manifest, written beside DEST, would land in the source, which a copy never
    changes, and a copy of a tree that grows under it could only end ``source_changed``); or SRC lies inside DEST
    (an earlier copy of ours there would be replaced, and the source removed with it). Judged on the paths
    resolved and by identity (device and inode), so that no symbolic link, ``..`` or bind mount hides it. A path that
    could not be resolved (unreadable, or no answer within ``timeout``) is not judged: its copy says what it finds."""
    from storwatch.calls.blocking import BlockingCalls

    paths = sorted({p for src, dest, _ in pairs for p in (src, dest)})
    calls = BlockingCalls(max_inflight=len(paths), max_stuck=len(paths))
    try:
        answers = calls.call_many("lineage", {p: [p] for p in paths}, timeout)
    finally:
        calls.close()
    # (resolved path, exists, identities: the path's own first when it exists, then each directory above it)
    lineage = {
        p: (os.fsdecode(bytes.fromhex(a.values[0])), a.values[1] == "1", a.values[2:])
        for p, a in answers.items()
        if a.values is not None and len(a.values) >= 2
    }
    refusals: dict[int, str] = {}
    for i, (src, dest, _) in enumerate(pairs):
        if src not in lineage:
            continue
        real_src, src_exists, src_ids = lineage[src]
        if not src_exists:
            refusals[i] = f"{src!r}: no such file or directory"
            continue
        if dest not in lineage or not src_ids:
            continue
        real_dest, dest_exists, dest_ids = lineage[dest]
        shown = f"DEST {dest!r}" + (f" ({real_dest!r})" if real_dest != dest else "")
        shown_src = f"SRC {src!r}" + (f" ({real_src!r})" if real_src != src else "")
        if dest_exists and dest_ids[0] == src_ids[0]:
            refusals[i] = f"{shown} is {shown_src} itself: name a DEST outside SRC"
        elif src_ids[0] in dest_ids:
            refusals[i] = (
                f"{shown} lies inside {shown_src}: the copy's temporary and manifest would be written into the "
                "source, which a copy never changes; name a DEST outside SRC"
            )
        elif dest_exists and dest_ids[0] in src_ids:
            refusals[i] = (
                f"{shown_src} lies inside {shown}: replacing DEST (an earlier copy) would remove the source with "
                "it; name a DEST that does not hold SRC"
            )
    return refusals


def _sync_exit(results: Sequence[Any], interrupted: bool) -> int:
    if interrupted:
        return EXIT_INTERRUPTED
    if any(r.outcome == "refused" for r in results):
        return EXIT_USAGE
    return EXIT_OK if all(r.ok for r in results) else EXIT_FINDINGS


def _size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


class _ProgressLine:
    """One line on a terminal, rewritten in place: bytes done of the total, the rate since the copy started, ETA."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.width = 0

    def show(self, label: str, done: int, total: int, seconds: float) -> None:
        rate = done / seconds if seconds > 0 else 0.0
        share = f"{100 * done / total:3.0f}%" if total else "  -%"
        if rate > 0 and total >= done:
            left = int((total - done) / rate)
            eta = f"ETA {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}"
        else:
            eta = "ETA -:--:--"
        text = f"{label}  {_size_text(done)} / {_size_text(total)}  {share}  {rate / 1e6:.0f} MB/s  {eta}"
        self.width = max(self.width, len(text))
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()

    def clear(self) -> None:
        if self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


def _sync_line(r: Any) -> str:
    from storwatch.printable import printable

    if r.outcome == "verified":
        rate = f", {r.bytes / r.seconds / 1e6:.0f} MB/s" if r.seconds > 0 else ""
        text = (
            f"{'VERIFIED':<10} {printable(r.dest)}: {_size_text(r.bytes)} in {r.files} files, {r.seconds:.1f} s{rate}; "
            f"manifest {printable(r.manifest or '')}"
        )
    elif r.outcome == "unchanged":
        text = f"{'UNCHANGED':<10} {printable(r.dest)}: already a verified copy of {printable(r.source)} as it is now"
    else:
        word = "REFUSED" if r.outcome == "refused" else "FAILED"
        text = f"{word:<10} {printable(r.dest)}: {r.outcome}: {printable(r.error or '')}"
    notes = "".join(f"\n           note: {printable(n)}" for n in r.notes)
    removed = "".join(f"\n           removed (keep-N): {printable(p)}" for p in r.removed)
    return text + notes + removed


def cmd_sync(args: argparse.Namespace) -> int:
    import json

    from storwatch.printable import printable
    from storwatch.sync import Destinations, SyncResult, SyncWorker

    config = _config_file(args.config)
    if args.job is not None:  # a job is found through the host's procfs
        _check(config, args)
    else:
        config.validate(args.config or "command line")
    section = config.sync
    pairs = _sync_pairs(args, config)
    if isinstance(pairs, str):
        print(pairs, file=sys.stderr)
        return EXIT_USAGE
    bandwidth = section.bandwidth_bytes_per_second if args.bandwidth is None else args.bandwidth
    allowed = Destinations.from_config(section) if section.destinations else None
    if args.job is not None:  # a job's copies are planned below the roots as reached under paths.rootfs
        allowed = Destinations([config.host_paths().root(root) for root in section.destinations])
    deadline = section.deadline_seconds if args.deadline is None else args.deadline
    refusals = _sync_refusals(pairs, min(SYNC_PATH_CHECK_SECONDS, deadline))
    worker = SyncWorker(
        allowed,
        deadline_seconds=deadline,
        bandwidth=float(bandwidth) or None,
        keep=section.keep if args.keep is None else args.keep,
    )
    bar = _ProgressLine(sys.stderr) if sys.stderr.isatty() else None
    results: list[Any] = []
    interrupted = False
    try:
        for i, (src, dest, source_root) in enumerate(pairs):
            if i in refusals:
                src, dest = os.path.abspath(src), os.path.abspath(dest)
                results.append(SyncResult(False, src, dest, 0, 0, 0.0, refusals[i], None, outcome="refused"))
                continue
            job_id = worker.submit(src, dest, source_root=source_root)
            try:
                results.append(_follow_sync(worker, job_id, bar, f"{printable(os.path.basename(dest))}"))
            except KeyboardInterrupt:
                interrupted = True
                worker.cancel(job_id, "interrupted")
                job = worker.wait(job_id, worker.cancel_grace_seconds + 1.0)
                if job is not None and job.result is not None:
                    results.append(job.result)
                break
    finally:
        if bar is not None:
            bar.clear()
        worker.close()
    if args.json:
        json.dump([r.to_dict() for r in results], sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        for r in results:
            print(_sync_line(r))
    return _sync_exit(results, interrupted)


def _follow_sync(worker: Any, job_id: int, bar: _ProgressLine | None, label: str) -> Any:
    """The job's result, once it has one; its progress on ``bar`` meanwhile."""
    while True:
        job = worker.wait(job_id, 0.2)
        if job.result is not None:
            return job.result
        if bar is not None and job.state == "running" and job.bytes_total:
            bar.show(label, job.bytes_done, job.bytes_total, time.time() - job.started)


def cmd_verify(args: argparse.Namespace) -> int:
    import json

    from storwatch.checkpoints.limits import DeepLimits
    from storwatch.printable import printable

    missing = [p for p in args.paths if not os.path.lexists(p)]
    if missing:
        print(f"storwatch verify: no such file or directory: {', '.join(map(printable, missing))}", file=sys.stderr)
        return EXIT_USAGE
    config = _config_file(args.config)
    limits = DeepLimits.from_config(config.checkpoints)
    # Names from disk may hold bytes that are not UTF-8 (kept as surrogates): printed escaped (printable), and never
    # an exception should a line still hold one.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    results = []
    writing: set[str] = set()
    for path in args.paths:
        checked, held = _verify_path(path, args.deep, limits, config.host_paths())
        results.extend(checked)
        writing |= held
    if args.json:
        keys = ("path", "format", "verdict", "reason", "size_bytes", "deep", "notes", "unknown_globals")
        # No number here is a float (sizes are ints): allow_nan=False only keeps it so.
        json.dump([{k: r.to_dict()[k] for k in keys} for r in results], sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        for r in results:
            print(_verdict_lines(r, "WRITING" if r.path in writing else None))
    orphans = _orphaned_temps(args.paths)
    if orphans:
        # Not a verdict on any checkpoint (the exit status does not change): litter beside them.
        print(
            f"{'ORPHANED':<10}  {len(orphans)} temporaries of atomic_save, {sum(o[1] for o in orphans)} bytes, whose "
            "writer is gone (the run's next atomic_save removes them):",
            file=sys.stderr if args.json else sys.stdout,
        )
        for path, _ in orphans:
            print(f"            {printable(path)}", file=sys.stderr if args.json else sys.stdout)
    verdicts = {r.verdict for r in results}
    if verdicts & {"incomplete", "corrupt", "unsafe"}:
        return EXIT_FINDINGS
    return EXIT_NOTHING_VERIFIED if "unknown" in verdicts or not results else EXIT_OK


def _verdict_lines(r: Any, label: str | None = None) -> str:
    """A check's lines: verdict (or ``label``), format and path, then the reason, then its notes. The path, the reason
    and the notes (which may quote an entry's or a class's name) come from the files checked: escaped, so a name
    cannot rewrite the lines around it."""
    from storwatch.printable import printable

    return (
        f"{label or r.verdict.upper():<10}  {printable(r.format or 'unknown'):<19}  {printable(r.path)}\n            "
        + printable(r.reason)
        + "".join(f"\n            note: {printable(note)}" for note in r.notes)
    )


def _orphaned_temps(paths: Sequence[str]) -> list[tuple[str, int]]:
    """atomic_save temporaries whose writer is gone: below each directory given, and beside each file given."""
    import contextlib

    from storwatch.checkpoints.scan import CheckpointScanner
    from storwatch.training import is_temp_name, orphaned_temp

    temps: set[str] = set()
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            temps.update(CheckpointScanner([path]).scan().temps)
        else:
            parent = os.path.dirname(os.path.abspath(path))
            with contextlib.suppress(OSError), os.scandir(parent) as entries:
                temps.update(e.path for e in entries if is_temp_name(e.name))
    found: list[tuple[str, int]] = []
    for temp in sorted(temps):
        directory, name = os.path.split(temp)
        try:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            orphan = orphaned_temp(dir_fd, name)
        finally:
            os.close(dir_fd)
        if orphan is not None:
            found.append((temp, orphan.allocated_bytes))
    return found


def _verify_path(path: str, deep: bool, limits: Any = None, paths: Any = None) -> tuple[list[Any], set[str]]:
    """The check of ``path``; for a directory that is no checkpoint itself (a run directory, a scan root), the check of
    every checkpoint found below it, oldest first, by the agent's own scanner and bounds. With them, the paths of those
    still being written (``_checked``)."""
    from storwatch.checkpoints import identify
    from storwatch.checkpoints.scan import CheckpointScanner
    from storwatch.paths import HostPaths
    from storwatch.printable import printable

    paths = paths or HostPaths()
    if not os.path.isdir(path) or os.path.islink(path) or identify(path) is not None:
        return _checked([path], deep, limits, paths)
    result = CheckpointScanner([path]).scan()
    if result.truncated_detail:
        print(
            f"storwatch verify: {printable(path)}: scan stopped early: {printable(result.truncated_detail)}",
            file=sys.stderr,
        )
    found = sorted(result.candidates, key=lambda c: (c.newest_mtime, c.path))
    if not found:
        (r,), writing = _checked([path], deep, limits, paths)
        return [dataclasses.replace(r, reason=f"{r.reason}, and none was found below it")], writing
    print(f"storwatch verify: {printable(path)}: {len(found)} checkpoints found below it", file=sys.stderr)
    return _checked([c.path for c in found], deep, limits, paths)


def _checked(targets: list[str], deep: bool, limits: Any, paths: Any) -> tuple[list[Any], set[str]]:
    """Each checkpoint's check, and the paths of those still being written. The Trainer and Accelerate mark no end
    of a save, so the agent calls such a directory complete only once it has settled; a person checking a save needs
    no wait when no process on the node holds any of its files open for writing (holders.py): its writer has closed
    it, and it is judged now. One still held is being written, which is no damage (an ``unknown`` verdict that says
    so, never ``incomplete``). What came out incomplete is looked at again after the checks, for a writer that opened
    a file in the meantime."""
    from storwatch.checkpoints import check
    from storwatch.checkpoints.holders import writers_of

    writers = writers_of(paths, targets)
    results = []
    for target in targets:
        w = writers[target]
        if w.holders:
            results.append(_being_written(check(target, limits=limits), w))
            continue
        r = check(target, deep=deep, limits=limits, closed=w.closed)
        if r.verdict == "incomplete" and not w.closed:
            r = dataclasses.replace(r, notes=(*r.notes, _unseen_writers(w)))
        results.append(r)
    again = [r.path for r in results if r.verdict == "incomplete"]
    later = writers_of(paths, again) if again else {}
    for i, r in enumerate(results):
        if r.path in later and later[r.path].holders:
            results[i] = _being_written(r, later[r.path])
    writing = {t for t in targets if writers[t].holders or (t in later and later[t].holders)}
    return results, {r.path for r in results if r.path in writing and r.verdict == "unknown"}


def _being_written(r: Any, w: Any) -> Any:
    """A checkpoint a process holds open for writing: being written, not damaged (an unsafe pickle in what is there
    already stays unsafe)."""
    if r.verdict == "unsafe":
        return r
    first = w.holders[0]
    more = f" (and {len(w.holders) - 1} more processes)" if len(w.holders) > 1 else ""
    return dataclasses.replace(
        r,
        verdict="unknown",
        reason=f"still being written by PID {first.pid} ({first.command}), which has {first.path} open for "
        f"writing{more}: no damage is claimed; verify it again once the save has finished",
    )


def _unseen_writers(w: Any) -> str:
    why = (
        f"the open files of {w.unseen} processes running as its owner could not be read (as root they can)"
        if w.unseen
        else f"the look at open files stopped at {w.bound}"
    )
    return f"whether a process still writes it is not known: {why}, so it is judged only once settled"


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


def _config_file(path: str | None) -> Config:
    """The configuration in ``path``, or the defaults without one. Only a file needs the registry (it declares the
    sections of the sources a file may configure, and importing it imports every source)."""
    if path is None:
        from storwatch.config import Config

        return Config()
    from storwatch.registry import load_config

    return load_config(path)


def _load(args: argparse.Namespace) -> tuple[Config, Any]:
    flags = apply_flags(args)
    config = flags(_config_file(args.config))
    _check(config, args)
    return config, flags


def _check(config: Config, args: argparse.Namespace) -> None:
    """Raise a ConfigError naming every problem of ``config`` as the file and the flags made it, the host's procfs
    included: one that is not there, or cannot be read, is an error, not a node without mounts."""
    from storwatch.config import ConfigError

    where = args.config or "command line"
    problems = [f"{where}: {p}" for p in config.problems()]
    procfs = config.host_paths().procfs_problem()
    if procfs is not None:
        flag = bool(getattr(args, "procfs", None))
        problems.append(f"command line: --path.procfs: {procfs}" if flag else f"{where}: paths.procfs: {procfs}")
    if problems:
        raise ConfigError(*problems)


def _setup_logging(level: str) -> None:
    # Log lines quote mountpoints, paths and errors that embed them: the formatter escapes what a terminal would act
    # on, and indents a record's further lines so that none can pass for a record of its own.
    import logging

    from storwatch.printable import PrintableFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])


def cmd_agent(args: argparse.Namespace) -> int:
    from storwatch.agent.malloc import tune_malloc

    tune_malloc()  # before any thread starts (storwatch/agent/malloc.py)
    from storwatch.agent import Agent
    from storwatch.config import parse_listen
    from storwatch.printable import printable
    from storwatch.web import StatusHTTPServer

    config, flags = _load(args)
    _setup_logging(config.log_level)
    # The port first: a busy port is one line and exit 2, before any source has started or said anything.
    try:
        server = StatusHTTPServer(config.listen, tls=config.tls)
    except OSError as err:
        host, port = parse_listen(config.listen)
        print(f"storwatch: cannot serve on {printable(host or '*')}:{port}: {err.strerror or err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        agent = Agent(config, config_path=args.config, flags=flags, server=server)
    except ValueError as err:
        server.server_close()
        print(f"storwatch: {printable(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    agent.run_until_signalled(exiting=True)
    return EXIT_OK


def _policy_explain(args: argparse.Namespace) -> int:
    from storwatch.actions.registry import checks
    from storwatch.agent.policy import policy_files
    from storwatch.policy.explain import explain
    from storwatch.policy.load import PolicyError, load_policy
    from storwatch.policy.schema import entities
    from storwatch.printable import printable

    config, _ = _load(args)
    _setup_logging(config.log_level if args.log_level else "warning")
    files = [*policy_files(config.policy), *args.files]
    if not config.policy.enabled:
        print("the policy is off (policy.enabled is false): the agent evaluates no rule; as it would be if on:")
    try:
        policy = load_policy(files, checks())
    except PolicyError as err:
        for line in err.errors:
            print(printable(line), file=sys.stderr)
        return EXIT_FINDINGS
    view = scan_view(config, args.timeout)
    print(f"{len(policy.rules)} rules from {', '.join(map(printable, files))}; this node now ({view.platform.name}):")
    print()
    for line in explain(policy, entities(view)):
        print(line)
    return EXIT_OK


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


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _bytes_arg(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        t = text.strip().upper().removesuffix("IB").removesuffix("B")
        unit = t[-1:] if t[-1:] in _UNITS and t[-1:] else ""
        try:
            value = int(float(t[: len(t) - len(unit)]) * _UNITS[unit])
        except ValueError:
            value = -1
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be a size from {minimum} to {maximum} bytes, got {text!r}")
        return value

    return parse


def _job_id_arg(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 1 << 32:
        raise argparse.ArgumentTypeError(f"must be a Slurm job ID (a whole number above 0), got {text!r}")
    return int(text)


def _uid_arg(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) < 1 << 32:
        raise argparse.ArgumentTypeError(f"must be a user ID (a whole number), got {text!r}")
    return int(text)


def _count_arg(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be a whole number from {minimum} to {maximum}, got {text!r}")
        return value

    return parse


def _ratio_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a ratio above 0 and below 1, got {text!r}")
    return value


def cmd_plan(args: argparse.Namespace) -> int:
    from storwatch.plan import as_dicts, checkpoint_size, cpu_stall_reader, format_plan, plan
    from storwatch.printable import printable
    from storwatch.report import NON_FINITE, finite_data, strict_json
    from storwatch.sources.checkpoint_key import default_roots

    config, _ = _load(args)
    _setup_logging(config.log_level if args.log_level else "warning")
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


def cmd_scan(args: argparse.Namespace) -> int:
    import shutil

    from storwatch.report import strict_json, view_to_dict

    config, _ = _load(args)
    _setup_logging(config.log_level if args.log_level else "warning")
    data = view_to_dict(scan_view(config, args.timeout, args.sample), sample_seconds=args.sample or None)
    if args.json:
        sys.stdout.write(strict_json(data, indent=2) + "\n")
    else:
        width = shutil.get_terminal_size((200, 24)).columns if sys.stdout.isatty() else 10_000
        print(format_table(data, width))
    sys.stdout.flush()
    # A statvfs may still be stuck in the helper; nothing of ours waits on it.
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from storwatch.config import ConfigError
    from storwatch.printable import printable_lines

    try:
        if args.command == "agent":
            return cmd_agent(args)
        if args.command == "verify":
            return cmd_verify(args)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command == "policy":
            return cmd_policy(args)
        if args.command == "sync":
            return cmd_sync(args)
        return cmd_scan(args)
    except ConfigError as err:
        print(f"storwatch: configuration error:\n{printable_lines(str(err), indent='')}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
