"""Hostile checkpoints (tests/hostile.py) through check(), through ``storwatch verify --deep`` as a process, and
through the running agent: no payload ever runs, memory and time stay bounded, each gets the right verdict (every
code payload ``unsafe``, never complete), and a healthy run beside the poison is still tracked. Classes the reader
merely does not know are no damage: complete, with a note. One agent test runs in a 256 MiB memory cgroup with the
zip bomb."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from storwatch.checkpoints import DeepLimits, check
from tests import hostile
from tests.agentproc import REPO_ROOT, AgentProcess, running_agent, wait_until
from tests.builders import release_cgroup

try:
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None  # type: ignore[assignment]

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (pip install torch==2.13.0, CPU wheel)")
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")
MIB = 1 << 20


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[hostile.Item]]:
    root = tmp_path_factory.mktemp("hostile")
    marker = root.parent / f"MARKER-{secrets.token_hex(4)}"
    items = hostile.build_corpus(root / "corpus", marker)
    return root / "corpus", marker, items


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hostile.zip_bomb(tmp_path_factory.mktemp("bomb") / "model.pt")


def verify_process(*args: str, timeout: float = 120.0) -> tuple[int, str, float, int, int]:
    """``storwatch verify ARGS`` in a process of its own: exit status, stdout, wall seconds, its own peak RSS and the
    peak RSS of its children (the torch-load child), in bytes."""
    code = (
        "import resource, sys\n"
        "from storwatch.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "sys.stdout.flush()\n"
        # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve, so it would report pytest's own peak.
        "own = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
        "kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "sys.stderr.write(f'PEAK {own} {kids}\\n')\n"
        "sys.exit(rc)\n"
    )
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code, "verify", *args],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        cwd=REPO_ROOT,
        check=False,
    )
    elapsed = time.monotonic() - started
    peak = [line for line in proc.stderr.splitlines() if line.startswith("PEAK ")]
    assert peak, proc.stderr
    own, kids = (int(v) * 1024 for v in peak[-1].split()[1:])
    return proc.returncode, proc.stdout, elapsed, own, kids


# ---- the corpus is hostile for real ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(hostile.PAYLOADS))
def test_payloads_run_when_unpickled_the_ordinary_way(tmp_path: Path, kind: str) -> None:
    """The control: the standard unpickler runs every payload, so the marker assertions below can fail."""
    marker = tmp_path / "MARKER"
    for protocol in (2, 4):
        assert hostile.payload_would_run(hostile.payload(marker, kind, protocol), marker)


@pytest.mark.parametrize("kind", sorted(hostile.GADGETS))
def test_gadgets_run_when_unpickled_the_ordinary_way(tmp_path: Path, kind: str) -> None:
    marker = tmp_path / "MARKER"
    assert hostile.payload_would_run(hostile.gadget(marker, kind), marker)


# ---- check() in this process ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_hostile_item_gets_its_verdict_and_nothing_runs(corpus: tuple[Path, Path, list[hostile.Item]]) -> None:
    _, marker, items = corpus
    assert len(items) > 40
    for item in items:
        for deep in (False, True):
            result = check(str(item.path), deep=deep)
            assert result.verdict in item.verdicts, (item.name, deep, result)
            assert item.mentions in result.reason, (item.name, result.reason)
            assert result.verdict != "complete"
    assert not marker.exists()


def test_unsafe_global_is_named_and_no_configuration_makes_it_complete(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    path = hostile.torch_zip(tmp_path / "m.pt", hostile.payload(marker, "builtins.exec", 2))
    result = check(str(path))
    assert result.verdict == "unsafe" and not result.complete
    assert "data.pkl names builtins.exec, which runs code when unpickled" in result.reason
    assert "no configuration makes it complete" in result.reason
    # Configured names only quiet the note on unknown classes: an unsafe one stays unsafe.
    for allowed in ("builtins.exec", "builtins.*", "posix.*"):
        assert check(str(path), limits=DeepLimits(allowed_globals=(allowed,))).verdict == "unsafe", allowed
    assert not marker.exists()


def _pickle_of_unknown_class(monkeypatch: pytest.MonkeyPatch) -> bytes:
    import pickle
    import types

    class Hyper:  # a harmless class of a user's own, as Lightning hyper-parameters carry
        pass

    module = types.ModuleType("myproject.config")
    Hyper.__module__, Hyper.__qualname__ = module.__name__, "Hyper"
    module.Hyper = Hyper  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "myproject", types.ModuleType("myproject"))
    monkeypatch.setitem(sys.modules, "myproject.config", module)
    h = Hyper()
    h.lr = 0.1  # type: ignore[attr-defined]
    return pickle.dumps({"hparams": h, "more": [Hyper(), Hyper()]}, protocol=2)


def test_unknown_class_is_complete_with_a_note_that_allowed_globals_quiets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = hostile.torch_zip(tmp_path / "m.pt", _pickle_of_unknown_class(monkeypatch))
    result = check(str(path))
    assert result.verdict == "complete" and result.reason == "all checks passed"
    assert result.unknown_globals == ("myproject.config.Hyper",) and result.unknown_global_count == 1
    (note,) = result.notes
    assert "1 name storwatch does not know (myproject.config.Hyper)" in note
    assert "checkpoints.allowed_globals" in note and "no damage" in note
    for allowed in ("myproject.config.Hyper", "myproject.config.*"):
        quiet = check(str(path), limits=DeepLimits(allowed_globals=(allowed,)))
        assert (quiet.verdict, quiet.notes, quiet.unknown_globals) == ("complete", (), ()), allowed


def test_enum_members_pickled_by_name_are_no_payload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An enum member pickled by its name, getattr(TheEnum, "NAME") (as ``enum.global_enum`` and some Python
    versions write it), and a Flag combination as operator.or_ of such: that form is no payload; getattr of a
    dunder, or on something that is not a named class, is (and calling what getattr gave is a gadget, in hostile.py)."""
    import enum
    import pickle
    import types

    module = types.ModuleType("myproject.enums")

    class Mode(enum.Enum):
        TRAIN = 1

    class Flags(enum.Flag):
        A = 1
        B = 2

    for cls in (Mode, Flags):
        cls.__module__, cls.__qualname__ = module.__name__, cls.__name__
        setattr(module, cls.__name__, cls)
    monkeypatch.setitem(sys.modules, "myproject", types.ModuleType("myproject"))
    monkeypatch.setitem(sys.modules, "myproject.enums", module)
    by_name = (
        b"\x80\x02}(Vmode\nc__builtin__\ngetattr\n(cmyproject.enums\nMode\nVTRAIN\ntR"
        b"Vflags\nc_operator\nor_\n(c__builtin__\ngetattr\n(cmyproject.enums\nFlags\nVA\ntR"
        b"c__builtin__\ngetattr\n(cmyproject.enums\nFlags\nVB\ntRtRu."
    )
    loaded = pickle.loads(by_name)  # the control: what the standard unpickler makes of it
    assert loaded == {"mode": Mode.TRAIN, "flags": Flags.A | Flags.B}
    result = check(str(hostile.torch_zip(tmp_path / "enum.pt", by_name)))
    assert result.verdict == "complete", result
    assert result.unknown_globals == ("myproject.enums.Flags", "myproject.enums.Mode")
    dunder = b"\x80\x02c__builtin__\ngetattr\n(cmyproject.enums\nMode\nV__init__\ntR."
    result = check(str(hostile.torch_zip(tmp_path / "dunder.pt", dunder)))
    assert result.verdict == "unsafe" and "__init__" in result.reason, result
    on_value = b"\x80\x02c__builtin__\ngetattr\n(K\x01Vreal\ntR."
    assert check(str(hostile.torch_zip(tmp_path / "value.pt", on_value))).verdict == "unsafe"


