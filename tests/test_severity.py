"""One severity per run, wherever it shows: its finding's (analysis/findings.py, critical past the recovery-point budget
or while the node drains), in the run's policy entity, in every firing of the default policy's rules about it, and
in the alerts about it, as Prometheus computes them from the agent's own scrape (``promtool test rules`` over the
series of that scrape). A run without a finding (on durable storage) is a warning everywhere.

The View is the metric catalog test's rich View (tests/rich_view.py: the node drains, so its findings are critical),
with GPUs given to two of its runs so the recovery-point detection fires for a critical run (on node-local storage,
its durable copy an hour and a half old) and for a warning one (on durable storage, its newest checkpoint two hours
old); its series carry the ``cluster``, ``node``, ``instance`` and ``job`` labels Prometheus adds."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from mixin.rules import RUN_SEVERITY, alerts
from storwatch.analysis.view import View
from storwatch.exporter import Exporter
from storwatch.policy.engine import Engine
from storwatch.policy.load import load_policy
from storwatch.policy.schema import entities, run_severity
from storwatch.registry import exporter_areas
from tests.rich_view import REPO_ROOT, rich_view

pytestmark = pytest.mark.realpart

TARGET = {"cluster": "c1", "node": "n1", "instance": "10.0.0.1:9477", "job": "storwatch"}
RULES = REPO_ROOT / "alerts" / "storwatch.rules.yaml"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found on PATH (Debian package 'prometheus')")
    return path


def at_risk_view() -> View:
    view = rich_view()
    recovery = []
    for r in view.recovery:
        if r.label == "llama":  # on node-local storage, its durable copy 90 minutes old, training on 8 GPUs
            r = dataclasses.replace(r, gpus=8, recovery_point_seconds=5400.0)
        elif r.label == "ckpt/bert":  # on durable storage, its newest checkpoint two hours old, on 4 GPUs
            r = dataclasses.replace(r, gpus=4, recovery_point_seconds=7200.0)
        recovery.append(r)
    return dataclasses.replace(view, recovery=tuple(recovery))


def series(view: View) -> list[dict[str, str]]:
    """The scrape of ``view`` as promtool input series, each held for twenty minutes."""
    text = Exporter(exporter_areas()).render(view).decode("utf-8")
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, **TARGET}
            selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            if sample.value != sample.value:
                continue  # NaN: nothing any expression here reads
            if abs(sample.value) == float("inf"):  # promtool's expanding notation takes no infinity
                values = " ".join(["+Inf" if sample.value > 0 else "-Inf"] * 21)
            else:
                values = f"{float(sample.value)!r}x20"
            out.append({"series": f"{sample.name}{{{selector}}}", "values": values})
    return out


def test_a_run_has_one_severity_in_its_finding_the_policy_and_the_alerts(promtool: str, tmp_path: Path) -> None:
    view = at_risk_view()
    # The finding's, and the run entity's: one severity per run (warning without a finding).
    own = run_severity(view)
    findings = {f.run: f.severity for f in view.findings if f.kind != "dataset"}
    assert own == {**findings, "ckpt/bert": "warning"} and findings == {
        "llama": "critical",
        "models/llama-weights": "critical",
    }
    ents = entities(view)
    assert {e.key: e.fields["severity"] for e in ents["run"]} == own
    # The default policy over an hour of Views: every firing about a run (or its finding) has the run's severity.
    engine = Engine(load_policy([str(REPO_ROOT / "storwatch" / "policies" / "default.yaml")]), budget_seconds=1e9)
    for minute in range(61):
        engine.evaluate(ents, view.timestamp + 60 * minute)
    run_of = {e.key: str(e.fields["run"]) for e in ents["finding"]}
    fired = [a for a in engine.status().active if a.state == "firing" and a.kind in ("run", "finding")]
    shown = {(a.rule, a.key if a.kind == "run" else run_of[a.key], a.severity) for a in fired}
    assert {(rule, run) for rule, run, _ in shown} >= {
        ("recovery-point-over-budget", "llama"),
        ("recovery-point-over-budget", "ckpt/bert"),
        ("important-data-only-on-ephemeral-storage", "models/llama-weights"),
        ("leaving-with-checkpoints-only-on-ephemeral-storage", "models/llama-weights"),
    }
    assert {(run, severity) for _, run, severity in shown} <= set(own.items()), shown
    # Prometheus over the agent's own scrape of that View: the run's severity as the alerts take it, and the
    # recovery-point alert's runs and severities, the same as the policy's.
    rpo = next(a for a in alerts() if a.name == "StorwatchRecoveryPointOverBudget")
    fired_rpo = sorted((run, sev) for rule, run, sev in shown if rule == "recovery-point-over-budget")
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series(view),
                "promql_expr_test": [
                    {
                        "expr": RUN_SEVERITY,
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": f'{RUN_SEVERITY}{{cluster="c1",node="n1",run="{run}",severity="{sev}"}}',
                             "value": 1}
                            for run, sev in sorted(own.items())
                        ],
                    },
                    {
                        "expr": f"group by (run, severity) ({rpo.expr})",
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": f'{{run="{run}",severity="{sev}"}}', "value": 1} for run, sev in fired_rpo
                        ],
                    },
                ],
            }
        ],
    }  # fmt: skip
    assert fired_rpo == [("ckpt/bert", "warning"), ("llama", "critical")]
    path = tmp_path / "severity.test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    run = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
