"""Reading a file the operator names for a credential (a webhook's bearer token, HMAC key or CA file, the
Alertmanager receiver's token): opened without blocking and without following a symbolic link, a regular file only,
bounded in size. Every such read in the package goes through :func:`read_secret_file`.

A FIFO opened for reading blocks until something opens it for writing, and a read of it blocks until something
writes: one put where a secret is named would hold the thread that reads it for good (the webhook lane, or the agent
at start). ``O_NONBLOCK`` makes the open return at once, and the file is refused unless ``fstat`` shows a regular
file, before anything is read. ``O_NOFOLLOW`` refuses a symbolic link as the last component (the directories above it
are followed), with one exception, the layout the kubelet writes a Secret or ConfigMap volume in: ``DIR/KEY`` a link
to ``..data/KEY``, the link and ``DIR`` owned by root and ``DIR`` writable by no one else. That one link is read and
``DIR/..data/KEY`` opened the same way (``..data`` is swapped whole on an update, so a rotated secret is read at
once); any other link is refused.
"""

from __future__ import annotations

import errno
import os
import stat

from storwatch.nofollow import file_kind
from storwatch.printable import printable

MAX_SECRET_BYTES = 64 << 10
"""A token or a key past this is not one (a log file named by mistake): refused, nothing kept of it."""

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


class SecretFileError(Exception):
    """A secret file that cannot be had; the message names what it is for and the file."""


def _volume_key(path: str) -> str | None:
    """``DIR/..data/KEY`` where ``path`` is a Secret volume's ``DIR/KEY`` as the kubelet writes it (see the module's
    docstring); None for any other link."""
    directory, key = os.path.split(path)
    try:
        link = os.lstat(path)
        holder = os.lstat(directory or ".")
        target = os.readlink(path)
    except OSError:
        return None
    trusted = link.st_uid == 0 and holder.st_uid == 0 and not holder.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if not trusted or not stat.S_ISLNK(link.st_mode) or target != f"..data/{key}":
        return None
    return os.path.join(directory, target)


def read_secret_file(path: str, what: str, max_bytes: int = MAX_SECRET_BYTES) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``max_bytes``), or SecretFileError naming ``what`` (the
    field that names the file: ``hmac_key_file``) and the file, saying why: missing or unreadable, a symbolic link,
    not a regular file, or too large."""
    shown = printable(path)
    try:
        try:
            fd = os.open(path, _FLAGS)
        except OSError as err:
            key = _volume_key(path) if err.errno == errno.ELOOP else None
            if key is None:
                raise
            fd = os.open(key, _FLAGS)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise SecretFileError(
                f"{what}: {shown} is a symbolic link, not followed: name the file itself (a Kubernetes Secret "
                "volume's keys, as the kubelet writes them, are read)"
            ) from None
        if err.errno == errno.ENXIO:  # a socket (or a device without its driver) cannot be opened at all
            try:
                mode: int | None = os.lstat(path).st_mode
            except OSError:
                mode = None
            if mode is not None:
                raise SecretFileError(f"{what}: {shown} is {file_kind(mode)}, not a regular file: not read") from None
        raise SecretFileError(f"{what}: cannot read {shown}: {err.strerror or err}") from None
    try:
        try:
            st = os.fstat(fd)
        except OSError as err:
            raise SecretFileError(f"{what}: cannot read {shown}: {err.strerror or err}") from None
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError(f"{what}: {shown} is {file_kind(st.st_mode)}, not a regular file: not read")
        if st.st_size > max_bytes:
            raise SecretFileError(f"{what}: {shown} is {st.st_size} bytes, over the {max_bytes} a secret may hold")
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:
            try:
                chunk = os.read(fd, max_bytes + 1 - got)
            except OSError as err:
                raise SecretFileError(f"{what}: cannot read {shown}: {err.strerror or err}") from None
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:  # it grew since fstat
            raise SecretFileError(f"{what}: {shown} is over the {max_bytes} bytes a secret may hold")
        return b"".join(chunks)
    finally:
        os.close(fd)


__all__ = ["MAX_SECRET_BYTES", "SecretFileError", "read_secret_file"]
