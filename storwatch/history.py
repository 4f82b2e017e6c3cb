"""History: a bounded ring of recent snapshots, fixed in size whatever the uptime."""

from __future__ import annotations

import threading
from collections import deque

from storwatch.snapshot import Snapshot


class History:
    def __init__(self, size: int) -> None:
        self._ring: deque[Snapshot] = deque(maxlen=size)
        self._lock = threading.Lock()

    def append(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._ring.append(snapshot)

    def resize(self, size: int) -> None:
        with self._lock:
            self._ring = deque(self._ring, maxlen=size)

    def snapshots(self) -> list[Snapshot]:
        with self._lock:
            return list(self._ring)

    def __len__(self) -> int:
        return len(self._ring)

    @property
    def capacity(self) -> int:
        return self._ring.maxlen or 0
