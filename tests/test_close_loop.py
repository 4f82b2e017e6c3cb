"""Issue 37's acceptance, the loop closed end to end on one node: a training job that saves only to node-local
storage is found, alerted on, copied and verified, and then found safe, with every alert resolving by itself.

The node is what a user runs (tests/test_e2e_writers.py's way): one agent at its defaults (no tick, interval or settle
setting), the generic preset, with the configuration the README tells a user to write: the checkpoint roots, the
durable root in ``sync.destinations`` (a tmpfs pinned ``cluster`` by ``mounts.overrides``, the stand-in for network
storage, as in tests/test_mixin_e2e.py), and the Alertmanager receiver on with its token; the shipped default policy
(its ``alert-sync-checkpoint`` rule). Debian's ``prometheus`` scrapes the agent with the shipped rules
(alerts/storwatch.rules.yaml) whose every ``for`` is shortened through ``Thresholds.with_every_for``, the one way the
tests shorten them; Debian's ``prometheus-alertmanager`` routes with the README's route as the README prints it (its
matchers, grouping and intervals), only its receiver pointed at this agent on loopback over plain HTTP.

Two jobs run at once under that agent, each a plain ``torch.save`` loop that never imports storwatch
(tests/saving_jobs.py) on a GPU of its own (the fake NVML library, driven by the job: tests/fake_gpu.py) and an ext4
loop mount of its own, node-local. ``plain`` saves 16 MiB and fsyncs it onto a slow device (its image on a FUSE
filesystem that delays each write), a save of about two seconds, as a checkpoint of gigabytes takes, seen open by
the agent. ``fast`` saves 6 MiB into the page cache, about 10 ms a save: too fast to be caught open, so that only
other evidence from the kernel can tie its run to its GPU (without which the recovery-point alert cannot fire). Each
job saves a few seconds apart, SAVES times, then trains on without saving, as a long job does between two saves (a
job that keeps saving every few seconds keeps a finding for the saves newer than its copy, by design); ``fast``
starts saving once ``plain`` has made its saves, so that no two jobs save in the same second.
For each run, in order:

1. the finding (/api/status ``findings``);
2. both alerts firing in Prometheus: StorwatchImportantDataOnlyOnEphemeralStorage and, the run tied to its GPU,
   StorwatchRecoveryPointOverBudget;
3. Alertmanager delivering them to the agent (/api/status ``alerts``);
4. the agent's copy of the newest checkpoint, verified (``policy.syncs`` done, by ``alert-sync-checkpoint``), with
   its manifest beside it;
5. the run safe: no finding, a finite recovery point, the copy named as its durable copy;
6. both alerts resolved in Prometheus, in Alertmanager, and at the agent (Alertmanager's resolution delivered).

How long each step took from the job's first save is printed (``pytest -s``). The drain half of the acceptance (the
requested checkpoint copied and verified, and /status showing the drain and the copy) is tests/test_sync_drain.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from mixin.rules import rules_file
from mixin.thresholds import THRESHOLDS
from storwatch.checkpoints.manifest import MANIFEST_SUFFIX
from tests.agentproc import REPO_ROOT, AgentProcess, running_agent, wait_until
from tests.builders import own_mount_table
from tests.docs_text import section, yaml_blocks
from tests.nvml import FakeNVMLUnavailable, build_fake_nvml
from tests.promtools import binary, free_port, get_json, prometheus_config, server
from tests.realmounts import RealPartUnavailable, fuse_mount, loop_ext4_mount, tmpfs_mount

pytestmark = [pytest.mark.realpart, pytest.mark.timeout(600)]

NODE = "gpu-node-7"
"""The node the README's route is written for (the agent's NODE_NAME, the scrape's ``node`` label)."""
TOKEN = "am-to-storwatch-close-loop-0123456789"
EPHEMERAL = "StorwatchImportantDataOnlyOnEphemeralStorage"
RECOVERY = "StorwatchRecoveryPointOverBudget"
ALERTS = (EPHEMERAL, RECOVERY)
SHORT_FOR = "1s"
"""Every alert's ``for`` in the Prometheus of this test (``Thresholds.with_every_for``)."""
SAVES = 3
COMPUTE_SECONDS = 4.0
"""The job computes this long between two saves."""
DEADLINE_SECONDS = 300.0
"""From the jobs' start to the last step of both runs."""
POLL_SECONDS = 1.0
STEPS = ("finding", "firing", "delivered", "copied", "safe", "resolved")


