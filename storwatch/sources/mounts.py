"""The mount source: every mount in the host's mount table, with statvfs usage that never waits on a hung mount."""

from __future__ import annotations

import logging
import os

from storwatch.calls.blocking import BlockingCalls, Helper
from storwatch.config import MountsConfig
from storwatch.paths import HostPaths
from storwatch.printable import shown
from storwatch.procfs.mountinfo import MountInfo, parse_mountinfo
from storwatch.sources import FactsKey, OnceLog, read_first_named, require_parsed
from storwatch.sources.blockdev import BlockDevices
from storwatch.vocabulary import FsUsage, Mount, MountDevice

log = logging.getLogger(__name__)

# Kernel and virtual filesystems that hold no user data. tmpfs, overlay and FUSE are kept on purpose.
PSEUDO_FSTYPES = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "devpts", "devtmpfs", "mqueue",
    "hugetlbfs", "pstore", "bpf", "configfs", "fusectl", "binfmt_misc", "autofs", "rpc_pipefs", "nsfs",
    "efivarfs", "selinuxfs", "nfsd", "ramfs_internal", "sockfs", "pipefs", "anon_inodefs", "cpuset",
})  # fmt: skip

# statvfs(3) f_flag bit for a read-only filesystem (ST_RDONLY).
_ST_RDONLY = 1


def mount_of(
    info: MountInfo,
    readonly: bool | None = None,
    usage: FsUsage | None = None,
    stuck: bool = False,
    stuck_seconds: float = 0.0,
    usage_error: str | None = None,
    block: MountDevice | None = None,
) -> Mount:
    """A mountinfo line as a Mount, with what statvfs and the block device said of it (nothing, by default)."""
    return Mount(
        mount_id=info.mount_id,
        mountpoint=info.mountpoint,
        device=info.source,
        fstype=info.fstype,
        root=info.root,
        major=info.major,
        minor=info.minor,
        readonly=info.readonly if readonly is None else readonly,
        options=info.mount_options,
        super_options=info.super_options,
        usage=usage,
        stuck=stuck,
        stuck_seconds=stuck_seconds,
        usage_error=usage_error,
        block=block,
    )


class MountFacts(tuple[Mount, ...]):
    """The mounts of one collection, and what makes it a failure of the source: a mount left unmeasured because of
    a limit on the statvfs calls (a stuck mount is a fact about that mount, not a failure)."""

    failure: str | None

    def __new__(cls, mounts: tuple[Mount, ...] = (), failure: str | None = None) -> MountFacts:
        self = super().__new__(cls, mounts)
        self.failure = failure
        return self


MOUNTS: FactsKey[MountFacts] = FactsKey("mounts")
"""The mount source's facts in a Snapshot."""


