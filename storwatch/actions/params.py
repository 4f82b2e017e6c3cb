"""An action's params as a rule gives them (YAML data), read into typed values: each problem is a sentence that names
the field (``params.url: ...``), for the policy loader to put its file and line in front of. The same reading serves
the check at load time and the run, so a run never meets params its check would have refused."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping


class Params:
    """Reads ``params`` field by field, collecting the problems in ``errors``; each read returns a usable value (the
    default where the field is missing or wrong), so one check reports every problem at once."""

    def __init__(self, params: Mapping[str, object], known: Collection[str]) -> None:
        self.params = params
        self.errors: list[str] = []
        for name in params:
            if not isinstance(name, str):
                self.errors.append(f"params: a field name must be a string, not {type(name).__name__}")
            elif name not in known:
                allowed = ", ".join(sorted(known)) or "none"
                self.errors.append(f"params.{name}: unknown field (this action takes: {allowed})")

    def _fail(self, name: str, message: str) -> None:
        self.errors.append(f"params.{name}: {message}")

    def string(self, name: str, *, required: bool = False, max_length: int = 4096) -> str | None:
        value = self.params.get(name)
        if value is None:
            if required:
                self._fail(name, "required")
            return None
        if not isinstance(value, str):
            self._fail(name, f"must be a string, not {type(value).__name__}")
            return None
        if not value or len(value) > max_length:
            self._fail(name, f"must be 1 to {max_length} characters long")
            return None
        if not value.isprintable():
            self._fail(name, "must not hold control or format characters")
            return None
        return value

    def choice(self, name: str, allowed: Collection[str], default: str) -> str:
        value = self.params.get(name, default)
        if not isinstance(value, str) or value not in allowed:
            self._fail(name, f"must be one of {', '.join(sorted(allowed))}")
            return default
        return value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        value = self.params.get(name, default)
        # bool is an int to Python; `timeout: true` is a mistake, not 1 second.
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            self._fail(name, "must be a number")
            return default
        if not low <= value <= high:
            self._fail(name, f"must be between {low:g} and {high:g}, not {value:g}")
            return default
        return float(value)

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        value = self.params.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(name, "must be a whole number")
            return default
        if not low <= value <= high:
            self._fail(name, f"must be between {low} and {high}, not {value}")
            return default
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self.params.get(name, default)
        if not isinstance(value, bool):
            self._fail(name, "must be true or false")
            return default
        return value

    def problem(self, name: str, message: str) -> None:
        """A problem found across fields (two that exclude each other), filed under ``name``."""
        self._fail(name, message)