@dataclasses.dataclass(frozen=True)
class Scenario:
    way: str
    """tests/saving_jobs.py's WAY."""
    mib: int
    device: Literal["slow", "memory"]
    """``slow``: the loop device's image on a FUSE filesystem that delays every write, so that a save with fsync takes
    a second or two, as a real checkpoint of gigabytes does, and is seen open; ``memory``: its image on a tmpfs, so
    that it writes back at once and a save without fsync is a copy into the page cache (tests/test_e2e_writers.py's
    ``fast`` device)."""


SCENARIOS = {
    "plain": Scenario("fsync_same", 16, "slow"),
    "fast": Scenario("no_fsync", 6, "memory"),
}
WRITE_DELAY_MS = 40
"""Each write into the slow device's FUSE filesystem sleeps this long."""


@dataclasses.dataclass
class Loop:
    """One job's run, and when (time.time()) each step was first seen, with what showed it."""

    name: str
    gpu: int
    run_dir: Path
    proc: subprocess.Popen[bytes]
    result: Path
    start: Path
    stop: Path
    log: Path
    seen: dict[str, float] = dataclasses.field(default_factory=dict)
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    events: dict[str, float] = dataclasses.field(default_factory=dict)
    """When each part of a step was first seen, whether or not the steps before it were (for the figures)."""

    def measured(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.result.read_text())
        except (OSError, ValueError):
            return None
        return data

    def first_save(self) -> float | None:
        m = self.measured()
        return m["saves"][0]["start"] if m and m["saves"] else None

    def last_save(self) -> Path | None:
        """The job's last save, once it has made all of them."""
        m = self.measured()
        return Path(m["saves"][-1]["path"]) if m and len(m["saves"]) >= SAVES else None

    def next_step(self) -> str | None:
        return next((s for s in STEPS if s not in self.seen), None)

    def figures(self) -> str:
        first = self.first_save()
        m = self.measured() or {"saves": []}
        saves = [round(s["end"] - s["start"], 3) for s in m["saves"]]
        if first is None:
            return f"{self.name}: no save yet"
        steps = ", ".join(f"{s} {self.seen[s] - first:.0f} s" for s in STEPS if s in self.seen)
        events = ", ".join(f"{e} {t - first:.0f} s" for e, t in sorted(self.events.items(), key=lambda kv: kv[1]))
        return (
            f"{self.name}: saves took {saves} s; from the first save: {steps or 'nothing'} "
            f"(each part first seen: {events or 'none'}); tied by {self.evidence.get('tied')}"
        )


def _log_tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except OSError:
        return ""


def readme_route(agent: AgentProcess, token_file: Path) -> str:
    """The documented Alertmanager configuration (docs/alertmanager.md, "Routing alerts to the agent") as it prints
    it, its receiver pointed at this agent (plain HTTP on loopback, so without its tls_config) and its token file
    here."""
    text = section(REPO_ROOT / "docs" / "alertmanager.md", "## Routing alerts to the agent")
    (block,) = [b for b in yaml_blocks(text) if b.startswith("route:")]
    config = yaml.safe_load(block)
    (receiver,) = [r for r in config["receivers"] if r["name"] == f"storwatch-{NODE}"]
    (hook,) = receiver["webhook_configs"]
    assert hook["url"].endswith("/api/v1/alertmanager"), hook
    hook["url"] = agent.url("/api/v1/alertmanager")
    hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    del hook["http_config"]["tls_config"]
    return yaml.safe_dump(config)


