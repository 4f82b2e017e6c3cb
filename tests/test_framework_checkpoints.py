"""Checkpoints written by the real training libraries (tests/framework_checkpoints.py: the Hugging Face Trainer with
Accelerate on a tiny GPT-2, Lightning's ModelCheckpoint, Accelerate's save_state, dcp.save, a legacy-format
torch.save), judged by ``storwatch verify`` as a process and by the checkpoint source the agent runs: every one is
found once, as the checkpoint it is (an Accelerate save_state directory is one checkpoint, not one per file), and
is complete. Written once per module; the files are dated two hours back, as a run's settled checkpoints are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storwatch.checkpoints import check
from storwatch.config import CheckpointsConfig
from storwatch.sources.checkpoints import CheckpointSource
from tests.agentproc import REPO_ROOT

pytestmark = pytest.mark.realpart

LIBRARIES = ("torch", "transformers", "accelerate", "lightning")
SETTLED = 2 * 3600


def _missing_libraries() -> list[str]:
    import importlib.util

    return [name for name in LIBRARIES if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
    """The root the libraries wrote into, and what each wrote (kind -> checkpoint paths)."""
    missing = _missing_libraries()
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (make's install step adds them beside torch==2.13.0)")
    root = tmp_path_factory.mktemp("frameworks")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.framework_checkpoints", str(root)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    kinds: dict[str, list[str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    settled = time.time() - SETTLED
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.utime(os.path.join(top, name), (settled, settled), follow_symlinks=False)
    return root, kinds


def _expected(kinds: dict[str, list[str]]) -> dict[str, str]:
    """Checkpoint path -> the format it must be taken for."""
    fmt = {"lightning": "torch-zip"}
    return {path: fmt.get(kind, kind) for kind, paths in kinds.items() for path in paths}


def test_each_library_wrote_what_it_writes(written: tuple[Path, dict[str, list[str]]]) -> None:
    # The control: the layouts are the libraries' own, so the tests below judge what users have on disk.
    _, kinds = written
    assert [Path(p).name for p in kinds["hf-trainer"]] == ["checkpoint-10", "checkpoint-15", "checkpoint-5"]
    for step in kinds["hf-trainer"]:
        names = set(os.listdir(step))
        assert {"training_args.bin", "optimizer.pt", "rng_state.pth", "trainer_state.json"} <= names, names
    assert len(kinds["lightning"]) == 2
    assert len(kinds["accelerate"]) == 3
    for state in kinds["accelerate"]:
        names = set(os.listdir(state))
        assert {"optimizer.bin", "scheduler.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl"} <= names, names
        assert names & {"model.safetensors", "pytorch_model.bin"}, names
    (legacy,) = kinds["torch-legacy"]
    assert not Path(legacy).read_bytes().startswith(b"PK")  # not a ZIP: the legacy format


def test_verify_calls_every_library_checkpoint_complete(written: tuple[Path, dict[str, list[str]]]) -> None:
    root, kinds = written
    proc = subprocess.run(
        [sys.executable, "-m", "storwatch", "verify", "--json", str(root)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    results = json.loads(proc.stdout)
    found = {r["path"]: (r["format"], r["verdict"]) for r in results}
    expected = _expected(kinds)
    assert found == {path: (fmt, "complete") for path, fmt in expected.items()}, proc.stdout
    assert proc.returncode == 0, proc.stderr
    for r in results:
        # What the Trainer pickles into training_args.bin (AcceleratorConfig among it) is on the allow-list.
        assert "transformers.trainer_pt_utils.AcceleratorConfig" not in r["unknown_globals"], r
        if r["notes"]:
            print(f"{r['path']}: {r['notes']}")


def test_verify_deep_loads_each_kind_with_torch(written: tuple[Path, dict[str, list[str]]]) -> None:
    _, kinds = written
    one_each = [kinds["hf-trainer"][1], kinds["lightning"][-1], kinds["accelerate"][0], *kinds["torch-legacy"]]
    proc = subprocess.run(
        [sys.executable, "-m", "storwatch", "verify", "--deep", "--json", *one_each],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    results = json.loads(proc.stdout)
    assert [(r["path"], r["verdict"], r["deep"]) for r in results] == [(p, "complete", True) for p in one_each]
    assert proc.returncode == 0


def test_the_agents_source_calls_every_library_checkpoint_complete(
    written: tuple[Path, dict[str, list[str]]],
) -> None:
    root, kinds = written
    source = CheckpointSource([str(root)], CheckpointsConfig(deep_per_scan=0))
    try:
        facts = source.collect()
    finally:
        source.close()
    found = {c.path: (c.format, c.verdict) for run in facts.runs for c in run.checkpoints}
    expected = _expected(kinds)
    assert found == {path: (fmt, "complete") for path, fmt in expected.items()}, found
    runs = {run.path: len(run.checkpoints) for run in facts.runs}
    # Accelerate's automatic naming keeps its series in checkpoints/; each save_state is one checkpoint of it.
    assert runs[str(root / "accelerate" / "auto" / "checkpoints")] == 2
    assert runs[str(root / "hf")] == 3
    assert all(run.unsafe == 0 and run.corrupt == 0 and run.incomplete == 0 for run in facts.runs)


def test_accelerate_state_without_its_random_states_is_not_complete(
    written: tuple[Path, dict[str, list[str]]], tmp_path: Path
) -> None:
    """A save_state cut off before random_states_0.pkl (written after the model, optimizer and scheduler states) is
    an incomplete save, and one whose optimizer.bin is cut short is too."""
    _, kinds = written
    state = Path(kinds["accelerate"][0])
    partial = tmp_path / "ckpt"
    partial.mkdir()
    for name in os.listdir(state):
        data = (state / name).read_bytes()
        if name == "random_states_0.pkl":
            continue
        (partial / name).write_bytes(data)
    settled = time.time() - SETTLED
    os.utime(partial, (settled, settled))
    assert check(str(partial)).format is None  # without its marker it is no save_state directory (yet)
    (partial / "random_states_0.pkl").write_bytes((state / "random_states_0.pkl").read_bytes())
    optimizer = (state / "optimizer.bin").read_bytes()
    (partial / "optimizer.bin").write_bytes(optimizer[: len(optimizer) // 2])
    for p in (*partial.iterdir(), partial):
        os.utime(p, (settled, settled))
    result = check(str(partial))
    assert (result.format, result.verdict) == ("accelerate", "incomplete")
    assert "optimizer.bin" in result.reason
    (partial / "optimizer.bin").write_bytes(optimizer)
    assert check(str(partial)).verdict == "incomplete"  # just written: not settled yet
    assert check(str(partial), now=time.time() + SETTLED).verdict == "complete"
