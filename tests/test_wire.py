"""The checkpoint records across the helper's pipe (storwatch/checkpoints/record.py to_wire, from_wire): a unit's
answer goes as JSON and comes back equal; an answer of the wrong shape (the helper reads tenant files: its answer
is checked like any other input) is refused with an error that names the field."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from storwatch.checkpoints.record import (
    Checkpoint,
    DeepAnswer,
    Run,
    Temp,
    UnitAnswer,
    WireError,
    applied,
    from_wire,
    to_wire,
)
from storwatch.checkpoints.scan import DatasetDir


def _answer() -> UnitAnswer:
    def ckpt(run: int, step: int) -> Checkpoint:
        return Checkpoint(
            path=f"/ckpt/run-{run}/checkpoint-{step}",
            format="hf-trainer",
            verdict="complete",
            reason="every file checks",
            size_bytes=(run + 1) * 1000 + step,
            mtime=1.7e9 + step,
            write_seconds=None if step % 2 else 12.5,
            notes=("an unknown class read as an inert record",) if step == 3 else (),
            claimed_pid=4103 if step == 4 else None,
        )

    runs = tuple(
        Run(f"/ckpt/run-{r}", tuple(ckpt(r, s) for s in range(5)), (Temp(f"/ckpt/run-{r}/.tmp", r % 2 == 0, 7),))
        for r in range(20)
    )
    return UnitAnswer(
        "/ckpt",
        runs,
        False,
        None,
        None,
        1.25,
        {"zip": 2},
        {"pid": 1},
        (DatasetDir("/ckpt/data", 3, 3000, 1.7e9),),
        1,
        ("/ckpt/secret",),
    )


def _wire(record: Any) -> Any:
    return json.loads(json.dumps(to_wire(record), allow_nan=False))


def test_an_answer_goes_across_as_asdict_writes_it_and_comes_back_equal() -> None:
    answer = _answer()
    assert json.dumps(to_wire(answer)) == json.dumps(dataclasses.asdict(answer))
    assert from_wire(UnitAnswer, _wire(answer)) == answer
    deep = DeepAnswer(answer.runs[0].checkpoints[0], {"crc": 1})
    assert from_wire(DeepAnswer, _wire(deep)) == deep


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            lambda d: d["runs"][3]["checkpoints"][2].__setitem__("size_bytes", "12"),
            "UnitAnswer.runs[3].checkpoints[2].size_bytes: a whole number expected, got '12'",
            id="string-for-int",
        ),
        pytest.param(
            lambda d: d["runs"][0]["checkpoints"][1].__setitem__("size_bytes", True),
            "UnitAnswer.runs[0].checkpoints[1].size_bytes: a whole number expected, got True",
            id="bool-for-int",
        ),
        pytest.param(
            lambda d: d["runs"][1]["checkpoints"][0].pop("verdict"),
            "UnitAnswer.runs[1].checkpoints[0].verdict: missing",
            id="missing",
        ),
        pytest.param(
            lambda d: d.__setitem__("runs", {}), "UnitAnswer.runs: a list expected, got dict", id="not-a-list"
        ),
        pytest.param(
            lambda d: d["runs"][2]["temps"][0].__setitem__("writing", "yes"),
            "UnitAnswer.runs[2].temps[0].writing: true or false expected, got 'yes'",
            id="string-for-bool",
        ),
        pytest.param(
            lambda d: d["check_errors"].__setitem__("zip", 1.5),
            "UnitAnswer.check_errors['zip']: a whole number expected, got 1.5",
            id="dict-value",
        ),
        pytest.param(
            lambda d: d.__setitem__("runs", [7]), "UnitAnswer.runs[0]: an object expected, got int", id="item"
        ),
    ],
)
def test_an_answer_of_the_wrong_shape_is_refused_naming_the_field(change: Any, message: str) -> None:
    data = _wire(_answer())
    change(data)
    with pytest.raises(WireError) as err:
        from_wire(UnitAnswer, data)
    assert str(err.value) == message


def test_a_number_that_is_not_finite_is_refused() -> None:
    data = _wire(_answer())
    bad = copy.deepcopy(data)
    bad["runs"][0]["checkpoints"][0]["mtime"] = float("inf")
    with pytest.raises(WireError, match=r"runs\[0\]\.checkpoints\[0\]\.mtime: a finite number expected"):
        from_wire(UnitAnswer, bad)
    # A null where the field may be null is read as None; where it may not, refused.
    data["runs"][0]["checkpoints"][1]["write_seconds"] = None
    assert from_wire(UnitAnswer, data).runs[0].checkpoints[1].write_seconds is None
    data["runs"][0]["checkpoints"][1]["mtime"] = None
    with pytest.raises(WireError, match=r"checkpoints\[1\]\.mtime"):
        from_wire(UnitAnswer, data)


def test_a_change_is_applied_only_to_the_answer_it_was_made_from() -> None:
    """A rescan's answer names the answer it changes (``base``): its runs replace those of the same path, ``gone``
    ones go, every other run keeps its record (the same object); a change from another answer is refused."""
    held = dataclasses.replace(_answer(), seq=7)
    run_3 = dataclasses.replace(held.runs[3], temps=())
    new_run = Run("/ckpt/run-new", (held.runs[0].checkpoints[0],))
    change = dataclasses.replace(held, runs=(run_3, new_run), seq=8, base=7, gone=("/ckpt/run-5", "/ckpt/never-there"))
    whole = applied(held, from_wire(UnitAnswer, _wire(change)))
    assert whole.seq == 8 and whole.base == 0 and whole.gone == ()
    paths = [r.path for r in whole.runs]
    assert paths == sorted(paths) and "/ckpt/run-5" not in paths and "/ckpt/run-new" in paths
    assert len(whole.runs) == len(held.runs)  # one gone, one new
    by_path = {r.path: r for r in whole.runs}
    assert by_path["/ckpt/run-3"] == run_3
    assert by_path["/ckpt/run-4"] is held.runs[4]
    assert applied(held, held) is held  # a whole answer stands for itself
    with pytest.raises(WireError, match="changes answer 7, and 6 is held"):
        applied(dataclasses.replace(held, seq=6), change)
    with pytest.raises(WireError, match="none is held"):
        applied(None, change)
