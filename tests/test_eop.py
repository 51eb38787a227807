"""eOperators: scopes lowered to model-local ONNX functions, run in ONNX Runtime.

Every case wraps the function in a one-node model, checks it with
``onnx.checker`` (full check, which infers shapes through the function body),
runs it in ONNX Runtime (float32) and compares with the float64 reference
interpreter. Tables also pin the structure of the lowering: which operators a
case must or must not use (e.g. layout transforms with ``//`` and ``%`` need no
Gather) and how large its Gather indices get.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import einopt
from einopt import L, tensor
from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.instantiate import EOP_DOMAIN
from einopt.instantiate import eop as eop_module
from einopt.instantiate.eop import EOperator, EOperatorError, eop_name, eoperator

from paper import fig5_chain
from strategies import random_inputs, scopes

_ELEM_TYPES = {
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
    "float16": TensorProto.FLOAT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
}


def _model(e: EOperator, scope: ir.Scope, opset: int) -> onnx.ModelProto:
    """A one-node model calling the eOperator, inputs ``x0, x1, ..`` in source order."""
    inputs = [
        helper.make_tensor_value_info(
            f"x{k}", _ELEM_TYPES[s.dtype] if isinstance(s, ir.Tensor) else TensorProto.FLOAT, list(s.shape)
        )
        for k, s in enumerate(e.sources)
    ]
    node = helper.make_node(e.function.name, [v.name for v in inputs], ["y"], domain=EOP_DOMAIN)
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(scope.shape))
    graph = helper.make_graph([node], "eop_test", inputs, [output])
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(EOP_DOMAIN, 1)],
        functions=[e.function],
        ir_version=10,
    )


def _run(scope: ir.Scope, opset: int = 17, seed: int = 0, integer: bool = False) -> EOperator:
    """Lower, check and run ``scope``; assert ORT agrees with the float64 interpreter."""
    e = eoperator(scope, eop_name(scope), opset)
    model = _model(e, scope, opset)
    onnx.checker.check_model(model, full_check=True)
    # Inputs rounded to their storage type first, so that only arithmetic rounding differs.
    dtypes = {t.name: np.dtype(t.dtype) for t in ir.tensors_in(scope)}
    raw = random_inputs(scope, np.random.default_rng(seed), integer=integer)
    tensors = {name: a.astype(dtypes[name]).astype(np.float64) for name, a in raw.items()}
    feeds = {}
    for k, s in enumerate(e.sources):
        if isinstance(s, ir.Tensor):
            feeds[f"x{k}"] = tensors[s.name].astype(np.dtype(s.dtype))
        else:
            feeds[f"x{k}"] = evaluate(s, tensors).astype(np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, feeds)
    want = evaluate(scope, tensors)
    assert got.shape == want.shape
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)
    return e


def _op_types(e: EOperator) -> set[str]:
    return {n.op_type for n in e.function.node}


def _largest_gather_index(e: EOperator) -> int:
    """Elements of the largest constant index tensor feeding a Gather (0 without Gathers)."""
    constants = {
        n.output[0]: numpy_helper.to_array(n.attribute[0].t)
        for n in e.function.node
        if n.op_type == "Constant"
    }
    return max((constants[n.input[1]].size for n in e.function.node if n.op_type == "Gather"), default=0)


# --------------------------------------------------------------------------
# Hand-written cases
# --------------------------------------------------------------------------

# (id, expression, eop_name, operators it must use, operators it must not use,
#  elements of the largest Gather index: 0 when the reads need no Gather)
CASES = [
    (
        "offset_reduce",
        "L[h:5, w:4, f:3] Sum[r:3, s:3] T[r, s, f, h+r-1, w+s-1] where T: [3, 3, 3, 5, 4]",
        "OffsetReduce",
        {"Slice", "Pad", "Sum"},  # r and s unrolled: nine shifted windows of T
        {"Gather", "Einsum", "ReduceSum"},
        0,
    ),
    (
        "offset_reduce_wide_window",
        "L[h:5, w:4] Sum[r:7, s:5] T[r, s, h+r-3, w+s-2] where T: [7, 5, 5, 4]",
        "OffsetReduce",
        {"Gather", "ReduceSum"},  # 35 windows are too many to unroll
        {"Einsum"},
        35,  # one index over (r, h) and one over (s, w), not over the whole space
    ),
    (
        "window_contraction",
        "L[h:5, f:2] Sum[r:3, c:4] A[h+r-1, c] * K[r, f, c] where A: [5, 4], K: [3, 2, 4]",
        "Contract",
        {"Einsum", "Sum"},
        {"Gather"},
        0,
    ),
    (
        "depth_to_space_dcr",
        "L[n:1, c:2, h:6, w:4] X[n, (h%2)*2*2 + (w%2)*2 + c, h//2, w//2] where X: [1, 8, 3, 2]",
        "Relayout",
        {"Reshape", "Transpose"},
        {"Gather"},
        0,
    ),
    (
        "depth_to_space_crd",
        "L[n:2, c:2, h:4, w:6] X[n, c*4 + (h%2)*2 + w%2, h//2, w//2] where X: [2, 8, 2, 3]",
        "Relayout",
        {"Reshape", "Transpose"},
        {"Gather"},
        0,
    ),
    (
        "space_to_depth",
        "L[n:1, c:8, h:2, w:3] X[n, c%2, h*2 + c//4, w*2 + (c//2)%2] where X: [1, 2, 4, 6]",
        "Relayout",
        {"Reshape", "Transpose"},
        {"Gather"},
        0,
    ),
    (
        "merge_x_times_w_plus_y",
        "L[i:3, j:4] X[i*4 + j] where X: [12]",
        "Relayout",
        {"Reshape"},
        {"Gather"},
        0,
    ),
    ("split_by_div_mod", "L[i:12] X[i//4, i%4] where X: [3, 4]", "Relayout", {"Reshape"}, {"Gather"}, 0),
    (
        "split_with_offset_range",
        "L[i=-4:8, j:2] X[(i+4)//4, i%4, j] where X: [3, 4, 2]",
        "Relayout",
        {"Reshape"},
        {"Gather"},
        0,
    ),
    (
        "reshape_general",
        "L[i:4, j:3] X[(i*3 + j)//2, (i*3 + j)%2] where X: [6, 2]",
        "Relayout",
        {"Gather"},
        set(),
        12,
    ),
    (
        "transpose_shift",
        "L[i:5, j:4] X[j, i-1] where X: [4, 4]",
        "Relayout",
        {"Pad", "Transpose"},
        {"Gather"},
        0,
    ),
    ("strided", "L[i:4] X[2*i + 1] where X: [6]", "Relayout", {"Slice", "Pad"}, {"Gather"}, 0),
    (
        "reversed_out_of_range",
        "L[i=-2:6] X[3 - 2*i] where X: [5]",
        "Relayout",
        {"Slice", "Pad"},
        {"Gather"},
        0,
    ),
    ("diagonal", "L[i:4] X[i, i] where X: [4, 5]", "Relayout", {"Gather"}, set(), 4),
    ("product_index", "L[i:3, j:3] X[i*j] where X: [4]", "Relayout", {"Gather", "Pad"}, set(), 9),
    ("negative_div_mod", "L[i=-4:5] X[i%3, i//3 + 1] where X: [3, 3]", "Relayout", set(), set(), 9),
    ("constant_index", "L[i:3] X[1, 2] where X: [3, 3]", "Relayout", {"Slice", "Expand"}, {"Gather"}, 0),
    ("broadcast_constant", "L[i:3, j:4] X[j] + 1.5 where X: [4]", "AddEop", {"Add", "Expand"}, set(), 0),
    ("add_relu", "L[i:3, j:4] relu(A[i, j] + B[j]) where A: [3, 4], B: [4]", "AddRelu", {"Relu"}, set(), 0),
    (
        "max_leaky_relu",
        "L[i:3, j:4] leaky_relu(max(A[i, j], B[j, i]), 0.1) where A: [3, 4], B: [4, 3]",
        "MaxLeakyRelu",
        {"Max", "LeakyRelu", "Transpose"},
        set(),
        0,
    ),
    (
        "unary_zoo",
        "L[i:5] sigmoid(A[i]) * tanh(A[i]) - exp(min(A[i], 2.0)) / (abs(A[i]) + 1.0) + sqrt(abs(A[i])) + -A[i]"
        " where A: [5]",
        "SigmoidTanhMulMin",
        {"Sigmoid", "Tanh", "Exp", "Min", "Div", "Abs", "Sqrt"},
        set(),
        0,
    ),
    (
        "matmul",
        "L[i:3, j:4] Sum[k:5] A[i, k] * B[k, j] where A: [3, 5], B: [5, 4]",
        "Contract",
        {"Einsum"},
        {"Gather", "Transpose"},
        0,
    ),
    (
        "conv3x3",
        "L[h:4, w:3, f:2] Sum[r:3, s:3, c:2] A[h+r-1, w+s-1, c] * K[r, s, f, c] where A: [4, 3, 2], K: [3, 3, 2, 2]",
        "Contract",
        {"Einsum", "Sum"},
        {"Gather"},
        0,
    ),
    ("reduce", "L[i:3] Sum[k:4] A[i, k] where A: [3, 4]", "Reduce", {"ReduceSum"}, set(), 0),
    ("unused_summation", "L[i:3] Sum[k:4] A[i] * 2.0 where A: [3]", "MulReduce", {"Mul"}, {"ReduceSum"}, 0),
    ("concat", "L[i:7] A[i] + B[i-3] where A: [3], B: [4]", "AddEop", {"Add", "Pad"}, set(), 0),
    ("fill", "L[i:2, j:3] 2.5", "Fill", {"Expand"}, set(), 0),
    (
        "distributed_sum",
        "L[i:3, j:2] Sum[k:4] (A[i, k] + B[k, j]) * C[k] where A: [3, 4], B: [4, 2], C: [4]",
        "AddMulReduce",
        {"Einsum"},
        set(),
        0,
    ),
    ("out_of_range_term", "L[i:3] A[i + 5] + 1.0 where A: [4]", "AddEop", {"Expand"}, set(), 0),
    ("out_of_range_inside", "L[i:3] relu(A[i + 5]) + A[i] where A: [4]", "ReluAdd", set(), set(), 0),
    ("int64_input", "L[i:3] A[2 - i] * 2.0 where A: int64[3]", "MulEop", {"Cast"}, set(), 0),
    ("other_dtypes", "L[i:3] A[i] + B[i] where A: float64[3], B: float16[3]", "AddEop", {"Cast"}, set(), 0),
    ("pad_ignored", "L[i:3 | pad 1:2] A[i] * 2.0 where A: [3]", "MulEop", {"Mul"}, {"Pad"}, 0),
    (
        "reduce_max",
        "L[i:3, k:2] Max[j:4] A[i, j, k] where A: [3, 4, 2]",
        "MaxReduce",
        {"ReduceMax"},
        {"ReduceSum", "Einsum", "Gather"},
        0,
    ),
    (
        "max_pool",  # a 2x2 window of stride 2: s unrolled into two strided reads, r reshaped off
        "L[c:2, h:3, w:2] Max[r:2, s:2] A[c, 2*h + r, 2*w + s] where A: [2, 6, 5]",
        "OffsetMaxReduce",
        {"Max", "Slice", "ReduceMax"},
        {"Gather", "Sum", "ReduceSum"},
        0,
    ),
    (
        "max_window_leaving_the_tensor",  # reads 0 outside A, as the interpreter does
        "L[h:5] Max[r:3] A[h + r - 1] where A: [5]",
        "OffsetMaxReduce",
        {"Max", "Pad"},
        {"Gather"},
        0,
    ),
    (
        "max_wide_window",  # too many copies to unroll: a Gather and a ReduceMax
        "L[h:4] Max[r:30] A[h + r] where A: [33]",
        "OffsetMaxReduce",
        {"ReduceMax", "Gather"},
        set(),
        120,
    ),
    (
        "max_of_expression_unread_iterator",
        "L[i:3] Max[j:4, k:5] exp(A[i, j] - B[j]) where A: [3, 4], B: [4]",
        "SubExpMaxReduce",
        {"ReduceMax", "Exp"},
        {"ReduceSum"},
        0,
    ),
]


@pytest.mark.parametrize(
    ("text", "name", "uses", "avoids", "index_size"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_case_matches_interpreter(text, name, uses, avoids, index_size):
    scope = einopt.parse(text)
    assert eop_name(scope) == name
    e = _run(scope, integer="int64" in text)
    assert e.function.name == name and e.function.domain == EOP_DOMAIN
    assert [(o.domain, o.version) for o in e.function.opset_import] == [("", 17)]
    assert str(scope) in e.function.doc_string
    ops = _op_types(e)
    assert uses <= ops, f"missing {uses - ops} in {sorted(ops)}"
    assert not avoids & ops, f"unexpected {avoids & ops}"
    assert _largest_gather_index(e) == index_size


OPSET_CASES = [
    "reduce_max",
    "max_wide_window",
    "offset_reduce",
    "matmul",
    "transpose_shift",
    "reduce",
    "conv3x3",
    "space_to_depth",
    "diagonal",
]


@pytest.mark.parametrize("opset", [11, 12, 13, 18, 21])
@pytest.mark.parametrize("case", OPSET_CASES)
def test_opsets(case, opset):
    text = next(c[1] for c in CASES if c[0] == case)
    e = _run(einopt.parse(text), opset=opset)
    assert [(o.domain, o.version) for o in e.function.opset_import] == [("", opset)]
    if opset < 12:
        assert "Einsum" not in _op_types(e)


# --------------------------------------------------------------------------
# Nested scopes as sources
# --------------------------------------------------------------------------


def test_offset_reduce_over_a_scope_with_negative_origin():
    """The paper's E4: an OffsetReduce over ``T`` computed on ``t1, t2 = -1:H+1``."""
    e4 = fig5_chain(4, 3, 2, 3)[3]
    box = e4.body.source
    assert box.origin == (0, 0, 0, -1, -1)
    e = _run(e4)
    assert e.sources == (box,)
    assert list(e.function.input) == ["S0"]
    assert eop_name(e4) == "OffsetReduce"
    assert "nested scope, origin [0, 0, 0, -1, -1]" in e.function.doc_string


