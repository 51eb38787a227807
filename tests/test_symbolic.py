"""Symbolic dimensions: representative values, the shapes an output is checked at, and the exporters'
dynamic models (``../shared/models/dynamic``) optimized as they are."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_models import prelu_block
from shared_models import SHARED

from einopt.errors import ModelError
from einopt.frontend.symbolic import check_assignments, keep_symbolic, representative, seen_values, shapes_at
from einopt.pipeline import Options, optimize

DYNAMIC = SHARED / "dynamic"


def _model(*dims) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(dims))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_representative_values_by_name_and_by_dim():
    dims = representative(_model("batch_size", "sequence_length", 64), {})
    assert dims.values == {"batch_size": 1, "sequence_length": 128} and not dims.unresolved
    assert dims.shapes() == {"x": (1, 128, 64)}
    dims = representative(_model("N", 3, "height", "width"), {"height": 32, "width": 48})
    assert dims.shapes() == {"x": (1, 3, 32, 48)}


def test_a_dimension_without_a_default_is_unresolved_and_its_input_stays_symbolic():
    dims = representative(_model("batch", "frames"), {})
    assert dims.unresolved == ("frames",) and dims.inputs == {} and dims.shapes() == {}
    assert representative(_model("batch", "frames"), {"frames": 9}).shapes() == {"x": (1, 9)}
    unnamed = representative(_model("batch", ""), {})
    assert "?" in unnamed.unresolved and unnamed.shapes() == {}


def test_a_wrong_dim_is_a_clear_error():
    with pytest.raises(ModelError, match="--dim names seq, not a symbolic dimension"):
        representative(_model("batch", "sequence"), {"seq": 4})
    with pytest.raises(ModelError, match="at least 1"):
        representative(_model("batch", "sequence"), {"sequence": 0})


def test_the_users_inputs_give_the_values_they_run_at():
    model = _model("batch", "sequence", 64)
    assert seen_values(model, {"x": np.zeros((2, 48, 64), np.float32)}) == {"batch": 2, "sequence": 48}
    assert seen_values(model, {"x": np.zeros((2, 48), np.float32)}) == {}  # not the input's rank
    prelu = prelu_block(batch="N")
    given = {"x": np.random.default_rng(0).standard_normal((2, 4, 8, 8)).astype(np.float32)}
    options = Options(max_depth=2, accept="verified", cache=False, states_per_search=300, inputs=[given])
    result = optimize(prelu, options)
    assert any("searched and timed at N=2" in n for n in result.notes)


def test_a_dim_that_disagrees_with_the_given_inputs_is_a_clear_error():
    given = {"x": np.zeros((2, 4, 8, 8), np.float32)}
    with pytest.raises(ModelError, match="--dim N=3 disagrees with --inputs, which run at N=2"):
        optimize(prelu_block(batch="N"), Options(max_depth=0, dims={"N": 3}, inputs=[given]))


def test_pinned_inputs_have_no_representative_values():
    assert representative(_model("batch", "sequence"), {}, {"x": (2, 5)}).values == {}


def test_the_output_is_checked_at_one_and_at_an_odd_value():
    dims = representative(_model("batch", "sequence", "height"), {})
    ones, odd = check_assignments(dims)
    assert ones == {"batch": 1, "sequence": 1, "height": 1}
    assert odd == {"batch": 3, "sequence": 65, "height": 113}
    assert shapes_at(dims, odd) == {"x": (3, 65, 113)}
    assert check_assignments(representative(_model("batch", 8), {"batch": 1})) == [{"batch": 3}]


def test_keep_symbolic_puts_the_declarations_back_and_drops_inferred_shapes():
    original = _model("batch", 4)
    pinned = _model(1, 4)
    pinned.graph.value_info.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4]))
    out = keep_symbolic(pinned, original)
    assert out.graph.input[0].type == original.graph.input[0].type
    assert out.graph.output[0].type == original.graph.output[0].type
    assert not out.graph.value_info and pinned.graph.value_info  # the argument is left as it was


def test_a_model_that_does_not_run_at_the_default_values_keeps_them_symbolic():
    # Relu, then a Reshape to 8 features: the model runs at 1 x 1 images only, not at 224 x 224
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "height", "width"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    shape = onnx.numpy_helper.from_array(np.array([1, 8], np.int64), "shape")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = optimize(model, Options(max_depth=0, accept="verified"))
    assert not result.blocked
    assert any("does not run at height=224, width=224" in n and "--dim" in n for n in result.notes)
    given = optimize(model, Options(max_depth=0, accept="verified", dims={"height": 1, "width": 1}))
    assert not given.blocked and not any("does not run" in n for n in given.notes)


def _declared(model: onnx.ModelProto) -> list[list]:
    return [
        [d.dim_value or d.dim_param for d in vi.type.tensor_type.shape.dim]
        for vi in (*model.graph.input, *model.graph.output)
    ]


def _random(model: onnx.ModelProto, shape: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    x = model.graph.input[0]
    rng = np.random.default_rng(seed)
    if x.type.tensor_type.elem_type == TensorProto.INT64:
        return {x.name: rng.integers(0, 1000, size=shape).astype(np.int64)}
    return {x.name: rng.standard_normal(shape).astype(np.float32)}


def _run(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


SHAPES = {
    "bert_tiny_dynamic": [(1, 1), (2, 48), (5, 77)],
    "prelu_net_dynamic": [(1, 3, 32, 32), (2, 3, 61, 61), (5, 3, 32, 61)],
    "basic_block_dynamic": [(1, 64, 28, 28), (2, 64, 28, 28), (5, 64, 28, 28)],
}


@pytest.mark.skipif(not (DYNAMIC / "index.json").exists(), reason="no ../shared/models/dynamic")
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n.startswith("bert") else n for n in SHAPES]
)
def test_an_exporters_dynamic_model_keeps_its_symbolic_dims(name):
    model = onnx.load(DYNAMIC / f"{name}.onnx")
    result = optimize(
        model, Options(accept="verified", cache=False, states_per_search=300, states_per_model=3000)
    )
    assert result.verified
    assert _declared(result.model) == _declared(model)
    if name != "basic_block_dynamic":  # rewrites written for any batch and sequence (image size) are kept
        assert result.counts()["rewritten"] >= {"bert_tiny_dynamic": 5, "prelu_net_dynamic": 4}[name]
    for k, shape in enumerate(SHAPES[name]):
        feeds = _random(model, shape, k)
        for a, b in zip(_run(model, feeds), _run(result.model, feeds), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    # and what PyTorch computed, at the shape of the export's example
    data = np.load(DYNAMIC / f"{name}.npz")
    xs = {model.graph.input[0].name: data["x0"]}
    ys = [data[f"y{i}"] for i in range(len(model.graph.output))]
    for got, want in zip(_run(result.model, xs), ys, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    index = json.loads((DYNAMIC / "index.json").read_text())
    assert list(data["x0"].shape) == index[name]["inputs"]["x0"]
