"""The pool of BlockingCalls: hung keys cannot starve healthy ones, and the helper's threads stay bounded.

The helper here is the real worker loop (``_blocking_worker.serve``) with one test operation: a path starting with
``hang`` never returns (a thread parked on an event, as a thread stuck in the kernel would be), any other answers at
once. Real hung FUSE mounts run through the same pool in tests/test_hung_mount.py.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from storwatch.calls.blocking import MIN_KEYS_KEPT, BlockingCalls, CallOutcome, Helper

REPO = Path(__file__).resolve().parents[1]
DEADLINE = 1.0
"""Each call's deadline: far beyond what a healthy answer takes even on a busy machine (a round that sends hung keys
lasts this long, so the tests take a few seconds)."""
WORKER = f"""
import os, sys, threading
sys.path.insert(0, {str(REPO)!r})
from storwatch.calls._blocking_worker import serve

def answer(path):
    if path.startswith(b"hang"):
        threading.Event().wait()
    if path == b"exit":
        os._exit(3)
    if path == b"mute":  # its output ends, and it lives on
        os.close(1)
        threading.Event().wait()
    return [path.decode()]

serve({{"answer": answer}})
"""


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))  # type: ignore[union-attr]


@pytest.fixture
def pool(tmp_path: Path):  # type: ignore[no-untyped-def]
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    calls = BlockingCalls(max_inflight=4, max_stuck=8, command=[sys.executable, "-I", str(script)])
    yield calls
    calls.close()


def test_hung_keys_never_starve_healthy_ones_and_threads_stay_bounded(pool: BlockingCalls) -> None:
    hung = {f"hang{i:02}": [f"hang{i:02}"] for i in range(20)}
    healthy = {f"ok{i}": [f"ok{i}"] for i in range(6)}
    # More hung keys than the pool has threads for (4 working + 8 stuck), listed after the healthy ones as pod
    # volumes come after / and the node's disks in the mount table.
    requests = {**healthy, **hung}
    for _ in range(5):
        out = pool.call_many("answer", requests, timeout=DEADLINE)
        # Every round measures every healthy key: they answered in time before, so they go first, and a hung key
        # past its deadline leaves its working slot for the stuck set.
        assert all(out[k].values == (k,) for k in healthy), {k: out[k] for k in healthy}
    assert pool.stuck() == 8
    assert pool.in_flight() <= 4 + 8
    stuck = [k for k in hung if out[k].stuck]
    skipped = [k for k in hung if out[k].skipped]
    assert len(stuck) >= 8 and len(stuck) + len(skipped) == 20
    # Those never called are said to be left out by the limit (the mount source makes that a collector failure).
    assert skipped and all("limit 8" in (out[k].error or "") for k in skipped)
    assert all(not out[k].stuck and out[k].values is None for k in skipped)
    assert pool.helper_pid is not None
    assert _threads(pool.helper_pid) <= 4 + 8 + 1


def test_keys_that_answered_go_first_whatever_the_request_order(pool: BlockingCalls) -> None:
    healthy = {f"ok{i}": [f"ok{i}"] for i in range(6)}
    assert all(o.values for o in pool.call_many("answer", healthy, timeout=DEADLINE).values())
    hung = {f"hang{i:02}": [f"hang{i:02}"] for i in range(20)}
    for _ in range(4):
        out = pool.call_many("answer", {**hung, **healthy}, timeout=DEADLINE)
        assert all(out[k].values == (k,) for k in healthy)


@pytest.mark.slow
def test_a_hundred_hung_keys_with_the_default_limits(tmp_path: Path) -> None:
    """Issue 13's bar: 100 hung mounts, the default max_inflight (16) and max_stuck (128), healthy mounts listed among
    them: from the second round on every healthy key is answered each round, and the helper's threads stay bounded."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    calls = BlockingCalls(command=[sys.executable, "-I", str(script)])
    try:
        keys = [f"hang{i:03}" for i in range(100)]
        healthy = [f"ok{i:02}" for i in range(30)]
        for i, key in enumerate(healthy):
            keys.insert(i * 4, key)  # scattered among the hung ones, as pod volumes are in the mount table
        requests = {k: [k] for k in keys}
        for round_ in range(10):
            out = calls.call_many("answer", requests, timeout=DEADLINE)
            answered = [k for k in healthy if out[k].values == (k,)]
            if round_ >= 1 + 100 // 16:  # by then every hung key has had its one call and sits in the stuck set
                assert answered == healthy, [k for k in healthy if k not in answered]
        assert calls.stuck() == 100
        assert not any(out[k].skipped for k in keys)
        assert calls.helper_pid is not None and _threads(calls.helper_pid) <= 16 + 128 + 1
    finally:
        calls.close()


