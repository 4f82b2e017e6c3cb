"""``storwatch verify``: exit codes 0/1/2, the line output and the JSON shape."""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from storwatch.cli import main
from tests.builders import torch_like_zip


def write_safetensors(path: Path, truncate: int = 0) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    data = struct.pack("<Q", len(header)) + header + bytes(16)
    path.write_bytes(data[: len(data) - truncate])


def test_all_complete_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_safetensors(tmp_path / "a.safetensors")
    assert main(["verify", str(tmp_path / "a.safetensors")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("COMPLETE") and "safetensors" in out and "all checks passed" in out


def test_any_incomplete_exits_1_and_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.safetensors", tmp_path / "bad.safetensors"
    write_safetensors(good)
    write_safetensors(bad, truncate=5)
    assert main(["verify", "--json", "--deep", str(good), str(bad)]) == 1
    results = json.loads(capsys.readouterr().out)
    keys = {"path", "format", "verdict", "reason", "size_bytes", "deep", "notes", "unknown_globals"}
    assert [set(r) for r in results] == [keys] * 2
    assert [r["verdict"] for r in results] == ["complete", "incomplete"]
    assert results[1]["path"] == str(bad) and results[1]["deep"] is True
    assert results[1]["size_bytes"] == bad.stat().st_size
    assert "truncated" in results[1]["reason"]


def test_incomplete_directory_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "__0_0.distcp").write_bytes(b"x")
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("INCOMPLETE") and "torch-dcp" in out and ".metadata" in out


def test_missing_path_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_safetensors(tmp_path / "a.safetensors")
    missing = tmp_path / "nope.pt"
    assert main(["verify", str(tmp_path / "a.safetensors"), str(missing)]) == 2
    captured = capsys.readouterr()
    assert str(missing) in captured.err and captured.out == ""


def test_no_paths_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["verify"])
    assert exc.value.code == 2


