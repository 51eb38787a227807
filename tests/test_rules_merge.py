"""merge_expressions: concat, batch and join; split/merge round trips; ConvTranspose phases."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from rules_support import Example, NearMiss, apply_all, as_program, check_result, contractions, load
from test_rules_split import CONV_TRANSPOSE, strided

from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.core.parser import parse
from einopt.frontend.importers import translate_single_node
from einopt.rules import Apply, derive, get

GCN = """Y1 = L[i:3, f:4] Sum[k:5] X[i, k] * W1[k, f]
Y2 = L[i:3, f:6] Sum[k:5] X[i, k] * W2[k, f]
Z = L[i:3, f:4] Y1[i, f] * Y2[i, f+2]
return Z, Y2 where X: [3, 5], W1: [5, 4], W2: [5, 6]"""

BATCH = """A1 = L[i:3, f:4] Sum[k:5] X[i, k] * W1[k, f]
A2 = L[i:3, f:4] Sum[k:5] H[i, k] * W2[k, f]
Z = L[i:3, f:4] sigmoid(A1[i, f] + A2[i, f])
return Z where X: [3, 5], H: [3, 5], W1: [5, 4], W2: [5, 4]"""

JOIN = """Y0 = L[i:3, j:4] Sum[k:5] A[i+k-1, k] * B[k, j]
Y1 = L[i=3:6, j:4] Sum[k:5] A[i+k-1, k] * B[k, j]
Y = L[i:6, j:4] Y0[i, j] + Y1[i, j]
return Y where A: [6, 5], B: [5, 4]"""

# Phases written by hand: the constants differ, the ranges along q are single values.
PHASES = """P0 = L[q:1, i:4] Sum[k:2] A[2*i + k] * B[k]
P1 = L[q=1:2, i:4] Sum[k:2] A[2*i + k + 1] * B[k]
Y = L[x:8] P0[x%2, x//2] + P1[x%2, x//2]
return Y where A: [9], B: [2]"""


def gates(n: int = 4, hidden: int = 3) -> str:
    """``n`` LSTM-gate-like matmuls on one input and a consumer of all of them."""
    lines = [f"G{g} = L[b:2, j:{hidden}] Sum[k:5] X[b, k] * W{g}[k, j]" for g in range(n)]
    reads = " + ".join(f"sigmoid(G{g}[b, j])" for g in range(n))
    decls = ", ".join(f"W{g}: [5, {hidden}]" for g in range(n))
    return "\n".join([*lines, f"Z = L[b:2, j:{hidden}] {reads}", f"return Z where X: [2, 5], {decls}"])


EXAMPLES = {
    "merge_expressions": [
        Example(GCN),
        Example(BATCH),
        Example(JOIN),
        Example(PHASES),
        Example(gates(3), min_matches=6),
    ],
}

NEAR_MISSES = {
    "merge_expressions": [
        NearMiss(
            "Y1 = L[i:3, j:4] Sum[k:4] A[i, k] * B[k, j]\nY2 = L[i:3, j:4] Sum[k:4] A[i, k+1] * B[k, j]\n"
            "return Y1, Y2 where A: [3, 5], B: [4, 4]",
            "bodies differ in A[i, k] vs A[i, k+1]",
        ),
        NearMiss(
            "Y1 = L[i:4] A[i] * B[i]\nY2 = L[i:4] Y1[i] * B[i]\nreturn Y2 where A: [4], B: [4]", "Y2 reads Y1"
        ),
        NearMiss(
            "Y1 = L[i:4] A[i] * B[i]\nY2 = L[i=5:8] A[i] * B[i]\nreturn Y1, Y2 where A: [8], B: [8]",
            "not adjacent",
        ),
        NearMiss(
            "Y1 = L[i:4] Sum[k:3] A[i, k]\nY2 = L[i:4] Sum[k:4] C[i, k]\nreturn Y1, Y2 where A: [4, 3], C: [4, 4]",
            "summation ranges differ",
        ),
        NearMiss(
            "Y1 = L[i:3, f:4] Sum[k:5] X[i, k] * W1[k, f]\nY2 = L[i:3, f:3] Sum[k:5] X[i, k] * W2[k, 2*f]\n"
            "return Y1, Y2 where X: [3, 5], W1: [5, 4], W2: [5, 6]",
            "not a plain index",
        ),
    ],
}


def _apply(text_or_program, summary: str) -> ir.Program:
    program = parse(text_or_program) if isinstance(text_or_program, str) else text_or_program
    (after,) = [a for m, a in apply_all("merge_expressions", program) if summary in m.summary]
    return after


def test_gcn_concat_shares_the_input_and_redirects_readers():
    after = _apply(GCN, "concat Y1, Y2 along f into M")
    m = after.scope("M")
    assert [(it.name, it.hi) for it in m.traversal] == [("i", 3), ("f", 10)]
    assert [n for n, _ in after.bindings] == ["M", "Y2", "Z"]  # Y1 is read only inside its range: dropped
    assert "Z = L[i:3, f:4] M[i, f] * M[i, f+6]" in str(after)
    assert "Y2 = L[i:3, f:6] M[i, f+4]" in str(after)


def test_batch_stacks_the_differing_operands():
    after = _apply(BATCH, "batch A1, A2 into M")
    m = after.scope("M")
    assert [(it.name, it.hi) for it in m.traversal] == [("b", 2), ("i", 3), ("f", 4)]
    assert "Z = L[i:3, f:4] sigmoid(M[0, i, f] + M[1, i, f])" in str(after)
    assert [n for n, _ in after.bindings] == ["M", "Z"]


def test_four_gates_merge_in_three_concat_steps():
    program = parse(gates(4))
    trace = derive(
        program,
        [
            Apply("merge_expressions", "G0, G1", "concat"),
            Apply("merge_expressions", "M, G2", "concat"),
            Apply("merge_expressions", "M1, G3", "concat"),
        ],
    )
    result = trace.result
    assert [n for n, _ in result.bindings] == ["M", "Z"]
    assert [(it.name, it.hi) for it in result.scope("M").traversal] == [("b", 2), ("j", 12)]
    assert (
        "Z = L[b:2, j:3] sigmoid(M[b, j]) + sigmoid(M[b, j+3]) + sigmoid(M[b, j+6]) + sigmoid(M[b, j+9])"
        in str(result)
    )


def test_join_collapses_the_recombination_back_to_the_original():
    original = load("L[i:6, j:4] Sum[k:5] A[i+k-1, k] * B[k, j] where A: [6, 5], B: [5, 4]")
    assert _apply(JOIN, "join Y0, Y1 along i") is original


def test_join_with_differing_constants_on_single_values():
    after = _apply(PHASES, "join P0, P1 along q")
    assert "M = L[q:2, i:4] Sum[k:2] A[2*i+k+q] * B[k]" in str(after)
    assert "Y = L[x:8] M[x%2, x//2]" in str(after)


def _conv_transpose_program() -> ir.Program:
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node],
        "ct",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 2, 4, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    # ConvTranspose is translated only with a finite constant weight (its gather form multiplies
    # inserted zeros by it); the program still reads it as the input tensor w.
    program, _ = translate_single_node(model, {"w": np.ones((3, 2, 4, 4), np.float32)})
    return program


def phase_steps(y: str, h: str = "h", w: str = "w") -> list[Apply]:
    """ConvTranspose stride 2 -> four phase convolutions -> one convolution over (phase, position)."""
    return [
        Apply("split_expression", y, f"split {h} of {y} by residue 2"),
        Apply("split_expression", f"{y}0", f"split {w} of {y}0 by residue 2"),
        Apply("split_expression", f"{y}1", f"split {w} of {y}1 by residue 2"),
        Apply("merge_expressions", f"{y}00, {y}01"),
        Apply("merge_expressions", f"{y}10, {y}11"),
        Apply("merge_expressions", "M, M1"),
        Apply("merge_expressions", f"{y}0, {y}1"),
    ]


def test_conv_transpose_splits_into_four_phases_and_merges_into_one_conv():
    for program, (h, w) in ((_conv_transpose_program(), ("o0", "o1")), (load(CONV_TRANSPOSE), ("h", "w"))):
        y = program.outputs[0]
        trace = derive(program, phase_steps(y, h, w))
        phases = trace.steps[2].program
        assert [n for n, _ in phases.bindings] == [
            f"{y}00",
            f"{y}01",
            f"{y}0",
            f"{y}10",
            f"{y}11",
            f"{y}1",
            y,
        ]
        result = trace.result
        assert [n for n, _ in result.bindings] == ["M2", "M", y]
        conv = result.scope("M2")
        assert [(it.name, it.hi) for it in conv.traversal] == [
            ("n", 1),
            ("f", 2),
            (f"{h}r", 2),
            (f"{h}q", 4),
            (f"{w}r", 2),
            (f"{w}q", 4),
        ]
        text = str(result)
        assert f"M = L[n:1, f:2, {h}r:2, {h}q:4, {w}:8] M2[n, f, {h}r, {h}q, {w}%2, {w}//2]" in text
        assert f"{y} = L[n:1, f:2, {h}:8, {w}:8] M[n, f, {h}%2, {h}//2, {w}]" in text
        check_result(program, result)


def test_rebound_scopes_keep_their_pad():
    text = GCN.replace("Y2 = L[i:3, f:6]", "Y2 = L[i:3, f:6 | pad 0:0, 1:1]")
    after = _apply(text, "concat")
    assert after.scope("Y2").pad == ((0, 0), (1, 1))


def test_independent_bodies_with_other_shapes_are_not_candidates():
    program = parse("Y1 = L[i:4] A[i] * B[i]\nY2 = L[i:4] relu(A[i])\nreturn Y1, Y2 where A: [4], B: [4]")
    assert list(get("merge_expressions").match(program)) == []


# --------------------------------------------------------------------------
# Random programs
# --------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.one_of(contractions(max_sums=2), strided().map(lambda case: case[0])), st.data())
def test_split_then_join_gives_back_the_original(scope, data):
    program = as_program(scope)
    matches = get("split_expression").matches(program)
    if not matches:
        return
    m = data.draw(st.sampled_from(matches))
    current = get("split_expression").apply(program, m)
    parts = list(m["names"])
    while len(parts) > 1:
        a, b = parts[0], parts[1]
        (join,) = [
            j for j in get("merge_expressions").matches(current) if j.summary.startswith(f"join {a}, {b}")
        ]
        current = get("merge_expressions").apply(current, join)
        check_result(program, current)
        parts = [join["name"], *parts[2:]]
    if m["mode"] == "range":
        assert current is program
    else:
        assert len(current.bindings) == 2


@st.composite
def matmul_pairs(draw):
    """Two matmuls: sharing the input (different weights, maybe sizes) or on different inputs."""
    m, k = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    n1, n2 = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    shared = draw(st.booleans())
    second = "X" if shared else "H"
    n2 = n2 if shared else n1
    offset = draw(st.sampled_from(["", "", "+1", "-1"]))
    text = (
        f"Y1 = L[i:{m}, f:{n1}] Sum[k:{k}] X[i, k{offset}] * W1[k, f]\n"
        f"Y2 = L[i:{m}, f:{n2}] Sum[k:{k}] {second}[i, k{offset}] * W2[k, f]\n"
        f"Z = L[i:{m}, f:{min(n1, n2)}] Y1[i, f] + Y2[i, f]\n"
        f"return Z, Y2 where X: [{m}, {k}], H: [{m}, {k}], W1: [{k}, {n1}], W2: [{k}, {n2}]"
    )
    return parse(text), shared


@settings(max_examples=40, deadline=None)
@given(matmul_pairs())
def test_random_matmul_pairs(case):
    program, shared = case
    summaries = [m.summary for m, _ in apply_all("merge_expressions", program)]
    if shared:
        assert "concat Y1, Y2 along f into M" in summaries
    else:
        assert "batch Y1, Y2 into M" in summaries


def test_matmul_pair_values_with_numpy():
    program = parse(GCN)
    after = _apply(GCN, "concat")
    rng = np.random.default_rng(0)
    inputs = {t.name: rng.standard_normal(t.shape) for t in program.inputs}
    want, got = evaluate(program, inputs), evaluate(after, inputs)
    np.testing.assert_allclose(got["Z"], want["Z"])
    np.testing.assert_allclose(got["Y2"], inputs["X"] @ inputs["W2"])


def test_bodies_zip_when_only_their_reads_differ():
    """Two scopes merge only when their operator structure (skeleton) agrees: the same operators,
    functions, parameters and constants, reads of the same ranks in the same places."""
    from einopt.rules.merge import scope_skeleton, zip_bodies

    i, j = ir.Iter("i", 0, 3), ir.Iter("j", 0, 4)
    A, B, C = ir.Tensor("A", (3, 4)), ir.Tensor("B", (4, 3)), ir.Tensor("C", (3,))

    def body(x, y, c=2.0, fn="leaky_relu", p=0.1):
        return ir.Unary(fn, x * y + c, p if fn == "leaky_relu" else None)

    e1 = body(A[i, j], C[i])
    e2 = body(B[j, i], C[2 - i])
    assert scope_skeleton(ir.Scope((i, j), (), e1)) == scope_skeleton(ir.Scope((i, j), (), e2))
    assert zip_bodies(e1, e2) == [(A[i, j], B[j, i]), (C[i], C[2 - i])]
    for other in (
        body(A[i, j], C[i], c=3.0),
        body(A[i, j], C[i], p=0.2),
        body(A[i, j], C[i], fn="relu"),
        body(A[i, j], A[i, j]),
        ir.Unary("leaky_relu", A[i, j] + C[i] + 2.0, 0.1),
    ):
        assert scope_skeleton(ir.Scope((i, j), (), other)) != scope_skeleton(ir.Scope((i, j), (), e1))
    assert scope_skeleton(ir.Scope((i,), (j,), e1)) != scope_skeleton(ir.Scope((i, j), (), e1))
