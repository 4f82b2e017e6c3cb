"""Whatever numbers reach a View (a tenant's event line of ``"end": 1e999``, ``"bytes": NaN``, a start of -1.7e308),
what the agent serves stays well formed: /api/status and ``scan --json`` are strict JSON (RFC 8259) with those numbers
null and named, every SVG coordinate on /status is a finite number inside its picture, and /metrics carries ``+Inf``
only where docs/metrics.md says what it means, and NaN or -Inf nowhere.

The View is built from facts directly, as a checkpoint source that let such numbers through would leave them, and
served by the real HTTP server."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from storwatch.analysis.recovery import RunRecovery
from storwatch.analysis.stalls import Stall, StallState
from storwatch.analysis.timeline import Span
from storwatch.analysis.view import View
from storwatch.exporter import Exporter, Family
from storwatch.registry import exporter_areas
from storwatch.report import NON_FINITE, finite_data, strict_json, view_to_dict
from storwatch.web import StatusHTTPServer, render_status_page
from storwatch.web.timeline import WIDTH, timelines
from tests.browser import Elements
from tests.builders import page_with_a_stalled_gpu
from tests.docs_text import inf_metrics

INF, NAN = float("inf"), float("nan")


def hostile_view() -> View:
    """The stalled-GPU View of test_status_timeline, with every kind of number a tenant's files could bring: infinite,
    NaN, and finite but absurd, in checkpoints, recovery figures, stall totals, GPU readings and the timeline."""
    _, view = page_with_a_stalled_gpu()
    now = view.timestamp
    (rv,) = view.checkpoints
    assert rv.mount is not None and view.timeline is not None and view.stalls is not None and view.gpus is not None
    good = rv.run.checkpoints[-1]
    forged = (
        dataclasses.replace(good, path=good.path + ".1", write_seconds=INF, write_bytes_per_second=NAN),
        dataclasses.replace(good, path=good.path + ".2", mtime=1e999, write_seconds=-1.7e308),
    )
    run = dataclasses.replace(rv.run, checkpoints=(*rv.run.checkpoints, *forged))
    mount = dataclasses.replace(rv.mount, mount=dataclasses.replace(rv.mount.mount, stuck=True, stuck_seconds=INF))
    rv = dataclasses.replace(rv, run=run, mount=mount)
    recovery = (
        RunRecovery(
            rv.label, INF, NAN, INF, NAN, INF, gpus=2, tier_write_seconds={"node": INF, "cluster": NAN}, run=rv.id
        ),
        RunRecovery("other", NAN, -INF, -INF, INF, NAN, gpus=1, tier_write_seconds={"volatile": -INF}),
    )
    stalls = StallState(
        totals={**view.stalls.totals, ("1", "/scratch", "io_contention"): INF, ("1", "/data", "data_read"): NAN},
        current=(Stall("0", now - 5, INF, "/scratch", "checkpoint_write", rv.label),),
        settle_seconds=NAN,
    )
    g0, g1 = view.timeline.gpus
    g0 = dataclasses.replace(
        g0,
        stalls=(
            *g0.stalls,
            Span(-1.7e308, now - 5, "checkpoint_write", "/scratch"),  # began before there were clocks
            Span(now - 100, INF, "io_contention", "/scratch"),
            Span(NAN, now, "data_read", "/data"),
            Span(now - 10, now - 20, "io_contention", "/scratch"),  # ends before it starts
        ),
        writes=(*g0.writes, Span(now - 50, 1e999, rv.label), Span(now - 50, now + 1e300, rv.label)),
        utilization=(*g0.utilization, (now - 30, NAN), (now - 20, INF), (INF, 0.5)),
        latency=(*g0.latency, (now - 30, INF), (now - 20, NAN)),
    )
    timeline = dataclasses.replace(view.timeline, gpus=(g0, g1))
    gpu0, gpu1 = view.gpus.gpus
    gpus = dataclasses.replace(
        view.gpus,
        gpus=(dataclasses.replace(gpu0, power_watts=NAN, utilization_ratio=INF, temperature_celsius=-INF), gpu1),
    )
    snapshot = dataclasses.replace(view.snapshot, gpus=gpus)
    return dataclasses.replace(
        view,
        snapshot=snapshot,
        mounts=(mount,),
        checkpoints=(rv,),
        recovery=recovery,
        stalls=stalls,
        timeline=timeline,
    )


def refuse(word: str) -> Any:
    raise ValueError(f"not JSON (RFC 8259): {word}")


def at(data: Any, pointer: str) -> Any:
    for token in pointer.split("/")[1:]:
        data = data[int(token)] if isinstance(data, list) else data[token.replace("~1", "/").replace("~0", "~")]
    return data


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, View, Exporter]]:
    view = hostile_view()
    exporter = Exporter(exporter_areas(), process_metrics=False)
    server = StatusHTTPServer("127.0.0.1:0", lambda: view, lambda: exporter.render(view))
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", view, exporter
    finally:
        server.shutdown()
        server.server_close()


def get(base: str, path: str) -> str:
    with urllib.request.urlopen(base + path, timeout=10) as answer:
        return bytes(answer.read()).decode("utf-8")


def test_api_status_is_strict_json_with_each_non_finite_number_null_and_named(
    served: tuple[str, View, Exporter],
) -> None:
    base, view, _ = served
    body = get(base, "/api/status")
    data = json.loads(body, parse_constant=refuse)
    named = {(n["pointer"], n["value"]) for n in data[NON_FINITE]}
    for pointer, value in [
        ("/checkpoints/0/checkpoints/1/write_seconds", "inf"),
        ("/checkpoints/0/checkpoints/1/write_bytes_per_second", "nan"),
        ("/checkpoints/0/checkpoints/2/mtime", "inf"),
        ("/checkpoints/0/write_seconds_by_tier/node", "inf"),
        ("/mounts/0/stuck_seconds", "inf"),
        ("/gpus/0/power_watts", "nan"),
        ("/gpus/0/temperature_celsius", "-inf"),
        ("/stalls/settle_seconds", "nan"),
        ("/stalls/current/0/end", "inf"),
        ("/timeline/gpus/0/writes/1/end", "inf"),
    ]:
        assert (pointer, value) in named
        assert at(data, pointer) is None
    assert all(at(data, n["pointer"]) is None for n in data[NON_FINITE])
    # The finite figures are untouched, absurd ones included (they are a matter for the source, and finite).
    assert at(data, "/checkpoints/0/checkpoints/2/write_seconds") == -1.7e308
    assert at(data, "/checkpoints/0/checkpoints/0/write_seconds") == 30.0
    # What the same View gives `scan --json` (the CLI writes it with the same strict_json).
    assert json.loads(strict_json(view_to_dict(view), indent=2), parse_constant=refuse) == data


@pytest.mark.parametrize(
    ("data", "plain", "named"),
    [
        pytest.param({"a": 1.5, "b": [1, "x", None, True]}, {"a": 1.5, "b": [1, "x", None, True]}, [], id="finite"),
        pytest.param(NAN, None, [("", "nan")], id="bare"),
        pytest.param([1.0, INF, -INF], [1.0, None, None], [("/1", "inf"), ("/2", "-inf")], id="list"),
        pytest.param({"t": (0.0, NAN)}, {"t": [0.0, None]}, [("/t/1", "nan")], id="tuple"),
        pytest.param({"a/b": {"c~d": -INF}}, {"a/b": {"c~d": None}}, [("/a~1b/c~0d", "-inf")], id="pointer-escapes"),
        pytest.param(
            {"huge": 1e308, "tiny": -1e308, "n": 10**400},
            {"huge": 1e308, "tiny": -1e308, "n": 10**400},
            [],
            id="finite-however-large",
        ),
    ],
)
def test_finite_data(data: Any, plain: Any, named: list[tuple[str, str]]) -> None:
    got, found = finite_data(data)
    assert got == plain and [(f["pointer"], f["value"]) for f in found] == named
    json.loads(strict_json(got), parse_constant=refuse)


def test_finite_data_copies_only_what_it_changes() -> None:
    untouched, touched = {"a": [1.0, 2.0]}, {"b": INF}
    data = {"x": untouched, "y": touched}
    got, _ = finite_data(data)
    assert got["x"] is untouched and got["y"] == {"b": None} and touched == {"b": INF} and data["y"] is touched
    assert finite_data(untouched)[0] is untouched


def test_strict_json_refuses_a_bare_non_finite_number_rather_than_writing_one() -> None:
    with pytest.raises(ValueError):
        strict_json({"end": INF})


class SVGNumbers(HTMLParser):
    """Every number in an SVG attribute of the page: x, y, width, height, viewBox and each polyline point."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers: list[tuple[str, str, str]] = []
        self.svg_heights: list[float] = []
        self._in_svg = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "svg":
            self._in_svg = True
        if not self._in_svg:
            return
        for key, value in attrs:
            if key in ("x", "y", "width", "height", "viewbox", "points", "stroke-width", "fill-opacity"):
                for word in re.split(r"[ ,]+", (value or "").strip()):
                    self.numbers.append((tag, key, word))
        if tag == "svg":
            self.svg_heights.append(float(dict(attrs)["height"] or "nan"))

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._in_svg = False


