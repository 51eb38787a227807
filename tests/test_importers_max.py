"""Importers of reductions by maximum (ReduceMax, MaxPool, Softmax) against ONNX Runtime.

Every one-node model is translated and evaluated by the reference interpreter (float64) and
compared with ONNX Runtime on the same float32 inputs, the model's attributes and opsets varied;
refusals carry their reason. Softmax is checked on inputs of 1e4 too, where the form without the
maximum subtracted overflows, and the shared models' Softmax and MaxPool nodes are translated.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from reduce_cases import MAX_POOLS, REDUCE_MAXES, SOFTMAXES, max_pool
from shared_models import needs_shared, path
from test_importers import Case, build, cases, check, run_ort

from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.frontend.fold import prepare
from einopt.frontend.importers import translate_single_node
from einopt.frontend.importers_max import MAX_IMPORTERS, NONLINEAR
from einopt.frontend.operand import Unsupported
from einopt.frontend.translate import translate_graph

F32 = np.float32


def _scopes(program: ir.Program) -> list[ir.Scope]:
    return [s for _, s in program.bindings for s in ir.scopes_in(s)]


# --------------------------------------------------------------------------
# ReduceMax
# --------------------------------------------------------------------------


@cases(*REDUCE_MAXES)
def test_reduce_max(case):
    program = check(case)
    (y,) = (program.scope(n) for n in program.outputs)
    noop = case.attrs.get("noop_with_empty_axes")
    assert y.is_max != bool(noop), y


def test_reduce_max_of_negative_values_is_negative():
    # The maximum of negatives is not 0: nothing pads a reduction.
    case = Case("negative", "ReduceMax", [("x", (2, 3))], {"axes": [1]}, opset=13)
    model, _ = build(case)
    program, _ = translate_single_node(model)
    x = -np.arange(1, 7, dtype=F32).reshape(2, 3)
    (want,) = run_ort(model, {"x": x})
    np.testing.assert_array_equal(evaluate(program, {"x": x})[program.outputs[0]], want)
    assert (want < 0).all()


# --------------------------------------------------------------------------
# MaxPool
# --------------------------------------------------------------------------


@cases(*MAX_POOLS)
def test_max_pool(case):
    program = check(case)
    y = program.scope(program.outputs[0])
    assert y.is_max and len(y.summation) == len(case.attrs["kernel_shape"])


def test_max_pool_pads_with_minus_infinity():
    # Negative inputs: a window over the padding takes its inside's maximum, not 0 (the IR's read
    # outside a tensor); the penalty scopes give the padding -inf.
    case = MAX_POOLS[2]
    model, feeds = build(case)
    x = {"x": -1.0 - np.abs(feeds["x"])}
    (want,) = run_ort(model, x)
    program, _ = translate_single_node(model)
    got = evaluate(program, x)[program.outputs[0]]
    np.testing.assert_array_equal(got, want)
    assert (want < 0).all()
    unpadded, _ = translate_single_node(build(MAX_POOLS[1])[0])
    assert len(_scopes(unpadded)) == 1  # no penalty where every window stays inside


@pytest.mark.parametrize(
    "case, reason",
    [
        (
            Case("indices", "MaxPool", [("x", (1, 2, 4, 4))], {"kernel_shape": [2, 2]}, outputs=2),
            "Indices output is used",
        ),
        (
            max_pool("padding-only", (1, 1, 3, 3), kernel_shape=[2, 2], dilations=[5, 1], pads=[1, 0, 2, 0]),
            "reads only padding",
        ),
        (max_pool("no-kernel", (1, 1, 4, 4)), "without kernel_shape"),
    ],
    ids=["indices", "padding-only", "no-kernel"],
)
def test_max_pool_refusals(case, reason):
    model, _ = build(case)
    with pytest.raises(Unsupported, match=reason):
        translate_single_node(onnx.shape_inference.infer_shapes(model))


def test_max_pool_of_integers_is_refused():
    node = onnx.helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [1, 1, 4, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, None)],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    with pytest.raises(Unsupported, match="only float32"):
        translate_single_node(model)


# --------------------------------------------------------------------------
# Softmax
# --------------------------------------------------------------------------


@cases(*SOFTMAXES)
def test_softmax(case):
    program = check(case)
    kinds = sorted(s.reduce for s in _scopes(program) if s.summation)
    assert kinds == ["max", "sum"]


@pytest.mark.parametrize("case", [SOFTMAXES[0], SOFTMAXES[4]], ids=["opset13", "opset11"])
def test_softmax_of_large_inputs_subtracts_the_maximum(case):
    model, feeds = build(case)
    x = {"x": (feeds["x"] * 5e3).astype(F32)}  # up to 1e4: exp overflows float32 and float64
    (want,) = run_ort(model, x)
    program, _ = translate_single_node(model)
    got = evaluate(program, x)[program.outputs[0]]
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with np.errstate(over="ignore", invalid="ignore"):
        plain = np.exp(x["x"].astype(np.float64))
        plain = plain / plain.sum(axis=-1, keepdims=True)
    assert not np.isfinite(plain).all()  # the form without the maximum fails on these inputs
    got32 = evaluate(program, x, mode="float32")[program.outputs[0]]
    np.testing.assert_allclose(got32, want, rtol=1e-5, atol=1e-6)


def test_softmax_axis_out_of_range_is_refused():
    model, _ = build(Case("bad-axis", "Softmax", [("x", (2, 3))], {"axis": 2}, opset=13))
    with pytest.raises(Exception, match="axis"):
        translate_single_node(model)


def test_none_of_these_ops_is_linear():
    assert NONLINEAR == set(MAX_IMPORTERS) == {"ReduceMax", "MaxPool", "Softmax"}


# --------------------------------------------------------------------------
# The shared models
# --------------------------------------------------------------------------

SHARED_MODELS = ["bert_tiny", "unet_tiny", "gpt2_tiny_dynamo", "vit_tiny_dynamo"]


@needs_shared
@pytest.mark.parametrize("name", SHARED_MODELS)
def test_shared_models_translate_their_softmax_and_max_pool(name):
    model = prepare(onnx.load(path(name))).model
    nodes = list(model.graph.node)
    mine = {i for i, n in enumerate(nodes) if n.op_type in MAX_IMPORTERS}
    assert mine, f"{name} has no {sorted(MAX_IMPORTERS)} node"
    parts = [p for p in translate_graph(model) if mine & set(p.nodes)]
    refused = [(nodes[p.nodes[0]].op_type, p.reason) for p in parts if not p.translated]
    assert not refused, refused
    for p in parts:
        assert any(s.is_max for _, s in p.program.bindings for s in ir.scopes_in(s))


# --------------------------------------------------------------------------
# The imported forms compile (TVM) and lower to eOperators (ORT) as the interpreter says
# --------------------------------------------------------------------------

FORMS = [
    MAX_POOLS[2],
    MAX_POOLS[5],
    MAX_POOLS[7],
    SOFTMAXES[1],
    SOFTMAXES[4],
    Case("rm", "ReduceMax", [("x", (2, 3, 4))], {"axes": [0, 2]}),
]


@pytest.mark.tvm
@pytest.mark.parametrize("case", FORMS, ids=lambda c: f"{c.op}-{c.id}")
def test_imported_forms_compile_to_the_interpreters_values(case):
    import einopt.codegen

    model, feeds = build(case)
    program, _ = translate_single_node(model)
    x = {"x": feeds["x"] - 2.5}  # mostly negative: a padding read as 0 would show
    want = evaluate(program, x)[program.outputs[0]]
    got = einopt.codegen.compile(program)(**x)[program.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", FORMS, ids=lambda c: f"{c.op}-{c.id}")
def test_imported_forms_lower_to_eoperators(case):
    from test_eop import _run

    model, _ = build(case)
    program, _ = translate_single_node(model)
    for scope in _scopes(program):
        _run(scope)
