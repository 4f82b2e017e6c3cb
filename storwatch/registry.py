"""Every source storwatch runs, declared once: its collector name, the configuration section it takes, how it is
made, the facts it files in the Snapshot, and how `storwatch scan` collects it. The agent, `scan`, reloads and the
configuration loader are all built from ``SOURCES``; docs/architecture.md has the recipe for adding one.

This module sits at the top of the layers (beside the agent): it is the one place that knows every source, so no
source, and nothing below the agent, has to. What only the agent runs (the exporter areas, the checkpoint source, the
Kubernetes watcher) is imported when it is made, so that `storwatch scan` and reading a configuration file do not.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast

from storwatch.calls.blocking import Helper
from storwatch.classify import Classifier, default_places, searchable_directory
from storwatch.config import (
    CheckpointsConfig,
    Config,
    DiskIOConfig,
    GPUConfig,
    KubeConfig,
    MountsConfig,
    NFSConfig,
    ProbesConfig,
    SyncConfig,
)
from storwatch.config import load_config as _load_config
from storwatch.config import parse_config as _parse_config
from storwatch.pace import Pace
from storwatch.paths import HostPaths
from storwatch.procfs.mountinfo import MountInfo, parse_mountinfo
from storwatch.sources import FactsKey, Source, access, copies, fileevents, lustre, pressure, read_first
from storwatch.sources.access import ACCESS, AccessConfig
from storwatch.sources.checkpoint_key import CHECKPOINTS, DefaultPlaces, SearchPlan, search_plan
from storwatch.sources.diskio import DISKIO, DiskIOSource
from storwatch.sources.gpu import GPUS, GPUFacts, GPUSource
from storwatch.sources.gpu import RETRYING as GPU_RETRYING
from storwatch.sources.kubevolumes import KUBE, KubeFacts
from storwatch.sources.lustre import LUSTRE, LustreConfig
from storwatch.sources.mounts import MOUNTS, MountFacts, MountSource, mount_of
from storwatch.sources.nfs import NFS, NFSSource
from storwatch.sources.probe import PROBES, ProbeSource, ProbeTarget
from storwatch.sources.processes import CONTAINERS, ProcessSource
from storwatch.vocabulary import Mount

if TYPE_CHECKING:
    from storwatch.analysis.view import View
    from storwatch.exporter import Area
    from storwatch.sources.checkpoints import CheckpointFacts, CheckpointSource
    from storwatch.sources.kube import KubeSource

C = TypeVar("C")
F = TypeVar("F")

ScanMode = Literal["once", "sampled", "never"]
"""How `storwatch scan` collects a source: once; twice, ``--sample`` seconds apart (counters whose change is the
point), and only with ``--sample``; or not at all (probes write to mounts)."""

KUBE_SCAN_WAIT_SECONDS = 5.0
"""How long `storwatch scan` waits for the Kubernetes API's first lists."""


@dataclass(frozen=True)
class SourceContext:
    """What a source's factory may use besides its section: where the host's files are, the clock, another source's
    latest facts (read when the source asks), and a way to be told of each View the agent publishes."""

    paths: HostPaths
    clock: Callable[[], float]
    latest: Callable[[FactsKey[Any]], Any]
    """Another source's newest facts (None before it reports)."""
    subscribe: Callable[[Callable[[View], None]], None]
    """Have a callable told of each View the agent publishes, on its ticker (`storwatch scan` publishes none)."""
    pace: Pace = field(default_factory=Pace)
    """The agent's pace, which the workers of ``paced`` sources wait by (storwatch/pace.py); never quiet unless the
    agent configures it."""
    classifier: Callable[[], Classifier] | None = None
    """The durability classifier as it stands (platform preset, overrides; a reload may replace it), for the
    checkpoint source's default places; None: the default places cannot be chosen."""
    helper: Helper | None = None
    """The helper process that the mount table's statvfs calls and the checkpoint walks share (``shared_helper``);
    None: each of those sources starts one of its own."""


