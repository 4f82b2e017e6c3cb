"""The agent's malloc settings (storwatch/agent/malloc.py), in real processes with glibc's own report.

Each case runs a fresh Python (the settings are per process, and the arena limit only holds for arenas not made yet).
The arenas: 16 threads allocate, then glibc's ``malloc_info`` says how many heaps (arenas) there are: without the
limit glibc gives each new thread its own (up to eight per core). Large blocks: 1 MiB blocks from malloc, each
followed by a smaller one that pins the heap, are freed, then glibc's ``mallinfo2`` says how much more free memory
the heap keeps: with glibc's moving threshold the blocks after the first come from the heap and stay there when
freed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from storwatch.agent.malloc import ARENAS, MMAP_THRESHOLD

ROOT = Path(__file__).resolve().parent.parent

SETTINGS = ["MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]

TUNE = r"""
import subprocess, sys
if sys.argv[1] == "tune":
    from storwatch.agent.malloc import tune_malloc
    assert tune_malloc() == ["MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
elif sys.argv[1] == "tune-then-child":  # what a helper process the agent starts gets
    from storwatch.agent.malloc import tune_malloc
    assert len(tune_malloc()) == 3
    run = subprocess.run([sys.executable, "-I", "-c", sys.argv[2], "plain"], capture_output=True, text=True)
    sys.stdout.write(run.stdout)
    sys.exit(run.returncode)
"""

CHILD = (
    TUNE
    + r"""
import ctypes, threading
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
)


HOLES = (
    TUNE
    + r"""
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc.mallinfo2.restype = Info
big, pins = [], []
before = libc.mallinfo2().fordblks
for _ in range(32):
    big.append(libc.malloc(1 << 20))
    libc.free(big.pop())  # freed at once: the first raises glibc's moving threshold
    big.append(libc.malloc(1 << 20))
    pins.append(libc.malloc(100 << 10))  # after it in the heap (no older hole fits it): the big one cannot join the top
for p in big:
    libc.free(p)
print(libc.mallinfo2().fordblks - before)
"""
)


def _run(script: str, mode: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", script, mode, script], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout


def _heaps(mode: str) -> int:
    return len(re.findall(r"<heap nr=", _run(CHILD, mode)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_info")
def test_tune_malloc_holds_the_threads_to_two_heaps() -> None:
    unlimited = _heaps("plain")
    limited = _heaps("tune")
    assert unlimited > ARENAS  # the case can fail: without the limit the threads do make arenas of their own
    assert 1 <= limited <= ARENAS
    assert 1 <= _heaps("tune-then-child") <= ARENAS  # a helper process inherits the limit


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2")
def test_tune_malloc_gives_large_freed_blocks_back() -> None:
    kept = int(_run(HOLES, "plain"))
    assert kept >= 16 << 20  # the case can fail: glibc's default keeps the freed blocks in the heap
    assert int(_run(HOLES, "tune")) < MMAP_THRESHOLD
    assert int(_run(HOLES, "tune-then-child")) < MMAP_THRESHOLD  # a helper process inherits the setting


def test_a_setting_in_the_environment_is_left_to_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    from storwatch.agent.malloc import tune_malloc

    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert tune_malloc() == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
    assert os.environ["MALLOC_ARENA_MAX"] == "4"
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == str(MMAP_THRESHOLD)
