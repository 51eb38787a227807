"""einopt.core.cost: FLOPs and bytes of hand-checked small models, views, eOperator functions, unknown shapes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_models import conv_block, tiny_model

from einopt.core.cost import model_cost
from einopt.pipeline import Options, optimize


def test_cost_of_batched_matmul():
    w = np.zeros((3, 32, 16), np.float32)
    m = tiny_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [3, 4, 32])], [("y", [3, 4, 16])], [("w", w)]
    )
    c = model_cost(m)
    assert c.flops == 2 * 3 * 4 * 16 * 32
    assert c.bytes == 4 * (3 * 4 * 32 + 3 * 32 * 16 + 3 * 4 * 16)
    assert c.by_op == {"MatMul": (c.flops, c.bytes)} and isinstance(c.flops, int)


def test_cost_of_einsum_counts_its_joint_index_space():
    """An eOperator's contraction runs as Einsum: 2 FLOPs per point of b, i, j, k (same as MatMul)."""
    w = np.zeros((3, 32, 16), np.float32)
    m = tiny_model(
        [helper.make_node("Einsum", ["x", "w"], ["y"], equation="bik,bkj->bij")],
        [("x", [3, 4, 32])],
        [("y", [3, 4, 16])],
        [("w", w)],
    )
    assert model_cost(m).flops == 2 * 3 * 4 * 16 * 32


def test_unknown_shapes_count_zero_and_are_listed():
    m = tiny_model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Add", ["r", "r"], ["y"], name="add"),
        ],
        [("x", ["n", 8])],
        [("y", ["n", 8])],
    )
    c = model_cost(m)
    assert c.flops == 0 and c.bytes == 0 and c.unknown == ["relu", "add"]


def test_cost_of_conv_and_conv_transpose():
    x = ("x", [1, 8, 6, 6])
    w = np.zeros((4, 8, 3, 3), np.float32)
    conv = tiny_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        [x],
        [("y", [1, 4, 6, 6])],
        [("w", w)],
    )
    c = model_cost(conv)
    assert c.flops == 2 * 4 * 36 * 8 * 9
    assert c.bytes == 4 * (8 * 36 + 4 * 8 * 9 + 4 * 36) and c.unknown == []
    wt = np.zeros((8, 4, 4, 4), np.float32)
    ct = tiny_model(
        [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])],
        [x],
        [("y", [1, 4, 12, 12])],
        [("w", wt)],
    )
    assert model_cost(ct).flops == 2 * 8 * 36 * 4 * 16
    # inputs and output, plus the column buffer (F * k*k values per input position) written and read
    col = 4 * 16 * 36
    assert model_cost(ct).bytes == 4 * (8 * 36 + 8 * 4 * 16 + 4 * 144 + 2 * col)


def test_cost_of_views_and_eoperator_functions():
    reshape = tiny_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        [("x", [2, 6])],
        [("y", [3, 4])],
    )
    reshape.graph.initializer.append(numpy_helper.from_array(np.array([3, 4], np.int64), "s"))
    assert model_cost(reshape).bytes == 0 and model_cost(reshape).flops == 0
    fn = helper.make_function(
        "einopt.eop",
        "Double",
        ["a"],
        ["b"],
        [helper.make_node("Add", ["a", "a"], ["b"])],
        [helper.make_opsetid("", 17)],
    )
    m = tiny_model(
        [helper.make_node("Double", ["x"], ["y"], domain="einopt.eop")],
        [("x", [5])],
        [("y", [5])],
        functions=[fn],
    )
    c = model_cost(m)
    assert c.flops == 5 and c.by_op == {"Add": (5, 4 * 15)}


def test_cost_of_einopt_output_matches_original_for_a_depth0_round_trip():
    model = conv_block()
    out = optimize(model, Options(seed=0)).model
    assert model_cost(out).flops == pytest.approx(
        model_cost(onnx.shape_inference.infer_shapes(model)).flops, rel=0.2
    )
