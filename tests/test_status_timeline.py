"""The /status pictures, rendered from the View: the per-GPU SVG timeline (utilisation, memory, stall spans by
cause, checkpoint writes, the run mount's latency) and the findings panel."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from storwatch.analysis.stall_feed import StallFeed
from storwatch.analysis.stalls import StallParams
from storwatch.analysis.view import MountIO, RunView, View
from storwatch.report import view_to_dict
from storwatch.snapshot import Snapshot
from storwatch.sources.checkpoints import RunState
from storwatch.sources.gpu.facts import GPUFacts, GPUState
from storwatch.vocabulary import Durability, Platform
from storwatch.web import render_status_page
from tests.browser import Elements, TableParser
from tests.builders import ckpt, on, page_with_a_stalled_gpu, stall_gpus


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


def sawtooth_view(seconds: int = 120) -> View:
    """A GPU that computes at 95% for 2 s and waits idle for 2 s, over and over, read as the agent reads the driver:
    five buffered samples at a time."""
    t0 = 1_000_000.0
    feed = StallFeed()
    feed.update(t0, [], [], None, {})
    for read in range(0, seconds, 5):
        samples = tuple((t0 + i, 0.95 if i % 4 < 2 else 0.0) for i in range(read + 1, read + 6))
        state = GPUState(0, "GPU-a", "H100", True, utilization_samples=samples)
        feed.observe(GPUFacts(t0 + read + 5, True, "550", None, (state,)), [])
    now = t0 + seconds + 5
    _, picture = feed.update(now, [], [], None, {})
    return View(Snapshot(now), Platform("generic", "test"), timeline=picture)


def test_a_sawtooth_keeps_its_peaks_and_troughs() -> None:
    """Each 10 s bucket keeps its lowest and highest sample: a 95%/0% sawtooth draws as a band from 0 to 95% around
    its mean, not as a flat line at the mean."""
    view = sawtooth_view()
    (g,) = view_to_dict(view)["timeline"]["gpus"]
    full = [row for row in g["utilization_range"] if row[0] % 10 == 0][1:-1]  # the whole buckets
    assert len(full) >= 10 and all((low, high) == (0.0, 0.95) for _, low, high in full), g["utilization_range"]
    means = {t: v for t, v in g["utilization"]}
    assert all(0.3 < means[t] < 0.65 for t, _, _ in full)  # the mean alone would say "about half, steadily"

    page = render_status_page(view_to_dict(view))
    p = Elements()
    p.feed(page)
    (band,) = p.having("polygon", "util-range")
    ys = [float(xy.split(",")[1]) for xy in band["points"].split()]
    (frame,) = [a for a in p.having("rect", "frame") if float(a["y"]) < 30]
    top, height = float(frame["y"]), float(frame["height"])
    # the band reaches 95% and 0% of the plot's height; the mean's line stays in between
    assert min(ys) == pytest.approx(top + 0.05 * height, abs=0.1)
    assert max(ys) == pytest.approx(top + height, abs=0.1)
    (util,) = p.having("polyline", "util")
    mean_ys = [float(xy.split(",")[1]) for xy in util["points"].split()]
    assert top + 0.3 * height < min(mean_ys[1:-1]) and max(mean_ys[1:-1]) < top + 0.7 * height
    assert any("lowest to highest sample in each 10 s" in t for t in p.titles)


def fuse_run_page(io: MountIO, write_seconds: float | None) -> tuple[str, dict[str, Any]]:
    """The page of a node whose GPU 0's process writes its run on /fuse (a FUSE mount: no block device under it),
    with ``io`` joined to that mount and, each second, writes taking ``write_seconds`` on average (None: none
    measured)."""
    t0 = 1_000_000.0
    base = on(Durability.NODE, "/fuse")
    mv = dataclasses.replace(base, mount=dataclasses.replace(base.mount, fstype="fuse.sshfs", major=0), io=io)
    c = dataclasses.replace(ckpt(0.0), mtime=t0 + 60, write_start=t0 + 40, write_seconds=20.0, writer_pid=4242)
    rv = RunView(RunState("/fuse/run", "/fuse", (c,)), "run", mv)
    feed = StallFeed(StallParams(settle_seconds=5.0))
    feed.update(t0, [rv], [mv], stall_gpus(t0, 0.95), {})
    for i in range(120):
        t = t0 + i
        latency = [] if write_seconds is None else [("/fuse", "write", t - 1, t, 2.0, 2 * write_seconds)]
        feed.observe(stall_gpus(t, 0.95), latency)
    now = t0 + 125
    state, picture = feed.update(now, [rv], [mv], stall_gpus(t0 + 119, 0.95), {})
    view = View(
        Snapshot(now, gpus=stall_gpus(t0 + 119, 0.95)),
        Platform("generic", "test"),
        mounts=(mv,),
        checkpoints=(rv,),
        stalls=state,
        timeline=picture,
    )
    data = view_to_dict(view)
    return render_status_page(data), data


def test_a_mount_nothing_measures_says_so_and_how_to_get_a_measure() -> None:
    """A FUSE mount has no block device and no NFS statistics: without a probe its latency is unknown, said as such
    with the key that gets it, in the GPU's picture and in the latency table, never drawn as a made-up peak."""
    page, data = fuse_run_page(MountIO(), None)
    assert data["timeline"]["gpus"][0]["latency_sources"] == [] and data["mounts"][0]["io"]["latency_sources"] == []
    p = Elements()
    p.feed(page)
    assert p.having("polyline", "latency") == [] and "peak" not in page
    assert len(p.having("text", "latency-unknown")) == 1
    assert "write latency of /fuse: no latency source \N{EM DASH} enable probes: probes.mountpoints" in page
    _, rows = table(page, "latency")
    assert rows == [["/fuse", "-", "no latency source \N{EM DASH} enable probes: probes.mountpoints"]]


