"""Fair actions, through the policy worker as the agent runs it (the shipped default set, the real runner and its
shipped budgets, Views built from facts by the real View builder, an injected clock): one tenant's many runs cannot
take what another tenant's run needs, a run whose age is unknown (checkpoints dated in the future) never goes first,
and a request refused for its rate is asked again once tokens return, never dropped, though the shipped
``leaving-request-checkpoint`` has no cooldown and so announces each firing once.

``request_checkpoint`` is a recorder here: what it does to a run is tested in tests/test_request_checkpoint.py; what
is tested here is who gets asked, when, and how often.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Mapping

from storwatch.actions.alertbook import AlertBook
from storwatch.actions.base import ActionRequest, ActionResult, Entity
from storwatch.actions.registry import registry
from storwatch.agent.policy import PolicyWorker, urgency
from storwatch.analysis.build import build_view
from storwatch.analysis.view import View
from storwatch.classify import Classifier
from storwatch.config import PolicyConfig
from storwatch.policy.schema import entities
from storwatch.sources.checkpoints import Checkpoint, RunState
from storwatch.vocabulary import Platform
from tests.rich_view import NOW, rich_view

GiB = 1 << 30
RULE = "leaving-request-checkpoint"


class Asked:
    """request_checkpoint, recording the runs it was asked for."""

    name = "request_checkpoint"

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.lock = threading.Lock()

    def check(self, params: Mapping[str, object]) -> list[str]:
        return []

    def run(self, request: ActionRequest, timeout: float) -> ActionResult:
        with self.lock:
            self.runs.append(request.entity.key)
        return ActionResult("ok", "asked")


def run_state(name: str, uid: int, age: float) -> RunState:
    """A run under /scratch (node-local NVMe: lost with the node) with one complete checkpoint ``age`` seconds old
    (negative: dated in the future), its directory owned by ``uid``."""
    path = f"/scratch/{name}"
    checkpoint = Checkpoint(
        path=f"{path}/step-100.pt",
        format="torch-zip",
        verdict="complete",
        reason="complete",
        size_bytes=GiB,
        allocated_bytes=GiB,
        mtime=NOW - age,
        deep_checked=False,
        first_seen=NOW - 3600,
    )
    return RunState(path, "/scratch", (checkpoint,), uid=uid)


def view_at(at: float, runs: tuple[RunState, ...]) -> View:
    """The rich View's node (being drained), with ``runs`` as its checkpoint runs, at ``at``."""
    base = rich_view().snapshot
    assert base.checkpoints is not None
    facts = dataclasses.replace(base.checkpoints, runs=runs, stuck_roots=())
    snapshot = dataclasses.replace(base, timestamp=at, checkpoints=facts)
    return build_view(snapshot, Classifier("generic"), Platform("generic", "configured"))


def worker(clock: list[float]) -> tuple[PolicyWorker, Asked]:
    asked = Asked()
    actions = {**registry(), "request_checkpoint": asked}
    made = PolicyWorker(PolicyConfig(), actions, AlertBook(), lambda: clock[0], threading.Event())
    assert made.load(PolicyConfig())
    return made, asked


def judge_until(made: PolicyWorker, clock: list[float], runs: tuple[RunState, ...], seconds: int) -> None:
    """A View a second, as the agent judges them, for ``seconds``."""
    for _ in range(seconds):
        clock[0] += 1.0
        made.evaluate(view_at(clock[0], runs))
        assert made.runner.wait_idle(10)


