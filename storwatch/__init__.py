"""storwatch: a node agent that joins mount durability, storage latency, GPUs and checkpoints."""

from __future__ import annotations

__version__ = "0.1.0"
