"""The torch-load part of a deep check, in a separate, short-lived, resource-limited process.

``torch.load(path, weights_only=True, mmap=True)`` runs in ``sys.executable -I -c CHILD`` (isolated mode: no
PYTHON* variables, no user site, no current directory on the path), never in the calling process, so neither a
hostile file nor a large honest checkpoint can raise the caller's memory: importing torch alone costs about 200 MB of
RSS. The child, before it imports torch, lowers its own limits: RLIMIT_AS (address space: the configured bytes plus
the file's size, which torch maps), RLIMIT_CPU, no core dumps, and ``oom_score_adj`` 1000, so that under a memory
cgroup the kernel's OOM killer takes the child, not the agent. The caller kills the child's process group at a wall
deadline. The outcome comes back as one JSON line on stdout.

Extra globals (argparse.Namespace, the frameworks' enums, ``checkpoints.allowed_globals``, and the classes the
restricted reader found the file to name that storwatch does not know) are registered with
``torch.serialization.safe_globals`` as an inert class of the child's own, so torch never imports them either. A
legacy (non-ZIP) torch.save file is loaded without ``mmap``, which torch allows only for its ZIP format.
Only the standard library is imported here; torch only in the child.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from storwatch.checkpoints.limits import Deadline, DeepLimits
from storwatch.paths import HostPaths, own_fd

_Finding = tuple[str, str]
_MAX_OUTPUT = 64 * 1024
WEIGHTS_ONLY_REFUSED = (
    "torch's weights_only loader refused something storwatch's reader read (a class it takes as an inert record, "
    "or a pickle opcode torch's loader does not support), so torch.load did not finish; that is no damage "
    "(storwatch's own read of every storage passed)"
)

CHILD = r"""
import json, os, resource, sys
path, cfg = sys.argv[1], json.loads(sys.argv[2])
def report(**kw):
    sys.stdout.write(json.dumps(kw, allow_nan=False) + "\n")
    sys.stdout.flush()
try:
    with open(cfg["oom_score_adj"], "w") as f:
        f.write("1000")
except OSError:
    pass
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_AS, (cfg["address_space"], cfg["address_space"]))
resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu"], cfg["cpu"] + 5))
import warnings
warnings.filterwarnings("ignore")
try:
    import torch
except MemoryError:
    report(status="memory", error="importing torch")
    sys.exit(0)
except Exception as err:
    # The parent found torch before starting us: failing to import it here is the address-space limit at work
    # (shared libraries that cannot be mapped) or a broken installation.
    report(status="import-failed", error=(type(err).__name__ + ": " + str(err))[:600])
    sys.exit(0)

class Inert(dict):
    # Stands in for every extra allowed class: accepts any arguments and state, does nothing with them.
    def __new__(cls, *args, **kwargs):
        return dict.__new__(cls)
    def __init__(self, *args, **kwargs):
        pass
    def __setstate__(self, state):
        pass
    def append(self, item):
        pass
    def extend(self, items):
        pass

stubs = [(type(name.rpartition(".")[2], (Inert,), {}), name) for name in cfg["globals"]]
try:
    with torch.serialization.safe_globals(stubs):
        torch.load(path, weights_only=True, mmap=cfg["mmap"], map_location="cpu")
except MemoryError:
    report(status="memory", error="torch.load")
except Exception as err:
    report(status="failed", error=(type(err).__name__ + ": " + str(err))[:600])
else:
    report(status="ok")
"""


def torch_available() -> bool:
    """Whether torch can be imported by the child (found without importing it here)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


GONE_BEFORE_LOAD = (
    "every entry's CRC32 matches; the file was removed before torch.load could read it (a rotation of old saves): "
    "that says nothing against it"
)


def torch_load_in_child(
    path: str,
    file_size: int,
    limits: DeepLimits,
    deadline: Deadline,
    extra_globals: tuple[str, ...] = (),
    mmap: bool = True,
) -> _Finding:
    """Load ``path`` with torch (``weights_only=True``) in a limited child; the finding for the check."""
    if not torch_available():
        return "complete", "every entry's CRC32 matches; torch is not installed, so torch.load was not tried"
    deadline.check()
    cfg: dict[str, Any] = {
        "oom_score_adj": HostPaths().proc("self", "oom_score_adj"),
        "address_space": limits.torch_address_space_bytes + file_size,
        "cpu": max(1, int(limits.torch_cpu_seconds)),
        "globals": list(extra_globals),
        "mmap": mmap,
    }
    wall = max(1.0, min(limits.torch_wall_seconds, deadline.end - time.monotonic()))
    # The child reads the file through a descriptor opened here: a save's rotation may remove the file while it is
    # being checked (Lightning's save_top_k, the Trainer's save_total_limit), and the inode it read stays whole.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "unknown", GONE_BEFORE_LOAD
    except OSError as err:
        return "unknown", f"every entry's CRC32 matches; it could not be opened for torch.load ({err.strerror or err})"
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", CHILD, own_fd(fd), json.dumps(cfg, allow_nan=False)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            pass_fds=(fd,),
            start_new_session=True,
        )
    except OSError as err:
        return "unknown", f"every entry's CRC32 matches; the torch-load child could not start ({err.strerror or err})"
    finally:
        os.close(fd)
    try:
        out, _ = proc.communicate(timeout=wall)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return (
            "unknown",
            f"every entry's CRC32 matches; torch.load did not finish within {wall:.0f} s "
            "(checkpoints.deep_torch_wall_seconds) and was stopped: that says nothing against the checkpoint",
        )
    finally:
        _kill(proc)
    return _outcome(out[:_MAX_OUTPUT], proc.returncode, limits)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5.0)


def _outcome(out: bytes, returncode: int | None, limits: DeepLimits) -> _Finding:
    lines = out.decode("utf-8", "replace").strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else {}
    except ValueError:
        result = {}
    status = result.get("status") if isinstance(result, dict) else None
    error = str(result.get("error", "")) if isinstance(result, dict) else ""
    if status == "ok":
        return "complete", ""
    if status == "no-torch":
        return "complete", "every entry's CRC32 matches; torch is not installed, so torch.load was not tried"
    if status == "import-failed":
        return (
            "unknown",
            f"every entry's CRC32 matches; torch could not be imported within the child's limits (address space "
            f"{limits.torch_address_space_bytes:,} bytes plus the file, checkpoints.deep_torch_address_space_bytes): "
            f"{error[:200]}",
        )
    if status == "memory" or (status is None and returncode in (-signal.SIGKILL, -signal.SIGXCPU)):
        what = "memory" if status == "memory" or returncode == -signal.SIGKILL else "CPU"
        return (
            "unknown",
            f"every entry's CRC32 matches; torch.load in its child ran out of {what} "
            f"(address space {limits.torch_address_space_bytes:,} bytes plus the file, "
            f"{limits.torch_cpu_seconds} s CPU: checkpoints.deep_torch_*) and was stopped",
        )
    if status == "failed":
        if "Weights only load failed" in error:
            # storwatch's own reader already read every global (none unsafe); torch's narrower list refusing one is
            # no damage: the caller makes this a note.
            return "complete", WEIGHTS_ONLY_REFUSED
        first = error.strip().splitlines()[0] if error.strip() else "an error"
        return "corrupt", f"torch.load failed: {first[:300]}; the last complete checkpoint should be used"
    return "unknown", f"every entry's CRC32 matches; the torch-load child ended without an answer (status {returncode})"
