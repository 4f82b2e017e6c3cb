"""A training job of one framework, joined to storwatch with its one line as a user writes it (run as ``python -I
tests/callback_jobs.py FRAMEWORK OUT``): the Hugging Face Trainer on a tiny GPT-2, Lightning with a ModelCheckpoint,
or an Accelerate loop with automatic checkpoint naming. It imports nothing of storwatch's agent nor of the tests
(``-I``: with ``--sys-path`` the tree holding ``storwatch_training``, else the installed distribution), so it runs in
a fresh virtual environment holding only the framework and ``storwatch-training``. A job of several processes:
the Trainer and Accelerate under ``torchrun``, Lightning with ``--processes N`` (its own DDP launcher); the process of
rank 0 prints and records as below.

Each step sleeps ``--step-seconds`` (its "compute"); at each step's end, before the callback looks, the job appends
``{"step", "t", "request"}`` to ``OUT/boundaries.jsonl`` (``request``: the agent's request file is there now). It
prints ``{"ready": true, "pid", "run_dir"}`` at its first step's end (the callback's handler is installed by then),
saves by itself every ``--save-every`` steps (0: never, only when asked) keeping ``--keep`` (0: all), and stops at
the first step's end after ``OUT/stop`` appears (or after ``--max-steps``), printing ``{"done": true,
"agent_imported": ...}``. No model or data set is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
warnings.filterwarnings("ignore")

REQUEST_NAME = ".storwatch-checkpoint-request"


def rank() -> int:
    """This process's rank in a job of several (torchrun sets RANK; Lightning's own launcher, LOCAL_RANK)."""
    return int(os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or 0)


class Boundaries:
    """What the job records at each step's end, before the callback looks (a process of rank N > 0 in
    ``boundaries-rankN.jsonl``, and it prints nothing)."""

    def __init__(self, out: Path, run_dir: Path) -> None:
        self.out = out
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)  # the job's output directory, as the agent would find it
        name = "boundaries.jsonl" if rank() == 0 else f"boundaries-rank{rank()}.jsonl"
        self.log = open(out / name, "a", buffering=1)  # noqa: SIM115 - open for the job's life
        self.ready = rank() != 0

    def step_end(self, step: int) -> bool:
        """Record the boundary; whether the job should stop."""
        request = (self.run_dir / REQUEST_NAME).exists()
        self.log.write(json.dumps({"step": step, "t": time.time(), "request": request}) + "\n")
        if not self.ready:
            self.ready = True
            print(json.dumps({"ready": True, "pid": os.getpid(), "run_dir": str(self.run_dir)}), flush=True)
        return (self.out / "stop").exists()


def transformers_job(out: Path, args: argparse.Namespace) -> None:
    import torch
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from storwatch_training.transformers import StorwatchCallback

    class RandomTokens(Dataset[dict[str, torch.Tensor]]):
        def __init__(self, count: int) -> None:
            self.ids = torch.randint(0, 100, (count, 16), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    run_dir = out / "run"
    boundaries = Boundaries(out, run_dir)

    class Job(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, a: Any, state: Any, control: Any, **kwargs: Any) -> None:
            time.sleep(args.step_seconds)

        def on_step_end(self, a: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if boundaries.step_end(state.global_step):
                control.should_training_stop = True

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32)
    training = TrainingArguments(
        output_dir=str(run_dir),
        use_cpu=True,
        max_steps=args.max_steps,
        save_strategy="steps" if args.save_every else "no",
        save_steps=args.save_every or 500,
        save_total_limit=args.keep or None,
        per_device_train_batch_size=2,
        report_to=[],
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=training,
        train_dataset=RandomTokens(2 * args.max_steps),
        callbacks=[Job(), StorwatchCallback()],  # the job's boundary first, so it is recorded before the look
    )
    trainer.train()


def lightning_job(out: Path, args: argparse.Namespace) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from storwatch_training.lightning import StorwatchCallback

    run_dir = out / "run"
    boundaries = Boundaries(out, run_dir)

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 2)

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=0.01)

    class Job(Callback):
        def on_train_batch_start(self, *a: Any) -> None:
            time.sleep(args.step_seconds)

        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            if boundaries.step_end(trainer.global_step):
                trainer.should_stop = True

    count = args.max_steps * args.processes
    data = DataLoader(TensorDataset(torch.randn(count, 8), torch.randn(count, 2)), batch_size=1)
    periodic = ModelCheckpoint(
        dirpath=str(run_dir), every_n_train_steps=args.save_every, every_n_epochs=0, save_top_k=1
    )
    trainer = L.Trainer(
        max_epochs=1,
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=args.processes,
        strategy="ddp" if args.processes > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out),
        callbacks=[Job(), StorwatchCallback(), periodic],
    )
    trainer.fit(Regressor(), data)


def accelerate_job(out: Path, args: argparse.Namespace) -> None:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration
    from torch import nn

    from storwatch_training.accelerate import StorwatchCheckpoints

    config = ProjectConfiguration(
        project_dir=str(out / "project"), automatic_checkpoint_naming=True, total_limit=args.keep or None
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    checkpoints = StorwatchCheckpoints(accelerator)
    boundaries = Boundaries(out, Path(checkpoints.run_dir))
    for step in range(1, args.max_steps + 1):
        time.sleep(args.step_seconds)
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        accelerator.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        if args.save_every and step % args.save_every == 0:
            accelerator.save_state()
        stop = boundaries.step_end(step)
        checkpoints.step_end(step)
        if stop:
            break
    checkpoints.close()


JOBS = {"transformers": transformers_job, "lightning": lightning_job, "accelerate": accelerate_job}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("framework", choices=sorted(JOBS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--sys-path", help="put this tree first on sys.path (where storwatch_training is)")
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--step-seconds", type=float, default=0.05)
    ap.add_argument("--keep", type=int, default=0, help="checkpoints the framework keeps (0: all)")
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument(
        "--processes", type=int, default=1, help="Lightning's own DDP processes (the others: start under torchrun)"
    )
    args = ap.parse_args()
    if args.sys_path:
        sys.path.insert(0, args.sys_path)
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    JOBS[args.framework](args.out, args)
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    if distributed:
        # As a well-made training script ends: every process at the barrier, then the process group let go.
        dist.barrier()
        dist.destroy_process_group()
    agent = sorted(m for m in sys.modules if m == "storwatch" or m.startswith("storwatch."))
    if rank() == 0:
        print(json.dumps({"done": True, "agent_imported": agent}), flush=True)
    if distributed:
        # Done, and the job's files written: each process leaves without the interpreter's finalization. There gloo's
        # worker threads were still torn down under it now and then, destroy_process_group or not (a rank aborted
        # with "terminate called without an active exception" after the job was done, in two full runs under mount
        # churn; pytorch/pytorch#179291 describes the teardown), and the launcher then failed the job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
