"""The /status pictures, rendered from the View: the per-GPU SVG timeline (utilisation, memory, stall spans by
cause, checkpoint writes, the run mount's latency) and the findings panel."""

from __future__ import annotations

from html.parser import HTMLParser

from storwatch.analysis.findings import find
from storwatch.analysis.view import View
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.vocabulary import Platform
from storwatch.web.page import render_status_page
from tests.test_stalls import _gpus, stalled_feed


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text of each <title>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.titles: list[str] = []
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        self._in_title = tag == "title"

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.titles.append(data)
            self._in_title = False

    def having(self, tag: str, cls: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and cls in a.get("class", "").split()]


def page_with_a_stalled_gpu() -> tuple[str, View]:
    t0 = 1_000_000.0
    feed, rv = stalled_feed(t0, 120, (40, 70), "llama")
    assert rv.mount is not None
    now = t0 + 130
    state, picture = feed.update(now, [rv], [rv.mount], _gpus(t0 + 119, 0.95), {})
    findings = find([rv], [rv.mount], now)
    view = View(
        Snapshot(now, gpus=_gpus(t0 + 119, 0.95)),
        Platform("generic", "test"),
        mounts=(rv.mount,),
        checkpoints=(rv,),
        findings=findings,
        stalls=state,
        timeline=picture,
    )
    return render_status_page(view_to_dict(view)), view


def test_the_timeline_draws_utilisation_stalls_writes_and_latency() -> None:
    page, _ = page_with_a_stalled_gpu()
    p = Elements()
    p.feed(page)
    svgs = p.having("svg", "timeline")
    assert len(svgs) == 2  # one per GPU
    (stall,) = p.having("rect", "stall")
    assert "checkpoint_write" in stall["class"].split()
    assert any(t.startswith("waiting on its checkpoint write on /scratch: 30.0 s") for t in p.titles)
    (write,) = p.having("rect", "write")
    assert float(write["width"]) == float(stall["width"])  # the stall is the write, GPU 0 waited all through it
    assert len(p.having("polyline", "util")) == 2 and len(p.having("polyline", "memory")) == 0  # no memory totals
    (latency,) = p.having("polyline", "latency")
    assert len(latency["points"].split()) >= 12  # 120 s of readings in 10 s buckets
    # GPU 0's utilisation line dips where the stall is drawn: the lowest point lies inside the stall's span
    util = p.having("polyline", "util")[0]["points"].split()
    lowest = min(util, key=lambda xy: -float(xy.split(",")[1]))
    x0 = float(stall["x"])
    assert x0 <= float(lowest.split(",")[0]) <= x0 + float(stall["width"]) + 10


def test_the_findings_panel_says_what_is_at_risk_first() -> None:
    page, view = page_with_a_stalled_gpu()
    p = Elements()
    p.feed(page)
    (item,) = p.having("li", "finding")
    assert "critical" in item["class"] and item["data-id"] == view.findings[0].id
    assert page.index("id='findings'") < page.index('id="mounts"')  # at the top
    assert view.findings[0].sentence.split(";")[0] in page