def shared_helper() -> Helper:
    """The one helper process the agent's statvfs calls and checkpoint walks and checks go to: the checkpoint walks'
    program, whose operations include the plain blocking calls', so the node pays for one interpreter (about 10 MB
    resident) where it paid for two. Each source keeps its own bounds on it (storwatch/calls/blocking.py). The
    active probes keep a helper of their own: they time their writes inside it, where a walk's CPU would count."""
    from storwatch._checkpoint_worker import command

    return Helper(command())


@dataclass(frozen=True)
class ExporterArea:
    """An exporter area by name: the function ``function`` of ``storwatch/exporter/<module>.py``, a function
    ``(view, state) -> families``. Named rather than imported so that reading the registry (``storwatch scan``, a
    configuration file's sections) does not load the exporter and prometheus_client; the agent takes the functions
    from ``exporter_areas()``."""

    module: str
    function: str = "families"

    def resolve(self) -> Area:
        return cast("Area", getattr(importlib.import_module(f"storwatch.exporter.{self.module}"), self.function))


@dataclass(frozen=True)
class SourceSpec(Generic[C, F]):
    """One source, declared once."""

    name: str
    """Its collector name (``storwatch_collector_*{collector=...}``)."""
    section: str
    """The configuration section it takes, on start and on every reload (``configure(section)``)."""
    section_type: type[C]
    """The section's dataclass. A section that is not a field of Config is accepted by the loader under ``section``
    because it is declared here (a source added by the recipe declares its own)."""
    facts: FactsKey[F]
    """Where its facts go in the Snapshot."""
    make: Callable[[SourceContext, C], Source[F]]
    switch: str | None = None
    """The section's boolean field that turns the source on and off (``enabled``), if it has one. Off at start, the
    source is not made (turning it on takes a restart); switched off by a reload, it is closed and its facts dropped
    (the GPU source so releases the NVIDIA driver); switched on again, it is made anew."""
    scan: ScanMode = "once"
    scan_once: Callable[[SourceContext, C], F] | None = None
    """How `storwatch scan` collects it once, when not simply make, collect, close."""
    scan_off: Callable[[SourceContext, C], str | None] | None = None
    """Why `storwatch scan` has nothing for it to do on this host, where its section alone cannot say (None: it
    has)."""
    metrics: ExporterArea | None = None
    """The exporter area that writes its facts as metric families (storwatch/exporter/), if any."""
    paced: bool = False
    """Its worker waits by the agent's pace: at least ``quiet_seconds`` between collections while the node is quiet
    (storwatch/pace.py), and woken when it ends. For sources whose facts serve the GPU-time join and the Views, which
    a quiet node makes every ``quiet_seconds`` anyway; not for those that find what is new or stuck (mounts,
    checkpoints, probes) nor the GPU source, whose first process ends quiet. A paced source read every tick is part
    of the second's work, and its budget (``tick_cpu_share``) stretches it as it stretches the ticks."""
    budgeted: bool = False
    """Not paced, but its reads every tick are part of the second's work all the same (the GPU source: its one-second
    reads feed the stall accounting): they count in that budget and wait as it stretches the ticks, never by the
    quiet pace."""
    keeps_second: bool = False
    """Paced, but the second's budget never stretches it past ``tick_seconds``: the access source's looks between
    passes, which see a save while its file is open (who writes a run, the join's own evidence). Their cost is a few
    small reads per GPU process; stretched with the ticks on a busy node (3 to 5 s apart), saves of a few seconds
    went unseen. While a save's file is open the source keeps its own pace (``KeepsPace``): no budget stretches it."""

    def off_reason(self, section: C) -> str | None:
        """Why ``section`` switches the source off, or None while it leaves it on."""
        if self.switch is None or getattr(section, self.switch):
            return None
        return f"{self.section}.{self.switch} is false in the configuration"

    def section_of(self, config: Config) -> C:
        """This source's section of ``config`` (its default where the file has none)."""
        value = getattr(config, self.section, None)
        if value is None:
            value = config.extra_sections.get(self.section)
        return value if value is not None else self.section_type()


# -- how each source is made


def _mounts(ctx: SourceContext, section: MountsConfig) -> MountSource:
    return MountSource(ctx.paths, section, helper=ctx.helper)


def _diskio(ctx: SourceContext, section: DiskIOConfig) -> DiskIOSource:
    return DiskIOSource(ctx.paths, section, ctx.clock)


