"""``storwatch sync``: copy a checkpoint to durable storage, verified byte for byte (storwatch/sync/), or with
``--job`` a Slurm job's checkpoints from this node's local storage (:mod:`.sync_job`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storwatch.config import Config
from storwatch.commands.common import (
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    MAX_SYNC_DEADLINE_SECONDS,
    bytes_arg,
    check_config,
    config_file,
    count_arg,
    job_id_arg,
    seconds_arg,
    uid_arg,
)


def add_parser(sub: Any) -> None:
    """The ``sync`` command's arguments."""
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
        type=bytes_arg(0, 1 << 40),
        metavar="BYTES",
        help="read at most this many bytes a second (K, M, G suffixes; 0: unlimited; default "
        "sync.bandwidth_bytes_per_second)",
    )
    sync.add_argument(
        "--keep",
        type=count_arg(0, 100_000),
        metavar="N",
        help="keep the N newest verified copies in DEST's directory, removing older ones storwatch made (0: keep "
        "every one; default sync.keep). Only copies storwatch made are ever removed, never the source",
    )
    sync.add_argument(
        "--deadline",
        type=seconds_arg(0.0, MAX_SYNC_DEADLINE_SECONDS, zero_ok=False),
        metavar="SECONDS",
        help="abandon the copy past this (default sync.deadline_seconds): a hung destination never holds the command",
    )
    sync.add_argument(
        "--job",
        type=job_id_arg,
        metavar="JOBID",
        help="copy a Slurm job's checkpoints from this node's local storage (instead of SRC DEST)",
    )
    sync.add_argument(
        "--uid",
        type=uid_arg,
        metavar="UID",
        help="with --job: the job's owner (default $SLURM_JOB_UID when $SLURM_JOB_ID is JOBID, else from its cgroups)",
    )
    sync.add_argument(
        "--destination", metavar="ROOT", help="with --job: which of sync.destinations to copy to (default the first)"
    )


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
    """A Slurm job's copies (storwatch/commands/sync_job.py); where it looked, and what it left out, on stderr."""
    import contextlib
    import functools

    from storwatch.commands.sync_job import plan_job
    from storwatch.printable import printable

    uid = args.uid
    if uid is None and os.environ.get("SLURM_JOB_ID") == str(args.job):
        with contextlib.suppress(ValueError):
            uid = uid_arg(os.environ.get("SLURM_JOB_UID", ""))
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

    config = config_file(args.config)
    if args.job is not None:  # a job is found through the host's procfs
        check_config(config, args)
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
