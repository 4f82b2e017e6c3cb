"""The durable copies source: storwatch's verified copies below the durable roots (``sync.destinations``), each
described by its manifest (the source checkpoint and run it is a copy of, and the save it protects). The analysis
joins them to their source runs: a copy is what makes a run safe once it exists, so the recovery point, the finding
and the alerts resolve by themselves (analysis/copies.py).

Only manifests storwatch wrote count: owned by the agent's user (root) and writable by no one else, describing the copy
beside them (its inode, its top's type and mtime). The walk runs in a helper process with a deadline per root
(``_copies_worker.py``): a durable root on a hung NFS mount is reported stuck, never waited on.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from storwatch._copies_worker import OP, command
from storwatch.calls.blocking import BlockingCalls
from storwatch.checkpoints.manifest import FoundCopy
from storwatch.config import SyncConfig
from storwatch.paths import HostPaths
from storwatch.sources import Context, FactsKey, OnceLog

log = logging.getLogger(__name__)

MAX_DEPTH = 8
"""Directories below a durable root walked at most (the default template puts a copy four down)."""
MAX_ENTRIES = 100_000
MAX_SECONDS = 10.0
"""A walk stops itself after this; a root whose walk has not answered by the source's deadline is stuck."""
MAX_COPIES = 10_000
"""Copies kept per collection at most (the newest)."""


@dataclass(frozen=True)
class CopiesFacts:
    copies: tuple[FoundCopy, ...] = ()
    """Every verified copy found, newest first."""
    roots: tuple[str, ...] = ()
    """The durable roots walked, as this process reaches them."""
    stuck: tuple[str, ...] = ()
    """Roots whose walk did not answer in time (a hung mount): their copies are not known this time."""
    problems: tuple[str, ...] = ()
    """What stopped a walk early, or could not be read, one sentence each."""


COPIES: FactsKey[CopiesFacts] = FactsKey("copies")


class CopiesSource:
    name = "copies"

    def __init__(self, paths: HostPaths, section: SyncConfig, calls: BlockingCalls | None = None) -> None:
        self.paths = paths
        self._calls = calls
        self._bad = OnceLog(log)
        self.off_reason: str | None = None
        self.configure(section)

    def configure(self, section: SyncConfig) -> None:
        self.interval_seconds = section.copies_interval_seconds
        self.roots = tuple(dict.fromkeys(self.paths.root(r) for r in section.destinations))
        self.off_reason = None if self.roots else "no durable root to look in: sync.destinations is empty"

    @property
    def calls(self) -> BlockingCalls:
        if self._calls is None:
            self._calls = BlockingCalls(max_inflight=4, max_stuck=8, command=command())
        return self._calls

    def collect(self) -> CopiesFacts:
        if not self.roots:
            return CopiesFacts()
        params = (
            json.dumps(
                {"max_depth": MAX_DEPTH, "max_entries": MAX_ENTRIES, "max_seconds": MAX_SECONDS}, allow_nan=False
            )
            .encode("ascii")
            .hex()
        )
        outcomes = self.calls.call_many(OP, {r: [r, params] for r in self.roots}, timeout=MAX_SECONDS + 5.0)
        copies: list[FoundCopy] = []
        stuck: list[str] = []
        problems: list[str] = []
        for root, outcome in outcomes.items():
            if outcome.text is None:
                if outcome.stuck or outcome.in_flight_seconds:
                    stuck.append(root)
                else:
                    problems.append(f"{root}: {outcome.error or 'no answer'}")
                continue
            try:
                answer = json.loads(outcome.text)
                copies.extend(FoundCopy(**c) for c in answer["copies"])
                if answer.get("stopped"):
                    problems.append(str(answer["stopped"]))
            except (ValueError, TypeError, KeyError) as err:
                problems.append(f"{root}: the helper answered something unreadable: {err}")
        for p in problems:
            self._bad.warning(p, "durable copies: %s", p)
        copies.sort(key=lambda c: c.finished, reverse=True)
        if stuck and not copies and len(stuck) == len(self.roots):
            raise OSError(f"no durable root answered in time (a hung mount?): {', '.join(stuck)}")
        return CopiesFacts(tuple(copies[:MAX_COPIES]), self.roots, tuple(stuck), tuple(problems))

    def close(self) -> None:
        if self._calls is not None:
            self._calls.close()


def make(ctx: Context, section: SyncConfig) -> CopiesSource:
    return CopiesSource(ctx.paths, section)
