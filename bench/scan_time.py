#!/usr/bin/env python3
"""Wall time of ``storwatch scan`` and ``storwatch scan --json``, each a fresh process, as a user runs them.

The runs alternate (scan, scan --json, floors, scan, ...) so that background work falls on all alike. Floors,
for reference, with the same interpreter as the ``storwatch`` script:
  python -c pass                       what any Python command costs on this machine
  python -I -S -c pass                 the floor of the helper process that scan starts for its statvfs calls
  python -c 'import <scan's modules>'  the import cost of storwatch and its dependencies, without scanning

Target (PASS/MISS is printed; a miss does not change the exit status, only a harness error does):
  p50 wall time of ``storwatch scan`` <= 0.5 s (and of ``storwatch scan --json``)

Note: a mount whose statvfs hangs makes every scan wait for its deadline (``--timeout``, 0.3 s by default).

Usage: .venv/bin/python bench/scan_time.py [--runs 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (
    ROOT,
    VENV_BIN,
    HarnessError,
    fmt_ms,
    machine_info,
    quiet_machine_warnings,
    summary,
    verdict,
    write_json,
)

TARGET_P50_SECONDS = 0.5
SCAN_IMPORTS = "import storwatch.cli, storwatch.agent, storwatch.report"
# What scan needs without storwatch.agent (which it imports only for resolve_platform, and which pulls in the
# exporter with prometheus_client and the web server with http.server and ssl).
SCAN_IMPORTS_NO_AGENT = (
    "import storwatch.cli, storwatch.report, storwatch.classify, storwatch.analysis.view, storwatch.sources.mounts"
)


def find_storwatch(arg: str | None) -> str:
    if arg:
        if os.access(arg, os.X_OK):
            return arg
        raise HarnessError(f"--storwatch {arg}: not an executable")
    for cand in (str(VENV_BIN / "storwatch"), shutil.which("storwatch")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise HarnessError("no storwatch executable (make the virtual environment first: make run / make test-fast)")


def interpreter_of(script: str) -> str:
    """The interpreter named on the script's #! line (what runs `storwatch`), else this one."""
    try:
        with open(script, "rb") as f:
            first = f.readline().decode("utf-8", "replace").strip()
    except OSError:
        return sys.executable
    if first.startswith("#!"):
        words = first[2:].split()
        if words and os.access(words[0], os.X_OK) and not words[0].endswith("/env"):
            return words[0]
    return sys.executable


@dataclass
class Case:
    name: str
    cmd: list[str]
    check: str | None = None
    env: dict[str, str] | None = None
    times: list[float] = field(default_factory=list)


def timed(cmd: list[str], check_output: str | None = None, env: dict[str, str] | None = None) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):  # 1 would be "findings" (EXIT_FINDINGS), still a finished scan
        err = proc.stderr.decode("utf-8", "replace")[-2000:]
        raise HarnessError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{err}")
    if check_output == "table" and b"MOUNTPOINT" not in proc.stdout:
        raise HarnessError(f"{' '.join(cmd)} printed no table:\n{proc.stdout[:500]!r}")
    if check_output == "json":
        try:
            json.loads(proc.stdout)
        except ValueError as err:
            raise HarnessError(f"{' '.join(cmd)} printed no JSON ({err}):\n{proc.stdout[:500]!r}") from err
    return wall, proc.stdout


