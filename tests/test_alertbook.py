"""The alert book (storwatch/actions/alertbook.py) with an injected clock: one alert per fingerprint, a repeat post
an update, resolved alerts kept a while, firing ones past their endsAt or TTL gone, and the bound on alerts held."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import pytest

from storwatch.actions.alertbook import AddResult, AlertBook
from storwatch.actions.base import Alert

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def alert(
    fp: str,
    starts_at: float = T0 - 60,
    status: str = "firing",
    ends_at: float | None = None,
    received_at: float = T0,
    annotations: Mapping[str, str] | None = None,
) -> Alert:
    assert status in ("firing", "resolved")
    return Alert(
        fp,
        "firing" if status == "firing" else "resolved",
        {"alertname": "DiskFull", "node": "n1"},
        annotations or {},
        starts_at,
        ends_at,
        received_at,
    )


def fingerprints(book: AlertBook) -> list[str]:
    return [a.fingerprint for a in book.current()]


def test_a_repeat_post_updates_the_alert_it_does_not_add_one() -> None:
    clock = Clock()
    book = AlertBook(clock=clock)
    assert book.add([alert("a"), alert("b", starts_at=T0 - 30)]) == AddResult(stored=2)
    clock.now += 10
    result = book.add([alert("a", status="resolved", ends_at=T0 + 5, received_at=clock.now, annotations={"x": "2"})])
    assert result == AddResult(updated=1)
    (a, b) = book.current()
    assert (a.fingerprint, a.status, a.ends_at, a.annotations, a.received_at) == (
        "a",
        "resolved",
        T0 + 5,
        {"x": "2"},
        clock.now,
    )
    assert (b.fingerprint, b.status) == ("b", "firing")


def test_one_alert_per_fingerprint_the_latest_firing_wins() -> None:
    clock = Clock()
    book = AlertBook(clock=clock)
    book.add([alert("a", starts_at=T0 - 600, status="resolved", ends_at=T0 - 300, received_at=T0 - 300)])
    # The same alert fired again: a later startsAt is a new alert under the same fingerprint.
    assert book.add([alert("a", starts_at=T0 - 60)]) == AddResult(stored=1)
    # A late post of the first firing, which ended before this one began, changes nothing.
    late = alert("a", starts_at=T0 - 600, status="resolved", ends_at=T0 - 300, received_at=T0 + 1)
    assert book.add([late]) == AddResult(stale=1)
    (only,) = book.current()
    assert (only.starts_at, only.status) == (T0 - 60, "firing")


def test_a_start_moved_back_while_the_alert_is_active_is_the_same_alert() -> None:
    """Alertmanager keeps the earliest start of an alert re-sent while active: a client that re-sends it with its
    start rounded to the millisecond (its API writes milliseconds) moves it back a little."""
    book = AlertBook(clock=Clock())
    book.add([alert("a", starts_at=T0 - 60.000123)])
    resolved = alert("a", starts_at=T0 - 60.001, status="resolved", ends_at=T0, received_at=T0 + 1)
    assert book.add([resolved]) == AddResult(updated=1)
    (only,) = book.current()
    assert (only.starts_at, only.status, only.ends_at) == (T0 - 60.001, "resolved", T0)


def test_a_resolved_alert_stays_for_a_while_then_goes() -> None:
    clock = Clock()
    book = AlertBook(resolved_keep_seconds=300, clock=clock)
    book.add([alert("a"), alert("b", status="resolved", ends_at=T0 - 1, received_at=T0)])
    clock.now = T0 + 299
    assert fingerprints(book) == ["a", "b"]
    clock.now = T0 + 300
    assert fingerprints(book) == ["a"]
    assert book.expired_total == 1


def test_a_firing_alert_past_its_ends_at_reads_resolved_then_goes() -> None:
    clock = Clock()
    book = AlertBook(resolved_keep_seconds=60, clock=clock)
    book.add([alert("a", ends_at=T0 + 100)])
    assert [a.status for a in book.current()] == ["firing"]
    clock.now = T0 + 100
    assert [a.status for a in book.current()] == ["resolved"]
    clock.now = T0 + 160
    assert book.current() == ()


def test_the_firing_ttl_drops_an_alert_that_was_not_posted_again() -> None:
    clock = Clock()
    book = AlertBook(firing_ttl_seconds=3600, clock=clock)
    book.add([alert("a"), alert("b")])
    clock.now = T0 + 1800
    book.add([alert("b", received_at=clock.now)])  # Alertmanager's repeat_interval: b is posted again
    clock.now = T0 + 3600
    assert fingerprints(book) == ["b"]
    assert AlertBook(clock=clock).firing_ttl_seconds == 0  # off by default: firing alerts stay until resolved


def test_the_bound_drops_resolved_alerts_first_then_the_least_recently_posted() -> None:
    clock = Clock()
    book = AlertBook(max_alerts=3, clock=clock)
    book.add([alert("a"), alert("b", status="resolved", ends_at=T0), alert("c")])
    assert book.add([alert("d")]) == AddResult(stored=1, evicted=1)
    assert sorted(fingerprints(book)) == ["a", "c", "d"]
    book.add([alert("a", received_at=T0 + 1)])  # posted again: now the most recent
    assert book.add([alert("e")]) == AddResult(stored=1, evicted=1)
    assert sorted(fingerprints(book)) == ["a", "d", "e"]
    assert book.evicted_total == 2
    book.configure(max_alerts=1, resolved_keep_seconds=300)
    assert fingerprints(book) == ["e"]
    assert book.evicted_total == 4


def test_an_update_at_the_bound_evicts_nothing() -> None:
    book = AlertBook(max_alerts=2, clock=Clock())
    book.add([alert("a"), alert("b")])
    assert book.add([alert("a", status="resolved", ends_at=T0)]) == AddResult(updated=1)
    assert len(book) == 2


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_alerts"):
        AlertBook(max_alerts=0)


def test_adds_from_many_threads_keep_one_alert_per_fingerprint_within_the_bound() -> None:
    book = AlertBook(max_alerts=50, clock=Clock())

    def post(worker: int) -> None:
        for i in range(200):
            book.add([alert(f"fp{(worker * 7 + i) % 80}")])

    threads = [threading.Thread(target=post, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held = fingerprints(book)
    assert len(held) == 50 == len(set(held))