@pytest.mark.parametrize(
    ("io", "write_seconds", "words"),
    [
        pytest.param(MountIO(device="loop7"), None, ": no write measured in the last hour", id="measured-idle"),
        pytest.param(MountIO(device="loop7"), 0.0, " (peak 0.0 ms)", id="measured-zero"),
        pytest.param(MountIO(device="loop7"), 0.150, " (peak 150.0 ms)", id="measured"),
    ],
)
def test_a_measured_mount_draws_what_was_measured_and_nothing_else(
    io: MountIO, write_seconds: float | None, words: str
) -> None:
    page, data = fuse_run_page(io, write_seconds)
    assert data["timeline"]["gpus"][0]["latency_sources"] == ["diskstats"]
    assert f"write latency of /fuse{words}" in page
    p = Elements()
    p.feed(page)
    lines = p.having("polyline", "latency")
    assert len(lines) == (0 if write_seconds is None else 1)
    if write_seconds == 0.0:  # every write took no measurable time: along the bottom of its frame
        (frame,) = [a for a in p.having("rect", "frame") if a["height"] == "40"]
        bottom = float(frame["y"]) + float(frame["height"])
        assert {float(xy.split(",")[1]) for xy in lines[0]["points"].split()} == {bottom}


def table(page: str, table_id: str) -> tuple[list[str], list[list[str]]]:
    parser = TableParser(table_id)
    parser.feed(page)
    parser.close()
    (header,) = parser.head_rows
    return header, parser.body_rows


def test_a_gpu_strip_draws_its_runs_mount_before_others_it_writes_to() -> None:
    """GPU 0's process writes logs on /aaa-logs (first by name) and its run's checkpoints on /scratch: the strip
    beside the GPU draws /scratch's latency, the mount its saves wait on."""
    from storwatch.procfs.pidio import ProcessIO
    from storwatch.sources.access import AccessFacts, WorkloadAccess

    t0 = 1_000_000.0
    mv = on(Durability.NODE, "/scratch")
    c = dataclasses.replace(ckpt(0.0), mtime=t0 - 10, write_start=t0 - 20, write_seconds=10.0, writer_pid=4242)
    rv = RunView(RunState("/scratch/run", "/scratch", (c,)), "run", mv)
    logs = WorkloadAccess(4242, 1, ProcessIO(), mounts_written=("/aaa-logs",))
    access = AccessFacts(t0, {4242: logs})
    feed = StallFeed()
    for i in range(3):  # a GPU is drawn from its second reading on
        feed.observe(stall_gpus(t0 + i, 0.9), [])
    _, picture = feed.update(t0 + 3, [rv], [mv], stall_gpus(t0, 0.9), {}, access)
    (gpu0,) = [g for g in picture.gpus if g.gpu == "0"]
    assert gpu0.latency_mount == "/scratch", gpu0
