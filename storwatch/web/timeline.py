"""The pictures on /status, drawn on the server as inline SVG (no script, no outside asset): per GPU the last hour of
utilisation (each 10 s bucket's mean as a line, its lowest to highest sample as a band) and memory, stall spans
coloured by cause, checkpoint writes as bars, and the latency of the mount its run writes to (or, where nothing
measures that mount's latency, a line saying so and how to get it); and the findings panel, one line a finding, most
severe first.

Every drawn element carries a class (``util``, ``util-range``, ``memory``, ``stall <cause>``, ``write``,
``latency``) and a ``<title>`` a browser shows on hover, so the test can read the picture from the DOM as a person
reads it on screen.

Every coordinate is a finite number inside the picture: a time or value that is not a finite number (null in the
report), a span that ends before it starts, ends in the future or lasts longer than any stall or write can, is not
drawn, and the GPU's caption says how many were left out.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

from storwatch.printable import printable
from storwatch.report import NO_LATENCY_SOURCE, SearchSummary, human_seconds
from storwatch.words import CAUSE_WORDS

WIDTH, PLOT_HEIGHT, LATENCY_HEIGHT, MARGIN = 900, 90, 40, 48
BUCKET_SECONDS = 10.0
"""The width of a point's bucket (analysis/timeline.py): a point is drawn at its middle."""
MAX_SPAN_SECONDS = 86400.0
"""No stall or checkpoint write lasts a day: a span that began earlier than that before the picture's hour is a
clock step or a forged time (an event line's ``start``), not something to draw."""
CAUSE_COLOURS = {"checkpoint_write": "#e8871e", "data_read": "#8e44ad", "io_contention": "#c0392b"}


def findings_panel(findings: list[dict[str, Any]], search: SearchSummary, done: Mapping[str, str] | None = None) -> str:
    """The findings, most severe first, each with what was done about its run (``done``: its newest durable copy, the
    last checkpoint request and its answer), and where the checkpoint scan looked: "nothing found" only of places it
    searched, and where it searched nowhere, why and how to have a place searched."""
    e = html.escape
    caveats = f"<p class='note' id='search-caveats'>{shown(' '.join(search.caveats))}</p>" if search.caveats else ""
    if not findings:
        if search.searched is None:
            return (
                "<section id='findings' class='unsearched'><h2>At risk</h2>"
                f"<p id='searched'>{shown(search.unsearched or '')}</p>{caveats}</section>"
            )
        return (
            f"<section id='findings' class='{'unsure' if search.partial else 'none'}'><h2>At risk</h2>"
            f"<p id='searched'>{shown(search.searched)}: nothing important found on storage that is lost with this "
            f"node.</p>{caveats}</section>"
        )
    # One line a finding, in the report's order (most severe, then largest, first): its sentence names the run and
    # its directory, the bytes, the age and where the data should go; then why it is as severe as it is.
    items = "\n".join(
        f"<li class='finding {e(f['severity'])}' data-id='{e(f['id'])}'><b>{e(f['severity'])}</b> "
        f"<span class='sentence'>{shown(f['sentence'])}</span>"
        + (f" <span class='why'>({shown(f['severity_reason'])})</span>" if f.get("severity_reason") else "")
        + (f"<br><span class='done'>Done: {shown(done[f['run']])}</span>" if done and done.get(f["run"]) else "")
        + "</li>"
        for f in findings
    )
    where = f"<p class='note' id='searched'>{shown(search.searched)}.</p>" if search.searched else ""
    return f"<section id='findings'><h2>At risk</h2><ul>\n{items}\n</ul>{where}{caveats}</section>"


def shown(text: str) -> str:
    """Text from data (a tenant's file and directory names, and sentences quoting them) for the page: made printable
    (no control, bidirectional or line-separator character acts on what follows it), then escaped for HTML."""
    return html.escape(printable(text))


def _x(t: float, start: float, end: float) -> float:
    """The x of time ``t``, held inside the plot (``t``, ``start`` and ``end`` finite, ``end`` after ``start``)."""
    x = MARGIN + (t - start) / (end - start) * (WIDTH - 2 * MARGIN)
    return min(WIDTH - MARGIN, max(MARGIN, x))


def _finite(*values: Any) -> bool:
    """Every value is a number (not null: report.finite_data nulls infinities and NaN) and finite."""
    return all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def _drawable_points(points: list[list[Any]], start: float, end: float) -> list[tuple[float, float]]:
    """The points with a finite time inside the picture's hour (a bucket either side) and a finite value."""
    return [(t, v) for t, v in points if _finite(t, v) and start - BUCKET_SECONDS <= t <= end + BUCKET_SECONDS]


