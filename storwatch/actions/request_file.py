"""The checkpoint request file (``storwatch.training.REQUEST_NAME``) placed in a run's directory, safely in a
directory a tenant writes: every directory from the trusted scan root down is opened relative to the one above it
without following a symbolic link, and the file is made with ``O_CREAT|O_EXCL|O_NOFOLLOW`` relative to the run's
directory descriptor, so it is never made through a link nor over anything already there.

An entry already at the name is renewed (its text rewritten, its mtime made now: the training loop answers a request
newer than its last save) only when it is what an earlier request left: a regular file with one link, owned by this
process's user. That is checked on the entry (never followed) and again on the very file opened, before it is
written; the open itself never creates, follows a link, waits on a FIFO or takes a terminal. Anything else there (a
symbolic link, a FIFO, a device, a directory, a file with other links, someone else's file) is left exactly as it
is, and the request fails, saying what was found. One gap is named, not closed: between the look at the entry and the
open, a process able to make device nodes in the run's directory could swap a device in, which is then opened
(write-only, non-blocking) and refused without a byte written.

Standard library only: it runs in the helper process (``_request_worker.py``), where a hung mount strands a thread.
"""

from __future__ import annotations

import os
import stat

from storwatch.nofollow import NotFollowed, components, file_kind, open_below
from storwatch.training import REQUEST_NAME

MAX_TEXT_BYTES = 4096

_OPEN_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Refused(Exception):
    """The request was not placed; the message says what was found and that it was left as it was."""


def open_run_dir(run_dir: str, root: str | None) -> int:
    """A descriptor of ``run_dir``: each directory below ``root`` (trusted, followed as given) opened without
    following a link; without ``root``, ``run_dir``'s last component alone is held so."""
    run_dir = os.path.normpath(run_dir)
    if not os.path.isabs(run_dir):
        raise Refused(f"the run directory {run_dir} is not an absolute path")
    if root is None:
        top, parts = os.path.dirname(run_dir), [os.path.basename(run_dir)]
    else:
        top, below = root, components(root, run_dir)
        if below is None:
            raise Refused(f"the run directory {run_dir} is not under its scan root {os.path.normpath(root)}")
        parts = below
    try:
        return open_below(top, parts)
    except NotFollowed as err:
        raise Refused(str(err)) from None
    except OSError as err:
        raise Refused(f"cannot open the directory {run_dir}: {err.strerror or err}") from None


def _renew(dir_fd: int, text: bytes, shown: str) -> None:
    st = os.stat(REQUEST_NAME, dir_fd=dir_fd, follow_symlinks=False)
    uid = os.geteuid()

    def refuse_unless_ours(st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{file_kind(st.st_mode)} is at {shown}: not followed, not replaced, left as it is")
        if st.st_nlink != 1:
            raise Refused(f"a file with {st.st_nlink} links is at {shown}: not one we made, left as it is")
        if st.st_uid != uid:
            raise Refused(f"a file owned by uid {st.st_uid} (not {uid}) is at {shown}: not one we made, left as it is")

    refuse_unless_ours(st)
    try:
        fd = os.open(REQUEST_NAME, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as err:
        raise Refused(f"cannot open {shown} to renew it: {err.strerror or err}") from None
    try:
        opened = os.fstat(fd)
        refuse_unless_ours(opened)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise Refused(f"{shown} changed while it was looked at: left as it is")
        os.ftruncate(fd, 0)
        os.write(fd, text)
        os.utime(fd)  # now, whatever the write did: the loop compares it with its last save's start
    finally:
        os.close(fd)


def place_request(run_dir: str, root: str | None, text: str) -> tuple[str, int]:
    """Create (``"created"``) or renew (``"renewed"``) the request file in ``run_dir``, and the run directory's mode
    (who else may write it); :class:`Refused` or OSError when not done."""
    data = text.encode("utf-8", "replace")[:MAX_TEXT_BYTES]
    dir_fd = open_run_dir(run_dir, root)
    shown = os.path.join(os.path.normpath(run_dir), REQUEST_NAME)
    try:
        mode = os.fstat(dir_fd).st_mode
        try:
            fd = os.open(REQUEST_NAME, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
        except FileExistsError:
            _renew(dir_fd, data, shown)
            return "renewed", mode
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return "created", mode
    finally:
        os.close(dir_fd)
