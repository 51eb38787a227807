"""Cast, Expand and Where: ops exporters write around values (a float32 Cast around a mask, a
broadcast, a causal mask as Where on a constant condition), imported and checked against ONNX
Runtime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.frontend.importers import translate_single_node
from einopt.frontend.operand import Unsupported


def _model(node, x_shape, inits=()):
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        list(inits),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _against_ort(model, x):
    program, arrays = translate_single_node(model)
    got = evaluate(program, {**arrays, "x": x})[program.outputs[0]]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float32), want)


def test_a_float_cast_of_float_data_is_a_copy():
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    _against_ort(_model(helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT), [2, 3, 4]), x)


def test_a_cast_that_changes_the_type_is_refused():
    model = _model(helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT64), [2, 3])
    with pytest.raises(Unsupported, match="Cast to INT64"):
        translate_single_node(model)


@pytest.mark.parametrize(
    "x_shape, shape",
    [([3, 1], [2, 3, 4]), ([1, 4], [3, 1]), ([2, 1, 5], [2, 3, 5]), ([4], [2, 3, 4]), ([1], [6])],
)
def test_expand_broadcasts_like_onnx_runtime(x_shape, shape):
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    shape_init = numpy_helper.from_array(np.array(shape, dtype=np.int64), "shape")
    model = _model(helper.make_node("Expand", ["x", "shape"], ["y"]), x_shape, [shape_init])
    _against_ort(model, x)


def test_expand_by_a_computed_shape_is_refused():
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "s"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(Unsupported, match="not a constant"):
        translate_single_node(model)


# --------------------------------------------------------------------------
# Where on a constant condition
# --------------------------------------------------------------------------

_CAUSAL = np.tril(np.ones((4, 4), dtype=bool)).reshape(1, 1, 4, 4)


def _where_model(cond, other, other_is_input=False):
    inits = [numpy_helper.from_array(cond, "c")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])]
    if other_is_input:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, list(other.shape)))
    else:
        inits.append(numpy_helper.from_array(other, "z"))
    graph = helper.make_graph(
        [helper.make_node("Where", ["c", "x", "z"], ["y"])],
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "cond, other, form",
    [
        # transformers' causal mask: Where(tril, scores, finfo(float32).min), an additive mask
        (_CAUSAL, np.array(np.finfo(np.float32).min, np.float32), "+"),
        (_CAUSAL, np.array(-np.inf, np.float32), "+"),
        # another constant: the selection as products with the 0/1 condition
        (_CAUSAL, np.full((1, 1, 1, 4), 2.5, np.float32), "*"),
        (_CAUSAL[0, 0, 0], np.array(-7.0, np.float32), "*"),
        # a condition true everywhere: a copy of X
        (np.ones((4,), bool), np.array(0.0, np.float32), None),
    ],
)
def test_where_on_a_constant_condition_equals_onnx_runtime(cond, other, form):
    model = _where_model(cond, other)
    x = (10 * np.random.default_rng(2).standard_normal((2, 3, 4, 4))).astype(np.float32)
    _against_ort(model, x)
    program, _ = translate_single_node(model)
    ops = {e.op for _, scope in program.bindings for e in ir.walk(scope) if isinstance(e, ir.Binary)}
    assert (form in ops) if form else not ops, ops


def test_where_between_two_varying_values_takes_each_where_the_condition_says():
    model = _where_model(_CAUSAL, np.zeros((2, 3, 4, 4), np.float32), other_is_input=True)
    rng = np.random.default_rng(3)
    x, z = (rng.standard_normal((2, 3, 4, 4)).astype(np.float32) for _ in range(2))
    program, arrays = translate_single_node(model)
    got = evaluate(program, {**arrays, "x": x, "z": z})[program.outputs[0]]
    np.testing.assert_array_equal(got.astype(np.float32), np.where(_CAUSAL, x, z))


def test_where_on_a_computed_condition_is_refused():
    graph = helper.make_graph(
        [helper.make_node("Where", ["c", "x", "x"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, [3]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(Unsupported, match="condition c is not a constant"):
        translate_single_node(model)
