"""Every rule on what the ONNX importers really produce: no crash, every applied match equal.

The rule tests use hand-written and generated expressions; this runs the
whole registry over the subprograms translated from a sample of the ONNX
backend node suite and a light model zoo network, applies the first matches
of every rule and checks each result with the reference interpreter (where
the program is small enough to evaluate quickly).
"""

from __future__ import annotations

import numpy as np
import pytest

from einopt.core import ir
from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.rules import REGISTRY, Context, Match, check_equivalent
from einopt.testing.onnx_suite import light_model, light_model_paths, node_cases

# Every SAMPLE-th node case (the whole suite takes about 90 s), and a few matches per rule and program.
SAMPLE = 7
PER_RULE = 3
MAX_WORK = 200_000  # elements times summation extent, over all scopes: quick to evaluate in float64


def _programs(model):
    try:
        parts = translate_graph(prepare(model, {}).model)
    except Exception:  # noqa: BLE001 - models the pipeline refuses have nothing to derive
        return []
    return [(p.program, p.constants) for p in parts if p.program is not None]


def _work(p: ir.Program) -> int:
    return sum(
        int(np.prod(s.shape)) * int(np.prod([i.extent for i in s.summation] or [1])) for s in ir.scopes_in(p)
    )


def _exercise(program: ir.Program, constants) -> int:
    ctx = Context(dict(constants))
    check = _work(program) < MAX_WORK
    applied = 0
    for rule in REGISTRY.values():
        for m in [m for m in rule.match(program, ctx) if isinstance(m, Match)][:PER_RULE]:
            new = rule.apply(program, m, ctx)
            if check:
                try:
                    check_equivalent(program, new, ctx, modes=("float64",))
                except Exception as e:
                    raise AssertionError(f"{m}\n{program}\n->\n{new}\n{e}") from None
            applied += 1
    return applied


CASES = node_cases()[::SAMPLE]


@pytest.mark.parametrize("chunk", range(4))
def test_rules_on_node_suite_programs(chunk):
    applied = 0
    for case in CASES[chunk::4]:
        for program, constants in _programs(case.model):
            applied += _exercise(program, constants)
    assert applied > 100  # the importers' forms do offer derivations


def test_rules_on_a_light_model():
    path = next(p for p in light_model_paths() if "squeezenet" in p)
    applied = sum(_exercise(p, c) for p, c in _programs(light_model(path)))
    assert applied > 50
