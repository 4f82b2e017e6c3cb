#!/usr/bin/env python3
"""NVML sampling cost of the GPU source per tick: 8 GPUs, one collect() a second, on the fake libnvidia-ml.so.1.

The fake library (tests/nvml/fake_nvml.c, built here with gcc) is loaded by the real nvidia-ml-py bindings through
LD_LIBRARY_PATH in a child process (the project's venv Python), scripted as a busy training node: 8 GPUs, two
compute processes each with per-process utilisation samples, utilisation samples every 1/6 s as the driver takes
them, MIG off, Xid events registered. The child runs ``GPUSource.collect()`` once per ``--interval`` (1 s) for
``--ticks`` ticks and times each: CPU seconds of the whole process (``time.process_time``: the calling thread and
the NVML worker thread) and wall seconds. The first tick (nvmlInit) is reported apart.

For reference, the child also times the floor: the same NVML calls made straight through pynvml, in a loop, without
the source (no wrapper, no worker thread, no dataclasses). The fake answers from memory, so both figures are the
cost of Python, the bindings and the source; a real driver adds its ioctls (tens of microseconds a call, more for
process lists) to both alike.

Target (PASS/MISS is printed; a miss does not change the exit status, only a harness error does):
  p99 CPU per collect() for 8 GPUs <= 10 ms (1 % of one core at one tick a second)

Usage: .venv/bin/python bench/gpu_sampling.py [--ticks 60] [--interval 1.0] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
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

sys.path.insert(0, str(ROOT))

from tests.nvml import FakeNVML, FakeNVMLUnavailable, build_fake_nvml

TARGET_P99_CPU_SECONDS = 0.010
GPUS = 8
GIB = 1 << 30

SCRIPT = "\n".join(
    [
        "driver 550.54.15",
        *(
            f"gpu {i} uuid=GPU-{i:08x}-0000-0000-0000-{i:012x} name=NVIDIA_H100_80GB_HBM3 util={60 + i} "
            f"mem_util={30 + i} mem_used={(40 + i) * GIB} mem_reserved={GIB // 2} mem_total={80 * GIB} "
            f"power_mw={350000 + i * 1000} temp={60 + i} throttle=0 sample_ms=166"
            for i in range(GPUS)
        ),
        *(f"proc {i} pid={1000 + 2 * i} used={30 * GIB} sm={80 + i}" for i in range(GPUS)),
        *(f"proc {i} pid={1001 + 2 * i} used={GIB}" for i in range(GPUS)),
        "",
    ]
)

# The child: runs in the venv's Python with LD_LIBRARY_PATH naming the fake. Prints one JSON object.
CHILD = r"""
import json, sys, time
from storwatch.sources.gpu import GPUSource
import pynvml as nv

ticks, interval = int(sys.argv[1]), float(sys.argv[2])
source = GPUSource(interval_seconds=interval)
first = None
cpu, wall, samples_per_tick = [], [], []
for n in range(ticks + 1):
    start = time.monotonic()
    c0, w0 = time.process_time(), time.monotonic()
    facts = source.collect()
    c1, w1 = time.process_time(), time.monotonic()
    if not facts.nvml_up or len(facts.gpus) != 8 or not all(g.up for g in facts.gpus):
        print(json.dumps({"error": f"unexpected facts: {facts}"}))
        sys.exit(1)
    if n == 0:
        first = {"cpu": c1 - c0, "wall": w1 - w0}
    else:
        cpu.append(c1 - c0)
        wall.append(w1 - w0)
        samples_per_tick.append(sum(len(g.utilization_samples) for g in facts.gpus))
    time.sleep(max(0.0, interval - (time.monotonic() - start)))
source.close()

# The floor: the same calls straight through pynvml, no source around them.
nv.nvmlInit()
handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
last = [0] * len(handles)
es = nv.nvmlEventSetCreate()
for h in handles:
    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