def test_a_round_waits_for_no_call_already_past_its_deadline(pool: BlockingCalls) -> None:
    first = pool.call_many("answer", {"hang": ["hang"], "ok": ["ok"]}, timeout=DEADLINE)
    assert first["hang"].stuck and first["ok"].values == ("ok",)
    # The next round's deadline is an hour and the hung call never returns: a round that waited for it would never
    # end. The join's bound only keeps the test from hanging with it.
    rounds: list[dict[str, CallOutcome]] = []
    again = threading.Thread(
        target=lambda: rounds.append(pool.call_many("answer", {"hang": ["hang"], "ok": ["ok"]}, timeout=3600.0)),
        daemon=True,
    )
    again.start()
    again.join(60.0)
    assert rounds, "the round waited for a call already past its deadline"
    (out,) = rounds
    assert out["hang"].stuck and out["hang"].in_flight_seconds >= DEADLINE  # the first round's call, still in flight
    assert out["ok"].values == ("ok",)


def test_a_call_within_its_deadline_is_in_flight_not_stuck(pool: BlockingCalls) -> None:
    out = pool.call_many("answer", {"hang": ["hang"]}, timeout=30.0, wait=0.1)
    assert not out["hang"].stuck and out["hang"].values is None and out["hang"].error is None
    assert out["hang"].in_flight_seconds >= 0.1


