"""The status page: the View's plain data (report.view_to_dict) as one HTML page, with no script and no outside
asset, so it renders the same in a browser, in curl and in a screenshot test."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from storwatch.classify import KERNEL_INTERFACE_DIRS
from storwatch.report import (
    NO_LATENCY_SOURCE,
    human_bytes,
    human_seconds,
    kube_cell,
    latency_cell,
    mount_state,
    no_checkpoints_line,
    no_gpus_line,
    search_summary,
    usage_percent,
)
from storwatch.web.timeline import findings_panel, shown, timelines


def render_status_page(data: dict[str, Any]) -> str:
    e = html.escape
    # Mounts under the host's procfs and sysfs (a cgroup tmpfs...) are kernel interfaces, not storage: left off the
    # page, named in a line under the table, and kept in /api/status with "pseudo": true.
    storage = [m for m in data["mounts"] if not m["pseudo"]]
    pseudo = [m["mountpoint"] for m in data["mounts"] if m["pseudo"]]
    rows = []
    for m in storage:
        state = mount_state(m)
        rows.append(
            "<tr class='{cls}'><td class='mountpoint'>{mp}</td><td>{dev}</td><td>{fs}</td>"
            "<td class='durability'><span class='d-{dur}'>{dur}</span></td><td class='reason'>{reason}</td>"
            "<td class='kube'>{kube}</td>"
            "<td class='num'>{used}</td><td class='num'>{size}</td><td class='num'>{avail}</td>"
            "<td class='state'>{state}</td></tr>".format(
                cls="stuck" if m["stuck"] else "",
                mp=shown(m["mountpoint"]),
                dev=shown(m["device"]),
                fs=e(m["fstype"]),
                dur=e(m["durability"]),
                reason=e(m["reason"]),
                kube=e(kube_cell(m["kube"])),
                used=usage_percent(m),
                size=human_bytes(m["size_bytes"]),
                avail=human_bytes(m["avail_bytes"]),
                state=e(state),
            )
        )
    pseudo_note = (
        "<p class='note' id='pseudo'>Not shown: {} under {}: kernel interfaces rather than storage "
        '(listed in /api/status with "pseudo": true).</p>'.format(
            e(", ".join(pseudo)), " and ".join(KERNEL_INTERFACE_DIRS)
        )
        if pseudo
        else ""
    )
    io_rows = []
    # The mounts an operator looks for here: those holding checkpoint runs and those whose latency a GPU's picture
    # would draw. One of them with nothing to measure its latency (a FUSE mount, no probe) gets a row saying so.
    wanted = {r["mountpoint"] for r in data["checkpoints"]} | {
        g["latency_mountpoint"] for g in ((data.get("timeline") or {}).get("gpus") or [])
    }
    for m in storage:
        cells = [latency_cell(m, op, win) for op in ("read", "write", "fsync") for win in ("1m", "1h")]
        probe = m["io"]["probe"]
        if probe is None:
            probe_cell = "-"
        elif probe["stuck"]:
            probe_cell = "STUCK"
        elif probe["seconds"] is None:
            probe_cell = "failed: " + (probe["error"] or "")
        else:
            probe_cell = "/".join(_ms(probe["seconds"].get(k)) for k in ("write", "fsync", "read"))
        if all(c == "-" for c in cells) and probe_cell == "-":
            if m["io"].get("latency_sources") == [] and m["mountpoint"] in wanted:
                io_rows.append(
                    f"<tr class='no-latency-source'><td class='mountpoint'>{shown(m['mountpoint'])}</td><td>-</td>"
                    f"<td colspan='7' class='empty'>{e(NO_LATENCY_SOURCE)}</td></tr>"
                )
            continue
        io_rows.append(
            "<tr><td class='mountpoint'>{}</td><td>{}</td>{}<td class='num'>{}</td></tr>".format(
                shown(m["mountpoint"]),
                e(m["io"]["device"] or ("nfs" if m["io"]["nfs"] else "-")),
                "".join(f"<td class='num'>{c}</td>" for c in cells),
                e(probe_cell),
            )
        )
    gpu_rows = []
    for g in data["gpus"]:

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v * 100:.0f}%"

        pods = sorted({p["pod_uid"] or "(host)" for p in g["processes"]})
        gpu_rows.append(
            "<tr class='{cls}'><td>{idx}</td><td>{name}</td><td>{up}</td><td class='num'>{util}</td>"
            "<td class='num'>{mem}</td><td class='num'>{used} / {total}</td><td class='num'>{power}</td>"
            "<td>{pods}</td></tr>".format(
                cls="" if g["up"] else "stuck",
                idx=g["index"],
                name=e(g["name"] or "?"),
                up="up" if g["up"] else "DOWN " + e(g["error"] or ""),
                util=pct(g["utilization_ratio"]),
                mem=pct(g["memory_utilization_ratio"]),
                used=human_bytes(g["memory_used_bytes"]),
                total=human_bytes(g["memory_total_bytes"]),
                power="-" if g["power_watts"] is None else f"{g['power_watts']:.0f} W",
                pods=e(", ".join(pods)),
            )
        )
    done = what_was_done(data)
    ckpt_rows = []
    for r in data["checkpoints"]:
        problems = []
        # An incomplete checkpoint still changing is the write in progress ("writing"); one that stopped changing
        # long ago was cut short, and saying "writing" of it would send an operator to wait for nothing.
        abandoned = r["abandoned"]
        others = r["incomplete"] - abandoned - (1 if r["writing_incomplete"] else 0)
        if abandoned:
            problems.append(f"{abandoned} incomplete, abandoned: cut short, and nothing writes to it any more")
        if others > 0:
            problems.append(f"{others} incomplete")
        if r["corrupt"]:
            bad = next((c for c in r["checkpoints"] if c["verdict"] == "corrupt"), None)
            problems.append(f"{r['corrupt']} corrupt" + (f": {bad['reason']}" if bad else ""))
        if r.get("unsafe"):
            bad = next((c for c in r["checkpoints"] if c["verdict"] == "unsafe"), None)
            problems.append(f"{r['unsafe']} unsafe" + (f": {bad['reason']}" if bad else ""))
        if r["orphaned_temps"]:
            problems.append(
                f"{r['orphaned_temps']} orphaned temporaries ({human_bytes(r['orphaned_temp_bytes'])}) left by killed "
                "saves; the run's next atomic_save removes them"
            )
        ckpt_rows.append(
            "<tr class='{cls}'><td class='mountpoint'>{run}</td><td class='mountpoint path'>{path}</td>"
            "<td class='durability'><span class='d-{dur}'>{dur}</span></td><td class='num'>{age}</td>"
            "<td class='num'>{size}</td><td class='num'>{interval}</td>"
            "<td class='num'>{kept}</td><td>{state}</td><td class='done'>{done}</td></tr>".format(
                done=shown(done.get(r["run"], "")) or "-",
                cls="stuck" if r["corrupt"] or r.get("unsafe") else "",
                run=shown(r["run"]),
                path=shown(r.get("directory") or r["path"]),
                dur=e(r["durability"] or "unknown"),
                age=human_seconds(r["newest_complete_age_seconds"]),
                size=human_bytes(r["newest_complete_size_bytes"]),
                interval=human_seconds(r["interval_seconds"]),
                kept=r["kept"],
                state=e("writing; " if r["write_in_progress"] else "") + shown("; ".join(problems) or "ok"),
            )
        )
    if not io_rows:
        idle = "no latency: no mount did I/O in the last hour, and no probe ran"
        io_rows.append(f"<tr><td colspan='9' class='empty'>{idle}</td></tr>")
    if not gpu_rows:
        gpu_rows.append(f"<tr><td colspan='8' class='empty'>{e(no_gpus_line(data))}</td></tr>")
    if not ckpt_rows:
        ckpt_rows.append(f"<tr><td colspan='9' class='empty'>{shown(no_checkpoints_line(data))}</td></tr>")
    gpu_note = _gpu_note(data)
    collectors = ", ".join(_collector_text(c) for c in data["collectors"])
    plat = data["platform"]
    stuck_count = sum(1 for m in storage if m["stuck"])
    ephemeral = sum(1 for m in storage if m["ephemeral"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>storwatch status</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; overflow-wrap: anywhere; }}
table {{ border-collapse: collapse; width: 100%; table-layout: auto; }}
td.num {{ overflow-wrap: normal; }} td.done {{ font-size: 12px; }}
#node-state.leaving {{ border: 1px solid #e0b4b4; background: #fff6f6; padding: 0 1em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }} td.num {{ text-align: right; white-space: nowrap; }}
tr.stuck {{ background: #fde2e2; }} .mountpoint {{ font-family: monospace; }}
.d-volatile {{ color: #b00020; font-weight: bold; }} .d-node {{ color: #b36b00; font-weight: bold; }}
.d-cluster {{ color: #1b5e20; font-weight: bold; }} .d-region {{ color: #0d47a1; font-weight: bold; }}
.summary span {{ margin-right: 2em; }} .note {{ color: #555; }} td.empty {{ color: #555; font-style: italic; }}
td.kube {{ font-size: 12px; }}
#findings li.critical b {{ color: #b00020; }} #findings li.warning b {{ color: #b36b00; }}
#findings {{ border: 1px solid #e0b4b4; background: #fff6f6; padding: 0 1em; }}
#findings.none {{ border-color: #c8e6c9; background: #f5fbf5; }} figure {{ margin: 0.5em 0; }}
#findings.unsearched, #findings.unsure {{ border-color: #e6d3a3; background: #fffaf0; }}
</style></head><body>
<h1>storwatch</h1>
<p class="summary"><span>platform: <b id="platform">{e(plat["name"])}</b> ({e(plat["detected_by"])})</span>
<span>mounts: <b id="mount-count">{len(storage)}</b></span>
<span>ephemeral (volatile or node): <b id="ephemeral-count">{ephemeral}</b></span>
<span>stuck: <b id="stuck-count">{stuck_count}</b></span></p>
{findings_panel(data.get("findings") or [], search_summary(data), done)}
{_node_section(data)}
<h2>GPUs</h2>
{gpu_note}
<table id="gpus"><thead><tr><th>GPU</th><th>Name</th><th>State</th><th>Util</th><th>Mem util</th>
<th>Memory</th><th>Power</th><th>Pods</th></tr></thead>
<tbody>
{chr(10).join(gpu_rows)}
</tbody></table>
{timelines(data)}
<h2>Checkpoints</h2>
<table id="checkpoints"><thead><tr><th>Run</th><th>Path</th><th>Durability</th><th>Newest complete, age</th>
<th>Size</th><th>Interval</th><th>Kept</th><th>State</th><th>Done about it</th></tr></thead>
<tbody>
{chr(10).join(ckpt_rows)}
</tbody></table>
{_left_out_line(data.get("left_out") or {})}
{_policy_section(data.get("policy"), data.get("generated_at"))}
{_alerts_section(data.get("alerts"), data.get("generated_at"))}
<h2>Mounts</h2>
<table id="mounts"><thead><tr><th>Mountpoint</th><th>Device</th><th>Type</th><th>Durability</th><th>Reason</th>
<th>Kubernetes</th><th>Used</th><th>Size</th><th>Avail</th><th>State</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>
{pseudo_note}
<p class="note" id="legend">Durability, how long data on a mount survives:
<span class="d-volatile">volatile</span> is lost on a reboot or a pod restart (memory);
<span class="d-node">node</span> survives pod restarts and is lost with the node;
<span class="d-cluster">cluster</span> survives losing this node;
<span class="d-region">region</span> survives losing the cluster.
<b>Ephemeral</b> means volatile or node: data there is gone when this node is.
Used is counted as df counts it, used / (used + available): space reserved for root is neither.</p>
<h2>Latency</h2>
<p>Milliseconds, p50/p95/max of per-second averages, over the last minute and hour; probe: write/fsync/read of
its last round.</p>
<table id="latency"><thead><tr><th>Mountpoint</th><th>Device</th><th>Read 1m</th><th>Read 1h</th>
<th>Write 1m</th><th>Write 1h</th><th>Fsync 1m</th><th>Fsync 1h</th><th>Probe</th></tr></thead>
<tbody>
{chr(10).join(io_rows)}
</tbody></table>
<p>Collectors: {collectors}</p>
<p><a href="/metrics">/metrics</a> · <a href="/api/status">/api/status</a></p>
</body></html>
"""


