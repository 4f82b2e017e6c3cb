"""Reading a new configuration for a reload: loaded, checked and resolved before anything is applied, with the fields
that wait for a restart kept as they are. Whatever goes wrong is a ``ReloadError`` naming the file (and the line and
field where there is one); the agent then keeps its last good configuration."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from storwatch.classify import resolve_platform
from storwatch.config import Config, ConfigError
from storwatch.registry import load_config
from storwatch.vocabulary import Platform

log = logging.getLogger(__name__)

RESTART_ONLY = ("listen", "tls", "paths")
"""Fields a reload leaves as they are (the README lists them)."""


class ReloadError(Exception):
    """The new configuration cannot be read or checked (the message is ``FILE:LINE: FIELD: message`` or
    ``FILE: message``)."""


def read_new(path: str, flags: Callable[[Config], Config], current: Config) -> tuple[Config, Platform]:
    """The configuration in ``path`` (with the command line's flags laid over it), checked, with the restart-only
    fields of ``current``; and the platform it resolves to."""
    try:
        new = flags(load_config(path))
        new.validate(path)
        platform = resolve_platform(new.platform, new.host_paths())
    except ConfigError as err:
        raise ReloadError(str(err)) from err
    except Exception as err:  # a bug in reading a file must not take a running agent down
        log.debug("reload: reading %s", path, exc_info=True)
        raise ReloadError(f"{path}: cannot load: {type(err).__name__}: {err}") from err
    for name in RESTART_ONLY:
        if getattr(new, name) != getattr(current, name):
            log.warning("reload: %s changed; it takes effect on restart", name)
            new = dataclasses.replace(new, **{name: getattr(current, name)})
    return new, platform
