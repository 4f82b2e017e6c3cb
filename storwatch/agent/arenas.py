"""glibc's malloc arenas: at most two for the agent.

glibc gives each new thread that allocates an arena of its own, up to eight per core. Memory freed in one
arena serves only allocations that land in it again, so an agent whose two dozen threads each allocate now and then
(sources, the ticker, the policy, HTTP workers) keeps freed memory idle in many arenas: on bench/at_scale.py's node,
MALLOC_ARENA_MAX=2 took the agent's RSS from 165 MB to 130 MB, at the same CPU. ``limit_arenas`` does that from
inside the process (``mallopt(M_ARENA_MAX)``) before the threads start, so the DaemonSet, the systemd unit and a
plain ``storwatch agent`` all get it, and puts MALLOC_ARENA_MAX in the environment its helper processes inherit (the
checkpoint walks', the blocking calls', the copies'); one already there is left to glibc. Where the C library has no
``mallopt`` (musl), only the environment is set.
"""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8
"""mallopt's parameter number for the arena limit (glibc's malloc.h)."""
ARENAS = 2


def limit_arenas(count: int = ARENAS) -> bool:
    """At most ``count`` malloc arenas from now on; True when the C library took the setting."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    os.environ["MALLOC_ARENA_MAX"] = str(count)  # the helper processes it starts have glibc read it at their start
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, count))
