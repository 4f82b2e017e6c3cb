"""The metric catalog (storwatch/exporter/catalog.py) against what ships.

Every family a scrape writes is declared there, with its type, help and label names, and each label value of a fixed
set is one of those listed; every declared metric is written by one of the scrapes here (so no entry is stale); each
area writes only the metrics declared for it; docs/metrics.md's table names the same metrics with the same labels;
and no series carries a PID. The scrapes: the golden file (the gpu-node fixture through the sources, kept current by
test_golden), a View built here with facts for every area, and a running agent.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from storwatch.exporter import AlertmanagerCounts, ConfigReloads, Exporter, ExportState, Family
from storwatch.exporter import gpu as gpu_area
from storwatch.exporter.catalog import BY_NAME, CATALOG, MetricSpec, main
from storwatch.exporter.text import labels_template, render_text
from storwatch.registry import exporter_areas
from tests.agentproc import running_agent, wait_until
from tests.docs_text import METRICS_DOC, inf_metrics, section
from tests.rich_view import (
    GOLDEN,
    REPO_ROOT,
    rich_view,
)


def policy_scrape() -> str:
    """storwatch_policy_*: the shipped default policy over the rich View's entities an hour on, an action counted."""
    from storwatch.exporter import policy as policy_area
    from storwatch.policy.engine import Engine
    from storwatch.policy.load import load_policy
    from storwatch.policy.schema import entities

    view = rich_view()
    shipped = REPO_ROOT / "storwatch" / "policies" / "default.yaml"
    engine = Engine(load_policy([str(shipped)]), budget_seconds=float("inf"))
    for minute in range(61):
        engine.evaluate(entities(view), view.timestamp + 60 * minute)
    actions = {("mount-stuck", "log", "ok"): 2, ("mount-stuck", "event", "failed"): 1}
    return render_text(policy_area.families(engine.status().metrics(actions))).decode("utf-8")


def sync_scrape() -> str:
    """storwatch_sync_*: one run copied in 12 s, another copy running."""
    from storwatch.exporter import sync as sync_area
    from storwatch.exporter.area import SyncMetrics

    metrics = SyncMetrics(
        bytes_total=2 << 30,
        in_progress=1,
        last_success={"alice/run1": 1_800_000_000.0},
        duration_buckets=((5.0, 0), (15.0, 1), (float("inf"), 1)),
        duration_sum=12.0,
    )
    return render_text(sync_area.families(metrics)).decode("utf-8")


def rich_scrape() -> str:
    """Every area of a scrape of :func:`rich_view`, with the reload record, the Alertmanager receiver's counts and this
    process's metrics, and the policy's families."""
    counts = AlertmanagerCounts()
    counts.request("accepted")
    counts.alerts("stored", 2)
    exporter = Exporter(exporter_areas(), process_metrics=True, reloads=ConfigReloads(), alertmanager=counts)
    exporter.state.tick_interval = lambda: 15.0  # a quiet node's pace (storwatch/pace.py)
    exporter.state.view_interval = lambda: 5.0  # a large node's View (storwatch/pace.py CpuBudget)
    return exporter.render(rich_view()).decode("utf-8") + policy_scrape() + sync_scrape()


# -- reading a scrape against the catalog


def declared_name(family: Metric) -> str:
    """The name a family is declared under: as a scrape shows it (the parser drops a counter's ``_total``)."""
    return family.name + "_total" if family.type == "counter" else family.name


def sample_label_names(spec: MetricSpec, sample_name: str, labels: Iterable[str]) -> set[str]:
    names = set(labels)
    if spec.type == "histogram" and sample_name.endswith("_bucket"):
        names.discard("le")
    return names


def catalog_problems(text: str) -> list[str]:
    """What in an exposition text disagrees with the catalog, one sentence each."""
    problems = []
    for family in text_string_to_metric_families(text):
        name = declared_name(family)
        spec = BY_NAME.get(name)
        if spec is None:
            problems.append(f"{name} ({family.type}) is not in the catalog")
            continue
        if family.type != spec.type:
            problems.append(f"{name} is a {family.type}, declared a {spec.type}")
        if family.documentation != spec.help:
            problems.append(f"{name}'s help is {family.documentation!r}, declared {spec.help!r}")
        for sample in family.samples:
            names = sample_label_names(spec, sample.name, sample.labels)
            if names != set(spec.label_names):
                problems.append(f"{sample.name} has labels {sorted(names)}, declared {sorted(spec.label_names)}")
                continue
            for label in spec.labels:
                value = sample.labels[label.name]
                if label.values is not None and value not in label.values:
                    problems.append(f"{sample.name}: {label.name}={value!r} not among {label.values}")
    return problems


