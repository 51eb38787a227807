"""Rewrites of models with symbolic dimensions written for every value of them
(:mod:`einopt.stages.generalize`): sizes solved from a second translation, computed at run time."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_models import assert_same_outputs

from einopt.pipeline import Options, optimize
from einopt.runtime import modelio
from einopt.stages.generalize import _Sizes

VERIFIED = Options(max_depth=0, accept="verified", cache=False)
SHAPES = [(1, 1), (2, 48), (5, 77), (3, 128)]


def _model(nodes, inits, inputs=("x",), hidden=64, out_shape=("batch", "seq", 64)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", hidden]) for n in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _add_layer_norm() -> onnx.ModelProto:
    """``LayerNormalization(x + r)`` over ``[batch, seq, 64]``: the matcher normalises the rows
    merged into one dimension (a Reshape there and one back, written for the searched shape)."""
    rng = np.random.default_rng(0)
    inits = {"g": rng.standard_normal(64).astype(np.float32), "b": rng.standard_normal(64).astype(np.float32)}
    nodes = [
        helper.make_node("Add", ["x", "r"], ["s"]),
        helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1, epsilon=1e-5),
    ]
    return _model(nodes, inits, inputs=("x", "r"))


def _split_heads() -> onnx.ModelProto:
    """A projection split into 4 heads by a Reshape whose target is computed from ``Shape`` (as
    exporters write it for a symbolic batch and sequence), then the heads moved forward."""
    rng = np.random.default_rng(1)
    inits = {
        "w": rng.standard_normal((64, 64)).astype(np.float32),
        "i0": np.array([0], np.int64),
        "i1": np.array([1], np.int64),
        "heads": np.array([4, 16], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["p"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["shape", "i1"], ["s"], axis=0),
        helper.make_node("Concat", ["b", "s", "heads"], ["target"], axis=0),
        helper.make_node("Reshape", ["p", "target"], ["h"]),
        helper.make_node("Transpose", ["h"], ["y"], perm=[0, 2, 1, 3]),
    ]
    return _model(nodes, inits, out_shape=("batch", 4, "seq", 16))


def _feeds(model: onnx.ModelProto, batch: int, seq: int) -> dict[str, np.ndarray]:
    return modelio.random_inputs(model, 7, {i.name: (batch, seq, 64) for i in model.graph.input})


def _declared(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


@pytest.mark.parametrize("make", [_add_layer_norm, _split_heads], ids=["layer-norm", "split-heads"])
def test_a_rewrite_with_sizes_of_the_searched_shape_is_written_for_every_shape(make):
    model = make()
    result = optimize(model, VERIFIED)
    assert result.changed(), result.report()
    assert all(p.status == "rewritten" for p in result.parts if p.kind != "passthrough"), [
        (p.name, p.status, p.reason) for p in result.parts
    ]
    out = result.model
    onnx.checker.check_model(out, full_check=True)
    assert _declared(out.graph.input[0]) == _declared(model.graph.input[0])
    assert _declared(out.graph.output[0]) == _declared(model.graph.output[0])
    # the sizes of batch and seq are read from an input's Shape at run time, none written as constants
    assert any(n.op_type == "Shape" and n.name.startswith("sp") for n in out.graph.node)
    for batch, seq in SHAPES:
        assert_same_outputs(model, out, _feeds(model, batch, seq))


def test_a_reshape_with_a_computed_target_is_translated_with_its_neighbours():
    result = optimize(_split_heads(), VERIFIED)
    (linear,) = [p for p in result.parts if p.kind != "passthrough"]
    assert sorted(linear.ops) == ["MatMul", "Reshape", "Transpose"]


def test_the_shape_computation_that_only_the_replaced_nodes_read_goes_with_them():
    out = optimize(_split_heads(), VERIFIED).model
    assert not any(n.op_type == "Concat" and n.output[0] == "target" for n in out.graph.node)
    read = {i for n in out.graph.node for i in n.input} | {"y"}
    assert all(any(o in read for o in n.output) for n in out.graph.node)


def test_a_pinned_model_keeps_constant_sizes():
    model = _add_layer_norm()
    shapes = {"x": (2, 8, 64), "r": (2, 8, 64)}
    pinned = optimize(model, Options(max_depth=0, accept="verified", cache=False, input_shapes=shapes))
    assert pinned.changed()
    assert not any(n.op_type == "Shape" for n in pinned.model.graph.node)


@pytest.mark.parametrize(
    ("rep", "probe", "solved"),
    [
        (64, 64, (64, (0, 0))),  # the same at both: a constant
        (1, 3, (1, (1, 0))),  # the batch
        (128, 195, (1, (1, 1))),  # batch * sequence
        (256, 390, (2, (1, 1))),  # twice that
        (16384, 4225, (1, (0, 2))),  # sequence squared
        (127, 64, None),  # sequence - 1: no product of the dimensions
    ],
)
def test_a_size_is_solved_as_a_product_of_the_dimensions(rep, probe, solved):
    sizes = _Sizes(["batch", "sequence"], [(1, 3), (128, 65)])
    assert sizes.solve(rep, probe) == solved


def test_a_size_two_products_fit_equally_is_not_solved():
    sizes = _Sizes(["height", "width"], [(224, 224), (113, 113)])  # a height and a width alike
    assert sizes.solve(224, 113) is None
