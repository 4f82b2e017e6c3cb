"""The /status pictures, rendered from the View: the per-GPU SVG timeline (utilisation, memory, stall spans by
cause, checkpoint writes, the run mount's latency) and the findings panel."""

from __future__ import annotations

from tests.browser import Elements
from tests.builders import page_with_a_stalled_gpu


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
    assert view.findings[0].severity in item["class"] and item["data-id"] == view.findings[0].id
    assert page.index("id='findings'") < page.index('id="mounts"')  # at the top
    assert view.findings[0].sentence.split(";")[0] in page
