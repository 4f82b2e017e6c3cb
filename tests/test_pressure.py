"""The PSI parser (``<procfs>/pressure/cpu`` and friends), a table of real and damaged files."""

from __future__ import annotations

import pytest

from storwatch.procfs.pressure import Pressure, PressureLine, parse_pressure

CPU_5_15 = (
    b"some avg10=92.92 avg60=67.55 avg300=42.88 total=2085322481\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
)
"""A busy 2-vCPU VM, kernel 6.18 (since 5.13 the system-level cpu file carries a ``full`` line of zeros)."""
CPU_5_4 = b"some avg10=0.12 avg60=0.05 avg300=0.01 total=123456\n"
"""Before 5.13 the cpu file has no ``full`` line."""


@pytest.mark.parametrize(
    ("data", "some", "full", "errors"),
    [
        pytest.param(
            CPU_5_15,
            PressureLine(92.92, 67.55, 42.88, 2085322481),
            PressureLine(0.0, 0.0, 0.0, 0),
            0,
            id="cpu-with-full",
        ),
        pytest.param(CPU_5_4, PressureLine(0.12, 0.05, 0.01, 123456), None, 0, id="cpu-without-full"),
        pytest.param(
            b"some avg10=1.00 avg60=x avg300=0.00 total=5\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n",
            None,
            PressureLine(0.0, 0.0, 0.0, 7),
            1,
            id="a-bad-line-fails-only-itself",
        ),
        pytest.param(b"some avg10=101 avg60=0 avg300=0 total=1\n", None, None, 1, id="a-percentage-past-100"),
        pytest.param(b"some avg10=nan avg60=0 avg300=0 total=1\n", None, None, 1, id="not-a-number"),
        pytest.param(b"some avg10=0 avg60=0 avg300=0 total=-1\n", None, None, 1, id="a-negative-counter"),
        pytest.param(b"some avg10=0 avg60=0 avg300=0\n", None, None, 1, id="no-total"),
        pytest.param(b"most avg10=0 avg60=0 avg300=0 total=1\n", None, None, 1, id="an-unknown-kind"),
        pytest.param(b"", None, None, 0, id="empty"),
    ],
)
def test_parse_pressure(data: bytes, some: PressureLine | None, full: PressureLine | None, errors: int) -> None:
    parsed, problems = parse_pressure(data)
    assert len(problems) == errors, problems
    if some is None and full is None:
        assert parsed is None
    else:
        assert parsed == Pressure(some, full)
