"""The calling thread's name given to the OS, so ``top -H``, ``ps -L``, ``/proc/PID/task/TID/comm`` and the benches
show which part of the agent each of its two dozen threads is (Python 3.11 leaves them all named after the process:
on a node whose agent burns CPU, an operator sees thirty ``python`` threads).

Linux only (``prctl(PR_SET_NAME)``, which names the calling thread); elsewhere, or where the C library has no
``prctl``, nothing is named and the agent runs as before. The kernel keeps 15 bytes of a name: the long prefixes are
shortened first (``source-file_events`` becomes ``src-file_events``)."""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable
from typing import Any

PR_SET_NAME = 15
"""prctl's option that names the calling thread (linux/prctl.h)."""
OS_NAME_BYTES = 15
"""What the kernel keeps of a thread's name (TASK_COMM_LEN, 16 with its NUL)."""
_SHORTER = (("source-", "src-"), ("storwatch-", ""))


def os_name(name: str) -> bytes:
    """The OS name of a thread called ``name``: a long prefix shortened, then cut to what the kernel keeps (a name
    that is not ASCII has ``?`` for each character that is not)."""
    for long, short in _SHORTER:
        if name.startswith(long):
            name = short + name[len(long) :]
            break
    return name.encode("ascii", "replace")[:OS_NAME_BYTES]


@functools.cache
def _prctl() -> Callable[..., Any] | None:
    try:
        prctl: Callable[..., Any] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


def name_this_thread() -> bool:
    """Give the calling thread its Python name (:func:`os_name`) as its OS name; False where that cannot be done, and
    on the main thread, whose name is the process's own (``ps``, ``pgrep``) and stays so."""
    prctl = _prctl()
    if prctl is None or threading.current_thread() is threading.main_thread():
        return False
    return bool(prctl(PR_SET_NAME, ctypes.c_char_p(os_name(threading.current_thread().name)), 0, 0, 0) == 0)
