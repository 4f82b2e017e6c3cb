"""Helpers shared by the benchmarks: percentiles, /proc readings, free ports, starting and stopping processes, and
an agent measured over a window while it is scraped.

Standard library only, so the benchmarks run with any Python 3.10+, the project's virtual environment included.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class HarnessError(RuntimeError):
    """The benchmark itself could not run (a process did not start, a port did not answer): exit non-zero."""


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100), linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "min": min(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
        "mean": sum(values) / len(values),
    }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the kernel picks it; a race with another program is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# -- /proc


def rss_kib(pid: int) -> int | None:
    """VmRSS of a process in KiB, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads) in seconds, or None when it is gone."""
    fields = stat_fields(f"/proc/{pid}/stat")
    if fields is None:
        return None
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLK_TCK


def tasks(pid: int) -> list[str]:
    """The thread ids of a process, from /proc/PID/task; empty when it is gone."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def stat_fields(path: str) -> list[str] | None:
    """The fields of a /proc stat file after the command's name (which may hold spaces and parentheses): field 3 of
    proc(5) is the first. None when it cannot be read (the process or thread ended)."""
    try:
        with open(path) as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(")") + 2 :].split()


def children(pid: int) -> list[int]:
    """Direct child processes, from /proc/PID/task/*/children (every thread can be a parent)."""
    found: list[int] = []
    for tid in tasks(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return sorted(set(found))


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (its helper processes, and theirs), found through :func:`children`."""
    found: list[int] = []
    todo = children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children(child))
    return found


@dataclass(frozen=True)
class ProcessSample:
    name: str
    """What it runs: the script or module of a Python process, else its command's name."""
    cpu_seconds: float
    """utime + stime."""
    ended_children_cpu_seconds: float
    """cutime + cstime: its children that ended and were waited for (a short-lived helper's CPU lands here)."""
    rss_kib: int


def process_name(pid: int) -> str:
    """``python -m storwatch agent`` -> ``storwatch``, ``python -I -S -c "...from storwatch.calls._blocking_worker
    import main..."`` -> ``storwatch.calls._blocking_worker``, ``sleep 5`` -> ``sleep``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return "?"
    for i, arg in enumerate(args[1:], 1):
        if arg == "-m" and i + 1 < len(args):
            return args[i + 1]
        if arg == "-c" and i + 1 < len(args):
            imported = re.search(r"from ([\w.]+) import", args[i + 1])
            return imported.group(1) if imported else "python -c"
        if arg.endswith(".py"):
            return os.path.basename(arg)
    return os.path.basename(args[0]) if args and args[0] else "?"


def family(pid: int) -> dict[int, ProcessSample]:
    """A process and every live descendant (its helper processes, and theirs), by PID; empty when it is gone. The
    CPU of the whole family, short-lived helpers included, is the sum of both CPU fields over all of them."""
    out = {}
    for p in [pid, *descendants(pid)]:
        fields = stat_fields(f"/proc/{p}/stat")
        if fields is None:
            continue
        utime, stime, cutime, cstime = (int(v) / CLK_TCK for v in fields[11:15])  # fields 14 to 17 of proc(5)
        out[p] = ProcessSample(process_name(p), utime + stime, cutime + cstime, rss_kib(p) or 0)
    return out


@dataclass(frozen=True)
class ThreadSample:
    name: str
    """The name the thread gave the OS (the agent names its threads after their parts: storwatch/threadname.py; a
    thread that gave none has its process's)."""
    cpu_seconds: float
    """Its time on a CPU so far, from /proc/PID/task/TID/schedstat: nanoseconds, finer than the clock tick of
    /proc/PID/stat, which matters at a few hundredths of a percent."""
    wakeups: int
    """Its voluntary context switches so far: each a sleep it left."""


def threads(pid: int) -> dict[int, ThreadSample]:
    """Each live thread of a process, by thread id; empty when the process is gone."""
    out: dict[int, ThreadSample] = {}
    for tid in tasks(pid):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = f.read().rstrip("\n")
            with open(f"{base}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"{base}/status") as f:
                switches = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except (OSError, ValueError, IndexError, StopIteration):
            continue  # ended between the listing and the reads
        out[int(tid)] = ThreadSample(name, ns / 1e9, switches)
    return out


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """Each of a process's threads' CPU seconds so far (:func:`threads`), by name, threads of one name summed and a
    thread that has ended no longer there; empty when the process is gone."""
    out: dict[str, float] = {}
    for sample in threads(pid).values():
        out[sample.name] = out.get(sample.name, 0.0) + sample.cpu_seconds
    return out


def family_cpu_seconds(samples: dict[int, ProcessSample]) -> float:
    return sum(s.cpu_seconds + s.ended_children_cpu_seconds for s in samples.values())


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    fields = stat_fields(f"/proc/{pid}/stat")
    return fields is not None and fields[0] != "Z"


def kernel() -> str:
    u = os.uname()
    return f"{u.sysname} {u.release} {u.machine}"


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": kernel(),
        "date": time.strftime("%Y-%m-%d"),
        "loadavg": os.getloadavg()[0],
    }


def _cpu_ticks() -> tuple[int, int] | None:
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]), idle