def _nfs(ctx: SourceContext, section: NFSConfig) -> NFSSource:
    return NFSSource(ctx.paths, section, ctx.clock)


def probe_targets(view: View | None) -> list[ProbeTarget]:
    """The mounts a probe may go to: every mount of the View but those whose statvfs is stuck (a probe there would
    only strand one more call: it waits until the mount answers)."""
    if view is None:
        return []
    return [
        ProbeTarget(mv.mount.mountpoint, mv.verdict.durability, mv.mount.readonly)
        for mv in view.mounts
        if not mv.mount.stuck
    ]


class ProbeTargets:
    """The probe source's targets, from each View the agent publishes (the source never asks for a View)."""

    def __init__(self) -> None:
        self.targets: list[ProbeTarget] = []

    def __call__(self, view: View) -> None:
        self.targets = probe_targets(view)

    def get(self) -> list[ProbeTarget]:
        return self.targets


def _probe(ctx: SourceContext, section: ProbesConfig) -> ProbeSource:
    targets = ProbeTargets()
    ctx.subscribe(targets)
    return ProbeSource(ctx.paths, section, targets.get, ctx.clock)


def _stuck_mount_paths(ctx: SourceContext) -> list[str]:
    mounts: MountFacts | None = ctx.latest(MOUNTS)
    return [ctx.paths.root(m.mountpoint) for m in mounts or () if m.stuck]


def _saving_files(ctx: SourceContext) -> frozenset[str]:
    """The files whose save the file events show may still be under way now (none before that source reports)."""
    events: fileevents.FileEventFacts | None = ctx.latest(fileevents.FILE_EVENTS)
    return events.saving(time.time()) if events is not None else frozenset()


def _mount_table(ctx: SourceContext) -> tuple[Sequence[Mount] | None, str | None]:
    """The mounts as the mount source last read them; before it first has, the host's mount table read here (a file
    of procfs: no mount is touched), so the first scan already searches the default places. None, and why, where
    neither can be had."""
    mounts: MountFacts | None = ctx.latest(MOUNTS)
    if mounts is not None:
        return mounts, None
    try:
        data = read_first(ctx.paths.mountinfo_candidates(), "the mount table")
    except OSError as err:
        return None, str(err)
    infos, _ = parse_mountinfo(data)
    if not infos:
        return None, "the mount table has no line that could be read"
    by_point: dict[str, MountInfo] = {}
    for info in infos:  # a later mount over the same point hides the earlier
        by_point.pop(info.mountpoint, None)
        by_point[info.mountpoint] = info
    return [mount_of(info) for info in by_point.values()], None


def checkpoint_plan(ctx: SourceContext, section: CheckpointsConfig) -> SearchPlan:
    """Where the checkpoint scan searches under ``section``: the configured roots, the default places the platform
    preset and the mount table choose (storwatch.classify.default_places; ``checkpoints.default_roots``), the
    kubelet's pod volumes."""
    if not section.default_roots:
        return search_plan(ctx.paths, section, None)
    if ctx.classifier is None:
        return search_plan(ctx.paths, section, None, "no durability classifier was given")
    mounts, why = _mount_table(ctx)
    if mounts is None:
        return search_plan(ctx.paths, section, None, why)
    places: DefaultPlaces = default_places(
        ctx.classifier(), mounts, lambda host_path: searchable_directory(ctx.paths.root(host_path))
    )
    return search_plan(ctx.paths, section, places)


def _checkpoints(ctx: SourceContext, section: CheckpointsConfig) -> CheckpointSource:
    from storwatch.sources.checkpoints import CheckpointSource

    return CheckpointSource(
        (),
        section,
        clock=ctx.clock,
        # A mount whose statvfs is stuck would hang the walk's helper too: its directories wait until it answers.
        stuck_paths=lambda: _stuck_mount_paths(ctx),
        saving=lambda: _saving_files(ctx),
        # Asked at every collection, and so of a reloaded section: the default places follow the mount table.
        plan=lambda s: checkpoint_plan(ctx, s),
        paths=ctx.paths,
        helper=ctx.helper,
    )


