"""The checked-in alerts/ and dashboards/: what the code in mixin makes, every expression parsed by
promql-parser and naming only metrics the agent exports (with labels they carry), every alert complete and with its
runbook section, every dashboard as the issue asks (timeseries, units, variables, fixed uids, links); and promtool's
own checks and unit tests, which must also catch a rule that drifts from them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mixin.__main__ import generated, main
from mixin.rules import SEVERITY_FROM_LABEL, alerts, rules_file
from mixin.thresholds import SITE, THRESHOLDS
from storwatch.config import FindingsConfig
from storwatch.exporter.catalog import CATALOG, MetricSpec
from tests.mixin_exprs import (
    DASHBOARDS,
    PROMETHEUS_OWN,
    REPO_ROOT,
    RULES_FILE,
    Expression,
    dashboard_expressions,
    grafana_to_promql,
    recorded_names,
    rule_expressions,
    rule_groups,
    selectors,
)

RUNBOOK = REPO_ROOT / "docs" / "runbook.md"
PROMTOOL_TESTS = REPO_ROOT / "alerts" / "tests" / "storwatch.rules.test.yaml"
TARGET_LABELS = frozenset({"cluster", "node", "instance", "job"})
"""Labels Prometheus adds to every series of an agent (alerts/, and docs/dashboards-and-alerts.md's scrape config)."""
SPECS: dict[str, MetricSpec] = {spec.name: spec for spec in CATALOG}
EXPRESSIONS = rule_expressions() + dashboard_expressions()


def sample_names(spec: MetricSpec) -> set[str]:
    if spec.type == "histogram":
        return {f"{spec.name}_bucket", f"{spec.name}_count", f"{spec.name}_sum"}
    return {spec.name}


EXPORTED = {name: spec for spec in CATALOG for name in sample_names(spec)}


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    for rel, text in generated().items():
        assert (REPO_ROOT / rel).read_text(encoding="utf-8") == text, f"{rel}: run python -m mixin"
    assert main(["--check"]) == 0
    # --check sees a drifted file (and writes nothing)
    (tmp_path / "alerts").mkdir()
    (tmp_path / "alerts" / "storwatch.rules.yaml").write_text("groups: []\n")
    assert main(["--check", "--root", str(tmp_path)]) == 1
    assert (tmp_path / "alerts" / "storwatch.rules.yaml").read_text() == "groups: []\n"


def test_the_prometheus_rule_holds_the_rules_file() -> None:
    doc = yaml.safe_load((REPO_ROOT / "alerts" / "prometheusrule.yaml").read_text(encoding="utf-8"))
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert doc["spec"]["groups"] == rule_groups()


@pytest.mark.parametrize("expr", EXPRESSIONS, ids=[e.where for e in EXPRESSIONS])
def test_every_expression_names_exported_metrics_and_their_labels(expr: Expression) -> None:
    recorded = recorded_names()
    found = selectors(expr.promql)
    assert found, expr
    for sel in found:
        if sel.metric in recorded or sel.metric in PROMETHEUS_OWN:
            labels = TARGET_LABELS
            spec = None
        else:
            assert sel.metric in EXPORTED, f"{expr.where}: {sel.metric} is not in storwatch/exporter/catalog.py"
            spec = EXPORTED[sel.metric]
            labels = TARGET_LABELS | set(spec.label_names) | ({"le"} if spec.type == "histogram" else set())
        for label, op, value in sel.matchers:
            assert label in labels, f"{expr.where}: {sel.metric} has no label {label!r}"
            if spec is not None and label in spec.label_names and op == "=" and spec.label(label).values is not None:
                assert value in spec.values(label), f"{expr.where}: {sel.metric}{{{label}={value!r}}} is never written"


def test_a_misspelt_metric_is_caught() -> None:
    """The check above is live: a selector's name and labels are read from the parsed expression."""
    (sel,) = selectors('sum by (x) (rate(storwatch_gpu_stall_second_total{cause="io"}[5m]))')
    assert sel.metric == "storwatch_gpu_stall_second_total" and sel.metric not in EXPORTED
    assert sel.matchers == (("cause", "=", "io"),)


def test_every_recording_rule_is_read_by_an_alert_or_a_dashboard() -> None:
    read = {s.metric for e in EXPRESSIONS for s in selectors(e.promql)}
    assert recorded_names() <= read


def runbook_sections() -> dict[str, str]:
    text = RUNBOOK.read_text(encoding="utf-8")
    parts = re.split(r"^## (\S+)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_alert_is_complete_and_has_its_runbook_section() -> None:
    sections = runbook_sections()
    rules = [r for g in rule_groups() for r in g["rules"] if "alert" in r]  # type: ignore[attr-defined]
    assert {r["alert"] for r in rules} == set(sections), "one runbook section per alert, and none other"
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        assert rule["labels"]["severity"] in ("critical", "warning", "info", SEVERITY_FROM_LABEL), name
        notes = rule["annotations"]
        assert set(notes) == {"summary", "description", "runbook_url"}, name
        assert notes["summary"].endswith(".") and "{{" not in notes["summary"], name
        assert "{{ $labels." in notes["description"] or name == "StorwatchAgentAbsent", name
        assert notes["runbook_url"] == f"{SITE.runbook_url}#{name.lower()}", name
        section = sections[name]
        for part in ("**What it means.**", "**Confirm.**", "**What to do.**", "```promql"):
            assert part in section, f"runbook section {name} lacks {part}"
        severity = rule["labels"]["severity"]
        words = "the run's (its finding's: " if severity == SEVERITY_FROM_LABEL else f"{severity}, "
        assert re.search(rf"^\*\*Severity\*\* {re.escape(words)}.*after {rule['for']}\.$", section, re.M), name
    # the issue's list of alerts, at least
    assert {
        "StorwatchImportantDataOnlyOnEphemeralStorage",
        "StorwatchRecoveryPointOverBudget",
        "StorwatchCheckpointIncomplete",
        "StorwatchCheckpointCorrupt",
        "StorwatchMountStuck",
        "StorwatchGPUStallShareHigh",
        "StorwatchCheckpointWillNotFit",
        "StorwatchNodeDrainingWithEphemeralCheckpoints",
        "StorwatchCollectorFailing",
        "StorwatchAgentAbsent",
        "StorwatchNVMLDown",
    } <= set(sections)


def test_alerts_about_a_node_keep_its_label() -> None:
    """The agent's Alertmanager receiver takes only alerts whose node label is its own: an aggregation must keep it."""
    for a in alerts():
        if a.name == "StorwatchAgentAbsent":
            continue
        for m in re.finditer(r"\b(sum|max|min|count|avg) by \(([^)]*)\)", a.expr):
            assert "node" in m.group(2).split(", "), f"{a.name}: {m.group(0)} drops the node label"


def test_the_budget_is_the_agents() -> None:
    """The recovery-point alert and the agent's critical findings use one budget."""
    assert THRESHOLDS.rpo_budget_seconds == FindingsConfig().rpo_budget_seconds


@pytest.mark.parametrize("path", sorted(DASHBOARDS.glob("*.json")), ids=lambda p: p.name)
def test_dashboards_are_as_the_issue_asks(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["uid"] == path.stem and doc["title"].startswith("storwatch / ")
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "cluster" in variables
    if path.stem != "storwatch-fleet":
        assert "node" in variables
        assert any(link.get("url") == "http://${instance}/status" for link in doc["links"]), "no link to /status"
    assert any(link.get("url") == SITE.runbook_url for link in doc["links"]), "no link to the runbook"
    ids = [p["id"] for p in doc["panels"]]
    assert len(set(ids)) == len(ids)
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert panels
    titles = [p["title"] for p in panels]
    assert len(set(titles)) == len(titles), "two panels of one dashboard share a title (the runbook names them by it)"
    for panel in panels:
        assert panel["type"] in ("timeseries", "stat"), panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and all(t["datasource"] == panel["datasource"] for t in panel["targets"])


def infinite_names() -> set[str]:
    """The series that may be +Inf: the catalog's allow_inf metrics and the recording rules made from them."""
    names = {spec.name for spec in CATALOG if spec.allow_inf}
    records = [e for e in rule_expressions() if e.kind == "record"]
    while True:
        more = {e.name for e in records if {sel.metric for sel in selectors(e.promql)} & names} - names
        if not more:
            return names
        names |= more


def test_the_infinite_series_are_known() -> None:
    assert {
        "storwatch_recovery_point_seconds",
        "storwatch_gpu_seconds_at_risk",
        "cluster:storwatch_gpu_seconds_at_risk:sum",
    } <= infinite_names()


@pytest.mark.parametrize("path", sorted(DASHBOARDS.glob("*.json")), ids=lambda p: p.name)
def test_a_panel_shows_inf_as_words_never_as_an_empty_graph(path: Path) -> None:
    """A graph cannot draw +Inf: a panel of a series that may be +Inf is a stat panel that maps it (Grafana looks a
    value up by String(value), "Infinity") to words, unless its query filters +Inf out or counts it."""
    infinite = infinite_names()
    doc = json.loads(path.read_text(encoding="utf-8"))
    shown = 0
    for panel in (p for p in doc["panels"] if p["type"] != "row"):
        for target in panel["targets"]:
            names = {sel.metric for sel in selectors(grafana_to_promql(target["expr"]))}
            if not names & infinite or re.search(r"(<|==) \+Inf\b", target["expr"]):
                continue
            shown += 1
            assert panel["type"] == "stat", f"{panel['title']}: +Inf in a {panel['type']} panel"
            words = [
                m["options"]["Infinity"].get("text", "")
                for m in panel["fieldConfig"]["defaults"].get("mappings", [])
                if m["type"] == "value" and "Infinity" in m["options"]
            ]
            assert words and "durable" in words[0], f"{panel['title']}: +Inf has no words"
    if path.stem in ("storwatch-node", "storwatch-fleet"):
        assert shown >= 2, "the at-risk panels are among them"


def test_the_mixins_copies_of_label_values_are_the_agents() -> None:
    """mixin imports nothing of storwatch: the label values its zero fallbacks spell are held equal here."""
    from mixin import dashboards as d
    from storwatch.analysis.stalls import CAUSES
    from storwatch.exporter.checkpoints import EPHEMERAL_IMPORTANT, FINDING
    from storwatch.exporter.policy import POLICY_ACTIONS

    assert d.STALL_CAUSES == CAUSES
    assert FINDING.values("severity") == d.FINDING_SEVERITIES
    assert EPHEMERAL_IMPORTANT.values("kind") == d.IMPORTANT_KINDS
    assert POLICY_ACTIONS.values("result") == d.ACTION_RESULTS


# -- the runbook: every link leads to a section, every panel it names is in a dashboard


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), flags=re.M)}


