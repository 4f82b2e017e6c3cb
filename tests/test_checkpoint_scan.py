"""The checkpoint discovery walk on trees built in tmp_path: layouts, runs, symlinks, bounds, incremental rescans."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storwatch.checkpoints.scan import CheckpointScanner, ScanResult

HOUR = 3600.0


def write(path: Path, size: int = 16) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def age_tree(root: Path, seconds: float = HOUR) -> None:
    """Move every mtime below root an hour back, so the scanner trusts the listings (racy and settle rules) and
    any change made afterwards gets a different mtime, whatever the filesystem's timestamp granularity."""
    then = time.time() - seconds
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (then, then), follow_symlinks=False)
    os.utime(root, (then, then))


def by_path(result: ScanResult, root: Path) -> dict[str, tuple[str, str]]:
    """Candidate path relative to root -> (kind, run relative to root)."""
    return {
        os.path.relpath(c.path, root): (c.kind, os.path.relpath(c.run, root) if c.run != str(root) else ".")
        for c in result.candidates
    }


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "ckpt"
    r.mkdir()
    return r


class TickClock:
    """A monotonic clock that moves ``step`` seconds on every read."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


# -- layouts


LAYOUTS: list[tuple[str, list[str], dict[str, tuple[str, str]]]] = [
    (
        "hf-trainer",
        [
            "run1/checkpoint-500/model.safetensors",
            "run1/checkpoint-500/trainer_state.json",
            "run1/checkpoint-1000/model.safetensors",
            "run1/checkpoint-1000/trainer_state.json",
            "run1/config.json",
        ],
        {"run1/checkpoint-500": ("dir", "run1"), "run1/checkpoint-1000": ("dir", "run1")},
    ),
    (
        "hf-trainer-deepspeed-nested",
        [
            "run/checkpoint-10/global_step10/mp_rank_00_model_states.pt",
            "run/checkpoint-10/global_step10/zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "run/checkpoint-10/latest",
            "run/checkpoint-10/pytorch_model.bin",
        ],
        {"run/checkpoint-10": ("dir", "run")},
    ),
    (
        "deepspeed",
        ["ds/global_step100/mp_rank_00_model_states.pt", "ds/global_step200/mp_rank_00_model_states.pt", "ds/latest"],
        {"ds/global_step100": ("dir", "ds"), "ds/global_step200": ("dir", "ds")},
    ),
    (
        "megatron",
        [
            "mg/iter_0001000/mp_rank_00/model_optim_rng.pt",
            "mg/iter_0002000/mp_rank_00/model_optim_rng.pt",
            "mg/latest_checkpointed_iteration.txt",
        ],
        {"mg/iter_0001000": ("dir", "mg"), "mg/iter_0002000": ("dir", "mg")},
    ),
    (
        "torch-dcp",
        [
            "dcp/step_100/.metadata",
            "dcp/step_100/__0_0.distcp",
            "dcp/step_100/__1_0.distcp",
            "dcp/step_200/__0_0.distcp",
        ],
        {"dcp/step_100": ("dir", "dcp"), "dcp/step_200": ("dir", "dcp")},
    ),
    (
        "torchsnapshot",
        ["snap/epoch_1/.snapshot_metadata", "snap/epoch_1/0/model/weight"],
        {"snap/epoch_1": ("dir", "snap")},
    ),
    (
        "orbax",
        [
            "ox/checkpoints/1000/_CHECKPOINT_METADATA",
            "ox/checkpoints/1000/state/d/0.0",
            "ox/checkpoints/2000.orbax-checkpoint-tmp-1700000000/state/d/0.0",
            "ox/checkpoints/3000/commit_success.txt",
        ],
        {
            "ox/checkpoints/1000": ("dir", "ox/checkpoints"),
            "ox/checkpoints/2000.orbax-checkpoint-tmp-1700000000": ("dir", "ox/checkpoints"),
            "ox/checkpoints/3000": ("dir", "ox/checkpoints"),
        },
    ),
    (
        "sharded-safetensors",
        [
            "export/model.safetensors.index.json",
            "export/model-00001-of-00002.safetensors",
            "export/model-00002-of-00002.safetensors",
        ],
        {"export": ("dir", ".")},
    ),
    (
        "lightning-files",
        ["ll/v0/checkpoints/epoch=0-step=100.ckpt", "ll/v0/checkpoints/epoch=1-step=200.ckpt", "ll/v0/hparams.yaml"],
        {
            "ll/v0/checkpoints/epoch=0-step=100.ckpt": ("file", "ll/v0/checkpoints"),
            "ll/v0/checkpoints/epoch=1-step=200.ckpt": ("file", "ll/v0/checkpoints"),
        },
    ),
    (
        "plain-files",
        ["job/model_1.pt", "job/model_2.pth", "job/notes.txt", "job/data/train.jsonl"],
        {"job/model_1.pt": ("file", "job"), "job/model_2.pth": ("file", "job")},
    ),
    (
        # One file per step directory: the series is the directory holding the step directories.
        "step-dirs-one-file-each",
        ["exp/step_100/model.pt", "exp/step_200/model.pt", "exp/step_300/model.pt"],
        {
            "exp/step_100/model.pt": ("file", "exp"),
            "exp/step_200/model.pt": ("file", "exp"),
            "exp/step_300/model.pt": ("file", "exp"),
        },
    ),
    (
        # Two jobs with one file each are two runs: the job names are no numbered series.
        "two-jobs-one-file-each",
        ["jobs/alpha/model.pt", "jobs/beta/model.pt"],
        {"jobs/alpha/model.pt": ("file", "jobs/alpha"), "jobs/beta/model.pt": ("file", "jobs/beta")},
    ),
    (
        # Accelerate's save_state killed before its random states (model and optimizer written), and one killed before
        # its optimizer state: each one checkpoint of the series, not files of a run of their own.
        "accelerate-cut-short",
        [
            "acc/checkpoints/checkpoint_0/model.safetensors",
            "acc/checkpoints/checkpoint_0/optimizer.bin",
            "acc/checkpoints/checkpoint_0/random_states_0.pkl",
            "acc/checkpoints/checkpoint_0/custom_checkpoint_0.pkl",
            "acc/checkpoints/checkpoint_1/model.safetensors",
            "acc/checkpoints/checkpoint_1/optimizer.bin",
            "acc/checkpoints/checkpoint_2/model.safetensors",
        ],
        {
            "acc/checkpoints/checkpoint_0": ("dir", "acc/checkpoints"),
            "acc/checkpoints/checkpoint_1": ("dir", "acc/checkpoints"),
            "acc/checkpoints/checkpoint_2": ("dir", "acc/checkpoints"),
        },
    ),
    (
        # Only a step directory of the series holding nothing but what save_state writes is taken for a cut save.
        "accelerate-series-beside-others",
        [
            "acc/step_1/pytorch_model.bin",
            "acc/step_1/random_states_0.pkl",
            "acc/step_2/pytorch_model.bin",
            "acc/step_2/notes.txt",
            "acc/epoch_3/pytorch_model.bin",
        ],
        {
            "acc/step_1": ("dir", "acc"),
            "acc/step_2/pytorch_model.bin": ("file", "acc/step_2"),
            "acc/epoch_3/pytorch_model.bin": ("file", "acc/epoch_3"),
        },
    ),
    (
        "candidate-file-in-root",
        ["final.safetensors", "readme.md"],
        {"final.safetensors": ("file", ".")},
    ),
    (
        "nothing",
        ["a/b/c.txt", "a/checkpoint-x/file.txt", "a/iter_12/f.txt", "a/model.pt.tmp"],
        {},
    ),
]


@pytest.mark.parametrize(("files", "expected"), [(f, e) for _, f, e in LAYOUTS], ids=[i for i, _, _ in LAYOUTS])
def test_layouts_found_and_grouped(root: Path, files: list[str], expected: dict[str, tuple[str, str]]) -> None:
    for f in files:
        write(root / f)
    result = CheckpointScanner([str(root)]).scan()
    assert not result.truncated
    assert result.errors == ()
    assert by_path(result, root) == expected
    runs = {os.path.relpath(r.path, root) for r in result.runs}
    assert runs == {run for _, run in expected.values()}
    for run in result.runs:
        assert all(c.run == run.path for c in run.candidates)


def test_an_empty_step_directory_beside_accelerate_saves_is_one_cut_short_and_keeps_its_place(root: Path) -> None:
    """save_state makes its directory first: killed then, the directory is a save that wrote nothing, one checkpoint
    of the series (its check calls it incomplete); the weights written next join it, on a rescan too."""
    for name in ("model.safetensors", "optimizer.bin", "random_states_0.pkl"):
        write(root / "run" / "checkpoint_0" / name, 100)
    (root / "run" / "checkpoint_1").mkdir()
    scanner = CheckpointScanner([str(root)])
    result = scanner.scan()
    assert by_path(result, root) == {"run/checkpoint_0": ("dir", "run"), "run/checkpoint_1": ("dir", "run")}
    cut = next(c for c in result.candidates if c.path.endswith("checkpoint_1"))
    assert (cut.files, cut.size_bytes, cut.reason) == (0, 0, "beside accelerate step directories")
    write(root / "run" / "checkpoint_1" / "model.safetensors", 40)
    age_tree(root)
    for _ in range(2):  # listed, then from the cache
        result = scanner.scan()
        assert by_path(result, root) == {"run/checkpoint_0": ("dir", "run"), "run/checkpoint_1": ("dir", "run")}
        cut = next(c for c in result.candidates if c.path.endswith("checkpoint_1"))
        assert (cut.files, cut.size_bytes) == (1, 40)
    assert scanner.stats.dirs_listed == 0


def test_dir_candidate_size_mtime_and_reason(root: Path) -> None:
    write(root / "run/checkpoint-7/model.safetensors", 1000)
    write(root / "run/checkpoint-7/optimizer.pt", 300)
    write(root / "run/checkpoint-7/global_step7/shard.pt", 20)
    write(root / "run/weights.bin", 55)
    age_tree(root)
    newest = time.time() - 10
    os.utime(root / "run/checkpoint-7/global_step7/shard.pt", (newest, newest))
    result = CheckpointScanner([str(root)]).scan()
    (c,) = [c for c in result.candidates if c.kind == "dir"]
    assert c.path == str(root / "run/checkpoint-7")
    assert (c.size_bytes, c.files, c.reason) == (1320, 3, "name checkpoint-N")
    assert c.newest_mtime == pytest.approx(newest, abs=1e-3)
    assert c.mtime < c.newest_mtime
    (f,) = [c for c in result.candidates if c.kind == "file"]
    assert (f.size_bytes, f.files, f.reason) == (55, 1, "suffix .bin")
    (run,) = result.runs
    assert run.size_bytes == 1375
    assert run.newest == c


def test_marker_reasons(root: Path) -> None:
    write(root / "a/.metadata")
    write(root / "b/__0_0.distcp")
    write(root / "c/trainer_state.json")
    reasons = {os.path.basename(c.path): c.reason for c in CheckpointScanner([str(root)]).scan().candidates}
    assert reasons == {"a": "marker .metadata", "b": "suffix .distcp", "c": "marker trainer_state.json"}


def test_several_roots_and_a_missing_one(tmp_path: Path) -> None:
    write(tmp_path / "r1/m.pt")
    write(tmp_path / "r2/checkpoint-1/m.pt")
    scanner = CheckpointScanner([str(tmp_path / "r1"), str(tmp_path / "r2"), str(tmp_path / "nope")])
    result = scanner.scan()
    assert [(os.path.relpath(c.path, tmp_path), os.path.relpath(c.root, tmp_path)) for c in result.candidates] == [
        ("r1/m.pt", "r1"),
        ("r2/checkpoint-1", "r2"),
    ]
    assert len(result.errors) == 1 and "nope" in result.errors[0]
    assert not result.truncated


def test_root_given_through_a_symlink_is_resolved_once(tmp_path: Path) -> None:
    write(tmp_path / "real/checkpoint-3/m.pt")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    scanner = CheckpointScanner([str(tmp_path / "link")])
    assert scanner.roots == (str(tmp_path / "real"),)
    (c,) = scanner.scan().candidates
    assert c.path == str(tmp_path / "real/checkpoint-3")


# -- symlinks


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    write(outside / "checkpoint-9/model.pt")
    write(outside / "secret.pt")
    write(root / "run/checkpoint-1/model.pt", 10)
    write(root / "run/real.pt")
    (root / "run/to_outside_dir").symlink_to(outside)
    (root / "run/checkpoint-2").symlink_to(outside / "checkpoint-9")
    (root / "run/linked.pt").symlink_to(outside / "secret.pt")
    (root / "run/inside_loop").symlink_to(root)
    (root / "run/to_sibling").symlink_to(root / "run/checkpoint-1")
    (root / "run/checkpoint-1/escape.pt").symlink_to(outside / "secret.pt")
    (root / "run/checkpoint-1/escape_dir").symlink_to(outside)
    scanner = CheckpointScanner([str(root)])
    result = scanner.scan()
    assert by_path(result, root) == {"run/checkpoint-1": ("dir", "run"), "run/real.pt": ("file", "run")}
    (ckpt,) = [c for c in result.candidates if c.kind == "dir"]
    assert (ckpt.size_bytes, ckpt.files) == (10, 1)
    assert all(c.path.startswith(str(root) + os.sep) for c in result.candidates)
    assert result.stats.symlinks_skipped >= 5
    assert scanner.stats.dirs_listed == 3  # root, run, run/checkpoint-1


def test_dir_replaced_by_symlink_between_scans_is_not_followed(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside / "checkpoint-5/m.pt")
    write(root / "run/sub/m.pt")
    age_tree(root)
    scanner = CheckpointScanner([str(root)])
    assert len(scanner.scan().candidates) == 1
    (root / "run/sub/m.pt").unlink()
    (root / "run/sub").rmdir()
    (root / "run/sub").symlink_to(outside)
    result = scanner.scan()
    assert result.candidates == ()


# -- bounds


def test_depth_bound(root: Path) -> None:
    deep = root
    for i in range(6):
        deep = deep / f"d{i}"
    write(deep / "deep.pt")
    write(root / "d0/shallow.pt")
    result = CheckpointScanner([str(root)], max_depth=3).scan()
    assert [os.path.relpath(c.path, root) for c in result.candidates] == ["d0/shallow.pt"]
    assert result.truncated and result.truncated_reason == "max_depth"
    assert result.truncated_detail is not None and "max_depth 3" in result.truncated_detail
    assert result.stats.dirs_listed == 4  # root (depth 0) to d0/d1/d2 (depth 3)

    full = CheckpointScanner([str(root)], max_depth=6).scan()
    assert not full.truncated
    assert len(full.candidates) == 2


def test_entry_bound(root: Path) -> None:
    for i in range(10):
        for j in range(10):
            write(root / f"d{i}" / f"f{j}.pt")
    scanner = CheckpointScanner([str(root)], max_entries=25)
    result = scanner.scan()
    assert result.truncated and result.truncated_reason == "max_entries"
    assert result.stats.entries_visited <= 25
    assert len(result.candidates) < 100
    assert scanner.stats.entries_visited <= 25
    assert not CheckpointScanner([str(root)], max_entries=110).scan().truncated  # 10 dirs + 100 files


def test_entry_bound_in_one_large_directory(root: Path) -> None:
    for j in range(50):
        write(root / f"f{j}.pt")
    result = CheckpointScanner([str(root)], max_entries=20).scan()
    assert result.truncated_reason == "max_entries"
    assert result.stats.entries_visited == 20
    assert result.candidates == ()  # the listing was cut short: nothing of it is reported half-read


def test_time_bound_with_injected_clock(root: Path) -> None:
    for i in range(20):
        write(root / f"d{i:02}" / "m.pt")
    clock = TickClock(step=1.0)
    scanner = CheckpointScanner([str(root)], max_seconds=5.0, clock=clock)
    result = scanner.scan()
    assert result.truncated and result.truncated_reason == "max_seconds"
    assert result.truncated_detail is not None and "max_seconds 5" in result.truncated_detail
    assert 0 < result.stats.dirs_listed < 21
    assert len(result.candidates) < 20

    # Without the ticking, the same scanner finishes: the bound is per scan.
    scanner.clock = lambda: 0.0
    assert len(scanner.scan().candidates) == 20


def test_truncated_scan_keeps_earlier_listings(root: Path) -> None:
    for i in range(20):
        write(root / f"d{i:02}" / "m.pt")
    age_tree(root)
    scanner = CheckpointScanner([str(root)])
    scanner.scan()
    assert scanner.stats.cached_dirs == 21
    scanner.clock, scanner.max_seconds = TickClock(step=1.0), 3.0
    assert scanner.scan().truncated
    assert scanner.stats.cached_dirs == 21
    scanner.clock = lambda: 0.0
    assert len(scanner.scan().candidates) == 20
    assert scanner.stats.dirs_listed == 0


# -- incremental rescans


@pytest.fixture
def aged_tree(root: Path) -> Iterator[Path]:
    write(root / "runA/checkpoint-100/model.safetensors", 100)
    write(root / "runA/checkpoint-100/trainer_state.json", 10)
    write(root / "runB/epoch_1.pt", 50)
    for i in range(5):
        write(root / f"data/shard{i}/x.txt")
    age_tree(root)
    yield root


def test_rescan_with_nothing_changed_lists_no_directory(aged_tree: Path) -> None:
    scanner = CheckpointScanner([str(aged_tree)])
    first = scanner.scan()
    assert first.stats.dirs_listed == 10
    second = scanner.scan()
    assert second.stats.dirs_listed == 0
    assert second.stats.dirs_reused == 10
    assert second.stats.files_stated == 1  # the one candidate file, for growth
    assert second.candidates == first.candidates
    assert second.runs == first.runs
    assert second.stats.entries_visited == first.stats.entries_visited


def test_rescan_finds_checkpoint_in_new_subdir(aged_tree: Path) -> None:
    scanner = CheckpointScanner([str(aged_tree)])
    scanner.scan()
    write(aged_tree / "runC/sub/checkpoint-1/model.safetensors", 7)
    result = scanner.scan()
    assert "runC/sub/checkpoint-1" in by_path(result, aged_tree)
    # root changed (runC added), plus the three new directories; nothing else is listed again.
    assert result.stats.dirs_listed == 4
    (c,) = [c for c in result.candidates if c.path.endswith("checkpoint-1")]
    assert c.size_bytes == 7


def test_rescan_reports_grown_file(aged_tree: Path) -> None:
    scanner = CheckpointScanner([str(aged_tree)])
    first = {c.path: c for c in scanner.scan().candidates}
    path = aged_tree / "runB/epoch_1.pt"
    assert first[str(path)].size_bytes == 50
    with open(path, "ab") as f:
        f.write(b"y" * 950)
    result = scanner.scan()
    assert result.stats.dirs_listed == 0  # the directory did not change; the file was stat'ed again
    grown = {c.path: c for c in result.candidates}[str(path)]
    assert grown.size_bytes == 1000
    assert grown.mtime > first[str(path)].mtime


def test_rescan_follows_a_checkpoint_directory_still_being_written(root: Path) -> None:
    # Fresh mtimes (not aged): the directory is within settle_seconds, so it is listed again until it settles.
    shard = write(root / "run/checkpoint-5/shard.pt", 10)
    scanner = CheckpointScanner([str(root)])
    scanner.scan()
    with open(shard, "ab") as f:
        f.write(b"z" * 90)
    (c,) = scanner.scan().candidates
    assert c.size_bytes == 100


def test_marker_dir_cached_with_its_sizes(aged_tree: Path) -> None:
    write(aged_tree / "dcp/step_1/.metadata", 5)
    write(aged_tree / "dcp/step_1/__0_0.distcp", 95)
    age_tree(aged_tree)
    scanner = CheckpointScanner([str(aged_tree)])
    first = scanner.scan()
    second = scanner.scan()
    assert second.stats.dirs_listed == 0
    (dcp,) = [c for c in second.candidates if c.path.endswith("step_1")]
    assert (dcp.size_bytes, dcp.files) == (100, 2)
    assert second.candidates == first.candidates


def test_new_marker_turns_listed_dir_into_candidate(aged_tree: Path) -> None:
    write(aged_tree / "plain/weights/a.safetensors", 30)
    age_tree(aged_tree)
    scanner = CheckpointScanner([str(aged_tree)])
    assert "plain/weights/a.safetensors" in by_path(scanner.scan(), aged_tree)
    write(aged_tree / "plain/weights/model.safetensors.index.json", 3)
    found = by_path(scanner.scan(), aged_tree)
    assert found["plain/weights"] == ("dir", "plain")
    assert "plain/weights/a.safetensors" not in found


def test_a_listing_inside_a_candidate_keeps_no_file_names_and_is_listed_again_outside(aged_tree: Path) -> None:
    # Inside a candidate directory the walk needs only totals, so its listings keep no candidate file names (most
    # of a node's checkpoint files are there). When the directory around it stops being a candidate, such a listing
    # cannot answer for its files: it is listed again, and its checkpoint file found.
    write(aged_tree / "dcp/step_1/.metadata", 5)
    write(aged_tree / "dcp/step_1/extra/w.pt", 20)
    age_tree(aged_tree)
    scanner = CheckpointScanner([str(aged_tree)])
    assert by_path(scanner.scan(), aged_tree)["dcp/step_1"][0] == "dir"
    inner = str(aged_tree / "dcp/step_1/extra")
    assert scanner._cache[inner].candidate_files == ()
    assert scanner._cache[inner].file_bytes == 20
    (aged_tree / "dcp/step_1/.metadata").unlink()
    found = by_path(scanner.scan(), aged_tree)
    assert "dcp/step_1" not in found
    assert "dcp/step_1/extra/w.pt" in found
    assert scanner._cache[inner].candidate_files == ("w.pt",)


def test_cache_drops_directories_no_longer_seen(aged_tree: Path) -> None:
    scanner = CheckpointScanner([str(aged_tree)])
    scanner.scan()
    assert scanner.stats.cached_dirs == 10
    for i in range(5):
        (aged_tree / f"data/shard{i}/x.txt").unlink()
        (aged_tree / f"data/shard{i}").rmdir()
    scanner.scan()
    assert scanner.stats.cached_dirs == 5


def test_removed_candidate_disappears(aged_tree: Path) -> None:
    scanner = CheckpointScanner([str(aged_tree)])
    scanner.scan()
    (aged_tree / "runB/epoch_1.pt").unlink()
    assert "runB/epoch_1.pt" not in by_path(scanner.scan(), aged_tree)


def test_racy_listing_is_not_trusted(root: Path) -> None:
    write(root / "d/m.pt")
    age_tree(root)
    now = time.time()
    os.utime(root / "d", (now, now))
    wall: Callable[[], float] = lambda: now + 0.5  # noqa: E731 -- listed half a second after its change
    scanner = CheckpointScanner([str(root)], wall_clock=wall)
    scanner.scan()
    assert scanner.scan().stats.dirs_listed == 1  # d again; root was listed long after its change


def test_dataset_shards_are_tallied_per_directory(root: Path) -> None:
    files = {
        "c4/part-00000.parquet": 1000,
        "c4/part-00001.parquet": 2000,
        "c4/README.md": 99,  # not a shard
        "wds/train-000000.tar": 500,
        "wds/train-000001.tar": 700,
        "wds/backup.tar": 10_000,  # a tar, not a numbered shard
        "tf/x.tfrecord": 300,
        "ckpt/step-1.pt": 10,
    }
    for rel, size in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * size)
    os.symlink(root / "c4" / "part-00000.parquet", root / "c4" / "part-00002.parquet")  # never followed or counted
    scanner = CheckpointScanner([str(root)])
    by_dir = {os.path.relpath(d.path, root): (d.files, d.bytes) for d in scanner.scan().datasets}
    assert by_dir == {"c4": (2, 3000), "wds": (2, 1200), "tf": (1, 300)}
    again = scanner.scan()  # listings reused: the tallies stay
    assert {os.path.relpath(d.path, root): (d.files, d.bytes) for d in again.datasets} == by_dir
    assert [os.path.relpath(d.path, root) for d in again.datasets] == ["c4", "wds", "tf"]  # the largest first
