"""Checkpoints on disk: which format a file or directory is, and whether it is complete, incomplete, corrupt, unsafe
(a pickle in it names a global that runs code when loaded) or unknown (not a checkpoint, or a check stopped at a
limit)."""

from __future__ import annotations

from storwatch.checkpoints.formats import FORMATS, VERDICTS, CheckResult, check, identify
from storwatch.checkpoints.limits import DeepLimits

__all__ = ["FORMATS", "VERDICTS", "CheckResult", "DeepLimits", "check", "identify"]
