"""Training jobs that save their checkpoints each in one of the ways people save them, for the end-to-end tests of the
agent's join (tests/test_e2e_writers.py). None imports storwatch: the agent learns of them only from the kernel and
the GPU's driver.

Each job plays its GPU's part through the fake NVML library (tests/fake_gpu.py: a helper process that samples as the
driver does, 5 samples a second, about 14 s kept, its own NVML index in a script directory): busy while it computes,
idle while it is blocked in a save, with its memory held throughout. Its CPU waits while its "GPU" computes (a step,
then a pause), as a GPU job's does, so that many jobs share two cores. It measures the time it spends blocked in each
save itself and writes that, with each save's span and path, to a JSON file after each save and once more when it has
been told to stop.

How it saves (WAY):
- ``fsync_same``: ``torch.save`` into an open file, flush, fsync it, close;
- ``reopen_fsync``: ``torch.save(state, path)``, then the file opened again (read-only) and fsynced;
- ``no_fsync``: ``torch.save(state, path)`` and nothing more (the test puts it on a mount where the dirty pages are
  throttled, or where the page cache takes them);
- ``tmp_rename``: ``torch.save`` into ``NAME.tmp``, flush, fsync, close, rename onto ``NAME`` (hand-written atomic
  saves);
- ``dcp``: ``torch.distributed.checkpoint.save`` into ``step-N/`` (it fsyncs its files);
- ``lightning``: a real Lightning Trainer with its ModelCheckpoint (every N steps, every checkpoint kept): Lightning
  saves into a temporary file (``tempfile.mkstemp``, in TMPDIR) and moves it into place;
- ``hf_trainer``: a real Hugging Face Trainer at its defaults (a ``checkpoint-N/`` directory every N steps: safetensors
  weights, optimizer, scheduler, RNG state, trainer state; nothing fsynced), on a GPT-2 built from a config (no
  download).

Usage: python -m tests.saving_jobs WAY RUN_DIR NVML_SCRIPT RESULT_JSON --gpu I --start-file F --stop-file F
       [--saves N] [--compute S] [--mib M] [--gate-seconds S]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from tests.fake_gpu import DriverGPU  # noqa: E402

WAYS = ("fsync_same", "reopen_fsync", "no_fsync", "tmp_rename", "dcp", "lightning", "hf_trainer")
STEP_SECONDS = 0.25
"""The GPU's time for one training step: the job's CPU waits it out."""
GATE_SECONDS = 180.0
"""The longest a job waits for its start file, and, after its last save, for its stop file (``--gate-seconds``)."""


class Job:
    """What every job shares: its GPU, its clock of blocked time, and its saves."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.gpu = DriverGPU(args.script, args.gpu)
        self.blocked = 0.0
        self.saves: list[dict[str, Any]] = []

    def wait_for(self, path: str, what: str) -> None:
        deadline = time.monotonic() + self.args.gate_seconds
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                self.gpu.release()
                sys.exit(f"{what} ({path}) did not appear within {self.args.gate_seconds:.0f} s")
            time.sleep(0.05)

    def saving(self, path: str, save: Callable[[], None]) -> None:
        """One save, with the GPU idle while the job is blocked in it."""
        self.gpu.phase(2)
        start, started = time.time(), time.perf_counter()
        save()
        self.blocked += time.perf_counter() - started
        end = time.time()
        self.gpu.phase(97)
        self.saves.append({"start": start, "end": end, "path": path})
        self.write_result(done=False)

    def finish(self) -> None:
        """Compute on after the last save (a long job's next save is far off) until told to stop; then let the GPU go
        and write what the job measured."""
        self.wait_for(self.args.stop_file, "the stop file")
        self.gpu.release()
        self.write_result(done=True)

    def write_result(self, done: bool) -> None:
        """What the job measured so far (after each save, and once more at the end, with ``done``)."""
        imported = sorted(m for m in sys.modules if m == "storwatch" or m.startswith("storwatch."))
        result = {
            "pid": os.getpid(),
            "blocked_seconds": self.blocked,
            "saves": self.saves,
            "imported": imported,
            "tempdir": tempfile.gettempdir(),
            "done": done,
        }
        tmp = f"{self.args.result}.part"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, self.args.result)


def gpu_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """One training step on a small batch, then the CPU waits while the "GPU" computes."""
    x = torch.randn(8, 256)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(STEP_SECONDS)


def torch_save_way(job: Job, way: str) -> None:
    args = job.args
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ballast = torch.randn(args.mib * (1 << 20) // 4)  # the optimizer state and the rest of a real checkpoint
    job.wait_for(args.start_file, "the start file")
    step = 0
    for i in range(args.saves):
        until = time.monotonic() + args.compute
        while time.monotonic() < until:
            gpu_step(model, opt)
            step += 1
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "ballast": ballast, "step": step}
        path = os.path.join(args.run_dir, f"step-{i:04d}" if way == "dcp" else f"step-{i:04d}.pt")
        job.saving(path, functools.partial(save_torch, way, path, state))
    job.finish()