def _hung(mount: dict[str, Any]) -> bool:
    return bool(mount.get("stuck")) or "in flight" in (mount.get("usage_error") or "")


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sw = find_storwatch(args.storwatch)
    py = interpreter_of(sw)
    # Bytecode: with PYTHONDONTWRITEBYTECODE=1 (set in some environments) and an editable install, storwatch's own
    # modules are compiled from source on every run. An installed wheel has its .pyc files; PYTHONPYCACHEPREFIX
    # gives the same to the cases marked ".pyc" without writing into the source tree.
    pyc_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    pyc_env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    cases = [
        Case("storwatch scan", [sw, "scan"], "table"),
        Case("storwatch scan --json", [sw, "scan", "--json"], "json"),
        Case("storwatch scan, .pyc", [sw, "scan"], "table", pyc_env),
        Case("python -c pass", [py, "-c", "pass"]),
        Case("python -I -S -c pass", [py, "-I", "-S", "-c", "pass"]),
        Case("python -c 'import ...'", [py, "-c", SCAN_IMPORTS]),
        Case("  ... without agent", [py, "-c", SCAN_IMPORTS_NO_AGENT]),
        Case("python -c 'import ...', .pyc", [py, "-c", SCAN_IMPORTS], None, pyc_env),
        Case("python -c 'import yaml'", [py, "-c", "import yaml"]),
    ]
    result: dict[str, Any] = {"benchmark": "scan_time", "machine": machine_info(), "runs": args.runs}
    result["warnings"] = quiet_machine_warnings()
    for w in result["warnings"]:
        print(f"WARNING: {w}")
    print(f"storwatch: {sw}\ninterpreter: {py}")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("PYTHONDONTWRITEBYTECODE is set: cases without '.pyc' compile storwatch's modules on every run")
    print(f"import floors: {SCAN_IMPORTS}\n          and: {SCAN_IMPORTS_NO_AGENT}")

    # A mount that does not answer statvfs (another program's hung FUSE mount, say) adds the statvfs deadline to
    # every scan. The plain scan stays the measured one; a second case leaves those filesystem types out
    # (mounts.exclude_fstypes in a config file) to show the time on a node without the hung mount.
    _, probe_out = timed([sw, "scan", "--json"], "json")
    hung_types = sorted({m["fstype"] for m in json.loads(probe_out)["mounts"] if _hung(m)})
    if hung_types:
        cfg = workdir / "exclude-hung.yaml"
        cfg.write_text("mounts:\n  exclude_fstypes: [" + ", ".join(json.dumps(t) for t in hung_types) + "]\n")
        name = f"scan without {','.join(hung_types)}"
        cases[3:3] = [
            Case(name, [sw, "scan", "--config", str(cfg)], "table"),
            Case(name + ", .pyc", [sw, "scan", "--config", str(cfg)], "table", pyc_env),
        ]
        print(f"a mount of type {', '.join(hung_types)} does not answer statvfs: also timing '{name}'")
    collect: list[float] = []  # the mount collector's own duration, as scan --json reports it
    last_json = b""
    for _ in range(max(args.warmup, 1)):  # at least one: it fills the .pyc cache
        for c in cases:
            timed(c.cmd, c.check, c.env)
    for _ in range(args.runs):
        for c in cases:
            wall, out = timed(c.cmd, c.check, c.env)
            c.times.append(wall)
            if c.check == "json":
                last_json = out
                collect.extend(c["duration_seconds"] for c in json.loads(out).get("collectors", []))

    data = json.loads(last_json)
    mounts = data.get("mounts", [])
    # A mount whose statvfs did not return in time: reported "stuck", or "statvfs in flight" when the deadline
    # passed a hair before the age check.
    hung = [m["mountpoint"] for m in mounts if _hung(m)]
    result["mounts"] = len(mounts)
    result["hung_mounts"] = hung
    print(f"\n{args.runs} runs each, interleaved; the scan saw {len(mounts)} mounts, {len(hung)} not answering statvfs")
    if hung:
        print(
            f"  WARNING: {', '.join(hung)}: each scan waits out the statvfs deadline ({args.timeout_hint} s by "
            "default) for it, so these times are not those of a healthy node"
        )
    print(f"\n{'wall time (ms)':36s} {'min':>8s} {'p50':>8s} {'p90':>8s} {'max':>8s}")
    stats: dict[str, Any] = {}
    for c in cases:
        s = summary(c.times)
        stats[c.name] = s
        print(
            f"  {c.name:34s} {fmt_ms(s['min']):>8s} {fmt_ms(s['p50']):>8s} {fmt_ms(s['p90']):>8s} "
            f"{fmt_ms(s['max']):>8s}"
        )
    floor = stats["python -c pass"]["p50"]
    imports = stats["python -c 'import ...'"]["p50"]
    print()
    imports_pyc = stats["python -c 'import ...', .pyc"]["p50"]
    for name in [c.name for c in cases if c.name.startswith(("storwatch scan", "scan without"))]:
        p50 = stats[name]["p50"]
        base = imports_pyc if name.endswith(".pyc") else imports
        print(
            f"  {name:34s} p50 = {p50 / floor:5.1f} x python -c pass; beyond its imports: "
            f"{fmt_ms(p50 - base)} ms (collecting, the helper process, building and printing the report)"
        )
    print(f"  {'imports':34s} {fmt_ms(imports - floor)} ms beyond python -c pass")
    no_agent = stats["  ... without agent"]["p50"]
    yaml_cost = stats["python -c 'import yaml'"]["p50"] - floor
    print(f"  {'of which storwatch.agent':34s} {fmt_ms(imports - no_agent)} ms (imported for resolve_platform only)")
    print(f"  {'of which yaml':34s} {fmt_ms(yaml_cost)} ms (storwatch.config imports it even without --config)")
    pyc_saves = imports - stats["python -c 'import ...', .pyc"]["p50"]
    print(f"  {'of which compiling (no .pyc)':34s} {fmt_ms(pyc_saves)} ms")
    result["import_costs_ms"] = {
        "all": (imports - floor) * 1000,
        "storwatch_agent": (imports - no_agent) * 1000,
        "yaml": yaml_cost * 1000,
        "compiling_without_pyc": pyc_saves * 1000,
    }
    if collect:
        cs = summary(collect)
        result["collector_duration"] = cs
        print(
            f"  {'mount collection':34s} {fmt_ms(cs['p50'])} ms p50 (max {fmt_ms(cs['max'])}), "
            "as scan --json reports it"
        )
    result["stats"] = stats
    targets: dict[str, Any] = {}
    print()
    for name in ("storwatch scan", "storwatch scan --json"):
        p50 = stats[name]["p50"]
        ok = p50 <= TARGET_P50_SECONDS
        targets[name] = {
            "p50_seconds": p50,
            "max_seconds": stats[name]["max"],
            "target": TARGET_P50_SECONDS,
            "pass": ok,
        }
        print(
            f"TARGET {name} p50 <= {TARGET_P50_SECONDS:.1f} s: {p50:.3f} s (max {stats[name]['max']:.3f} s)  "
            f"{verdict(ok)}"
        )
    for name in [c.name for c in cases[2:] if c.name.startswith(("scan without", "storwatch scan"))]:
        p50 = stats[name]["p50"]
        print(f"INFO   {name} p50: {p50:.3f} s (max {stats[name]['max']:.3f} s)")
    result["targets"] = targets
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="timed runs of each command (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs of each command first (default 2)")
    p.add_argument("--storwatch", help="storwatch executable (default .venv/bin/storwatch)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    args.timeout_hint = 0.3
    if args.runs < 1 or args.warmup < 0:
        p.error("--runs must be >= 1 and --warmup >= 0")
    os.chdir(ROOT)
    try:
        with tempfile.TemporaryDirectory(prefix="storwatch-scan-bench-") as tmp:
            result = run(args, Path(tmp))
    except (HarnessError, OSError, subprocess.SubprocessError) as err:
        print(f"scan_time: harness error: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
