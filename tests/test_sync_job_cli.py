"""``storwatch sync --job JOBID``, the command as an epilog runs it, on a Slurm-like node under --path.rootfs: a
fake procfs whose job processes carry slurmstepd's real cgroup files (tests/fixtures/cgroup), a mount table with /home
on NFS and node-local NVMe scratch, and real checkpoint files. The job's node-local directories are walked and each
run's newest complete checkpoint copied below sync.destinations, byte for byte; its NFS directory is left out and
nothing of it copied; a run without a complete checkpoint is skipped, saying so. After the job (no process left) its
scratch is still found through sync.job_scratch and $SLURM_JOB_UID."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agentproc import REPO_ROOT
from tests.builders import torch_like_zip

FIXTURES = Path(__file__).parent / "fixtures"
JOB = 4242
UID = 1000  # the fixture's cgroup path: /slurm/uid_1000/job_4242
MOUNTINFO = """\
24 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw,discard
26 24 0:23 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
99 24 0:61 / /home rw,relatime shared:50 - nfs4 10.0.0.5:/home rw,vers=4.1,hard,proto=tcp,sec=sys,addr=10.0.0.5
97 24 259:4 / /scratch rw,noatime shared:48 - xfs /dev/nvme1n1 rw,attr2,inode64,logbufs=8,logbsize=32k,noquota
98 24 0:62 / /durable rw,relatime shared:51 - nfs4 10.0.0.6:/ckpt rw,vers=4.1,hard,proto=tcp,sec=sys,addr=10.0.0.6
"""


def _owner(uid: int) -> str:
    """What {namespace} is for a job of ``uid``: its name on this machine, else the number."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _node(tmp_path: Path) -> tuple[Path, Path, Path]:
    """procfs with the mount table, the host's root with /home, /scratch and /durable, and the config file."""
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "mountinfo").write_text(MOUNTINFO)
    root = tmp_path / "root"
    for d in ("home", "scratch", "durable"):
        (root / d).mkdir(parents=True)
    cfg = tmp_path / "storwatch.yaml"
    cfg.write_text(
        "platform: together-slurm\n"
        f"paths: {{procfs: {proc}, sysfs: {FIXTURES / 'gpu-node' / 'sys'}, rootfs: {root}}}\n"
        "mounts: {statvfs_timeout_seconds: 2}\n"
        "checkpoints: {deep_per_scan: 0}\n"
        "sync: {destinations: [/durable], job_scratch: ['/scratch/{uid}/{job}', '/scratch/tmp/slurm-{job}']}\n"
    )
    return proc, root, cfg


def _process(proc: Path, pid: int, cwd: str, writes: str | None = None, cgroup: str = "slurm-v1") -> None:
    """A process as procfs shows it: its cgroup (by default a job's, slurmstepd's v1 layout), cwd, and a file open
    for writing."""
    d = proc / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "fdinfo").mkdir()
    shutil.copy(FIXTURES / "cgroup" / cgroup, d / "cgroup")
    (d / "cwd").symlink_to(cwd)
    if writes is not None:
        (d / "fd" / "3").symlink_to(writes)
        (d / "fdinfo" / "3").write_text("pos:\t0\nflags:\t0100001\nmnt_id:\t30\nino:\t1\n")