def _drawable_ranges(rows: list[list[Any]], start: float, end: float) -> list[tuple[float, float, float]]:
    """The (time, lowest, highest) rows with finite numbers, the lowest no higher than the highest, at a time inside
    the picture's hour (a bucket either side)."""
    return [
        (t, lo, hi)
        for t, lo, hi in rows
        if _finite(t, lo, hi) and lo <= hi and start - BUCKET_SECONDS <= t <= end + BUCKET_SECONDS
    ]


def _band(rows: list[tuple[float, float, float]], start: float, end: float, top: float, height: float) -> str:
    """Utilisation's lowest to highest sample in each bucket, as one shaded band under the mean's line."""
    if not rows:
        return ""

    def y(v: float) -> float:
        return top + height - min(1.0, max(0.0, v)) * height

    xs = [_x(t + BUCKET_SECONDS / 2, start, end) for t, _, _ in rows]
    upper = [f"{x:.1f},{y(hi):.1f}" for x, (_, _, hi) in zip(xs, rows, strict=True)]
    lower = [f"{x:.1f},{y(lo):.1f}" for x, (_, lo, _) in zip(reversed(xs), reversed(rows), strict=True)]
    # A stroke as well as the fill: a band of one bucket (a young agent) is a vertical line, which a fill leaves out.
    return (
        f"<polygon class='util-range' points='{' '.join(upper + lower)}' fill='#2e7d32' fill-opacity='0.2' "
        "stroke='#2e7d32' stroke-opacity='0.3' stroke-width='1'>"
        f"<title>utilisation, lowest to highest sample in each {BUCKET_SECONDS:.0f} s</title></polygon>"
    )


def _drawable_span(span: dict[str, Any], start: float, end: float) -> bool:
    """A span with finite times, in order, that ends no later than a bucket after the picture's end and began less
    than MAX_SPAN_SECONDS before its start. One wholly before the hour is not drawn either, but is no fault."""
    s, e = span["start"], span["end"]
    if not _finite(s, e):
        return False
    return bool(start - MAX_SPAN_SECONDS <= s <= e <= end + BUCKET_SECONDS)


def _polyline(
    points: list[tuple[float, float]],
    start: float,
    end: float,
    top: float,
    height: float,
    scale: float,
    cls: str,
    title: str,
) -> str:
    if not points:
        return ""
    coords = " ".join(
        f"{_x(t + BUCKET_SECONDS / 2, start, end):.1f},{top + height - min(1.0, max(0.0, v / scale)) * height:.1f}"
        for t, v in points
    )
    colour = {"util": "#2e7d32", "memory": "#757575", "latency": "#1565c0"}.get(cls, "#333")
    return (
        f"<polyline class='{cls}' points='{coords}' fill='none' stroke='{colour}' stroke-width='1.5'>"
        f"<title>{html.escape(title)}</title></polyline>"
    )