def test_sources_are_direct_reads_in_first_read_order():
    text = (
        "L[i:3] B[i] * {L[t=-1:4] A[t] * 2.0}[i] + A[i] + {L[t=-1:4] A[t] * 2.0}[i + 1] where A: [3], B: [3]"
    )
    scope = einopt.parse(text)
    inner = scope.body.a.a.b.source
    e = _run(scope)
    assert e.sources == (scope.body.a.a.a.source, inner, scope.body.a.b.source)
    assert [s.name for s in e.sources if isinstance(s, ir.Tensor)] == ["B", "A"]
    assert list(e.function.input) == ["B", "S1", "A"]


def test_names_never_clash_with_tensor_names():
    scope = einopt.parse("L[i:3] S2[i] + Y[i] + {L[t:3] S2[t]}[i] * t1[i] where S2: [3], Y: [3], t1: [3]")
    e = _run(scope)
    assert list(e.function.input) == ["S2", "Y", "S2_1", "t1"]
    assert list(e.function.output) == ["Y_1"]
    produced = [o for n in e.function.node for o in n.output]
    assert len(produced) == len(set(produced)) and not set(produced) & set(e.function.input)


# --------------------------------------------------------------------------
# Names and refusals
# --------------------------------------------------------------------------

NAMES = [
    ("relayout", "L[i:3] A[2 - i] where A: [3]", "Relayout"),
    ("reduce", "L[i:3] Sum[k:2] A[i, k] where A: [3, 2]", "Reduce"),
    ("offset_reduce", "L[i:3] Sum[k:2] A[i + k] where A: [4]", "OffsetReduce"),
    ("contract_scaled", "L[i:3] Sum[k:2] 0.5 * A[i, k] * -B[k] where A: [3, 2], B: [2]", "Contract"),
    ("fused_reduce", "L[i:3] Sum[k:2] relu(A[i, k]) where A: [3, 2]", "ReluReduce"),
    ("first_four_ops", "L[i:3] exp(abs(relu(A[i]) - A[i]) / 2.0) + 1.0 where A: [3]", "ReluSubAbsDiv"),
]


