"""A GPU-like process tree that is heavy in open files, for the access source's tests and benchmarks: a parent that
holds ``fds`` open files (one file opened again and again) and ``children`` processes that inherit all of them
(``sleep``, spawned with the descriptors inheritable: each child gets its own table pointing at the same open file
descriptions). Standard library only (the benchmarks import it too)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

PARENT = """
import os, resource, signal, sys
path, children, fds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
need = fds + 64
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < need:
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, max(hard, need)))
for i in range(fds):
    fd = os.open(path, os.O_RDONLY if i % 2 else os.O_RDWR)
    os.set_inheritable(fd, True)
sleep = "/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep"
pids = [os.posix_spawn(sleep, [sleep, "1000000"], os.environ) for _ in range(children)]
print("ready", os.getpid(), len(pids), flush=True)
signal.pause()
"""


@contextlib.contextmanager
def fd_tree(path: Path, children: int, fds: int) -> Iterator[int]:
    """Start the tree (``path``: the file every descriptor opens, created if missing); yield the parent's PID; kill
    the whole tree at the end."""
    path.touch()
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(path), str(children), str(fds)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the sleeps are in its session: one killpg ends them all
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if not line or line[0] != "ready":
            raise RuntimeError(f"the fd tree did not start: {line!r}, exit {proc.poll()}")
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
