"""Runs one GPUSource and answers commands on stdin with JSON lines on stdout; it logs to stderr.

Commands: ``collect`` (one collect(): the facts, how long it took in wall and CPU seconds, how many threads the
process has, and the source's interval_seconds after it), ``close``, ``sleep SECONDS``, ``quit`` (exit without
closing), and with --manual-clock ``ticks N STEP``: N runs through the agent's own collector worker
(storwatch.agent.collectors), the manual clock moved STEP seconds after each; the answer lists nvmlInit's attempts
so far after each run, and the collector's failure count. Started by tests/nvml GPUSourceProcess with
LD_LIBRARY_PATH naming the fake libnvidia-ml.so.1, or none.

Options: --interval S, --call-timeout S, --samples-interval S (how often the sample buffers are read; 0, the default
here, every collect, so that each collect shows what the fake scripted since the last), --init-backoff S (the first
nvmlInit retry wait), --manual-clock (the source's wall clock and the nvmlInit backoff's clock are one clock that
moves only by ``ticks``), --hide-pynvml (the bindings cannot be imported), --drop-binding NAME (delete pynvml.NAME:
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
    p.add_argument("--manual-clock", action="store_true")
    p.add_argument("--hide-pynvml", action="store_true")
    p.add_argument("--drop-binding", action="append", default=[])
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")

    if args.hide_pynvml:
        sys.modules["pynvml"] = None  # type: ignore[assignment]
    for name in args.drop_binding:
        import pynvml

        delattr(pynvml, name)

    from storwatch.agent.collectors import Collectors, given
    from storwatch.paths import HostPaths
    from storwatch.registry import SourceContext
    from storwatch.sources import gpu

    now = [1_000_000.0]
    clocks: dict[str, Any] = {"clock": lambda: now[0], "monotonic": lambda: now[0]} if args.manual_clock else {}
    source = gpu.GPUSource(
        interval_seconds=args.interval,
        call_timeout_seconds=args.call_timeout,
        samples_interval_seconds=args.samples_interval,
        **({} if args.init_backoff is None else {"init_backoff_seconds": args.init_backoff}),
        **clocks,
    )
    state = given(source)
    # The agent's context, but for the pace: the default one (no budget, never quiet), so the source waits its own.
    context = SourceContext(HostPaths(), lambda: now[0], lambda key: None, lambda consumer: None)
    collectors = Collectors([state], context, lambda: now[0], threading.Event(), lambda: None)

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
                        "interval": source.interval_seconds,
                    }
                )
            elif cmd == "close":
                w0 = time.monotonic()
                source.close()
                answer({"wall": time.monotonic() - w0, "threads": threading.active_count()})
            elif cmd == "sleep":
                time.sleep(float(rest))
                answer({})
            elif cmd == "ticks":
                count, step = rest.split()
                attempts = []
                for _ in range(int(count)):
                    collectors.collect_once(state)
                    attempts.append(source._sampler.nvml.init_attempts)
                    now[0] += float(step)
                answer({"init_attempts": attempts, "failures": state.failures, "error": state.last_error})
            elif cmd == "quit":
                break
            else:
                answer({"exception": f"unknown command {cmd!r}"})
        except Exception as err:
            answer({"exception": f"{type(err).__name__}: {err}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