def written(text: str) -> set[str]:
    """The declared names of the families with at least one sample in ``text``."""
    return {declared_name(f) for f in text_string_to_metric_families(text) if f.samples}


def label_names_in_line_order(text: str) -> Iterator[tuple[str, list[str]]]:
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" in line:
            name, rest = line.split("{", 1)
            yield name, re.findall(r'(?:^|,)([a-zA-Z_]\w*)="', rest.rsplit("}", 1)[0])


@pytest.fixture(scope="module")
def scrapes() -> dict[str, str]:
    return {"golden": GOLDEN.read_text(encoding="utf-8"), "rich": rich_scrape()}


@pytest.mark.parametrize("which", ["golden", "rich"])
def test_every_family_a_scrape_writes_is_in_the_catalog_as_declared(scrapes: dict[str, str], which: str) -> None:
    text = scrapes[which]
    assert text.count("\n") > 200  # a full scrape, not an empty one
    assert catalog_problems(text) == []


def test_the_check_is_live() -> None:
    """catalog_problems names a family the catalog lacks, a wrong help, a wrong label set and an unlisted value."""
    text = (
        "# HELP storwatch_not_declared Nothing.\n# TYPE storwatch_not_declared gauge\nstorwatch_not_declared 1.0\n"
        "# HELP storwatch_mount_stuck Another help.\n# TYPE storwatch_mount_stuck gauge\n"
        'storwatch_mount_stuck{mountpoint="/",pid="7"} 1.0\n'
        f"# HELP storwatch_finding {BY_NAME['storwatch_finding'].help}\n# TYPE storwatch_finding gauge\n"
        'storwatch_finding{id="0123456789abcdef",kind="checkpoint",mountpoint="/",run="r",severity="mild"} 1.0\n'
    )
    problems = catalog_problems(text)
    assert len(problems) == 4, problems
    assert "storwatch_not_declared (gauge) is not in the catalog" in problems
    assert any("help" in p and "storwatch_mount_stuck" in p for p in problems)
    assert any("'pid'" in p for p in problems)
    assert any("severity='mild'" in p for p in problems)


def test_every_metric_in_the_catalog_is_written_by_a_scrape_here(scrapes: dict[str, str]) -> None:
    exported = written(scrapes["golden"]) | written(scrapes["rich"])
    assert {spec.name for spec in CATALOG} - exported == set(), "declared, but no scrape here writes a sample of it"


def test_every_line_writes_its_labels_sorted_by_name(scrapes: dict[str, str]) -> None:
    """As prometheus_client's generate_latest writes them (the label templates of the hot paths included)."""
    lines = [pair for text in scrapes.values() for pair in label_names_in_line_order(text)]
    assert len(lines) > 500
    assert [(name, labels) for name, labels in lines if labels != sorted(labels)] == []


def test_each_area_writes_only_the_metrics_declared_for_it() -> None:
    view = rich_view()
    for area in exporter_areas():
        module = area.__module__.rsplit(".", 1)[-1]
        names = [f.sample_name for f in area(view, ExportState(process=None))]
        assert names, f"{area.__module__}.{area.__name__} writes nothing for the rich View"
        assert [n for n in names if BY_NAME[n].area != module] == [], module


def test_the_families_an_area_makes_are_the_catalogs() -> None:
    """allow_inf and the label names come from the entry (test_strict_output checks allow_inf against the docs)."""
    view = rich_view()
    for area in exporter_areas():
        for family in area(view, ExportState()):
            spec = BY_NAME[family.sample_name]
            assert (family.type, family.documentation, family.label_names, family.allow_inf) == (
                spec.type,
                spec.help,
                spec.label_names,
                spec.allow_inf,
            )


@pytest.mark.realpart
def test_a_running_agent_writes_only_families_in_the_catalog() -> None:
    with running_agent("--listen", "127.0.0.1:0") as agent:

        def full_scrape() -> str | None:
            resp = agent.fetch("/metrics")
            body = resp.body.decode("utf-8")
            return body if resp.status == 200 and "storwatch_collector_success{" in body else None

        text = wait_until(full_scrape, timeout=15.0, what="a full /metrics scrape")
    assert "process_resident_memory_bytes " in text  # the agent's own process metrics are there
    assert catalog_problems(text) == []


