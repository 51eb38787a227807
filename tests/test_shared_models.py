"""The shared real exports (``../shared/models``): every float operation is translated, and einopt's
output computes what PyTorch computed.

A node may still pass through for an accepted reason (integer work such as BERT's
embedding lookup by token ids); never for "no importer" when it computes floats.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from shared_models import data, names, needs_shared, path

from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.pipeline import Options, optimize

pytestmark = needs_shared


def _float_outputs(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    types |= {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.output}
    return any(types.get(o) == onnx.TensorProto.FLOAT for o in node.output if o)


@pytest.mark.parametrize("name", names())
def test_no_float_operation_passes_through_for_want_of_an_importer(name):
    model = prepare(onnx.load(path(name))).model
    nodes = list(model.graph.node)
    missing = [
        f"{nodes[p.nodes[0]].op_type}: {p.reason}"
        for p in translate_graph(model)
        if p.kind == "passthrough"
        and p.reason.startswith("no importer")
        and _float_outputs(model, nodes[p.nodes[0]])
    ]
    assert not missing, missing


def _run(model: onnx.ModelProto, xs: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: xs[f"x{k}"] for k, i in enumerate(sess.get_inputs())}
    return sess.run(None, feeds)


@pytest.mark.slow
@pytest.mark.parametrize("name", names())
def test_the_output_computes_what_pytorch_computed(name, tmp_path):
    xs, ys = data(name)
    options = Options(accept="verified", cache=False, states_per_search=200, states_per_model=600)
    result = optimize(onnx.load(path(name)), options)
    assert result.verified, result.notes
    for got, want in zip(_run(result.model, xs), ys, strict=True):
        scale = max(1.0, float(np.max(np.abs(want))))
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * scale)


def _at_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """``model`` with the leading dimension of every graph input and output set to ``batch``."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    del model.graph.value_info[:]
    for vi in (*model.graph.input, *model.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_value = batch
    return model


def _gate_keys(model: onnx.ModelProto) -> list[str]:
    from einopt.core import keys

    (part,) = [p for p in translate_graph(prepare(model).model) if p.kind == "linear" and len(p.nodes) == 12]
    return sorted(keys.key(part.program.scope(o)) for o in part.program.outputs)


def test_both_exporters_lstm_cells_translate_to_one_key_per_gate():
    # TorchScript writes Gemm(transB=1) with alpha and beta left out, dynamo writes every attribute:
    # one computation, so one canonical key per gate's pre-activation.
    ts = _gate_keys(onnx.load(path("lstm_linear_cell")))
    dynamo = _gate_keys(_at_batch(onnx.load(path("lstm_linear_cell_dynamo")), 1))
    assert len(ts) == 4 and ts == dynamo