def shortened_rules() -> str:
    """The shipped rules with every ``for`` shortened, and nothing else changed but the descriptions quoting them."""
    shipped = (REPO_ROOT / "alerts" / "storwatch.rules.yaml").read_text(encoding="utf-8")
    assert shipped == rules_file(THRESHOLDS), "alerts/storwatch.rules.yaml is not current (python -m mixin)"
    short = rules_file(THRESHOLDS.with_every_for(SHORT_FOR))

    def without_fors(text: str) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in rule.items() if k not in ("for", "annotations")}
            for group in yaml.safe_load(text)["groups"]
            for rule in group["rules"]
        ]

    assert without_fors(short) == without_fors(shipped)
    return short


@pytest.fixture(scope="module")
def loops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Loop]]:
    """Both jobs under one agent, Prometheus and Alertmanager, followed until each run went through every step (or
    the deadline passed: the step not reached fails its test, with what showed)."""
    pytest.importorskip("torch", reason="torch==2.13.0 is installed by make test")
    prometheus = binary("prometheus")
    alertmanager = binary("prometheus-alertmanager", "alertmanager")
    tmp = tmp_path_factory.mktemp("close-loop")
    try:
        lib = build_fake_nvml(tmp / "nvml")
    except FakeNVMLUnavailable as err:
        pytest.skip(str(err))
    rules = tmp / "rules.yaml"
    rules.write_text(shortened_rules())
    with contextlib.ExitStack() as stack:

        def enter(cm: contextlib.AbstractContextManager[Any]) -> Any:
            try:
                return stack.enter_context(cm)
            except RealPartUnavailable as err:
                pytest.skip(str(err))

        # The GPUs' scripts on a tmpfs: the driver's samples never wait on a disk the saves keep busy.
        scripts = enter(tmpfs_mount(tmp / "nvml-scripts", size="8m")).mountpoint
        durable = enter(tmpfs_mount(tmp / "durable", size="160m")).mountpoint
        slow = enter(fuse_mount(tmp / "slow", write_delay_ms=WRITE_DELAY_MS))
        mounts: dict[str, Path] = {}
        for i, (name, scenario) in enumerate(SCENARIOS.items()):
            size_mb = max(128, 4 * SAVES * scenario.mib)  # room to spare: no headroom alert
            if scenario.device == "memory":
                image_dir, mkfs_via = (
                    enter(tmpfs_mount(tmp / f"image-{name}", size=f"{size_mb + 16}m")).mountpoint,
                    None,
                )
            else:
                image_dir, mkfs_via = slow.mountpoint, slow.backing
            disk = enter(
                loop_ext4_mount(
                    tmp / f"ckpt-{name}",
                    size_mb=size_mb,
                    image_dir=image_dir,
                    mkfs_via=mkfs_via,
                    mkfs_args=("-E", "lazy_itable_init=0,lazy_journal_init=0"),
                )
            )
            mounts[name] = disk.mountpoint
            (scripts / f"gpu-{i:02d}.txt").write_text(
                f"gpu {i} uuid=GPU-e2e-{i:04d} name=Fake_Trainer util=0 mem_used=0 mem_total={80 << 30}\n"
            )
        token_file = tmp / "am-token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
        cfg = tmp / "storwatch.yaml"
        # What the README has a user write: where the checkpoints are, what is durable, where copies go, the receiver.
        cfg.write_text(
            "platform: generic\n"
            f"checkpoints: {{roots: {json.dumps([str(m) for m in mounts.values()])}}}\n"
            f"mounts: {{overrides: [{{mountpoint: {json.dumps(str(durable))}, durability: cluster, "
            'reason: "the test\'s stand-in for network storage"}]}\n'
            f"sync: {{destinations: [{json.dumps(str(durable))}]}}\n"
            f"alertmanager: {{enabled: true, token_file: {json.dumps(str(token_file))}}}\n"
        )
        env = {
            "LD_LIBRARY_PATH": str(lib.parent),
            "FAKE_NVML_SCRIPT": str(scripts),
            "NODE_NAME": NODE,
            "KUBECONFIG": None,
            "KUBERNETES_SERVICE_HOST": None,
        }
        prefix = own_mount_table(tmp / "table", [scripts, durable, *mounts.values()])
        agent: AgentProcess = stack.enter_context(
            running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=env, timeout=60, prefix=prefix)
        )
        am_port, prom_port = free_port(), free_port()
        am, prom = f"http://127.0.0.1:{am_port}", f"http://127.0.0.1:{prom_port}"
        am_yml = tmp / "alertmanager.yml"
        am_yml.write_text(readme_route(agent, token_file))
        stack.enter_context(
            server(
                [
                    alertmanager,
                    f"--config.file={am_yml}",
                    f"--storage.path={tmp / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",
                ],
                tmp / "alertmanager.log",
                f"{am}/-/ready",
            )
        )
        stack.enter_context(
            server(
                [
                    prometheus,
                    f"--config.file={prometheus_config(tmp / 'prometheus.yml', rules, am_port, {NODE: agent.port})}",
                    f"--storage.tsdb.path={tmp / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                tmp / "prometheus.log",
                f"{prom}/-/ready",
            )
        )

        loops: dict[str, Loop] = {}

        def stop_jobs() -> None:
            for loop in loops.values():
                loop.stop.touch()
            for loop in loops.values():
                try:
                    loop.proc.wait(30)
                except subprocess.TimeoutExpired:
                    loop.proc.kill()
                    loop.proc.wait(10)

        stack.callback(stop_jobs)
        for i, (name, scenario) in enumerate(SCENARIOS.items()):
            run_dir = mounts[name] / f"{name}-run"
            run_dir.mkdir()
            work = tmp / f"job-{name}"
            work.mkdir()
            result, start, stop, log = work / "result.json", work / "start", work / "stop", work / "job.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.saving_jobs",
                        scenario.way,
                        str(run_dir),
                        str(scripts / f"gpu-{i:02d}.txt"),
                        str(result),
                        *("--gpu", str(i), "--start-file", str(start), "--stop-file", str(stop)),
                        *("--saves", str(SAVES), "--compute", str(COMPUTE_SECONDS), "--mib", str(scenario.mib)),
                        *("--gate-seconds", str(DEADLINE_SECONDS + 120)),
                    ],
                    cwd=REPO_ROOT,
                    env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            loops[name] = Loop(name, i, run_dir, proc, result, start, stop, log)

        def failed_job() -> str | None:
            for loop in loops.values():
                if loop.proc.poll() is not None:
                    return f"job {loop.name} exited with {loop.proc.returncode}:\n{_log_tail(loop.log)}"
            return None

        def status() -> dict[str, Any]:
            data: dict[str, Any] = json.loads(agent.fetch("/api/status", timeout=30).body)
            return data

        # A real job trains for a while before its first save, long after the agent has found its process; these
        # save seconds after they start, so each holds its GPU, computing, until the agent lists it.
        def listed() -> bool:
            problem = failed_job()
            assert problem is None, problem
            return {loop.proc.pid for loop in loops.values()} <= {w["pid"] for w in status().get("workloads", ())}

        wait_until(listed, timeout=120, interval=1.0, what="the agent listing both jobs' processes")
        # One job starts saving once the other has made all its saves, so that each scenario is the acceptance's one
        # job: the write counters tie a save too quick to be seen open to the one GPU workload that wrote its bytes
        # meanwhile, and to none where two did (analysis/writes.py, burst_writers).
        order = list(loops.values())
        order[0].start.touch()

        deadline = time.monotonic() + DEADLINE_SECONDS
        while any(loop.next_step() for loop in loops.values()) and time.monotonic() < deadline:
            problem = failed_job()
            assert problem is None, problem
            for before, after in itertools.pairwise(order):
                if not after.start.exists() and before.last_save() is not None:
                    after.start.touch()
            now, data = time.time(), status()
            firing = get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]
            held = get_json(f"{am}/api/v2/alerts")
            for loop in loops.values():
                for event in _events(loop, data, firing, held):
                    loop.events.setdefault(event, now)
                step = loop.next_step()
                if step is not None:
                    shown = _step(step, loop, data, firing, held)
                    if shown is not None:
                        loop.seen[step], loop.evidence[step] = now, shown
                        print(f"{loop.name}: {step} at {now - (loop.first_save() or now):.1f} s", flush=True)
                        continue  # the next step is looked for at the next look, a second later
                loop.evidence["last"] = {"status": _about(loop, data), "prometheus": firing, "alertmanager": held}
            time.sleep(POLL_SECONDS)
        for loop in loops.values():
            print(loop.figures())
            if loop.next_step() is not None:
                loop.evidence["agent log"] = agent.stderr_text()[-6000:]
                loop.evidence["alertmanager log"] = _log_tail(tmp / "alertmanager.log")
        yield loops


