"""glibc's malloc, set for a long-running process with two dozen threads: at most two arenas, and large blocks
given back to the system when freed.

- **Arenas.** glibc gives each new thread that allocates an arena of its own, up to eight per core. Memory freed in
  one arena serves only allocations that land in it again, so an agent whose threads each allocate now and then
  (sources, the ticker, the policy, HTTP workers) keeps freed memory idle in many arenas: on bench/at_scale.py's
  node, two arenas took the agent's RSS from 165 MB to 130 MB, at the same CPU.
- **Large blocks.** A block from ``MMAP_THRESHOLD`` up is mapped on its own and unmapped when freed. glibc's default
  threshold moves: freeing such a block raises it to that block's size (up to 32 MB), after which blocks that large
  come from the heap, where the holes they leave behind stay in the process. The agent's large blocks are short-lived
  (a scrape's text, a helper's answer, the lists of a View), so a fixed threshold keeps them out of the heap; with
  the heap's free top given back from ``TRIM_THRESHOLD``, the agent at that scale held 94 MB at the end of the run
  instead of 101.5, its checkpoint helper 37 MB instead of 39.

:func:`tune_malloc` sets these from inside the process (``mallopt``) before the threads start, so the DaemonSet, the
systemd unit and a plain ``storwatch agent`` all get them, and puts them in the environment its helper processes
inherit (glibc reads ``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` at a process's
start: the checkpoint walks', the blocking calls', the copies'). A setting already in the environment is left to
glibc. Where the C library has no ``mallopt`` (musl), only the environment is set.
"""

from __future__ import annotations

import ctypes
import os

# mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

ARENAS = 2
MMAP_THRESHOLD = 256 * 1024
"""Blocks from this size up are mapped on their own, and given back when freed."""
TRIM_THRESHOLD = 512 * 1024
"""Free memory at the heap's top from this size up is given back."""

_SETTINGS = (
    ("MALLOC_ARENA_MAX", M_ARENA_MAX, ARENAS),
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, TRIM_THRESHOLD),
)


def tune_malloc() -> list[str]:
    """Set the settings above that the environment does not already hold; the names of those the C library took."""
    chosen = [(name, param, value) for name, param, value in _SETTINGS if name not in os.environ]
    for name, _, value in chosen:
        os.environ[name] = str(value)  # the helper processes it starts have glibc read it at their start
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return []
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return [name for name, param, value in chosen if mallopt(param, value)]
