"""Cost of a policy condition's evaluation, with the two CEL libraries measured in one run on the same rules and
entities: ``common-expression-language`` (Rust bindings, what storwatch uses) and ``cel-python`` (pure Python).

The rules are the shipped default set (storwatch/policies/default.yaml, macros expanded), the entities those of a View
with facts for every area (the metric catalog test's rich View: 6 mounts, 3 runs, 3 GPUs...), each rule over the
entities of its kind, as the engine calls it. Both libraries must give the same value for every (rule, entity), or the
bench fails. Also measured: one evaluation of an expression at the static bounds (a comprehension over a 64-item list
field of 4096-character strings, its body 40 substring searches and regex matches), the Rust library's worst case held
under the GIL; the worst conditions the estimate still accepts (storwatch.policy.cel.estimate: each shape's count raised
until the loader refuses it), each evaluated in a process of its own over a gpu whose every field is as large as the
schema allows, for its time and how far its resident size rises; and the whole default set through the engine per View.

Usage: .venv/bin/python bench/policy_eval.py [--rounds 200] [--json FILE]   (cel-python: pip install cel-python==0.5.0)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import summary, write_json
from storwatch.actions.base import Entity
from storwatch.policy.cel import compile_expression
from storwatch.policy.engine import Engine
from storwatch.policy.load import load_policy
from storwatch.policy.schema import SCHEMA, entities
from tests.test_metric_catalog import rich_view
from tests.test_policy_cel import EVALUATE_IN_A_CHILD, MEMORY_SHAPES, worst_accepted

ROOT = Path(__file__).resolve().parent.parent


def _celpy_value(value: Any) -> Any:
    import celpy

    return celpy.json_to_cel(value)


def per_evaluation(rounds: int) -> dict[str, Any]:
    policy = load_policy([str(ROOT / "storwatch" / "policies" / "default.yaml")])
    view = rich_view()
    ents = entities(view)
    pairs: list[tuple[Any, Entity]] = [(r, e) for r in policy.rules for e in ents[r.on]]
    activations = [{**policy.lists, **e.fields} for _, e in pairs]

    rust_times: list[float] = []
    rust_values = []
    for _ in range(rounds):
        for (rule, _e), act in zip(pairs, activations, strict=True):
            t0 = time.perf_counter()
            value = rule.expression.evaluate(act)
            rust_times.append(time.perf_counter() - t0)
            if len(rust_values) < len(pairs):
                rust_values.append(value)
    out: dict[str, Any] = {
        "rules": len(policy.rules),
        "evaluations_per_view": len(pairs),
        "rust_us": {k: v * 1e6 if k != "n" else v for k, v in summary(rust_times).items()},
    }

    try:
        limit_before = sys.getrecursionlimit()
        import celpy
    except ImportError:
        out["cel_python"] = "not installed (pip install cel-python==0.5.0)"
        return out
    env = celpy.Environment()
    programs = {r.name: env.program(env.compile(r.when)) for r in policy.rules}
    out["cel_python_recursion_limit"] = {"before": limit_before, "after_compile": sys.getrecursionlimit()}
    py_acts = [{k: _celpy_value(v) for k, v in act.items()} for act in activations]
    py_times: list[float] = []
    mismatches = []
    for i in range(max(1, rounds // 20)):
        for k, ((rule, e), act) in enumerate(zip(pairs, py_acts, strict=True)):
            t0 = time.perf_counter()
            value = programs[rule.name].evaluate(act)
            py_times.append(time.perf_counter() - t0)
            if i == 0 and bool(value) != rust_values[k]:
                mismatches.append(f"{rule.name} {e.key}: rust {rust_values[k]}, cel-python {value}")
    out["cel_python_us"] = {k: v * 1e6 if k != "n" else v for k, v in summary(py_times).items()}
    out["mismatches"] = mismatches
    out["ratio_p50"] = out["cel_python_us"]["p50"] / out["rust_us"]["p50"]
    return out


_OPS = [f"w.contains('z{i}')" for i in range(36)] + ["w.matches('^z[0-9]+q$')"] * 4
WORST = "workloads.exists(w, " + " || ".join("(" + " || ".join(_OPS[i : i + 8]) + ")" for i in range(0, 40, 8)) + ")"
"""A condition near the bounds that no item ends early: 40 substring searches and regex matches per item, in the one
comprehension allowed, over the longest list and strings an entity holds."""


def worst_case(rounds: int) -> dict[str, Any]:
    """One evaluation at the bounds: the one comprehension allowed, over the longest list field allowed."""
    gpu = SCHEMA["gpu"]
    expr = compile_expression(WORST, gpu.names, sizes=gpu.sizes)
    from storwatch.policy.cel import MAX_LIST_ITEMS
    from storwatch.policy.schema import MAX_STRING_CHARS

    workloads = tuple(f"ns/pod-{i:04d}-".ljust(MAX_STRING_CHARS, "w") for i in range(MAX_LIST_ITEMS))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        assert expr.evaluate({"workloads": workloads}) is False  # no item ends the loop early
        times.append(time.perf_counter() - t0)
    return {
        "nodes": expr.analysis.nodes,
        "estimated_cost": expr.analysis.estimate.cost if expr.analysis.estimate else None,
        "chars": len(WORST),
        "us": {k: v * 1e6 if k != "n" else v for k, v in summary(times).items()},
    }


TIME_SHAPES: dict[str, Callable[[int], str]] = {
    "maps of a list field": lambda k: " && ".join(["workloads.map(w, w).size() > 0"] * k),
    "a Unicode class repeated, per item": lambda k: f"workloads.exists(w, w.matches('\\\\d{{{k}}}'))",
    "a Unicode class, per item": lambda k: "workloads.exists(w, " + " || ".join(["w.matches('^\\\\W')"] * k) + ")",
    "the old worst case (40 searches per item)": lambda k: WORST,
}
"""Conditions near the estimated cost's bound, each from a count."""