POLICY_ACTIONS_SHOWN = 20
ALERTS_SHOWN = 50


def what_was_done(data: dict[str, Any]) -> dict[str, str]:
    """For each run, what protects it and what the agent did about it, in words: its newest durable copy (where, how
    old the save it protects), and the last checkpoint request the policy made of it, with its answer (a save newer
    than the request). A ``skipped`` record asked nothing (the rule resolved, the same request came within its
    cooldown) and never hides the request that was made."""
    now = data.get("generated_at")
    requests: dict[str, dict[str, Any]] = {}
    for a in (data.get("policy") or {}).get("actions") or ():
        if (
            a.get("action") == "request_checkpoint"
            and a.get("kind") == "run"
            and a.get("outcome") != "skipped"
            and a.get("key") not in requests
        ):
            requests[a["key"]] = a  # newest first
    syncs: dict[str, dict[str, Any]] = {}
    for j in (data.get("policy") or {}).get("syncs") or ():
        syncs.setdefault(j["run"], j)  # newest first
    out: dict[str, str] = {}
    for r in data.get("checkpoints") or ():
        parts = []
        copy = r.get("durable_copy")
        if copy is not None:
            how = "verified copy" if copy["how"] == "verified" else "copy at the same path"
            age = human_seconds(copy["covers_age_seconds"])
            parts.append(f"{how} of {copy['checkpoint']} (a save {age} old) at {copy['where']}")
        elif r.get("durability") in ("volatile", "node"):
            parts.append("no durable copy")
        job = syncs.get(r["run"])
        if job is not None and job["state"] in ("queued", "running"):
            parts.append(f"copy to {job['destination']} {job['state']}")
        elif job is not None and job["state"] != "done" and copy is None:
            parts.append(
                f"copy to {job['destination']} {job['state']}" + (f": {job['detail']}" if job.get("detail") else "")
            )
        asked = requests.get(r["run"])
        if asked is not None and now is not None:
            when = human_seconds(max(0.0, now - asked["at"]))
            text = f"checkpoint asked {when} ago ({asked['outcome']}"
            text += f": {asked['detail']})" if asked.get("detail") else ")"
            age = r.get("newest_complete_age_seconds")
            if age is not None and now - age > asked["at"]:
                text += f"; answered by a save {human_seconds(age)} old"
            elif asked["outcome"] in ("ok", "dry_run"):
                text += "; not answered yet"
            parts.append(text)
        if parts:
            out[r["run"]] = "; ".join(parts)
    return out


