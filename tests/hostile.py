"""A corpus of hostile checkpoints, made at test time: code payloads in every place a format reads a pickle, a zip
bomb, deep-nesting and huge-length headers, trackers holding non-ASCII digits and huge numbers, symlink loops, FIFOs
and hardlinks.

Every payload is a pickle whose ``__reduce__`` runs ``touch MARKER`` (through ``os.system``, ``builtins.exec`` or a
``subprocess`` call) when unpickled the ordinary way; :func:`payload_would_run` proves that in a throw-away process,
so a test asserting the marker's absence can fail. Nothing here needs torch: archives are laid out as torch.save lays
them out, by hand.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30


class _System:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


class _Exec:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import builtins

        return builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",)


class _Subprocess:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[list[str]]]:
        return subprocess.call, (["touch", str(self.marker)],)


PAYLOADS = {"os.system": _System, "builtins.exec": _Exec, "subprocess.call": _Subprocess}
NAMED_AS = {"os.system": "posix.system", "builtins.exec": "builtins.exec", "subprocess.call": "subprocess.call"}
"""The global each payload's pickle names (os.system pickles as posix.system on Linux)."""


def payload(marker: Path, kind: str = "os.system", protocol: int = 2, wrap: bool = True) -> bytes:
    """A pickle that touches ``marker`` when loaded by the standard unpickler; ``wrap`` hides it in a state dict."""
    evil = PAYLOADS[kind](marker)
    obj: object = {"state_dict": {"w": [0.0] * 4}, "epoch": 3, "hook": evil} if wrap else evil
    return pickle.dumps(obj, protocol=protocol)


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def gadget(marker: Path, kind: str) -> bytes:
    """A pickle, written opcode by opcode, that touches ``marker`` through a gadget a name-based allow-list can miss:

    ``attribute-path``: protocol 4 resolves ``logging`` + ``os.system`` by getattr, reaching os through logging;
    ``getattr-import``: ``getattr(__import__("os"), "system")``; ``partial``: ``functools.partial(os.system, CMD)()``;
    ``io-open``: ``io.open(marker, "w")`` (creates the file); ``timeit``: ``timeit.timeit(CODE, number=1)``;
    ``getattr-method``: ``getattr(PosixPath, "write_text")(PosixPath(marker), "x")``, the enum-member form of
    getattr whose result is then called."""
    touch = f"touch {marker}"
    if kind == "attribute-path":
        return b"\x80\x04" + _text("logging") + _text("os.system") + b"\x93" + _text(touch) + b"\x85R."
    if kind == "getattr-import":
        return (
            b"\x80\x02c__builtin__\ngetattr\n(c__builtin__\n__import__\n(Vos\ntRVsystem\ntR"
            + b"(V"
            + touch.encode()
            + b"\ntR."
        )
    if kind == "getattr-method":
        return (
            b"\x80\x02c__builtin__\ngetattr\n(cpathlib\nPosixPath\nVwrite_text\ntR"
            + b"(cpathlib\nPosixPath\n(V"
            + str(marker).encode()
            + b"\ntRVx\ntR."
        )
    if kind == "partial":
        return b"\x80\x02cfunctools\npartial\n(cposix\nsystem\nV" + touch.encode() + b"\ntR)R."
    if kind == "io-open":
        return b"\x80\x02cio\nopen\n(V" + str(marker).encode() + b"\nVw\ntR."
    if kind == "timeit":
        code = f"open({str(marker)!r}, 'w').close()"
        # timeit(stmt, setup, timer, number): the statement runs once.
        return b"\x80\x02ctimeit\ntimeit\n(V" + code.encode() + b"\nVpass\nctimeit\ndefault_timer\nK\x01tR."
    raise ValueError(kind)


GADGETS = {
    "attribute-path": "logging.os.system",
    "getattr-import": "builtins.__import__",
    "getattr-method": "pathlib.PosixPath.write_text",
    "partial": "posix.system",
    "io-open": "io.open",
    "timeit": "timeit.timeit",
}
"""Each gadget and the name the restricted reader stops at."""


def payload_would_run(data: bytes, marker: Path) -> bool:
    """Load ``data`` with the standard unpickler in a separate process: whether the marker appeared (the control)."""
    code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"
    subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, timeout=30, check=False)
    ran = marker.exists()
    if ran:
        marker.unlink()
    return ran


