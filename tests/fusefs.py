#!/usr/bin/env python3
"""A passthrough FUSE filesystem (libfuse3 through ``mfusepy``) for the real-mount test harness.

Usage::

    python tests/fusefs.py --backing DIR --mountpoint MNT [--write-delay-ms N] [--block-statfs]
                           [--block-readdir] [--block-getattr] [--no-rename-flags] [--ready-file PATH]
                           [--fsname NAME] [--debug]

* Every operation is passed through to the same path under ``--backing``.
* ``--write-delay-ms N`` sleeps N ms in every ``write`` handler: a loop device whose backing image lives
  on this mount then shows real write latency in /proc/diskstats.
* ``--block-statfs`` makes ``statfs`` block forever, so ``os.statvfs(MNT)`` hangs in the kernel the way it
  does on a hung NFS server. Release it with the connection's ``abort`` file in fusectl.
* ``--block-readdir`` and ``--block-getattr`` make ``readdir`` (listing any directory) or ``getattr`` (a stat of
  anything, the mount's root included) block the same way while ``statfs`` still answers, as s3fs can: statvfs
  says the mount is fine, and a walk of it hangs.
* ``--no-rename-flags`` answers EINVAL to ``renameat2`` with any flag (``RENAME_NOREPLACE``, ``RENAME_EXCHANGE``),
  as NFS and many FUSE filesystems do, so that the fallbacks for them are what runs. mfusepy itself drops the flags
  and renames plainly (an exchange would overwrite), so they are refused here, in the FUSE layer; the mount then
  also gives the backing files' inode numbers (``use_ino``), as a real filesystem does, so identity checks hold.
* Runs in the foreground, multithreaded. Once the kernel has sent FUSE_INIT (that is, the filesystem is
  mounted) it writes ``--ready-file`` (atomically) or prints ``ready`` on stdout.

This file is run as a script by ``tests/realmounts.py``; it is not imported by the tests.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import threading
import time
from typing import Any

import mfusepy
from mfusepy import FUSE, FuseOSError, Operations

_STAT_KEYS = (
    "st_mode",
    "st_ino",
    "st_dev",
    "st_nlink",
    "st_uid",
    "st_gid",
    "st_size",
    "st_blocks",
    "st_blksize",
    "st_rdev",
)
_STATVFS_KEYS = (
    "f_bsize",
    "f_frsize",
    "f_blocks",
    "f_bfree",
    "f_bavail",
    "f_files",
    "f_ffree",
    "f_favail",
    "f_flag",
    "f_namemax",
)


def _is_mounted(mountpoint: str) -> bool:
    """Whether a FUSE filesystem is mounted at ``mountpoint`` (from /proc/self/mountinfo, without a stat)."""
    escaped = mountpoint.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")
    escaped = escaped.replace("\n", "\\012")
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and fields[4] == escaped and " - fuse" in line:
                    return True
    except OSError:
        return True  # cannot tell: keep blocking
    return False


class Passthrough(Operations):  # type: ignore[misc]
    """Passthrough of every operation to ``backing``; file handles are real OS file descriptors."""

    use_ns = True  # utimens/getattr times in integer nanoseconds

    def __init__(
        self,
        backing: str,
        write_delay_s: float = 0.0,
        block_statfs: bool = False,
        ready_file: str | None = None,
        mountpoint: str | None = None,
        block_readdir: bool = False,
        block_getattr: bool = False,
        use_ino: bool = False,
    ) -> None:
        self.backing = os.path.realpath(backing)
        self.use_ino = use_ino
        self.mountpoint = mountpoint
        self.write_delay_s = write_delay_s
        self.block_statfs = block_statfs
        self.block_readdir = block_readdir
        self.block_getattr = block_getattr
        self.ready_file = ready_file
        # statfs (readdir, getattr) waits on this when --block-statfs (...). Nothing sets it while mounted: only
        # once the mount is gone (the harness aborted the connection and unmounted), so that libfuse, which
        # joins its worker threads on exit, can end without a SIGKILL.
        self._unmounted = threading.Event()

    # -- helpers -------------------------------------------------------------------------------------------

    def _full(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    @staticmethod
    def _errno(exc: OSError) -> FuseOSError:
        return FuseOSError(exc.errno or errno.EIO)

    # -- lifecycle -----------------------------------------------------------------------------------------

    def init(self, path: str) -> None:
        # Called once the kernel has sent FUSE_INIT: the filesystem is in the mount table now.
        if (self.block_statfs or self.block_readdir or self.block_getattr) and self.mountpoint:
            threading.Thread(target=self._watch_unmount, name="watch-unmount", daemon=True).start()
        # libfuse may chdir("/") before this runs, so ready_file is made absolute in main().
        try:
            if self.ready_file:
                tmp = f"{self.ready_file}.tmp"
                with open(tmp, "w", encoding="utf-8") as fh:
                    fh.write(f"{os.getpid()}\n")
                os.replace(tmp, self.ready_file)
            else:
                print("ready", flush=True)
        except OSError as exc:  # an exception here would be swallowed by libfuse: say it
            print(f"fusefs: cannot signal readiness: {exc}", file=sys.stderr, flush=True)

    def _watch_unmount(self) -> None:
        while not self._unmounted.wait(0.2):
            if not _is_mounted(self.mountpoint or ""):
                self._unmounted.set()

    # -- metadata ------------------------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        if self.block_getattr:
            self._unmounted.wait()
            raise FuseOSError(errno.ENOTCONN)
        try:
            st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
        except OSError as exc:
            raise self._errno(exc) from None
        attrs: dict[str, Any] = {key: getattr(st, key) for key in _STAT_KEYS}
        attrs["st_atime"] = st.st_atime_ns
        attrs["st_mtime"] = st.st_mtime_ns
        attrs["st_ctime"] = st.st_ctime_ns
        return attrs

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._full(path), amode):
            raise FuseOSError(errno.EACCES)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        try:
            os.chmod(self._full(path), mode)
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        try:
            os.lchown(self._full(path), uid, gid)
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        try:
            if times is None:
                os.utime(self._full(path), follow_symlinks=False)
            else:
                os.utime(self._full(path), ns=(int(times[0]), int(times[1])), follow_symlinks=False)
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        if self.block_statfs:
            # Block forever, like a statfs RPC to a dead NFS server. The kernel keeps the caller in D state
            # until the connection is aborted through fusectl.
            self._unmounted.wait()
            raise FuseOSError(errno.ENOTCONN)  # nobody reads this answer: the connection is gone
        try:
            sv = os.statvfs(self._full(path))
        except OSError as exc:
            raise self._errno(exc) from None
        return {key: getattr(sv, key) for key in _STATVFS_KEYS}

    def readlink(self, path: str) -> str:
        try:
            return os.readlink(self._full(path))
        except OSError as exc:
            raise self._errno(exc) from None

    # -- directories ---------------------------------------------------------------------------------------

    def readdir(self, path: str, fh: int) -> list[Any]:
        if self.block_readdir:
            self._unmounted.wait()
            raise FuseOSError(errno.ENOTCONN)
        try:
            names = [".", "..", *os.listdir(self._full(path))]
            if not self.use_ino:
                return names
            # With use_ino the kernel takes each entry's inode number from here: a name alone would be inode 0,
            # which readdir(3) skips.
            out: list[Any] = []
            for name in names:
                st = os.lstat(os.path.join(self._full(path), name))
                out.append((name, {"st_ino": st.st_ino, "st_mode": st.st_mode}, 0))
            return out
        except OSError as exc:
            raise self._errno(exc) from None

    def mkdir(self, path: str, mode: int) -> int:
        try:
            os.mkdir(self._full(path), mode)
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def rmdir(self, path: str) -> int:
        try:
            os.rmdir(self._full(path))
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def unlink(self, path: str) -> int:
        try:
            os.unlink(self._full(path))
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def rename(self, old: str, new: str) -> int:
        try:
            os.rename(self._full(old), self._full(new))
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def symlink(self, target: str, source: str) -> int:
        # mfusepy: creates ``target`` pointing at ``source`` (ln -s source target)
        try:
            os.symlink(source, self._full(target))
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def link(self, target: str, source: str) -> int:
        try:
            os.link(self._full(source), self._full(target))
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def mknod(self, path: str, mode: int, dev: int) -> int:
        try:
            os.mknod(self._full(path), mode, dev)
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    # -- files ---------------------------------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        try:
            return os.open(self._full(path), flags)
        except OSError as exc:
            raise self._errno(exc) from None

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        flags = fi if isinstance(fi, int) else os.O_RDWR
        try:
            return os.open(self._full(path), flags | os.O_CREAT, mode)
        except OSError as exc:
            raise self._errno(exc) from None

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        try:
            return os.pread(fh, size, offset)
        except OSError as exc:
            raise self._errno(exc) from None

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        if self.write_delay_s > 0:
            time.sleep(self.write_delay_s)
        try:
            return os.pwrite(fh, data, offset)
        except OSError as exc:
            raise self._errno(exc) from None

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        try:
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(self._full(path), length)
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        if mode != 0:
            raise FuseOSError(errno.EOPNOTSUPP)
        try:
            os.posix_fallocate(fh, offset, size)
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        try:
            if datasync:
                os.fdatasync(fh)
            else:
                os.fsync(fh)
        except OSError as exc:
            raise self._errno(exc) from None
        return 0

    def release(self, path: str, fh: int) -> int:
        try:
            os.close(fh)
        except OSError as exc:
            raise self._errno(exc) from None
        return 0


class FlagRefusingFUSE(FUSE):  # type: ignore[misc]
    """mfusepy's FUSE, refusing ``renameat2`` flags instead of dropping them."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        if flags:
            return -errno.EINVAL
        return int(super().rename_fuse_3(old, new, flags))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backing", required=True, help="directory to pass through to")
    parser.add_argument("--mountpoint", required=True)
    parser.add_argument("--write-delay-ms", type=float, default=0.0, help="sleep this long in every write")
    parser.add_argument("--block-statfs", action="store_true", help="statfs blocks forever (a hung mount)")
    parser.add_argument("--block-readdir", action="store_true", help="readdir blocks forever (statfs answers)")
    parser.add_argument("--block-getattr", action="store_true", help="getattr blocks forever (statfs answers)")
    parser.add_argument("--no-rename-flags", action="store_true", help="renameat2 with flags answers EINVAL")
    parser.add_argument("--ready-file", default=None, help="written once mounted (else 'ready' on stdout)")
    parser.add_argument("--fsname", default="storwatch-fusefs", help="source shown in the mount table")
    parser.add_argument("--debug", action="store_true", help="libfuse debug output on stderr")
    args = parser.parse_args(argv)

    if mfusepy.fuse_version_major != 3:
        print(f"fusefs: need libfuse3, found libfuse{mfusepy.fuse_version_major}", file=sys.stderr)
        return 2

    ops = Passthrough(
        args.backing,
        write_delay_s=args.write_delay_ms / 1000.0,
        block_statfs=args.block_statfs,
        ready_file=os.path.abspath(args.ready_file) if args.ready_file else None,
        mountpoint=os.path.realpath(args.mountpoint),
        block_readdir=args.block_readdir,
        block_getattr=args.block_getattr,
        use_ino=args.no_rename_flags,
    )
    extra = {"use_ino": True} if args.no_rename_flags else {}
    (FlagRefusingFUSE if args.no_rename_flags else FUSE)(
        ops,
        os.path.realpath(args.mountpoint),
        foreground=True,
        nothreads=False,
        debug=args.debug,
        fsname=args.fsname,
        subtype="storwatch",
        **extra,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