def worst_accepted_measured(rounds: int) -> dict[str, Any]:
    """The worst conditions still accepted, each in its own process: its time, and how far its resident size rose."""
    gpu = SCHEMA["gpu"]
    out: dict[str, Any] = {}
    for family, shape in {**MEMORY_SHAPES, **TIME_SHAPES}.items():
        source = worst_accepted(shape)
        analysis = compile_expression(source, gpu.names, sizes=gpu.sizes).analysis
        run = subprocess.run(
            [sys.executable, "-c", EVALUATE_IN_A_CHILD, source, str(rounds)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
            check=True,
        )
        measured = json.loads(run.stdout)
        assert analysis.estimate is not None
        out[family] = {
            "source": source,
            "chars": len(source),
            "nodes": analysis.nodes,
            "estimate": {
                "elements": analysis.estimate.elements,
                "chars": analysis.estimate.chars,
                "cost": analysis.estimate.cost,
            },
            "ms": {k: v * 1e3 if k != "n" else v for k, v in summary(measured["seconds"]).items()},
            "rss_growth_kib": measured["growth_kib"],
        }
    return out


def engine_per_view(rounds: int) -> dict[str, Any]:
    policy = load_policy([str(ROOT / "storwatch" / "policies" / "default.yaml")])
    view = rich_view()
    engine = Engine(policy, budget_seconds=float("inf"))
    times = []
    build = []
    for i in range(rounds):
        t0 = time.perf_counter()
        ents = entities(view)
        t1 = time.perf_counter()
        engine.evaluate(ents, view.timestamp + i)
        t2 = time.perf_counter()
        build.append(t1 - t0)
        times.append(t2 - t1)
    return {
        "entities_ms": {k: v * 1e3 if k != "n" else v for k, v in summary(build).items()},
        "evaluate_ms": {k: v * 1e3 if k != "n" else v for k, v in summary(times).items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    result = {
        "per_evaluation": per_evaluation(args.rounds),
        "worst_case_at_bounds": worst_case(max(10, args.rounds // 4)),
        "worst_accepted": worst_accepted_measured(max(10, args.rounds // 10)),
        "engine_per_view": engine_per_view(args.rounds),
    }
    pe = result["per_evaluation"]
    print(f"default set: {pe['rules']} rules, {pe['evaluations_per_view']} evaluations per View of the rich View")
    print(f"  common-expression-language (Rust): p50 {pe['rust_us']['p50']:.1f} us, p99 {pe['rust_us']['p99']:.1f} us")
    if "cel_python_us" in pe:
        py = pe["cel_python_us"]
        print(f"  cel-python:                         p50 {py['p50']:.1f} us, p99 {py['p99']:.1f} us")
        print(f"  ratio (p50): {pe['ratio_p50']:.0f}x; results differing: {len(pe['mismatches'])}")
        lim = pe["cel_python_recursion_limit"]
        print(f"  cel-python recursion limit: {lim['before']} before, {lim['after_compile']} after compiling")
    else:
        print(f"  cel-python: {pe['cel_python']}")
    w = result["worst_case_at_bounds"]
    print(
        f"worst case at the bounds ({w['chars']} chars, {w['nodes']} nodes, 64 items): p50 {w['us']['p50']:.0f} us, "
        f"max {w['us']['max']:.0f} us (GIL held)"
    )
    print(f"  its estimated cost: {w['estimated_cost']} (bound 1000000)")
    print("worst conditions still accepted (each in its own process, every field at its largest):")
    for family, m in result["worst_accepted"].items():
        est = m["estimate"]
        print(
            f"  {family}: {m['chars']} chars, {m['nodes']} nodes; estimate {est['elements']} elements, "
            f"{est['chars']} characters, cost {est['cost']}; p50 {m['ms']['p50']:.2f} ms, max {m['ms']['max']:.2f} "
            f"ms; resident size +{m['rss_growth_kib']} KiB"
        )
    e = result["engine_per_view"]
    print(
        f"engine per View: entities p50 {e['entities_ms']['p50']:.2f} ms, evaluate p50 {e['evaluate_ms']['p50']:.2f} "
        f"ms, p99 {e['evaluate_ms']['p99']:.2f} ms"
    )
    if args.json:
        write_json(args.json, result)
    return 1 if pe.get("mismatches") else 0


if __name__ == "__main__":
    sys.exit(main())
