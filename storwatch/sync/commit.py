"""The commit: how a verified copy is put in place beside its manifest, and what the next copy into the same directory
does with whatever a copy killed at any point left there. The crash table (:data:`CRASH_TABLE`) lists every point a
copy can die, what the next copy finds and what it does; ``tests/test_sync_crash.py`` kills a copy at each row.

Names, beside DEST (``NAME``): ``NAME.storwatch-sync.json`` (M, the manifest of the copy at NAME), and the copy's
own ``.NAME.storwatch-sync-TOKEN.{tmp,manifest,old,gone}`` (T the copy being made, TM its manifest, A the earlier copy
moved aside, G a copy retention removes). TM is written only once T is complete: every file read back identical and
fsynced, every directory fsynced. So a TM that parses and describes T (its inode, its top's type and mtime) proves T
a complete, verified copy, and an M that describes NAME proves NAME one.

The rule of the next copy (:func:`recover`), before it removes anything: a DEST that is absent is given back a
verified copy where one is left (the newest complete T, else the earlier copy A that M describes); a DEST that is
present gets the manifest a TM describing it holds. Only then is the rest removed. So DEST is always absent (never
copied), the earlier verified copy, or the new one, and a crash never loses the last good copy, even where the
source is gone by then (a pod deleted).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from storwatch.checkpoints.manifest import MANIFEST_SUFFIX, TEMP_NAME, describes, ours, read_manifest, temp_name
from storwatch.sync.pipeline import libc_function
from storwatch.sync.result import Abort, SyncRefused
from storwatch.sync.tree import remove_tree

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


@dataclass(frozen=True)
class Crash:
    """One point a copy can die at."""

    point: str
    found: str
    """What the next copy into the directory finds there."""
    does: str
    """What it does, before anything else."""


CRASH_TABLE: tuple[Crash, ...] = (
    Crash(
        "writing",
        "DEST as it was (absent, or the earlier verified copy with M); T partly written; no TM",
        "removes T; DEST stays as it was",
    ),
    Crash(
        "verified",
        "DEST as it was; T complete and verified; no TM (or one cut short, which does not parse)",
        "removes T (and a TM that does not describe it): without TM nothing proves T complete",
    ),
    Crash(
        "manifest_written",
        "DEST as it was; T complete; TM describing T",
        "DEST absent: puts T in place as DEST and TM as M (the new copy committed); DEST present: removes T and TM",
    ),
    Crash(
        "renamed",
        "a first copy: DEST is the new copy; TM describing it; no M",
        "puts TM in place as M",
    ),
    Crash(
        "exchanged",
        "a copy replacing one (RENAME_EXCHANGE): DEST is the new copy, T the earlier one; TM describing DEST; M the "
        "earlier copy's manifest",
        "puts TM in place as M, then removes T",
    ),
    Crash(
        "moved_aside",
        "a copy replacing one without RENAME_EXCHANGE (NFS, FUSE): DEST absent; A the earlier copy, M describing it; "
        "T complete with TM describing it",
        "puts T in place as DEST and TM as M, then removes A (were T not complete: puts A back as DEST)",
    ),
    Crash(
        "renamed_over",
        "without RENAME_EXCHANGE: DEST is the new copy; A the earlier one; TM describing DEST; M the earlier copy's",
        "puts TM in place as M, then removes A",
    ),
    Crash(
        "manifest_in_place",
        "DEST the new copy with its M; the earlier copy still at T (exchanged) or A (moved aside)",
        "removes T or A",
    ),
    Crash(
        "retained_aside",
        "keep-N retention: a copy it removes moved to G; its M still there",
        "removes G, and M (whose copy is gone); never puts G back",
    ),
)
"""Every point a copy can die at, in the order a copy passes them."""
POINTS = frozenset(c.point for c in CRASH_TABLE)

kill_at: str | None = None
"""A point of :data:`CRASH_TABLE` at which this process kills itself with SIGKILL: for the test that walks the table
with real kills (set in the copy's own process, never by the agent)."""


def point(name: str) -> None:
    """The copy has reached ``name`` of the crash table."""
    assert name in POINTS, name
    if kill_at == name:
        os.kill(os.getpid(), signal.SIGKILL)


_renameat2_call = libc_function("renameat2")


def renameat2(dir_fd: int, old: str, new: str, flags: int) -> None:
    if _renameat2_call is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if _renameat2_call(dir_fd, os.fsencode(old), dir_fd, os.fsencode(new), ctypes.c_uint(flags)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


_NO_FLAGS = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)
"""What a filesystem (or kernel) without renameat2's flags answers."""


def _rename(dir_fd: int, old: str, new: str) -> None:
    os.rename(old, new, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def write_manifest(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """The manifest's temporary (TM), written and fsynced; ``mode`` exactly (no umask)."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------------------------------------
# The commit


def commit(dest_dir: int, name: str, token: str, replacing: bool, shown: str) -> None:
    """Put the verified copy T in place as ``name``, then its manifest TM as M, and fsync the directory; the earlier
    copy, when ``replacing``, is removed last. Each step is a row of :data:`CRASH_TABLE`."""
    tmp, tmp_manifest = temp_name(name, token, "tmp"), temp_name(name, token, "manifest")
    point("manifest_written")
    earlier: str | None = None
    if replacing:
        try:
            renameat2(dest_dir, tmp, name, RENAME_EXCHANGE)
            point("exchanged")
            earlier = tmp
        except OSError as err:
            if err.errno not in _NO_FLAGS:
                raise
            # No atomic exchange here (NFS, FUSE): the earlier copy moved aside first, DEST absent meanwhile.
            earlier = temp_name(name, token, "old")
            _rename(dest_dir, name, earlier)
            point("moved_aside")
            _rename(dest_dir, tmp, name)
            point("renamed_over")
    else:
        try:
            renameat2(dest_dir, tmp, name, RENAME_NOREPLACE)
        except OSError as err:
            if err.errno == errno.EEXIST:
                raise SyncRefused(f"{shown} appeared during the copy: left as it is") from None
            if err.errno not in _NO_FLAGS:
                raise
            # Copies into one directory take turns (dir_lock), so nothing of ours makes DEST between these two.
            if _exists(dest_dir, name):
                raise SyncRefused(f"{shown} appeared during the copy: left as it is") from None
            _rename(dest_dir, tmp, name)
        point("renamed")
    _rename(dest_dir, tmp_manifest, name + MANIFEST_SUFFIX)
    os.fsync(dest_dir)
    point("manifest_in_place")
    if earlier is not None:
        remove_tree(dest_dir, earlier)
        os.fsync(dest_dir)


def recover(dir_fd: int, problems: list[str]) -> list[str]:
    """What copies killed in this directory left, made good (see :data:`CRASH_TABLE`): a DEST left absent gets back
    the newest complete copy there is, a DEST renamed in gets its manifest; then the leftovers are removed, and the
    manifests whose copy is gone. Returns what was removed; what cannot be is said in ``problems`` and left."""
    left: dict[str, list[tuple[str, str, str]]] = {}
    for entry in sorted(os.listdir(dir_fd)):
        m = TEMP_NAME.fullmatch(entry)
        if m is not None:
            left.setdefault(m["name"], []).append((m["kind"], m["token"], entry))
    changed = False
    for name, items in left.items():
        by_kind: dict[str, dict[str, str]] = {}
        for kind, token, entry in items:
            by_kind.setdefault(kind, {})[token] = entry
        temps, temp_manifests = by_kind.get("tmp", {}), by_kind.get("manifest", {})
        if not _exists(dir_fd, name):
            complete: list[tuple[float, str]] = []
            for token, tm in temp_manifests.items():
                manifest = read_manifest(dir_fd, tm)
                if token in temps and describes(manifest, dir_fd, temps[token]):
                    assert manifest is not None
                    finished = manifest.get("finished")
                    complete.append((float(finished) if isinstance(finished, (int, float)) else 0.0, token))
            if complete:
                token = max(complete)[1]
                _rename(dir_fd, temps.pop(token), name)
                _rename(dir_fd, temp_manifests.pop(token), name + MANIFEST_SUFFIX)
                changed = True
            else:
                manifest = read_manifest(dir_fd, name + MANIFEST_SUFFIX)
                for token, aside in by_kind.get("old", {}).items():
                    if describes(manifest, dir_fd, aside):
                        _rename(dir_fd, aside, name)
                        del by_kind["old"][token]
                        changed = True
                        break
        else:
            for token, tm in list(temp_manifests.items()):
                if describes(read_manifest(dir_fd, tm), dir_fd, name):
                    # The copy was renamed into place and its writer died before its manifest followed.
                    _rename(dir_fd, tm, name + MANIFEST_SUFFIX)
                    del temp_manifests[token]
                    changed = True
    if changed:
        os.fsync(dir_fd)
    removed: list[str] = []
    for entry in sorted(os.listdir(dir_fd)):
        if TEMP_NAME.fullmatch(entry) is None:
            continue
        try:
            remove_tree(dir_fd, entry)
        except FileNotFoundError:
            continue
        except OSError as err:
            problems.append(f"{entry}: {err.strerror or err}")
            continue
        removed.append(entry)
    for entry in sorted(os.listdir(dir_fd)):
        if entry.endswith(MANIFEST_SUFFIX) and len(entry) > len(MANIFEST_SUFFIX):
            final = entry[: -len(MANIFEST_SUFFIX)]
            if not _exists(dir_fd, final) and read_manifest(dir_fd, entry) is not None:
                os.unlink(entry, dir_fd=dir_fd)
                removed.append(entry)
    return removed


def retain(dir_fd: int, keep: int, current: str, shown_dir: str) -> list[str]:
    """Keep the ``keep`` newest verified copies of ours in this directory (``current`` among them); remove the rest,
    each first moved aside as G (so no final path ever holds half a copy, and recovery never puts it back), then its
    manifest, then its tree."""
    if keep <= 0:
        return []
    copies: list[tuple[float, str]] = []
    for entry in os.listdir(dir_fd):
        if not entry.endswith(MANIFEST_SUFFIX) or TEMP_NAME.fullmatch(entry):
            continue
        final = entry[: -len(MANIFEST_SUFFIX)]
        manifest = ours(dir_fd, final)
        if manifest is None:
            continue
        finished = manifest.get("finished")
        copies.append((float(finished) if isinstance(finished, (int, float)) else 0.0, final))
    copies.sort(reverse=True)
    kept = [name for _, name in copies[:keep]]
    if current not in kept and copies:
        kept = [current, *kept[: keep - 1]]
    removed: list[str] = []
    for _, name in copies:
        if name in kept:
            continue
        gone = temp_name(name, os.urandom(8).hex(), "gone")
        _rename(dir_fd, name, gone)
        point("retained_aside")
        os.unlink(name + MANIFEST_SUFFIX, dir_fd=dir_fd)
        remove_tree(dir_fd, gone)
        removed.append(f"{shown_dir}/{name}")
    if removed:
        os.fsync(dir_fd)
    return removed


@contextlib.contextmanager
def dir_lock(dir_fd: int, stop: Callable[[], bool]) -> Iterator[None]:
    """Copies into one directory take turns (their recovery removes what is not running); a filesystem without
    flock on directories goes without."""
    while True:
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if stop():
                raise Abort("stopped", "stopped while another copy into the same directory ran") from None
            time.sleep(0.05)
        except OSError as err:
            if err.errno in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                break
            raise
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(dir_fd, fcntl.LOCK_UN)
