"""The agent's malloc arena limit (storwatch/agent/arenas.py), in real processes with glibc's own report.

Each case runs a fresh Python (arenas are per process, and the limit only holds for arenas not made yet) that starts
16 threads which allocate, then asks glibc's ``malloc_info`` how many heaps (arenas) it has: without the limit glibc
gives each new thread its own (up to eight per core).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from storwatch.agent.arenas import ARENAS

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import ctypes, sys, threading
if sys.argv[1] == "limit":
    from storwatch.agent.arenas import limit_arenas
    assert limit_arenas() is True
elif sys.argv[1] == "limit-then-child":  # what a helper process the agent starts gets
    import subprocess
    from storwatch.agent.arenas import limit_arenas
    assert limit_arenas() is True
    run = subprocess.run([sys.executable, "-I", "-c", sys.argv[2], "plain"], capture_output=True, text=True)
    sys.stdout.write(run.stdout)
    sys.exit(run.returncode)
libc = ctypes.CDLL(None)
start = threading.Barrier(16)
def work():
    start.wait()
    keep = [bytearray(4096) for _ in range(2000)]
    done.wait()
done = threading.Event()
threads = [threading.Thread(target=work) for _ in range(16)]
for t in threads: t.start()
import time; time.sleep(0.5)
libc.open_memstream.restype = ctypes.c_void_p
buf, size = ctypes.c_char_p(), ctypes.c_size_t()
stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
libc.malloc_info(0, ctypes.c_void_p(stream))
libc.fclose(ctypes.c_void_p(stream))
done.set()
for t in threads: t.join()
sys.stdout.write(buf.value.decode())
"""


def _heaps(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, CHILD], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return len(re.findall(r"<heap nr=", out))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_info")
def test_limit_arenas_holds_the_threads_to_two_heaps() -> None:
    unlimited = _heaps("plain")
    limited = _heaps("limit")
    assert unlimited > ARENAS  # the case can fail: without the limit the threads do make arenas of their own
    assert 1 <= limited <= ARENAS
    assert 1 <= _heaps("limit-then-child") <= ARENAS  # a helper process inherits the limit


def test_a_malloc_arena_max_in_the_environment_is_left_to_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    from storwatch.agent.arenas import limit_arenas

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_arenas() is False
