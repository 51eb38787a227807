"""One binding of a program on its own, and put back: ``binding_program`` and ``put_binding``."""

import numpy as np
import pytest

import einopt
from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.core.rewrite import binding_program, put_binding
from einopt.rules.derive import Apply, apply_rule

# A conv-like binding read by two later ones; y0 has a nonzero origin (t from -1), so reads of it
# through a stand-in tensor must shift.
PROGRAM = """
y0 = L[t=-1:9, f:3] Sum[c:2] X[t, c] * W[f, c]
y1 = L[i:8, f:3] Sum[r:3] y0[i+r-1, f] * K[r]
y2 = L[i:8, f:3] y1[i, f] + y0[i, f]
return y2, y1
where X: [9, 2], W: [3, 2], K: [3]
"""


def _inputs(program: ir.Program, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape) for t in program.inputs}


def test_a_binding_on_its_own_reads_the_bindings_before_it_as_tensors():
    program = einopt.parse(PROGRAM)
    alone = binding_program(program, "y1")
    assert [t.name for t in alone.inputs] == ["K", "y0"] and alone.outputs == ("y1",)
    assert dict(alone.bindings).keys() == {"y1"}
    feeds = _inputs(program)
    y0 = evaluate(program.scope("y0"), feeds)
    want = evaluate(program, feeds)["y1"]
    np.testing.assert_allclose(evaluate(alone, feeds | {"y0": y0})["y1"], want)


def test_putting_a_binding_back_gives_the_program():
    program = einopt.parse(PROGRAM)
    for name, _ in program.bindings:
        assert put_binding(program, name, binding_program(program, name)) is program


def test_a_derived_binding_goes_back_with_its_new_bindings():
    program = einopt.parse(PROGRAM)
    alone = binding_program(program, "y0")
    derived, _ = apply_rule(alone, Apply("split_expression", at="y0", choose="split t of y0 at 4"))
    assert len(derived.bindings) > 1
    out = put_binding(program, "y0", derived)
    assert out.outputs == program.outputs and len(out.bindings) > len(program.bindings)
    feeds = _inputs(program, 1)
    got, want = evaluate(out, feeds), evaluate(program, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12)


def test_put_binding_refuses_what_does_not_fit():
    program = einopt.parse(PROGRAM)
    alone = binding_program(program, "y1")
    with pytest.raises(ir.IRError, match="output must be y2"):
        put_binding(program, "y2", alone)
    other = einopt.parse("y1 = L[i:8, f:3] Z[i, f] * 2\nreturn y1\nwhere Z: [8, 3]")
    with pytest.raises(ir.IRError, match=r"input Z\[8, 3\] is not in the program"):
        put_binding(program, "y1", other)
