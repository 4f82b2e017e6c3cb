"""The metric catalog (storwatch/exporter/catalog.py) against what ships.

Every family a scrape writes is declared there, with its type, help and label names, and each label value of a fixed
set is one of those listed; every declared metric is written by one of the scrapes here (so no entry is stale); each
area writes only the metrics declared for it; the README's metrics table names the same metrics with the same labels;
and no series carries a PID. The scrapes: the golden file (the gpu-node fixture through the sources, kept current by
test_golden), a View built here with facts for every area, and a running agent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from storwatch.analysis.build import build_view
from storwatch.analysis.io import WindowFeeder
from storwatch.analysis.latency import LatencyWindows
from storwatch.analysis.stalls import StallState
from storwatch.analysis.view import View
from storwatch.checkpoints.scan import DatasetDir
from storwatch.classify import Classifier
from storwatch.exporter import AlertmanagerCounts, ConfigReloads, Exporter, ExportState, Family
from storwatch.exporter import gpu as gpu_area
from storwatch.exporter.catalog import BY_NAME, CATALOG, MetricSpec, main
from storwatch.exporter.text import labels_template, render_text
from storwatch.procfs.cgroup import ContainerRef, SlurmJob
from storwatch.procfs.diskstats import parse_diskstats
from storwatch.procfs.lustre import parse_llite_stats
from storwatch.procfs.pidio import ProcessIO
from storwatch.registry import SOURCES, exporter_areas
from storwatch.snapshot import Snapshot
from storwatch.sources.access import ACCESS, AccessFacts, WorkloadAccess
from storwatch.sources.checkpoints import (
    CHECK_ERROR_REASONS,
    CLAIM_REJECT_REASONS,
    Checkpoint,
    CheckpointFacts,
    RunState,
    StuckRoot,
    Unreadable,
)
from storwatch.sources.diskio import DiskIO
from storwatch.sources.gpu import GPUFacts, GPUProcess, GPUState
from storwatch.sources.kubevolumes import ClusterObjects, KubeFacts, NodeInfo, PodInfo
from storwatch.sources.lustre import LUSTRE, LustreClient, LustreFacts
from storwatch.sources.mountstats_reader import MountStatsReader
from storwatch.sources.nfs import NFSStats
from storwatch.sources.probe import Histogram, ProbeResult
from storwatch.sources.processes import CONTAINERS, ProcessFacts
from storwatch.vocabulary import CollectorStatus, FsUsage, Mount, MountDevice, Platform
from tests.agentproc import running_agent, wait_until

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "gpu-node" / "golden.prom"
NFSV3 = FIXTURES / "mountstats" / "nfsv3"
LLITE = FIXTURES / "lustre" / "v2.15" / "sys" / "kernel" / "debug" / "lustre" / "llite"

NOW = 1_800_000_000.0
GiB = 1 << 30
POD_UID = "81742e8f-be31-4219-bac3-e2ed48dd4123"
TRAINER, LOADER, SLURM_JOB = 4242, 4343, 5151
"""GPU processes: one in a pod, one in no container and no job, one in a Slurm job."""


# -- a View with facts for every area


def _mount(mount_id: int, mountpoint: str, device: str, fstype: str, block: MountDevice | None = None) -> Mount:
    usage = FsUsage(1000 * GiB, 400 * GiB, 380 * GiB, 1_000_000, 900_000)
    return Mount(
        mount_id, mountpoint, device, fstype, "/", 259, mount_id, False, (), (), usage, False, 0.0, None, block
    )


MOUNTS = (
    _mount(1, "/", "/dev/nvme0n1p1", "ext4", MountDevice("nvme0n1p1", ("nvme0n1",), partition=True)),
    _mount(2, "/scratch", "/dev/nvme1n1", "ext4", MountDevice("nvme1n1", ("nvme1n1",))),
    _mount(3, "/mnt/datasets", "10.0.0.5:/export/datasets", "nfs"),  # an NFS mount of the nfsv3 fixture
    _mount(4, "/dev/shm", "tmpfs", "tmpfs"),
    _mount(5, "/lustre", "10.0.0.9@tcp:/scratch", "lustre"),
    dataclasses.replace(_mount(6, "/home", "nfs:/home", "nfs4"), usage=None, stuck=True, stuck_seconds=12.5),
)
DISKSTATS = (
    " 259 0 nvme0n1 9000 10 720000 3000 8000 20 640000 4000 0 5000 7000 100 0 800 5 50 60\n"
    " 259 1 nvme0n1p1 8000 10 640000 2500 7000 20 560000 3500 0 4000 6000 90 0 700 0 0 0\n"
    " 259 2 nvme1n1 90000 100 7200000 30000 80000 200 6400000 40000 3 50000 70000 1000 0 8000 50 500 600\n"
)


def _checkpoint(path: str, age: float, write_seconds: float | None = None, fmt: str = "torch-zip") -> Checkpoint:
    return Checkpoint(
        path=path,
        format=fmt,
        verdict="complete",
        reason="complete",
        size_bytes=2 * GiB,
        allocated_bytes=2 * GiB,
        mtime=NOW - age,
        deep_checked=False,
        first_seen=NOW - age,
        write_seconds=write_seconds,
        write_bytes_per_second=None if write_seconds is None else 2 * GiB / write_seconds,
    )


def _checkpoint_facts() -> CheckpointFacts:
    llama = RunState(
        "/scratch/llama",
        "/scratch",
        (
            _checkpoint("/scratch/llama/step-100", 3600.0, 20.0),
            _checkpoint("/scratch/llama/step-200", 600.0, 18.0),
            dataclasses.replace(_checkpoint("/scratch/llama/step-300", 5.0), verdict="incomplete"),
        ),
        orphaned_temps=1,
        orphaned_temp_bytes=GiB,
    )
    weights = RunState(
        "/scratch/models/llama-weights",
        "/scratch",
        (_checkpoint("/scratch/models/llama-weights/model.safetensors", 7200.0, fmt="safetensors"),),
    )
    bert = RunState(
        "/mnt/datasets/ckpt/bert",
        "/mnt/datasets",
        (
            _checkpoint("/mnt/datasets/ckpt/bert/step-1", 1800.0, 60.0),
            dataclasses.replace(_checkpoint("/mnt/datasets/ckpt/bert/step-2", 300.0, 55.0), writer_pid=SLURM_JOB),
        ),
    )
    return CheckpointFacts(
        NOW,
        runs=(llama, weights, bert),
        truncated=False,
        truncated_reason=None,
        scan_seconds=0.25,
        roots=("/scratch", "/mnt/datasets", "/home"),
        stuck_roots=(StuckRoot("/home", 40.0, "statvfs past its deadline"),),
        check_errors={**dict.fromkeys(CHECK_ERROR_REASONS, 0), "os_error": 2},
        claims_rejected={**dict.fromkeys(CLAIM_REJECT_REASONS, 0), "not_writer": 1, "future": 3},
        unreadable=(Unreadable("/mnt/datasets", 3, ("/mnt/datasets/private",)),),
        datasets=(DatasetDir("/scratch/data/shards", 400, 100 * GiB, NOW - 100),),
    )


def _gpus() -> GPUFacts:
    def gpu(index: int, processes: tuple[GPUProcess, ...], throttle: int) -> GPUState:
        return GPUState(
            index,
            f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd",
            "NVIDIA H100 80GB HBM3",
            True,
            utilization_ratio=0.12,
            memory_utilization_ratio=0.05,
            memory_used_bytes=40 * GiB,
            memory_total_bytes=80 * GiB,
            power_watts=310.5,
            temperature_celsius=54.0,
            throttle_reasons=throttle,
            xid_counts={79: 1} if index == 0 else {},
            processes=processes,
        )

    return GPUFacts(
        NOW,
        nvml_up=True,
        driver_version="550.54.15",
        error=None,
        gpus=(
            gpu(0, (GPUProcess(TRAINER, 30 * GiB, None), GPUProcess(LOADER, 2 * GiB, None)), 0x4),
            gpu(1, (GPUProcess(SLURM_JOB, 20 * GiB, None),), 0x1),
            GPUState(2, "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd", "NVIDIA H100 80GB HBM3", False, error="GPU lost"),
        ),
    )


def _kube() -> KubeFacts:
    pod = PodInfo(POD_UID, "trainer-0", "ml", "node-1", deletion_timestamp=NOW + 20, grace_seconds=30)
    node = NodeInfo(
        "node-1",
        cordoned=True,
        taints=(("ToBeDeletedByClusterAutoscaler", "NoSchedule"),),
        removal_taints=("ToBeDeletedByClusterAutoscaler",),
    )
    return KubeFacts(True, True, cluster=ClusterObjects(pods={POD_UID: pod}), node=node, timestamp=NOW)


def _access() -> AccessFacts:
    def workload(pid: int) -> WorkloadAccess:
        return WorkloadAccess(
            pid,
            3,
            ProcessIO(read_bytes=1 << 20, write_bytes=2 << 20, rchar=3 << 20, wchar=4 << 20, syscr=10, syscw=20),
            comm="python3",
            mounts_read=("/mnt/datasets",),
            mounts_written=("/scratch",),
        )

    return AccessFacts(NOW, {pid: workload(pid) for pid in (TRAINER, LOADER, SLURM_JOB)})


def rich_view() -> View:
    """One View with facts for every area of the exporter: mounts with devices, NFS, a probe, GPUs in a pod, a Slurm
    job and neither, checkpoint runs on node and cluster storage with findings, the Kubernetes node being drained,
    a Lustre client, GPU workloads' I/O, and stalls."""
    disks, errors = parse_diskstats(DISKSTATS)
    assert errors == []
    nfs_mounts, nfs_errors = MountStatsReader(lambda errors: None).read(NFSV3.read_bytes())
    assert nfs_errors == []
    histogram = Histogram((0, 0, 0, 0, 3, 17, 19, 19, 19, 19, 19, 20, 20, 20, 20, 20, 20), 0.375, 20)
    probe = ProbeResult(
        "/scratch", NOW - 3, {"write": 0.004, "fsync": 0.012, "read": 0.0008}, False, 0.0, None, {"write": histogram}
    )
    llite = LLITE / "scratch-ffff9bc043537800" / "stats"
    stats, llite_errors = parse_llite_stats(llite.read_bytes())
    assert llite_errors == []
    collectors = tuple(
        CollectorStatus(spec.name, True, 0.01, NOW, parse_errors=0)
        if spec.name != "probe"
        else CollectorStatus(spec.name, False, 0.0, None, off_reason="no probe chosen")
        for spec in SOURCES
    )
    snapshot = Snapshot(
        NOW,
        mounts=MOUNTS,
        collectors=collectors,
        disks=DiskIO(NOW, {d.name: d for d in disks}, {}),
        nfs=NFSStats(NOW, {m.mountpoint: m for m in nfs_mounts}, {}),
        probes=(probe,),
        gpus=_gpus(),
        checkpoints=_checkpoint_facts(),
        kube=_kube(),
        facts={
            CONTAINERS.name: ProcessFacts(
                {
                    TRAINER: ContainerRef("containerd", "c0ffee" * 10 + "abcd", POD_UID, "guaranteed", "/kubepods"),
                    LOADER: None,
                    SLURM_JOB: None,
                },
                jobs={SLURM_JOB: SlurmJob(77, "0", 1000)},
            ),
            LUSTRE.name: LustreFacts(NOW, (LustreClient("scratch-ffff9bc043537800", "scratch", "/lustre", stats),)),
            ACCESS.name: _access(),
        },
    )
    windows = LatencyWindows()
    WindowFeeder(windows).feed(snapshot)
    view = build_view(snapshot, Classifier("generic"), Platform("generic", "configured"), windows=windows)
    stalls = StallState(totals={("0", "/scratch", "checkpoint_write"): 30.0, ("1", "/mnt/datasets", "data_read"): 4.0})
    return dataclasses.replace(view, stalls=stalls)


