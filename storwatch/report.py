"""The View as plain data: the one shape behind /api/status, ``scan --json``, the status page and the scan table."""

from __future__ import annotations

from typing import Any

from storwatch.model import View
from storwatch.sources.mounts import display_path


def view_to_dict(view: View) -> dict[str, Any]:
    mounts = []
    for mv in view.mounts:
        m = mv.mount
        u = m.usage
        mounts.append(
            {
                "mountpoint": display_path(m.mountpoint),
                "device": display_path(m.device),
                "fstype": m.fstype,
                "durability": mv.verdict.durability.value,
                "ephemeral": mv.verdict.durability.ephemeral,
                "reason": mv.verdict.reason,
                "evidence": [
                    {"source": e.source.label, "durability": e.durability.value, "reason": e.reason}
                    for e in mv.verdict.evidence
                ],
                "stuck": m.stuck,
                "stuck_seconds": round(m.stuck_seconds, 3),
                "readonly": m.readonly,
                "size_bytes": u.size_bytes if u else None,
                "used_bytes": (u.size_bytes - u.free_bytes) if u else None,
                "avail_bytes": u.avail_bytes if u else None,
                "free_bytes": u.free_bytes if u else None,
                "files": u.files if u else None,
                "files_free": u.files_free if u else None,
                "usage_error": m.usage_error,
                "root": display_path(m.root),
                "device_number": f"{m.major}:{m.minor}",
            }
        )
    return {
        "generated_at": view.timestamp,
        "ready": view.ready,
        "platform": {"name": view.platform.name, "detected_by": view.platform.detected_by},
        "mounts": mounts,
        "collectors": [
            {
                "name": c.name,
                "success": c.success,
                "duration_seconds": round(c.duration_seconds, 6),
                "last_success_timestamp": c.last_success_timestamp,
                "error": c.error,
            }
            for c in view.collectors
        ],
    }


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def usage_percent(mount: dict[str, Any]) -> str:
    size, used = mount.get("size_bytes"), mount.get("used_bytes")
    if not size or used is None:
        return "-"
    return f"{100.0 * used / size:.0f}%"


def mount_state(mount: dict[str, Any]) -> str:
    if mount["stuck"]:
        return f"STUCK {mount['stuck_seconds']:.0f}s"
    if mount.get("usage_error"):
        return str(mount["usage_error"])
    return "ro" if mount["readonly"] else "ok"
