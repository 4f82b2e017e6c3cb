"""Where the checkpoint source files its facts in a Snapshot. The key has a module of its own so that the Snapshot
and the registry name it without importing the source (its helper-process client, the format checks, the pickle
reader), which `storwatch scan` never runs; ``storwatch.sources.checkpoints`` gives it its facts type."""

from __future__ import annotations

from typing import Any

from storwatch.sources import FactsKey

CHECKPOINTS: FactsKey[Any] = FactsKey("checkpoints")