@pytest.mark.parametrize(("text", "name"), [c[1:] for c in NAMES], ids=[c[0] for c in NAMES])
def test_eop_name(text, name):
    assert eop_name(einopt.parse(text)) == name


def test_index_tensor_budget_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(eop_module, "MAX_INDEX_ELEMENTS", 8)
    scope = einopt.parse("L[i:4] X[i, i] where X: [4, 4]")
    eoperator(scope, "Diag", 17)  # 4 index elements
    big = einopt.parse("L[i:3, j:3] X[i*j] where X: [9]")
    with pytest.raises(ValueError, match=r"Gather index of 9 elements over iterators i, j \(limit 8\)"):
        eoperator(big, "Prod", 17)


@pytest.mark.parametrize(
    ("name", "opset", "message"),
    [
        ("Bad name", 17, "identifier"),
        ("Add", 17, "'Add' is an ONNX operator type"),
        ("Ok", 10, "opset 10 unsupported"),
        ("Ok", 99, "opset 99 unsupported"),
    ],
    ids=["not_identifier", "operator_type", "old_opset", "future_opset"],
)
def test_refusals(name, opset, message):
    with pytest.raises(EOperatorError, match=message):
        eoperator(einopt.parse("L[i:3] A[i] where A: [3]"), name, opset)


