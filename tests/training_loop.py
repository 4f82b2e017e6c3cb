"""A CPU torch training loop for the end-to-end test: it trains a small model, checkpoints with
storwatch.training.atomic_save, and plays the GPU's part through the fake NVML library's script: while it computes,
its "GPU" is busy; while it is blocked in a save, idle, with its memory still held. It measures the time it spends
blocked in saves itself and writes that, with each save's span, to a JSON file at the end.

Usage: python -m tests.training_loop RUN_DIR NVML_SCRIPT RESULT_JSON [--saves N] [--compute S] [--mib M]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import deque

import torch

from storwatch.training import atomic_save

MEM_USED = 30 << 30
MEM_TOTAL = 80 << 30


class FakeGPU:
    """The loop's "GPU" as the fake NVML library shows it: a sample every 20 ms of what the loop was doing (busy or
    blocked), with the exact moment of each change, written into the library's script with their timestamps (as the
    driver keeps real samples), together with this process holding its memory."""

    PERIOD = 0.02

    def __init__(self, script: str) -> None:
        self.script = script
        self.util = 97
        self.samples: deque[tuple[int, int]] = deque(maxlen=120)  # 2.4 s (the library keeps 128): read every 0.1 s
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def phase(self, util: int) -> None:
        with self.lock:
            self.samples.append((int(time.time() * 1e6), self.util))  # the old phase lasted until now
            self.util = util
        self._write()

    def _run(self) -> None:
        while not self.stop.wait(self.PERIOD):
            with self.lock:
                self.samples.append((int(time.time() * 1e6), self.util))
            self._write()

    def _write(self) -> None:
        with self.lock:
            samples = ",".join(f"{t}:{u}" for t, u in self.samples)
            util = self.util
        text = (
            f"gpu 0 uuid=GPU-e2e-0000 name=Fake_Trainer util={util} mem_util={util // 2} mem_used={MEM_USED} "
            f"mem_total={MEM_TOTAL}" + (f" samples={samples}" if samples else "") + "\n"
            f"proc 0 pid={os.getpid()} used={MEM_USED}\n"
        )
        tmp = f"{self.script}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.script)  # a new inode: the library reads it again


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("script")
    ap.add_argument("result")
    ap.add_argument("--saves", type=int, default=5)
    ap.add_argument("--compute", type=float, default=1.5)
    ap.add_argument("--mib", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ballast = torch.randn(args.mib * (1 << 20) // 4)  # optimizer state and the rest of a real checkpoint
    blocked = 0.0
    saves = []
    step = 0
    gpu = FakeGPU(args.script)
    for i in range(args.saves):
        until = time.monotonic() + args.compute
        while time.monotonic() < until:
            x = torch.randn(64, 256)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        gpu.phase(2)
        started = time.perf_counter()
        event = atomic_save(
            {"model": model.state_dict(), "opt": opt.state_dict(), "ballast": ballast, "step": step},
            os.path.join(args.run_dir, f"step-{i:04d}.pt"),
            step=step,
        )
        blocked += time.perf_counter() - started
        gpu.phase(97)
        saves.append({"start": event.start, "end": event.end, "bytes": event.bytes})
    # computing on for a moment, then the job ends (its "GPU" keeps no process)
    time.sleep(args.compute)
    gpu.stop.set()
    gpu.thread.join()
    with open(args.result, "w") as f:
        json.dump({"pid": os.getpid(), "blocked_seconds": blocked, "saves": saves, "steps": step}, f)


if __name__ == "__main__":
    main()
