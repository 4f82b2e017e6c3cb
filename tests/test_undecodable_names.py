"""Names are bytes until shown. Runs whose directory and checkpoint names hold every byte 0x80-0xff (not UTF-8: the
kernel's names are bytes, Python keeps them as surrogates) go through a real agent at its defaults and every output
it has: the View (/readyz), /metrics, /api/status, /status, the log, a webhook and a Kubernetes Event (the test's
API server). Each shows each such byte as the text ``\\xNN``, and nothing anywhere holds a lone surrogate or fails to
encode: one tenant's odd name never blinds the agent to the rest."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from storwatch.printable import shown, shown_data
from storwatch.report import finite_data
from tests.agentproc import running_agent, wait_until
from tests.kubeapi import NODE, fake_kube_api, k8s_node_objects
from tests.webhook_receiver import receiver

BYTES = range(0x80, 0x100)
GROUPS = [bytes(BYTES)[i : i + 32] for i in range(0, 128, 32)]
"""Four names, each holding 32 of the 128 bytes that are never UTF-8 on their own."""
RULE = "every-run"
WAIT = 90.0
"""A bound against a hang; never what is asserted."""


def _escaped(raw: bytes) -> str:
    return "".join(f"\\x{b:02x}" for b in raw)


def _safetensors(path: bytes) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")
    os.utime(path, (1_700_000_000, 1_700_000_000))  # long settled


def _runs(root: Path) -> list[str]:
    """The runs, each owned by its own uid (so one owner's action budget is no bound here); their labels as shown."""
    shown_names = []
    for i, raw in enumerate(GROUPS):
        run = os.path.join(os.fsencode(root), b"run-" + raw)
        os.mkdir(run)
        _safetensors(os.path.join(run, b"ck-" + raw + b".safetensors"))
        os.chown(run, 2000 + i, 2000 + i)
        shown_names.append("run-" + _escaped(raw))
    return shown_names


def _no_surrogate(text: str) -> None:
    bad = [c for c in text if "\ud800" <= c <= "\udfff"]
    assert not bad, f"lone surrogates in the output: {bad[:5]}"


def test_every_byte_that_is_not_utf8_is_shown_escaped_in_every_output(tmp_path: Path) -> None:
    root = tmp_path / "scratch"
    root.mkdir()
    labels = _runs(root)
    site = tmp_path / "site.yaml"
    cfg = tmp_path / "storwatch.yaml"
    with fake_kube_api() as api, receiver() as hooks:
        for obj in k8s_node_objects():
            api.add(obj)
        site.write_text(
            "rules:\n"
            f"  - name: {RULE}\n"
            "    on: run\n"
            "    when: complete > 0\n"
            "    severity: warning\n"
            "    message: 'run {run} at {path}: checkpoint {checkpoint}'\n"
            "    actions:\n"
            "      - action: log\n"
            "      - action: event\n"
            f"      - action: webhook\n        params: {{url: '{hooks.url}'}}\n"
        )
        cfg.write_text(
            f"checkpoints: {{roots: [{json.dumps(str(root))}]}}\ngpu: {{enabled: false}}\n"
            f"policy: {{files: [{json.dumps(str(site))}]}}\n"
        )
        env = {"KUBECONFIG": str(api.kubeconfig(tmp_path)), "NODE_NAME": NODE}
        with running_agent("--config", str(cfg), "--listen", "127.0.0.1:0", env=env, timeout=30) as agent:

            def every_run() -> dict[str, Any] | None:
                resp = agent.fetch("/api/status")
                if resp.status != 200:
                    return None
                status: dict[str, Any] = json.loads(resp.body)
                return status if len(status.get("checkpoints", [])) == len(GROUPS) else None

            status = wait_until(every_run, timeout=WAIT, interval=0.5, what="the four runs in /api/status")
            # /readyz: the Views come (a View that raised on a name would keep it 503).
            assert agent.fetch("/readyz").status == 200
            # /api/status: strict JSON, UTF-8, every name escaped.
            body = agent.fetch("/api/status").body
            _no_surrogate(body if isinstance(body, str) else body.decode("utf-8"))
            paths = sorted(c["path"] for c in status["checkpoints"])
            assert paths == sorted(f"{root}/{label}" for label in labels), paths
            for finding in status["findings"]:
                assert any(label in finding["sentence"] for label in labels), finding["sentence"]
            # /metrics: parses, and the run label of each run is its escaped name.
            metrics = agent.fetch("/metrics").body
            text = metrics if isinstance(metrics, str) else metrics.decode("utf-8")
            _no_surrogate(text)
            runs = {
                s.labels["run"]
                for family in text_string_to_metric_families(text)
                for s in family.samples
                if "run" in s.labels
            }
            assert set(labels) <= runs, sorted(runs)
            # /status: the page is UTF-8 and shows each name escaped (as text: the backslash is no markup).
            page = agent.fetch("/status").body
            html = page if isinstance(page, str) else page.decode("utf-8")
            _no_surrogate(html)
            for label in labels:
                assert label in html, label
            # The log action's line, the webhook and the Event: each run's name escaped.
            for label in labels:
                agent.wait_for_stderr(re.escape(f"run {label} at "), timeout=WAIT)
            got = wait_until(
                lambda: hooks.received if len(hooks.received) >= len(GROUPS) else None, timeout=WAIT, what="webhooks"
            )
            for r in got:
                payload = r.body.decode("utf-8")  # strict: a lone surrogate would not decode
                _no_surrogate(json.loads(payload)["message"])
            messages = {json.loads(r.body)["message"] for r in got}
            for label in labels:
                assert any(f"run {label} at {root}/{label}: checkpoint ck-" in m for m in messages), messages
            events = wait_until(
                lambda: [e for e in api.recorded if e.verb == "create"] or None, timeout=WAIT, what="an Event"
            )
            for e in events:
                _no_surrogate(json.dumps(e.body, ensure_ascii=False))
            assert any("run-\\x" in e.body.get("message", "") for e in events), [e.body for e in events]


def test_shown_writes_each_byte_as_it_was_on_disk() -> None:
    for b in BYTES:
        name = os.fsdecode(b"a" + bytes([b]) + b"z")
        assert shown(name) == f"a\\x{b:02x}z"
    assert shown("caf\u00e9 \u2603") == "caf\u00e9 \u2603"  # UTF-8 names stay as they are
    assert shown("\ud800") == "\\ud800"  # a lone surrogate no filesystem name gives: still never raw
    data = {"k\udcff": ["v\udcfe", ("t\udcfd",)], "plain": "x"}
    assert shown_data(data) == {"k\\xff": ["v\\xfe", ("t\\xfd",)], "plain": "x"}
    plain = {"a": ["b"]}
    assert shown_data(plain) is plain  # nothing to change: not copied
    assert finite_data({"name\udcff": "v\udcff", "n": float("inf")})[0] == {"name\\xff": "v\\xff", "n": None}


def test_each_writer_escapes_what_reaches_it_unescaped() -> None:
    """The outputs' own writers escape a name that reached them raw (the View's records show names escaped already;
    a field added tomorrow must not raise on the way out)."""
    from storwatch.actions.base import ActionRequest, Entity
    from storwatch.actions.webhook import payload
    from storwatch.exporter.text import label_value

    assert label_value("run-\udcff") == "run-\\\\xff"  # the exposition's own escape of the backslash
    entity = Entity("run", "k\udcfe", {"path": "/p\udcfd"})
    body = payload(ActionRequest("r", "webhook", {}, entity, "warning", "m\udcff"), "node")
    document = json.loads(body.decode("ascii"))
    assert (document["message"], document["entity"]["key"], document["entity"]["fields"]["path"]) == (
        "m\\xff",
        "k\\xfe",
        "/p\\xfd",
    )