@pytest.mark.realpart
def test_promtool_check_metrics_is_clean_on_the_rich_scrape(scrapes: dict[str, str]) -> None:
    """Every family here, the GPU, checkpoint, Kubernetes, Lustre and access ones included (a node without them
    gives test_promtool's agent nothing of those to check)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found on PATH (Debian package 'prometheus')")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=scrapes["rich"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


# -- no PIDs


def pid_carriers(text: str) -> set[str]:
    """The families with a sample labelled ``pid``."""
    return {declared_name(f) for f in text_string_to_metric_families(text) if any("pid" in s.labels for s in f.samples)}


def test_no_series_carries_a_pid_label(scrapes: dict[str, str]) -> None:
    assert pid_carriers(scrapes["rich"]) == set()
    assert [s.name for s in CATALOG if "pid" in s.label_names] == []


def test_no_label_value_names_a_pid(scrapes: dict[str, str]) -> None:
    named = [
        (s.name, key)
        for f in text_string_to_metric_families(scrapes["rich"])
        for s in f.samples
        for key, value in s.labels.items()
        if re.fullmatch(r"pid:\d+", value)
    ]
    assert named == []


# -- the catalog itself


def test_every_entry_follows_the_naming_rules() -> None:
    for spec in CATALOG:
        assert spec.name.startswith("storwatch_" if spec.written_by == "storwatch" else "process_"), spec.name
        assert spec.name.endswith("_total") == (spec.type == "counter"), spec.name
        assert spec.help and spec.help.endswith("."), spec.name
        names = spec.label_names
        assert len(set(names)) == len(names) and "le" not in names, spec.name
        for label in spec.labels:
            assert label.bound, f"{spec.name}: label {label.name} has no bound"
            assert label.values is None or (label.values and len(set(label.values)) == len(label.values))
        if spec.name.endswith("_info"):
            assert spec.type == "gauge", spec.name


def test_the_process_metrics_are_prometheus_clients_own() -> None:
    """The catalog's process_* entries are what prometheus_client's ProcessCollector writes, name and help."""
    from prometheus_client import ProcessCollector

    families = [f for metric in ProcessCollector(registry=None).collect() for f in Family.from_metric(metric)]
    assert len(families) == 6
    declared = {s.name: (s.type, s.help) for s in CATALOG if s.written_by == "prometheus_client"}
    assert {f.sample_name: (f.type, f.documentation) for f in families} == declared


def test_the_gpu_areas_throttle_bits_are_the_catalogs_reasons() -> None:
    assert tuple(gpu_area._THROTTLE_BITS) == BY_NAME["storwatch_gpu_clock_throttled"].values("reason")


def test_copies_by_result_are_written_at_zero_before_any_copy_ends() -> None:
    """So the first failed copy is a rise that rate() and increase() see, not a new series they skip."""
    from storwatch.exporter import sync as sync_area
    from storwatch.exporter.area import SyncMetrics

    text = render_text(sync_area.families(SyncMetrics())).decode("utf-8")
    lines = [line for line in text.splitlines() if line.startswith("storwatch_sync_copies_total{")]
    assert lines == [f'storwatch_sync_copies_total{{result="{r}"}} 0.0' for r in ("verified", "failed", "superseded")]


def test_a_label_template_writes_what_add_writes() -> None:
    family = BY_NAME["storwatch_mount_latency_seconds"].family()
    values = ('/mnt/a "b"\\c', "probe_write", "1m", "p95")
    family.add(values, 0.5)
    template = labels_template(family.label_names, {"window": "1m", "stat": "p95"})
    quoted = [v.replace("\\", "\\\\").replace('"', '\\"') for v in values[:2]]
    assert family.lines == [f"{family.sample_name}{template.format(*quoted)} 0.5\n"]
    assert family.labels_for(values) == template.format(*quoted)
    with pytest.raises(ValueError, match="not among"):
        labels_template(family.label_names, {"pid": "1"})


def test_a_family_is_not_a_prometheus_client_metric() -> None:
    """Metric.add_sample would append to a list a Family never writes: the sample would vanish. There is none."""
    family = BY_NAME["storwatch_mount_stuck"].family()
    assert not isinstance(family, Metric) and not hasattr(family, "add_sample")
    family.add(("/",), 1)
    assert [(s.name, s.labels, s.value) for s in family.samples] == [("storwatch_mount_stuck", {"mountpoint": "/"}, 1)]
    assert render_text([family]).decode().endswith('storwatch_mount_stuck{mountpoint="/"} 1.0\n')


# -- docs/metrics.md's table, and the catalog printed


def docs_rows() -> list[tuple[list[str], set[str], str]]:
    """docs/metrics.md's table of every metric: each row's metric names (``_x`` after a first name is that name's
    subsystem plus ``_x``; ``{a,b}`` is one name per choice), its label names (a bracket after a name lists its
    values) and its meaning."""
    rows = []
    for line in section(METRICS_DOC, "## Every metric").splitlines():
        if not re.match(r"\| `(storwatch|process)_", line):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        assert len(cells) == 3, f"not a row of three cells: {line}"
        names: list[str] = []
        for token in re.findall(r"`([^`]+)`", cells[0]):
            if token.startswith("_"):
                first = names[0].split("_")
                token = f"{first[0]}_{first[1]}{token}"
            expanded = [token]
            while any("{" in t for t in expanded):
                t = next(t for t in expanded if "{" in t)
                head, choices, tail = re.match(r"(.*?)\{([^}]*)\}(.*)", t).groups()  # type: ignore[union-attr]
                expanded.remove(t)
                expanded += [head + c + tail for c in choices.split(",")]
            names += expanded
        labels = {label.strip() for label in re.sub(r"\([^)]*\)", "", cells[1]).split(",") if label.strip()}
        rows.append((names, labels, cells[2]))
    return rows


def test_the_docs_table_names_every_metric_once_with_its_labels() -> None:
    rows = docs_rows()
    assert len(rows) > 30
    seen = [name for names, _, _ in rows for name in names]
    assert sorted(n for n in set(seen) if seen.count(n) > 1) == [], "named in more than one row"
    assert set(seen) - set(BY_NAME) == set(), "in docs/metrics.md, not in the catalog"
    assert set(BY_NAME) - set(seen) == set(), "in the catalog, not in docs/metrics.md"
    wrong = [
        (name, sorted(labels), sorted(BY_NAME[name].label_names))
        for names, labels, _ in rows
        for name in names
        if labels != set(BY_NAME[name].label_names)
    ]
    assert wrong == []


def test_the_docs_say_what_inf_means_exactly_where_the_catalog_allows_it() -> None:
    documented = inf_metrics()
    assert documented == {s.name for s in CATALOG if s.allow_inf} and documented


def test_the_catalog_prints_as_markdown_rows() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([]) == 0
    rows = out.getvalue().splitlines()
    assert rows[:2] == ["| metric | labels | meaning |", "|---|---|---|"]
    assert [re.match(r"\| `(\w+)`", row).group(1) for row in rows[2:]] == [s.name for s in CATALOG]  # type: ignore[union-attr]
    assert "| `storwatch_mount_latency_seconds` | mountpoint, op (read, write, fsync" in out.getvalue()
    bounds = io.StringIO()
    with contextlib.redirect_stdout(bounds):
        assert main(["--labels"]) == 0
    assert len(bounds.getvalue().splitlines()) == 2 + sum(len(s.labels) for s in CATALOG)
    assert "| `storwatch_checkpoint_size_bytes` | run | one per checkpoint run exported, at most 100" in (
        bounds.getvalue()
    )
    assert "| `storwatch_finding` | severity | how urgent: warning, critical |" in bounds.getvalue()


def test_each_area_declares_its_metrics_in_its_own_module_and_the_catalog_gathers_them_all() -> None:
    """An area's metrics are declared at the top of storwatch/exporter/AREA.py, beside the code that fills them, and
    nowhere else: adding an area is its own module (the catalog imports every module of the package)."""
    import importlib
    import pkgutil

    import storwatch.exporter

    found: dict[str, set[str]] = {}
    for info in pkgutil.iter_modules(storwatch.exporter.__path__):
        module = importlib.import_module(f"storwatch.exporter.{info.name}")
        for value in vars(module).values():
            if isinstance(value, MetricSpec) and info.name != "catalog":
                assert value.area == info.name, (value.name, value.area, info.name)
                found.setdefault(info.name, set()).add(value.name)
    assert set().union(*found.values()) == {spec.name for spec in CATALOG}
    assert set(found) == {spec.area for spec in CATALOG}
