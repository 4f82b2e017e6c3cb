"""The probe never writes what it did not create, never hangs on what someone planted, and says why it refused.

Every case runs on a real tmpfs mount: something is planted where the probe makes its directory or its file (a hard
link to a root-owned 0600 file, a symlink to it, a FIFO, a device node, a directory owned by someone else), then the
probe runs through the real helper process. The victim must stay byte-identical, the probe must fail at once with a
reason naming what it found, and the mount must not be reported stuck.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from storwatch.calls._blocking_worker import probe_file_name
from storwatch.calls.blocking import BlockingCalls
from storwatch.config import ProbesConfig
from storwatch.paths import HostPaths
from storwatch.sources.probe import ProbeResult, ProbeSource, ProbeTarget
from storwatch.vocabulary import Durability
from tests.agentproc import running_agent
from tests.realmounts import tmpfs_mount

pytestmark = pytest.mark.realpart

SCRATCH = ".storwatch-probe"
VICTIM = b"root's secret, not to be overwritten\n" * 100


def _probe_once(mountpoint: Path, timeout: float = 60.0) -> ProbeResult:
    config = ProbesConfig(mountpoints=(str(mountpoint),), timeout_seconds=timeout)
    target = ProbeTarget(str(mountpoint), Durability.VOLATILE, False)
    source = ProbeSource(HostPaths(), config, lambda: [target], time.time, calls=BlockingCalls(max_inflight=2))
    try:
        (result,) = source.collect()
        return result
    finally:
        source.close()


def _victim(mount: Path) -> Path:
    victim = mount / "victim"
    victim.write_bytes(VICTIM)
    victim.chmod(0o600)
    return victim


def _plant_hardlink(scratch: Path, name: str, victim: Path) -> None:
    os.link(victim, scratch / name)


def _plant_symlink(scratch: Path, name: str, victim: Path) -> None:
    os.symlink(victim, scratch / name)


def _plant_fifo(scratch: Path, name: str, victim: Path) -> None:
    os.mkfifo(scratch / name, 0o666)


def _plant_device(scratch: Path, name: str, victim: Path) -> None:
    os.mknod(scratch / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


@pytest.mark.parametrize(
    ("plant", "what"),
    [
        (_plant_hardlink, "a file with 2 links"),
        (_plant_symlink, "a symbolic link"),
        (_plant_fifo, "a FIFO"),
        (_plant_device, "a character device"),
    ],
    ids=["hardlink", "symlink", "fifo", "device"],
)
def test_a_planted_file_is_refused_and_left_alone(
    tmp_path: Path, real_mounts: Callable[..., object], plant: Callable[[Path, str, Path], None], what: str
) -> None:
    mount = real_mounts(tmpfs_mount(tmp_path / "m")).mountpoint  # type: ignore[attr-defined]
    victim = _victim(mount)
    scratch = mount / SCRATCH
    scratch.mkdir(mode=0o700)
    name = probe_file_name(os.fsencode(str(mount)))
    plant(scratch, name, victim)
    result = _probe_once(mount)
    # Answered, not stuck: nothing was opened that could block (a FIFO opened for writing would wait here for ever).
    assert not result.stuck and result.seconds is None
    assert result.error is not None and what in result.error and "refused" in result.error, result.error
    assert victim.read_bytes() == VICTIM
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert os.path.lexists(scratch / name)  # what was planted stays for a person to look at


def test_a_planted_scratch_directory_is_refused(tmp_path: Path, real_mounts: Callable[..., object]) -> None:
    mount = real_mounts(tmpfs_mount(tmp_path / "m")).mountpoint  # type: ignore[attr-defined]
    victim = _victim(mount)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # A symlink where the directory should be: never followed.
    os.symlink(elsewhere, mount / SCRATCH)
    result = _probe_once(mount)
    assert result.error is not None and "not a real directory" in result.error, result.error
    assert os.listdir(elsewhere) == []
    os.unlink(mount / SCRATCH)
    # A directory someone else owns, or anyone may write to.
    (mount / SCRATCH).mkdir(mode=0o700)
    os.chown(mount / SCRATCH, 1234, 1234)
    result = _probe_once(mount)
    assert result.error is not None and "owned by uid 1234" in result.error and "refused" in result.error
    os.chown(mount / SCRATCH, os.geteuid(), os.getegid())
    os.chmod(mount / SCRATCH, 0o777)
    result = _probe_once(mount)
    assert result.error is not None and "mode 777" in result.error, result.error
    assert os.listdir(mount / SCRATCH) == []
    assert victim.read_bytes() == VICTIM


def test_the_probe_makes_its_directory_and_removes_its_own_stale_file(
    tmp_path: Path, real_mounts: Callable[..., object]
) -> None:
    mount = real_mounts(tmpfs_mount(tmp_path / "m")).mountpoint  # type: ignore[attr-defined]
    result = _probe_once(mount)
    assert result.error is None and result.seconds is not None, result.error
    st = (mount / SCRATCH).stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert os.listdir(mount / SCRATCH) == []
    # A file of its own left by a probe that was killed (a regular file, ours, one link) is removed, then probed.
    name = probe_file_name(os.fsencode(str(mount)))
    (mount / SCRATCH / name).write_bytes(b"left by a killed probe")
    result = _probe_once(mount)
    assert result.error is None and result.seconds is not None
    assert os.listdir(mount / SCRATCH) == []


def test_agent_with_a_hardlink_planted_at_the_probe_path(tmp_path: Path, real_mounts: Callable[..., object]) -> None:
    """Issue 12: a hard link planted at the probe's file turned a root-owned 0600 file into random bytes, and a FIFO
    left the probe stuck for good with the healthy mount reported stuck."""
    hard = real_mounts(tmpfs_mount(tmp_path / "hard")).mountpoint  # type: ignore[attr-defined]
    fifo = real_mounts(tmpfs_mount(tmp_path / "fifo")).mountpoint  # type: ignore[attr-defined]
    victim = _victim(hard)
    for mount in (hard, fifo):
        (mount / SCRATCH).mkdir(mode=0o700)
    _plant_hardlink(hard / SCRATCH, probe_file_name(os.fsencode(str(hard))), victim)
    _plant_fifo(fifo / SCRATCH, probe_file_name(os.fsencode(str(fifo))), victim)
    config = tmp_path / "storwatch.yaml"
    config.write_text(
        "tick_seconds: 0.2\nmounts:\n  interval_seconds: 0.5\n"
        f"probes:\n  mountpoints: ['{hard}', '{fifo}']\n  interval_seconds: 0.3\n  timeout_seconds: 0.5\n"
    )
    with running_agent("--config", str(config), "--listen", "127.0.0.1:0") as agent:

        def both_probed() -> str | None:
            text = agent.fetch("/metrics").text()
            lines = [ln for ln in text.splitlines() if ln.startswith("storwatch_probe_success{")]
            return text if len(lines) == 2 else None

        text = ""
        for _ in range(3):  # a few rounds, so a probe that hung would have passed its deadline
            text = wait_metrics(both_probed)
            time.sleep(0.6)
        for mount in (hard, fifo):
            assert f'storwatch_probe_success{{mountpoint="{mount}"}} 0.0' in text
            assert f'storwatch_probe_stuck{{mountpoint="{mount}"}} 0.0' in text
            assert f'storwatch_mount_stuck{{mountpoint="{mount}"}} 0.0' in text
        assert victim.read_bytes() == VICTIM
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=5) == 0


def wait_metrics(probe: Callable[[], str | None], timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = probe()
        if text is not None:
            return text
        time.sleep(0.1)
    raise AssertionError("the probes did not report in time")