def dashboard_docs() -> dict[str, dict[str, object]]:
    """Each shipped dashboard's JSON, by its title."""
    docs = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(DASHBOARDS.glob("*.json"))]
    return {d["title"]: d for d in docs}


def runbook_links() -> list[str]:
    """Every link of the runbook (its markdown links) and to it (each alert's runbook_url, the dashboards' links and
    their panels' links), as a path and anchor below the repository's root (docs/runbook.md#section)."""
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", RUNBOOK.read_text(encoding="utf-8")):
        if "://" in target:
            continue
        file, _, anchor = target.partition("#")
        path = (RUNBOOK.parent / file).resolve() if file else RUNBOOK
        out.append(f"{path.relative_to(REPO_ROOT)}#{anchor}")
    urls = [r["annotations"]["runbook_url"] for g in rule_groups() for r in g["rules"] if "alert" in r]  # type: ignore[attr-defined]
    for d in dashboard_docs().values():
        urls += [link.get("url", "") for link in d["links"]]  # type: ignore[attr-defined]
        urls += [link["url"] for p in d["panels"] for link in p.get("links", [])]  # type: ignore[attr-defined]
    for url in urls:
        if url.startswith(SITE.runbook_url):
            out.append("docs/runbook.md" + url[len(SITE.runbook_url) :])
    return out