# --------------------------------------------------------------------------
# Random scopes
# --------------------------------------------------------------------------


@settings(max_examples=30)
@given(scopes(), st.integers(0, 2**32 - 1))
def test_random_scopes_match_interpreter(scope, seed):
    _run(scope, seed=seed)


@settings(max_examples=30)
@given(scopes(allow_max=True), st.integers(0, 2**32 - 1))
def test_random_scopes_with_max_match_interpreter(scope, seed):
    _run(scope, seed=seed)


def test_softmax_program_scopes_match_interpreter():
    text = (
        "L[i:3, j:5] exp(X[i, j] - {L[a:3] Max[b:5] X[a, b]}[i])"
        " / {L[c:3] Sum[d:5] exp(X[c, d] - {L[a:3] Max[b:5] X[a, b]}[c])}[i] where X: [3, 5]"
    )
    scope = einopt.parse(text)
    for s in ir.scopes_in(scope):
        _run(s)


@settings(max_examples=15)
@given(scopes(allow_unary=False, binary_ops=("+", "*")), st.integers(0, 2**32 - 1))
def test_random_sums_of_products_match_interpreter(scope, seed):
    _run(scope, seed=seed)


def _grouping(draw: st.DrawFn, factors: list[int]) -> tuple[int, ...]:
    """A shape whose dimensions are products of consecutive runs of ``factors``."""
    cuts = draw(st.lists(st.booleans(), min_size=len(factors) - 1, max_size=len(factors) - 1))
    out, run = [], factors[0]
    for f, cut in zip(factors[1:], cuts, strict=True):
        out, run = (out + [run], f) if cut else (out, run * f)
    return (*out, run)