def torch_zip(path: Path, data_pkl: bytes, storages: dict[str, bytes] | None = None, prefix: str = "archive") -> Path:
    """A ZIP laid out as torch.save lays it out (stored entries under one folder) with the given data.pkl."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", data_pkl)
        z.writestr(f"{prefix}/byteorder", b"little")
        for key, raw in (storages or {}).items():
            z.writestr(f"{prefix}/data/{key}", raw)
        z.writestr(f"{prefix}/version", b"3\n")
    return path


def plain_state_pickle() -> bytes:
    """A data.pkl with no tensors: what torch.save writes for a dict of plain values."""
    return pickle.dumps({"epoch": 1, "lr": 0.1, "names": ["a", "b"]}, protocol=2)


def zip_bomb(path: Path, inflated: int = 3 * GIB) -> Path:
    """A ``.pt`` whose one storage entry inflates from about 3 MB to ``inflated`` bytes of zeros (the issue's bomb);
    its data.pkl is sound and names that storage, so the cheap check passes and the deep check has to inflate.

    Built in seconds: after a full flush a deflate stream's state is reset, so each MiB of zeros compresses to the
    same bytes, written again and again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mib = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    segment = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    tail = deflate.flush(zlib.Z_FINISH)
    count, rest = divmod(inflated, len(mib))
    assert rest == 0, "whole MiBs only"
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(mib, crc)
    entries = [
        ("archive/data.pkl", 0, _tensor_pickle(("storage", "FLOAT", "0", "cpu", inflated // 4)), None),
        ("archive/data/0", 8, None, (crc, count * len(segment) + len(tail), inflated)),
        ("archive/version", 0, b"3\n", None),
    ]
    central = bytearray()
    with open(path, "wb") as f:
        for name, method, raw, sizes in entries:
            offset = f.tell()
            if raw is not None:
                crc_e, csize, usize = zlib.crc32(raw), len(raw), len(raw)
            else:
                assert sizes is not None
                crc_e, csize, usize = sizes
            f.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc_e, csize, usize, len(name), 0))
            f.write(name.encode())
            if raw is not None:
                f.write(raw)
            else:
                for _ in range(count):
                    f.write(segment)
                f.write(tail)
            central += struct.pack(
                "<4s6H3L5H2L",
                b"PK\x01\x02",
                20,
                20,
                0,
                method,
                0,
                0x21,
                crc_e,
                csize,
                usize,
                len(name),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            central += name.encode()
        cd_offset = f.tell()
        f.write(central)
        f.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central), cd_offset, 0))
    return path


def _tensor_pickle(pid: tuple[str, str, str, str, int]) -> bytes:
    """Protocol 2 bytes for {"w": torch._utils._rebuild_tensor_v2(<storage pid>, 0, (numel,), (1,), False, OD())},
    written opcode by opcode so that no torch is needed."""
    numel = pid[4]
    out = bytearray(b"\x80\x02}q\x00X\x01\x00\x00\x00w")
    out += b"ctorch._utils\n_rebuild_tensor_v2\n("
    out += b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
    out += b"X" + struct.pack("<I", len(pid[2])) + pid[2].encode() + b"X\x03\x00\x00\x00cpu"
    out += b"\x8a\x08" + struct.pack("<q", numel) + b"tQ"
    out += b"K\x00\x8a\x08" + struct.pack("<q", numel) + b"\x85K\x01\x85\x89ccollections\nOrderedDict\n)Rt"
    out += b"Rs."
    return bytes(out)


def dcp_dir(path: Path, metadata: bytes, shards: dict[str, bytes] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / ".metadata").write_bytes(metadata)
    for name, raw in (shards or {"__0_0.distcp": b"\0" * 64}).items():
        (path / name).write_bytes(raw)
    return path


def safetensors_nested(path: Path, depth: int = 200_000) -> Path:
    header = b"[" * depth + b"]" * depth
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


def safetensors_huge_length(path: Path) -> Path:
    path.write_bytes(struct.pack("<Q", (1 << 63) - 1) + b"{}")
    return path


# ---- hostile pickles for the restricted reader ---------------------------------------------------------------------


def pickle_huge_length() -> bytes:
    """BINUNICODE8 claiming 2**60 bytes of text in a 20-byte file."""
    return b"\x80\x04\x8d" + struct.pack("<Q", 1 << 60) + b"abc."


