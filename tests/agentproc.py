"""Run ``python -m storwatch agent`` as a real subprocess for a test, and learn its port from its log.

The agent is started with ``--listen HOST:0`` (pass it in ``args``); it logs ``serving on HOST:0 (port N)`` on stderr
at INFO once its server is bound. :func:`running_agent` reads stderr until that line appears, then keeps draining
stderr (and stdout) on background threads for the life of the process, so a chatty agent never blocks on a full pipe
and the test can read everything it logged with :meth:`AgentProcess.stderr_text` or wait for a line with
:meth:`AgentProcess.wait_for_stderr`.

On exit the agent gets SIGTERM and up to ``stop_timeout`` seconds (5 by default) to end; then SIGKILL, sent to its
whole process group (the agent runs in a session of its own, so that group holds only the agent and the helper
processes it started). Teardown runs when the test failed, too.

The agent must log at INFO (the default; a config with ``log_level: warning`` hides the port line).
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import IO, TypeVar

__all__ = [
    "REPO_ROOT",
    "SERVING_LINE",
    "AgentProcess",
    "AgentStartError",
    "Response",
    "fetch",
    "running_agent",
    "start_agent",
    "wait_until",
]

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[1]

# storwatch.agent logs: "serving on %s (port %d)" with the configured listen address.
SERVING_LINE = re.compile(r"serving on (?P<listen>\S+) \(port (?P<port>\d+)\)")


class AgentStartError(RuntimeError):
    """The agent exited, or did not log its port, before the deadline; the message carries its stderr."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: Message
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8")


def fetch(url: str, method: str = "GET", timeout: float = 5.0, context: ssl.SSLContext | None = None) -> Response:
    """One HTTP(S) request; an HTTP error status is returned, not raised (connection and TLS errors are raised)."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return Response(resp.status, resp.headers, resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return Response(err.code, err.headers, err.read())


def wait_until(probe: Callable[[], T | None], timeout: float, interval: float = 0.05, what: str = "") -> T:
    """Call ``probe`` until it returns something other than None, False or an empty collection; raise AssertionError
    at the deadline.

    Exceptions from ``probe`` count as "not yet" (the last one is chained to the AssertionError).
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            # An empty list or mapping is "not yet" too: a probe that collects what has arrived returns one
            if (
                value is not None
                and value is not False
                and not (isinstance(value, (list, tuple, dict, set)) and not value)
            ):
                return value
        except Exception as err:
            last_error = err
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what or probe!r}") from last_error
        time.sleep(interval)