def _run(loop: Loop, data: dict[str, Any]) -> dict[str, Any] | None:
    runs = [r for r in data.get("checkpoints", ()) if r["path"] == str(loop.run_dir)]
    return runs[0] if runs else None


def _about(loop: Loop, data: dict[str, Any]) -> dict[str, Any]:
    """What /api/status says of this run: the run, its findings, its copies, the alerts the agent holds for it."""
    run = _run(loop, data)
    label = None if run is None else run["run"]
    return {
        "run": run,
        "findings": [f for f in data.get("findings", ()) if label is not None and f["run"] == label],
        "syncs": [j for j in (data.get("policy") or {}).get("syncs", ()) if j["run"] == label],
        "actions": [a for a in (data.get("policy") or {}).get("actions", ()) if a.get("key") == label][:10],
        "alerts": [a for a in data.get("alerts") or () if a["labels"].get("run") == label],
        "workloads": data.get("workloads"),
    }


def _events(loop: Loop, data: dict[str, Any], firing: list[dict[str, Any]], held: list[dict[str, Any]]) -> list[str]:
    """The parts of the steps that show now, each on its own: the run tied to a GPU, each alert firing in Prometheus
    and in Alertmanager and gone from them again, held firing and resolved by the agent, a copy done."""
    about = _about(loop, data)
    run = about["run"]
    if run is None:
        return []
    label = run["run"]
    out = ["finding"] if about["findings"] else []
    if run["gpus"]:
        out.append("tied")
        loop.evidence.setdefault("tied", {k: run[k] for k in ("gpus", "workload", "writers", "write_in_progress")})
    out += [f"{a['labels']['alertname']} {a['state']}" for a in firing if a["labels"].get("run") == label]
    out += [f"{a['labels']['alertname']} {a['status']} at the agent" for a in about["alerts"]]
    for name in ALERTS:
        if f"{name} firing" in loop.events and not any(
            a["labels"].get("run") == label and a["labels"]["alertname"] == name for a in firing
        ):
            out.append(f"{name} resolved in Prometheus")
        if any(a["labels"].get("run") == label and a["labels"]["alertname"] == name for a in held):
            out.append(f"{name} in Alertmanager")
        elif f"{name} in Alertmanager" in loop.events:
            out.append(f"{name} resolved in Alertmanager")
    out += ["a copy done"] if any(j["state"] == "done" for j in about["syncs"]) else []
    out += ["finite recovery point"] if run["recovery_point_seconds"] is not None else []
    return out


