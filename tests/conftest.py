"""Shared test set-up. In CI (CI=true) a skipped real-part test is a failure, not a skip."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager as ContextManager
from typing import Any, TypeVar

import pytest

from storwatch.config import CheckpointsConfig
from storwatch.sources.checkpoints import CheckpointSource

T = TypeVar("T")

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and item.get_closest_marker("realpart") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"real-part test skipped in CI (CI=true makes this a failure): {reason}"


@pytest.fixture
def real_mounts() -> Generator[Callable[[ContextManager[T]], T], None, None]:
    """Enter real-mount context managers (tests/realmounts.py); skip with the reason when a part is unavailable.

    Everything entered is torn down when the test ends, failed or not, in reverse order.
    """
    from tests.realmounts import RealPartUnavailable

    with contextlib.ExitStack() as stack:

        def enter(cm: ContextManager[T]) -> T:
            try:
                return stack.enter_context(cm)
            except RealPartUnavailable as err:
                pytest.skip(str(err))

        yield enter


@pytest.fixture(scope="session")
def chromium() -> str:
    """The headless browser that renders the status page (tests/browser.py runs it); skip where it is missing."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.skip("chromium not found on PATH (Debian package 'chromium')")


@pytest.fixture
def make_source() -> Iterator[Callable[..., CheckpointSource]]:
    """CheckpointSource(roots, **kwargs), closed (its helper process stopped) when the test ends; the keywords that
    are fields of the checkpoints section go in its settings."""
    made: list[CheckpointSource] = []

    def make(*args: Any, **kwargs: Any) -> CheckpointSource:
        fields = {f.name for f in dataclasses.fields(CheckpointsConfig)}
        settings = CheckpointsConfig(**{k: kwargs.pop(k) for k in list(kwargs) if k in fields})
        made.append(CheckpointSource(*args, settings, **kwargs))
        return made[-1]

    yield make
    for source in made:
        source.close()
