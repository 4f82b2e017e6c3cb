"""Writes checkpoints with the real training libraries, as their users do, into the directory given (run as
``python -m tests.framework_checkpoints OUT``): a Hugging Face Trainer on a tiny GPT-2 (checkpoint-5, -10, -15),
Lightning's ModelCheckpoint (one ``.ckpt`` per epoch), Accelerate's ``save_state`` (with automatic naming, twice, and
once into a directory of its own with ``pytorch_model.bin`` and a custom object), ``torch.distributed.checkpoint``
``dcp.save`` and a legacy-format ``torch.save``. No model or data set is downloaded: the model is built from a config
and the data are random tokens made here. Prints one JSON object: what was written, by kind.

``OUT --fresh``: only the Trainer and Accelerate, then it stays alive (a training job after its saves) until its
standard input closes. ``OUT --interrupt before|during``: two Accelerate ``save_state`` with automatic naming, then a
third that stops, the process alive, where a kill would cut it: ``before`` its random states are written (the model,
optimizer and scheduler states are), ``during`` (``random_states_0.pkl`` half written and held open). It prints
``{"pid": ..., "state": the third save's directory}`` when stopped there, and waits to be killed.

Run in a process of its own so that the libraries (and their threads and warnings) never enter the test process.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402


class RandomTokens(Dataset[dict[str, torch.Tensor]]):
    """Random token sequences, the labels their own inputs (causal language modelling)."""

    def __init__(self, count: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (count, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def hf_trainer(out: Path) -> list[str]:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32)
    args = TrainingArguments(
        output_dir=str(out),
        use_cpu=True,
        max_steps=15,
        save_steps=5,
        save_strategy="steps",
        per_device_train_batch_size=4,
        report_to=[],
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=RandomTokens(64, 16, 100))
    trainer.train()
    return sorted(str(p) for p in out.glob("checkpoint-*"))


def lightning_checkpoints(out: Path) -> list[str]:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Regressor(L.LightningModule):
        def __init__(self, lr: float = 0.05, hidden: int = 8) -> None:
            super().__init__()
            self.save_hyperparameters()  # Lightning pickles these into the .ckpt
            self.layer = nn.Linear(hidden, 2)

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    data = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 2)), batch_size=8)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out.parent / "lightning-root"),
        callbacks=[ModelCheckpoint(dirpath=str(out), save_top_k=-1, every_n_epochs=1)],
    )
    trainer.fit(Regressor(), data)
    return sorted(str(p) for p in out.glob("*.ckpt"))


class Counter:
    """A custom object registered with Accelerate: saved as custom_checkpoint_0.pkl."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]


def accelerate_training(out: Path) -> tuple[Any, Any]:
    """An Accelerator (its project in ``out/auto``) prepared with a model, optimizer, scheduler, data loader and a
    custom object, and a function that trains one epoch."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(out / "auto")))
    model = nn.Linear(8, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    data = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 2)), batch_size=8, shuffle=True)
    model, optimizer, data, scheduler = accelerator.prepare(model, optimizer, data, scheduler)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)

    def epoch() -> None:
        for x, y in data:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            counter.steps += 1

    return accelerator, epoch


def accelerate_states(out: Path) -> list[str]:
    accelerator, epoch = accelerate_training(out)
    written = []
    epoch()
    plain = out / "plain" / "ckpt"
    accelerator.save_state(str(plain), safe_serialization=False)  # pytorch_model.bin
    written.append(str(plain))
    accelerator.project_configuration.automatic_checkpoint_naming = True
    for _ in range(2):
        epoch()
        accelerator.save_state()  # auto/checkpoints/checkpoint_N, model.safetensors
    written += sorted(str(p) for p in (out / "auto" / "checkpoints").glob("checkpoint_*"))
    return written


def dcp_save(out: Path) -> list[str]:
    import torch.distributed.checkpoint as dcp

    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    # One process and no process group: dcp.save runs without one.
    path = out / "step-100"
    dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=str(path))
    return [str(path)]


def legacy_save(out: Path) -> list[str]:
    model = nn.Linear(16, 4)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "model.pt"
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}
    torch.save(state, path, _use_new_zipfile_serialization=False)
    return [str(path)]


def accelerate_interrupted(out: Path, where: str) -> None:
    """Two save_state, then a third stopped where a kill would cut it (the module doc), until killed."""
    import io
    import time

    accelerator, epoch = accelerate_training(out)
    accelerator.project_configuration.automatic_checkpoint_naming = True
    for _ in range(2):
        epoch()
        accelerator.save_state()
    epoch()
    real_save = torch.save

    def stop_at_random_states(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        # Accelerate's checkpointing calls torch.save for the random states (and, through its own save(), for the
        # optimizer and scheduler states before them): the stop is at the first random states file.
        if not (isinstance(f, str | os.PathLike) and os.path.basename(f).startswith("random_states_")):
            real_save(obj, f, *args, **kwargs)
            return
        held = None
        if where == "during":
            whole = io.BytesIO()
            real_save(obj, whole)
            held = open(f, "wb")  # noqa: SIM115 (held open until the process is killed)
            held.write(whole.getvalue()[: len(whole.getvalue()) // 2])
            held.flush()
        sys.stdout.write(json.dumps({"pid": os.getpid(), "state": os.path.dirname(os.path.abspath(f))}) + "\n")
        sys.stdout.flush()
        while True:
            time.sleep(3600)

    torch.save = stop_at_random_states
    accelerator.save_state()


def fresh(out: Path) -> None:
    """The Trainer's and Accelerate's saves, then alive (a job training on) until standard input closes."""
    written = {"hf-trainer": hf_trainer(out / "hf"), "accelerate": accelerate_states(out / "accelerate")}
    sys.stdout.write(json.dumps(written) + "\n")
    sys.stdout.flush()
    sys.stdin.read()


def main(out: Path) -> None:
    torch.manual_seed(0)
    written = {
        "hf-trainer": hf_trainer(out / "hf"),
        "lightning": lightning_checkpoints(out / "lightning"),
        "accelerate": accelerate_states(out / "accelerate"),
        "torch-dcp": dcp_save(out / "dcp"),
        "torch-legacy": legacy_save(out / "legacy"),
    }
    sys.stdout.write(json.dumps(written) + "\n")


if __name__ == "__main__":
    if sys.argv[2:3] == ["--fresh"]:
        torch.manual_seed(0)
        fresh(Path(sys.argv[1]))
    elif sys.argv[2:3] == ["--interrupt"]:
        torch.manual_seed(0)
        accelerate_interrupted(Path(sys.argv[1]), sys.argv[3])
    else:
        main(Path(sys.argv[1]))