def _node_section(data: dict[str, Any]) -> str:
    """The node's drain and the pods being deleted, as states of their own (only with a Kubernetes API)."""
    kube = data.get("kubernetes") or {}
    if not kube.get("enabled"):
        return ""
    node = kube.get("node") or {}
    leaving = kube.get("terminating_pods") or []
    words = []
    if node.get("draining"):
        taints = ", ".join(node.get("removal_taints") or ())
        words.append("<b>draining</b>: cordoned" + (f", with the removal taint {shown(taints)}" if taints else ""))
    elif node.get("cordoned"):
        words.append("<b>cordoned</b> (no removal taint: not draining)")
    else:
        words.append("not cordoned, not draining")
    if leaving:
        pods = "; ".join(
            f"{shown(p['namespace'])}/{shown(p['pod'])}"
            + ("" if p.get("seconds_left") is None else f" ({human_seconds(p['seconds_left'])} left)")
            for p in leaving
        )
        words.append(f"<b>pods being deleted</b>: {pods}")
    cls = " class='leaving'" if node.get("draining") or leaving else ""
    name = shown(node.get("name") or "this node")
    return f"<section id='node-state'{cls}><p>Node {name}: {'; '.join(words)}.</p></section>"


def _alerts_section(alerts: list[dict[str, Any]] | None, now: float | None) -> str:
    """The alerts Alertmanager posted for this node: which, about what, firing or resolved, since when."""
    if alerts is None:
        return ""
    e = html.escape
    rows = []
    for a in alerts[-ALERTS_SHOWN:]:
        labels = a.get("labels") or {}
        about = ", ".join(f"{k}={labels[k]}" for k in ("run", "mountpoint", "gpu", "uuid") if k in labels)
        since = "-" if now is None else f"{human_seconds(max(0.0, now - a['starts_at']))} ago"
        rows.append(
            f"<tr class='{e(a['status'])}'><td>{shown(labels.get('alertname', '?'))}</td>"
            f"<td>{shown(labels.get('severity', '-'))}</td><td class='mountpoint'>{shown(about or '-')}</td>"
            f"<td>{e(a['status'])}</td><td class='num'>{e(since)}</td>"
            f"<td>{shown((a.get('annotations') or {}).get('summary', ''))}</td></tr>"
        )
    if not rows:
        rows.append("<tr><td colspan='6' class='empty'>none received</td></tr>")
    return f"""<h3>Alerts received from Alertmanager</h3>
<table id="alerts-received"><thead><tr><th>Alert</th><th>Severity</th><th>About</th><th>Status</th><th>Since</th>
<th>Summary</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>"""


