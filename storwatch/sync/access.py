"""Who may read a copy: never anyone the source's own path kept out. A checkpoint that is private only because it
sits in a 0700 home must not become readable because its copy sits in directories anyone may enter.

The source's path is read from ``access_root`` (the host's root; for a pod's volume, the volume's own directory, which
the pod sees as its mount) down to the directory holding the source. For each class of user (the source's group,
everyone else) the tightest permissions met on that path are applied at the destination: to the directories the copy
makes, to the copy's top, and to its manifest (which lists every name and hash). Owners are not granted anything:
what the copy makes above its top belongs to the user the copy runs as (root, in the agent). Only mode bits are read:
an ACL on the source's path that grants more is not carried over, so the copy is at most as open, never more.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass


@dataclass(frozen=True)
class Reach:
    """The tightest permissions (``rwx`` as 0-7) the source's path grants each class on the way to the source."""

    group: int
    """For members of the source's group."""
    other: int
    """For everyone else."""

    @property
    def dir_mode(self) -> int:
        """The mode of a directory the copy makes: its owner's, and each class's tightest on the source's path."""
        return 0o700 | (self.group << 3) | self.other

    def top_mode(self, mode: int) -> int:
        """The copy's top: the source's own mode, without the bits of a class that could not reach the source (the
        set-user-ID and set-group-ID bits never kept)."""
        mode = stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID)
        if not self.group & 1:
            mode &= ~0o070
        if not self.other & 1:
            mode &= ~0o007
        return mode

    def manifest_mode(self, top_mode: int, is_dir: bool) -> int:
        """The manifest names every entry and its hash: a class may read it only where it may read the copy's top
        (a file: read; a directory: read and enter)."""
        mode = 0o600
        want = 0o5 if is_dir else 0o4
        if (top_mode >> 3) & want == want:
            mode |= 0o040
        if top_mode & want == want:
            mode |= 0o004
        return mode


CLOSED = Reach(0, 0)
"""Nobody but the owner: what a path that cannot be read counts as."""


def source_reach(source: str, access_root: str | None = None) -> Reach:
    """The tightest permissions on the path from ``access_root`` (default ``/``) down to the directory holding
    ``source`` (both absolute, as this process reaches them). A directory whose group is not the source's counts for
    the source's group by the bits both of its classes grant (a member of the source's group may or may not be in
    the directory's). A path that cannot be read, or a source not below ``access_root``, is :data:`CLOSED`."""
    source = os.path.normpath(source)
    top = os.path.normpath(access_root or "/")
    parent = os.path.dirname(source)
    rel = os.path.relpath(parent, top)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        return CLOSED
    try:
        gid = os.stat(source, follow_symlinks=False).st_gid
        group = other = 0o7
        here = top
        for part in ["", *([] if rel == os.curdir else rel.split(os.sep))]:
            here = os.path.join(here, part) if part else here
            st = os.stat(here)
            o = st.st_mode & 0o7
            g = (st.st_mode >> 3) & 0o7
            group &= g if st.st_gid == gid else (g & o)
            other &= o
    except OSError:
        return CLOSED
    return Reach(group, other)