def test_every_svg_coordinate_is_finite_and_inside_its_picture_and_what_was_left_out_is_said(
    served: tuple[str, View, Exporter],
) -> None:
    base, _, _ = served
    page = get(base, "/status")
    svg = SVGNumbers()
    svg.feed(page)
    assert len(svg.svg_heights) == 2 and svg.numbers
    tallest = max(svg.svg_heights)
    for tag, key, word in svg.numbers:
        value = float(word)  # raises for "inf" spelled any other way than a number, and for "None"
        assert math.isfinite(value), (tag, key, word)
        assert 0 <= value <= max(WIDTH, tallest), (tag, key, word)
    p = Elements()
    p.feed(page)
    # The stall and write that were sound are drawn as before; none of the forged spans is.
    assert len(p.having("rect", "stall")) == 1 and len(p.having("rect", "write")) == 1
    # GPU 0's caption: the 30 s stall, and how many values were not drawn (4 stalls, 2 writes, 3 + 2 readings).
    assert "30 s stalled on storage in the last hour (11 values not drawn: not a finite number" in page
    assert re.search(r"\b(inf|nan)\b", page, re.I) is None  # in no caption, title or label either


def test_a_picture_whose_hour_is_not_finite_is_not_drawn_and_says_so() -> None:
    data = view_to_dict(hostile_view())
    data["timeline"]["end"] = None
    html = timelines(data)
    assert "Not drawn" in html and "<svg" not in html
    render_status_page(data)  # and the page around it still renders


