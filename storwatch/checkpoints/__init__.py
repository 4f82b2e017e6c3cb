"""Checkpoints on disk: which format a file or directory is, and whether it is complete, incomplete or corrupt."""

from __future__ import annotations

from storwatch.checkpoints.formats import FORMATS, VERDICTS, CheckResult, check, identify

__all__ = ["FORMATS", "VERDICTS", "CheckResult", "check", "identify"]