def _sync(cfg: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "storwatch", "sync", "--config", str(cfg), *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_jobs_node_local_checkpoints_are_copied_and_its_nfs_home_left_alone(tmp_path: Path) -> None:
    proc, root, cfg = _node(tmp_path)
    home_run = root / "home" / "alice" / "llama" / "ckpt"
    scratch = root / "scratch" / str(UID) / str(JOB)
    gpt, broken, writing = scratch / "gpt", scratch / "broken", root / "scratch" / "fast" / "run-a"
    for d in (home_run, gpt, broken, writing):
        d.mkdir(parents=True)
    torch_like_zip(home_run / "step-30.pt")
    torch_like_zip(gpt / "step-10.pt", b"a" * 5000)
    torch_like_zip(gpt / "step-20.pt", b"b" * 7000)
    torch_like_zip(broken / "step-5.pt")
    with open(broken / "step-5.pt", "r+b") as f:
        f.truncate(100)
    torch_like_zip(writing / "step-7.pt", b"c" * 3000)
    # Two tasks of the job: one works in its NFS home, one writes to node-local scratch outside the template.
    _process(proc, 300, "/home/alice/llama")
    _process(proc, 301, "/home/alice/llama", writes="/scratch/fast/run-a/step-7.pt")
    done = _sync(cfg, "--job", str(JOB), "--json")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    copied = {Path(r["source"]).relative_to(root): Path(r["dest"]) for r in results}
    owner = root / "durable" / _owner(UID) / f"job-{JOB}"
    assert copied == {
        Path("scratch/fast/run-a/step-7.pt"): owner / "run-a" / "step-7.pt",
        Path(f"scratch/{UID}/{JOB}/gpt/step-20.pt"): owner / "gpt" / "step-20.pt",
    }, (copied, done.stderr)
    assert all(r["outcome"] == "verified" for r in results), results
    for src, dest in copied.items():
        assert dest.read_bytes() == (root / src).read_bytes()
        assert (dest.parent / (dest.name + ".storwatch-sync.json")).is_file()
    # Nothing of the NFS home, of the older checkpoint or of the broken run reached the durable root.
    everything = sorted(p.relative_to(owner).as_posix() for p in owner.rglob("*"))
    assert everything == [
        "gpt",
        "gpt/step-20.pt",
        "gpt/step-20.pt.storwatch-sync.json",
        "run-a",
        "run-a/step-7.pt",
        "run-a/step-7.pt.storwatch-sync.json",
    ], everything
    err = done.stderr
    assert f"job {JOB}: 2 processes on this node" in err and "platform together-slurm" in err, err
    assert "left out  /home/alice/llama (cluster:" in err, err
    assert f"walked    /scratch/{UID}/{JOB} (node:" in err and "walked    /scratch/fast/run-a (node:" in err, err
    assert "skipped   broken: no complete checkpoint" in err, err
    # Run again: the copies there are verified copies of the checkpoints as they are, and are left alone.
    again = _sync(cfg, "--job", str(JOB), "--json")
    assert again.returncode == 0 and {r["outcome"] for r in json.loads(again.stdout)} == {"unchanged"}, again


def test_in_an_epilog_the_jobs_scratch_is_found_by_its_template(tmp_path: Path) -> None:
    """The job's processes are gone: its owner comes from $SLURM_JOB_UID, its scratch from sync.job_scratch."""
    _proc, root, cfg = _node(tmp_path)
    run = root / "scratch" / "tmp" / "slurm-77" / "ckpt"
    run.mkdir(parents=True)
    torch_like_zip(run / "step-3.pt")
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_UID": "4000123"}
    done = _sync(cfg, "--job", "77", env=env)
    assert done.returncode == 0, done.stderr
    dest = root / "durable" / _owner(4000123) / "job-77" / "ckpt" / "step-3.pt"
    assert dest.read_bytes() == (run / "step-3.pt").read_bytes()
    assert done.stdout.startswith("VERIFIED"), done.stdout
    assert "job 77: 0 processes on this node" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "cgroup", ["tenant-delegated-v2-stepd-scope", "tenant-delegated-v2-slurm", "tenant-delegated-v1-hybrid"]
)
def test_a_tenant_process_in_her_own_cgroup_cannot_make_the_epilog_walk_her_directory(
    tmp_path: Path, cgroup: str
) -> None:
    """Another user's process, in cgroups she made below her own user@UID.service (systemd delegates it to her) and
    named ``.../job_4242/...``, is not job 4242's: the job's epilog neither walks her node-local directory nor copies
    her checkpoint over the job's."""
    proc, root, cfg = _node(tmp_path)
    job_run = root / "scratch" / str(UID) / str(JOB) / "ckpt"
    hers = root / "scratch" / "mallory" / "ckpt"
    for d in (job_run, hers):
        d.mkdir(parents=True)
    torch_like_zip(job_run / "step-10.pt", b"job" * 1000)
    torch_like_zip(hers / "step-10.pt", b"hers" * 1000)  # the same run and checkpoint names as the job's
    _process(proc, 900, "/scratch/mallory/ckpt", writes="/scratch/mallory/ckpt/step-10.pt", cgroup=cgroup)
    done = _sync(cfg, "--job", str(JOB), "--json", env={"SLURM_JOB_ID": str(JOB), "SLURM_JOB_UID": str(UID)})
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert [Path(r["source"]).relative_to(root) for r in results] == [Path(f"scratch/{UID}/{JOB}/ckpt/step-10.pt")]
    dest = root / "durable" / _owner(UID) / f"job-{JOB}" / "ckpt" / "step-10.pt"
    assert dest.read_bytes() == (job_run / "step-10.pt").read_bytes()
    assert f"job {JOB}: 0 processes on this node" in done.stderr, done.stderr
    assert "mallory" not in done.stderr and "mallory" not in done.stdout, done


def test_a_job_with_nothing_to_copy_exits_0_and_says_so(tmp_path: Path) -> None:
    _proc, root, cfg = _node(tmp_path)
    done = _sync(cfg, "--job", "5")
    assert done.returncode == 0 and done.stdout == "", done
    assert "no directory of the job found" in done.stderr and "nothing to copy" in done.stderr, done.stderr
    assert list((root / "durable").iterdir()) == []


@pytest.mark.parametrize(
    "args, config, message",
    [
        (["--job", "5", "a", "b"], "", "--job takes no SRC or DEST"),
        (["--job", "5"], "sync: {destinations: []}\n", "sync.destinations is empty"),
        (["--job", "5", "--destination", "/elsewhere"], "", "'/elsewhere' is not one of sync.destinations"),
        (["a", "b", "--uid", "3"], "", "--uid and --destination go with --job"),
        (["--job", "0"], "", "must be a Slurm job ID"),
    ],
    ids=["src-and-job", "no-destinations", "unknown-destination", "uid-without-job", "bad-job-id"],
)
def test_usage_problems_exit_2(tmp_path: Path, args: list[str], config: str, message: str) -> None:
    _proc, _root, cfg = _node(tmp_path)
    if config:
        cfg.write_text(cfg.read_text().split("sync:")[0] + config)
    done = _sync(cfg, *args)
    assert done.returncode == 2 and message in done.stderr, done


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("scratch/{job}", "is not an absolute path"),
        ("/scratch/{user}/../{job}", "holds a '.' or '..' component"),
        ("/scratch/{pod}", "{pod} is not one of {job}, {uid}, {user}"),
        ("/scratch/{job!r}", "{job} is not one of"),
        ("/scratch/{job", "is not a template"),
    ],
    ids=["relative", "dotdot", "unknown-field", "conversion", "unclosed"],
)
def test_a_bad_job_scratch_template_is_refused_naming_the_line(template: str, problem: str) -> None:
    from storwatch.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as err:
        parse_config(f"sync:\n  destinations: [/durable]\n  job_scratch: [{json.dumps(template)}]\n", "sync.yaml")
    assert f"sync.yaml:3: sync.job_scratch: {template!r}" in str(err.value) and problem in str(err.value), err.value