def test_every_runbook_link_leads_to_a_section() -> None:
    links = runbook_links()
    # the alerts', the dashboards' and their panels' (one per alert a panel is about), and the runbook's own
    assert sum(1 for link in links if "#storwatch" in link) > 2 * len(alerts())
    assert "docs/alertmanager.md#routing-alerts-to-the-agent" in links
    for link in links:
        file, _, anchor = link.partition("#")
        assert (REPO_ROOT / file).is_file(), f"{link}: no such file"
        assert not anchor or anchor in anchors(REPO_ROOT / file), f"{link}: no such section"


def test_a_link_to_a_missing_section_is_caught() -> None:
    assert "storwatchmountstuck" in anchors(RUNBOOK) and "storwatchmountstuk" not in anchors(RUNBOOK)
    assert slug("Alertmanager receiver") == "alertmanager-receiver"
    assert slug("How a copy is made and checked") == "how-a-copy-is-made-and-checked"


PANEL_REF = re.compile(r"\*\*(storwatch\s+/\s+\w+)\*\*\s+\u203a\s+\*([^*]+)\*")
"""How the runbook names a panel: **storwatch / Node** \u203a *Title* (a single right-pointing angle quotation mark)."""


def test_every_panel_the_runbook_names_is_in_a_shipped_dashboard() -> None:
    text = RUNBOOK.read_text(encoding="utf-8")
    docs = dashboard_docs()
    refs = [(" ".join(d.split()), " ".join(t.split())) for d, t in PANEL_REF.findall(text)]
    assert len(refs) > 2 * len(runbook_sections()), "each section names the panels to look at"
    for board, title in refs:
        assert board in docs, f"the runbook names a dashboard {board!r}; there are {sorted(docs)}"
        panels = {p["title"] for p in docs[board]["panels"]}  # type: ignore[attr-defined]
        assert title in panels, f"the runbook names a panel {title!r} that {board} does not have"
    # every dashboard it names in bold is one shipped, and it never points at a dashboard in loose words
    for board in re.findall(r"\*\*(storwatch\s+/\s+\w+)\*\*", text):
        assert " ".join(board.split()) in docs, board
    loose = re.findall(r"the (?:Node|Checkpoints|Fleet) dashboard", text)
    assert not loose, f"name the panel (**storwatch / Node** \u203a *Title*), not {loose}"
    # the sections name the panels the issue's acting side added
    named = {title for _, title in refs}
    assert {"Copies by outcome", "Actions by result", "Received alerts", "Drain state", "Workload I/O"} <= named


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found on PATH (Debian package 'prometheus')")
    return path