raw = []
for n in range(max(ticks, 200)):
    c0 = time.process_time()
    nv.nvmlDeviceGetCount()
    try:
        nv.nvmlEventSetWait_v2(es, 0)
    except nv.NVMLError:
        pass
    for i, h in enumerate(handles):
        nv.nvmlDeviceGetUtilizationRates(h)
        try:
            got = nv.nvmlDeviceGetSamples(h, 1, last[i])[1]
            last[i] = max(int(x.timeStamp) for x in got)
        except nv.NVMLError:
            pass
        nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        nv.nvmlDeviceGetPowerUsage(h)
        nv.nvmlDeviceGetTemperatureV(h, 0)
        nv.nvmlDeviceGetCurrentClocksEventReasons(h)
        nv.nvmlDeviceGetComputeRunningProcesses_v3(h)
        try:
            nv.nvmlDeviceGetProcessUtilization(h, 0)
        except nv.NVMLError:
            pass
        nv.nvmlDeviceGetMigMode(h)
    raw.append(time.process_time() - c0)
    time.sleep(0.005)
nv.nvmlEventSetFree(es)
nv.nvmlShutdown()
print(json.dumps({"first": first, "cpu": cpu, "wall": wall, "raw_cpu": raw, "samples_per_tick": samples_per_tick}))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ticks", type=int, default=60, help="collects to time after the first (default 60)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between collects (default 1.0)")
    p.add_argument("--json", help="write the figures here as JSON")
    args = p.parse_args(argv)

    python = VENV_BIN / "python"
    if not python.exists():
        raise HarnessError(f"{python} not found: make the venv first (make test-fast)")
    for w in quiet_machine_warnings():
        print(f"WARNING: {w}")
    with tempfile.TemporaryDirectory(prefix="storwatch-bench-gpu-") as tmp:
        try:
            lib = build_fake_nvml(Path(tmp) / "lib")
        except FakeNVMLUnavailable as err:
            raise HarnessError(str(err)) from err
        nvml = FakeNVML(lib.parent, Path(tmp))
        nvml.write_script(SCRIPT)
        env = dict(os.environ)
        env.update(nvml.env())
        env["PYTHONPATH"] = str(ROOT)
        print(f"{GPUS} GPUs on the fake NVML, {args.ticks} collects {args.interval} s apart ...", flush=True)
        t0 = time.monotonic()
        proc = subprocess.run(
            [str(python), "-c", CHILD, str(args.ticks), str(args.interval)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise HarnessError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        counts = nvml.counts()
    elapsed = time.monotonic() - t0

    cpu, wall, raw = summary(data["cpu"]), summary(data["wall"]), summary(data["raw_cpu"])
    first = data["first"]
    samples = summary(data["samples_per_tick"])
    print(f"ran {elapsed:.1f} s; nvmlInit {counts['init']}x, nvmlShutdown {counts['shutdown']}x")
    print(
        f"first collect (nvmlInit, handles, event registration): cpu {fmt_ms(first['cpu'])} ms, "
        f"wall {fmt_ms(first['wall'])} ms"
    )
    print(f"{'per collect, ms':<34} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    for label, s in (
        ("CPU, GPUSource.collect()", cpu),
        ("wall, GPUSource.collect()", wall),
        ("CPU, same calls raw via pynvml", raw),
    ):
        print(f"{label:<34} {fmt_ms(s['p50']):>8} {fmt_ms(s['p90']):>8} {fmt_ms(s['p99']):>8} {fmt_ms(s['max']):>8}")
    print(f"per GPU: cpu p50 {fmt_ms(cpu['p50'] / GPUS)} ms; source / raw p50 {cpu['p50'] / raw['p50']:.2f}x")
    print(f"utilisation samples per tick (8 GPUs): p50 {samples['p50']:.0f}")
    print(f"share of one core at {args.interval} s: {cpu['p50'] / args.interval:.2%} (p50)")
    ok = cpu["p99"] <= TARGET_P99_CPU_SECONDS
    print(f"{verdict(ok)}: p99 CPU per collect {fmt_ms(cpu['p99'])} ms <= {fmt_ms(TARGET_P99_CPU_SECONDS)} ms")
    write_json(
        args.json,
        {
            "machine": machine_info(),
            "gpus": GPUS,
            "ticks": args.ticks,
            "interval_seconds": args.interval,
            "first_collect": first,
            "cpu_seconds": cpu,
            "wall_seconds": wall,
            "raw_pynvml_cpu_seconds": raw,
            "utilization_samples_per_tick": samples,
            "target_p99_cpu_seconds": TARGET_P99_CPU_SECONDS,
            "pass": ok,
        },
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HarnessError as err:
        print(f"harness error: {err}", file=sys.stderr)
        sys.exit(2)
