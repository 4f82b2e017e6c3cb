"""One exporter area that raises costs only its own families: the scrape still answers with every other area, the
failure is counted in storwatch_exporter_area_errors_total{area} (every area's series there at 0 from the first
scrape) and logged; the policy's and the sync action's figures, read from other threads, fail alone inside the
agent's own area. As node_exporter fails one collector, not the whole /metrics."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from storwatch.analysis.view import View
from storwatch.exporter import Exporter, ExportState, Family
from storwatch.registry import exporter_areas
from tests.rich_view import rich_view


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text.decode())
        for s in fam.samples
    }


def broken(view: View | None, state: ExportState) -> Iterator[Family]:
    """An area with a bug: it raises half way through its families."""
    from storwatch.exporter.agent import TICK_INTERVAL

    fam = TICK_INTERVAL.family()
    fam.add((), 1.0)
    yield fam
    raise KeyError("a field the View no longer has")


def test_a_failing_area_is_left_out_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    areas = exporter_areas()
    healthy = _samples(Exporter(areas, process_metrics=False).render(rich_view()))
    exporter = Exporter((*areas[:2], broken, *areas[2:]), process_metrics=False)
    with caplog.at_level(logging.ERROR, logger="storwatch.exporter"):
        first = _samples(exporter.render(rich_view()))
        second = _samples(exporter.render(rich_view()))
    assert ("storwatch_exporter_area_errors_total", (("area", "test_exporter_isolation.broken"),)) in first
    assert first[("storwatch_exporter_area_errors_total", (("area", "test_exporter_isolation.broken"),))] == 1
    assert second[("storwatch_exporter_area_errors_total", (("area", "test_exporter_isolation.broken"),))] == 2
    # every other area wrote what it writes without the broken one (the counters of errors aside)
    others = {k: v for k, v in healthy.items() if k[0] != "storwatch_exporter_area_errors_total"}
    assert {k: first[k] for k in others} == others
    assert first[("storwatch_exporter_area_errors_total", (("area", "mounts.families"),))] == 0
    assert ("storwatch_tick_interval_seconds", ()) not in first  # nothing of the broken area, not even its first half
    (line,) = [r for r in caplog.records if "test_exporter_isolation.broken" in r.getMessage()]
    assert "left out of this scrape" in line.getMessage() and "a field the View no longer has" in line.getMessage()


def test_the_policys_figures_failing_cost_only_their_own_lines() -> None:
    exporter = Exporter(exporter_areas(), process_metrics=False)

    def policy_figures() -> object:
        raise RuntimeError("the policy worker is being reloaded")

    exporter.state.policy = policy_figures  # type: ignore[assignment]
    text = _samples(exporter.render(rich_view()))
    assert text[("storwatch_exporter_area_errors_total", (("area", "agent.policy"),))] == 1
    assert ("storwatch_collector_success", (("collector", "mounts"),)) in text  # the rest of the agent's own area