def cpu_busy_fraction(seconds: float) -> float | None:
    """Share of all CPUs' time spent busy over ``seconds`` (the load average also counts tasks in D state, which a
    hung mount leaves behind without using any CPU, so it is no measure of a busy machine)."""
    a = _cpu_ticks()
    time.sleep(seconds)
    b = _cpu_ticks()
    if a is None or b is None or b[0] == a[0]:
        return None
    return 1.0 - (b[1] - a[1]) / (b[0] - a[0])


def steal_ticks() -> int | None:
    """CPU time the hypervisor gave to others, all CPUs, in clock ticks since boot (/proc/stat's eighth field)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8])
    except (OSError, ValueError, IndexError):
        return None


def reference_cpu_ms(rounds: int = 5) -> float:
    """Median CPU time of a fixed pure-Python loop (a million additions): the speed of this machine right now, to
    tell a slow phase of a shared VM from a change in the code when absolute CPU figures of two runs differ."""
    times = []
    for _ in range(rounds):
        t0, total = time.process_time(), 0
        for i in range(1_000_000):
            total += i
        times.append(time.process_time() - t0)
    return sorted(times)[rounds // 2] * 1000


def fuse_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """The FUSE mount points in ``mountinfo``, as text for a message (a byte that is not UTF-8, as another test's
    mount point may hold, shown as U+FFFD), or none where it cannot be read."""
    found = []
    with contextlib.suppress(OSError), open(mountinfo, errors="replace") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.startswith("fuse") and not right.startswith("fusectl"):
                found.append(left.split()[4])
    return found


def quiet_machine_warnings() -> list[str]:
    """Things that make figures unrepresentative: load from other work, FUSE mounts (a test run may be going on;
    a FUSE mount whose statfs hangs stalls node_exporter's filesystem collector for its 5 s mount timeout)."""
    warnings = []
    busy = cpu_busy_fraction(1.0)
    if busy is not None and busy > 0.15:
        warnings.append(f"the CPUs were {busy:.0%} busy over 1 s before the run: other work is running; figures noisy")
    fuse = fuse_mounts()
    if fuse:
        warnings.append(
            f"{len(fuse)} FUSE mount(s) present ({', '.join(fuse[:3])}): a test run may be going on, and a hung one "
            "delays node_exporter's scrapes"
        )
    return warnings


# -- processes


def terminate(proc: subprocess.Popen[Any], grace: float = 5.0) -> str:
    """SIGTERM, then SIGKILL after ``grace`` seconds; always reaps. Says how it ended."""
    if proc.poll() is not None:
        return f"had exited ({proc.returncode})"
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
        return f"stopped by SIGTERM ({proc.returncode})"
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait(timeout=5)
    return "killed (SIGKILL)"


def kill_pid_if_alive(pid: int, grace: float = 2.0) -> str:
    """For a grandchild we did not Popen ourselves (the agent's helper): wait for it to go, else SIGKILL it by pid."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(pid):
            return "gone"
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return "left behind, killed (SIGKILL)"


# -- an agent under measurement


def get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body: bytes = resp.read()
        return body


def series_count(body: str) -> int:
    """Samples in an exposition (every line that is not blank and not a comment)."""
    return sum(1 for line in body.splitlines() if line and not line.startswith("#"))


def wait_ready(proc: subprocess.Popen[Any], port: int, timeout: float) -> float:
    """Wait until the agent answers /readyz with 200; the seconds that took. HarnessError when it exits first or the
    deadline passes."""
    start = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise HarnessError(f"the agent exited ({proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except OSError:  # not listening yet, or 503 until its first View
            pass
        if time.monotonic() - start > timeout:
            raise HarnessError(f"the agent was not ready within {timeout:g} s")
        time.sleep(0.2)


def measure_agent(
    proc: subprocess.Popen[Any],
    port: int,
    *,
    seconds: float,
    warmup: float,
    scrape_interval: float,
    tick: Callable[[int], None] | None = None,
    ready_timeout: float = 15.0,
    settled: Callable[[], bool] | None = None,
    settle_timeout: float = 600.0,
) -> tuple[dict[str, Any], str]:
    """A started agent, measured: wait for /readyz, call ``tick(n)`` once a second from then on (a bench moving its
    synthetic counters), wait until ``settled()`` says its start-up work is done (asked every 10 s, when given; a
    bench with a large tree waits for its first full walk), wait ``warmup`` seconds, scrape once unmeasured (the
    first scrape writes everything once: not the steady state), then for ``seconds`` scrape every
    ``scrape_interval`` seconds (0: never) and measure the CPU of the agent and of its helper processes
    (:func:`family`, helpers that ended included) as a share of one core, in all, by process name and by the agent's
    thread (:func:`thread_cpu_seconds`). The RSS of
    the agent and its helpers together is sampled twice a second from the start, so its maximum covers start-up
    too (and the maximum of each process name's). Returns the figures and the body of a last scrape, taken after
    the window."""
    url = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    rss_max = [0]
    rss_max_by_name: dict[str, int] = {}
    rss_timeline: list[tuple[float, dict[str, int]]] = []
    """(seconds since the agent started, each process name's RSS in KiB), every second sample: where the maximum
    comes (start-up, the first walk, the window)."""
    t_start = time.monotonic()
    scrapes: list[float] = []
    scrape_errors: list[str] = []

    def watch_rss() -> None:
        while True:
            by_name: dict[str, int] = {}
            for pid, sample in family(proc.pid).items():
                name = "agent" if pid == proc.pid else sample.name
                by_name[name] = by_name.get(name, 0) + sample.rss_kib
            rss_max[0] = max(rss_max[0], sum(by_name.values()))
            for name, kib in by_name.items():
                rss_max_by_name[name] = max(rss_max_by_name.get(name, 0), kib)
            if len(rss_timeline) < 20_000:
                rss_timeline.append((round(time.monotonic() - t_start, 1), by_name))
            if stop.wait(0.5):
                return

    def ticker() -> None:
        n = 1
        while tick is not None and not stop.wait(1.0):
            tick(n)
            n += 1

    def scraper() -> None:
        while scrape_interval > 0 and not stop.wait(scrape_interval):
            t0 = time.monotonic()
            try:
                get(f"{url}/metrics")
                scrapes.append(time.monotonic() - t0)
            except OSError as err:
                scrape_errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=f, daemon=True) for f in (watch_rss, ticker, scraper)]
    try:
        threads[0].start()
        started = time.monotonic()
        ready_seconds = wait_ready(proc, port, ready_timeout)
        threads[1].start()
        while settled is not None and not settled():
            if proc.poll() is not None:
                raise HarnessError(f"the agent exited ({proc.returncode}) during its start-up work")
            if time.monotonic() - started > settle_timeout:
                raise HarnessError(f"the agent had not done its start-up work within {settle_timeout:g} s")
            time.sleep(10.0)
        settle_seconds = time.monotonic() - started
        time.sleep(warmup)
        if scrape_interval > 0:
            get(f"{url}/metrics")
        threads[2].start()
        s0 = steal_ticks()
        threads_before = thread_cpu_seconds(proc.pid)
        before, w0, start_unix = family(proc.pid), time.monotonic(), time.time()
        window_from = w0 - t_start
        time.sleep(seconds)
        after, w1, end_unix = family(proc.pid), time.monotonic(), time.time()
        threads_after = thread_cpu_seconds(proc.pid)
        s1 = steal_ticks()
        if proc.poll() is not None:
            raise HarnessError(f"the agent exited ({proc.returncode}) during the measurement")
        body = get(f"{url}/metrics").decode()
        rss_end = rss_kib(proc.pid)
    finally:
        stop.set()
        for t in threads:
            if t.is_alive():
                t.join(15)
    wall = w1 - w0
    cpus = os.cpu_count() or 1
    total = family_cpu_seconds(after) - family_cpu_seconds(before)
    by_name: dict[str, float] = {}  # each live process's CPU in the window; what is left is that of helpers that ended
    for pid, sample in after.items():
        name = "agent" if pid == proc.pid else sample.name
        earlier = before[pid].cpu_seconds if pid in before else 0.0
        by_name[name] = by_name.get(name, 0.0) + sample.cpu_seconds - earlier
    ended = total - sum(by_name.values())
    if abs(ended) >= 1 / CLK_TCK:  # below a clock tick it is the rounding of the others
        by_name["helpers that ended"] = ended
    own = by_name.get("agent", 0.0)
    by_thread = {name: cpu - threads_before.get(name, 0.0) for name, cpu in threads_after.items()}
    steal = (s1 - s0) / CLK_TCK / wall / cpus if s0 is not None and s1 is not None else None
    return {
        "cpu_share_of_one_core": total / wall,
        "agent_cpu_share": own / wall,
        "helper_cpu_share": (total - own) / wall,
        "processes": {
            name: {"cpu_share": cpu / wall, "rss_max_bytes": rss_max_by_name.get(name, 0) * 1024}
            for name, cpu in sorted(by_name.items())
        },
        "agent_threads": {name: cpu / wall for name, cpu in sorted(by_thread.items(), key=lambda kv: -kv[1])},
        "seconds": wall,
        "window_unix": [start_unix, end_unix],
        "warmup_seconds": warmup,
        "ready_seconds": ready_seconds,
        "settle_seconds": settle_seconds,
        "series": series_count(body),
        "scrapes": len(scrapes),
        "scrape_seconds": summary(scrapes) if scrapes else None,
        "scrape_errors": scrape_errors,
        "rss_bytes": (rss_end or 0) * 1024 or None,
        "family_rss_max_bytes": rss_max[0] * 1024 or None,
        "family_rss_max_in_window_bytes": max(
            (sum(kib.values()) for t, kib in rss_timeline if t >= window_from), default=0
        )
        * 1024
        or None,
        "settled_at_seconds": round(window_from - warmup, 1),
        "rss_timeline": rss_timeline,
        "steal_share": steal,
    }, body


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2) + "\n")


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"
