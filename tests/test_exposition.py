"""storwatch's text renderer writes what prometheus_client's generate_latest writes, byte for byte, for every kind of
family and awkward label value; it refuses names it would have to escape."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

from storwatch.analysis.view import View
from storwatch.config import DEFAULT_NFS_OPERATIONS
from storwatch.exporter import Exporter, Family, render_text
from storwatch.exporter.nfs import WrittenLines
from storwatch.registry import exporter_areas
from storwatch.snapshot import Snapshot
from storwatch.sources.mountstats_reader import MountStatsReader
from storwatch.sources.nfs import NFSStats
from storwatch.vocabulary import Platform
from tests.golden_scrape import render_scrape

MOUNTSTATS = Path(__file__).parent / "fixtures" / "mountstats"
NFSV3, NFSV42 = MOUNTSTATS / "nfsv3", MOUNTSTATS / "nfsv4.2-nconnect"


class Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def families() -> list[Metric]:
    awkward = ['/mnt/a "quoted" dir', "C:\\back\\slash", "two\nlines", "caf\u00e9 \u2603", "", "trailing\\"]
    gauge = GaugeMetricFamily("test_gauge", "A gauge.\nWith a second line and a \\ backslash.", labels=["z", "a"])
    for i, v in enumerate(awkward):
        gauge.add_metric([v, str(i)], [0.5, 1e21, -3.0, float("inf"), float("-inf"), float("nan")][i])
    counter = CounterMetricFamily("test_ops", "Operations.", labels=["op"], created=None)
    counter.add_metric(["READ"], 12345678.0)
    counter.add_metric(["WRITE"], 3, created=1700000000.5)
    counter.add_metric(["COMMIT"], 2**60, timestamp=1700000000.25)
    plain = GaugeMetricFamily("test_plain", "No labels.", value=7)
    hist = HistogramMetricFamily("test_seconds", "A histogram.", labels=["mountpoint"])
    hist.add_metric(["/x"], [("0.001", 1.0), ("0.1", 3.0), ("+Inf", 4.0)], 0.25)
    info = InfoMetricFamily("test_build", "Build.", value={"version": "1.0", "python": "3.11"})
    state = StateSetMetricFamily("test_state", "State.", value={"on": True, "off": False})
    ghist = GaugeHistogramMetricFamily(
        "test_queue", "Gauge histogram.", buckets=[("1.0", 2.0), ("+Inf", 3.0)], gsum_value=4
    )
    summary = SummaryMetricFamily("test_summary", "Summary.", count_value=3, sum_value=1.5)
    unknown = UnknownMetricFamily("test_unknown", "Unknown.", value=1)
    numbers = GaugeMetricFamily("test_numbers", "Numbers as counters and gauges hold them.", labels=["v"])
    for v in [0, 1, 999_999, 1_000_000, 1_000_001, 1_234_567, 12_345_678, 10_000_000, 120_000_000_000,
              10**15 + 1, 2**53 - 1, 2**53, 2**53 + 1, 10**16 + 1, 2**63, -1, -1_000_000, -12_345_678, 0.0, -0.0, 0.1,
              1e-7, 123456.5, 1234567.0, 5e-324, 1.7976931348623157e308, True]:  # fmt: skip
        numbers.add_metric([repr(v)], v)
    return [gauge, counter, plain, hist, info, state, ghist, summary, unknown, numbers]


def test_every_kind_of_family_renders_as_generate_latest_does() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed(families()))
    expected = generate_latest(registry)
    assert b'z="/mnt/a \\"quoted\\" dir"' in expected and b"two\\nlines" in expected  # the cases are really there
    # Byte for byte as generate_latest, except its samples that are not finite: the writer leaves those out (one rule,
    # exporter/text.py), where generate_latest writes +Inf, -Inf and NaN.
    lines = expected.splitlines(keepends=True)
    non_finite = [line for line in lines if line.split()[-1] in (b"+Inf", b"-Inf", b"NaN")]
    assert len(non_finite) == 3
    assert render_text(registry.collect()) == b"".join(line for line in lines if line not in non_finite)


def as_samples(family: Metric) -> Metric:
    """A Family's lines read back as samples into an ordinary prometheus_client family."""
    if not isinstance(family, Family):
        return family
    copy = Metric(family.name, family.documentation, family.type)
    copy.samples = family.samples
    return copy


def test_the_golden_scrape_renders_as_generate_latest_does(tmp_path: Path) -> None:
    # The golden scrape is rendered by render_text; generate_latest of the same families must give the same text.
    import storwatch.exporter as exporter

    ours = render_scrape(tmp_path / "ours")
    original = exporter.render_text
    try:
        exporter.render_text = lambda fams: generate_latest(Fixed([as_samples(f) for f in fams]))  # type: ignore[assignment]
        theirs = render_scrape(tmp_path / "theirs")
    finally:
        exporter.render_text = original
    assert ours.count("\n") > 200 and ours == theirs


