"""How a copy ended: its outcome, in the one vocabulary every part of a copy's life uses, and the result record that
crosses the helper's pipe."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

HASH_NAME = "xxh3_128"
"""The hash of every file, read and read back: xxh3-128 hashes far faster than any disk writes (BENCHMARKS.md), so
it never limits the copy; BLAKE3 and SHA-256 would, at about a gigabyte a second on one core."""
OUTCOMES = ("verified", "unchanged", "refused", "source_changed", "no_space", "failed", "stopped", "abandoned")
"""How a copy ended: ``verified`` (made and read back identical), ``unchanged`` (DEST already holds our verified copy
of the source as it is), ``refused`` (it may not be made: the allowlist, a template field, a symlink out of the
source, something at DEST that is not ours), ``source_changed``, ``no_space``, ``failed`` (an I/O error, a read-back
that differs), ``stopped`` (``stop()``, ``cancel()``), ``abandoned`` (past its deadline, or the worker closed)."""
OK_OUTCOMES = frozenset({"verified", "unchanged"})

JobState = Literal["queued", "running", "done", "failed", "abandoned"]
"""Where a copy is in its life, the one vocabulary of the worker, the sync action's jobs, /status and /api/status:
``queued``, ``running``, then ``done`` (a verified copy, made or already there: its outcome one of OK_OUTCOMES),
``failed`` (any other outcome the copy reported) or ``abandoned`` (its helper was killed: past its deadline,
cancelled, the worker closed)."""
STATES: tuple[JobState, ...] = get_args(JobState)
ACTIVE_STATES: frozenset[JobState] = frozenset({"queued", "running"})
ENDED_STATES: frozenset[JobState] = frozenset({"done", "failed", "abandoned"})


class SyncRefused(Exception):
    """The copy may not be made; the message says why, naming the field, path or entry at fault."""


class Abort(Exception):
    """The copy ended before it was made; ``outcome`` says how (one of OUTCOMES)."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True)
class SyncResult:
    ok: bool
    """The copy at ``dest`` is verified identical to the source (made now, or already there)."""
    source: str
    dest: str
    bytes: int
    """Bytes in the copy's files."""
    files: int
    """Regular files in the copy."""
    seconds: float
    error: str | None
    manifest: str | None
    """The manifest beside the copy, when there is a verified copy."""
    outcome: str = "verified"
    """One of OUTCOMES."""
    written_bytes: int = 0
    """Bytes written by this copy (0 when unchanged or failed before writing)."""
    hash: str = HASH_NAME
    removed: tuple[str, ...] = ()
    """Older copies removed by keep-N retention."""
    notes: tuple[str, ...] = ()
    """What is no failure but worth saying (the owner not kept, retention that stopped)."""
    job_id: int | None = None
    started: float = 0.0
    """Wall-clock time the copy started (seconds since the epoch)."""

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "removed": list(self.removed), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SyncResult:
        """A result read back from a helper's pipe, every field checked against its type."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for name, value in data.items():
            if name not in fields:
                continue
            if name in ("removed", "notes"):
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"{name}: not a list of strings")
                value = tuple(value)
            values[name] = value
        result = cls(**values)
        checks = {
            "ok": bool,
            "source": str,
            "dest": str,
            "bytes": int,
            "files": int,
            "seconds": (int, float),
            "written_bytes": int,
            "hash": str,
            "started": (int, float),
        }
        for name, kind in checks.items():
            if not isinstance(getattr(result, name), kind):  # type: ignore[arg-type]
                raise ValueError(f"{name}: {getattr(result, name)!r} is not {kind}")
        for name in ("error", "manifest"):
            if getattr(result, name) is not None and not isinstance(getattr(result, name), str):
                raise ValueError(f"{name}: not a string")
        if result.outcome not in OUTCOMES:
            raise ValueError(f"outcome: {result.outcome!r} is not one of {OUTCOMES}")
        return result


def failed(source: str, dest: str, outcome: str, error: str, seconds: float = 0.0, started: float = 0.0) -> SyncResult:
    return SyncResult(
        ok=False,
        source=source,
        dest=dest,
        bytes=0,
        files=0,
        seconds=seconds,
        error=error,
        manifest=None,
        outcome=outcome,
        started=started,
    )