@pytest.mark.realpart
def test_promtool_checks_the_rules(promtool: str) -> None:
    check = subprocess.run([promtool, "check", "rules", str(RULES_FILE)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(rule_expressions())} rules found" in check.stdout


@pytest.mark.realpart
def test_promtool_unit_tests_pass_and_cover_every_alert(promtool: str) -> None:
    tests = yaml.safe_load(PROMTOOL_TESTS.read_text(encoding="utf-8"))
    fired: set[str] = set()
    quiet: set[str] = set()
    for group in tests["tests"]:
        for case in group.get("alert_rule_test", []):
            (fired if case["exp_alerts"] else quiet).add(case["alertname"])
    names = {a.name for a in alerts()}
    assert fired == names and quiet == names, "each alert needs a firing and a quiet case"
    run = subprocess.run(
        [promtool, "test", "rules", PROMTOOL_TESTS.name],
        cwd=PROMTOOL_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.realpart
def test_promtool_unit_tests_catch_a_drifted_threshold(promtool: str, tmp_path: Path) -> None:
    """The unit tests can fail: rules made with a stall share of 0.6 no longer fire for a GPU stalled half the time."""
    import dataclasses

    (tmp_path / "tests").mkdir()
    (tmp_path / "storwatch.rules.yaml").write_text(rules_file(dataclasses.replace(THRESHOLDS, stall_share=0.6)))
    shutil.copy(PROMTOOL_TESTS, tmp_path / "tests" / PROMTOOL_TESTS.name)
    run = subprocess.run(
        [promtool, "test", "rules", PROMTOOL_TESTS.name],
        cwd=tmp_path / "tests",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "StorwatchGPUStallShareHigh" in run.stdout + run.stderr


def test_one_table_makes_the_alerts_and_the_default_policy() -> None:
    """Each detection's alert (alerts/, as checked in) and rule (storwatch/policies/default.yaml, as checked in) fire
    after the same ``for`` with the same severity: the run's own where the table says so (the alert's label from
    storwatch_finding, the rule's ``severity: "{severity}"``). Nothing watched by one system is missing from the
    table."""
    from mixin.thresholds import DETECTIONS, OWN
    from storwatch.policy.load import load_policy, parse_duration

    policy = {r.name: r for r in load_policy([str(REPO_ROOT / "storwatch" / "policies" / "default.yaml")]).rules}
    shipped = {r["alert"]: r for g in rule_groups() for r in g["rules"] if "alert" in r}  # type: ignore[index]
    assert {d.rule for d in DETECTIONS if d.rule} == set(policy)
    assert {d.alert for d in DETECTIONS if d.alert} == set(shipped)
    both = [d for d in DETECTIONS if d.alert and d.rule]
    assert len(both) == 9
    for d in both:
        alert, rule = shipped[d.alert], policy[d.rule]  # type: ignore[index]
        assert parse_duration(alert["for"]) == rule.for_seconds, d
        if d.severity == OWN:
            assert (alert["labels"]["severity"], rule.severity_field) == (SEVERITY_FROM_LABEL, "severity"), d
        else:
            assert (alert["labels"]["severity"], rule.severity, rule.severity_field) == (d.severity, d.severity, None)
    # The issue's two disagreements, settled once: a stuck mount and ephemeral data, each with one duration.
    assert policy["mount-stuck"].for_seconds == parse_duration(shipped["StorwatchMountStuck"]["for"]) == 300
    assert policy["important-data-only-on-ephemeral-storage"].for_seconds == 600


def test_the_alerts_meant_to_act_name_a_run_and_carry_the_action_label() -> None:
    """The alerts the node's agent can act on carry storwatch_action="sync" (the route in docs/alertmanager.md
    matches it) and the run label (the agent's alert-sync-checkpoint rule copies that run), in every promtool case
    where they fire; no other alert carries the action label."""
    from mixin.thresholds import DETECTIONS

    acting = {d.alert for d in DETECTIONS if d.acts}
    assert acting == {
        "StorwatchImportantDataOnlyOnEphemeralStorage",
        "StorwatchRecoveryPointOverBudget",
        "StorwatchNodeDrainingWithEphemeralCheckpoints",
    }
    for a in alerts():
        assert (a.labels == {SITE.action_label: SITE.action_value}) == (a.name in acting), a.name
    tests = yaml.safe_load(PROMTOOL_TESTS.read_text(encoding="utf-8"))
    fired = [
        (case["alertname"], exp["exp_labels"])
        for group in tests["tests"]
        for case in group.get("alert_rule_test", [])
        for exp in case["exp_alerts"]
    ]
    for name, labels in fired:
        assert (labels.get(SITE.action_label) == SITE.action_value) == (name in acting), (name, labels)
        if name in acting:
            assert labels.get("run"), (name, labels)
