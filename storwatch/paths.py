"""Host paths: the one place that knows where procfs, sysfs and the host root are.

Every other module asks a ``HostPaths`` for a path; none writes "/proc", "/sys" or "/host" itself, so tests point
the whole agent at fixture trees and the DaemonSet at the host's mounts under /host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_PROCFS = "/proc"
DEFAULT_SYSFS = "/sys"
DEFAULT_ROOTFS = "/"

OWN_SOMAXCONN = "/proc/sys/net/core/somaxconn"
NOT_FILE_TARGETS = (b"socket:", b"pipe:", b"anon_inode:", b"/dev/", b"/proc/", b"/sys/", b"/memfd:")
"""Where a process's open file descriptor leads (``readlink <pid>/fd/N``, in the process's own namespace) when it is
not a file on storage: sockets, pipes, kernel objects, devices and kernel interfaces."""
"""The longest listen queue the kernel allows, in the agent's own network namespace (where its port is), which is
not the host's --path.procfs."""


def own_fd(fd: int) -> str:
    """This process's own descriptor as a path (``/proc/self/fd/N``), in its own procfs, never ``--path.procfs``: a
    child reads a file through it, and its link names the file the kernel opened."""
    return f"/proc/self/fd/{fd}"


def unreadable_directory(path: str) -> str | None:
    """Why ``path`` cannot be read as a directory (missing, not a directory, not readable), or None when it can."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        return err.strerror or str(err)
    os.close(fd)
    return None


@dataclass(frozen=True)
class HostPaths:
    procfs: str = DEFAULT_PROCFS
    sysfs: str = DEFAULT_SYSFS
    rootfs: str = DEFAULT_ROOTFS

    def proc(self, *parts: str) -> str:
        return os.path.join(self.procfs, *parts)

    def sys(self, *parts: str) -> str:
        return os.path.join(self.sysfs, *parts)

    def root(self, host_path: str) -> str:
        """Where a path of the host (as mountinfo names it) is reachable from this process."""
        if self.rootfs in ("", "/"):
            return host_path
        return os.path.join(self.rootfs, host_path.lstrip("/"))

    def host_process_file(self, name: str) -> tuple[str, ...]:
        # PID 1's view is the host's mount namespace when /proc is the host's (hostPID or /host/proc);
        # "self" is the fallback where PID 1 is not readable (unprivileged runs, some sandboxes).
        return (self.proc("1", name), self.proc("self", name))

    def procfs_problem(self) -> str | None:
        """What is wrong with ``procfs`` (a directory that is not there, or cannot be read), or None. Every source
        reads it: without it the node would look like one with no mounts, processes or I/O, which it is not."""
        why = unreadable_directory(self.procfs)
        return None if why is None else f"{self.procfs!r} cannot be read as procfs: {why}"

    def mountinfo_candidates(self) -> tuple[str, ...]:
        return self.host_process_file("mountinfo")