def _kube(ctx: SourceContext, section: KubeConfig) -> KubeSource:
    from storwatch.sources.kube import KubeSource

    return KubeSource(section.interval_seconds, clock=ctx.clock)


def _scan_checkpoints(ctx: SourceContext, section: CheckpointsConfig) -> CheckpointFacts:
    """The configured checkpoint roots walked once, with the agent's helper and limits (cheap checks only: a deep
    check reads every byte), collecting until every walk has answered or is stuck; a progress line on a terminal."""
    import sys

    from storwatch.sources.checkpoints import CheckpointSource

    source = CheckpointSource(
        (),
        dataclasses.replace(section, deep_per_scan=0),
        clock=ctx.clock,
        plan=lambda s: checkpoint_plan(ctx, s),
        paths=ctx.paths,
    )
    progress = sys.stderr.isatty()
    try:
        deadline = time.monotonic() + section.timeout_seconds
        facts = source.collect()
        while source.waiting and time.monotonic() < deadline:
            if progress:
                runs = len(facts.runs)
                sys.stderr.write(f"\rwalking checkpoint roots: {len(source.waiting)} still walking, {runs} runs found ")
                sys.stderr.flush()
            facts = source.collect()
        if progress:
            sys.stderr.write("\r\033[K")
        return facts
    finally:
        source.close()


def _no_checkpoint_roots(ctx: SourceContext, section: CheckpointsConfig) -> str | None:
    plan = checkpoint_plan(ctx, section)
    return None if plan.roots else plan.nowhere()


def _scan_kube(ctx: SourceContext, section: KubeConfig) -> KubeFacts:
    """This node's pods and the storage objects behind them, listed once (waiting a little for the first lists)."""
    from storwatch.sources.kube import KubeSource

    source = KubeSource(section.interval_seconds)
    if not source.enabled:
        return source.collect()
    try:
        source.start()
        deadline = time.monotonic() + KUBE_SCAN_WAIT_SECONDS
        while not source.api_up and time.monotonic() < deadline:
            time.sleep(0.05)
        facts = source.collect()
        if not facts.api_up:
            logging.getLogger("storwatch").warning(
                "the Kubernetes API did not answer within %.0f s (%s): mounts are shown without their pods",
                KUBE_SCAN_WAIT_SECONDS,
                facts.last_error or "no answer",
            )
        return facts
    finally:
        source.close()


def _gpu(ctx: SourceContext, section: GPUConfig) -> GPUSource:
    return GPUSource(
        section.interval_seconds, section.call_timeout_seconds, ctx.clock, section.samples_interval_seconds
    )


def _scan_gpu(ctx: SourceContext, section: GPUConfig) -> GPUFacts:
    # The GPU source logs for an agent that retries NVML with backoff; a one-shot scan never retries, and prints
    # what NVML said in its own output instead (keep the log when debugging).
    gpu_log = logging.getLogger("storwatch.sources.gpu")
    level = gpu_log.level
    if not gpu_log.isEnabledFor(logging.DEBUG):
        gpu_log.setLevel(logging.ERROR)
    source = GPUSource(call_timeout_seconds=min(section.call_timeout_seconds, 2.0))
    try:
        facts = source.collect()
    finally:
        source.close()
        gpu_log.setLevel(level)
    if facts.error and f"; {GPU_RETRYING}" in facts.error:
        facts = dataclasses.replace(facts, error=facts.error.split(f"; {GPU_RETRYING}", 1)[0])
    return facts


def _gpu_pids(ctx: SourceContext) -> list[int]:
    facts: GPUFacts | None = ctx.latest(GPUS)
    if facts is None:
        return []
    return sorted({p.pid for g in facts.gpus for p in g.processes})


def _processes(ctx: SourceContext, section: GPUConfig) -> ProcessSource:
    return ProcessSource(ctx.paths, lambda: _gpu_pids(ctx), section.interval_seconds)


