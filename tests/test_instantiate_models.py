"""Depth 0 on the evaluation models: each subprogram comes back as the operators it was.

Every model (small size, batch 1 and 2) is prepared and translated, each
subprogram instantiated with ``preferred=original_ops(model, part)``, the
parts assembled, and the result run in ONNX Runtime against the prepared
model. The emitted operator types must equal the original ones per
subprogram, except the known differences listed in ``DIFFERENT`` (ops no
matcher produces).
"""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.instantiate.emit import instantiate, original_ops
from einopt.models import MODELS, build, sample_inputs
from einopt.opsets import DEFAULT_DOMAINS, default_opset
from einopt.runtime import modelio
from einopt.stages.export import assemble

# Subprograms whose operators differ, and why, by the part's name without its ordinal (``sp<N>_``,
# which shifts whenever an earlier node starts or stops translating). No matcher produces Gather, so
# Longformer's two band gathers (with the Reshape, Pad, Unsqueeze and Squeeze around them) become
# one eOperator each, in the attention's one part (projections, scores, Softmax, band product,
# output projection, residual Add and LayerNormalization: Softmax and LayerNormalization no longer
# cut it).
DIFFERENT = {("longformer", "attention_matmul"): "Gather"}
# ShuffleNetV2's channel split (two Slices that tile the channels) comes back as one Split, on purpose
# (emit._split_tilings: one kernel instead of two), in the 13 parts that hold a stride-1 unit's split.
DIFFERENT |= {
    ("shufflenetv2", f"stage{stage}_{unit}_concat"): "Split"
    for stage, units in ((2, range(3)), (3, range(7)), (4, range(3)))
    for unit in units
}
# GPT-2's causal mask, Where(tril, scores, -3.4e38), is imported as the scores plus a constant mask
# (importers_elementwise.import_where) and comes back as that Add: one kernel either way.
DIFFERENT |= {
    ("gpt2", part): "Add"
    for part in (
        "h_0_attn_c_attn_reshape",
        "h_0_mlp_c_fc_reshape",
        "h_1_mlp_c_fc_reshape",
        "h_2_mlp_c_fc_reshape",
    )
}


def _unnumbered(part_name: str) -> str:
    return re.sub(r"^sp\d+_", "", part_name)


def _op_types(nodes) -> collections.Counter:
    """Operator types, without the Reshapes that merge a LayerNormalization's rows and split them
    back (its lowering on 2-D rows, which ONNX Runtime does not turn into SkipLayerNormalization)."""
    nodes = list(nodes)
    norms = [n for n in nodes if n.op_type == "LayerNormalization"]
    rows = {n.input[0] for n in norms} | {n.output[0] for n in norms}
    return collections.Counter(
        n.op_type if n.domain in DEFAULT_DOMAINS else "eop"
        for n in nodes
        if not (n.op_type == "Reshape" and (n.output[0] in rows or n.input[0] in rows))
    )


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_depth0_keeps_the_original_operators(name, batch):
    original = build(name, batch, size="small")
    model = prepare(original, {}).model
    opset = default_opset(model)
    emitted, differ = {}, {}
    for p in translate_graph(model):
        if not p.translated:
            continue
        inst = instantiate(
            p.program,
            onnx_names=p.names,
            constants=p.constants,
            opset=opset,
            prefix=p.name + "/",
            preferred=original_ops(model, p),
        )
        emitted[p.nodes] = inst
        before, after = _op_types(model.graph.node[i] for i in p.nodes), _op_types(inst.nodes)
        if after != before:
            differ[_unnumbered(p.name)] = f"{dict(before)} -> {dict(after)}"
    assert sorted(differ) == sorted(part for model_name, part in DIFFERENT if model_name == name), differ
    feeds = sample_inputs(original)
    want = modelio.run(model, feeds)
    got = modelio.run(assemble(model, emitted), feeds)
    assert want and sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want[k]).max()))


def test_original_ops_names_each_binding_by_its_node():
    model = prepare(build("resnet18", 1, size="small"), {}).model
    # The head: the part that holds the classifier's Gemm.
    part = next(
        p for p in translate_graph(model) if any(model.graph.node[i].op_type == "Gemm" for i in p.nodes)
    )
    ops = original_ops(model, part)
    assert sorted(ops.values()) == ["Flatten", "Gemm", "GlobalAveragePool"]
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    assert all(producer[part.names[b]] == op for b, op in ops.items())
