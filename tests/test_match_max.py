"""ReduceMax, MaxPool and Softmax come back as the operator they were imported from.

Each one-node model is translated, instantiated (original operator preferred, as the pipeline
does at depth 0, and from the table alone), assembled and run in ONNX Runtime against the
original: the emitted nodes must be that one operator, with the original's output. Near misses
are refused with their reason, and no matcher of sums takes a maximum.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from reduce_cases import MAX_POOLS, REDUCE_MAXES, SOFTMAXES, max_pool
from round_trips import depth0, round_trip
from test_importers import build, run_ort

from einopt import L, Sum, iters, tensor
from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.core.parser import parse
from einopt.core.rewrite import transform
from einopt.frontend.importers import translate_single_node
from einopt.frontend.importers_max import softmax
from einopt.frontend.operand import Operand as SourceOperand
from einopt.instantiate.emit import instantiate
from einopt.instantiate.match import MATCHERS, match
from einopt.instantiate.match_contrib_attention import ATTENTION_MATCHERS
from einopt.instantiate.match_max import (
    MAX_MATCHERS,
    match_max_pool,
    match_reduce_max,
    match_softmax,
    reads_maxima,
    takes_maxima,
)
from einopt.instantiate.plan import NO_MATCH_CONTEXT, MatchContext, Operand, OperatorMatch, Refusal
from einopt.runtime.verify import subgraph_model
from einopt.search import Budget, search

F32 = np.float32


# A reduction over no axis is a copy, not a ReduceMax.
CASES = [c for c in REDUCE_MAXES if "noop_with_empty_axes" not in c.attrs] + MAX_POOLS + SOFTMAXES


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.op}-{c.id}")
@pytest.mark.parametrize("prefer", [True, False], ids=["preferred", "table"])
def test_round_trip_is_the_one_original_operator(case, prefer):
    assert round_trip(case, prefer, every_part=True) == collections.Counter({case.op: 1})


@pytest.mark.parametrize("case", [MAX_POOLS[2], SOFTMAXES[0], SOFTMAXES[4]], ids=lambda c: f"{c.op}-{c.id}")
def test_round_trip_of_extreme_inputs(case):
    model, feeds = build(case)
    scaled = {"x": (feeds["x"] * 5e3 - 1e4).astype(F32)}  # large and negative: -inf padding, overflow
    assert round_trip(case, feeds=scaled, every_part=True) == collections.Counter({case.op: 1})


def _scope(text: str) -> ir.Scope:
    return parse(text)


def test_table_order_takes_a_pooling_window_as_max_pool():
    scope = _scope("L[n:1, c:2, h:3, w:2] Max[r:2, s:2] X[n, c, 2*h + r, 2*w + s] where X: [1, 2, 6, 5]")
    m, _ = match(scope)
    assert m.op_type == "MaxPool" and m.attrs["kernel_shape"] == (2, 2) and m.attrs["strides"] == (2, 2)
    assert isinstance(match_reduce_max(scope), OperatorMatch)  # also a Reshape + ReduceMax


def test_max_pool_computing_fewer_windows_than_the_operator_is_sliced():
    scope = _scope("L[n:1, c:1, h:2] Max[r:2] X[n, c, 2*h + r] where X: [1, 1, 7]")
    m = match_max_pool(scope)
    assert isinstance(m, OperatorMatch) and [type(st).__name__ for st in m.post] == ["Slice"]


def test_reduce_max_of_a_transposed_read_and_old_opsets():
    scope = _scope("L[i:4] Max[j:3] X[j, i] where X: [3, 4]")
    m = match_reduce_max(scope, MatchContext(opset=13))
    assert isinstance(m, OperatorMatch) and m.attrs["axes"] == (0,)
    m18 = match_reduce_max(scope, MatchContext(opset=18))
    assert "axes" not in m18.attrs and len(m18.operands) == 2


@pytest.mark.parametrize(
    "text, matcher, reason",
    [
        ("L[i:3] Sum[j:4] X[i, j] where X: [3, 4]", match_reduce_max, "not a maximum"),
        ("L[i:3] Max[j:4] X[i, j] * 2.0 where X: [3, 4]", match_reduce_max, "not one read"),
        ("L[i:3, j:4] Max[k:2] X[i, j] where X: [3, 4]", match_reduce_max, "not read"),
        (
            "L[n:1, c:1, h:4] Max[r:3] X[n, c, h + r - 1] where X: [1, 1, 4]",
            match_max_pool,
            "read outside X as 0",
        ),
        ("L[n:1, c:1, h:3] Max[r:2] X[n, c, h + r + 1] where X: [1, 1, 5]", match_max_pool, "not a window"),
        ("L[n:1, c:2, h:3] Max[r:2] X[c, n, h + r] where X: [2, 1, 5]", match_max_pool, "not read whole"),
        (
            "L[n:1, c:1, h:3] Max[r:2] X[n, c, h + r] + Y[h] where X: [1, 1, 5], Y: [3]",
            match_max_pool,
            "not its -inf padding",
        ),
        (
            "L[i:2, j:3] exp(X[i, j] - {L[a:2] Max[b:3] X[a, b]}[i]) / {L[a:2] Sum[b:3] exp(X[a, b])}[i]"
            " where X: [2, 3]",
            match_softmax,
            "not exp(X - max) / sum(exp(X - max))",
        ),
        (
            "L[i:2, j:3] exp(X[i, j] - {L[a:2] Max[b:3] X[a, b]}[i]) * 2.0 where X: [2, 3]",
            match_softmax,
            "not a quotient",
        ),
    ],
    ids=[
        "sum",
        "scaled",
        "unread",
        "zero-padding",
        "offset",
        "transposed",
        "extra-term",
        "sum-of-unshifted",
        "no-sum",
    ],
)
def test_near_misses(text, matcher, reason):
    r = matcher(_scope(text), NO_MATCH_CONTEXT)
    assert isinstance(r, Refusal) and reason in r.reason, r


def test_softmax_of_an_element_wise_input_takes_it_as_its_input_scope():
    # A transposed read (a layout the normal form inlined) and scaled, masked scores: Softmax reads
    # a scope of the expression, which is materialised on its own.
    for x, xm in (("X[j, i]", "X[b, a]"), ("X[i, j] * 0.125 + K[j]", "X[a, b] * 0.125 + K[b]")):
        scope = _scope(
            f"L[i:2, j:3] exp({x} - {{L[a:2] Max[b:3] {xm}}}[i])"
            f" / {{L[a:2] Sum[b:3] exp({xm} - {{L[a:2] Max[b:3] {xm}}}[a])}}[i] where X: [3, 3], K: [3]"
        )
        m = match_softmax(scope)
        assert isinstance(m, OperatorMatch), m
        (operand,) = m.operands
        assert isinstance(operand.source, ir.Scope) and operand.source.shape == (2, 3)
        assert m.attrs == {"axis": 1} and len(m.consumes) == 2
    # Inlined into the maximum and the sum only (as the normal form leaves a bound input): the same.
    bound = _scope("L[c:2, d:3] X[c, d] * 0.125 where X: [2, 3]")
    text = (
        "L[i:2, j:3] exp(Z[i, j] - {L[a:2] Max[b:3] X[a, b] * 0.125}[i])"
        " / {L[a:2] Sum[b:3] exp(X[a, b] * 0.125 - {L[a:2] Max[b:3] X[a, b] * 0.125}[a])}[i]"
        " where X: [2, 3], Z: [2, 3]"
    )
    parsed = _scope(text)
    z = parsed.body.a.x.a
    scope = parsed.replace(
        body=transform(parsed.body, lambda e: ir.Access(bound, z.indices) if e is z else None)
    )
    m = match_softmax(scope, MatchContext(bound=frozenset({bound})))
    assert isinstance(m, OperatorMatch) and m.operands[0].source is bound


def test_softmax_refuses_a_bound_maximum():
    scope = _scope(
        "L[i:2, j:3] exp(X[i, j] - {L[a:2] Max[b:3] X[a, b]}[i])"
        " / {L[a:2] Sum[b:3] exp(X[a, b] - {L[a:2] Max[b:3] X[a, b]}[a])}[i] where X: [2, 3]"
    )
    assert isinstance(match_softmax(scope), OperatorMatch)
    bound = MatchContext(bound=frozenset({scope.body.a.x.b.source}))
    assert "program binding" in match_softmax(scope, bound).reason


def test_softmax_at_the_end_of_a_deep_program():
    # A translated model nests one scope per node (ViT's attention program 272 deep): the forms are
    # flattened and keyed producers first, never recursing over the nesting.
    i, j, k = iters("i:3 j:3 k:3")
    X, W = tensor("X", (3, 3)), tensor("W", (3, 3))
    chain = []
    for _ in range(3000):
        chain.append(L(i, j)(Sum(k)((chain[-1] if chain else X)[i, k] * W[k, j])))
    scope = softmax(SourceOperand("X", chain[-1], (3, 3), onnx.TensorProto.FLOAT), [1]).y
    m = match_softmax(scope, MatchContext(bound=frozenset(chain)))
    assert isinstance(m, OperatorMatch) and m.operands[0].source is chain[-1], m


def test_softmax_over_the_last_axes_before_and_from_opset_13():
    scope = _scope(
        "L[i:2, j:3, k:4] exp(X[i, j, k] - {L[a:2] Max[b:3, c:4] X[a, b, c]}[i])"
        " / {L[a:2] Sum[b:3, c:4] exp(X[a, b, c] - {L[a:2] Max[b:3, c:4] X[a, b, c]}[a])}[i]"
        " where X: [2, 3, 4]"
    )
    old = match_softmax(scope, MatchContext(opset=11))
    assert old.attrs == {"axis": 1} and not old.post
    new = match_softmax(scope, MatchContext(opset=13))
    assert new.attrs == {"axis": 1} and [type(s).__name__ for s in new.operands[0].steps + new.post] == [
        "Reshape",
        "Reshape",
    ]
    middle = _scope(
        "L[i:2, j:3] exp(X[i, j] - {L[a:3] Max[b:2] X[b, a]}[j])"
        " / {L[a:3] Sum[b:2] exp(X[b, a] - {L[a:3] Max[b:2] X[b, a]}[a])}[a] where X: [2, 3]".replace(
            "}[a] where", "}[j] where"
        )
    )
    assert match_softmax(middle, MatchContext(opset=13)).attrs == {"axis": 0}
    assert "normalises the axes from one on" in match_softmax(middle, MatchContext(opset=11)).reason


# --------------------------------------------------------------------------
# Matchers of sums never read a maximum
# --------------------------------------------------------------------------


def test_only_matchers_of_maxima_take_a_max_scope():
    scope = _scope("L[i:3, j:5] Max[k:4] A[i, k] * B[k, j] where A: [3, 4], B: [4, 5]")
    m, failures = match(scope)
    assert m is None  # MatMul, Gemm, Einsum would compute a sum of products
    reasons = dict(failures)
    for name in ("MatMul", "Gemm", "Einsum"):
        assert "takes a maximum" in reasons[name].reason
    assert all(takes_maxima(fn) for fn in MAX_MATCHERS.values())
    # and the attention matcher, which fuses a softmax's maximum
    assert not any(
        takes_maxima(fn) for name, fn in MATCHERS.items() if name not in (*MAX_MATCHERS, *ATTENTION_MATCHERS)
    )


def test_no_matcher_of_sums_fuses_a_max_scope():
    # A Gemm's bias form would fuse the inline product scope: a maximum here, so it is refused and
    # the scope is computed on its own.
    scope = _scope(
        "L[i:3, j:5] {L[a:3, b:5] Max[k:4] A[a, k] * B[k, b]}[i, j] + C[j] where A: [3, 4], B: [4, 5], C: [5]"
    )
    m, failures = match(scope)
    assert m is None or all(not s.is_max for s in m.consumes)
    assert any("would fuse a scope that takes a maximum" in r.reason for _, r in failures)


def test_a_marked_matcher_is_trusted_with_maxima():
    def fuses_anything(scope, ctx):
        return OperatorMatch("Identity", (), consumes=tuple(s for s in ir.scopes_in(scope) if s is not scope))

    scope = _scope("L[i:3] {L[a:3] Max[k:4] A[a, k]}[i] where A: [3, 4]")
    assert "takes a maximum as a sum" in match(scope, matchers={"Any": fuses_anything})[1][0][1].reason
    marked = reads_maxima(fuses_anything)
    assert match(scope, matchers={"Any": marked})[0].op_type == "Identity"


def test_a_maximum_an_operand_computes_is_not_fused():
    # A matcher may list the inline scopes it walked through; a maximum its operand computes anyway
    # is not fused by it (LayerNormalization after an attention block).
    scope = _scope("L[i:3] {L[a:3] {L[b:3] Max[k:4] A[b, k]}[a] + 1.0}[i] * 2.0 where A: [3, 4]")
    x = scope.body.a.source
    peak = x.body.a.source

    def lists_everything(s, ctx):
        return OperatorMatch("Identity", (Operand(x),), consumes=(x, peak))

    assert match(scope, matchers={"Any": lists_everything})[0].op_type == "Identity"

    def fuses(s, ctx):
        return OperatorMatch("Identity", (Operand(ir.Tensor("A", (3, 4))),), consumes=(x, peak))

    assert match(scope, matchers={"Any": fuses})[0] is None


def test_scaled_masked_scores_then_softmax_come_back_as_they_were():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    mask = numpy_helper.from_array(np.where(rng.random((4, 6)) < 0.3, -1e4, 0.0).astype(F32), "mask")
    scale = numpy_helper.from_array(np.array(0.125, F32), "scale")
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["s"]),
        helper.make_node("Add", ["s", "mask"], ["m"]),
        helper.make_node("Softmax", ["m"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "attention_scores",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 6])],
        [mask, scale],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": (rng.standard_normal((2, 4, 6)) * 1e3).astype(F32)}
    (want,) = run_ort(model, feeds)
    again, ops = depth0(model, prefer=True, every_part=True)
    (got,) = run_ort(again, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert ops["Softmax"] == 1 and ops["eop"] == 0, ops


# The 1-D dilated, padded pooling of ``scripts/fuzz.py`` seed 0 graph 268, and the padded ones above.
_PADDED_POOLS = [
    max_pool("1d-dilated-padded", (1, 3, 3), kernel_shape=[2], dilations=[2], pads=[1, 1]),
    *(c for c in MAX_POOLS if "pad" in c.id or c.id.startswith("2d-same")),
]
# Every special value but NaN (ONNX Runtime passes a NaN only as a window's first value, see
# importers_max), and no float32's lowest (ONNX Runtime's window of -inf alone, read as -inf).
_EXTREMES = np.array([0.0, -0.0, np.inf, -np.inf, 1e30, -1e30, 3e38, 1.5, -2.0], F32)


@pytest.mark.parametrize("case", _PADDED_POOLS, ids=lambda c: c.id)
def test_padding_penalty_is_exact_on_infinite_inputs(case):
    # The penalty scope is 0 inside X and -inf on the padding, added to X's reads (0 outside X):
    # 0 + -inf, never inf + -inf or -inf * 0, in the translation, in every form the search
    # finds and in each one's emitted ONNX (a MaxPool, or an eOperator of Pad, Gather, Add and
    # ReduceMax).
    model, _ = build(case)
    program, _ = translate_single_node(model)
    (x_name,), (y_name,) = [t.name for t in program.inputs], program.outputs
    candidates = search(program, budget=Budget(max_depth=3, states_per_search=300)).candidates
    assert len(candidates) > 1  # eOperators besides MaxPool: split and offset maxima, relayouts
    lowest = np.finfo(F32).min
    rng = np.random.default_rng(0)
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    feeds = [{"x": rng.choice(_EXTREMES, shape)} for _ in range(8)]
    for c in candidates:
        inst = instantiate(
            c.program, onnx_names={x_name: "x", y_name: "y"}, constants={}, opset=17, prefix="p/"
        )
        emitted = subgraph_model(model, inst.nodes, feeds[0], ["y"], inst.initializers, inst.functions)
        for f in feeds:
            (want,) = run_ort(model, f)
            want = np.where(want == lowest, -np.inf, want)
            np.testing.assert_array_equal(evaluate(program, {x_name: f["x"]})[y_name], want)
            np.testing.assert_array_equal(evaluate(c.program, {x_name: f["x"]})[y_name], want)
            (got,) = run_ort(emitted, f)
            np.testing.assert_array_equal(np.where(got == lowest, -np.inf, got), want)