class _Drain:
    """Reads a text pipe line by line on a daemon thread and keeps every line; waiters are woken per line."""

    def __init__(self, pipe: IO[str], name: str) -> None:
        self._pipe = pipe
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for line in self._pipe:
                with self._cond:
                    self._lines.append(line)
                    self._cond.notify_all()
        except (OSError, ValueError):  # the pipe was closed under us during teardown
            pass
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def text(self) -> str:
        with self._cond:
            return "".join(self._lines)

    def line_count(self) -> int:
        with self._cond:
            return len(self._lines)

    def wait_for(
        self, pattern: re.Pattern[str], timeout: float, start_line: int = 0, stop: threading.Event | None = None
    ) -> re.Match[str] | None:
        """The first match of ``pattern`` in a line at index ``start_line`` or later, waiting up to ``timeout``.

        Returns None at the deadline or at end of file without a match.
        """
        deadline = time.monotonic() + timeout
        seen = start_line
        with self._cond:
            while True:
                while seen < len(self._lines):
                    m = pattern.search(self._lines[seen])
                    seen += 1
                    if m is not None:
                        return m
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    return None
                self._cond.wait(min(left, 0.2))

    def at_eof(self) -> bool:
        with self._cond:
            return self._eof

    def join(self, timeout: float) -> bool:
        """Wait for end of file; True once the reader thread is done."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


class AgentProcess:
    """A running agent: ``port``, ``proc``, ``url(path)``, its logs, and signals."""

    def __init__(self, proc: subprocess.Popen[str], stop_timeout: float, started_at: float) -> None:
        self.proc = proc
        self.stop_timeout = stop_timeout
        self.started_at = started_at
        """``time.monotonic()`` just before Popen: measure start-up times from here."""
        self.port = 0
        """The port the agent bound (known once it logged its serving line)."""
        self.host = "127.0.0.1"
        """The address to connect to: the listen host, or loopback for a wildcard listen address."""
        assert proc.stderr is not None and proc.stdout is not None
        self._stderr = _Drain(proc.stderr, f"agent-{proc.pid}-stderr")
        self._stdout = _Drain(proc.stdout, f"agent-{proc.pid}-stdout")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def url(self, path: str = "/", scheme: str = "http") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}{path}"

    def fetch(self, path: str, method: str = "GET", timeout: float = 5.0) -> Response:
        """A plain-HTTP request to the agent (see :func:`fetch`)."""
        return fetch(self.url(path), method, timeout)

    def stderr_text(self) -> str:
        """What the agent logged so far; once it has exited, all it logged (the drain thread may still be reading
        its last lines when the exit status is already in: wait for the end of the pipe, a few seconds at most)."""
        if self.proc.poll() is not None:
            self._stderr.join(5.0)
        return self._stderr.text()

    def stdout_text(self) -> str:
        return self._stdout.text()

    def stderr_mark(self) -> int:
        """A position in the log; pass it to :meth:`wait_for_stderr` to look only at lines logged after it."""
        return self._stderr.line_count()

    def wait_for_stderr(self, pattern: str | re.Pattern[str], timeout: float = 10.0, since: int = 0) -> re.Match[str]:
        """Wait for a stderr line matching ``pattern`` (a regex), logged at mark ``since`` or later; raise if none."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        m = self._stderr.wait_for(regex, timeout, since)
        if m is None:
            raise AssertionError(
                f"no stderr line matching {regex.pattern!r} within {timeout} s (agent {self.state()}); stderr:\n"
                + self.stderr_text()
            )
        return m

    def wait_serving(self, timeout: float = 10.0) -> None:
        """Wait for the line that says the agent serves, and learn its port from it; AgentStartError (with the
        agent's stderr) when it exits first or ``timeout`` passes."""
        m = self._stderr.wait_for(SERVING_LINE, timeout)
        if m is None:
            raise AgentStartError(
                f"agent {' '.join(map(str, self.proc.args))} did not log its port within {timeout} s "
                f"({self.state()}); stderr:\n" + self.stderr_text()
            )
        self.host = _connect_host(m.group("listen"))
        self.port = int(m.group("port"))

    def state(self) -> str:
        """Whether the agent still runs, or its exit status ("exited with N").

        End of file on stderr comes before the exit status can be collected (the process closes its pipes as it
        exits and becomes waitable a moment later), so once stderr has ended this waits up to 5 s for the status
        rather than calling an exiting agent "still running"."""
        if self._stderr.at_eof():
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5.0)
        code = self.proc.poll()
        return "still running" if code is None else f"exited with {code}"

    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float | None = None) -> int:
        """SIGTERM, wait up to ``timeout`` (default ``stop_timeout``), then SIGKILL; the agent's exit status.

        Whatever is left of the agent's session afterwards (a helper process it started, perhaps still stuck on a
        hung mount) gets SIGKILL too, so a test leaves no process behind. Idempotent: a second call returns the
        same status. A process that not even SIGKILL ends within 5 s (stuck in the kernel) is left; the status is
        then ``-SIGKILL``.
        """
        timeout = self.stop_timeout if timeout is None else timeout
        proc = self.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
        self.kill()
        self._close()
        return proc.returncode if proc.returncode is not None else -signal.SIGKILL

    def kill(self) -> None:
        """SIGKILL the agent and every helper process in its session; wait up to 5 s for the agent."""
        # The agent leads its own session (start_new_session), so its pid is the group id of it and its helpers.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)

    def _close(self) -> None:
        # A helper the agent started may outlive it and still hold a pipe's write end. Closing a pipe that a reader
        # thread is blocked on would block too (the buffer's lock), so such a pipe is left to its daemon thread.
        for drain, pipe in ((self._stderr, self.proc.stderr), (self._stdout, self.proc.stdout)):
            if drain.join(2.0) and pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _environment(env: Mapping[str, str | None] | None) -> dict[str, str]:
    merged = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def _connect_host(listen: str) -> str:
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def start_agent(
    *args: str,
    env: Mapping[str, str | None] | None = None,
    stop_timeout: float = 5.0,
    cwd: str | os.PathLike[str] | None = None,
    nofile: int | None = None,
    prefix: Sequence[str] = (),
    python: str = sys.executable,
) -> AgentProcess:
    """Start ``python -m storwatch agent *args`` and return at once; :meth:`AgentProcess.wait_serving` waits for its
    port. The caller stops it (:meth:`AgentProcess.stop`). Starting several this way and then waiting for each lets
    them start concurrently. ``nofile``: the agent's file descriptor limit (RLIMIT_NOFILE, soft and hard).
    ``prefix``: a command that execs the agent (``setpriv --bounding-set=-all`` runs it without capabilities).
    ``python``: the interpreter (another virtual environment's, to run the storwatch installed there)."""
    cmd = [*prefix, python, "-m", "storwatch", "agent", *args]

    def limit_fds() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    started_at = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="replace",
        bufsize=1,
        env=_environment(env),
        cwd=str(cwd if cwd is not None else REPO_ROOT),
        start_new_session=True,
        preexec_fn=limit_fds if nofile is not None else None,
    )
    return AgentProcess(proc, stop_timeout, started_at)


@contextlib.contextmanager
def running_agent(
    *args: str,
    env: Mapping[str, str | None] | None = None,
    timeout: float = 10.0,
    stop_timeout: float = 5.0,
    cwd: str | os.PathLike[str] | None = None,
    nofile: int | None = None,
    prefix: Sequence[str] = (),
    python: str = sys.executable,
) -> Iterator[AgentProcess]:
    """Start ``python -m storwatch agent *args`` and yield it once it logged its port; stop it afterwards.

    ``args`` should include ``--listen 127.0.0.1:0``. ``env`` is laid over this process's environment (a value of
    None removes the variable). ``timeout`` bounds the wait for the port line; :class:`AgentStartError` (with the
    agent's stderr) if it exits first or the deadline passes. ``cwd`` defaults to the repository root, so the
    working tree's ``storwatch`` is the one imported. ``nofile``, ``python``: see :func:`start_agent`.
    """
    agent = start_agent(*args, env=env, stop_timeout=stop_timeout, cwd=cwd, nofile=nofile, prefix=prefix, python=python)
    try:
        agent.wait_serving(timeout)
        yield agent
    finally:
        agent.stop()
