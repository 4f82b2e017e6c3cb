"""Analysis: pure functions from a Snapshot (and History) to the facts consumers read."""
