"""The policy worker: the policy engine (storwatch.policy) and the action runner (storwatch.actions) on a thread of
their own. The ticker hands it each View it publishes (``offer``: a reference swap, nothing more); the worker builds
the View's entities (with the alerts Alertmanager posted), evaluates the rules over them and submits the actions
they ask for to the runner, which runs each off this thread too. A View that comes while an evaluation runs replaces
the one waiting: the worker always judges the newest, and never slows the tick or a scrape.

The policy is the shipped default set (``storwatch/policies/default.yaml``, package data: found the same way from a
wheel, an editable install and the image; unless ``policy.default_set`` is false) followed by ``policy.files`` in
order. A policy that cannot be loaded at start leaves the agent running with no rules, the errors
logged and ``storwatch_policy_last_reload_success`` 0; on a reload the last good policy stays in force.
"""

from __future__ import annotations

import importlib.resources
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from storwatch.actions.alertbook import AlertBook
from storwatch.actions.base import Action, ActionRequest
from storwatch.actions.checkpoint_sync import SyncAction
from storwatch.actions.runner import ActionRunner
from storwatch.actions.sync_jobs import SyncJobs
from storwatch.analysis.view import View
from storwatch.config import PolicyConfig
from storwatch.exporter.area import SyncMetrics
from storwatch.exporter.policy import PolicyMetrics
from storwatch.policy.engine import Engine
from storwatch.policy.load import PolicyError, load_policy
from storwatch.policy.schema import entities
from storwatch.printable import Lines, printable
from storwatch.threadname import name_this_thread

log = logging.getLogger(__name__)

SHIPPED_DEFAULT = str(importlib.resources.files("storwatch") / "policies" / "default.yaml")
"""The default set, package data of ``storwatch`` (pyproject.toml's package-data): a file in the installed package, as
every installation this agent supports unpacks it (a wheel, an editable install, the image)."""


def _at_risk(request: ActionRequest) -> float:
    """A request's rank: its run's GPU-seconds at risk (unknown and other kinds last; infinity first)."""
    value = request.entity.fields.get("gpu_seconds_at_risk") if request.entity.kind == "run" else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else -1.0


def _age_unknown(request: ActionRequest) -> bool:
    """The entity's files are dated in the future, so how old its data is cannot be known: a run's newest complete
    checkpoint, a finding's newest file."""
    fields = request.entity.fields
    if request.entity.kind == "run":
        return fields.get("newest_complete_age_seconds") is None and bool(fields.get("complete"))
    if request.entity.kind == "finding":
        return fields.get("newest_age_seconds") is None
    return False


def urgency(request: ActionRequest) -> tuple[bool, float]:
    """The order requests are submitted in (ascending): an entity whose age is known before one whose age is not (a
    date in the future is a claim anyone who writes the files can make, so it never goes first), then the runs with
    the most GPU-seconds at risk."""
    return (_age_unknown(request), -_at_risk(request))


def policy_files(config: PolicyConfig) -> list[str]:
    """The files of the policy in force, in the order they load."""
    return ([SHIPPED_DEFAULT] if config.default_set else []) + list(config.files)


