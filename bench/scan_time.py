#!/usr/bin/env python3
"""Wall time of storwatch's commands as a user runs them, each a fresh process: ``storwatch --help``,
``storwatch verify`` of one checkpoint file, ``storwatch scan`` and ``storwatch scan --json``, beside the floors.

The runs alternate (help, verify, scan, ..., floors, help, ...) so that background work falls on all alike. Floors,
for reference, with the same interpreter as the ``storwatch`` script:
  python -c pass                       what any Python command costs on this machine
  python -I -S -c pass                 the floor of the helper process that scan starts for its statvfs calls
  python -c 'import <scan's modules>'  the import cost of scan's modules and their dependencies, without scanning

Cases marked ``.pyc`` keep compiled modules between runs (PYTHONPYCACHEPREFIX in a temporary directory): where
PYTHONDONTWRITEBYTECODE is set and storwatch is an editable install, the others compile storwatch's modules on every
run; an installed wheel has its ``.pyc`` files.

``--before DIR`` also runs each command with ``PYTHONPATH=DIR`` (a checkout of another commit, say), interleaved in
the same run, so that the two can be compared in one run on a noisy machine.

Targets (PASS/MISS is printed; a miss does not change the exit status, only a harness error does), p50 wall time:
  storwatch --help <= 0.15 s; storwatch verify FILE <= 0.3 s; storwatch scan and scan --json <= 0.3 s

Note: a mount whose statvfs hangs makes every scan wait for its deadline (``--timeout``, 0.3 s by default).

Usage: .venv/bin/python bench/scan_time.py [--runs 20] [--before DIR] [--json FILE]
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

TARGETS_P50_SECONDS = {
    "storwatch --help": 0.15,
    "storwatch verify FILE": 0.3,
    "storwatch scan": 0.3,
    "storwatch scan --json": 0.3,
}
SCAN_IMPORTS = "import storwatch.cli, storwatch.registry, storwatch.analysis.build, storwatch.report"
BEFORE = "before: "
PYC = ", .pyc"


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


def checkpoint_file(py: str, workdir: Path) -> tuple[str, str]:
    """A small checkpoint for `verify`: a real torch.save file where torch imports, else a safetensors file written
    here (both are read by the same modules; the check of a torch file reads its pickle too). Says which."""
    pt = workdir / "model.pt"
    made = subprocess.run(
        [py, "-c", "import sys, torch; torch.save({'w': torch.zeros(256, 256), 'step': 1}, sys.argv[1])", str(pt)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    if made.returncode == 0 and pt.is_file():
        return str(pt), "torch.save of a 256 KiB state dict"
    header = json.dumps({"w": {"dtype": "F32", "shape": [256, 256], "data_offsets": [0, 256 * 256 * 4]}}).encode()
    header += b" " * (-len(header) % 8)
    st = workdir / "model.safetensors"
    st.write_bytes(len(header).to_bytes(8, "little") + header + bytes(256 * 256 * 4))
    return str(st), "a 256 KiB safetensors file (torch is not installed)"


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
    expected = {"table": b"MOUNTPOINT", "help": b"usage: storwatch", "verify": b"COMPLETE"}.get(check_output or "")
    if expected is not None and expected not in proc.stdout:
        raise HarnessError(f"{' '.join(cmd)} printed no {expected.decode()!r}:\n{proc.stdout[:500]!r}")
    if check_output == "json":
        try:
            json.loads(proc.stdout)
        except ValueError as err:
            raise HarnessError(f"{' '.join(cmd)} printed no JSON ({err}):\n{proc.stdout[:500]!r}") from err
    return wall, proc.stdout


def _hung(mount: dict[str, Any]) -> bool:
    return bool(mount.get("stuck")) or "in flight" in (mount.get("usage_error") or "")


def command_cases(sw: str, checkpoint: str, plain: dict[str, str], pyc: dict[str, str], prefix: str) -> list[Case]:
    """Each command, plainly and with its .pyc files kept; ``prefix`` names the code they run."""
    commands = [
        ("storwatch --help", ["--help"], "help", True),
        ("storwatch verify FILE", ["verify", checkpoint], "verify", True),
        ("storwatch scan", ["scan"], "table", True),
        ("storwatch scan --json", ["scan", "--json"], "json", False),
    ]
    cases = []
    for name, args, check, with_pyc in commands:
        cases.append(Case(prefix + name, [sw, *args], check, plain))
        if with_pyc:
            cases.append(Case(prefix + name + PYC, [sw, *args], check, pyc))
    return cases


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sw = find_storwatch(args.storwatch)
    py = interpreter_of(sw)
    checkpoint, checkpoint_kind = checkpoint_file(py, workdir)
    # Bytecode: with PYTHONDONTWRITEBYTECODE=1 (set in some environments) and an editable install, storwatch's own
    # modules are compiled from source on every run. An installed wheel has its .pyc files; PYTHONPYCACHEPREFIX
    # gives the same to the cases marked ".pyc" without writing into the source tree.
    env = dict(os.environ)
    pyc_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    pyc_env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    cases = command_cases(sw, checkpoint, env, pyc_env, "")
    if args.before:
        before = os.path.abspath(args.before)
        if not os.path.isfile(os.path.join(before, "storwatch", "__init__.py")):
            raise HarnessError(f"--before {args.before}: no storwatch package there")
        cases += command_cases(sw, checkpoint, {**env, "PYTHONPATH": before}, {**pyc_env, "PYTHONPATH": before}, BEFORE)
    cases += [
        Case("python -c pass", [py, "-c", "pass"]),
        Case("python -I -S -c pass", [py, "-I", "-S", "-c", "pass"]),
        Case("python -c 'import ...'", [py, "-c", SCAN_IMPORTS]),
        Case("python -c 'import ...', .pyc", [py, "-c", SCAN_IMPORTS], None, pyc_env),
        Case("python -c 'import yaml'", [py, "-c", "import yaml"]),
    ]
    result: dict[str, Any] = {"benchmark": "scan_time", "machine": machine_info(), "runs": args.runs}
    result["warnings"] = quiet_machine_warnings()
    for w in result["warnings"]:
        print(f"WARNING: {w}")
    print(f"storwatch: {sw}\ninterpreter: {py}\nverify's file: {checkpoint_kind}")
    if args.before:
        print(f"before: the same commands with PYTHONPATH={os.path.abspath(args.before)}")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("PYTHONDONTWRITEBYTECODE is set: cases without '.pyc' compile storwatch's modules on every run")
    print(f"import floor: {SCAN_IMPORTS}")

    # A mount that does not answer statvfs (another program's hung FUSE mount, say) adds the statvfs deadline to
    # every scan. The plain scan stays the measured one; a second case leaves those filesystem types out
    # (mounts.exclude_fstypes in a config file) to show the time on a node without the hung mount.
    _, probe_out = timed([sw, "scan", "--json"], "json")
    hung_types = sorted({m["fstype"] for m in json.loads(probe_out)["mounts"] if _hung(m)})
    if hung_types:
        cfg = workdir / "exclude-hung.yaml"
        cfg.write_text("mounts:\n  exclude_fstypes: [" + ", ".join(json.dumps(t) for t in hung_types) + "]\n")
        name = f"scan without {','.join(hung_types)}"
        cases += [
            Case(name, [sw, "scan", "--config", str(cfg)], "table", env),
            Case(name + PYC, [sw, "scan", "--config", str(cfg)], "table", pyc_env),
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
            if c.name == "storwatch scan --json":
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
    stats: dict[str, Any] = {c.name: summary(c.times) for c in cases}
    floor = stats["python -c pass"]["p50"]
    print(f"\n{'wall time (ms)':40s} {'min':>8s} {'p50':>8s} {'p90':>8s} {'max':>8s}  {'p50 / python -c pass':>20s}")
    for c in cases:
        s = stats[c.name]
        print(
            f"  {c.name:38s} {fmt_ms(s['min']):>8s} {fmt_ms(s['p50']):>8s} {fmt_ms(s['p90']):>8s} "
            f"{fmt_ms(s['max']):>8s}  {s['p50'] / floor:19.1f}x"
        )
    if args.before:
        print(f"\n{'p50 (ms)':40s} {'before':>8s} {'after':>8s} {'after / before':>15s}")
        for c in cases:
            if c.name.startswith(BEFORE):
                name = c.name.removeprefix(BEFORE)
                then, after = stats[c.name]["p50"], stats[name]["p50"]
                print(f"  {name:38s} {fmt_ms(then):>8s} {fmt_ms(after):>8s} {after / then:15.2f}")
    imports = stats["python -c 'import ...'"]["p50"]
    imports_pyc = stats["python -c 'import ...', .pyc"]["p50"]
    print()
    for name in ("storwatch scan", "storwatch scan" + PYC):
        base = imports_pyc if name.endswith(PYC) else imports
        print(
            f"  {name:38s} beyond its imports: {fmt_ms(stats[name]['p50'] - base)} ms (collecting, the helper "
            "process, building and printing the report)"
        )
    yaml_cost = stats["python -c 'import yaml'"]["p50"] - floor
    print(f"  {'scan imports':38s} {fmt_ms(imports - floor)} ms beyond python -c pass")
    print(f"  {'yaml':38s} {fmt_ms(yaml_cost)} ms (imported to read a --config file)")
    print(f"  {'of which compiling (no .pyc)':38s} {fmt_ms(imports - imports_pyc)} ms")
    result["import_costs_ms"] = {
        "scan": (imports - floor) * 1000,
        "yaml": yaml_cost * 1000,
        "compiling_without_pyc": (imports - imports_pyc) * 1000,
    }
    if collect:
        cs = summary(collect)
        result["collector_duration"] = cs
        print(
            f"  {'collection':38s} {fmt_ms(cs['p50'])} ms p50 (max {fmt_ms(cs['max'])}) per collector, "
            "as scan --json reports it"
        )
    result["stats"] = stats
    targets: dict[str, Any] = {}
    print()
    for name, target in TARGETS_P50_SECONDS.items():
        p50 = stats[name]["p50"]
        ok = p50 <= target
        targets[name] = {"p50_seconds": p50, "max_seconds": stats[name]["max"], "target": target, "pass": ok}
        print(f"TARGET {name} p50 <= {target:.2f} s: {p50:.3f} s (max {stats[name]['max']:.3f} s)  {verdict(ok)}")
    for c in cases:
        base = c.name.removesuffix(PYC)
        if c.name.endswith(PYC) and base in TARGETS_P50_SECONDS:
            p50 = stats[c.name]["p50"]
            ok = p50 <= TARGETS_P50_SECONDS[base]
            print(f"INFO   {c.name} p50: {p50:.3f} s (max {stats[c.name]['max']:.3f} s)  {verdict(ok)}")
        elif c.name.startswith("scan without"):
            print(f"INFO   {c.name} p50: {stats[c.name]['p50']:.3f} s (max {stats[c.name]['max']:.3f} s)")
    result["targets"] = targets
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="timed runs of each command (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs of each command first (default 2)")
    p.add_argument("--storwatch", help="storwatch executable (default .venv/bin/storwatch)")
    p.add_argument("--before", metavar="DIR", help="also run each command with PYTHONPATH=DIR, interleaved")
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