def test_one_tenants_future_dated_runs_cannot_starve_another_tenants_run() -> None:
    """The attack: tenant A (uid 1001) has six runs whose checkpoints are dated an hour in the future, and they come
    first in the View; tenant B (uid 1002) has one real run. The node drains. B's run is asked for a checkpoint in
    the first View; A's runs get their owner's budget, and the rest of them are asked as tokens return, each once."""
    clock = [NOW]
    attackers = tuple(run_state(f"a-{i}", 1001, -3600.0) for i in range(6))
    victim = run_state("z-victim", 1002, 600.0)
    runs = (*attackers, victim)
    made, asked = worker(clock)
    try:
        view = view_at(clock[0], runs)
        requests = made.engine.evaluate(entities(view), view.timestamp)
        assert {r.entity.key for r in requests if r.rule == RULE} == {"a-0", "a-1", "a-2", "a-3", "a-4", "a-5",
                                                                      "z-victim"}  # fmt: skip
        # An unknown age never goes first, and the owner is the one the kernel gives (the directory's uid).
        ordered = sorted((r for r in requests if r.rule == RULE), key=urgency)
        assert ordered[0].entity.key == "z-victim" and ordered[0].entity.owner == "uid:1002"
        assert {r.entity.owner for r in ordered[1:]} == {"uid:1001"}
    finally:
        made.close()

    made, asked = worker(clock)
    try:
        made.evaluate(view_at(clock[0], runs))
        assert made.runner.wait_idle(10)
        assert "z-victim" in asked.runs
        assert len([k for k in asked.runs if k.startswith("a-")]) == 2  # tenant A's budget: two at once
        judge_until(made, clock, runs, 120)
        assert Counter(asked.runs) == dict.fromkeys([r.path.rsplit("/", 1)[1] for r in runs], 1)
        counts = made.runner.counts()
        assert counts[(RULE, "request_checkpoint", "ok")] == 7
        assert counts[(RULE, "request_checkpoint", "rate_limited")] == 4  # each refused run counted once
    finally:
        made.close()


def test_a_run_refused_for_its_rate_is_asked_once_tokens_return() -> None:
    """Seven tenants' runs fire at once: more than the rule's budget of checkpoint requests. The first four are asked
    at once; the other three, refused, are asked again View after View while the node drains, and get their
    request when tokens return: every run exactly once, none dropped."""
    clock = [NOW]
    runs = tuple(run_state(f"t{i}", 2000 + i, 600.0 + i) for i in range(7))
    made, asked = worker(clock)
    try:
        made.evaluate(view_at(clock[0], runs))
        assert made.runner.wait_idle(10)
        assert len(asked.runs) == 4
        refused = [r for r in made.runner.recent() if r.rule == RULE and r.outcome == "rate_limited"]
        assert len(refused) == 3 and refused[0].detail.startswith(f"rule {RULE} may ask request_checkpoint 4 times")
        judge_until(made, clock, runs, 60)
        assert Counter(asked.runs) == {f"t{i}": 1 for i in range(7)}
        assert made.runner.counts()[(RULE, "request_checkpoint", "rate_limited")] == 3
    finally:
        made.close()


def test_an_unknown_age_goes_after_a_known_one_whatever_is_at_risk() -> None:
    """Both runs have no durable copy (infinitely at risk, with GPUs): the one whose newest checkpoint is dated in
    the future goes after the other; more GPU-seconds at risk go first; other kinds have no age to doubt."""

    def request(kind: str, **fields: object) -> ActionRequest:
        return ActionRequest(RULE, "request_checkpoint", {}, Entity(kind, str(fields), fields), "critical", "m")  # type: ignore[arg-type]

    future = request("run", complete=1, newest_complete_age_seconds=None, gpu_seconds_at_risk=float("inf"))
    known = request("run", complete=1, newest_complete_age_seconds=600.0, gpu_seconds_at_risk=float("inf"))
    small = request("run", complete=1, newest_complete_age_seconds=60.0, gpu_seconds_at_risk=480.0)
    none_yet = request("run", complete=0, newest_complete_age_seconds=None, gpu_seconds_at_risk=None)
    mount = request("mount", mountpoint="/scratch")
    stale_finding = request("finding", newest_age_seconds=None)
    ordered = sorted([future, stale_finding, mount, none_yet, small, known], key=urgency)
    assert ordered == [known, small, mount, none_yet, future, stale_finding]