def _policy_section(policy: dict[str, Any] | None, now: float | None) -> str:
    """What the policy fires for now (and holds pending), since when, and the last actions with their results."""
    if not policy:
        return ""
    e = html.escape

    def ago(t: float | None) -> str:
        return "-" if t is None or now is None else f"{human_seconds(max(0.0, now - t))} ago"

    notes = []
    if not policy["enabled"]:
        notes.append("The policy is off (policy.enabled is false).")
    if not policy["last_reload_success"]:
        notes.append(
            "The last policy load failed; the one before stays in force: " + "; ".join(policy["reload_errors"])
        )
    for r in policy["rules"]:
        if r["disabled_reason"]:
            notes.append(f"Rule {r['name']} is disabled: {r['disabled_reason']}")
    active = [
        f"<tr class='{e(a['state'])} {e(a['severity'])}'><td>{e(a['rule'])}</td><td>{e(a['severity'])}</td>"
        f"<td>{e(a['kind'])} <span class='mountpoint'>{e(a['key'])}</span></td><td>{e(a['state'])}</td>"
        f"<td class='num'>{e(ago(a['since']))}</td><td>{e(a['message'])}</td></tr>"
        for a in policy["active"]
    ] or ["<tr><td colspan='6' class='empty'>no rule fires or is pending</td></tr>"]
    done = [
        f"<tr class='{e(a['outcome'])}'><td class='num'>{e(ago(a['at']))}</td><td>{e(a['rule'])}</td>"
        f"<td>{e(a['action'])}</td><td>{e(a['kind'])} <span class='mountpoint'>{e(a['key'])}</span></td>"
        f"<td>{e(a['outcome'])}</td><td>{e(a['detail'])}</td></tr>"
        for a in policy["actions"][:POLICY_ACTIONS_SHOWN]
    ] or ["<tr><td colspan='6' class='empty'>no action yet</td></tr>"]
    rules = len(policy["rules"])
    return f"""<h2>Policy</h2>
<p class="note" id="policy-summary">{rules} rules; {sum(r["firing"] for r in policy["rules"])} firing.
{" ".join(e(n) for n in notes)}</p>
<table id="policy-active"><thead><tr><th>Rule</th><th>Severity</th><th>About</th><th>State</th><th>Since</th>
<th>Message</th></tr></thead>
<tbody>
{chr(10).join(active)}
</tbody></table>
<h3>Last actions</h3>
<table id="policy-actions"><thead><tr><th>When</th><th>Rule</th><th>Action</th><th>About</th><th>Result</th>
<th>Detail</th></tr></thead>
<tbody>
{chr(10).join(done)}
</tbody></table>
{_syncs_table(policy.get("syncs") or [], ago)}"""


