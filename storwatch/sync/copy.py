"""One verified copy of a checkpoint (a file or a directory), from the source's listing to the commit.

DEST is the copy's own final path: when it does not exist this is what ``cp -r SRC DEST`` makes. The source is read
once, each chunk hashed as it is read; the copy is written under a temporary name in DEST's directory, read back past
the page cache and compared (:mod:`.pipeline`). Files are fsynced, every file before its verdict, and the copy is
never put in place before every file is verified. Completeness markers (:data:`MARKERS`) are written after every
other file is verified and fsynced. Then the directories are fsynced, the manifest written (every entry with its
size, mode, times and hash; the source, its run, when), and the copy and its manifest put in place
(:mod:`.commit`, whose crash table says what a copy killed at each point leaves and what the next one does).

The copy aborts, and nothing appears at DEST, when the source changes while it is read (a file's size, mtime, ctime or
inode before and after it is read, and the whole tree listed again at the end), when DEST's filesystem lacks the space
(checked before anything is written), on an I/O error or a read-back that differs, or when ``stop()`` says so. It is
refused when DEST is inside the source, when DEST holds anything but a copy of ours, or a copy of ours of another run
(two sources never share one destination). A DEST that already holds our copy of the source as it is now is left
alone (``unchanged``); our copy of an older state of the same run is replaced. Keep-N retention (``keep``) then
removes the oldest verified copies of ours in DEST's directory beyond N, never anything else.

As root, safely: with ``root`` (an allowlisted root), every directory from the root down to the copy is opened with
``O_NOFOLLOW`` from the one above (:mod:`storwatch.nofollow`; made where missing, no more open than the source's path,
:mod:`.access`); with ``source_root``, the source is reached the same way. The source's own top must not be a
symlink; inside it, links are judged as the kernel would resolve them (:mod:`.tree`). Copies keep each entry's mode
(without set-user-ID and set-group-ID bits; the top's no more open than the source's path) and times, and, when
running as root, its owner and group (``CAP_CHOWN``; reading another user's files takes ``CAP_DAC_READ_SEARCH``; the
mode and times are set before the owner changes, so ``CAP_FOWNER`` is not needed). Not root, the owner is skipped
and the manifest says so; a filesystem that refuses the owner (NFS with root_squash) gives a note, not a failure.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

from storwatch.checkpoints.manifest import (
    MANIFEST_SUFFIX,
    MANIFEST_VERSION,
    identity,
    is_ours,
    manifest_run,
    ours,
    temp_name,
)
from storwatch.nofollow import DIR_FLAGS, NotFollowed, file_kind, open_below
from storwatch.sync.access import source_reach
from storwatch.sync.commit import commit, dir_lock, point, recover, retain, write_manifest
from storwatch.sync.pipeline import FileJob, Pipeline, read_full
from storwatch.sync.result import HASH_NAME, OK_OUTCOMES, Abort, SyncRefused, SyncResult
from storwatch.sync.tree import MAX_DEPTH, Dirs, Entry, check_links, kind_of, remove_tree, walk

MARKERS = frozenset(
    {
        ".metadata",  # torch.distributed.checkpoint
        ".snapshot_metadata",  # torchsnapshot
        "commit_success.txt",  # Orbax on object stores
        "_CHECKPOINT_METADATA",  # Orbax
        "latest_checkpointed_iteration.txt",  # Megatron-LM
        "latest",  # DeepSpeed
        "latest_universal",  # DeepSpeed universal checkpoints
    }
)
"""Files whose presence says a checkpoint (or a run's newest one) is complete: written after every other file."""

_O_NOATIME = getattr(os, "O_NOATIME", 0)


def _reaches(fd: int, target: tuple[int, int]) -> bool:
    """Whether the directory ``fd`` is ``target`` (device, inode) or below it: its parents followed up to the root."""
    here = os.dup(fd)
    try:
        for _ in range(MAX_DEPTH * 64):
            st = os.fstat(here)
            if (st.st_dev, st.st_ino) == target:
                return True
            up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=here)
            ust = os.fstat(up)
            os.close(here)
            here = up
            if (ust.st_dev, ust.st_ino) == (st.st_dev, st.st_ino):
                return False  # the root of this process's tree
        return False
    finally:
        os.close(here)