@st.composite
def reshapes(draw: st.DrawFn) -> ir.Scope:
    """A Reshape as the importers write it, ``X[unravel(ravel(i))]``, between two groupings
    of the same factors, with the output dimensions permuted."""
    factors = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    src, dst = _grouping(draw, factors), _grouping(draw, factors)
    its = [ir.Iter(f"i{k}", 0, n) for k, n in enumerate(dst)]
    flat = its[0]
    for it in its[1:]:
        flat = flat * it.extent + it
    indices = []
    for d, n in enumerate(src):
        stride = math.prod(src[d + 1 :])
        e = flat // stride if stride > 1 else flat
        indices.append(e % n if d > 0 else e)
    order = draw(st.permutations(its))
    return L(*order)(tensor("X", src)[tuple(indices)])


@settings(max_examples=30)
@given(reshapes())
def test_reshapes_and_transposes_need_no_gather(scope):
    e = _run(scope)
    assert "Gather" not in _op_types(e), str(scope)


def test_products_of_sums_are_distributed():
    """``(A[i,k] + B[k,j]) * C[k]`` summed over ``k``: two small contractions, no ``i*j*k`` intermediate."""
    scope = einopt.parse(next(c[1] for c in CASES if c[0] == "distributed_sum"))
    e = eoperator(scope, "Distributed", 17)
    equations = sorted(
        helper.get_attribute_value(n.attribute[0]) for n in e.function.node if n.op_type == "Einsum"
    )
    assert equations == [b"ac,c->a", b"cb,c->b"]


def test_a_read_outside_its_source_times_infinity_is_nan_as_in_the_interpreter():
    """``0 * inf`` is NaN: a product with a read that is always outside its source is computed, not dropped."""
    a, b = tensor("A", (4,)), tensor("B", (4, 2))
    i, k = einopt.iters("i:4 k:2")
    scope = L(i)(einopt.Sum(k)(a[i + 10] * b[i, k] + b[i, k]))
    e = eoperator(scope, "ZeroTimesInf", 17)
    model = _model(e, scope, 17)
    onnx.checker.check_model(model, full_check=True)
    arrays = {"A": np.ones(4, np.float32), "B": np.ones((4, 2), np.float32)}
    arrays["B"][1, 0] = np.inf
    feeds = {f"x{k}": arrays[s.name] for k, s in enumerate(e.sources)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, feeds)
    want = evaluate(scope, {n: v.astype(np.float64) for n, v in arrays.items()})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[1]) and np.isfinite(np.delete(got, 1)).all()
