"""Finding a Slurm job's checkpoint directories (storwatch/sources/slurmjob.py) on a fake procfs whose processes carry
the real cgroup files of slurmstepd's layouts (tests/fixtures/cgroup): the job's processes by their cgroup, its owner
from the cgroup v1 path, where they work and write (real open files, their fdinfo flags), and the site's scratch
directories; another job's process, a process in no job and a path that does not exist are left out."""

from __future__ import annotations

import shutil
from pathlib import Path

from storwatch.paths import HostPaths
from storwatch.sources.slurmjob import find_job, job_processes, scratch_directories

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"


def _process(
    proc: Path, pid: int, cgroup: str, cwd: Path, writes: Path | None = None, reads: Path | None = None
) -> None:
    """A process directory as procfs shows one: its cgroup file, cwd link, and fds with their fdinfo flags."""
    d = proc / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "fdinfo").mkdir()
    shutil.copy(FIXTURES / cgroup, d / "cgroup")
    (d / "cwd").symlink_to(cwd)
    for fd, (path, flags) in enumerate(((writes, "0100001"), (reads, "0100000")), start=3):
        if path is not None:
            (d / "fd" / str(fd)).symlink_to(path)
            (d / "fdinfo" / str(fd)).write_text(f"pos:\t0\nflags:\t{flags}\nmnt_id:\t30\nino:\t1\n")


def test_the_jobs_processes_directories_and_scratch(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    work = tmp_path / "nvme" / "alice" / "llama"
    ckpts = tmp_path / "nvme" / "alice" / "llama" / "ckpt"
    data = tmp_path / "datasets"
    scratch = tmp_path / "scratch" / "4242"
    other = tmp_path / "nvme" / "bob"
    for d in (ckpts, data, scratch, other):
        d.mkdir(parents=True)
    (ckpts / "step-10.pt").write_bytes(b"x")
    (data / "shard-0.parquet").write_bytes(b"x")
    _process(proc, 300, "slurm-v1", work, writes=ckpts / "step-10.pt", reads=data / "shard-0.parquet")
    _process(proc, 301, "slurm-v1", work)  # another task of the job: its cwd is listed once
    _process(proc, 400, "slurm-v2", other, writes=other)  # job 1234567
    _process(proc, 500, "containerd-systemd-v2", other)  # no job
    (proc / "self").mkdir()
    paths = HostPaths(procfs=str(proc), rootfs="/")
    assert job_processes(paths, 4242) == ((300, 301), 1000)
    templates = (f"{tmp_path}/scratch/{{job}}", f"{tmp_path}/tmp/slurm-{{job}}", f"{tmp_path}/local/{{user}}/{{job}}")
    job = find_job(paths, 4242, templates)
    assert (job.job_id, job.pids, job.uid) == (4242, (300, 301), 1000)
    # The job's cwd, the directory of the file open for writing (not the one read), the scratch directory that
    # exists (tmp/slurm-4242 does not).
    expected = [str(work), str(ckpts), str(scratch)]
    assert list(job.directories) == expected


def test_after_the_job_ended_only_its_scratch_is_left(tmp_path: Path) -> None:
    """In an epilog the job's processes are gone: its owner comes from the epilog (SLURM_JOB_UID)."""
    (tmp_path / "proc").mkdir()
    local = tmp_path / "local" / "1000" / "77"
    local.mkdir(parents=True)
    job = find_job(HostPaths(procfs=str(tmp_path / "proc")), 77, [f"{tmp_path}/local/{{uid}}/{{job}}"], uid=1000)
    assert (job.pids, job.uid, job.directories) == ((), 1000, (str(local),))


def test_a_scratch_template_never_leads_out_of_its_root() -> None:
    assert scratch_directories(
        ["/scratch/{job}", "/scratch/{user}/../{job}", "rel/{job}", "/x/{nope}"], 5, None, None
    ) == ["/scratch/5"]
    assert scratch_directories(["/local/{user}/{job}"], 5, 1000, "../etc") == []


def test_a_tenant_process_in_her_own_cgroup_subtree_is_not_the_job(tmp_path: Path) -> None:
    """systemd delegates user@UID.service to its user on cgroup v2: she may name cgroups below it as she likes,
    ``slurmstepd.scope/job_4242`` and ``slurm/uid_1000/job_4242`` included. Her processes there are not job 4242's:
    neither her directory nor her open files are the job's, nor is her UID its owner."""
    proc = tmp_path / "proc"
    work = tmp_path / "nvme" / "alice" / "llama"
    mallory = tmp_path / "nvme" / "mallory" / "ckpt"
    for d in (work, mallory):
        d.mkdir(parents=True)
    (mallory / "step-99.pt").write_bytes(b"x")
    _process(proc, 300, "slurm-v1", work)
    _process(proc, 900, "tenant-delegated-v2-stepd-scope", mallory, writes=mallory / "step-99.pt")
    _process(proc, 901, "tenant-delegated-v2-slurm", mallory)
    _process(proc, 902, "tenant-delegated-v1-hybrid", mallory)
    paths = HostPaths(procfs=str(proc), rootfs="/")
    assert job_processes(paths, 4242) == ((300,), 1000)
    job = find_job(paths, 4242)
    assert (job.pids, job.uid, job.directories) == ((300,), 1000, (str(work),))
    # With the job's own processes gone (as in an epilog), hers still name nothing.
    shutil.rmtree(proc / "300")
    assert job_processes(paths, 4242) == ((), None)
    assert find_job(paths, 4242).directories == ()