def _step(step: str, loop: Loop, data: dict[str, Any], firing: list[dict[str, Any]], held: list[dict[str, Any]]) -> Any:
    """What shows ``step`` for this run now, or None."""
    about = _about(loop, data)
    run = about["run"]
    if run is None:
        return None
    label = run["run"]
    if step == "finding":
        return about["findings"] or None
    if step == "firing":
        mine = {
            a["labels"]["alertname"]: a
            for a in firing
            if a["state"] == "firing" and a["labels"].get("run") == label and a["labels"].get("node") == NODE
        }
        return mine if set(ALERTS) <= set(mine) else None
    if step == "delivered":
        got = {a["labels"]["alertname"]: a for a in about["alerts"] if a["status"] == "firing"}
        return got if set(ALERTS) <= set(got) else None
    if step == "copied":
        newest = loop.last_save()
        done = [
            j
            for j in about["syncs"]
            if j["rule"] == "alert-sync-checkpoint" and j["state"] == "done" and j["source"] == str(newest)
        ]
        if not done:
            return None
        manifest = Path(done[0]["destination"] + MANIFEST_SUFFIX)
        return {"job": done[0], "manifest": json.loads(manifest.read_text())} if manifest.exists() else None
    if step == "safe":
        copy = run["durable_copy"]
        if about["findings"] or run["recovery_point_seconds"] is None or copy is None:
            return None
        return run
    if step == "resolved":
        in_prometheus = [a for a in firing if a["labels"].get("run") == label and a["labels"]["alertname"] in ALERTS]
        in_alertmanager = [a for a in held if a["labels"].get("run") == label and a["labels"]["alertname"] in ALERTS]
        at_agent = {a["labels"]["alertname"]: a["status"] for a in about["alerts"]}
        if in_prometheus or in_alertmanager or any(at_agent.get(name) != "resolved" for name in ALERTS):
            return None
        return at_agent
    raise AssertionError(step)


