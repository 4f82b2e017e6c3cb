"""Each GPU's stall share: the GPU time settled as lost to storage over the last ten minutes of Views, over ten
minutes (the policy's ``stall_share_10m``, and what the mixin's StorwatchGPUStalledByStorage computes from the
counters). Kept by the agent View after View, since a share needs the totals of ten minutes ago; the View carries it
(StallState.share_10m), so every consumer reads the same figure."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storwatch.analysis.stalls import Cause

STALL_WINDOW_SECONDS = 600.0


class StallShares:
    """Each GPU's settled stall seconds as the Views report them, over the last ``window`` seconds of View time."""

    MAX_SAMPLES = 4096
    """Samples kept per GPU (a View a second for ten minutes is 600)."""

    def __init__(self, window: float = STALL_WINDOW_SECONDS) -> None:
        self.window = window
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def clear(self) -> None:
        """Stalls are not tracked (any more): the next window starts from nothing."""
        self._samples.clear()

    def observe(
        self, now: float, totals: Mapping[tuple[str, str, Cause], float], gpus: Iterable[str]
    ) -> dict[str, float | None]:
        """One View's settled totals by (GPU, mount, cause) at ``now``, and the GPUs it lists (by their stall label,
        the NVML index): each GPU's share where the window is covered, else None for it."""
        by_gpu: dict[str, float] = {}
        for (gpu, _mp, _cause), seconds in totals.items():
            by_gpu[gpu] = by_gpu.get(gpu, 0.0) + seconds
        listed = set(gpus)
        out: dict[str, float | None] = {}
        for gpu in listed | set(by_gpu):
            samples = self._samples.setdefault(gpu, deque(maxlen=self.MAX_SAMPLES))
            total = by_gpu.get(gpu, 0.0)
            if samples and (total < samples[-1][1] or now <= samples[-1][0]):
                # Totals only grow and time only moves on: a drop (the tracker's bound dropped a total) or a step
                # back of the clock makes the window unknown until it is covered again.
                samples.clear()
            samples.append((now, total))
            while len(samples) > 1 and samples[1][0] <= now - self.window:
                samples.popleft()
            start_t, start_total = samples[0]
            out[gpu] = (total - start_total) / (now - start_t) if now - start_t >= self.window else None
        for gone in set(self._samples) - listed - set(by_gpu):
            del self._samples[gone]
        return out