class PolicyWorker:
    """Evaluates the policy over the newest View on its own thread and hands the actions to the runner."""

    def __init__(
        self,
        config: PolicyConfig,
        actions: Mapping[str, Action],
        alerts: AlertBook,
        clock: Callable[[], float],
        stop: threading.Event,
    ) -> None:
        self.alerts = alerts
        self.stop = stop
        self.checks = {name: action.check for name, action in actions.items()}
        self.engine = Engine(None, budget_seconds=config.budget_seconds)
        self.runner = ActionRunner(actions, clock=clock)
        sync = actions.get("sync")
        self.syncs: SyncJobs | None = sync.jobs if isinstance(sync, SyncAction) else None
        """The copies the sync action started (None: sync.destinations is empty)."""
        self.enabled = config.enabled
        self._lock = threading.Lock()
        """Held while the engine evaluates, loads or reports (the worker, a reload, an HTTP thread)."""
        self._latest: View | None = None
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.evaluations = 0
        self.last_cpu_seconds = 0.0
        """The CPU time the last View's judging took (the View's budget counts it: storwatch/pace.py)."""

    def load(self, config: PolicyConfig) -> bool:
        """Load the policy ``config`` names; on a problem keep the last good one (none at start), log every error
        as FILE:LINE: FIELD: message, and count it. True when the new policy is in force."""
        files = policy_files(config)
        try:
            policy = load_policy(files, self.checks) if config.enabled else None
        except PolicyError as err:
            with self._lock:
                self.engine.load_failed(err.errors)
            log.error("policy not loaded, keeping the last good one:\n%s", Lines("\n".join(err.errors)))
            return False
        with self._lock:
            self.enabled = config.enabled
            self.engine.budget_seconds = config.budget_seconds
            if policy is not None:
                self.engine.load(policy)
        if policy is None:
            log.info("policy: off (policy.enabled is false)")
        else:
            log.info("policy: %d rules from %s", len(policy.rules), ", ".join(map(printable, files)))
        return True

    def offer(self, view: View) -> None:
        """The ticker's newest View (called on the ticker thread: it only keeps it and wakes the worker)."""
        self._latest = view
        self._wake.set()

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._run, name="policy", daemon=True)
        self._thread.start()
        return self._thread

    def _run(self) -> None:
        name_this_thread()
        while not self.stop.is_set() and not self._closed:
            self._wake.wait()  # each View offered, and close(), wake it
            self._wake.clear()
            view, self._latest = self._latest, None
            if view is None or self.stop.is_set() or self._closed:
                continue
            try:
                self.evaluate(view)
            except Exception:  # a bug in a rule's fields must not end the worker: the next View is judged again
                log.exception("policy evaluation failed")

    def evaluate(self, view: View) -> int:
        """Judge one View; the number of action requests submitted."""
        with self._lock:
            if not self.enabled:
                return 0
            started = time.thread_time()
            # What the runner refused for its rate since the last View is asked for again while its rule fires.
            for refused in self.runner.take_refused():
                self.engine.owe(refused)
            requests = self.engine.evaluate(entities(view, self.alerts.current()), view.timestamp)
            self.last_cpu_seconds = time.thread_time() - started
            self.evaluations += 1
        # When a drain makes every run fire in one View, the runs with the most GPU-seconds at risk go first (each
        # action's budgets, its lanes, and the copy worker's queue behind sync, take requests in the order they come),
        # and those whose age is unknown last.
        requests.sort(key=urgency)
        for request in requests:
            self.runner.submit(request)
        return len(requests)

    def metrics(self) -> PolicyMetrics:
        with self._lock:
            status = self.engine.status()
        return status.metrics(self.runner.counts())

    def status(self) -> dict[str, Any]:
        """What /api/status and /status show: the rules, what is firing or pending since when, the last actions."""
        with self._lock:
            st = self.engine.status()
        return {
            "enabled": self.enabled,
            "files": [printable(f) for f in st.files],
            "last_evaluation": st.last_evaluation,
            "last_reload_success": st.last_reload_success,
            "reload_errors": [printable(e) for e in st.reload_errors],
            "rules": [
                {
                    "name": r.name,
                    "on": r.on,
                    "severity": r.severity,
                    "where": printable(r.where),
                    "enabled": r.enabled,
                    "dry_run": r.dry_run,
                    "disabled_reason": r.disabled_reason,
                    "firing": r.firing,
                    "pending": r.pending,
                    "errors_total": r.errors_total,
                    "last_error": None if r.last_error is None else printable(r.last_error),
                }
                for r in st.rules
            ],
            "active": [
                {
                    "rule": a.rule,
                    "kind": a.kind,
                    "key": printable(a.key),
                    "state": a.state,
                    "since": a.since,
                    "severity": a.severity,
                    "message": printable(a.message),
                }
                for a in st.active
            ],
            "actions": [
                {
                    "at": r.at,
                    "rule": r.rule,
                    "action": r.action,
                    "kind": r.entity_kind,
                    "key": printable(r.entity_key),
                    "outcome": r.outcome,
                    "detail": printable(r.detail),
                }
                for r in reversed(self.runner.recent())
            ],
            "syncs": [
                {
                    "job": j.job_id,
                    "rule": j.rule,
                    "run": printable(j.run),
                    "why": printable(j.why),
                    "source": printable(j.source),
                    "destination": printable(j.destination),
                    "state": j.state,
                    "queued_at": j.queued_at,
                    "started_at": j.started_at,
                    "finished_at": j.finished_at,
                    "deadline_at": j.deadline_at,
                    "seconds": j.seconds,
                    "bytes": j.bytes,
                    "detail": printable(j.detail),
                }
                for j in (self.syncs.jobs() if self.syncs is not None else [])
            ],
        }

    def sync_metrics(self) -> SyncMetrics:
        return self.syncs.metrics() if self.syncs is not None else SyncMetrics()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(2.0)
        self.runner.close()