class MountSource:
    name = "mounts"

    def __init__(
        self,
        paths: HostPaths,
        config: MountsConfig,
        calls: BlockingCalls | None = None,
        helper: Helper | None = None,
    ) -> None:
        """``helper``: the helper process the statvfs calls go to, shared with other sources' calls (None: one of
        this source's own)."""
        self.paths = paths
        self.configure(config)
        self.calls = (
            calls
            if calls is not None
            else BlockingCalls(config.max_inflight, max_stuck=config.max_stuck, helper=helper)
        )
        self._bad_lines = OnceLog(log)
        self.parse_errors = 0
        """Lines of the mount table that could not be parsed, counted at every read that holds them."""
        self._last_usage: dict[str, FsUsage] = {}
        self._last_table: tuple[bytes, list[MountInfo], int] | None = None
        """The mount table as last read, its visible mounts and its bad lines: it changes when pods come and go, not
        every read."""
        self.devices = BlockDevices(paths)

    first: frozenset[str] = frozenset()
    """Mountpoints (normalised, as the host names them) whose statvfs goes out before the others': `storwatch plan
    --mount`'s, so the mounts it is asked to measure are measured whatever hangs elsewhere in the table (with more
    hung mounts listed before them than the pool has working slots, one round would end before reaching them)."""

    def configure(self, config: MountsConfig) -> None:
        self.config = config
        self.interval_seconds = config.interval_seconds
        self.skip = PSEUDO_FSTYPES | set(config.exclude_fstypes)
        self._last_table = None  # read again with the new exclusions
        if hasattr(self, "calls"):
            self.calls.max_inflight = config.max_inflight
            self.calls.max_stuck = config.max_stuck

    def read_mountinfo(self) -> bytes:
        return self.read_mountinfo_named()[1]

    def read_mountinfo_named(self) -> tuple[str, bytes]:
        """The mount table's path and contents."""
        return read_first_named(self.paths.mountinfo_candidates(), "the mount table")

    def visible_mounts(self, data: bytes, path: str = "mountinfo") -> list[MountInfo]:
        """Parse, drop pseudo filesystems, and keep the top mount where several stack on one mountpoint. Bad lines
        are logged once and counted at every read; a table with no good line (empty, or all garbage) raises
        UnusableInput naming ``path``."""
        last = self._last_table
        if last is not None and data == last[0]:
            self.parse_errors += last[2]
            return last[1]
        infos, errors = parse_mountinfo(data)
        self.parse_errors += len(errors)
        for err in errors:
            self._bad_lines.warning(err.line, "mountinfo: skipping malformed %s", err)
        # Not cached: the same bad table read again raises again (and its lines are counted again above).
        require_parsed(path, "mount", len(infos), errors)
        by_point: dict[str, MountInfo] = {}
        for info in infos:
            # mountinfo lists mounts in mount order: a later one on the same point hides the earlier,
            # also when the later one is a pseudo filesystem (then nothing there is shown).
            by_point.pop(info.mountpoint, None)
            by_point[info.mountpoint] = info
        visible = [info for info in by_point.values() if info.fstype not in self.skip]
        self._last_table = (data, visible, len(errors))
        return visible

    def collect(self) -> tuple[Mount, ...]:
        """The mounts, as a MountFacts (its ``failure`` says when a mount was left unmeasured by a limit)."""
        path, data = self.read_mountinfo_named()
        infos = self.visible_mounts(data, path)
        if self.first:  # their calls go out before the others' (a fresh pool calls new keys in request order)
            infos = sorted(infos, key=lambda i: os.path.normpath(i.mountpoint) not in self.first)
        requests = {info.mountpoint: (self.paths.root(info.mountpoint),) for info in infos}
        outcomes = self.calls.call_many("statvfs", requests, self.config.statvfs_timeout_seconds)
        mounts = []
        usage_now: dict[str, FsUsage] = {}
        skipped = [(mp, o.error) for mp, o in outcomes.items() if o.skipped]
        for info in infos:
            outcome = outcomes.get(info.mountpoint)
            usage: FsUsage | None = None
            error: str | None = None
            readonly = info.readonly
            stuck = False
            stuck_seconds = 0.0
            if outcome is None:
                error = "no answer"
            elif outcome.values is not None:
                frsize, blocks, bfree, bavail, files, ffree, flag = (int(v) for v in outcome.values)
                usage = FsUsage(blocks * frsize, bfree * frsize, bavail * frsize, files, ffree)
                readonly = readonly or bool(flag & _ST_RDONLY)
            elif outcome.error is not None:
                error = outcome.error
            else:
                stuck = outcome.stuck
                stuck_seconds = outcome.in_flight_seconds
                error = "statvfs has not returned" if stuck else "statvfs in flight"
                # Still in flight but within its deadline (it started in an earlier round): keep the last answer.
                usage = None if stuck else self._last_usage.get(info.mountpoint)
            if usage is not None:
                usage_now[info.mountpoint] = usage
            block = (
                self.devices.for_mount(info.major, info.minor, info.source)
                if info.source.startswith("/dev/") or info.major != 0
                else None
            )
            mounts.append(mount_of(info, readonly, usage, stuck, stuck_seconds, error, block))
        self._last_usage = usage_now
        failure = None
        if skipped:
            mp, why = skipped[0]
            failure = f"{len(skipped)} mounts not measured this round ({display_path(mp)}: {why})"
        return MountFacts(tuple(mounts), failure)

    def close(self) -> None:
        self.calls.close()


def display_path(path: str) -> str:
    """A path fit for a label or a terminal: bytes that are not UTF-8 shown as \\xNN escapes (printable.shown)."""
    return shown(path)
