"""The GPU source: per-GPU utilisation, memory, power, temperature, throttling, Xid errors, compute processes and MIG
devices from NVML.

- :mod:`.nvml`: the NVML wrapper, the only module that imports the bindings (lazily): one wrapper for every call, a
  sentinel (NA) for a value NVML cannot give, an unsupported function logged once, nvmlInit retried with backoff;
- :mod:`.sampler`: one tick of sampling through the wrapper, and what is kept of each GPU between ticks;
- :mod:`.source`: :class:`GPUSource`, which runs the sampler on a deadline worker so a hung NVML call never holds
  the agent;
- :mod:`.facts`: the facts it returns, readable without the bindings.
"""

from __future__ import annotations

from storwatch.sources.gpu.facts import GPUS, GPUFacts, GPUProcess, GPUState, MIGDevice
from storwatch.sources.gpu.nvml import INIT_BACKOFF_FIRST_SECONDS, INIT_BACKOFF_MAX_SECONDS, NA, NAType
from storwatch.sources.gpu.sampler import BUFFERED_READ_SECONDS, RETRYING
from storwatch.sources.gpu.source import INIT_TIMEOUT_SECONDS, GPUSettings, GPUSource

__all__ = [
    "BUFFERED_READ_SECONDS",
    "GPUS",
    "INIT_BACKOFF_FIRST_SECONDS",
    "INIT_BACKOFF_MAX_SECONDS",
    "INIT_TIMEOUT_SECONDS",
    "NA",
    "RETRYING",
    "GPUFacts",
    "GPUProcess",
    "GPUSettings",
    "GPUSource",
    "GPUState",
    "MIGDevice",
    "NAType",
]
