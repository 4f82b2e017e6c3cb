"""A CPU torch training loop for the end-to-end tests: it trains a small model, checkpoints, and plays the GPU's part
through the fake NVML library's script: while it computes, its "GPU" is busy; while it is blocked in a save, idle,
with its memory still held. It measures the time it spends blocked in saves itself and writes that, with each save's
span, to a JSON file at the end.

How it saves (``--writer``): ``atomic`` with storwatch.training.atomic_save; the others as jobs that never import
storwatch do: ``plain`` torch.save into ``step-N.pt`` then fsync; ``trainer`` a Hugging Face Trainer's
``checkpoint-N/`` directory (model.safetensors, optimizer.pt, trainer_state.json, config.json), each file fsynced;
``dcp`` torch.distributed.checkpoint.save into ``step-N/`` (which fsyncs its files).

Usage: python -m tests.training_loop RUN_DIR NVML_SCRIPT RESULT_JSON [--saves N] [--compute S] [--mib M]
       [--writer atomic|plain|trainer|dcp]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
import threading
import time
from collections import deque
from typing import Any

import torch

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


def slow_disk(seconds: float) -> None:
    """Make every regular file's fsync in this process take ``seconds`` more, as on a disk slow to flush.

    For a loop on tmpfs, where a save of a few MiB is over in milliseconds: the agent confirms a writer by seeing it
    hold the checkpoint open (it looks every 0.25 s), and a save that short is seldom seen. The file stays open
    through the wait, exactly as it does while a slow device flushes; only the device is simulated."""
    real = os.fsync

    def fsync(fd: Any) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            time.sleep(seconds)
        real(fd)

    os.fsync = fsync


def _fsynced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save(writer: str, run_dir: str, i: int, step: int, state: dict[str, Any]) -> tuple[float, float, str]:
    """One checkpoint as ``writer`` makes it: (start, end, path), the span by this process's clock."""
    start = time.time()
    if writer == "atomic":
        from storwatch.training import atomic_save  # the only writer that imports storwatch

        event = atomic_save(state, os.path.join(run_dir, f"step-{i:04d}.pt"), step=step)
        return event.start, event.end, event.path
    if writer == "plain":
        path = os.path.join(run_dir, f"step-{i:04d}.pt")
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    elif writer == "trainer":
        from safetensors.torch import save as safetensors_bytes

        path = os.path.join(run_dir, f"checkpoint-{step}")
        os.mkdir(path)
        weights = {k: v.contiguous() for k, v in state["model"].items()} | {"ballast": state["ballast"]}
        _fsynced(os.path.join(path, "model.safetensors"), safetensors_bytes(weights))
        with open(os.path.join(path, "optimizer.pt"), "wb") as f:
            torch.save(state["opt"], f)
            f.flush()
            os.fsync(f.fileno())
        _fsynced(os.path.join(path, "trainer_state.json"), json.dumps({"global_step": step}).encode())
        _fsynced(os.path.join(path, "config.json"), json.dumps({"model_type": "mlp"}).encode())
    elif writer == "dcp":
        import torch.distributed.checkpoint as dcp

        path = os.path.join(run_dir, f"step-{i:04d}")
        dcp.save({"model": state["model"], "ballast": state["ballast"]}, checkpoint_id=path)
    else:
        raise SystemExit(f"unknown writer {writer!r}")
    return start, time.time(), path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("script")
    ap.add_argument("result")
    ap.add_argument("--saves", type=int, default=5)
    ap.add_argument("--compute", type=float, default=1.5)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--writer", choices=("atomic", "plain", "trainer", "dcp"), default="atomic")
    ap.add_argument("--keep", type=int, default=0, help="remove all but the newest N checkpoints (0: keep all)")
    ap.add_argument("--fsync-seconds", type=float, default=0.0, help="each file's fsync takes this long at least")
    ap.add_argument(
        "--start-file",
        help="hold the GPU (computing) but start the first step only once this file exists (at most 120 s): the "
        "test lets the job go once the agent knows its process, as it would long before a real job's first save",
    )
    args = ap.parse_args()
    if args.fsync_seconds:
        slow_disk(args.fsync_seconds)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ballast = torch.randn(args.mib * (1 << 20) // 4)  # optimizer state and the rest of a real checkpoint
    blocked = 0.0
    saves = []
    step = 0
    gpu = FakeGPU(args.script)
    if args.start_file:
        gate = time.monotonic() + 120
        while not os.path.exists(args.start_file):
            if time.monotonic() > gate:
                sys.exit(f"{args.start_file} did not appear within 120 s")
            time.sleep(0.05)
    for i in range(args.saves):
        until = time.monotonic() + args.compute
        while time.monotonic() < until:
            x = torch.randn(64, 256)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        # The state is gathered while the GPU still works: the idle phase begins as the write does.
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "ballast": ballast, "step": step}
        gpu.phase(2)
        started = time.perf_counter()
        start, end, path = save(args.writer, args.run_dir, i, step, state)
        blocked += time.perf_counter() - started
        gpu.phase(97)
        saves.append({"start": start, "end": end, "path": path})
        if args.keep and len(saves) > args.keep:  # as the Trainer's save_total_limit does
            old = saves[-args.keep - 1]["path"]
            if os.path.isdir(old):
                shutil.rmtree(old)
            else:
                os.unlink(old)
    # computing on for a moment, then the job ends (its "GPU" keeps no process)
    time.sleep(args.compute)
    gpu.stop.set()
    gpu.thread.join()
    with open(args.result, "w") as f:
        imported = sorted(m for m in sys.modules if m == "storwatch" or m.startswith("storwatch."))
        json.dump(
            {"pid": os.getpid(), "blocked_seconds": blocked, "saves": saves, "steps": step, "imported": imported}, f
        )


if __name__ == "__main__":
    main()
