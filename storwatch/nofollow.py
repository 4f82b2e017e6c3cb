"""Directories below a trusted root, opened as root without following a link: the one walker for every path the agent
opens below a root on behalf of data (a sync destination, a sync source, a run directory a request file goes in).

The root is configuration and opened as named; every component below it is opened from the one above with
``O_NOFOLLOW | O_DIRECTORY``, so a symbolic link a tenant plants anywhere in the path is refused (and said to be one),
never followed. Standard library only: the helper processes (sync copies, request files, the blocking calls) import
it. :func:`file_kind` is the package's one wording of what kind of file a mode says, for every message that names one.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""A directory below another, never through a link."""


class NotFollowed(Exception):
    """A component below the root is not a directory that may be entered; the message names it and what it is."""


_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISREG, "a regular file"),
)


def file_kind(mode: int) -> str:
    """The kind of file an ``st_mode`` says, in the words every message of the package uses for it: "a symbolic
    link", "a FIFO", "a socket", "a character device", "a block device", "a directory", "a regular file", or "a file
    of type NNN" (its ``S_IFMT`` bits in octal) for a type none of these is."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return f"a file of type {stat.S_IFMT(mode):o}"


def open_dir_at(dir_fd: int | None, name: str, shown: str) -> int:
    """The directory ``name`` below ``dir_fd``, never through a link; :class:`NotFollowed` naming what is there
    instead, OSError for anything else (the caller's own wording)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        # O_NOFOLLOW on a link gives ELOOP, O_DIRECTORY on anything else ENOTDIR: say which was found.
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            raise NotFollowed(f"{shown} is not a directory: never followed") from None
        if stat.S_ISLNK(st.st_mode):
            raise NotFollowed(f"{shown} is {file_kind(st.st_mode)}: never followed") from None
        raise NotFollowed(f"{shown} is {file_kind(st.st_mode)}, not a directory: never followed") from None


def components(root: str, path: str) -> list[str] | None:
    """The components of ``path`` below ``root`` (both absolute, compared as normalised text), or None when ``path``
    is not ``root`` nor below it."""
    root, path = os.path.normpath(root), os.path.normpath(path)
    rel = os.path.relpath(path, root)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        return None
    return [] if rel == os.curdir else rel.split(os.sep)


def open_below(
    root: str,
    parts: Sequence[str],
    *,
    make_mode: int | None = None,
    made: Callable[[int, int], None] | None = None,
) -> int:
    """A descriptor of the directory ``root/parts...``: ``root`` opened as named (trusted configuration), every
    component below it from the one above with O_NOFOLLOW. With ``make_mode``, a missing component is made with that
    mode (less the umask) and, once opened, ``made(parent_fd, fd)`` is called (to set its exact mode, fsync the
    parent...).
    :class:`NotFollowed` for a link or non-directory on the way or a ``.``/``..``/empty component; OSError for the
    rest (a missing component without ``make_mode``: FileNotFoundError)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    shown = root.rstrip("/") or "/"
    try:
        for part in parts:
            if part in ("", ".", "..") or "/" in part:
                raise NotFollowed(f"{shown}: the path below {root} holds {part!r}")
            shown = f"{shown.rstrip('/')}/{part}"
            new = False
            if make_mode is not None:
                try:
                    os.mkdir(part, make_mode, dir_fd=fd)
                    new = True
                except FileExistsError:
                    pass
            below = open_dir_at(fd, part, shown)
            if new and made is not None:
                try:
                    made(fd, below)
                except BaseException:
                    os.close(below)
                    raise
            os.close(fd)
            fd = below
        return fd
    except BaseException:
        os.close(fd)
        raise
