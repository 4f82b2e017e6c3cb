"""A checkpoint removed by its job's rotation while storwatch checks it deeply (Lightning's save_top_k, the Trainer's
save_total_limit delete the older saves as each new one lands) is no damage: the torch.load child reads the file
through a descriptor the check opened, so a removal after that leaves what it reads whole, and a file already gone
is said to be gone, never "corrupt". A real torch checkpoint and a real child process; the removal is made to land
between the check's open and the child's load by running it just before the child starts (the one moment that cannot
be timed from outside)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from storwatch.checkpoints import deep  # noqa: E402
from storwatch.checkpoints.limits import Deadline, DeepLimits  # noqa: E402


def _save(path: Path) -> int:
    torch.save({"w": torch.arange(1024, dtype=torch.float32)}, path)
    return path.stat().st_size


def test_a_checkpoint_removed_while_it_is_loaded_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "epoch=1.ckpt"
    size = _save(path)
    real = subprocess.Popen

    def rotate_then_start(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        path.unlink()  # the job's rotation lands here, after the check opened the file
        return real(*args, **kwargs)

    monkeypatch.setattr(deep.subprocess, "Popen", rotate_then_start)
    verdict, reason = deep.torch_load_in_child(str(path), size, DeepLimits(), Deadline(60.0))
    assert not path.exists()
    assert verdict == "complete", reason


def test_a_checkpoint_gone_before_the_load_is_said_to_be_gone(tmp_path: Path) -> None:
    path = tmp_path / "epoch=0.ckpt"
    size = _save(path)
    os.unlink(path)
    verdict, reason = deep.torch_load_in_child(str(path), size, DeepLimits(), Deadline(60.0))
    assert verdict == "unknown" and reason == deep.GONE_BEFORE_LOAD
    assert "corrupt" not in reason


def test_a_truncated_checkpoint_is_still_corrupt(tmp_path: Path) -> None:
    """Reading through the descriptor changes nothing for a damaged file."""
    path = tmp_path / "bad.pt"
    size = _save(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    verdict, reason = deep.torch_load_in_child(str(path), size // 2, DeepLimits(), Deadline(60.0))
    assert verdict == "corrupt" and reason.startswith("torch.load failed:"), reason
