"""A file's birth and change times, as the kernel keeps them (``statx``): the birth where the filesystem records one.

Python's ``os.stat`` has no birth time on Linux, so this calls libc's ``statx`` through ctypes. ext4, xfs, btrfs and
tmpfs (since Linux 5.18 for tmpfs) report it; NFS, overlayfs on some lowers, FUSE and older kernels do not, and then
the answer is None: an unknown birth is never stood in for by another time.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

AT_SYMLINK_NOFOLLOW = 0x100
AT_STATX_DONT_SYNC = 0x4000
"""Never ask a network filesystem's server: the cached attributes will do, and a hung server must not hang us."""
STATX_CTIME = 0x80
STATX_BTIME = 0x800


class _Timestamp(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_uint32), ("_reserved", ctypes.c_int32)]


class _Statx(ctypes.Structure):
    # struct statx from linux/stat.h; the trailing spare words keep the kernel's larger writes inside the buffer.
    _fields_ = [
        ("stx_mask", ctypes.c_uint32),
        ("stx_blksize", ctypes.c_uint32),
        ("stx_attributes", ctypes.c_uint64),
        ("stx_nlink", ctypes.c_uint32),
        ("stx_uid", ctypes.c_uint32),
        ("stx_gid", ctypes.c_uint32),
        ("stx_mode", ctypes.c_uint16),
        ("_spare0", ctypes.c_uint16),
        ("stx_ino", ctypes.c_uint64),
        ("stx_size", ctypes.c_uint64),
        ("stx_blocks", ctypes.c_uint64),
        ("stx_attributes_mask", ctypes.c_uint64),
        ("stx_atime", _Timestamp),
        ("stx_btime", _Timestamp),
        ("stx_ctime", _Timestamp),
        ("stx_mtime", _Timestamp),
        ("stx_rdev_major", ctypes.c_uint32),
        ("stx_rdev_minor", ctypes.c_uint32),
        ("stx_dev_major", ctypes.c_uint32),
        ("stx_dev_minor", ctypes.c_uint32),
        ("_spare2", ctypes.c_uint64 * 14),
    ]


def _load() -> Any:
    # The C library this process already runs on (CDLL(None): its own symbols). ctypes.util.find_library would run
    # ldconfig in a child process and import shutil, tempfile and subprocess, 1.5 MB in the checkpoint helper.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.statx
    except (OSError, AttributeError):
        return None  # a libc older than glibc 2.28, or none at all
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_Statx)]
    fn.restype = ctypes.c_int
    return fn


_statx = _load()
AT_FDCWD = -100


@dataclass(frozen=True)
class StatxTimes:
    birth: float | None
    """When the file was created; None where the filesystem keeps no birth time."""
    ctime: float
    """When its inode last changed (a write, a rename, a chmod): it only moves forward."""


def statx_times(path: str, dir_fd: int | None = None) -> StatxTimes | None:
    """The birth and change times of ``path`` (relative to ``dir_fd`` when given; a symlink itself, never its
    target), or None where the call fails or libc has no statx."""
    if _statx is None:
        return None
    buf = _Statx()
    flags = AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC
    if (
        _statx(
            AT_FDCWD if dir_fd is None else dir_fd,
            os.fsencode(path),
            flags,
            STATX_BTIME | STATX_CTIME,
            ctypes.byref(buf),
        )
        != 0
    ):
        return None
    if not buf.stx_mask & STATX_CTIME:
        return None
    ctime = _seconds(buf.stx_ctime)
    return StatxTimes(_seconds(buf.stx_btime) if buf.stx_mask & STATX_BTIME else None, ctime)


def _seconds(t: _Timestamp) -> float:
    seconds: int = t.tv_sec
    nanoseconds: int = t.tv_nsec
    return seconds + nanoseconds / 1e9


def birth_time(path: str, dir_fd: int | None = None) -> float | None:
    """When ``path`` was created (see :func:`statx_times`), or None where that is not known."""
    times = statx_times(path, dir_fd)
    return None if times is None else times.birth
