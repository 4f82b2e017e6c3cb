"""``storwatch verify``: check checkpoint files or directories, each with its verdict and why."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from storwatch.commands.common import EXIT_FINDINGS, EXIT_NOTHING_VERIFIED, EXIT_OK, EXIT_USAGE, config_file


def add_parser(sub: Any) -> None:
    """The ``verify`` command's arguments."""
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


def cmd_verify(args: argparse.Namespace) -> int:
    import json

    from storwatch.checkpoints.limits import DeepLimits
    from storwatch.printable import printable

    missing = [p for p in args.paths if not os.path.lexists(p)]
    if missing:
        print(f"storwatch verify: no such file or directory: {', '.join(map(printable, missing))}", file=sys.stderr)
        return EXIT_USAGE
    config = config_file(args.config)
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