def test_metrics_carry_inf_only_where_the_docs_say_and_never_nan(served: tuple[str, View, Exporter]) -> None:
    base, view, exporter = served
    text = get(base, "/metrics")
    non_finite: dict[str, set[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not math.isfinite(sample.value):
                assert not math.isnan(sample.value), sample
                non_finite.setdefault(sample.name, set()).add(sample.value)
    documented = inf_metrics()
    assert documented == {
        "storwatch_recovery_point_seconds",
        "storwatch_gpu_seconds_at_risk",
        "storwatch_checkpoint_dropped_gpu_seconds_at_risk",
    }
    # The documented +Inf is still written (a run with nothing that survives the node), and nothing else is infinite.
    assert non_finite == {"storwatch_recovery_point_seconds": {INF}, "storwatch_gpu_seconds_at_risk": {INF}}
    # The families that may write +Inf are exactly those docs/metrics.md documents it for.
    allowed = {f.sample_name for f in exporter.families(view) if isinstance(f, Family) and f.allow_inf}
    assert allowed == documented
    # What was dropped was dropped, not clamped: the forged figures have no sample at all.
    assert 'storwatch_recovery_point_seconds{run="other"}' not in text
    assert re.search(r'^storwatch_gpu_stall_seconds_total\{[^}]*gpu="1"', text, re.M) is None
    assert re.search(r'^storwatch_gpu_stall_seconds_total\{[^}]*gpu="0"', text, re.M) is not None


def test_the_writer_leaves_out_every_value_that_is_not_finite_but_a_documented_inf() -> None:
    plain = Family("storwatch_test_seconds", "A figure.", labels=("run",))
    infinite = Family("storwatch_test_point_seconds", "+Inf when there is none.", labels=("run",), allow_inf=True)
    for family in (plain, infinite):
        for run, value in [("a", 1.5), ("b", INF), ("c", -INF), ("d", NAN), ("e", 10**400), ("f", -1e308)]:
            family.add((run,), value)
        family.add_text('{run="g"}', NAN)
    assert [line.split()[0] for line in plain.lines] == [
        'storwatch_test_seconds{run="a"}',
        'storwatch_test_seconds{run="f"}',  # 10**400 (e): an int no float holds, which no writer could write
    ]
    assert [line.split() for line in infinite.lines if "+Inf" in line] == [
        ['storwatch_test_point_seconds{run="b"}', "+Inf"]
    ]
    assert len(infinite.lines) == 3 and not any("NaN" in line or "-Inf" in line for line in infinite.lines)
    histogram = Family("storwatch_test_duration_seconds", "A histogram.", "histogram", labels=("op",))
    histogram.add_histogram(("write",), [("0.1", 1.0), ("+Inf", 2.0)], NAN)
    histogram.add_histogram(("read",), [("0.1", 1.0), ("+Inf", INF)], 0.5)
    assert histogram.lines == []  # a histogram without one of its series would be read wrong: none of it
    histogram.add_histogram(("fsync",), [("0.1", 1.0), ("+Inf", 2.0)], 0.5)
    assert len(histogram.lines) == 4  # the +Inf bucket is a label, not a value
