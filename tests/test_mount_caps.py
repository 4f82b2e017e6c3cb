"""The bound on mounts with series of their own (mounts.max_series): the ``mountpoint`` label grows with pods (each
pod's token, secret and volume mounts are mounts of the node), so past the bound the mounts an operator least needs
lose their series, are counted in storwatch_mount_series_dropped, and stay everywhere else.

Rendered by the real exporter with every area of the registry, parsed back with prometheus_client's parser.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from storwatch.analysis.view import MountIO, MountView, View
from storwatch.config import DEFAULT_MAX_MOUNT_SERIES, parse_config
from storwatch.exporter import Exporter
from storwatch.exporter.area import unexported_mounts
from storwatch.procfs.diskstats import parse_line
from storwatch.snapshot import Snapshot
from storwatch.vocabulary import Durability, Mount, Platform, Verdict
from tests.builders import NOW, ckpt, run

DISK = parse_line("259 0 nvme0n1 10 0 80 5 20 0 160 9 0 7 14 0 0 0 0 0 0")
POD = "/var/lib/kubelet/pods/0a6f2e1d-3c4b-4a59-8e7f-{:012d}/volumes"


def _mount(mountpoint: str, fstype: str = "tmpfs", readonly: bool = False, stuck: bool = False) -> Mount:
    return Mount(1, mountpoint, fstype, fstype, "/", 0, 1, readonly, (), (), None, stuck, 5.0 if stuck else 0.0)


def _mv(mountpoint: str, durability: Durability = Durability.VOLATILE, **kw: object) -> MountView:
    io = kw.pop("io", None)
    return MountView(_mount(mountpoint, **kw), Verdict(durability, "test", ()), io or MountIO())  # type: ignore[arg-type]


def _node(tokens: int) -> tuple[list[MountView], dict[str, MountView]]:
    """A node's mounts in mount-table order: per pod a read-only projected token (idle), then the special ones."""
    mounts = [_mv(POD.format(i) + "/kubernetes.io~projected/kube-api-access", readonly=True) for i in range(tokens)]
    special = {
        "scratch": _mv(POD.format(9001) + "/kubernetes.io~empty-dir/scratch"),
        "disk": _mv("/data", Durability.NODE, fstype="ext4", io=MountIO(device="nvme0n1", counters=DISK)),
        "stuck": _mv("/mnt/dead", Durability.CLUSTER, fstype="nfs4", stuck=True),
        "ckpt": _mv(POD.format(9002) + "/kubernetes.io~empty-dir/ckpt", Durability.NODE),
    }
    # The special ones come last in the mount table: they keep their series by rank, not by place.
    return mounts + list(special.values()), special


def _scrape(view: View, limit: int = DEFAULT_MAX_MOUNT_SERIES) -> dict[str, list[tuple[dict[str, str], float]]]:
    from storwatch.registry import exporter_areas

    text = Exporter(exporter_areas(), process_metrics=False, max_mount_series=limit).render(view).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _view(mounts: list[MountView], special: dict[str, MountView]) -> View:
    holding = run("ckpt-run", special["ckpt"], ckpt(60))
    return View(Snapshot(NOW), Platform("generic", "test"), mounts=tuple(mounts), checkpoints=(holding,))


def test_past_the_bound_idle_read_only_mounts_lose_their_series_first_and_are_counted() -> None:
    tokens = DEFAULT_MAX_MOUNT_SERIES + 40
    mounts, special = _node(tokens)
    scrape = _scrape(_view(mounts, special))
    shown = {labels["mountpoint"] for labels, _ in scrape["storwatch_mount_stuck"]}
    assert len(shown) == DEFAULT_MAX_MOUNT_SERIES
    assert scrape["storwatch_mount_series_dropped"] == [({}, float(len(mounts) - DEFAULT_MAX_MOUNT_SERIES))]
    # Stuck, holding a run, with I/O, writable: every one kept although last in the table.
    assert {mv.mount.mountpoint for mv in special.values()} <= shown
    # The idle read-only tokens left out are the last ones in table order: the same ones from one View to the next.
    dropped = {mv.mount.mountpoint for mv in mounts} - shown
    assert dropped == {mv.mount.mountpoint for mv in mounts[DEFAULT_MAX_MOUNT_SERIES - 4 : tokens]}
    # Every mount-labelled family follows the bound (info, durability, stuck...), not just one.
    for name in ("storwatch_mount_info", "storwatch_mount_readonly", "storwatch_mount_stuck_seconds"):
        assert {labels["mountpoint"] for labels, _ in scrape[name]} == shown, name
    assert {labels["mountpoint"] for labels, _ in scrape["storwatch_mount_durability"]} == shown


def test_the_ranking_keeps_stuck_then_holding_then_busy_then_writable() -> None:
    mounts, special = _node(3)
    view = _view(mounts, special)
    order = ["stuck", "ckpt", "disk", "scratch"]
    for limit in range(1, len(order) + 1):
        left = unexported_mounts(view, limit)
        kept = {mv.mount.mountpoint for mv in mounts} - left
        assert kept == {special[name].mount.mountpoint for name in order[:limit]}, limit
    assert unexported_mounts(view, len(mounts)) == frozenset()


def test_at_or_under_the_bound_every_mount_has_series_and_none_are_counted_dropped() -> None:
    mounts, special = _node(10)
    scrape = _scrape(_view(mounts, special))
    assert len(scrape["storwatch_mount_stuck"]) == len(mounts)
    assert scrape["storwatch_mount_series_dropped"] == [({}, 0.0)]


def test_a_dropped_mount_writes_no_io_series_and_the_bound_is_configurable() -> None:
    mounts, special = _node(0)
    view = _view(mounts, special)
    scrape = _scrape(view, limit=1)  # only the stuck mount keeps its series
    assert [labels["mountpoint"] for labels, _ in scrape["storwatch_mount_stuck"]] == ["/mnt/dead"]
    assert not any(labels.get("mountpoint") == "/data" for samples in scrape.values() for labels, _ in samples)
    assert parse_config("mounts: {max_series: 12}\n").mounts.max_series == 12