@pytest.mark.parametrize(
    ("family", "message"),
    [
        (GaugeMetricFamily("test.dotted", "x", value=1), "metric name 'test.dotted' would need escaping"),
        (GaugeMetricFamily("test_g", "x", labels=["a-b"]), "label name 'a-b' would need escaping"),
    ],
    ids=["metric-name", "label-name"],
)
def test_names_that_need_escaping_are_refused(family: Metric, message: str) -> None:
    if not family.samples:
        family.add_metric(["v"], 1)
    with pytest.raises(ValueError, match=message):
        render_text([family])


def _nfs_view(reader: MountStatsReader, data: bytes, timestamp: float) -> View:
    mounts, errors = reader.read(data)
    assert errors == []
    nfs = NFSStats(timestamp, {m.mountpoint: m for m in mounts}, {})
    return View(Snapshot(timestamp, nfs=nfs), Platform("generic", "test"))


def test_nfs_lines_kept_between_renders_are_the_lines_a_fresh_render_writes() -> None:
    """The exporter keeps each NFS mount's lines, and each procedure's, while their counters stand still: after a
    procedure moves, a mount is unmounted or comes back, the text is what an exporter with no memory writes."""
    captures = [NFSV3.read_bytes(), NFSV42.read_bytes()]
    reader, kept = (
        MountStatsReader(lambda errors: None),
        Exporter(exporter_areas(), process_metrics=False, nfs_operations=["*"]),
    )
    steps = [
        b"".join(captures),
        b"".join(captures),  # nothing moved: the same NFSMount objects
        b"".join(captures).replace(b" READ: 2210331 2210331", b" READ: 2210400 2210402"),  # one procedure moved
        captures[0],  # the NFSv4.2 mount is gone
        b"".join(captures),  # and back
    ]
    for i, data in enumerate(steps):
        view = _nfs_view(reader, data, 1_700_000_000.0 + i)
        fresh = Exporter(exporter_areas(), process_metrics=False, nfs_operations=["*"]).render(view)
        assert kept.render(view) == fresh, f"step {i}"
        assert fresh.count(b"storwatch_nfs_operations_total{") > 10
    assert b'operation="READ"} 2.2104e+06' in kept.render(_nfs_view(reader, steps[2], 1_700_000_010.0))


def test_nfs_lines_are_kept_only_for_procedures_whose_counters_stood_still() -> None:
    """A procedure whose counters moved since the last render has its lines written for this render alone (busy, it
    would need them written again by the next); once they stand still from one render to the next, they are kept."""
    data = NFSV42.read_bytes()
    moved = data.replace(b" READ: 2210331 2210331", b" READ: 2210400 2210402")
    assert moved != data
    reader = MountStatsReader(lambda errors: None)
    exporter = Exporter(exporter_areas(), process_metrics=False, nfs_operations=["*"])

    def kept_lines() -> dict[str, bool]:
        (text,) = exporter.state.kept(WrittenLines).mounts.values()
        return {op.name: lines is not None for op, lines in text.ops.items()}

    exporter.render(_nfs_view(reader, data, 1_700_000_000.0))
    first = kept_lines()
    assert first and not any(first.values())  # the first render: nothing is known to stand still yet
    exporter.render(_nfs_view(reader, data, 1_700_000_001.0))
    assert all(kept_lines().values())  # the same counters again: every procedure's lines kept
    exporter.render(_nfs_view(reader, moved, 1_700_000_002.0))
    after_move = kept_lines()
    assert after_move["READ"] is False and all(kept for name, kept in after_move.items() if name != "READ")
    view = _nfs_view(reader, moved, 1_700_000_003.0)
    text = exporter.render(view)
    assert all(kept_lines().values())  # READ stood still since: kept again
    assert text == Exporter(exporter_areas(), process_metrics=False, nfs_operations=["*"]).render(view)


def test_nfs_procedures_exported_are_those_configured() -> None:
    reader = MountStatsReader(lambda errors: None)
    view = _nfs_view(reader, NFSV3.read_bytes() + NFSV42.read_bytes(), 1_700_000_000.0)

    def exported(exporter: Exporter) -> set[str]:
        text = exporter.render(view).decode()
        return {
            line.split('operation="')[1].split('"')[0] for line in text.splitlines() if "_nfs_operations_total{" in line
        }

    called = {op.name for m in view.nfs.mounts.values() for op in m.operations if op.requests}  # type: ignore[union-attr]
    assert exported(Exporter(exporter_areas(), process_metrics=False, nfs_operations=["*"])) == called
    default = exported(Exporter(exporter_areas(), process_metrics=False))
    assert default == called & set(DEFAULT_NFS_OPERATIONS) and {"READ", "WRITE", "COMMIT", "GETATTR"} <= default
    assert "SEQUENCE" in called - default  # NFSv4.1+ calls it with every request: many series, little news
    exporter = Exporter(exporter_areas(), process_metrics=False)
    exporter.render(view)
    exporter.configure(["READ", "SEQUENCE"])  # a reload: the lines written for the old set go
    assert exported(exporter) == {"READ", "SEQUENCE"}