def gpu_timeline(g: dict[str, Any], start: float, end: float) -> str:
    """One GPU's SVG: utilisation and memory over stall spans and write bars, and its run mount's latency below.
    ``start`` and ``end`` are finite, ``end`` after ``start`` (:func:`timelines` sees to it)."""
    e = html.escape
    top, h = 18.0, PLOT_HEIGHT
    stalls = [s for s in g["stalls"] if _drawable_span(s, start, end)]
    writes = [w for w in g["writes"] if _drawable_span(w, start, end)]
    utilization = _drawable_points(g["utilization"], start, end)
    util_range = _drawable_ranges(g.get("utilization_range") or [], start, end)
    memory = _drawable_points(g["memory"], start, end)
    latency = _drawable_points(g["latency"], start, end) if g["latency_mountpoint"] else []
    drawn = [
        (g["stalls"], stalls),
        (g["writes"], writes),
        (g["utilization"], utilization),
        (g.get("utilization_range") or [], util_range),
        (g["memory"], memory),
    ]
    if g["latency_mountpoint"]:
        drawn.append((g["latency"], latency))
    left_out = sum(len(given) - len(kept) for given, kept in drawn)
    stalls = [s for s in stalls if s["end"] >= start]  # wholly before the hour: nothing to draw, nothing wrong
    writes = [w for w in writes if w["end"] >= start]
    parts = [
        f"<rect class='frame' x='{MARGIN}' y='{top}' width='{WIDTH - 2 * MARGIN}' height='{h}' fill='#fafafa' "
        "stroke='#ccc'/>",
        f"<text x='4' y='{top + 10}' font-size='11'>100%</text><text x='4' y='{top + h}' font-size='11'>0</text>",
    ]
    for s in stalls:
        x0, x1 = _x(max(s["start"], start), start, end), _x(s["end"], start, end)
        seconds = s["end"] - s["start"]
        parts.append(
            f"<rect class='stall {e(s['cause'])}' x='{x0:.1f}' y='{top}' width='{max(1.0, x1 - x0):.1f}' "
            f"height='{h}' fill='{CAUSE_COLOURS.get(s['cause'], '#999')}' fill-opacity='0.35'>"
            f"<title>{e(CAUSE_WORDS.get(s['cause'], s['cause']))} on {shown(s['mountpoint'])}: {seconds:.1f} s"
            "</title></rect>"
        )
    for w in writes:
        x0, x1 = _x(max(w["start"], start), start, end), _x(w["end"], start, end)
        parts.append(
            f"<rect class='write' x='{x0:.1f}' y='2' width='{max(1.0, x1 - x0):.1f}' height='12' fill='#1565c0'>"
            f"<title>checkpoint of {shown(w['run'])}: {w['end'] - w['start']:.1f} s</title></rect>"
        )
    parts.append(_band(util_range, start, end, top, h))
    parts.append(_polyline(utilization, start, end, top, h, 1.0, "util", "utilisation (10 s means)"))
    parts.append(_polyline(memory, start, end, top, h, 1.0, "memory", "memory used / total"))
    height = top + h + 6
    mp = g["latency_mountpoint"]
    sources = g.get("latency_sources")
    if mp and not latency:
        # Nothing measured: no chart (an empty one read "peak 1.0 ms", a figure nobody measured). A mount nothing
        # measures says so and how to get a measure; one that is measured did no write in the hour.
        ltop = height + 12
        why = NO_LATENCY_SOURCE if sources == [] else "no write measured in the last hour"
        parts.append(
            f"<text class='latency-unknown' x='{MARGIN}' y='{ltop}' font-size='11'>write latency of {shown(mp)}: "
            f"{e(why)}</text>"
        )
        height = ltop + 4
    elif mp:
        peak = max(v for _, v in latency)
        ltop = height + 12
        parts.append(
            f"<text x='{MARGIN}' y='{ltop - 2}' font-size='11'>write latency of {shown(mp)} "
            f"(peak {peak * 1000:.1f} ms)</text>"
            f"<rect class='frame' x='{MARGIN}' y='{ltop}' width='{WIDTH - 2 * MARGIN}' height='{LATENCY_HEIGHT}' "
            "fill='#fafafa' stroke='#ccc'/>"
        )
        # Every write took no measurable time: drawn along the bottom (any scale does), the peak said as measured.
        scale = peak if peak > 0 else 1.0
        parts.append(
            _polyline(latency, start, end, ltop, LATENCY_HEIGHT, scale, "latency", f"{printable(mp)} write latency")
        )
        height = ltop + LATENCY_HEIGHT + 4
    lost = sum(min(s["end"], end) - max(s["start"], start) for s in stalls)
    parts.append(
        f"<text x='{MARGIN}' y='{height + 12}' font-size='11'>{human_seconds(end - start)} ago</text>"
        f"<text x='{WIDTH - MARGIN - 24}' y='{height + 12}' font-size='11'>now</text>"
    )
    return (
        f"<figure class='gpu-timeline' data-gpu='{e(g['gpu'])}'><figcaption>GPU {e(g['gpu'])}: "
        f"{lost:.0f} s stalled on storage in the last hour{_left_out_words(left_out)}</figcaption>"
        f"<svg class='timeline' xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height + 16:.0f}' "
        f"viewBox='0 0 {WIDTH} {height + 16:.0f}' role='img'>{''.join(parts)}</svg></figure>"
    )


def _left_out_words(count: int) -> str:
    if not count:
        return ""
    values = "value" if count == 1 else "values"
    return (
        f" ({count} {values} not drawn: not a finite number, a span that ends before it starts or in the future, "
        f"or one that began over {MAX_SPAN_SECONDS / 3600:.0f} h before this hour)"
    )


def timelines(data: dict[str, Any]) -> str:
    t = data.get("timeline")
    if not t or not t["gpus"]:
        return ""
    if not (_finite(t["start"], t["end"]) and t["end"] > t["start"]):
        return (
            "<h2>GPUs, the last hour</h2><p class='note' id='timeline-not-drawn'>Not drawn: the picture's hour is "
            "not a span of finite times.</p>"
        )
    legend = " ".join(
        f"<span style='background:{c};opacity:.6'>&nbsp;&nbsp;&nbsp;</span> {html.escape(CAUSE_WORDS[k])}"
        for k, c in CAUSE_COLOURS.items()
    )
    body = "\n".join(gpu_timeline(g, t["start"], t["end"]) for g in t["gpus"])
    return (
        "<h2>GPUs, the last hour</h2><p class='note' id='timeline-legend'>Green: utilisation, its mean over each "
        f"{BUCKET_SECONDS:.0f} s as a line and its lowest to highest sample as a band; grey: memory used; "
        f"blue bars: checkpoint writes; shaded: GPU time lost to storage, {legend}.</p>\n{body}"
    )