def rich_scrape() -> str:
    """Every area of a scrape of :func:`rich_view`, with the reload record, the Alertmanager receiver's counts and this
    process's metrics."""
    counts = AlertmanagerCounts()
    counts.request("accepted")
    counts.alerts("stored", 2)
    exporter = Exporter(exporter_areas(), process_metrics=True, reloads=ConfigReloads(), alertmanager=counts)
    return exporter.render(rich_view()).decode("utf-8")


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
        'storwatch_finding{id="0123456789abcdef",severity="mild"} 1.0\n'
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
    """allow_inf and the label names come from the entry (test_strict_output checks allow_inf against the README)."""
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


# -- the README's table, and the catalog printed


def readme_rows() -> list[tuple[list[str], set[str], str]]:
    """The README's metrics table: each row's metric names (``_x`` after a first name is that name's subsystem plus
    ``_x``; ``{a,b}`` is one name per choice), its label names (a bracket after a name lists its values) and its
    meaning."""
    section = README.read_text(encoding="utf-8").split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
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


def test_the_readme_table_names_every_metric_once_with_its_labels() -> None:
    rows = readme_rows()
    assert len(rows) > 30
    seen = [name for names, _, _ in rows for name in names]
    assert sorted(n for n in set(seen) if seen.count(n) > 1) == [], "named in more than one row"
    assert set(seen) - set(BY_NAME) == set(), "in the README, not in the catalog"
    assert set(BY_NAME) - set(seen) == set(), "in the catalog, not in the README"
    wrong = [
        (name, sorted(labels), sorted(BY_NAME[name].label_names))
        for names, labels, _ in rows
        for name in names
        if labels != set(BY_NAME[name].label_names)
    ]
    assert wrong == []


def test_the_readme_says_what_inf_means_exactly_where_the_catalog_allows_it() -> None:
    documented = {name for names, _, meaning in readme_rows() if "`+Inf`" in meaning for name in names}
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
