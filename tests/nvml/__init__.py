"""The fake NVML library (``fake_nvml.c``) for tests and benchmarks: build it, script it, and run GPUSource on it.

The real ``nvidia-ml-py`` bindings load ``libnvidia-ml.so.1`` by name with ctypes, and the dynamic loader reads
LD_LIBRARY_PATH only when a process starts; so the source runs in a subprocess (``gpu_source_driver.py``) whose
LD_LIBRARY_PATH names the directory of the fake, and every NVML call takes the same path as on a GPU node.
Standard library only (the benchmarks import it too).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = [
    "DRIVER",
    "FAKE_NVML_SOURCE",
    "REPO_ROOT",
    "FakeNVML",
    "FakeNVMLUnavailable",
    "GPUSourceProcess",
    "build_fake_nvml",
]

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
FAKE_NVML_SOURCE = HERE / "fake_nvml.c"
DRIVER = HERE / "gpu_source_driver.py"


class FakeNVMLUnavailable(RuntimeError):
    """The fake library cannot be built here (no C compiler); tests that need it skip with this reason."""


def build_fake_nvml(dest_dir: Path) -> Path:
    """Compile fake_nvml.c into ``dest_dir/libnvidia-ml.so.1`` with the system's gcc (or $CC); return its path."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise FakeNVMLUnavailable("no C compiler (gcc) to build the fake libnvidia-ml.so.1")
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / "libnvidia-ml.so.1"
    cmd = [cc, "-shared", "-fPIC", "-O2", "-pthread", "-Wall", "-o", str(out), str(FAKE_NVML_SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise FakeNVMLUnavailable(f"building the fake NVML library failed: {' '.join(cmd)}\n{proc.stderr}")
    return out


class FakeNVML:
    """One scripted fake: the library's directory, the script it answers from, and the file it counts calls in."""

    def __init__(self, lib_dir: Path, work_dir: Path) -> None:
        self.lib_dir = lib_dir
        self.script_path = work_dir / "nvml-script.txt"
        self.counts_path = work_dir / "nvml-counts.txt"
        self.write_script("")

    def write_script(self, text: str) -> None:
        """Replace the script atomically (a new inode, so the library sees the change even within one mtime tick)."""
        tmp = self.script_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.script_path)

    def counts(self) -> dict[str, int]:
        """init_attempts, init, shutdown, slow_entered, slow_returned (all 0 before the first init)."""
        out = dict.fromkeys(("init_attempts", "init", "shutdown", "slow_entered", "slow_returned"), 0)
        try:
            text = self.counts_path.read_text()
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if value:
                out[key] = int(value)
        return out

    def env(self) -> dict[str, str]:
        return {
            "LD_LIBRARY_PATH": str(self.lib_dir),
            "FAKE_NVML_SCRIPT": str(self.script_path),
            "FAKE_NVML_COUNTS": str(self.counts_path),
        }


class GPUSourceProcess:
    """``gpu_source_driver.py`` as a subprocess: send it commands, read its JSON answers, collect its log.

    Use as a context manager; on exit it is asked to quit, then killed if it does not within a few seconds.
    """

    def __init__(
        self,
        env: Mapping[str, str],
        args: Sequence[str] = (),
        python: str = sys.executable,
    ) -> None:
        full_env = dict(os.environ)
        full_env.pop("LD_LIBRARY_PATH", None)
        full_env.update(env)
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [python, str(DRIVER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=full_env,
        )
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._stderr_lock = threading.Lock()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._read_stdout, args=(self.proc.stdout,), daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(self.proc.stderr,), daemon=True).start()

    def _read_stdout(self, stream: IO[str]) -> None:
        for line in stream:
            self._answers.put(line)
        self._answers.put(None)

    def _read_stderr(self, stream: IO[str]) -> None:
        for line in stream:
            with self._stderr_lock:
                self._stderr.append(line)

    def stderr_text(self) -> str:
        with self._stderr_lock:
            return "".join(self._stderr)

    def request(self, command: str, timeout: float = 30.0) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        try:
            line = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no answer to {command!r} in {timeout} s; stderr:\n{self.stderr_text()}") from None
        if line is None:
            time.sleep(0.1)
            raise AssertionError(f"driver exited ({self.proc.poll()}) on {command!r}; stderr:\n{self.stderr_text()}")
        answer: dict[str, Any] = json.loads(line)
        if "exception" in answer:
            raise AssertionError(f"{command!r} raised {answer['exception']}; stderr:\n{self.stderr_text()}")
        return answer

    def collect(self) -> dict[str, Any]:
        """One GPUSource.collect(): {"facts": GPUFacts as a dict, "failure", "wall", "cpu", "threads"}."""
        return self.request("collect")

    def close(self) -> dict[str, Any]:
        return self.request("close")

    def stop(self, timeout: float = 5.0) -> str:
        """Quit (without closing the source), wait, and return everything it logged."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.05)  # let the reader threads take the last lines
        return self.stderr_text()

    def __enter__(self) -> GPUSourceProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
