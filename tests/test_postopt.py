"""Post-optimization: the peepholes on their own, the outputs unchanged in ONNX Runtime, names kept."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx_models import assert_same_outputs, random_feeds

from einopt.stages.postopt import postoptimize

F = onnx.TensorProto.FLOAT


def _model(nodes, inits=(), extra_outputs=()) -> onnx.ModelProto:
    outs = [helper.make_tensor_value_info(n, F, None) for n in ["y", *extra_outputs]]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3, 4])], outs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _check(model, ops):
    out = postoptimize(model)
    assert [n.op_type for n in out.graph.node] == ops
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    onnx.checker.check_model(out)
    assert_same_outputs(model, out, random_feeds(model, seed=2))
    return out


def test_inverse_transposes_cancel():
    t = [
        helper.make_node("Transpose", ["x"], ["a"], perm=[2, 0, 1]),
        helper.make_node("Transpose", ["a"], ["b"], perm=[1, 2, 0]),
        helper.make_node("Relu", ["b"], ["y"]),
    ]
    _check(_model(t), ["Relu"])


def test_two_transposes_become_one():
    t = [
        helper.make_node("Transpose", ["x"], ["a"], perm=[2, 0, 1]),
        helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1]),
        helper.make_node("Relu", ["b"], ["y"]),
    ]
    _check(_model(t), ["Transpose", "Relu"])


def test_two_reshapes_become_one_and_an_identity_reshape_goes():
    t = [
        helper.make_node("Reshape", ["x", "s1"], ["a"]),
        helper.make_node("Reshape", ["a", "s2"], ["b"]),
        helper.make_node("Relu", ["b"], ["c"]),
        helper.make_node("Reshape", ["c", "s3"], ["d"]),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    inits = [_ints("s1", [6, 4]), _ints("s2", [3, 8]), _ints("s3", [3, -1])]
    _check(_model(t, inits), ["Reshape", "Relu", "Relu"])


def test_a_reshape_naming_a_middle_dimension_stays():
    t = [
        helper.make_node("Reshape", ["x", "s1"], ["a"]),
        helper.make_node("Reshape", ["a", "s2"], ["y"]),
    ]
    _check(_model(t, [_ints("s1", [6, 4]), _ints("s2", [0, 2, 2])]), ["Reshape", "Reshape"])


def test_graph_outputs_and_shared_values_are_not_bypassed():
    t = [
        helper.make_node("Transpose", ["x"], ["a"], perm=[2, 0, 1]),
        helper.make_node("Transpose", ["a"], ["y"], perm=[1, 2, 0]),
    ]
    _check(_model(t), ["Transpose", "Transpose"])  # y is a graph output: kept as is
    t = [
        helper.make_node("Transpose", ["x"], ["a"], perm=[2, 0, 1]),
        helper.make_node("Transpose", ["a"], ["b"], perm=[1, 2, 0]),
        helper.make_node("Relu", ["b"], ["y"]),
        helper.make_node("Relu", ["a"], ["z"]),
    ]
    _check(_model(t, extra_outputs=["z"]), ["Transpose", "Transpose", "Relu", "Relu"])


def test_work_on_weights_only_is_folded():
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    t = [
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "w2"], ["a"]),
        helper.make_node("Add", ["wt", "wt"], ["w2"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    t = [t[0], t[2], t[1], t[3]]
    out = _check(_model(t, [w]), ["MatMul", "Relu"])
    assert [i.name for i in out.graph.initializer] == ["w2"]


def test_the_input_model_is_not_changed():
    t = [
        helper.make_node("Transpose", ["x"], ["a"], perm=[2, 0, 1]),
        helper.make_node("Transpose", ["a"], ["b"], perm=[1, 2, 0]),
        helper.make_node("Relu", ["b"], ["y"]),
    ]
    m = _model(t)
    before = m.SerializeToString()
    postoptimize(m)
    assert m.SerializeToString() == before


def _norm(scale_name="g", bias_name="b", size=4):
    return [
        numpy_helper.from_array(np.linspace(0.5, 1.5, size, dtype=np.float32), scale_name),
        numpy_helper.from_array(np.linspace(-1, 1, size, dtype=np.float32), bias_name),
    ]


def test_a_row_wise_op_between_reshapes_runs_on_the_tensor_itself():
    """Reshape, LayerNormalization over the last axis, Reshape back: the norm alone (the rows are the
    same); likewise Softmax and an element-wise op. The last Reshape writes the graph output (kept)."""
    t = [
        helper.make_node("Reshape", ["x", "s1"], ["a"]),
        helper.make_node("LayerNormalization", ["a", "g", "b"], ["n"], axis=1),
        helper.make_node("Reshape", ["n", "s2"], ["c"]),
        helper.make_node("Reshape", ["c", "s1"], ["d"]),
        helper.make_node("Softmax", ["d"], ["e"], axis=-1),
        helper.make_node("Reshape", ["e", "s3"], ["f"]),
        helper.make_node("Reshape", ["f", "s1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Reshape", ["r", "s2"], ["y"]),
    ]
    inits = [_ints("s1", [6, 4]), _ints("s2", [2, 3, 4]), _ints("s3", [3, 2, 4]), *_norm()]
    out = _check(_model(t, inits), ["LayerNormalization", "Softmax", "Relu", "Reshape"])
    norm = out.graph.node[0]
    assert norm.input[0] == "x" and [a.i for a in norm.attribute if a.name == "axis"] == [-1]


def test_a_row_wise_op_stays_behind_a_reshape_that_changes_its_rows():
    t = [  # the rows of 4 become rows of 12: the softmax is another one
        helper.make_node("Reshape", ["x", "s1"], ["a"]),
        helper.make_node("Softmax", ["a"], ["e"], axis=-1),
        helper.make_node("Reshape", ["e", "s2"], ["y"]),
    ]
    _check(_model(t, [_ints("s1", [2, 12]), _ints("s2", [2, 3, 4])]), ["Reshape", "Softmax", "Reshape"])
    t = [  # normalized over both dimensions of [6, 4]
        helper.make_node("Reshape", ["x", "s1"], ["a"]),
        helper.make_node("LayerNormalization", ["a", "g", "b"], ["n"], axis=0),
        helper.make_node("Reshape", ["n", "s2"], ["y"]),
    ]
    inits = [_ints("s1", [6, 4]), _ints("s2", [2, 3, 4]), *_norm(size=4)]
    _check(_model(t, inits), ["Reshape", "LayerNormalization", "Reshape"])


def test_a_row_wise_op_read_by_another_op_than_a_reshape_stays():
    t = [
        helper.make_node("Reshape", ["x", "s1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Reshape", ["r", "s2"], ["y"]),
        helper.make_node("Neg", ["r"], ["z"]),
    ]
    inits = [_ints("s1", [6, 4]), _ints("s2", [2, 3, 4])]
    _check(_model(t, inits, extra_outputs=["z"]), ["Reshape", "Relu", "Reshape", "Neg"])


def test_an_element_wise_op_on_a_scalar_reshape_stays():
    """A Reshape to a scalar, then a row-wise op: the scalar has no last axis to compare (a fuzzer
    graph once raised IndexError here)."""
    t = [
        helper.make_node("Reshape", ["x", "s0"], ["a"]),
        helper.make_node("Erf", ["a"], ["e"]),
        helper.make_node("Reshape", ["e", "s1"], ["y"]),
    ]
    g = helper.make_graph(
        t,
        "g",
        [helper.make_tensor_value_info("x", F, [1, 1])],
        [helper.make_tensor_value_info("y", F, None)],
        [_ints("s0", []), _ints("s1", [1, 1])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    _check(m, ["Reshape", "Erf", "Reshape"])


def test_a_softmax_before_opset_13_is_not_moved_through_a_reshape():
    """Before opset 13, Softmax flattens its input from ``axis`` on: the rows depend on the rank."""
    t = [
        helper.make_node("Reshape", ["x", "s1"], ["a"]),
        helper.make_node("Softmax", ["a"], ["e"], axis=1),
        helper.make_node("Reshape", ["e", "s2"], ["y"]),
    ]
    m = _model(t, [_ints("s1", [6, 4]), _ints("s2", [2, 3, 4])])
    m.opset_import[0].version = 11
    _check(m, ["Reshape", "Softmax", "Reshape"])