def _failure(loop: Loop) -> str:
    step = loop.next_step()
    return (
        f"{loop.figures()}\nnot reached: {step}\nwhat showed last:\n"
        + json.dumps(loop.evidence.get("last"), indent=1, default=str)[-12000:]
        + f"\n-- job log:\n{_log_tail(loop.log)}\n-- alertmanager log:\n{loop.evidence.get('alertmanager log', '')}"
        + f"\n-- agent log:\n{loop.evidence.get('agent log', '')}"
    )


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_loop_closes_by_itself(name: str, loops: dict[str, Loop]) -> None:
    """Finding, alerts firing, delivered, the newest checkpoint copied and verified, the run safe, the alerts
    resolved: each step seen, in that order (each is looked for once the one before it showed), nothing restarted."""
    loop = loops[name]
    assert loop.next_step() is None, _failure(loop)
    # The run as the job made it, tied to the one GPU its process holds.
    safe = loop.evidence["safe"]
    assert safe["gpus"] == 1 and safe["workload"] == f"pid:{loop.proc.pid}", safe
    # The copy is of the job's last save, byte for byte, its manifest naming it; it is what protects the run now.
    copied = loop.evidence["copied"]
    job, manifest = copied["job"], copied["manifest"]
    source, dest = loop.last_save(), Path(job["destination"])
    assert source is not None and "verified" in job["detail"], job
    assert dest.read_bytes() == source.read_bytes()
    assert (manifest["source"], manifest["bytes"]) == (str(source), source.stat().st_size), manifest
    assert safe["durable_copy"]["where"] == str(dest) and safe["durable_copy"]["how"] == "verified", safe
    assert safe["recovery_point_seconds"] < THRESHOLDS.rpo_budget_seconds, safe
    # The alerts that fired were the shipped ones for this run, and Alertmanager delivered both to the agent.
    delivered = loop.evidence["delivered"]
    assert {a["labels"]["storwatch_action"] for a in delivered.values()} == {"sync"}, delivered
