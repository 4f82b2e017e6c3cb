"""The helper process behind the copies source (``sources/copies.py``): walks a durable root for storwatch's verified
copies (``checkpoints.manifest.find_copies``), so a durable root on a hung mount strands a thread here and never one
of the agent's. Answers requests as ``_blocking_worker`` does, one thread per request.

``sync_copies ROOT PARAMS`` (the root hex-encoded, the parameters a hex-encoded JSON object ``{"max_depth": int,
"max_entries": int, "max_seconds": float}``) answers one JSON text ``{"copies": [...], "stopped": str or null}``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from storwatch.calls._blocking_worker import serve
from storwatch.checkpoints.manifest import find_copies

OP = "sync_copies"


def copies_op(root: bytes, params_hex: str) -> str:
    params = json.loads(bytes.fromhex(params_hex))
    found, stopped = find_copies(
        os.fsdecode(root),
        max_depth=int(params["max_depth"]),
        max_entries=int(params["max_entries"]),
        max_seconds=float(params["max_seconds"]),
    )
    return json.dumps({"copies": [dataclasses.asdict(c) for c in found], "stopped": stopped}, allow_nan=False)


def command() -> list[str]:
    """How the source starts this helper: isolated (``-I``), with the tree this module comes from first on
    ``sys.path``."""
    tree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import sys; sys.path.insert(0, {tree!r}); from storwatch._copies_worker import main; main()"
    return [sys.executable, "-I", "-c", code]


def main() -> None:
    serve({OP: copies_op})