def save_torch(way: str, path: str, state: dict[str, Any]) -> None:
    if way == "fsync_same":
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    elif way == "reopen_fsync":
        torch.save(state, path)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    elif way == "no_fsync":
        torch.save(state, path)
    elif way == "tmp_rename":
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    elif way == "dcp":
        import torch.distributed.checkpoint as dcp

        # One process and no process group: dcp.save runs without one.
        dcp.save({"model": state["model"], "ballast": state["ballast"]}, checkpoint_id=path)
    else:
        raise SystemExit(f"unknown way {way!r}")


def lightning_way(job: Job) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    args = job.args
    steps = max(1, round(args.compute / STEP_SECONDS))
    width = max(64, int((args.mib * (1 << 20) / 4 / 3) ** 0.5))  # weights and Adam's two moments: about args.mib

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(width, width)

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            (x,) = batch
            return self.layer(x).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class GPUTime(Callback):
        def on_train_batch_end(self, *_: Any) -> None:
            time.sleep(STEP_SECONDS)

    class TimedCheckpoint(ModelCheckpoint):
        """Lightning's ModelCheckpoint, its save (Trainer.save_checkpoint: the checkpoint IO's atomic save) timed."""

        def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
            job.saving(filepath, lambda: super(TimedCheckpoint, self)._save_checkpoint(trainer, filepath))

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = DataLoader(TensorDataset(torch.randn(steps * args.saves * 2, width)), batch_size=1)
    trainer = L.Trainer(
        max_steps=steps * args.saves,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=os.path.dirname(args.result),
        callbacks=[TimedCheckpoint(dirpath=args.run_dir, every_n_train_steps=steps, save_top_k=-1), GPUTime()],
    )
    model = Regressor()
    job.wait_for(args.start_file, "the start file")
    trainer.fit(model, data)
    job.finish()


def hf_trainer_way(job: Job) -> None:
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    args = job.args
    steps = max(1, round(args.compute / STEP_SECONDS))

    class RandomTokens(Dataset[dict[str, torch.Tensor]]):
        def __init__(self, count: int, length: int, vocab: int) -> None:
            self.ids = torch.randint(0, vocab, (count, length), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class GPUTime(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            time.sleep(STEP_SECONDS)

    class TimedTrainer(Trainer):
        """The Trainer at its defaults, its save (``_save_checkpoint``: the whole checkpoint-N directory) timed."""

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            path = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
            job.saving(path, lambda: super(TimedTrainer, self)._save_checkpoint(model, trial))

    torch.manual_seed(0)
    torch.set_num_threads(1)
    # About args.mib of checkpoint: weights, and AdamW's two moments in optimizer.pt.
    embd = 256
    layers = max(1, round(args.mib * (1 << 20) / 3 / 4 / (12 * embd * embd)))
    config = GPT2Config(n_layer=layers, n_embd=embd, n_head=4, vocab_size=512, n_positions=32)
    training = TrainingArguments(
        output_dir=args.run_dir,
        use_cpu=True,
        max_steps=steps * args.saves,
        save_steps=steps,
        per_device_train_batch_size=2,
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = TimedTrainer(
        model=GPT2LMHeadModel(config),
        args=training,
        train_dataset=RandomTokens(steps * args.saves * 2, 16, 512),
        callbacks=[GPUTime()],
    )
    job.wait_for(args.start_file, "the start file")
    trainer.train()
    job.finish()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("way", choices=WAYS)
    ap.add_argument("run_dir")
    ap.add_argument("script", help="this job's file in the fake NVML library's script directory")
    ap.add_argument("result")
    ap.add_argument("--gpu", type=int, required=True, help="the NVML index of this job's GPU")
    ap.add_argument("--start-file", required=True, help="hold the GPU (computing) until this file exists")
    ap.add_argument("--stop-file", required=True, help="after the last save, compute on until this file exists")
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--compute", type=float, default=5.0, help="seconds of computing before each save")
    ap.add_argument("--mib", type=int, default=32, help="about this many MiB a checkpoint")
    ap.add_argument("--gate-seconds", type=float, default=GATE_SECONDS, help="the longest wait for each gate file")
    args = ap.parse_args()
    job = Job(args)
    try:
        if args.way == "lightning":
            lightning_way(job)
        elif args.way == "hf_trainer":
            hf_trainer_way(job)
        else:
            torch_save_way(job, args.way)
    finally:
        job.gpu.release()  # once it has ended, or failed: its GPU goes all the same


if __name__ == "__main__":
    main()
