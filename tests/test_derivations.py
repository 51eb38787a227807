"""The paper's derivations (einopt.rules.paper): every step checked, the result instantiated.

Each derivation applies named rules in sequence; ``derive`` checks every step
against the program before it with the reference interpreter (float64, and
exact integers where the program allows). The result is then instantiated
with einopt's operator matching and run in ONNX Runtime against the
interpreter, and the operators chosen are compared with what the derivation
is for (e.g. a MatMul plus an OffsetReduce eOperator).
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

import numpy as np
import pytest
from test_instantiate import run_onnx

from einopt.core import ir
from einopt.core.parser import parse
from einopt.rules import DerivationError, check_equivalent, derive
from einopt.rules.paper import DERIVATIONS

# What the derived program must instantiate to: (materialised scope label, chosen operator) pairs,
# with "eop:" standing for any eOperator.
INSTANTIATED = {
    "fig5": [("Y/1", "MatMul"), ("Y", "eop:OffsetReduce")],
    "fig6": [("Y/1/1", "constant"), ("Y/1", "eop:"), ("Y", "eop:OffsetReduce")],
    "convtranspose_matmul": [("Y/1", "MatMul"), ("Y", "eop:OffsetReduce")],
    "convtranspose_phases": [("Y/1/1", "constant"), ("Y/1", "Conv"), ("Y", "DepthToSpace")],
    "gcn_matmuls": [
        ("M/1", "constant"),
        ("M", "MatMul"),
        ("Y1", "eop:OffsetReduce"),
        ("Y2", "eop:OffsetReduce"),
        ("Z", "Add"),
    ],
    "lstm_gates": [
        ("M/1", "Concat"),
        ("M/2", "constant"),
        ("M", "MatMul"),
        *[(f"pre_{g}", "Slice") for g in "ifgo"],
    ],
    "lstm_gates_batched": [
        ("M2/1", "Add"),
        ("M2/2", "constant"),
        ("M2", "MatMul"),
        *[(f"pre_{g}", "Add") for g in "ifgo"],
    ],
    "g2bmm_dilated": [("Y/1/1", "Reshape"), ("Y/1/2", "Reshape"), ("Y/1", "G2BMM"), ("Y", "Reshape")],
    "im2col": [("Y/1", "eop:"), ("Y", "MatMul")],
    "grouped_conv": [("Y/1/1", "Reshape+Expand"), ("Y/1", "Reshape"), ("Y", "Conv")],
    "prelu_max": [("Y", "MatMul"), ("Z/1/1", "constant"), ("Z/1", "MatMul"), ("Z", "Max")],
    "prelu_leaky": [("Y", "MatMul"), ("Z", "LeakyRelu")],
}


@pytest.fixture(scope="module", params=sorted(DERIVATIONS))
def derivation(request):
    d = DERIVATIONS[request.param]
    return d, d.run()


def test_every_derivation_has_an_instantiation_expectation():
    assert set(INSTANTIATED) == set(DERIVATIONS)


def test_every_step_is_checked_and_the_trace_reads_back(derivation):
    d, trace = derivation
    assert len(trace.steps) == len(d.steps)
    for step, taken in zip(d.steps, trace.steps, strict=True):
        assert taken.rule == step.rule
        assert "float64" in taken.checked
    # Transitively equal; checked directly as well.
    check_equivalent(trace.start, trace.result, d.context())
    text = trace.format()
    for k, taken in enumerate(trace.steps, 2):
        assert f"E{k} = {taken.rule} at {taken.where}: {taken.summary}" in text
    # Every expression in the trace is valid text syntax.
    for p in trace.programs():
        assert parse(str(p)) is p


def test_the_result_instantiates_to_the_intended_operators(derivation):
    d, trace = derivation
    constants = sorted(set(d.weights) | set(d.constants() if d.constants else {}))
    inst, _ = run_onnx(trace.result, constants=constants)
    got = [(c.binding, c.how) for c in inst.choices]
    want = INSTANTIATED[d.name]
    assert len(got) == len(want), got
    for (binding, how), (want_binding, want_how) in zip(got, want, strict=True):
        assert binding == want_binding and how.startswith(want_how), got


def test_fig5_ends_in_a_matmul_shaped_scope_and_an_offset_reduce():
    trace = DERIVATIONS["fig5"].run()
    y = trace.result.scope("Y")
    assert [it.name for it in y.summation] == ["r", "s"]
    (t,) = [s for s in ir.scopes_in(y) if s is not y]
    # Every iterator of the inner scope is in exactly two of (A, K, output): a matmul.
    assert str(t).startswith("L[r:3, s:3, t:6, t1:5, f:4] Sum[c:3] A[t, t1, c] * K[r, s, f, c]")
    assert str(y.body).endswith("[r, s, h+r-1, w+s-1, f]")


def test_fig6_has_four_times_the_output_channels():
    trace = DERIVATIONS["fig6"].run()
    y = trace.result.scope("Y")
    inner = next(s for s in ir.scopes_in(y) if s is not y and s.summation)
    sizes = {it.name: it.extent for it in inner.traversal}
    assert sizes["q"] * sizes["q1"] * sizes["f"] == 4 * 2  # (q, q1, f): 4x the 2 output channels
    assert sorted(it.extent for it in inner.summation) == [3, 3, 3]  # a 3x3 kernel over 3 channels


def test_convtranspose_phases_pass_through_four_stride_one_convolutions():
    d = DERIVATIONS["convtranspose_phases"]
    after_parts = d.steps.index(next(s for s in d.steps if s.rule == "merge_expressions"))
    p = derive(d.program(), d.steps[:after_parts], d.context()).result
    for part in ("Y00", "Y01", "Y10", "Y11"):
        s = p.scope(part)
        # A 2x2 stride-1 convolution: two kernel iterators of extent 2, input read at unit stride.
        assert sorted(it.extent for it in s.summation) == [2, 2, 3], s
        assert "X[n, c, hq-q+1, wq-q1+1]" in str(s.body)
    final = d.run().result.scope("Y")
    assert str(final.body).endswith("[n, 4*f+2*(h%2)+w%2, h//2, w//2]")  # DepthToSpace, CRD order


def test_lstm_gates_become_one_matmul_on_concatenated_x_and_h():
    p = DERIVATIONS["lstm_gates"].run().result
    (matmul,) = [s for s in ir.scopes_in(p) if s.summation]
    assert [it.extent for it in matmul.traversal] == [2, 16] and matmul.summation[
        0
    ].extent == 8  # [x h] @ [W; U]
    assert [n for n, _ in p.bindings] == [
        "M",
        "pre_i",
        "pre_f",
        "pre_g",
        "pre_o",
    ]  # the 8 gate matmuls are gone


def test_lstm_gates_become_one_batched_matmul():
    p = DERIVATIONS["lstm_gates_batched"].run().result
    contractions = [s for s in ir.scopes_in(p) if s.summation]
    assert len(contractions) == 1
    assert [it.extent for it in contractions[0].traversal] == [2, 2, 16]  # (x | h) x batch x 4 gates


def test_the_recorded_traces_in_docs_are_up_to_date():
    root = pathlib.Path(__file__).parent.parent
    spec = importlib.util.spec_from_file_location("derivations_script", root / "scripts" / "derivations.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    recorded = (root / "docs" / "derivations.md").read_text()
    assert recorded == script.render(), "docs/derivations.md is stale: run python scripts/derivations.py"


def test_only_weights_are_constants_and_only_fig6_assumes_a_finite_activation():
    for d in DERIVATIONS.values():
        values = d.values()
        assert set(values) == set(d.weights), d.name
        assert all(np.isfinite(v).all() for v in values.values()), d.name
    assert {n: d.assumed_finite for n, d in DERIVATIONS.items() if d.assumed_finite} == {"fig6": ("A",)}


@pytest.mark.parametrize(
    "name, reason",
    [
        ("fig5", "cannot drop t = -1: the body is 0 there only if K is finite"),
        ("fig6", "the body is 0 at r = -1 only if A is finite"),
    ],
)
def test_without_its_premises_a_derivation_stops_at_the_zero_argument(name, reason):
    d = DERIVATIONS[name]
    with pytest.raises(DerivationError, match=re.escape(reason)):
        derive(d.program(), d.steps, verify=False)
