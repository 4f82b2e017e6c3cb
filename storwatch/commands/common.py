"""What the commands share: exit statuses, the common options, argument types that say what they accept, and the
configuration as a file and the flags make it (every problem named before anything runs)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from storwatch.vocabulary import PLATFORMS

if TYPE_CHECKING:
    from storwatch.config import Config


EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_NOTHING_VERIFIED = 0, 1, 2, 3


EXIT_INTERRUPTED = 130


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML configuration file (every field has a default)")
    p.add_argument("--platform", choices=("auto", *PLATFORMS), help="platform preset (default: auto-detect)")
    p.add_argument("--path.procfs", dest="procfs", metavar="DIR", help="procfs mount point (default /proc)")
    p.add_argument("--path.sysfs", dest="sysfs", metavar="DIR", help="sysfs mount point (default /sys)")
    p.add_argument("--path.rootfs", dest="rootfs", metavar="DIR", help="the host's root filesystem (default /)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="log level (default info)")


MAX_SCAN_TIMEOUT_SECONDS = 60.0


MIN_PLAN_BYTES, MAX_PLAN_BYTES = 8 << 20, 8 << 30


MAX_PLAN_ROUNDS, MAX_PLAN_SECONDS = 20, 3600.0


MAX_SCAN_SAMPLE_SECONDS = 3600.0


MAX_SYNC_DEADLINE_SECONDS = 7 * 86400.0


def seconds_arg(minimum: float, maximum: float, zero_ok: bool) -> Any:
    """An argparse type: a finite number of seconds in range, else a message that says what is accepted."""
    lowest = f"0 to {maximum:g}" if zero_ok else f"greater than 0 and at most {maximum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value >= minimum if zero_ok else value > minimum) and value <= maximum):
            raise argparse.ArgumentTypeError(f"must be a number of seconds {lowest}, got {text!r}")
        return value

    return parse


def apply_flags(args: argparse.Namespace) -> Any:
    """A function that lays the command-line flags over a Config: flags win over the file, on reload too."""

    def transform(config: Config) -> Config:
        paths = config.paths
        for name in ("procfs", "sysfs", "rootfs"):
            value = getattr(args, name, None)
            if value:
                paths = dataclasses.replace(paths, **{name: value})
        changes: dict[str, Any] = {"paths": paths}
        if getattr(args, "listen", None):
            changes["listen"] = args.listen
        if args.platform:
            changes["platform"] = args.platform
        if args.log_level:
            changes["log_level"] = args.log_level
        return dataclasses.replace(config, **changes)

    return transform


def config_file(path: str | None) -> Config:
    """The configuration in ``path``, or the defaults without one. Only a file needs the registry (it declares the
    sections of the sources a file may configure, and importing it imports every source)."""
    if path is None:
        from storwatch.config import Config

        return Config()
    from storwatch.registry import load_config

    return load_config(path)


def load(args: argparse.Namespace) -> tuple[Config, Any]:
    flags = apply_flags(args)
    config = flags(config_file(args.config))
    check_config(config, args)
    return config, flags


def check_config(config: Config, args: argparse.Namespace) -> None:
    """Raise a ConfigError naming every problem of ``config`` as the file and the flags made it, the host's procfs
    included: one that is not there, or cannot be read, is an error, not a node without mounts."""
    from storwatch.config import ConfigError

    where = args.config or "command line"
    problems = [f"{where}: {p}" for p in config.problems()]
    procfs = config.host_paths().procfs_problem()
    if procfs is not None:
        flag = bool(getattr(args, "procfs", None))
        problems.append(f"command line: --path.procfs: {procfs}" if flag else f"{where}: paths.procfs: {procfs}")
    if problems:
        raise ConfigError(*problems)


def setup_logging(level: str) -> None:
    # Log lines quote mountpoints, paths and errors that embed them: the formatter escapes what a terminal would act
    # on, and indents a record's further lines so that none can pass for a record of its own.
    import logging

    from storwatch.printable import PrintableFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def bytes_arg(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        t = text.strip().upper().removesuffix("IB").removesuffix("B")
        unit = t[-1:] if t[-1:] in _UNITS and t[-1:] else ""
        try:
            value = int(float(t[: len(t) - len(unit)]) * _UNITS[unit])
        except ValueError:
            value = -1
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be a size from {minimum} to {maximum} bytes, got {text!r}")
        return value

    return parse


def job_id_arg(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 1 << 32:
        raise argparse.ArgumentTypeError(f"must be a Slurm job ID (a whole number above 0), got {text!r}")
    return int(text)


def uid_arg(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) < 1 << 32:
        raise argparse.ArgumentTypeError(f"must be a user ID (a whole number), got {text!r}")
    return int(text)


def count_arg(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be a whole number from {minimum} to {maximum}, got {text!r}")
        return value

    return parse


def ratio_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a ratio above 0 and below 1, got {text!r}")
    return value