def _syncs_table(syncs: list[dict[str, Any]], ago: Callable[[float | None], str]) -> str:
    """The checkpoint copies the sync action made: what made each, where from and to, and what became of it."""
    if not syncs:
        return ""
    e = html.escape
    rows = [
        f"<tr class='{e(j['state'])}'><td class='num'>{e(ago(j['queued_at']))}</td><td>{e(j['rule'])}</td>"
        f"<td class='mountpoint'>{e(j['run'])}</td><td class='mountpoint'>{e(j['source'])}</td>"
        f"<td class='mountpoint'>{e(j['destination'])}</td><td>{e(j['state'])}</td>"
        f"<td class='num'>{e(human_bytes(j['bytes']))}</td>"
        f"<td class='num'>{'-' if j['seconds'] is None else e(human_seconds(j['seconds']))}</td>"
        f"<td>{e(j['why'])}</td><td>{e(j['detail'])}</td></tr>"
        for j in syncs[:POLICY_ACTIONS_SHOWN]
    ]
    return f"""<h3>Checkpoint copies</h3>
<table id="policy-syncs"><thead><tr><th>When</th><th>Rule</th><th>Run</th><th>From</th><th>To</th><th>State</th>
<th>Bytes</th><th>Took</th><th>Why</th><th>Detail</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody></table>"""


