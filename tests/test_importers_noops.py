"""Cast and Expand: ops exporters write that do not change values (a float32 Cast around a mask, a
broadcast), imported as reads and checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

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