def _open_below(
    root: str, rel: str, *, make_mode: int | None = None, made: Callable[[int, int], None] | None = None
) -> int:
    """A descriptor of the directory ``root/rel``, every component below ``root`` opened without following a link."""
    try:
        return open_below(root, [p for p in rel.split("/") if p], make_mode=make_mode, made=made)
    except NotFollowed as err:
        raise SyncRefused(str(err)) from None


class _Copy:
    """One copy, from the source's listing to the manifest; :func:`copy_verified` is its only user."""

    def __init__(
        self,
        src: str,
        dest: str,
        root: str | None,
        source_root: str | None,
        run: str | None,
        access_root: str | None,
        bandwidth: float | None,
        keep: int,
        progress: Callable[[int, int], None] | None,
        stop: Callable[[], bool],
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.src = src
        self.dest = dest
        self.root = root
        self.source_root = source_root
        self.source_run = run if run is not None else os.path.dirname(src)
        self.reach = source_reach(src, access_root)
        self.bandwidth = bandwidth if bandwidth and bandwidth > 0 else None
        self.keep = keep
        self.progress = progress
        self.stop = stop
        self.clock = clock
        self.sleep = sleep
        self.started_wall = time.time()
        self.t0 = clock()
        self.notes: list[str] = []
        self.keep_owner = os.geteuid() == 0
        self.owner_failed = False
        self.name = os.path.basename(dest)
        self.parent_shown = os.path.dirname(dest)
        self.token = secrets.token_hex(8)
        self.tmp = temp_name(self.name, self.token, "tmp")
        self.tmp_manifest = temp_name(self.name, self.token, "manifest")
        self.read_bytes = 0

    def result(self, outcome: str, error: str | None, entries: Sequence[Entry] = (), **kw: Any) -> SyncResult:
        files = [e for e in entries if e.kind == "file"]
        return SyncResult(
            ok=outcome in OK_OUTCOMES,
            source=self.src,
            dest=self.dest,
            bytes=sum(e.st.st_size for e in files),
            files=len(files),
            seconds=self.clock() - self.t0,
            error=error,
            manifest=kw.pop("manifest", None),
            outcome=outcome,
            notes=tuple(self.notes),
            started=self.started_wall,
            **kw,
        )

    # -- the source

    def open_source(self) -> tuple[int, Entry]:
        """A descriptor of the source's directory and the source's top entry (never a symlink)."""
        parent, base = os.path.split(self.src)
        if not base:
            raise SyncRefused(f"{self.src!r} names no file or directory")
        if self.source_root is not None:
            rel = os.path.relpath(parent, self.source_root)
            if rel == ".." or rel.startswith("../") or os.path.isabs(rel):
                raise SyncRefused(f"{self.src!r} is not below its source root {self.source_root!r}")
            parent_fd = _open_below(self.source_root, "" if rel == "." else rel)
        else:
            parent_fd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.stat(base, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.close(parent_fd)
            raise SyncRefused(f"{self.src!r}: no such file or directory") from None
        kind = kind_of(st.st_mode)
        if kind in (None, "link"):
            os.close(parent_fd)
            raise SyncRefused(f"{self.src!r} is {file_kind(st.st_mode)}: name a checkpoint file or directory itself")
        return parent_fd, Entry((), kind, st)

    def list_source(self, parent_fd: int, top: Entry) -> tuple[list[Entry], int | None]:
        """The source's entries, and a descriptor of its top when it is a directory."""
        if top.kind == "file":
            return [top], None
        fd = os.open(os.path.basename(self.src), DIR_FLAGS, dir_fd=parent_fd)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (top.st.st_dev, top.st.st_ino):
                raise Abort("source_changed", f"{self.src} was replaced while it was opened")
            entries = walk(fd, top, self.src)
            check_links(entries, self.src)
        except BaseException:
            os.close(fd)
            raise
        return entries, fd

    # -- the destination

    def open_dest_dir(self) -> int:
        if not self.name or self.name in (".", ".."):
            raise SyncRefused(f"{self.dest!r} names no file or directory to make")
        if is_ours(self.name):
            raise SyncRefused(f"{self.dest!r} could be taken for storwatch's own temporaries or manifests")
        if self.dest == self.src or self.dest.startswith(self.src.rstrip("/") + "/"):
            raise SyncRefused(f"{self.dest!r} is inside the source {self.src!r}: a copy would copy itself")
        if self.root is not None:
            rel = os.path.relpath(self.parent_shown, self.root)
            if rel == ".." or rel.startswith("../") or os.path.isabs(rel) or self.dest == self.root:
                raise SyncRefused(f"{self.dest!r} is not below the sync destination {self.root!r}")
            mode = self.reach.dir_mode

            def made(parent: int, fd: int) -> None:
                os.fchmod(fd, mode)  # exactly: mkdir's mode is less the umask
                os.fsync(parent)

            return _open_below(self.root, "" if rel == "." else rel, make_mode=mode, made=made)
        try:
            return os.open(self.parent_shown or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SyncRefused(f"{self.parent_shown!r}: no such directory (DEST's directory must exist)") from None
        except NotADirectoryError:
            raise SyncRefused(f"{self.parent_shown!r} is not a directory") from None

    # -- the copy

    def nested(self, dest_dir: int, src_parent: int, top: Entry) -> None:
        """Refuse a DEST that is the source, lies inside it (the copy's own temporary would be part of what it
        copies) or holds it (replacing an earlier copy there would remove the source), by identity (device and
        inode), whatever path reached either: no link, ``..`` or bind mount hides it."""
        src_id = (top.st.st_dev, top.st.st_ino)
        try:
            there = os.stat(self.name, dir_fd=dest_dir, follow_symlinks=False)
        except FileNotFoundError:
            there = None
        if there is not None and (there.st_dev, there.st_ino) == src_id:
            raise SyncRefused(f"{self.dest!r} is the source {self.src!r} itself")
        if top.kind == "dir" and _reaches(dest_dir, src_id):
            raise SyncRefused(f"{self.dest!r} is inside the source {self.src!r}: a copy would copy itself")
        if there is not None and stat.S_ISDIR(there.st_mode) and _reaches(src_parent, (there.st_dev, there.st_ino)):
            raise SyncRefused(
                f"the source {self.src!r} is inside {self.dest!r}: replacing what is there would remove the source"
            )

    def run(self) -> SyncResult:
        src_parent, top = self.open_source()
        src_top: int | None = None
        try:
            entries, src_top = self.list_source(src_parent, top)
            dest_dir = self.open_dest_dir()
            try:
                self.nested(dest_dir, src_parent, top)
                with dir_lock(dest_dir, self.stop):
                    return self.into(dest_dir, src_parent, src_top, entries)
            finally:
                os.close(dest_dir)
        finally:
            if src_top is not None:
                os.close(src_top)
            os.close(src_parent)

    def into(self, dest_dir: int, src_parent: int, src_top: int | None, entries: list[Entry]) -> SyncResult:
        problems: list[str] = []
        recover(dest_dir, problems)
        self.notes += [f"a leftover of an earlier copy could not be removed: {p}" for p in problems]
        state = [identity(self.manifest_entry(e)) for e in entries]
        replacing = False
        try:
            there = os.stat(self.name, dir_fd=dest_dir, follow_symlinks=False)
        except FileNotFoundError:
            there = None
        if there is not None:
            manifest = ours(dest_dir, self.name)
            if manifest is None:
                raise SyncRefused(
                    f"{self.dest} exists and is not a copy storwatch made (no manifest of ours describes it): "
                    "left as it is"
                )
            theirs = manifest_run(manifest)
            if theirs != self.source_run:
                # Two sources, one destination: the later copy never replaces the other's verified copy.
                raise SyncRefused(
                    f"{self.dest} holds the verified copy of another run ({theirs!r}, not {self.source_run!r}): "
                    "two runs map to this destination; left as it is"
                )
            recorded = [identity(e) for e in manifest["entries"] if isinstance(e, dict)]
            if recorded == state and manifest.get("source") == self.src:
                removed = self.retain(dest_dir)
                return self.result(
                    "unchanged",
                    None,
                    entries,
                    manifest=self.dest + MANIFEST_SUFFIX,
                    removed=tuple(removed),
                )
            replacing = True
        total = sum(e.st.st_size for e in entries if e.kind == "file")
        vfs = os.fstatvfs(dest_dir)
        free = vfs.f_bavail * vfs.f_frsize
        needed = total + 4096 * len(entries)
        if needed > free:
            raise Abort(
                "no_space",
                f"{self.parent_shown} has {free} bytes free for unprivileged use; the copy needs {needed}: nothing "
                "was written",
            )
        try:
            self.write_all(dest_dir, src_parent, src_top, entries, total)
            self.check_source_again(src_parent, src_top, entries)
            point("verified")
            tmp_ino = os.stat(self.tmp, dir_fd=dest_dir, follow_symlinks=False).st_ino
            self.write_manifest(dest_dir, entries, tmp_ino, time.time())
        except BaseException:
            for name in (self.tmp, self.tmp_manifest):
                with contextlib.suppress(OSError):
                    remove_tree(dest_dir, name)
            raise
        # From here what is left on a failure is the next copy's to make good (the crash table), never removed here.
        commit(dest_dir, self.name, self.token, replacing, self.dest)
        removed = self.retain(dest_dir)
        return self.result(
            "verified",
            None,
            entries,
            manifest=self.dest + MANIFEST_SUFFIX,
            written_bytes=total,
            removed=tuple(removed),
        )

    def retain(self, dest_dir: int) -> list[str]:
        try:
            return retain(dest_dir, self.keep, self.name, self.parent_shown)
        except OSError as err:
            self.notes.append(f"keep-{self.keep} retention stopped: {err.strerror or err} ({err.filename})")
            return []

    @staticmethod
    def manifest_entry(e: Entry) -> dict[str, Any]:
        st = e.st
        out: dict[str, Any] = {"path": e.path, "type": e.kind, "mtime_ns": st.st_mtime_ns}
        if e.kind == "file":
            out["size"] = st.st_size
        if e.kind == "link":
            out["target"] = e.target
        out.update(mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid)
        if e.kind == "file":
            out[HASH_NAME] = e.digest
        return out

    def write_all(self, dest_dir: int, src_parent: int, src_top: int | None, entries: list[Entry], total: int) -> None:
        is_dir = entries[0].kind == "dir"
        tmp_top: int | None = None
        if is_dir:
            os.mkdir(self.tmp, 0o700, dir_fd=dest_dir)
            tmp_top = os.open(self.tmp, DIR_FLAGS, dir_fd=dest_dir)
        try:
            self.write_files(dest_dir, src_parent, src_top, tmp_top, entries, total)
            self.apply_dir_meta(dest_dir, tmp_top, entries)
        finally:
            if tmp_top is not None:
                os.close(tmp_top)

    def write_files(
        self,
        dest_dir: int,
        src_parent: int,
        src_top: int | None,
        tmp_top: int | None,
        entries: list[Entry],
        total: int,
    ) -> None:
        expect = {e.rel: e.st for e in entries if e.kind == "dir"}
        src_dirs = Dirs(src_top, expect) if src_top is not None else None
        dest_dirs = Dirs(tmp_top) if tmp_top is not None else None
        pipeline = Pipeline()
        jobs: list[FileJob] = []
        started = self.clock()
        try:

            def dest_place(rel: tuple[str, ...]) -> tuple[int, str]:
                if not rel:
                    return dest_dir, self.tmp
                assert dest_dirs is not None
                return dest_dirs.fd(rel[:-1]), rel[-1]

            def src_place(rel: tuple[str, ...]) -> tuple[int, str]:
                if not rel:
                    return src_parent, os.path.basename(self.src)
                assert src_dirs is not None
                return src_dirs.fd(rel[:-1]), rel[-1]

            later = []
            for e in entries:
                if not e.rel and e.kind == "dir":
                    continue
                if e.kind == "dir":
                    fd, name = dest_place(e.rel)
                    os.mkdir(name, 0o700, dir_fd=fd)
                elif e.kind == "link":
                    fd, name = dest_place(e.rel)
                    assert e.target is not None
                    os.symlink(e.target, name, dir_fd=fd)
                elif e.rel and e.rel[-1] in MARKERS:
                    later.append(e)
                else:
                    self.copy_file(e, src_place, dest_place, pipeline, total, started, jobs)
            for e in later:
                # Markers only once every other file is written, read back and fsynced: a reader that trusts a
                # marker never meets a file still being written, even inside the temporary.
                self.wait_jobs(jobs, pipeline)
                self.copy_file(e, src_place, dest_place, pipeline, total, started, jobs)
            pipeline.finish(self.stop)
            self.wait_jobs(jobs, pipeline)
        finally:
            pipeline.shutdown()  # before any descriptor it writes is closed (a number closed could be reused)
            for job in jobs:
                for fd in (job.fd, job.verify_fd):
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if src_dirs is not None:
                src_dirs.close()
            if dest_dirs is not None:
                dest_dirs.close()

    def wait_jobs(self, jobs: Sequence[FileJob], pipeline: Pipeline) -> None:
        for job in jobs:
            while not job.done.wait(0.1):
                pipeline.check()
                if self.stop():
                    raise Abort("stopped", "stopped before the copy was complete")
            pipeline.check()

    def copy_file(
        self,
        e: Entry,
        src_place: Callable[[tuple[str, ...]], tuple[int, str]],
        dest_place: Callable[[tuple[str, ...]], tuple[int, str]],
        pipeline: Pipeline,
        total: int,
        started: float,
        jobs: list[FileJob],
    ) -> None:
        sfd, sname = src_place(e.rel)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            src = os.open(sname, flags | _O_NOATIME, dir_fd=sfd)
        except PermissionError:
            src = os.open(sname, flags, dir_fd=sfd)  # O_NOATIME needs the file's owner (or CAP_FOWNER)
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ELOOP):
                raise Abort("source_changed", f"{e.path} went away or was replaced during the copy") from None
            raise
        try:
            before = os.fstat(src)
            self.same(e, before)
            dfd, dname = dest_place(e.rel)
            out = os.open(dname, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            try:
                vfd = os.open(dname, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                vst, ost = os.fstat(vfd), os.fstat(out)
                if (vst.st_dev, vst.st_ino) != (ost.st_dev, ost.st_ino):
                    os.close(vfd)
                    raise Abort("failed", f"{e.path}: the copy was replaced while it was opened")
            except BaseException:
                os.close(out)
                raise
            job = FileJob(e, out, vfd, e.st.st_size)
            jobs.append(job)  # its descriptors closed with the others, once no thread of the pipeline touches them
            with contextlib.suppress(OSError):
                os.posix_fadvise(src, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            hasher = xxhash.xxh3_128()
            view = memoryview(pipeline.buf)
            try:
                offset = 0
                while True:
                    if self.stop():
                        raise Abort("stopped", "stopped before the copy was complete")
                    pipeline.check()
                    n = read_full(src, view)
                    if n == 0:
                        break
                    if offset + n > job.size:
                        raise Abort("source_changed", f"{e.path} grew during the copy")
                    hasher.update(view[:n])
                    written = 0
                    while written < n:
                        written += os.pwrite(out, view[written:n], offset + written)
                    pipeline.written(job, offset, n, self.stop)
                    point("writing")
                    offset += n
                    self.read_bytes += n
                    if self.progress is not None:
                        self.progress(self.read_bytes, total)
                    self.throttle(started)
            finally:
                view.release()
            after = os.fstat(src)
            if offset != job.size:
                raise Abort("source_changed", f"{e.path} shrank during the copy ({offset} of {job.size} bytes)")
            self.same(e, after)
            job.expected = hasher.hexdigest()
            self.apply_file_meta(job)
            pipeline.close_file(job, self.stop)
        finally:
            os.close(src)

    def same(self, e: Entry, st: os.stat_result) -> None:
        listed = e.st
        if (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino) or not stat.S_ISREG(st.st_mode):
            raise Abort("source_changed", f"{e.path} was replaced during the copy")
        if (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != (listed.st_size, listed.st_mtime_ns, listed.st_ctime_ns):
            raise Abort("source_changed", f"{e.path} changed during the copy (size, mtime or ctime)")

    def throttle(self, started: float) -> None:
        if self.bandwidth is None:
            return
        due = started + self.read_bytes / self.bandwidth
        while True:
            left = due - self.clock()
            if left <= 0:
                return
            if self.stop():
                raise Abort("stopped", "stopped before the copy was complete")
            self.sleep(min(left, 0.1))

    def mode(self, e: Entry) -> int:
        """The mode an entry of the copy gets: its own (never set-user-ID or set-group-ID); the top's, no class's
        bits that the source's path kept out (:mod:`.access`)."""
        if not e.rel:
            return self.reach.top_mode(e.st.st_mode)
        return stat.S_IMODE(e.st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)

    def apply_file_meta(self, job: FileJob) -> None:
        st = job.entry.st
        os.fchmod(job.fd, self.mode(job.entry))
        os.utime(job.fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        if self.keep_owner:
            self.chown(os.fchown, job.fd, st.st_uid, st.st_gid)

    def chown(self, call: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            call(*args, **kwargs)
        except PermissionError as err:
            if not self.owner_failed:
                self.owner_failed = True
                self.notes.append(f"the owner was not kept: the destination refused it ({err.strerror})")

    def apply_dir_meta(self, dest_dir: int, tmp_top: int | None, entries: Sequence[Entry]) -> None:
        """Links' and directories' times and owners, and directories' modes, deepest first (a directory's mode and
        times last, after what is made in it); then every directory fsynced."""
        if tmp_top is None:
            os.fsync(dest_dir)
            return
        dirs = Dirs(tmp_top)
        try:
            for e in sorted(entries, key=lambda e: len(e.rel), reverse=True):
                if e.kind == "file":
                    continue
                st = e.st
                fd, name = (dirs.fd(e.rel[:-1]), e.rel[-1]) if e.rel else (dest_dir, self.tmp)
                if e.kind == "link":
                    os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=fd, follow_symlinks=False)
                    if self.keep_owner:
                        self.chown(os.chown, name, st.st_uid, st.st_gid, dir_fd=fd, follow_symlinks=False)
                    continue
                dfd = tmp_top if not e.rel else os.open(name, DIR_FLAGS, dir_fd=fd)
                try:
                    os.fsync(dfd)
                    os.fchmod(dfd, self.mode(e))
                    os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))
                    if self.keep_owner:
                        self.chown(os.fchown, dfd, st.st_uid, st.st_gid)
                    os.fsync(dfd)
                finally:
                    if dfd != tmp_top:
                        os.close(dfd)
        finally:
            dirs.close()
        if not self.keep_owner and "owner" not in " ".join(self.notes):
            self.notes.append("the owner was not kept: not running as root (CAP_CHOWN)")

    def check_source_again(self, src_parent: int, src_top: int | None, entries: list[Entry]) -> None:
        """The whole source listed again: any entry added, gone or changed since the first listing aborts."""
        st = os.stat(os.path.basename(self.src), dir_fd=src_parent, follow_symlinks=False)
        top = Entry((), entries[0].kind, st)
        again = [top] if src_top is None else walk(src_top, top, self.src)
        if [e.state() for e in again] != [e.state() for e in entries]:
            raise Abort(
                "source_changed",
                f"{self.src} changed during the copy (an entry was added, removed or "
                "changed): nothing was put in place",
            )

    def write_manifest(self, dest_dir: int, entries: Sequence[Entry], inode: int, finished: float) -> None:
        manifest = {
            "storwatch_sync": MANIFEST_VERSION,
            "source": self.src,
            "run": self.source_run,
            "source_mtime": max(e.st.st_mtime_ns for e in entries) / 1e9,
            "dest": self.dest,
            "inode": inode,
            "hash": HASH_NAME,
            "started": self.started_wall,
            "finished": finished,
            "seconds": self.clock() - self.t0,
            "bytes": sum(e.st.st_size for e in entries if e.kind == "file"),
            "files": sum(1 for e in entries if e.kind == "file"),
            "owner_kept": self.keep_owner and not self.owner_failed,
            "host": os.uname().nodename,
            "entries": [self.manifest_entry(e) for e in entries],
        }
        # ASCII (names that are not UTF-8 as \udcXX escapes, which json reads back as the same names).
        data = json.dumps(manifest, indent=1, allow_nan=False).encode("ascii")
        top = entries[0]
        write_manifest(dest_dir, self.tmp_manifest, data, self.reach.manifest_mode(self.mode(top), top.kind == "dir"))


def copy_verified(
    src: str,
    dest: str,
    *,
    bandwidth: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    stop: Callable[[], bool] | None = None,
    root: str | None = None,
    source_root: str | None = None,
    run: str | None = None,
    access_root: str | None = None,
    keep: int = 0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> SyncResult:
    """Copy ``src`` (a file or a directory) to ``dest``, its final path, verified (see the module's docstring).

    ``bandwidth``: bytes per second read, at most (None or 0: unlimited). ``progress(done, total)``: bytes read so
    far, after each chunk, on the copying thread. ``stop()``: asked after each chunk; True aborts (``stopped``).
    ``root``: the allowlisted root ``dest`` lies below (every directory from it down opened with O_NOFOLLOW, made
    where missing); without it ``dest``'s directory must exist and is opened as named, as ``cp`` would.
    ``source_root``: a trusted directory above ``src``, opened the same way down to it. ``run``: the run the source
    belongs to (default: the directory holding it), recorded in the manifest; a DEST holding another run's copy is
    refused, never replaced. ``access_root``: where the source's path starts for who may read it (default ``/``; a
    pod volume's directory), :mod:`.access`. ``keep``: verified copies
    of ours kept in ``dest``'s directory (0: all). ``clock`` and ``sleep`` pace the bandwidth limit. Never raises
    for a copy that could not be made: the result says how it ended (``outcome``, ``error``)."""
    src = os.path.abspath(src)
    dest = os.path.abspath(dest)
    copy = _Copy(
        src, dest, root, source_root, run, access_root, bandwidth, keep, progress, stop or (lambda: False), clock, sleep
    )
    try:
        return copy.run()
    except SyncRefused as err:
        return copy.result("refused", str(err))
    except Abort as err:
        return copy.result(err.outcome, str(err))
    except OSError as err:
        where = f" ({err.filename})" if err.filename else ""
        if err.errno == errno.ENOSPC:
            return copy.result("no_space", f"the destination ran out of space{where}: nothing was put in place")
        return copy.result("failed", f"{err.strerror or err}{where}")