def _left_out_line(left: dict[str, Any]) -> str:
    """The runs the bound on runs left out of the table and the findings: how many, and that every total holds them."""
    if not left.get("runs"):
        return ""
    size = sum(b["bytes"] for b in left.get("important_bytes") or ())
    return (
        f"<p class='note' id='left-out'>{left['runs']} more runs are not listed ({left['findings']} findings, "
        f"{human_bytes(size)} on ephemeral storage); every total counts them "
        "(storwatch_checkpoint_series_dropped).</p>"
    )


def _ms(seconds: float | None) -> str:
    # None: not measured, or not a finite number (report.finite_data made it null).
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def _collector_text(c: dict[str, Any]) -> str:
    e = html.escape
    if c["state"] == "off":
        text = f"off ({e(c['off_reason'] or '')})"
    elif c["state"] == "ok":
        text = "ok"
    else:
        text = "FAILED " + e(c["error"] or "")
    return f"<span class='collector-{e(c['state'])}'>{e(c['name'])}: {text}</span>"


def _gpu_note(data: dict[str, Any]) -> str:
    """What the GPU table's own rows cannot say: that the collector is off and why, or that NVML stopped answering
    while the GPUs it knew are listed (as down). An empty table says why in its row (report.no_gpus_line)."""
    e = html.escape
    gpu = next((c for c in data["collectors"] if c["name"] == "gpu"), None)
    if gpu is not None and gpu["state"] == "off":
        return f"<p id='gpu-note'>The GPU collector is off: {e(gpu['off_reason'] or 'no reason given')}.</p>"
    nvml = data["nvml"]
    if not nvml["nvml_up"] and data["gpus"]:
        return f"<p id='gpu-note'>NVML is not answering: {e(nvml['error'] or 'no reason given')}</p>"
    return ""