def test_run_directory_checks_every_checkpoint_below_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A run directory (as a training loop leaves it: several checkpoints, the event log, a request file) is not a
    # checkpoint itself: verify checks each checkpoint in it, oldest first, instead of calling the directory corrupt.
    run = tmp_path / "run1"
    run.mkdir()
    write_safetensors(run / "step-1.safetensors")
    write_safetensors(run / "step-2.safetensors", truncate=3)
    (run / ".storwatch-events.jsonl").write_text("{}\n")
    (run / ".storwatch-checkpoint-request").write_text("drain\n")
    assert main(["verify", "--json", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    results = json.loads(captured.out)
    assert [(Path(r["path"]).name, r["verdict"]) for r in results] == [
        ("step-1.safetensors", "complete"),
        ("step-2.safetensors", "incomplete"),
    ]
    assert f"{tmp_path}: 2 checkpoints found below it" in captured.err


def test_directory_without_checkpoints_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("no checkpoints here\n")
    assert main(["verify", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert out.startswith("UNKNOWN")
    assert "not a recognised checkpoint format" in out and "none was found below it" in out


@pytest.mark.parametrize("kind", ["empty-dir", "text-file"])
def test_nothing_verifiable_is_unknown_with_its_own_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    target = tmp_path / "empty"
    if kind == "empty-dir":
        target.mkdir()
    else:
        target.write_text("just some text\n")
    assert main(["verify", "--json", str(target)]) == 3
    (result,) = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "unknown" and result["format"] is None
    assert "no checkpoint found" in result["reason"]


def test_unknown_beside_incomplete_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("text")
    write_safetensors(tmp_path / "bad.safetensors", truncate=2)
    assert main(["verify", str(tmp_path / "notes.txt"), str(tmp_path / "bad.safetensors")]) == 1
    out = capsys.readouterr().out
    assert "UNKNOWN" in out and "INCOMPLETE" in out


def test_help_documents_verdicts_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for line in (
        "0  every path is a complete checkpoint",
        "1  some checkpoint is incomplete, corrupt or unsafe",
        "2  usage",
        "3  ",
    ):
        assert line in out
    assert "unknown     not a checkpoint" in out
    assert "unsafe      a pickle in it names a global that runs code" in out


def test_bad_config_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_safetensors(tmp_path / "a.safetensors")
    config = tmp_path / "c.yaml"
    config.write_text("checkpoints:\n  allowed_globals: [os.system]\n")
    assert main(["verify", "--config", str(config), str(tmp_path / "a.safetensors")]) == 2
    assert "never allowed" in capsys.readouterr().err


def test_unsafe_exits_1_and_unknown_class_is_complete_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests import hostile

    marker = tmp_path / "MARKER"
    unsafe = hostile.torch_zip(tmp_path / "evil.pt", hostile.payload(marker, "os.system"))
    # A class nobody allow-listed, pickled by hand (GLOBAL, EMPTY_TUPLE, NEWOBJ, a dict state, BUILD).
    known_not = b"\x80\x02cmyproject.config\nHyper\n)\x81}X\x02\x00\x00\x00lrG?\xb9\x99\x99\x99\x99\x99\x9asb."
    fine = hostile.torch_zip(tmp_path / "fine.pt", known_not)
    assert main(["verify", str(fine)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("COMPLETE") and "all checks passed" in out
    assert "note: its pickles name 1 name storwatch does not know (myproject.config.Hyper)" in out
    config = tmp_path / "c.yaml"
    config.write_text("checkpoints:\n  allowed_globals: [myproject.config.Hyper]\n")
    assert main(["verify", "--config", str(config), str(fine)]) == 0
    assert "note:" not in capsys.readouterr().out
    assert main(["verify", "--json", str(unsafe), str(fine)]) == 1
    results = json.loads(capsys.readouterr().out)
    assert [r["verdict"] for r in results] == ["unsafe", "complete"]
    assert "names posix.system" in results[0]["reason"]
    assert results[1]["unknown_globals"] == ["myproject.config.Hyper"] and len(results[1]["notes"]) == 1
    assert main(["verify", str(unsafe)]) == 1
    assert capsys.readouterr().out.startswith("UNSAFE")
    assert not marker.exists()


@pytest.mark.parametrize("name", ["x.pt", "x.bin", "x.dat"])
def test_random_bytes_are_not_a_checkpoint_format_whatever_the_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """1 MiB of random bytes named x.pt is no checkpoint (exit 3, unknown), never "truncated during writing" (exit
    1), as the same bytes named x.dat are; a torch.save cut short beside it is still incomplete."""
    path = tmp_path / name
    path.write_bytes(random.Random(12).randbytes(1 << 20))
    assert main(["verify", str(path)]) == 3
    out = capsys.readouterr().out
    assert out.startswith("UNKNOWN") and "truncated" not in out, out
    assert ("not a checkpoint format" if name != "x.dat" else "not a recognised checkpoint format") in out, out
    assert main(["verify", "--json", "--deep", str(path)]) == 3
    (result,) = json.loads(capsys.readouterr().out)
    assert (result["format"], result["verdict"]) == (None, "unknown")
    cut = tmp_path / "cut.pt"
    torch_like_zip(cut, b"w" * 5000)
    cut.write_bytes(cut.read_bytes()[:3000])
    assert main(["verify", str(path), str(cut)]) == 1
    out = capsys.readouterr().out
    assert "UNKNOWN" in out and "INCOMPLETE  torch-zip" in out and "truncated during writing" in out, out


def test_a_run_directory_with_a_dataset_shard_named_bin_claims_no_damage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nanoGPT keeps its tokens in train.bin beside its checkpoints: the scan takes it for a candidate by its name,
    and its check says it is no checkpoint, not a damaged one."""
    write_safetensors(tmp_path / "step-1.safetensors")
    (tmp_path / "train.bin").write_bytes(random.Random(3).randbytes(1 << 20))
    assert main(["verify", "--json", str(tmp_path)]) == 3
    results = {Path(r["path"]).name: r for r in json.loads(capsys.readouterr().out)}
    assert results["step-1.safetensors"]["verdict"] == "complete"
    assert results["train.bin"]["verdict"] == "unknown"
    assert "not a checkpoint format" in results["train.bin"]["reason"]


def _trainer_checkpoint(run: Path) -> Path:
    """A Hugging Face Trainer directory just written (the real one is in tests/test_framework_checkpoints.py)."""
    ckpt = run / "checkpoint-5"
    ckpt.mkdir(parents=True)
    write_safetensors(ckpt / "model.safetensors")
    torch_like_zip(ckpt / "optimizer.pt")
    (ckpt / "trainer_state.json").write_text("{}")
    return ckpt


def test_a_checkpoint_no_process_holds_is_judged_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The Trainer marks no end of a save; a person checking one that was just saved, which no process holds open
    for writing, gets its verdict now, not INCOMPLETE until it has settled."""
    ckpt = _trainer_checkpoint(tmp_path)
    assert main(["verify", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("COMPLETE") and "hf-trainer" in out, out


def test_a_checkpoint_held_open_for_writing_is_being_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = _trainer_checkpoint(tmp_path)
    hold = "import sys; f = open(sys.argv[1], 'ab'); print('open', flush=True); sys.stdin.read()"
    proc = subprocess.Popen(
        [sys.executable, "-c", hold, str(ckpt / "optimizer.pt")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == b"open\n"
        text = main(["verify", str(tmp_path)])
        out = capsys.readouterr().out
        data = main(["verify", "--json", str(ckpt)])
        results = json.loads(capsys.readouterr().out)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert text == 3 and data == 3  # nothing damaged, nothing verified yet
    assert out.startswith("WRITING") and "INCOMPLETE" not in out, out
    assert f"still being written by PID {proc.pid} (python), which has {ckpt}/optimizer.pt open for writing" in out
    assert [(r["format"], r["verdict"]) for r in results] == [("hf-trainer", "unknown")]
    assert results[0]["reason"].startswith(f"still being written by PID {proc.pid}")
    assert main(["verify", str(ckpt)]) == 0  # closed: complete at once