def pickle_deep_tuples(depth: int = 200_000) -> bytes:
    """A tuple nested ``depth`` times (hashing it would recurse in C), then used as a dict key."""
    return b"\x80\x02}N" + b"\x85" * depth + b"Ns."


def pickle_deep_marks(depth: int = 200_000) -> bytes:
    return b"\x80\x02" + b"(" * depth + b"t" * depth + b"."


def pickle_memo_bomb(copies: int = 2_000_000) -> bytes:
    """A 10,000-item list re-pushed from the memo ``copies`` times: cheap to write, huge when built."""
    out = bytearray(b"\x80\x02](")
    out += b"K\x01" * 10_000
    out += b"eq\x00("  # APPENDS, BINPUT 0, MARK
    out += b"h\x00" * copies
    out += b"l."  # LIST, STOP
    return bytes(out)


def pickle_undefined_memo() -> bytes:
    return b"\x80\x02j\xff\xff\xff\x7f."  # LONG_BINGET of a key never written


# ---- layouts ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One hostile checkpoint: where it is, what a check must say, and what the reason must mention."""

    name: str
    path: Path
    verdicts: tuple[str, ...]
    mentions: str = ""


def build_corpus(root: Path, marker: Path) -> list[Item]:
    """Every hostile input, each in a run directory of its own under ``root``."""
    items: list[Item] = []
    m = marker

    def add(name: str, path: Path, verdicts: tuple[str, ...], mentions: str = "") -> None:
        items.append(Item(name, path, verdicts, mentions))

    # Code payloads wherever a format reads a pickle.
    for kind in PAYLOADS:
        for proto in (2, 4):
            tag = f"{kind.replace('.', '-')}-p{proto}"
            mention = f"names {NAMED_AS[kind]}"
            add(f"pt-{tag}", torch_zip(root / f"pt-{tag}" / "model.pt", payload(m, kind, proto)), ("unsafe",), mention)
    add(
        "dcp-metadata",
        dcp_dir(root / "dcp-metadata" / "step-10", payload(m, "os.system", 4, wrap=False)),
        ("unsafe",),
        "names posix.system",
    )
    for kind, name in GADGETS.items():
        add(f"gadget-{kind}", torch_zip(root / f"gadget-{kind}" / "model.pt", gadget(m, kind)), ("unsafe",), name)
        dcp = dcp_dir(root / f"gadget-dcp-{kind}" / "step-1", gadget(m, kind))
        add(f"gadget-dcp-{kind}", dcp, ("unsafe",), name)
    ds = root / "deepspeed"
    torch_zip(ds / "global_step10" / "mp_rank_00_model_states.pt", payload(m, "builtins.exec"))
    (ds / "latest").write_text("global_step10")
    add("deepspeed-model-states", ds / "global_step10", ("unsafe",), "builtins.exec")
    hf = root / "hf" / "checkpoint-10"
    torch_zip(hf / "pytorch_model.bin", plain_state_pickle())
    torch_zip(hf / "optimizer.pt", payload(m, "subprocess.call"))
    (hf / "trainer_state.json").write_text("{}")
    old = 1_700_000_000
    for p in (*hf.iterdir(), hf):
        os.utime(p, (old, old))
    add("hf-optimizer", hf, ("unsafe",), "subprocess.call")
    hf2 = root / "hf2" / "checkpoint-10"
    torch_zip(hf2 / "pytorch_model.bin", payload(m, "os.system", 4))
    (hf2 / "trainer_state.json").write_text("{}")
    for p in (*hf2.iterdir(), hf2):
        os.utime(p, (old, old))
    add("hf-model", hf2, ("unsafe",), "names posix.system")
    mg = root / "megatron"
    it = mg / "iter_0000010"
    torch_zip(it / "common.pt", payload(m, "os.system"))
    dcp_dir(it, payload(m, "builtins.exec", 4, wrap=False))
    (mg / "latest_checkpointed_iteration.txt").write_text("10")
    add("megatron-common", it, ("unsafe",), "names posix.system")
    mg2 = root / "megatron2" / "iter_0000010"
    torch_zip(mg2 / "common.pt", plain_state_pickle())
    dcp_dir(mg2, payload(m, "builtins.exec", 4, wrap=False))
    (root / "megatron2" / "latest_checkpointed_iteration.txt").write_text("10")
    add("megatron-dcp-metadata", mg2, ("unsafe",), "builtins.exec")

    # Headers and pickles built to exhaust a parser.
    for name in ("st-nested", "st-huge"):
        (root / name).mkdir()
    add("safetensors-nested", safetensors_nested(root / "st-nested" / "m.safetensors"), ("corrupt",), "nests deeper")
    add("safetensors-huge-length", safetensors_huge_length(root / "st-huge" / "m.safetensors"), ("corrupt",), "length")
    for name, data in (
        ("huge-length", pickle_huge_length()),
        ("deep-tuples", pickle_deep_tuples()),
        ("deep-marks", pickle_deep_marks()),
        ("memo-bomb", pickle_memo_bomb()),
        ("undefined-memo", pickle_undefined_memo()),
    ):
        add(f"dcp-{name}", dcp_dir(root / f"dcp-{name}" / "step-1", data), ("corrupt", "unknown"))
        add(f"pt-{name}", torch_zip(root / f"pt-{name}" / "model.pt", data), ("corrupt", "unknown"))

    # Trackers holding what str.isdigit() accepts and int() does not, and numbers too large to be steps.
    for name, text in (
        ("superscript", "²".encode()),
        ("huge-number", b"9" * 100_000),
        ("not-utf8", b"\xff\xfe\x00"),
        ("traversal", b"../../../../etc"),
    ):
        mt = root / f"tracker-{name}"
        torch_zip(mt / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt", plain_state_pickle())
        (mt / "latest_checkpointed_iteration.txt").write_bytes(text)
        add(f"megatron-tracker-{name}", mt, ("corrupt", "incomplete"))
        add(f"megatron-step-tracker-{name}", mt / "iter_0000010", ("corrupt", "incomplete"))
        dd = root / f"ds-tracker-{name}"
        torch_zip(dd / "global_step10" / "mp_rank_00_model_states.pt", plain_state_pickle())
        (dd / "latest").write_bytes(text)
        add(f"deepspeed-tracker-{name}", dd, ("corrupt", "incomplete"))

    # Names and file types a walk must survive.
    odd = root / "odd-names"
    odd.mkdir()
    bad_name = os.fsdecode(b"\xff\xfe-model.pt")
    torch_zip(odd / bad_name, payload(m, "os.system"))
    add("non-utf8-name", odd / bad_name, ("unsafe",), "names posix.system")
    loops = root / "symlink-loop"
    loops.mkdir()
    (loops / "a.pt").symlink_to("b.pt")
    (loops / "b.pt").symlink_to("a.pt")
    (loops / "dir").symlink_to(".")
    add("symlink-loop", loops / "a.pt", ("unknown", "incomplete", "corrupt"))
    fifo_dir = root / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "model.pt")
    add("fifo-pt", fifo_dir / "model.pt", ("unknown",))
    fifo_dcp = root / "fifo-dcp" / "step-1"
    fifo_dcp.mkdir(parents=True)
    os.mkfifo(fifo_dcp / ".metadata")
    (fifo_dcp / "__0_0.distcp").write_bytes(b"x")
    add("fifo-dcp-metadata", fifo_dcp, ("unknown",))
    fifo_ds = root / "fifo-ds"
    torch_zip(fifo_ds / "global_step1" / "mp_rank_00_model_states.pt", plain_state_pickle())
    os.mkfifo(fifo_ds / "latest")
    add("fifo-tracker", fifo_ds, ("unknown", "incomplete"))
    return items


def hardlinked_secret(root: Path, secret: Path) -> Path:
    """A hardlink, inside a checkpoint root, to a file outside it (same filesystem); returns the link."""
    link = root / "hardlink" / "model.pt"
    link.parent.mkdir(parents=True, exist_ok=True)
    os.link(secret, link)
    return link


def healthy_state_pickle(numel: int) -> bytes:
    return _tensor_pickle(("storage", "FLOAT", "0", "cpu", numel))


def healthy_pt(path: Path, numel: int = 256) -> Path:
    """A sound torch.save-like file (one float32 storage), built without torch."""
    return torch_zip(path, healthy_state_pickle(numel), {"0": bytes(4 * numel)})
