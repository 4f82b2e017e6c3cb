"""The names a copy gives what it writes beside DEST, and the test that tells them from anyone else's files: what the
next copy into a directory may recover or remove, and nothing else."""

from __future__ import annotations

import re

MANIFEST_SUFFIX = ".storwatch-sync.json"
"""A verified copy's manifest is put beside it as ``NAME`` + this."""
TEMP_TAG = ".storwatch-sync-"
TEMP_NAME = re.compile(
    r"\.(?P<name>.+)\.storwatch-sync-(?P<token>[0-9a-f]{16})\.(?P<kind>tmp|manifest|old|gone)", re.DOTALL
)
"""What a copy writes before its commit, by kind: ``tmp`` (the copy being made), ``manifest`` (its manifest, written
once the copy is verified), ``old`` (the earlier copy at DEST, moved aside where no atomic exchange exists), ``gone``
(a copy keep-N retention removes)."""
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 128 << 20
NAME_MAX = 255


def temp_name(name: str, token: str, kind: str) -> str:
    return f".{name}{TEMP_TAG}{token}.{kind}"


def is_ours(name: str) -> bool:
    """Whether a name could be taken for one storwatch gives its own files (a temporary or a manifest)."""
    return TEMP_TAG in name or name.endswith(MANIFEST_SUFFIX)
