"""`storwatch policy explain` on a node: the rules in force (the shipped default set, then files given), and for
each, which of this node's entities its condition holds for, with the values of the fields it reads, the message and
the actions it would run; which it does not hold for, and why; a policy file with a problem named with its line.
The node is the Slurm node tree of test_default_roots.py (a checkpoint in node-local scratch, no configuration),
through the real command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.builders import node_tree, torch_like_zip

REPO = Path(__file__).resolve().parents[1]


def explain(proc: Path, root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "storwatch", "policy", "explain", "--path.procfs", str(proc), "--path.rootfs",
         str(root), "--platform", "together-slurm", "--timeout", "1", *extra],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}, check=False,
    )  # fmt: skip


def rule_block(out: str, name: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{name} ("))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


def test_explain_says_what_each_rule_would_do_on_this_node_and_why(tmp_path: Path) -> None:
    proc, root = node_tree(tmp_path, "slurm-node")
    (root / "scratch/alice/run1").mkdir(parents=True)
    torch_like_zip(root / "scratch/alice/run1/step-100.pt")
    done = explain(proc, root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("13 rules from ") and "default.yaml" in done.stdout.splitlines()[0]
    finding = rule_block(done.stdout, "important-data-only-on-ephemeral-storage")
    assert finding[0].startswith(
        "important-data-only-on-ephemeral-storage (on finding; severity each finding's own (severity); once it has "
        "held for 10 min: log, event; again at most every 6 h while it fires)"
    )
    assert finding[1] == "  when: kind != 'dataset' && durable_age_seconds == null"
    assert finding[2] == "  holds for 1 of 1 finding: it would log, event once it has held for 10 min"
    assert finding[3].endswith(": durable_age_seconds=unknown, kind=checkpoint"), finding
    assert finding[4].startswith("      warning: alice/run1 (/scratch/alice/run1): 1 checkpoint, ")
    assert "only on node storage /scratch" in finding[4]
    # a rule that holds for nothing says so, with the values that keep it from holding
    stuck = rule_block(done.stdout, "mount-stuck")
    assert stuck[2].startswith("  holds for none of ") and stuck[2].endswith(" mounts: it would do nothing now")
    assert any(line.strip().endswith(": stuck=no") for line in stuck[3:])
    alert = rule_block(done.stdout, "alert-sync-checkpoint")
    assert alert[2].startswith("  no alert now: it acts on the alerts Alertmanager sends the running agent")


def test_explain_takes_more_files_and_names_a_problem_with_its_line(tmp_path: Path) -> None:
    proc, root = node_tree(tmp_path, "slurm-node")
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "rules:\n  - name: any-mount-read-only\n    on: mount\n    when: readonly\n"
        "    message: '{mountpoint} is read-only'\n    actions: [{action: log}]\n",
        encoding="utf-8",
    )
    done = explain(proc, root, str(mine))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("14 rules from ")
    block = rule_block(done.stdout, "any-mount-read-only")
    assert block[0].endswith(f") [{mine}:2]")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: x\n    on: mount\n    when: 'nosuchfield > 1'\n", encoding="utf-8")
    refused = explain(proc, root, str(bad))
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"{bad}:4: rules[0].when: "), refused.stderr
