"""Scrape latency while the policy engine meets a rule too slow for its budget: two agents on this machine, one
with the policy off (the peer) and one whose policy holds a rule that costs more than ``policy.budget_seconds``
over one View (a comprehension of regular expressions over every mount's fields, with a budget of 1 ms), scraped in
turns. The slow rule must be disabled with its reason; the scrape p99 of both is printed, and their ratio. Target:
the agent with the slow rule answers scrapes with a p99 under 100 ms.

Usage: .venv/bin/python bench/policy_scrape.py [--scrapes 500] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, HarnessError, free_port, percentile, terminate, verdict, write_json

SLOW_RULE = """rules:
  - name: slow-rule
    on: mount
    when: >-
      [mountpoint, device, fstype, durability].exists(s,
        s.matches('^(/[a-z0-9._-]+)+/?$') && s.contains('never-there') && s.matches('.*x.*y.*z.*'))
    actions: [{action: log}]
"""


def get(port: int, path: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        body = resp.read()
    return time.perf_counter() - started, body


def start(work: Path, name: str, policy: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cfg = work / f"{name}-config.yaml"
    cfg.write_text(f"kube: {{enabled: false}}\ngpu: {{enabled: false}}\n{policy}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "storwatch", "agent", "--config", str(cfg), "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(work / f"{name}.log", "wb"),  # noqa: SIM115 (closed with the process)
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if get(port, "/api/status")[1]:
                return proc, port
        except OSError:
            time.sleep(0.2)
    terminate(proc)
    raise HarnessError(f"the {name} agent did not serve within 60 s: {(work / f'{name}.log').read_text()[-2000:]}")


def run(scrapes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "slow.yaml").write_text(SLOW_RULE)
        peer, peer_port = start(work, "peer", "policy: {enabled: false}\n")
        slow, slow_port = start(
            work, "slow", f"policy: {{default_set: false, budget_seconds: 0.001, files: [{work / 'slow.yaml'}]}}\n"
        )
        try:
            times: dict[str, list[float]] = {"peer": [], "slow": []}
            for _ in range(scrapes):
                for name, port in (("peer", peer_port), ("slow", slow_port)):
                    times[name].append(get(port, "/metrics")[0])
                time.sleep(0.01)
            status = json.loads(get(slow_port, "/api/status")[1])["policy"]
        finally:
            terminate(peer)
            terminate(slow)
    rules = [r for r in status["rules"] if r["name"] == "slow-rule"]
    if not rules:
        raise HarnessError(f"the slow rule was not loaded: {status}")
    (rule,) = rules
    return {
        "scrapes": scrapes,
        "p50_ms": {k: percentile(v, 50) * 1000 for k, v in times.items()},
        "p99_ms": {k: percentile(v, 99) * 1000 for k, v in times.items()},
        "disabled_reason": rule["disabled_reason"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrapes", type=int, default=500)
    ap.add_argument("--json")
    args = ap.parse_args()
    out = run(args.scrapes)
    p50, p99 = out["p50_ms"], out["p99_ms"]
    print(f"scrapes: {out['scrapes']} each, in turns")
    print(f"peer (policy off):   p50 {p50['peer']:.2f} ms, p99 {p99['peer']:.2f} ms")
    ratio = p99["slow"] / p99["peer"]
    print(f"slow rule, disabled: p50 {p50['slow']:.2f} ms, p99 {p99['slow']:.2f} ms (ratio of p99s {ratio:.2f})")
    print(f"slow-rule: {out['disabled_reason']}")
    ok = out["disabled_reason"] is not None and p99["slow"] < 100.0
    print(f"{verdict(ok)}: the slow rule disabled with its reason, scrape p99 {p99['slow']:.1f} ms (target < 100 ms)")
    write_json(args.json, out)
    if out["disabled_reason"] is None:
        sys.exit(1)


if __name__ == "__main__":
    main()
