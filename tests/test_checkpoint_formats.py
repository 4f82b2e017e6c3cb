"""Checkpoint format identification and checks: real torch.save, safetensors and DCP output, and hand-built layouts."""

from __future__ import annotations

import io
import json
import os
import random
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest

from storwatch.checkpoints import CheckResult, check, identify

try:
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None  # type: ignore[assignment]

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (pip install torch==2.13.0, CPU wheel)")

DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int8", "bool")
LEGACY_HEAD = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little") + b"."
"""pickle.dumps(torch.serialization.MAGIC_NUMBER, protocol=2): how every legacy torch.save file starts."""


def safetensors_bytes(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    """A safetensors file built by hand, for tests that run without torch."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def torch_like_zip(path: Path, entries: int = 3) -> None:
    """A ZIP laid out as torch.save lays it out (stored entries under one archive folder), built without torch."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        for i in range(entries):
            z.writestr(f"archive/data/{i}", bytes(64))
        z.writestr("archive/version", b"3\n")


def random_state(rng: random.Random, target_bytes: int) -> dict[str, Any]:
    assert torch is not None
    state: dict[str, Any] = {}
    left, i = target_bytes, 0
    while left > 0:
        dtype = getattr(torch, rng.choice(DTYPES))
        n = max(1, min(left, rng.randint(16, 64 * 1024)) // 4)
        t = torch.randn(n).to(dtype) if dtype.is_floating_point else torch.randint(0, 100, (n,)).to(dtype)
        state[f"layer{i}.weight"] = t
        left -= t.numel() * t.element_size()
        i += 1
    return state


def save_safetensors(tensors: dict[str, Any], path: Path) -> None:
    """Write with the safetensors library's own serialiser (safetensors.torch.save_file would also need numpy)."""
    from safetensors import TensorSpec, serialize_file

    specs = {
        name: TensorSpec(
            dtype=str(t.dtype).removeprefix("torch."), shape=list(t.shape), data_ptr=t.data_ptr(), data_len=t.nbytes
        )
        for name, t in tensors.items()
    }
    serialize_file(specs, str(path), None)


def assert_truncated(result: CheckResult, size: int) -> None:
    """A torch.save cut short: its ZIP end record, the last thing written, is missing (or nothing was written)."""
    assert result.verdict == "incomplete", result
    expected = "the file is empty" if size == 0 else "ZIP end of central directory not found"
    assert result.reason.startswith(expected), result


# ---- identification ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "target", "expected"),
    [
        ({"m.pt": b"PK\x03\x04"}, "m.pt", "torch-zip"),
        ({"m.pt": b"PK\x03"}, "m.pt", "torch-zip"),  # a ZIP cut inside its first signature
        ({"noext": b"PK\x03\x04rest"}, "noext", "torch-zip"),
        ({"noext": b"PK\x03"}, "noext", None),  # only a torch.save name makes a few bytes of a signature a cut save
        ({"notes.txt": b"hello"}, "notes.txt", None),
        # Named like torch.save, with bytes of no format: no checkpoint (and so no damaged one).
        ({"m.ckpt": b""}, "m.ckpt", None),
        ({"m.pt": bytes(4096)}, "m.pt", None),
        ({"m.bin": b"just some text\n"}, "m.bin", None),
        ({"m.pth": b"\x80\x02}q\x00."}, "m.pth", None),  # a pickle, but not torch's: no magic number
        ({"m.bin": b"GGUF\x03\x00\x00\x00"}, "m.bin", "gguf"),  # another format's bytes under a torch name
        ({"m.safetensors": b""}, "m.safetensors", "safetensors"),
        ({"model.safetensors.index.json": b"{}"}, "model.safetensors.index.json", "safetensors-sharded"),
        ({"d/model.safetensors.index.json": b"{}"}, "d", "safetensors-sharded"),
        ({"d/.metadata": b"x", "d/__0_0.distcp": b"x"}, "d", "torch-dcp"),
        ({"d/__0_0.distcp": b"x"}, "d", "torch-dcp"),
        ({"d/.snapshot_metadata": b"x"}, "d", "torchsnapshot"),
        ({"d/latest": b"global_step5", "d/global_step5/x.pt": b""}, "d", "deepspeed"),
        ({"d/global_step5/x.pt": b""}, "d/global_step5", "deepspeed"),
        ({"d/checkpoint-500/trainer_state.json": b"{}"}, "d/checkpoint-500", "hf-trainer"),
        ({"d/100.orbax-checkpoint-tmp-17/x": b""}, "d/100.orbax-checkpoint-tmp-17", "orbax"),
        ({"d/100/commit_success.txt": b""}, "d/100", "orbax"),
        ({"d/latest_checkpointed_iteration.txt": b"10"}, "d", "megatron"),
        ({"d/iter_0000010/x": b""}, "d/iter_0000010", "megatron"),
        ({"d/readme": b""}, "d", None),
        # torch.save's legacy format: the magic number's pickle (protocol 2), then anything.
        ({"m.pt": LEGACY_HEAD + b"rest"}, "m.pt", "torch-legacy"),
        ({"m.bin": LEGACY_HEAD}, "m.bin", "torch-legacy"),
        ({"noext": LEGACY_HEAD}, "noext", "torch-legacy"),
        ({"m.pt": LEGACY_HEAD[:5]}, "m.pt", "torch-legacy"),  # cut inside the magic number's pickle
        ({"m.pt": LEGACY_HEAD[:1]}, "m.pt", "torch-legacy"),
        ({"noext": LEGACY_HEAD[:5]}, "noext", None),
        ({"d/random_states_0.pkl": b"PK\x03\x04", "d/optimizer.bin": b""}, "d", "accelerate"),
        ({"d/checkpoint_3/random_states_0.pkl": b"PK\x03\x04"}, "d/checkpoint_3", "accelerate"),
        # A save_state killed before its random states: its model's weights beside a state only save_state names so.
        ({"d/model.safetensors": b"", "d/optimizer.bin": b""}, "d", "accelerate"),
        ({"d/pytorch_model.bin": b"", "d/scheduler.bin": b""}, "d", "accelerate"),
        ({"d/pytorch_model_fsdp_0/.metadata": b"", "d/optimizer_0/.metadata": b""}, "d", "accelerate"),
        ({"d/model.safetensors": b"", "d/optimizer.pt": b"PK\x03\x04"}, "d", None),  # the Trainer's names, no marker
        ({"d/optimizer.bin": b""}, "d", None),  # a lone optimizer state says nothing of the directory
        # The Trainer under FSDP writes Accelerate's names through Accelerate's functions: still the Trainer's.
        ({"d/pytorch_model_fsdp.bin": b"", "d/optimizer.bin": b"", "d/trainer_state.json": b"{}"}, "d", None),
        (
            {"d/checkpoint-5/pytorch_model_fsdp.bin": b"", "d/checkpoint-5/optimizer.bin": b""},
            "d/checkpoint-5",
            "hf-trainer",
        ),
        # ... or before its optimizer state: a step directory beside finished saves of its series.
        (
            {"d/checkpoint_1/random_states_0.pkl": b"PK", "d/checkpoint_2/model.safetensors": b""},
            "d/checkpoint_2",
            "accelerate",
        ),
        ({"d/checkpoint_1/random_states_0.pkl": b"PK", "d/checkpoint_2/x": b""}, "d/checkpoint_2", None),
        ({"d/checkpoint_1/random_states_0.pkl": b"PK", "d/step_2/model.safetensors": b""}, "d/step_2", None),
        ({"d/step_1/random_states_0.pkl": b"PK", "d/other/model.safetensors": b""}, "d/other", None),
        ({"d/step_1/model.pt": b"PK\x03\x04", "d/step_2/model.safetensors": b""}, "d/step_2", None),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_identify(tmp_path: Path, layout: dict[str, bytes], target: str, expected: str | None) -> None:
    for rel, content in layout.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(content)
    assert identify(str(tmp_path / target)) == expected


def test_unknown_is_reported_not_raised(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    result = check(str(tmp_path / "notes.txt"))
    assert (result.format, result.verdict) == (None, "unknown")
    assert "not a recognised checkpoint format" in result.reason and "no checkpoint found" in result.reason


# Bytes that carry no evidence of any checkpoint format: what a tokenised dataset (nanoGPT's train.bin), a blob or a
# note under a torch.save name holds. 1 MiB each, as issue 36 reported them.
NOT_CHECKPOINTS = [
    pytest.param(random.Random(36).randbytes(1 << 20), id="random"),
    pytest.param(bytes(1 << 20), id="zeros"),
    pytest.param(b"epoch 3 loss 1.25\n" * 1000, id="text"),
    pytest.param(b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01u.", id="pickle-not-torch"),
]


@pytest.mark.parametrize("content", NOT_CHECKPOINTS)
@pytest.mark.parametrize("name", ["x.pt", "x.bin", "x.pth", "x.ckpt", "x.dat"])
def test_bytes_of_no_format_are_unknown_whatever_the_name(tmp_path: Path, content: bytes, name: str) -> None:
    """Damage only on evidence: bytes that are not a ZIP, not torch's legacy format and no other format are no
    checkpoint, never a save cut short ("the file was truncated during writing"), named .pt or .dat alike."""
    path = tmp_path / name
    path.write_bytes(content)
    for deep in (False, True):
        result = check(str(path), deep=deep)
        assert (result.format, result.verdict) == (None, "unknown"), result
        assert "not a checkpoint format" in result.reason or "not a recognised checkpoint format" in result.reason
        assert "truncated during writing" not in result.reason and "interrupted save" not in result.reason
    if name != "x.dat":
        assert check(str(path)).reason.startswith(f"{path} is not a checkpoint format: it is named like a torch.save")


def test_an_empty_torch_file_is_a_save_just_begun_until_it_settles(tmp_path: Path) -> None:
    """torch.save opens its file before it writes a byte: an empty ``.pt`` changed within the settle time may be a
    save that has just begun (incomplete, which the scan shows as being written); once settled, no save wrote a
    byte of it, and it is no checkpoint."""
    for name in ("e.pt", "e.bin"):
        path = tmp_path / name
        path.write_bytes(b"")
        t0 = 1_800_000_000.0
        os.utime(path, (t0, t0))
        fresh = check(str(path), now=t0 + 5)
        assert (fresh.format, fresh.verdict) == (None, "incomplete"), fresh
        assert fresh.reason.startswith("the file is empty") and "settle time" in fresh.reason
        assert check(str(path), now=t0 + 20, settle_seconds=30).verdict == "incomplete"
        settled = check(str(path), now=t0 + 61)
        assert (settled.format, settled.verdict) == (None, "unknown"), settled
        assert "not a checkpoint format" in settled.reason and "no damage is claimed" in settled.reason
        assert check(str(path), now=t0 + 20, settle_seconds=15).verdict == "unknown"
        # A tenant's mtime a day ahead is no sign of a save going on.
        assert check(str(path), now=t0 - 86400).verdict == "unknown"


@pytest.mark.parametrize("cut", [1, 2, 3, 4, 30, 100])
def test_a_zip_cut_anywhere_is_incomplete_even_inside_its_first_signature(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "model.pt"
    torch_like_zip(path)
    path.write_bytes(path.read_bytes()[:cut])
    result = check(str(path))
    assert (result.format, result.verdict) == ("torch-zip", "incomplete"), result


def test_a_step_directory_member_of_no_format_is_still_not_complete(tmp_path: Path) -> None:
    """On its own a ``.pt`` of zeros is no checkpoint; inside a settled Hugging Face Trainer directory, which keeps
    its optimizer with torch.save, it is a file that never got its bytes: the directory is incomplete, as before."""
    ckpt = tmp_path / "checkpoint-500"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(safetensors_bytes({"w": ("F32", [2], bytes(8))}))
    (ckpt / "trainer_state.json").write_text("{}")
    t0 = 1_800_000_000.0
    for content, says in ((bytes(4096), "holds no torch.save format"), (b"", "optimizer.pt is empty")):
        (ckpt / "optimizer.pt").write_bytes(content)
        for p in (*ckpt.iterdir(), ckpt):
            os.utime(p, (t0, t0))
        for deep in (False, True):
            result = check(str(ckpt), now=t0 + 120, deep=deep)
            assert (result.format, result.verdict) == ("hf-trainer", "incomplete"), result
            assert says in result.reason, result


@pytest.mark.parametrize(
    ("module", "name", "unsafe"),
    [
        ("posix", "system", "starts processes"),
        ("nt", "system", "starts processes"),
        ("os", "popen", "starts processes"),
        ("subprocess", "Popen", "starts processes"),
        ("builtins", "eval", "runs code"),
        ("builtins", "exec", "runs code"),
        ("builtins", "getattr", "runs code"),
        ("builtins", "__import__", "runs code"),
        ("builtins", "open", "runs code"),
        ("importlib", "import_module", "runs code"),
        ("runpy", "run_path", "runs code"),
        ("pickle", "loads", "runs code"),
        ("marshal", "loads", "runs code"),
        ("types", "FunctionType", "runs code"),
        ("ctypes", "CDLL", "runs code"),
        ("code", "InteractiveInterpreter", "runs code"),
        ("operator", "attrgetter", "runs code"),
        ("operator", "methodcaller", "runs code"),
        ("_operator", "methodcaller", "runs code"),
        ("torch", "load", "runs code"),
        ("torch.serialization", "load", "runs code"),
        ("torch.storage", "_load_from_bytes", "runs code"),
        ("torch.fx.graph_module", "reduce_graph_module", "runs code"),
        ("numpy.testing._private.utils", "runstring", "runs code"),
        ("io", "open", "files"),
        ("_io", "FileIO", "files"),
        ("shutil", "rmtree", "files"),
        ("pty", "spawn", "starts processes"),
        ("webbrowser", "open", "starts processes"),
        ("multiprocessing.util", "spawnv_passfds", "starts processes"),
        ("socket", "create_connection", "network"),
        ("sys", "modules", "runs code"),
        # Attribute paths that walk through a module, and dunders: what protocol 4's dotted names can reach.
        ("logging", "os.system", "attribute path"),
        ("collections", "abc.sys", "module sys"),
        ("logging", "os", "module os"),
        ("pathlib", "Path.write_text", "attribute path"),
        ("torch", "__builtins__", "internals"),
        # Not unsafe: allowed stand-ins are looked up first; unknown classes are only noted.
        ("transformers.trainer_pt_utils", "AcceleratorConfig", None),
        ("functools", "partial", None),
        ("copyreg", "__newobj__", None),
        ("mypkg.types", "Config", None),
        ("mypkg", "Outer.Inner", None),
        ("uuid", "UUID", None),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_unsafe_globals(module: str, name: str, unsafe: str | None) -> None:
    from storwatch.checkpoints.pickles import unsafe_global

    why = unsafe_global(module, name)
    assert (why is None) == (unsafe is None), why
    assert unsafe is None or (why is not None and unsafe in why), why


# ---- torch.save ZIP, hand-built (no torch needed) ------------------------------------------------------------------


def test_zip_layout_complete_and_truncated_without_torch(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch_like_zip(path)
    result = check(str(path), deep=True)
    assert (result.format, result.verdict, result.size_bytes) == ("torch-zip", "complete", path.stat().st_size)
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    result = check(str(path))
    assert result.verdict == "incomplete"
    assert result.reason.startswith("ZIP end of central directory not found: the file was truncated during writing")
    path.write_bytes(b"")
    assert "empty" in check(str(path)).reason


def test_zip_without_data_pkl_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "other.bin"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", b"not a checkpoint")
    result = check(str(path))
    assert result.verdict == "corrupt" and "data.pkl" in result.reason


def test_zip_central_directory_offset_out_of_range_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch_like_zip(path)
    data = bytearray(path.read_bytes())
    # cd_offset is at bytes 16..20 of the 22-byte end record.
    struct.pack_into("<L", data, len(data) - 22 + 16, len(data) + 100)
    path.write_bytes(bytes(data))
    result = check(str(path))
    assert result.verdict == "corrupt" and "central directory" in result.reason


@pytest.mark.slow
def test_zip64_archive_parses(tmp_path: Path) -> None:
    # More than 65535 entries forces the ZIP64 end records, as torch.save writes for very many tensors.
    path = tmp_path / "many.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        for i in range(65540):
            z.writestr(f"archive/data/{i}", b"")
        z.writestr("archive/version", b"3\n")
    assert path.read_bytes()[-22 - 20 : -22][:4] == b"PK\x06\x07"
    assert check(str(path)).verdict == "complete"
    assert check(str(path), deep=True).verdict == "complete"
    path.write_bytes(path.read_bytes()[:-30])
    assert check(str(path)).verdict == "incomplete"


def test_symlink_out_of_directory_is_not_followed(tmp_path: Path) -> None:
    outside, ckpt = tmp_path / "outside", tmp_path / "ckpt"
    outside.mkdir()
    ckpt.mkdir()
    torch_like_zip(outside / "real.pt")
    (ckpt / "model.pt").symlink_to(outside / "real.pt")
    result = check(str(ckpt / "model.pt"))
    assert result.verdict == "incomplete" and "not followed" in result.reason
    (ckpt / "inside.pt").write_bytes((outside / "real.pt").read_bytes())
    (ckpt / "alias.pt").symlink_to("inside.pt")
    assert check(str(ckpt / "alias.pt")).verdict == "complete"


def test_device_file_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "zero.pt").symlink_to(os.devnull)
    assert check(str(tmp_path / "zero.pt")).verdict != "complete"


# ---- torch.save, real ------------------------------------------------------------------------------------------


@pytest.mark.realpart
@needs_torch
def test_fifty_truncated_torch_saves_are_never_complete(tmp_path: Path) -> None:
    assert torch is not None
    rng = random.Random(20261122)
    for model in range(5):
        buf = io.BytesIO()
        torch.save(random_state(rng, rng.randint(150_000, 400_000)), buf)
        data = buf.getvalue()
        for cut in range(10):
            path = tmp_path / f"m{model}-{cut}.pt"
            size = rng.randrange(0, len(data))
            path.write_bytes(data[:size])
            assert_truncated(check(str(path)), size)
            if cut % 5 == 0:
                assert_truncated(check(str(path), deep=True), size)


@pytest.mark.realpart
@needs_torch
@pytest.mark.parametrize("protocol", [2, 4])
def test_legacy_torch_save_is_read_and_every_cut_is_incomplete(tmp_path: Path, protocol: int) -> None:
    """torch.save(..., _use_new_zipfile_serialization=False): complete whole, incomplete wherever it is cut (never for
    being no ZIP), corrupt when a storage's stored count disagrees with its pickle."""
    assert torch is not None
    rng = random.Random(protocol)
    state = random_state(rng, 200_000)
    state["marker"] = torch.zeros(12345, dtype=torch.float32)
    state["step"] = 3
    buf = io.BytesIO()
    torch.save(state, buf, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    data = buf.getvalue()
    path = tmp_path / "legacy.pt"
    path.write_bytes(data)
    result = check(str(path))
    assert (result.format, result.verdict, result.reason) == ("torch-legacy", "complete", "all checks passed")
    assert check(str(path), deep=True).verdict == "complete"
    cut = tmp_path / "cut.pt"
    for size in [*sorted(rng.sample(range(1, len(data)), 40)), len(data) - 1]:
        cut.write_bytes(data[:size])
        result = check(str(cut))
        assert result.verdict == "incomplete", (size, result)
        if size >= 32:  # past the magic number's pickle: known for what it is, and cut short
            assert result.format == "torch-legacy" and "cut short" in result.reason, (size, result)
    count = (12345).to_bytes(8, "little")
    assert data.count(count) == 1
    cut.write_bytes(data.replace(count, (12344).to_bytes(8, "little")))
    result = check(str(cut))
    assert result.verdict == "corrupt" and "12,344 elements where the pickle names 12,345" in result.reason


@pytest.mark.realpart
@needs_torch
def test_real_saves_cut_in_their_first_bytes_are_still_incomplete(tmp_path: Path) -> None:
    """Only bytes with no evidence of a format are unknown: a real torch.save cut anywhere, even inside the ZIP's
    first signature or the legacy magic number's pickle (every protocol torch.save writes it in), is a save cut
    short, of the format those bytes begin."""
    assert torch is not None
    state = {"w": torch.randn(64, 64), "step": 7}
    saves = []
    buf = io.BytesIO()
    torch.save(state, buf)
    saves.append(("torch-zip", buf.getvalue()))
    for protocol in (1, 2, 3, 4, 5):
        buf = io.BytesIO()
        torch.save(state, buf, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
        saves.append(("torch-legacy", buf.getvalue()))
    path = tmp_path / "model.bin"
    for fmt, data in saves:
        path.write_bytes(data)
        assert (check(str(path)).format, check(str(path)).verdict) == (fmt, "complete")
        for size in (*range(1, 70), len(data) // 2, len(data) - 1):
            path.write_bytes(data[:size])
            result = check(str(path))
            assert (result.format, result.verdict) == (fmt, "incomplete"), (fmt, size, result)


@pytest.mark.realpart
@needs_torch
def test_flipped_byte_in_tensor_data_fails_deep_check(tmp_path: Path) -> None:
    assert torch is not None
    path = tmp_path / "model.pt"
    torch.save({"w": torch.randn(256, 256), "b": torch.randn(256)}, path)
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
        with z.open(info) as member:
            member.read(1)
        local = path.read_bytes()[info.header_offset : info.header_offset + 30]
        name_len, extra_len = struct.unpack("<2H", local[26:30])
    data = bytearray(path.read_bytes())
    at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    assert check(str(path)).verdict == "complete"  # the structure is intact
    deep = check(str(path), deep=True)
    assert deep.verdict == "corrupt" and deep.deep
    assert "CRC32 mismatch" in deep.reason and info.filename in deep.reason


@pytest.mark.realpart
@needs_torch
def test_two_hundred_sound_checkpoints_pass(tmp_path: Path) -> None:
    assert torch is not None
    rng = random.Random(7)
    suffixes = (".pt", ".pth", ".bin", ".ckpt")
    for i in range(200):
        state = random_state(rng, rng.randint(64, 40_000))
        obj: Any = state
        if i % 4 == 3:  # Lightning's layout
            obj = {"epoch": i, "global_step": i * 10, "state_dict": state, "optimizer_states": [{"lr": 0.1}]}
        path = tmp_path / f"ckpt{i}{suffixes[i % 4]}"
        torch.save(obj, path)
        # A deep check loads the file in a torch subprocess (up to 10 s each on a busy machine): the first four, one
        # of each suffix and both layouts (i % 4); the quick checks see all 200.
        result = check(str(path), deep=i < 4)
        assert result.verdict == "complete", result
        assert result.format == "torch-zip"


# ---- safetensors --------------------------------------------------------------------------------------------------


def test_safetensors_hand_built_checks(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    good = safetensors_bytes({"a": ("F32", [2, 2], bytes(16)), "b": ("I64", [3], bytes(24))})
    path.write_bytes(good)
    assert check(str(path), deep=True).verdict == "complete"
    path.write_bytes(good + b"junk")
    assert check(str(path)).verdict == "corrupt"
    path.write_bytes(good.replace(b'"shape": [3]', b'"shape": [4]'))
    assert check(str(path)).verdict == "corrupt"
    path.write_bytes(good[:5])
    assert check(str(path)).verdict == "incomplete"
    path.write_bytes(struct.pack("<Q", 1 << 40) + good[8:])
    assert check(str(path)).verdict == "corrupt"


@pytest.mark.realpart
@needs_torch
def test_safetensors_from_the_library(tmp_path: Path) -> None:
    assert torch is not None
    path = tmp_path / "model.safetensors"
    save_safetensors({"w": torch.randn(64, 64), "b": torch.zeros(64, dtype=torch.bfloat16), "i": torch.arange(5)}, path)
    good = path.read_bytes()
    assert check(str(path)).verdict == "complete"
    assert check(str(path), deep=True).verdict == "complete"
    header_len = struct.unpack("<Q", good[:8])[0]
    for cut in (0, 3, 8 + header_len // 2, 8 + header_len + 10, len(good) - 1):
        path.write_bytes(good[:cut])
        result = check(str(path))
        assert result.verdict == "incomplete", (cut, result)
        assert "truncated" in result.reason
    bad = bytearray(good)
    bad[8] = ord("[")  # the header no longer opens an object
    path.write_bytes(bytes(bad))
    result = check(str(path))
    assert result.verdict == "corrupt" and "header" in result.reason


@pytest.mark.realpart
@needs_torch
def test_sharded_safetensors_with_index(tmp_path: Path) -> None:
    assert torch is not None
    shards = {
        "model-00001-of-00002.safetensors": {"a.weight": torch.randn(32, 32), "a.bias": torch.randn(32)},
        "model-00002-of-00002.safetensors": {"b.weight": torch.randn(32, 16)},
    }
    weight_map = {}
    for name, tensors in shards.items():
        save_safetensors(tensors, tmp_path / name)
        weight_map.update(dict.fromkeys(tensors, name))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    assert check(str(tmp_path)).verdict == "complete"
    assert check(str(index), deep=True).verdict == "complete"

    second = tmp_path / "model-00002-of-00002.safetensors"
    data = second.read_bytes()
    second.write_bytes(data[:-100])
    result = check(str(tmp_path))
    assert result.verdict == "incomplete" and "model-00002-of-00002" in result.reason
    second.unlink()
    result = check(str(tmp_path))
    assert result.verdict == "incomplete" and "missing" in result.reason
    second.write_bytes(data)

    index.write_text(json.dumps({"weight_map": {**weight_map, "c.weight": "model-00002-of-00002.safetensors"}}))
    assert check(str(tmp_path)).verdict == "corrupt"
    index.write_text(json.dumps({"weight_map": {"x": "../elsewhere.safetensors"}}))
    assert check(str(tmp_path)).verdict == "corrupt"
    index.write_text('{"weight_map": {"a.weight": "model-0000')
    assert check(str(tmp_path)).verdict == "corrupt"


# ---- torch Distributed Checkpoint ----------------------------------------------------------------------------------


@pytest.mark.realpart
@needs_torch
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dcp_written_by_torch(tmp_path: Path) -> None:
    assert torch is not None
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    target = tmp_path / "step-100"
    state = {"model": {"w": torch.randn(64, 64), "b": torch.randn(64)}, "step": torch.tensor(100)}
    dcp_save(state, checkpoint_id=str(target))
    assert identify(str(target)) == "torch-dcp"
    assert check(str(target)).verdict == "complete"
    assert check(str(target), deep=True).verdict == "complete"

    distcp = next(target.glob("*.distcp"))
    data = distcp.read_bytes()
    distcp.write_bytes(data[: len(data) // 2])
    # The cheap check compares each shard with the extent .metadata places in it (read without unpickling).
    result = check(str(target))
    assert result.verdict == "incomplete" and distcp.name in result.reason and "truncated" in result.reason
    assert check(str(target), deep=True).verdict == "incomplete"
    distcp.write_bytes(data)
    assert check(str(target)).verdict == "complete"

    (target / ".metadata").unlink()
    result = check(str(target))
    assert result.verdict == "incomplete" and ".metadata" in result.reason


# ---- layouts built by hand ----------------------------------------------------------------------------------------


def test_hf_trainer_complete_only_after_settle_time(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint-500"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(safetensors_bytes({"w": ("F32", [2], bytes(8))}))
    t0 = 1_800_000_000.0
    result = check(str(ckpt), now=t0)
    assert result.verdict == "incomplete" and "trainer_state.json" in result.reason
    (ckpt / "trainer_state.json").write_text("{}")
    for p in (*ckpt.iterdir(), ckpt):
        os.utime(p, (t0, t0))
    assert check(str(ckpt), now=t0 + 10).verdict == "incomplete"
    assert check(str(ckpt), now=t0 + 59).verdict == "incomplete"
    assert check(str(ckpt), now=t0 + 61).verdict == "complete"
    assert check(str(ckpt), now=t0 + 20, settle_seconds=15).verdict == "complete"
    # A damaged weight file inside a settled directory is still found.
    (ckpt / "model.safetensors").write_bytes(b"\x01")
    for p in (*ckpt.iterdir(), ckpt):
        os.utime(p, (t0, t0))
    assert check(str(ckpt), now=t0 + 120).verdict == "incomplete"


def test_without_an_end_marker_a_directory_no_process_holds_is_judged_at_once(tmp_path: Path) -> None:
    """``closed``: the caller (storwatch verify) saw that no process holds any of its files open for writing, so a
    Trainer directory is judged now, not after the settle time; that never makes a save without its end marker, or
    a damaged file, complete."""
    ckpt = tmp_path / "checkpoint-500"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(safetensors_bytes({"w": ("F32", [2], bytes(8))}))
    t0 = 1_800_000_000.0
    assert check(str(ckpt), now=t0, closed=True).verdict == "incomplete"  # no trainer_state.json
    (ckpt / "trainer_state.json").write_text("{}")
    for p in (*ckpt.iterdir(), ckpt):
        os.utime(p, (t0, t0))
    assert check(str(ckpt), now=t0 + 1).verdict == "incomplete"  # the agent's rule: not settled yet
    assert check(str(ckpt), now=t0 + 1, closed=True).verdict == "complete"
    (ckpt / "model.safetensors").write_bytes(b"\x01")
    assert check(str(ckpt), now=t0 + 1, closed=True).verdict == "incomplete"
    empty = tmp_path / "e.pt"
    empty.write_bytes(b"")
    result = check(str(empty), closed=True)
    assert (result.format, result.verdict) == (None, "unknown"), result
    assert "no process has it open for writing" in result.reason


def test_a_trainer_directory_under_fsdp_cut_short_is_the_trainers(tmp_path: Path) -> None:
    """Under FSDP the Trainer saves through Accelerate's functions (pytorch_model_fsdp.bin, optimizer.bin): cut short
    before its trainer_state.json it is a Trainer save that did not finish, not a save_state without random states."""
    ckpt = tmp_path / "checkpoint-5"
    ckpt.mkdir()
    for name in ("pytorch_model_fsdp.bin", "optimizer.bin"):
        torch_like_zip(ckpt / name)
    result = check(str(ckpt), closed=True)
    assert (result.format, result.verdict) == ("hf-trainer", "incomplete"), result
    assert result.reason.startswith("no trainer_state.json")


def _accelerate_save(path: Path, processes: int = 1, objects: int = 1) -> None:
    """What Accelerate's save_state writes, in its order (tests/test_framework_checkpoints.py has the real thing)."""
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(safetensors_bytes({"w": ("F32", [2], bytes(8))}))
    for name in ("optimizer.bin", "scheduler.bin"):
        torch_like_zip(path / name)
    for i in range(processes):
        torch_like_zip(path / f"random_states_{i}.pkl")
    for i in range(objects):
        torch_like_zip(path / f"custom_checkpoint_{i}.pkl")


def test_accelerate_every_process_writes_its_random_states(tmp_path: Path) -> None:
    state = tmp_path / "ckpt"
    _accelerate_save(state, processes=3)
    assert check(str(state), closed=True).verdict == "complete"
    (state / "random_states_1.pkl").unlink()
    result = check(str(state), closed=True)
    assert (result.format, result.verdict) == ("accelerate", "incomplete"), result
    assert result.reason.startswith("random_states_1.pkl missing beside random_states_2.pkl")
    (state / "random_states_0.pkl").unlink()
    result = check(str(state), closed=True)
    assert (result.format, result.verdict) == ("accelerate", "incomplete"), result
    assert "but no random_states_0.pkl" in result.reason


def test_accelerate_registered_objects_come_last_and_an_earlier_save_says_which(tmp_path: Path) -> None:
    """save_state writes each registered object's state after the random states: a save without the one the run's
    nearest earlier save holds did not finish. A save from before the object was registered is complete, and no
    evidence against the later ones."""
    run = tmp_path / "checkpoints"
    _accelerate_save(run / "checkpoint_0", objects=0)
    for n in (1, 2):
        _accelerate_save(run / f"checkpoint_{n}", objects=2)
    _accelerate_save(run / "checkpoint_3", objects=1)
    for n in (0, 1, 2):
        assert check(str(run / f"checkpoint_{n}"), closed=True).verdict == "complete"
    result = check(str(run / "checkpoint_3"), closed=True)
    assert (result.format, result.verdict) == ("accelerate", "incomplete"), result
    assert result.reason.startswith("no custom_checkpoint_1.pkl, which the run's earlier save checkpoint_2 holds")
    torch_like_zip(run / "checkpoint_3" / "custom_checkpoint_1.pkl")
    assert check(str(run / "checkpoint_3"), closed=True).verdict == "complete"


def test_deepspeed_latest_names_the_finished_step(tmp_path: Path) -> None:
    for step in (10, 20):
        (tmp_path / f"global_step{step}").mkdir()
        torch_like_zip(tmp_path / f"global_step{step}" / "mp_rank_00_model_states.pt")
    assert check(str(tmp_path)).verdict == "incomplete"  # no `latest` yet
    (tmp_path / "latest").write_text("global_step10")
    assert check(str(tmp_path)).verdict == "complete"
    assert check(str(tmp_path / "global_step10")).verdict == "complete"
    result = check(str(tmp_path / "global_step20"))
    assert result.verdict == "incomplete" and "latest" in result.reason
    (tmp_path / "latest").write_text("global_step20")
    assert check(str(tmp_path / "global_step10")).verdict == "complete"
    state = tmp_path / "global_step20" / "mp_rank_00_model_states.pt"
    state.write_bytes(state.read_bytes()[:50])
    assert check(str(tmp_path)).verdict == "incomplete"
    (tmp_path / "latest").write_text("global_step30")
    assert "missing" in check(str(tmp_path)).reason


def test_megatron_tracker_file(tmp_path: Path) -> None:
    for it in (1000, 2000):
        rank = tmp_path / f"iter_{it:07d}" / "mp_rank_00"
        rank.mkdir(parents=True)
        torch_like_zip(rank / "model_optim_rng.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1000\n")
    assert check(str(tmp_path)).verdict == "complete"
    assert check(str(tmp_path / "iter_0001000")).verdict == "complete"
    assert check(str(tmp_path / "iter_0002000")).verdict == "incomplete"
    (tmp_path / "iter_0003000").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3000")
    assert check(str(tmp_path / "iter_0003000")).verdict == "incomplete"  # no files in it


def test_orbax_tmp_and_committed(tmp_path: Path) -> None:
    tmp = tmp_path / "100.orbax-checkpoint-tmp-1763800000"
    tmp.mkdir()
    (tmp / "_CHECKPOINT_METADATA").write_text("{}")
    result = check(str(tmp))
    assert result.verdict == "incomplete" and "Orbax" in result.reason
    committed = tmp_path / "200"
    committed.mkdir()
    (committed / "commit_success.txt").write_text("")
    assert check(str(committed)).verdict == "complete"


def test_torchsnapshot_manifest_extents(tmp_path: Path) -> None:
    # The layout torchsnapshot 0.1.0 writes (recorded from Snapshot.take with torch 2.13): JSON metadata, and
    # batched tensor files whose byte ranges the manifest lists.
    (tmp_path / "batched").mkdir()
    blob = tmp_path / "batched" / "6c585e71"
    blob.write_bytes(bytes(860))
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "extra_obj").write_bytes(b"x" * 10)
    manifest = {
        "0/extra": {"type": "dict", "keys": ["step", "t"]},
        "0/extra/step": {"type": "int", "serialized_value": "5", "replicated": False, "readable": None},
        "0/extra/t": {
            "type": "Tensor",
            "location": "batched/6c585e71",
            "serializer": "buffer_protocol",
            "dtype": "torch.int64",
            "shape": [100],
            "replicated": False,
            "byte_range": [0, 800],
        },
        "0/model/weight": {
            "type": "Tensor",
            "location": "batched/6c585e71",
            "serializer": "buffer_protocol",
            "dtype": "torch.float32",
            "shape": [3, 4],
            "replicated": False,
            "byte_range": [800, 860],
        },
        "0/obj": {"type": "object", "location": "0/extra_obj", "serializer": "torch_save", "obj_type": "x"},
    }
    (tmp_path / ".snapshot_metadata").write_text(
        json.dumps({"version": "0.1.0", "world_size": 1, "manifest": manifest})
    )
    assert check(str(tmp_path)).verdict == "complete"
    assert check(str(tmp_path), deep=True).verdict == "complete"
    blob.write_bytes(bytes(859))
    result = check(str(tmp_path))
    assert result.verdict == "incomplete" and "batched/6c585e71" in result.reason and "860" in result.reason
    (tmp_path / "0" / "extra_obj").unlink()
    blob.write_bytes(bytes(860))
    result = check(str(tmp_path))
    assert result.verdict == "incomplete" and "0/extra_obj" in result.reason and "missing" in result.reason
    # Older torchsnapshot releases wrote YAML: read from parser events, never with aliases.
    (tmp_path / "0" / "extra_obj").write_bytes(b"x")
    yaml_text = "version: 0.0.3\nworld_size: 1\nmanifest:\n  0/t:\n    type: Tensor\n    location: batched/6c585e71\n"
    yaml_text += "    serializer: buffer_protocol\n    dtype: torch.float32\n    shape: [215]\n"
    (tmp_path / ".snapshot_metadata").write_text(yaml_text)
    assert check(str(tmp_path)).verdict == "complete"
    (tmp_path / ".snapshot_metadata").write_text(yaml_text.replace("[215]", "[216]"))
    assert check(str(tmp_path)).verdict == "incomplete"
    (tmp_path / ".snapshot_metadata").write_text("a: &x [1]\nmanifest: *x\n")
    result = check(str(tmp_path))
    assert result.verdict == "corrupt" and "anchors" in result.reason
    (tmp_path / ".snapshot_metadata").write_text(json.dumps({"manifest": {"0/t": {"location": "../../etc/passwd"}}}))
    result = check(str(tmp_path))
    assert result.verdict == "corrupt" and "outside the snapshot" in result.reason


@pytest.mark.realpart
@needs_torch
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchsnapshot_written_by_the_library(tmp_path: Path) -> None:
    torchsnapshot = pytest.importorskip(
        "torchsnapshot", reason="torchsnapshot is not installed (pip install torchsnapshot==0.1.0 numpy aiofiles)"
    )
    assert torch is not None
    app_state = {
        "model": torch.nn.Linear(64, 32),
        "extra": torchsnapshot.StateDict(step=5, name="run", t=torch.arange(1000)),
    }
    target = tmp_path / "snap-5"
    torchsnapshot.Snapshot.take(path=str(target), app_state=app_state)
    assert identify(str(target)) == "torchsnapshot"
    assert check(str(target)).verdict == "complete"
    assert check(str(target), deep=True).verdict == "complete"
    blob = max((p for p in target.rglob("*") if p.is_file() and p.name != ".snapshot_metadata"), key=os.path.getsize)
    data = blob.read_bytes()
    blob.write_bytes(data[: len(data) // 2])
    result = check(str(target))
    assert result.verdict == "incomplete" and blob.name in result.reason and "truncated" in result.reason


@pytest.mark.realpart
@needs_torch
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dcp_shard_cut_to_1000_bytes_is_incomplete_in_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: a real dcp.save step whose __0_0.distcp is truncated to 1,000 bytes, without --deep."""
    assert torch is not None
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from storwatch.cli import main

    target = tmp_path / "step-100"
    dcp_save({"model": {"w": torch.randn(128, 128)}, "step": torch.tensor(100)}, checkpoint_id=str(target))
    assert main(["verify", str(target)]) == 0
    capsys.readouterr()
    with open(target / "__0_0.distcp", "r+b") as f:
        f.truncate(1000)
    assert main(["verify", "--json", str(target)]) == 1
    (result,) = json.loads(capsys.readouterr().out)
    assert (result["format"], result["verdict"], result["deep"]) == ("torch-dcp", "incomplete", False)
    assert "__0_0.distcp has 1,000 bytes but .metadata places data up to" in result["reason"]
