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

import numpy as np
import pytest

from einopt.frontend.fold import prepare
from einopt.frontend.onnx_graph import DEFAULT_DOMAINS, default_opset
from einopt.frontend.translate import translate_graph
from einopt.instantiate.emit import instantiate, original_ops
from einopt.models import MODELS, build, sample_inputs
from einopt.runtime import modelio
from einopt.stages.export import assemble

# Subprograms whose operators differ, and why: no matcher produces Gather, so Longformer's
# band gathers (with the Reshape/Unsqueeze/Squeeze around them) become one eOperator.
DIFFERENT = {
    ("longformer", "sp0_attention_matmul"): "Gather",
    ("longformer", "sp1_attention_matmul_3"): "Gather",
}
# ShuffleNetV2's channel split (two Slices that tile the channels) comes back as one Split, on purpose
# (emit._split_tilings: one kernel instead of two), in the 13 parts that hold a stride-1 unit's split.
DIFFERENT |= {
    ("shufflenetv2", part): "Split"
    for part in (
        "sp7_stage2_0_concat",
        "sp11_stage2_1_concat",
        "sp15_stage2_2_concat",
        "sp24_stage3_0_concat",
        "sp28_stage3_1_concat",
        "sp32_stage3_2_concat",
        "sp36_stage3_3_concat",
        "sp40_stage3_4_concat",
        "sp44_stage3_5_concat",
        "sp48_stage3_6_concat",
        "sp57_stage4_0_concat",
        "sp61_stage4_1_concat",
        "sp65_stage4_2_concat",
    )
}


def _op_types(nodes) -> collections.Counter:
    return collections.Counter(n.op_type if n.domain in DEFAULT_DOMAINS else "eop" for n in nodes)


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
            differ[p.name] = f"{dict(before)} -> {dict(after)}"
    assert sorted(differ) == sorted(part for model_name, part in DIFFERENT if model_name == name), differ
    feeds = sample_inputs(original)
    want = modelio.run(model, feeds)
    got = modelio.run(assemble(model, emitted), feeds)
    assert want and sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want[k]).max()))


def test_original_ops_names_each_binding_by_its_node():
    model = prepare(build("resnet18", 1, size="small"), {}).model
    part = next(p for p in translate_graph(model) if p.name.startswith("sp34_head"))
    ops = original_ops(model, part)
    assert sorted(ops.values()) == ["Flatten", "Gemm", "GlobalAveragePool"]
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    assert all(producer[part.names[b]] == op for b, op in ops.items())