def test_the_worker_answers_json_as_one_text(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(
        f"import sys, json\nsys.path.insert(0, {str(REPO)!r})\nfrom storwatch.calls._blocking_worker import serve\n"
        "serve({'doc': lambda path: json.dumps({'path': path.decode(), 'words': 'a  b'})})\n"
    )
    calls = BlockingCalls(command=[sys.executable, "-I", str(script)])
    try:
        out = calls.call_many("doc", {"k": ["/some path"]}, timeout=5.0)["k"]
    finally:
        calls.close()
    assert out.values == () and out.text == '{"path": "/some path", "words": "a  b"}'
    assert sys.executable  # the helper runs under the same interpreter


def test_keys_of_unmounted_mounts_do_not_pile_up(pool: BlockingCalls) -> None:
    """Pod volumes come and go every second: what the pool remembers is bounded by the keys asked for lately, not by
    every key asked for in the last hour (a bound by age alone let 10,000 short-lived volumes add 4 MB of RSS)."""
    for n in range(300):
        keys = {f"vol-{n}-{i}": [f"ok-{n}-{i}"] for i in range(10)}
        out = pool.call_many("answer", keys, timeout=DEADLINE)
        assert all(o.values for o in out.values())
    assert pool.remembered() <= 2 * MIN_KEYS_KEPT
    assert pool.remembered() >= MIN_KEYS_KEPT // 2  # the recent ones are still known (their order of service)


def test_a_helper_slow_to_start_is_waited_for_and_its_start_is_not_the_calls_time(tmp_path: Path) -> None:
    """On a node whose CPUs are all busy, a new helper's interpreter can take seconds to start. Its first round is
    still answered in time: the deadlines (and the round) count from the helper's ``ready``, not from its start."""
    script = tmp_path / "worker.py"
    script.write_text("import time\ntime.sleep(1.5)  # a slow start, three deadlines long\n" + WORKER)
    calls = BlockingCalls(command=[sys.executable, "-I", str(script)])
    try:
        out = calls.call_many("answer", {"ok": ["ok"]}, timeout=0.5)
        assert out["ok"].values == ("ok",) and not out["ok"].stuck, out
    finally:
        calls.close()


def test_a_helper_that_exits_before_it_is_ready_fails_the_calls_at_once(tmp_path: Path) -> None:
    calls = BlockingCalls(command=[sys.executable, "-I", "-c", "pass"])
    try:
        out = calls.call_many("answer", {"ok": ["ok"]}, timeout=0.5, wait=60)
        assert out["ok"].values is None and out["ok"].error, out
    finally:
        calls.close()


# -- pools sharing one helper


@pytest.fixture
def shared(tmp_path: Path):  # type: ignore[no-untyped-def]
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    helper = Helper([sys.executable, "-I", str(script)])
    first = BlockingCalls(max_inflight=2, max_stuck=2, helper=helper)
    second = BlockingCalls(max_inflight=2, max_stuck=2, helper=helper)
    yield first, second
    first.close()
    second.close()


def test_pools_sharing_a_helper_get_their_own_answers_from_one_process(
    shared: tuple[BlockingCalls, BlockingCalls],
) -> None:
    first, second = shared
    # The same key in both pools, asked at once: each gets the answer to its own request.
    outs: dict[str, dict[str, CallOutcome]] = {}
    asking = [
        threading.Thread(target=lambda: outs.update(first=first.call_many("answer", {"k": ["one"]}, timeout=30.0))),
        threading.Thread(target=lambda: outs.update(second=second.call_many("answer", {"k": ["two"]}, timeout=30.0))),
    ]
    for t in asking:
        t.start()
    for t in asking:
        t.join(60.0)
    assert outs["first"]["k"].values == ("one",) and outs["second"]["k"].values == ("two",)
    assert first.helper_pid is not None and first.helper_pid == second.helper_pid


def test_one_pools_stuck_calls_take_no_slot_of_another(shared: tuple[BlockingCalls, BlockingCalls]) -> None:
    first, second = shared
    hung = {f"hang{i}": [f"hang{i}"] for i in range(6)}
    for _ in range(3):
        first.call_many("answer", hung, timeout=DEADLINE)
    assert first.stuck() == 2  # its stuck set is full: it calls nothing new
    assert first.call_many("answer", {"new": ["new"]}, timeout=DEADLINE)["new"].skipped
    # The other pool's bounds are its own: its new keys are called, in the same process.
    out = second.call_many("answer", {f"ok{i}": [f"ok{i}"] for i in range(4)}, timeout=30.0)
    assert all(o.values == (k,) for k, o in out.items()), out
    assert second.stuck() == 0 and second.helper_pid == first.helper_pid


def test_the_helper_stops_when_its_last_pool_closes(shared: tuple[BlockingCalls, BlockingCalls]) -> None:
    first, second = shared
    assert first.call_many("answer", {"a": ["a"]}, timeout=30.0)["a"].values == ("a",)
    pid = first.helper_pid
    assert pid is not None
    first.close()
    assert first.call_many("answer", {"a": ["a"]}, timeout=30.0)["a"].error == "shutting down"
    # The other pool still uses the same process.
    assert second.call_many("answer", {"b": ["b"]}, timeout=30.0)["b"].values == ("b",)
    assert second.helper_pid == pid
    second.close()
    assert second.helper_pid is None
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # killed and reaped by close
            os.kill(pid, 0)
            time.sleep(0.05)


def test_a_shared_helper_that_exits_fails_every_pools_calls_and_is_started_again(
    shared: tuple[BlockingCalls, BlockingCalls],
) -> None:
    first, second = shared
    assert second.call_many("answer", {"hang": ["hang"]}, timeout=3600.0, wait=0.1)["hang"].in_flight_seconds >= 0.1
    pid = second.helper_pid
    out = first.call_many("answer", {"x": ["exit"]}, timeout=30.0)
    assert out["x"].error == "helper process exited"
    # The other pool's call in flight is failed too, at once, not at its deadline an hour on (the reader of the
    # helper's output tells each pool in turn: this waits for that, bounded).
    for _ in range(600):
        if second.in_flight() == 0:
            break
        time.sleep(0.05)
    assert second.call_many("answer", {"hang": ["hang"]}, timeout=3600.0, wait=0.1)["hang"].error == (
        "helper process exited"
    )
    assert first.call_many("answer", {"a": ["a"]}, timeout=30.0)["a"].values == ("a",)
    assert second.call_many("answer", {"b": ["b"]}, timeout=30.0)["b"].values == ("b",)
    assert first.helper_pid is not None and first.helper_pid == second.helper_pid != pid


def test_a_helper_whose_output_ended_is_replaced_though_it_lives_on(
    shared: tuple[BlockingCalls, BlockingCalls],
) -> None:
    """A helper whose output has ended can answer nothing, whether it is still exiting (not yet reaped: the moment
    after any exit) or lives on: the next call goes to a new one, and the old one is killed."""
    first, second = shared
    assert first.call_many("answer", {"a": ["a"]}, timeout=30.0)["a"].values == ("a",)
    muted = first.helper_pid
    assert muted is not None
    assert first.call_many("answer", {"m": ["mute"]}, timeout=30.0)["m"].error == "helper process exited"
    assert second.call_many("answer", {"b": ["b"]}, timeout=30.0)["b"].values == ("b",)
    assert first.call_many("answer", {"a": ["a"]}, timeout=30.0)["a"].values == ("a",)
    assert first.helper_pid is not None and first.helper_pid == second.helper_pid != muted
    with pytest.raises(ProcessLookupError):
        os.kill(muted, 0)  # killed and reaped when the new one started


def test_a_word_that_is_not_utf8_goes_out_escaped_and_never_raises(pool: BlockingCalls) -> None:
    """A request's words after its path may come from disk (a name holding undecodable bytes, as surrogates): they go
    out escaped, and the helper answers for that call alone (here an error: the operation takes one word)."""
    out = pool.call_many("answer", {"odd": ["ok", "caf\udce9"], "plain": ["ok"]}, timeout=30.0)
    assert out["odd"].error is not None and out["odd"].values is None, out["odd"]
    assert out["plain"].values == ("ok",)
