"""The incremental readers of /proc/<pid>/mountstats that the NFS source keeps from one read to the next, and their
caches; the parsers they call are pure and live in ``storwatch/procfs/mountstats.py``.

- :class:`MountStatsReader` reads the whole file again and again at a cost that follows what changed and what is
  looked at (the NFS source's tables for a scrape or the status page);
- :class:`OperationLines` finds the few per-op lines the source turns into deltas every second.

Both keep caches bounded by the mounts in the current file (:func:`device_line_bound`), so pod volumes that come and
go cannot make them grow.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import NamedTuple

from storwatch.procfs.mountstats import (
    NFS_FSTYPES,
    PER_OP_HEADER,
    DeviceLine,
    MountStatsError,
    NFSMount,
    NFSOperation,
    later_blocks,
    moved,
    next_block,
    op_line_at,
    parse_device_line,
    parse_mountstats,
    shown,
)


def device_line_bound(blocks: int) -> int:
    """How many parsed device lines a cache keeps for a file of ``blocks`` mounts before it starts again: a few
    more than the file has, so lines of unmounted mounts (pod volumes come and go) cannot pile up. A fixed bound of
    4,096 let the two caches grow by some 5 MB over 10,000 short-lived NFS mounts."""
    return 2 * blocks + 64


class MountStatsReader:
    """Reads /proc/<pid>/mountstats again and again, at a cost that follows what changed and what is looked at.

    The file is cut into one block per mount (at its ``device`` line). A block that is the same bytes as in the
    previous read gives back the same NFSMount object, so an idle mount costs a dictionary lookup and no delta. A
    changed NFS block costs its device line; its tables are parsed when first used (:class:`NFSMount`), and one
    procedure's line can be had without them (``operation("READ")``). Everything else (a file that does not start with
    a device line, a block with a bad device line, a non-NFS block with more than its device line, the truncated
    last line) is parsed at once, so its errors come back from :meth:`read`. Errors in a lazily parsed table go to
    ``report`` when it is parsed. The mounts and errors are those :func:`parse_mountstats` gives (tested).
    """

    def __init__(self, report: Callable[[list[MountStatsError]], None]) -> None:
        self.report = report
        self._known: dict[bytes, NFSMount] = {}
        self._heads: dict[bytes, DeviceLine] = {}
        self._head_bound = device_line_bound(0)
        self._ops: dict[str, tuple[dict[bytes, NFSOperation], dict[bytes, NFSOperation]]] = {}
        """By mountpoint: the per-op lines parsed (or found parsed) by its newest mount that looked at any, and those
        of the mount before. Most stand still from one read to the next (a busy mount moves a few of its procedures'
        counters, and NFSv4 has some sixty), so the lines a consumer looks at again are mostly lookups."""

    def parsed_op(self, mountpoint: str, line: bytes) -> NFSOperation | None:
        kept = self._ops.get(mountpoint)
        if kept is None:
            return None
        newest, before = kept
        op = newest.get(line)
        return op if op is not None else before.get(line)

    def remember_ops(self, mountpoint: str, parsed: dict[bytes, NFSOperation]) -> None:
        """``parsed`` is a mount's own record, which it goes on filling: the newest, the last one's kept beside it."""
        kept = self._ops.get(mountpoint)
        if kept is None:
            self._ops[mountpoint] = (parsed, {})
        elif kept[0] is not parsed:
            self._ops[mountpoint] = (parsed, kept[0])  # one assignment: consumers parse in their own threads

    def read(self, data: bytes) -> tuple[list[NFSMount], list[MountStatsError]]:
        mounts: list[NFSMount] = []
        errors: list[MountStatsError] = []
        known: dict[bytes, NFSMount] = {}
        truncated: MountStatsError | None = None
        cut = data.rfind(b"\n") + 1
        if cut < len(data):
            # The kernel ends every line with a newline: a last line without one was cut short by the reader.
            lineno = data.count(b"\n") + 1
            truncated = MountStatsError(lineno, "truncated: the last line has no newline", shown(data[cut:]))
            data = data[:cut]
        starts = [0, *later_blocks(data), len(data)]
        self._head_bound = device_line_bound(len(starts))
        lineno = 1
        for begin, end in itertools.pairwise(starts):
            block = data[begin:end]
            if not block:
                continue
            mount = self._known.get(block) or self._read_block(block, lineno, mounts, errors)
            if mount is not None:
                known[block] = mount
                mounts.append(mount)
            lineno += block.count(b"\n")
        self._known = known
        if len(self._ops) > len(mounts):  # unmounted since: what they left goes
            present = {m.mountpoint for m in mounts}
            self._ops = {mp: kept for mp, kept in self._ops.items() if mp in present}
        if truncated is not None:
            errors.append(truncated)
        return mounts, errors

    def _read_block(
        self, block: bytes, lineno: int, mounts: list[NFSMount], errors: list[MountStatsError]
    ) -> NFSMount | None:
        first_end = block.find(b"\n")
        first = block[:first_end]
        head = self._heads.get(first)  # a busy mount's device line is the same every read
        if head is None and block.startswith((b"device ", b"no device ")):
            try:
                head = parse_device_line(first, lineno)
            except MountStatsError:
                head = None
            else:
                if len(self._heads) >= self._head_bound:
                    self._heads.clear()
                self._heads[first] = head
        if head is not None and head.fstype in NFS_FSTYPES:
            return NFSMount.from_block(head, block, lineno, self)
        if head is not None and first_end == len(block) - 1:
            return None  # another filesystem's one-line block
        # Anything unusual: parse it now, so its errors come back with this read.
        parsed, found = parse_mountstats(block)
        mounts.extend(parsed)
        errors.extend(moved(e, lineno) for e in found)
        return None


class OperationLines:
    """Finds the per-op lines of a few procedures (``READ``, ``WRITE``, ``COMMIT``) of every NFS mount in a whole
    /proc/<pid>/mountstats, for a reader that needs only those every second. The device lines are found with
    bytes.find, each NFS mount's procedures are looked for in its own per-op section only, and nothing else in the
    file is looked at: on a node with 64 busy NFS mounts this costs a third of cutting the file into blocks.

    A line counts only when a newline ends it (a last line cut short is not trusted) and when its mount's device
    line says nfs or nfs4; a mount whose device line is malformed is passed over (:class:`MountStatsReader` reports
    it). The lines are returned as they are, for the caller to parse (:func:`parse_operation_line`).
    """

    def __init__(self, names: tuple[str, ...]) -> None:
        # The kernel pads names to 12 columns ("\t%12s: "): a short name follows a space, a long one the tab.
        self._keys = [(name, os.fsencode(name) + b": ") for name in names]
        self._heads: dict[bytes, DeviceLine | None] = {}
        self._head_bound = device_line_bound(0)
        self.device_lines = 0
        """How many ``device`` lines (good or bad) the last :meth:`find` saw: 0 means the data is no mountstats."""
        self.bad_device_lines = 0
        """How many of them did not parse."""

    def find(self, data: bytes) -> list[tuple[str, str, bytes, int]]:
        """(mountpoint, procedure, line, offset of the line in ``data``) for every line found, in file order."""
        return list(zip(*self.columns(data), strict=True))

    def columns(self, data: bytes) -> FoundLines:
        """What :meth:`find` finds, as columns: item i of each list is one line's."""
        found = FoundLines([], [], [], [])
        blocks = bad = 0
        size = len(data)
        begin = 0 if data.startswith((b"device ", b"no device ")) else next_block(data, 1)
        while begin >= 0:
            blocks += 1
            newline = data.find(b"\n", begin)
            if newline < 0:  # cut short: the last line, and no block after it
                bad += 1
                break
            # The next block, and this one's per-op section, are looked for in a way that goes through the file about
            # once: a block of another filesystem is one line, and an NFS mount's per-op lines, most of the file, hold
            # no lowercase letter, so the first "d" after its section's header is where the next block's line says
            # "device", which is then checked as any other place is.
            end = newline + 1 if data.startswith((b"device ", b"no device "), newline + 1) else -1
            head = self._head(data[begin:newline])
            if head is None:
                bad += 1
            if head is None or head.fstype not in NFS_FSTYPES:
                begin = end if end >= 0 else next_block(data, newline + 1)
                continue
            # Without a per-op header (damaged), the lines may still be there: parse_mountstats reads them.
            section = begin
            if end < 0:
                header = data.find(PER_OP_HEADER, begin)
                end = next_block(data, newline + 1, header) if header >= 0 else next_block(data, newline + 1)
                if header >= 0 and end < 0:  # the header is this block's
                    section = after = header + len(PER_OP_HEADER)
                    d = data.find(b"d", after)
                    end = next_block(data, max(after, d - 3)) if d >= 0 else -1
            stop = end if end >= 0 else size
            for name, key in self._keys:
                at = op_line_at(data, key, section, stop)
                if at is not None:
                    found.mountpoints.append(head.mountpoint)
                    found.names.append(name)
                    found.lines.append(data[at[0] : at[1]])
                    found.offsets.append(at[0])
            begin = end
        self.device_lines, self.bad_device_lines = blocks, bad
        self._head_bound = device_line_bound(blocks)
        return found

    def _head(self, first: bytes) -> DeviceLine | None:
        """A block's device line, parsed; None when it does not parse."""
        heads = self._heads
        if first in heads:
            return heads[first]
        if len(heads) >= self._head_bound:
            heads.clear()
        try:
            head: DeviceLine | None = parse_device_line(first, 1)
        except MountStatsError:
            head = None
        heads[first] = head
        return head


class FoundLines(NamedTuple):
    """The per-op lines :class:`OperationLines` found, as columns (item i of each is one line's), in file order."""

    mountpoints: list[str]
    names: list[str]
    lines: list[bytes]
    """Each line as it is in the file, without its newline."""
    offsets: list[int]
    """Where each line starts in the file."""