SOURCES: tuple[SourceSpec[Any, Any], ...] = (
    SourceSpec("mounts", "mounts", MountsConfig, MOUNTS, _mounts, metrics=ExporterArea("mounts")),
    SourceSpec(
        "diskstats", "diskio", DiskIOConfig, DISKIO, _diskio, scan="sampled", metrics=ExporterArea("io"), paced=True
    ),
    SourceSpec("nfs", "nfs", NFSConfig, NFS, _nfs, scan="sampled", metrics=ExporterArea("nfs"), paced=True),
    SourceSpec(
        "probe", "probes", ProbesConfig, PROBES, _probe, scan="never", metrics=ExporterArea("io", "probe_families")
    ),
    SourceSpec(
        "checkpoints",
        "checkpoints",
        CheckpointsConfig,
        CHECKPOINTS,
        _checkpoints,
        scan_once=_scan_checkpoints,
        scan_off=_no_checkpoint_roots,
        metrics=ExporterArea("checkpoints"),
    ),
    SourceSpec(
        "kube",
        "kube",
        KubeConfig,
        KUBE,
        _kube,
        "enabled",
        scan_once=_scan_kube,
        metrics=ExporterArea("kube"),
        paced=True,
    ),
    SourceSpec(
        "gpu", "gpu", GPUConfig, GPUS, _gpu, "enabled", scan_once=_scan_gpu, metrics=ExporterArea("gpu"), budgeted=True
    ),
    SourceSpec("processes", "gpu", GPUConfig, CONTAINERS, _processes, "enabled", paced=True),
    SourceSpec(
        "lustre",
        "lustre",
        LustreConfig,
        LUSTRE,
        lustre.make,
        "enabled",
        "sampled",
        metrics=ExporterArea("lustre"),
        paced=True,
    ),
    SourceSpec("copies", "sync", SyncConfig, copies.COPIES, copies.make, scan="never"),
    SourceSpec(
        "file_events",
        "file_events",
        fileevents.FileEventsConfig,
        fileevents.FILE_EVENTS,
        fileevents.make,
        "enabled",
        "never",
    ),
    SourceSpec(
        "access",
        "access",
        AccessConfig,
        ACCESS,
        access.make,
        "enabled",
        "never",
        metrics=ExporterArea("access"),
        paced=True,
        keeps_second=True,
    ),
    SourceSpec(
        "pressure",
        "pressure",
        pressure.PressureConfig,
        pressure.PRESSURE,
        pressure.make,
        "enabled",
        "never",
        metrics=ExporterArea("pressure"),
        paced=True,
    ),
)
"""Every source, in the order their collectors are reported (a source whose factory reads another's facts comes
after it: processes after gpu)."""

SCRAPE_ORDER = ("mounts", "diskstats", "nfs", "probe", "gpu", "checkpoints", "kube")
"""The first sources' areas in a scrape, in the order their families have always been written; every other source's
area follows, in the order of SOURCES (a source added by the recipe needs no entry here)."""

BY_NAME: Mapping[str, SourceSpec[Any, Any]] = {spec.name: spec for spec in SOURCES}
assert len(BY_NAME) == len(SOURCES), "two sources of one name"
assert len({spec.facts.name for spec in SOURCES}) == len(SOURCES), "two sources file facts under one name"


def exporter_areas() -> tuple[Area, ...]:
    """What a scrape writes, in order: the agent's build and platform, each source's area (SCRAPE_ORDER, then the
    rest in the order of SOURCES), then the agent's health (collectors, reloads, its process)."""
    ordered = [BY_NAME[name] for name in SCRAPE_ORDER]
    ordered += [spec for spec in SOURCES if spec.name not in SCRAPE_ORDER]
    areas = [spec.metrics for spec in ordered if spec.metrics is not None]
    named = (ExporterArea("agent", "info_families"), *areas, ExporterArea("agent", "health_families"))
    return tuple(area.resolve() for area in named)


def extra_sections() -> dict[str, type]:
    """The configuration sections declared by sources beyond Config's own fields, by name."""
    fields = {f.name for f in dataclasses.fields(Config)}
    return {spec.section: spec.section_type for spec in SOURCES if spec.section not in fields}


def load_config(path: str | None) -> Config:
    """The configuration file (or the defaults), with every source's section known to the loader."""
    return _load_config(path, sections=extra_sections())


def parse_config(text: str, where: str = "config") -> Config:
    return _parse_config(text, where, sections=extra_sections())
