"""The I/O pressure source, added by the recipe of docs/architecture.md: the kernel's pressure stall information for
I/O (/proc/pressure/io) as two counters. Real-format files (tests/fixtures/pressure/, as a 6.x kernel writes them)
in a procfs tree of the test's own; the node's own file where it has one; each failure path: no PSI in the kernel
(off, with the reason), a line that does not parse (counted, the other still read), nothing usable (a failed
collection that says why)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from storwatch.exporter import Exporter
from storwatch.paths import HostPaths
from storwatch.registry import BY_NAME, exporter_areas
from storwatch.sources import UnusableInput
from storwatch.sources.pressure import PRESSURE, PressureConfig, PressureFacts, PressureSource
from tests.rich_view import rich_view

FIXTURES = Path(__file__).parent / "fixtures" / "pressure"


def source(tmp_path: Path, fixture: str | None) -> PressureSource:
    proc = tmp_path / "proc"
    (proc / "pressure").mkdir(parents=True)
    if fixture is not None:
        shutil.copy(FIXTURES / fixture, proc / "pressure" / "io")
    return PressureSource(HostPaths(procfs=str(proc)), PressureConfig(), clock=lambda: 1000.0)


def test_both_lines_are_read_as_seconds_since_boot(tmp_path: Path) -> None:
    facts = source(tmp_path, "io").collect()
    assert facts == PressureFacts(1000.0, 1253.835416, 472.564085)


def test_a_kernel_without_a_full_line_has_no_stalled_figure(tmp_path: Path) -> None:
    facts = source(tmp_path, "io-no-full").collect()
    assert (facts.waiting_seconds, facts.stalled_seconds) == (56.0, None)


def test_a_kernel_without_pressure_information_has_the_source_off_with_the_reason(tmp_path: Path) -> None:
    src = source(tmp_path, None)
    facts = src.collect()
    assert facts.waiting_seconds is None
    assert src.off_reason is not None and src.off_reason.startswith("this kernel gives no pressure stall information")
    assert "CONFIG_PSI" in src.off_reason and "psi=1" in src.off_reason


def test_a_bad_some_line_is_counted_and_fails_the_collection_saying_why(tmp_path: Path) -> None:
    src = source(tmp_path, "io-bad-some")
    with pytest.raises(UnusableInput, match=r"pressure/io: no 'some' line could be parsed \(line 1: "):
        src.collect()
    assert src.parse_errors == 1


def test_the_node_s_own_file_is_read_where_it_has_one_and_the_source_is_off_where_not() -> None:
    src = PressureSource(HostPaths(), PressureConfig())
    facts = src.collect()
    if Path("/proc/pressure/io").exists():
        assert facts.waiting_seconds is not None and facts.waiting_seconds >= 0 and src.off_reason is None
    else:
        assert facts.waiting_seconds is None and src.off_reason is not None


def _scrape(facts: PressureFacts | None) -> dict[str, float]:
    view = rich_view()
    merged = {k: v for k, v in view.snapshot.facts.items() if k != PRESSURE.name}
    if facts is not None:
        merged[PRESSURE.name] = facts
    view = dataclasses.replace(view, snapshot=dataclasses.replace(view.snapshot, facts=merged))
    text = Exporter(exporter_areas(), process_metrics=False).render(view).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if "io_pressure" in s.name}


def test_the_area_writes_the_counters_through_the_registry_line() -> None:
    assert BY_NAME["pressure"].metrics is not None and BY_NAME["pressure"].section == "pressure"
    assert _scrape(PressureFacts(1.0, 12.5, 3.25)) == {
        "storwatch_io_pressure_waiting_seconds_total": 12.5,
        "storwatch_io_pressure_stalled_seconds_total": 3.25,
    }
    assert _scrape(PressureFacts(1.0, 12.5, None)) == {"storwatch_io_pressure_waiting_seconds_total": 12.5}
    assert _scrape(PressureFacts(1.0, None, None)) == {}  # off: nothing written, the collector says why
    assert _scrape(None) == {}
