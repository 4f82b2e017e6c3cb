"""A job's GPU as a driver samples it, for the fake NVML library (tests/nvml/fake_nvml.c): a helper process that
writes the GPU's line in the library's script 5 times a second, keeping the last 14 s of utilisation samples as the
driver's ring does, with the job's process holding its memory; the job tells it of each change of phase (busy while it
computes, idle while it is blocked in a save) with the exact time of the change.

The sampling runs in a process of its own, as a driver's does, so that it never waits on the job: not on a save that
holds the interpreter's lock, and not on a disk the job's writes keep busy (put the script on a tmpfs). Standard
library only: the helper starts in a few milliseconds.

Use from a job: ``gpu = DriverGPU(script, index)``, then ``gpu.phase(2)`` / ``gpu.phase(97)``, and ``gpu.release()``
when the job lets its GPU go (it ends). The helper is ``python tests/fake_gpu.py SCRIPT INDEX PID``, fed lines
``TIME UTIL`` (a change of phase) and ``release TIME`` on its standard input; at the end of its input it releases.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections import deque

SAMPLE_SECONDS = 0.2
"""The driver's sampling period: 5 samples a second."""
KEEP = 72
"""Samples kept: about 14 s, as the driver keeps them (storwatch/sources/gpu/sampler.py)."""
MEM_USED = 30 << 30
MEM_TOTAL = 80 << 30
BUSY = 97


class DriverGPU:
    """The job's side: its GPU's helper process, told of each change of phase."""

    def __init__(self, script: str, index: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), script, str(index), str(os.getpid())],
            stdin=subprocess.PIPE,
            text=True,
        )
        self.released = False

    def _tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def phase(self, util: int) -> None:
        """From now on the GPU is at ``util`` percent (the old phase lasted until now)."""
        self._tell(f"{time.time():.6f} {util}")

    def release(self) -> None:
        """The job lets its GPU go: busy until now, then idle with no process."""
        if self.released:
            return
        self.released = True
        self._tell(f"release {time.time():.6f}")
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def _line(index: int, pid: int, util: int, holds: bool, samples: deque[tuple[int, int]]) -> str:
    text = (
        f"gpu {index} uuid=GPU-e2e-{index:04d} name=Fake_Trainer util={util} mem_util={util // 2} "
        f"mem_used={MEM_USED if holds else 0} mem_total={MEM_TOTAL}"
    )
    if samples:
        text += " samples=" + ",".join(f"{t}:{u}" for t, u in samples)
    return text + "\n" + (f"proc {index} pid={pid} used={MEM_USED}\n" if holds else "")


def _write(script: str, text: str) -> None:
    tmp = f"{script}.{os.getpid()}.tmp"  # not *.txt: the library never reads it half-written
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, script)  # a new inode: the library reads it again


def _change(samples: deque[tuple[int, int]], at_us: int, old: int, new: int) -> int:
    """A change of phase at ``at_us`` from ``old`` to ``new``: the old phase lasted until then, and a sample taken
    since (the news comes through a pipe, a moment late) was of the new phase."""
    revised = sorted([(t, new if t > at_us else u) for t, u in samples] + [(at_us, old)])
    samples.clear()
    samples.extend(revised)
    return new


def main(script: str, index: int, pid: int) -> None:
    util, holds = BUSY, True
    samples: deque[tuple[int, int]] = deque(maxlen=KEEP)
    next_sample = time.time() + SAMPLE_SECONDS
    _write(script, _line(index, pid, util, holds, samples))
    pending = ""
    while holds:
        ready, _, _ = select.select([sys.stdin], [], [], max(0.0, next_sample - time.time()))
        if ready:
            chunk = os.read(sys.stdin.fileno(), 4096).decode()
            if not chunk:  # the job is gone without a word: its GPU goes with it
                samples.append((int(time.time() * 1e6), util))
                util, holds = 0, False
            pending += chunk
            while "\n" in pending:
                line, pending = pending.split("\n", 1)
                words = line.split()
                if words[0] == "release":
                    util, holds = _change(samples, int(float(words[1]) * 1e6), util, 0), False
                else:
                    util = _change(samples, int(float(words[0]) * 1e6), util, int(words[1]))
            _write(script, _line(index, pid, util, holds, samples))
        now = time.time()
        if now >= next_sample and holds:
            samples.append((int(now * 1e6), util))
            _write(script, _line(index, pid, util, holds, samples))
            next_sample = max(next_sample + SAMPLE_SECONDS, now)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