def test_many_distinct_unknown_names_stop_at_the_object_limit(tmp_path: Path) -> None:
    """Each unknown name gets an inert stand-in; a pickle naming 100,000 distinct ones (and dropping each) is charged
    for them and stops at the object limit: unknown, not corrupt, and the note names only the first thousand."""
    body = b"".join(b"cm%d\nC%d\n0" % (i, i) for i in range(100_000))  # GLOBAL, POP
    path = hostile.torch_zip(tmp_path / "m.pt", b"\x80\x02" + body + b"N.")
    result = check(str(path), limits=DeepLimits(max_pickle_objects=500_000))
    assert (result.verdict, result.limit) == ("unknown", "max_pickle_objects"), result
    assert len(result.unknown_globals) <= 20


@pytest.mark.realpart
@needs_torch
def test_deep_check_loads_an_unknown_class_as_an_inert_stand_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The torch-load child registers each unknown class the reader met as an inert class of its own, so torch.load
    (weights_only=True) finishes without importing it; what torch still refuses is a note, not damage."""
    assert torch is not None
    import types

    class Hyper:  # a class of the user's own, importable here and nowhere else (not in the torch-load child)
        pass

    module = types.ModuleType("myproject.config")
    Hyper.__module__, Hyper.__qualname__ = module.__name__, "Hyper"
    module.Hyper = Hyper  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "myproject", types.ModuleType("myproject"))
    monkeypatch.setitem(sys.modules, "myproject.config", module)
    hparams = Hyper()
    hparams.lr = 0.1  # type: ignore[attr-defined]
    marked = tmp_path / "marked.pt"
    torch.save({"w": torch.randn(4, 4), "hparams": hparams}, marked)
    result = check(str(marked), deep=True)
    assert result.verdict == "complete", result
    assert result.unknown_globals == ("myproject.config.Hyper",)
    assert not any("weights_only loader refused" in n for n in result.notes), result.notes
    protocol4 = tmp_path / "p4.pt"
    torch.save({"w": torch.randn(4, 4)}, protocol4, pickle_protocol=4)
    result = check(str(protocol4), deep=True)
    # torch 2.13's weights_only loader does not take protocol 4's FRAME opcode: that is torch's gap, not damage.
    assert result.verdict == "complete" and result.reason == "all checks passed", result
    assert any("weights_only loader refused" in n for n in result.notes), result.notes


def test_unknown_class_in_dcp_metadata_is_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A .metadata that is not DCP's (an unknown class at its top) is corrupt for what it holds, not for the name.
    dcp = hostile.dcp_dir(tmp_path / "step-1", _pickle_of_unknown_class(monkeypatch))
    result = check(str(dcp))
    assert result.verdict == "corrupt" and "not a Metadata" in result.reason
    assert result.unknown_globals == ("myproject.config.Hyper",)


def test_hardlink_to_a_file_outside_is_read_only_and_not_complete(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"root-only secret\n" * 10)
    secret.chmod(0o600)
    before = secret.read_bytes()
    link = hostile.hardlinked_secret(tmp_path / "root", secret)
    result = check(str(link), deep=True)
    # Text under a torch.save name is no checkpoint format: unknown, never complete, and nothing of it quoted.
    assert result.verdict == "unknown" and "not a checkpoint format" in result.reason, result
    assert "secret" not in result.reason
    assert secret.read_bytes() == before and secret.stat().st_nlink == 2


def test_a_check_that_raises_is_corrupt_not_an_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from storwatch.checkpoints import formats

    path = hostile.healthy_pt(tmp_path / "m.pt")

    def boom(*_: Any) -> Any:
        raise RuntimeError("injected failure")

    monkeypatch.setitem(formats._CHECKS, "torch-zip", boom)
    result = check(str(path))
    assert result.verdict == "corrupt" and result.error == "RuntimeError" and "injected failure" in result.reason


def test_wall_time_limit_is_unknown_not_corrupt(tmp_path: Path) -> None:
    path = hostile.healthy_pt(tmp_path / "m.pt", numel=4 << 20)
    result = check(str(path), deep=True, limits=DeepLimits(wall_seconds=0.0))
    assert result.verdict == "unknown" and result.limit == "wall_seconds"
    assert "wall-time limit" in result.reason and "says nothing against the checkpoint" in result.reason


def test_decompression_limits_name_themselves(tmp_path: Path) -> None:
    path = hostile.zip_bomb(tmp_path / "small-bomb.pt", inflated=64 * MIB)
    assert check(str(path)).verdict == "complete"  # the structure is sound: only inflating shows the bomb
    result = check(str(path), deep=True)
    assert (result.verdict, result.limit) == ("corrupt", "max_inflate_ratio")
    assert "decompression-ratio limit" in result.reason and "> 100:1" in result.reason
    result = check(str(path), deep=True, limits=DeepLimits(max_inflate_ratio=1e9, max_inflated_factor=2.0))
    assert (result.verdict, result.limit) == ("unknown", "max_inflated_bytes")
    assert "inflated-bytes limit" in result.reason


def test_pickle_and_json_size_limits_are_unknown(tmp_path: Path) -> None:
    st = tmp_path / "m.safetensors"
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "__metadata__": {"x": "y" * 5000}}
    )
    st.write_bytes(len(header).to_bytes(8, "little") + header.encode() + bytes(4))
    assert check(str(st)).verdict == "complete"
    result = check(str(st), limits=DeepLimits(max_json_bytes=1000))
    assert (result.verdict, result.limit) == ("unknown", "max_json_bytes")
    dcp = hostile.dcp_dir(tmp_path / "dcp", hostile.pickle_memo_bomb(copies=10))
    result = check(str(dcp), limits=DeepLimits(max_pickle_bytes=100))
    assert (result.verdict, result.limit) == ("unknown", "max_pickle_bytes")


@pytest.mark.slow
def test_the_agents_source_calls_every_code_payload_unsafe(corpus: tuple[Path, Path, list[hostile.Item]]) -> None:
    """The checkpoint source the agent runs (its helper process, the scan's own candidates): every item carrying a
    code payload is unsafe, counted apart from the damaged ones, and nothing else in the corpus is complete."""
    from storwatch.config import CheckpointsConfig
    from storwatch.sources.checkpoints import CheckpointSource

    root, marker, items = corpus
    payloads = [item for item in items if item.verdicts == ("unsafe",)]
    source = CheckpointSource([str(root)], CheckpointsConfig(deep_per_scan=0))
    try:
        # The walk checks the bombs to their limits (seconds each): a collection that has not seen its answer yet
        # reports nothing new, so collect until the walk has answered (as the agent does every interval).
        deadline = time.monotonic() + 120
        while True:
            facts = source.collect()
            found = {c.path: c for run in facts.runs for c in run.checkpoints}
            if all(str(item.path) in found for item in payloads) or time.monotonic() > deadline:
                break
    finally:
        source.close()
    assert len(payloads) >= 20
    for item in payloads:
        state = found.get(str(item.path))
        assert state is not None, (item.name, sorted(found)[:5])
        assert state.verdict == "unsafe" and item.mentions in state.reason, (item.name, state)
    assert sum(run.unsafe for run in facts.runs) == len(payloads)
    assert not [path for path, state in found.items() if state.verdict == "complete"]
    assert not marker.exists()
    # Exported per run beside the damaged ones, and in /api/status's shape.
    from storwatch.analysis.build import build_view
    from storwatch.classify import Classifier
    from storwatch.exporter import Exporter
    from storwatch.registry import exporter_areas
    from storwatch.report import view_to_dict
    from storwatch.snapshot import Snapshot
    from storwatch.vocabulary import Platform

    view = build_view(
        Snapshot(timestamp=time.time(), checkpoints=facts), Classifier("generic"), Platform("generic", "t")
    )
    text = Exporter(exporter_areas(), process_metrics=False).render(view).decode()
    assert 'storwatch_checkpoint_unsafe{run="hf"} 1.0' in text
    assert 'storwatch_checkpoint_corrupt{run="hf"} 0.0' in text
    runs = {r["run"]: r for r in view_to_dict(view)["checkpoints"]}
    assert runs["hf"]["unsafe"] == 1 and runs["hf"]["corrupt"] == 0


# ---- storwatch verify --deep as a process ------------------------------------------------------------------------


@pytest.mark.realpart
def test_verify_deep_on_the_whole_corpus(corpus: tuple[Path, Path, list[hostile.Item]]) -> None:
    _, marker, items = corpus
    rc, out, elapsed, own, _ = verify_process("--deep", "--json", *(str(i.path) for i in items))
    results = json.loads(out)
    assert len(results) == len(items)
    for item, result in zip(items, results, strict=True):
        assert result["verdict"] in item.verdicts, (item.name, result)
        assert item.mentions in result["reason"], (item.name, result["reason"])
    assert rc == 1
    assert not marker.exists()
    print(f"verify --deep on {len(items)} hostile items: {elapsed:.1f} s, peak RSS {own / MIB:.0f} MiB")
    assert own < 300 * MIB


@pytest.mark.realpart
def test_verify_deep_on_the_zip_bomb_is_bounded(bomb: Path) -> None:
    assert bomb.stat().st_size < 4 * MIB
    rc, out, elapsed, own, kids = verify_process("--deep", str(bomb))
    print(
        f"zip bomb ({bomb.stat().st_size / MIB:.1f} MB, 3 GiB inflated): {elapsed:.2f} s, peak RSS {own / MIB:.0f} MiB"
    )
    assert rc == 1 and out.startswith("CORRUPT")
    assert "decompression-ratio limit" in out
    assert own < 300 * MIB and kids < 300 * MIB


@pytest.mark.realpart
@needs_torch
def test_verify_deep_loads_with_torch_only_in_a_limited_child(tmp_path: Path) -> None:
    assert torch is not None
    path = tmp_path / "model.pt"
    torch.save({"w": torch.randn(512, 512), "step": 10}, path)
    rc, out, _, own, kids = verify_process("--deep", str(path))
    assert rc == 0 and out.startswith("COMPLETE"), out
    # The child imported torch (about 200 MB); the verify process itself never did.
    print(f"verify --deep of a real torch.save: own peak RSS {own / MIB:.0f} MiB, torch child {kids / MIB:.0f} MiB")
    assert kids > 100 * MIB
    assert own < kids / 2


@pytest.mark.realpart
@needs_torch
def test_torch_child_address_space_limit_is_unknown(tmp_path: Path) -> None:
    assert torch is not None
    path = tmp_path / "model.pt"
    torch.save({"w": torch.randn(64, 64)}, path)
    result = check(str(path), deep=True, limits=DeepLimits(torch_address_space_bytes=64 * MIB))
    assert result.verdict == "unknown" and "within the child's limits" in result.reason, result


# ---- the running agent ---------------------------------------------------------------------------------------------


def _status(agent: AgentProcess) -> dict[str, Any]:
    resp = agent.fetch("/api/status")
    assert resp.status == 200
    data: dict[str, Any] = json.loads(resp.body)
    return data


def _checkpoints(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["path"]: c for run in status["checkpoints"] for c in run["checkpoints"]}


def _deep_checked(agent: AgentProcess, path: Path) -> dict[str, Any] | None:
    """The agent's status once ``path`` has had its deep check, else None."""
    status = _status(agent)
    return status if _checkpoints(status).get(str(path), {}).get("deep_checked") else None


def _collector_ok(status: dict[str, Any]) -> bool:
    (ckpt,) = [c for c in status["collectors"] if c["name"] == "checkpoints"]
    return bool(ckpt["success"])


class _PeakRSS:
    """Polls a process's RSS on a thread; ``peak`` in bytes."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.proc.memory_info().rss)
            self._stop.wait(0.1)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(2)
        return self.peak


def _config(tmp_path: Path, root: Path, interval: float, extra: str = "") -> Path:
    config = tmp_path / "storwatch.yaml"
    config.write_text(
        "tick_seconds: 0.5\ngpu: {enabled: false}\nmounts: {interval_seconds: 5}\n"
        f"checkpoints:\n  roots: ['{root}']\n  kubelet: false\n  interval_seconds: {interval}\n"
        f"  settle_seconds: 1\n  deep_per_scan: 100\n{extra}"
    )
    return config


@pytest.mark.realpart
@needs_torch
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_agent_beside_the_corpus(tmp_path: Path, corpus: tuple[Path, Path, list[hostile.Item]], bomb: Path) -> None:
    assert torch is not None
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    _, marker, _ = corpus
    root = tmp_path / "root"
    root.mkdir()
    items = hostile.build_corpus(root / "poison-copy", marker)
    os.link(bomb, root / "poison-copy" / "bomb.pt")
    healthy = root / "healthy-run"
    healthy.mkdir()
    torch.save({"w": torch.randn(64, 64), "step": 1}, healthy / "step-1.pt")
    dcp = root / "dcp-run"
    for step in (100, 200):
        dcp_save(
            {"model": {"w": torch.randn(64, 64)}, "step": torch.tensor(step)}, checkpoint_id=str(dcp / f"step-{step}")
        )
    shard = next((dcp / "step-200").glob("*.distcp"))
    with open(shard, "r+b") as f:
        f.truncate(1000)
    interval = 2.0
    config = _config(tmp_path, root, interval)
    with running_agent("--config", str(config), "--listen", "127.0.0.1:0", timeout=20) as agent:
        rss = _PeakRSS(agent.pid)
        try:
            status = wait_until(
                lambda: _deep_checked(agent, root / "poison-copy" / "bomb.pt"),
                60,
                what="the zip bomb's deep check",
            )
            cks = _checkpoints(status)
            bomb_state = cks[str(root / "poison-copy" / "bomb.pt")]
            assert bomb_state["verdict"] == "corrupt" and "decompression-ratio limit" in bomb_state["reason"]
            assert cks[str(dcp / "step-100")]["verdict"] == "complete"
            truncated = cks[str(dcp / "step-200")]
            assert truncated["verdict"] == "incomplete" and shard.name in truncated["reason"]
            assert cks[str(healthy / "step-1.pt")]["verdict"] == "complete"
            for path, state in cks.items():
                if "poison-copy" in path and state["verdict"] == "complete":
                    raise AssertionError(f"a hostile item reads complete: {path}: {state}")
            assert _collector_ok(status)
            # A healthy run beside the poison: its new checkpoint is still tracked.
            started = time.monotonic()
            torch.save({"w": torch.randn(64, 64), "step": 2}, healthy / "step-2.pt")
            wait_until(
                lambda: str(healthy / "step-2.pt") in _checkpoints(_status(agent)),
                interval + 60.0,  # a later scan sees it; the bound only keeps a broken agent from hanging the test
                what="the healthy run's new checkpoint",
            )
            seen_after = time.monotonic() - started
            assert _collector_ok(_status(agent)) and agent.running()
            maps = {m.path for m in psutil.Process(agent.pid).memory_maps()}
            assert not any("libtorch" in p for p in maps), "torch was loaded into the agent"
        finally:
            peak = rss.stop()
        print(
            f"agent beside {len(items)} hostile items and the zip bomb: peak RSS {peak / MIB:.0f} MiB; "
            f"new healthy checkpoint seen after {seen_after:.1f} s (scan interval {interval} s)"
        )
        assert peak < 200 * MIB
    assert not marker.exists()


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A child memory cgroup (v1) with a limit; removed at the end (its processes moved back to the root first)."""
    if not (CGROUP_MEMORY / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 memory controller at /sys/fs/cgroup/memory")
    group = CGROUP_MEMORY / f"storwatch-test-{os.getpid()}-{secrets.token_hex(3)}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
        yield group
    finally:
        release_cgroup(group, CGROUP_MEMORY)


@pytest.mark.realpart
def test_agent_in_a_256_mib_cgroup_survives_the_zip_bomb(tmp_path: Path, bomb: Path) -> None:
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    hostile.healthy_pt(root / "run" / "step-1.pt")
    config = _config(tmp_path, root, 1.0)
    with (
        memory_cgroup(256 * MIB) as group,
        running_agent("--config", str(config), "--listen", "127.0.0.1:0", timeout=20) as agent,
    ):
        (group / "cgroup.procs").write_text(str(agent.pid))
        assert str(agent.pid) in (group / "cgroup.procs").read_text().split()
        # The bomb arrives only once the agent is inside the cgroup.
        staging = tmp_path / "staging"
        staging.mkdir()
        os.link(bomb, staging / "step-2.pt")
        os.rename(staging / "step-2.pt", root / "run" / "step-2.pt")
        status = wait_until(
            lambda: _deep_checked(agent, root / "run" / "step-2.pt"),
            60,
            what="the zip bomb's deep check inside the cgroup",
        )
        state = _checkpoints(status)[str(root / "run" / "step-2.pt")]
        assert state["verdict"] == "corrupt" and "decompression-ratio limit" in state["reason"]
        time.sleep(2.0)  # a few more scans and ticks inside the limit
        assert agent.running() and _collector_ok(_status(agent))
        oom = dict(line.split() for line in (group / "memory.oom_control").read_text().splitlines())
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        rss = psutil.Process(agent.pid).memory_info().rss
        print(
            f"agent in a 256 MiB cgroup with the zip bomb: RSS {rss / MIB:.0f} MiB, cgroup peak {peak / MIB:.0f} MiB, "
            f"oom_kill {oom.get('oom_kill')}"
        )
        assert oom.get("oom_kill", "0") == "0" and oom["under_oom"] == "0"
        assert peak < 256 * MIB
