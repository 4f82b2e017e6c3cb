"""The ``sync`` action's params, checked when a policy is loaded (each problem naming the field, and the file and line
through the loader), and the run's fields a destination template is filled from."""

from __future__ import annotations

from pathlib import Path

import pytest

from storwatch.actions.base import Entity
from storwatch.actions.checkpoint_sync import template_fields, template_problem
from storwatch.actions.registry import checks
from storwatch.policy.load import PolicyError, load_policy


@pytest.mark.parametrize(
    "params, problems",
    [
        ({}, []),
        (
            {"destination": "/mnt/durable", "template": "{namespace}/{pod}/{run}/{node}/{checkpoint}"},
            [],
        ),
        ({"wait_for_requested_seconds": 20, "reserve_seconds": 10.5}, []),
        ({"template": "{namespace}/{uid}"}, ["params.template: {uid} is not one of"]),
        ({"template": "{run.__class__}"}, ["params.template: {run.__class__} is not one of"]),
        ({"template": "{run!r}"}, ["params.template: {run} is not one of"]),
        ({"template": "{run:>300}"}, ["params.template: {run} is not one of"]),
        ({"template": "{run"}, ["params.template: not a template"]),
        ({"template": "a\x00b"}, ["params.template: must not hold control or format characters"]),
        ({"template": 3}, ["params.template: must be a string, not int"]),
        ({"destination": ""}, ["params.destination: must be 1 to 4096 characters long"]),
        ({"wait_for_requested_seconds": -1}, ["params.wait_for_requested_seconds: must be between 0 and 3600"]),
        ({"wait_for_requested_seconds": True}, ["params.wait_for_requested_seconds: must be a number"]),
        ({"reserve_seconds": "10s"}, ["params.reserve_seconds: must be a number"]),
        ({"reserve_seconds": float("nan")}, ["params.reserve_seconds: must be a number"]),
        ({"root": "/x"}, ["params.root: unknown field (this action takes: destination, reserve_seconds, template,"]),
        (
            {"template": "{x}", "reserve_seconds": -2},
            ["params.template: {x} is not one of", "params.reserve_seconds: must be between 0 and 3600"],
        ),
    ],
    ids=[
        "none",
        "destination-and-template",
        "waits",
        "unknown-field",
        "attribute",
        "conversion",
        "format-spec",
        "unclosed",
        "nul",
        "not-a-string",
        "empty-destination",
        "negative-wait",
        "bool-wait",
        "duration-string",
        "nan",
        "unknown-param",
        "every-problem",
    ],
)
def test_the_params_are_checked(params: dict[str, object], problems: list[str]) -> None:
    found = checks()["sync"](params)
    assert len(found) == len(problems), found
    for got, want in zip(sorted(found), sorted(problems), strict=True):
        assert got.startswith(want), (got, want)


def test_a_destination_outside_the_configured_roots_is_refused_when_the_roots_are_known() -> None:
    from storwatch.actions.checkpoint_sync import _read

    assert _read({"destination": "/mnt/durable"}, ("/mnt/durable", "/fsx/ckpt"))[1] == []
    (problem,) = _read({"destination": "/tmp"}, ("/mnt/durable",))[1]
    assert problem == "params.destination: /tmp is not one of sync.destinations"


def test_the_loader_names_the_file_and_line_of_a_bad_sync_rule(tmp_path: Path) -> None:
    policy = tmp_path / "site.yaml"
    policy.write_text(
        "rules:\n"
        "  - name: copy-on-drain\n"
        "    on: run\n"
        "    when: node_draining == true\n"
        "    actions:\n"
        "      - action: sync\n"
        "        params: {template: '{namespace}/../{run}/{secret}', wait_for_requested_seconds: 9000}\n"
    )
    with pytest.raises(PolicyError) as err:
        load_policy([str(policy)], checks())
    assert err.value.errors == [
        f"{policy}:7: rules[0].actions[0].params: params.template: {{secret}} is not one of {{namespace}}, {{pod}}, "
        "{run}, {node}, {checkpoint}",
        f"{policy}:7: rules[0].actions[0].params: params.wait_for_requested_seconds: must be between 0 and 3600, "
        "not 9000",
    ]


def test_template_problem_allows_literal_text_between_fields() -> None:
    assert template_problem("ckpt/{namespace}-{pod}/{run}") is None
    assert template_problem("no fields at all") is None


def test_the_template_fields_of_a_run() -> None:
    """A run's label is one component, its slashes escaped (and its %, so two labels never give one name); a field
    the run does not have is ``_``, never an empty component."""
    run = Entity(
        "run",
        "alice/run%1",
        {"run": "alice/run%1", "namespace": "train", "pod": "trainer-0", "checkpoint": "step-200.pt"},
    )
    assert template_fields(run, "gpu-node-1") == {
        "namespace": "train",
        "pod": "trainer-0",
        "run": "alice%2Frun%251",
        "node": "gpu-node-1",
        "checkpoint": "step-200.pt",
    }
    bare = Entity("run", "r", {"run": "r", "namespace": None, "pod": None, "checkpoint": None})
    assert template_fields(bare, "") == {"namespace": "_", "pod": "_", "run": "r", "node": "_", "checkpoint": "_"}
