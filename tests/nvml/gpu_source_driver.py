"""Runs one GPUSource and answers commands on stdin with JSON lines on stdout; it logs to stderr.

Commands: ``collect`` (one collect(): the facts, how long it took in wall and CPU seconds, and how many threads the
process has), ``close``, ``sleep SECONDS``, ``quit`` (exit without closing). Started by tests/nvml GPUSourceProcess
with LD_LIBRARY_PATH naming the fake libnvidia-ml.so.1, or none.

Options: --interval S, --call-timeout S, --samples-interval S (how often the sample buffers are read; 0, the default
here, every collect, so that each collect shows what the fake scripted since the last), --init-backoff S (the first
nvmlInit retry wait), --hide-pynvml (the bindings cannot be imported), --drop-binding NAME (delete pynvml.NAME:
bindings older than the code).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import threading
import time
from typing import Any


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--call-timeout", type=float, default=2.0)
    p.add_argument("--samples-interval", type=float, default=0.0)
    p.add_argument("--init-backoff", type=float, default=None)
    p.add_argument("--hide-pynvml", action="store_true")
    p.add_argument("--drop-binding", action="append", default=[])
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")

    if args.hide_pynvml:
        sys.modules["pynvml"] = None  # type: ignore[assignment]
    for name in args.drop_binding:
        import pynvml

        delattr(pynvml, name)

    from storwatch.sources import gpu

    source = gpu.GPUSource(
        interval_seconds=args.interval,
        call_timeout_seconds=args.call_timeout,
        samples_interval_seconds=args.samples_interval,
        **({} if args.init_backoff is None else {"init_backoff_seconds": args.init_backoff}),
    )

    def answer(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        cmd, _, rest = line.strip().partition(" ")
        try:
            if cmd == "collect":
                w0, c0 = time.monotonic(), time.process_time()
                facts = source.collect()
                wall, cpu = time.monotonic() - w0, time.process_time() - c0
                answer(
                    {
                        "facts": dataclasses.asdict(facts),
                        "failure": facts.failure,
                        "wall": wall,
                        "cpu": cpu,
                        "threads": threading.active_count(),
                    }
                )
            elif cmd == "close":
                w0 = time.monotonic()
                source.close()
                answer({"wall": time.monotonic() - w0, "threads": threading.active_count()})
            elif cmd == "sleep":
                time.sleep(float(rest))
                answer({})
            elif cmd == "quit":
                break
            else:
                answer({"exception": f"unknown command {cmd!r}"})
        except Exception as err:
            answer({"exception": f"{type(err).__name__}: {err}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
