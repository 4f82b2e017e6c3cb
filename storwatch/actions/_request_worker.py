"""The helper process behind the ``request_checkpoint`` action: places the request file in a run's directory
(``request_file.place_request``), so a run directory on a hung mount strands a thread here and never one of the
agent's. Answers requests as ``_blocking_worker`` does, one thread per request.

``ckpt_request RUN_DIR PARAMS`` (the run directory hex-encoded, the parameters a hex-encoded JSON object ``{"root":
str or null, "text": str}``) answers one JSON text ``{"done": "created"|"renewed", "mode": the run directory's
st_mode}`` or ``{"refused": "why"}``.
"""

from __future__ import annotations

import json
import os
import sys

from storwatch.actions.request_file import Refused, place_request
from storwatch.calls._blocking_worker import serve

OP = "ckpt_request"


def request_op(run_dir: bytes, params_hex: str) -> str:
    params = json.loads(bytes.fromhex(params_hex))
    root = params.get("root")
    try:
        done, mode = place_request(
            os.fsdecode(run_dir), root if isinstance(root, str) else None, str(params.get("text", ""))
        )
    except Refused as why:
        return json.dumps({"refused": str(why)})
    except OSError as err:
        return json.dumps({"refused": f"{err.strerror or err}"})
    return json.dumps({"done": done, "mode": mode})


def command() -> list[str]:
    """How the action starts this helper: isolated (``-I``), with the tree this module comes from first on
    ``sys.path``."""
    tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = f"import sys; sys.path.insert(0, {tree!r}); from storwatch.actions._request_worker import main; main()"
    return [sys.executable, "-I", "-c", code]


def main() -> None:
    serve({OP: request_op})
