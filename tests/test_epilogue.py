"""A part's epilogue: the element-wise activations after it, which ONNX Runtime may fuse into its
last nodes (Gemm + Sigmoid into FusedGemm), timed and costed with the part on both sides.

Parts end where activations start, so four Gemms each read by a Sigmoid (four FusedGemm kernels in
ONNX Runtime) and one Gemm split four ways (a Gemm, a Split and four activations) looked alike to a
part timed alone; on the ``nn.Linear`` LSTM cell the split form measured 1.29x on its own and 1.01x
in the whole model, where the four fused Gemms ran 1.20x.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx_models import lstm_cell, make, random_feeds, run_ort

from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.instantiate.emit import instantiate
from einopt.runtime.opcost import node_costs
from einopt.search.results import Candidate
from einopt.stages.predict import _light, _with_epilogue
from einopt.stages.verify import epilogue, part_pairs


def _gates(model: onnx.ModelProto):
    parts = [p for p in translate_graph(model) if p.translated]
    return model, next(p for p in parts if len(p.nodes) == 12)


def _prepared_cell(form: str = "gemm"):
    return _gates(prepare(lstm_cell(hidden=16, form=form), {}, fold=True).model)


def test_the_gates_epilogue_is_their_four_activations():
    model, gates = _prepared_cell()
    tail = epilogue(model, gates)
    assert sorted(n.op_type for n in tail.nodes) == ["Sigmoid", "Sigmoid", "Sigmoid", "Tanh"]
    assert sorted(tail.outputs) == ["gate_f", "gate_g", "gate_i", "gate_o"]


def test_an_output_read_beside_its_activation_stays_an_output_and_non_element_wise_readers_stay_out():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    lo = numpy_helper.from_array(np.array(-1.0, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(1.0, np.float32), "hi")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("MatMul", ["x", "w"], ["b"]),
        helper.make_node("MatMul", ["x", "w"], ["c"]),
        helper.make_node("Relu", ["a"], ["ra"]),
        helper.make_node("Clip", ["b", "lo", "hi"], ["cb"]),  # bounds are constants: it joins
        helper.make_node("Max", ["c", "x"], ["mc"]),  # a second runtime operand: it does not
        helper.make_node("ReduceMax", ["a"], ["ma"], axes=[1], keepdims=0),  # not element-wise
        helper.make_node("Sum", ["ra", "cb", "mc"], ["s"]),
    ]
    f = onnx.TensorProto.FLOAT
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", f, [2, 8])],
            [helper.make_tensor_value_info("s", f, [2, 8]), helper.make_tensor_value_info("ma", f, [2])],
            [w, lo, hi],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model = prepare(model, {}, fold=True).model
    (part,) = [p for p in translate_graph(model) if p.kind == "linear" and len(p.nodes) == 3]
    tail = epilogue(model, part)
    assert [n.op_type for n in tail.nodes] == ["Relu", "Clip"]
    # "a" is also read by the ReduceMax, "c" by the Max: both stay outputs; "b" is the Clip's only.
    outputs = {part.names[o] for o in part.program.outputs}
    assert set(tail.outputs) == (outputs - {"b"}) | {"ra", "cb"}


def test_timing_pairs_carry_the_epilogue_on_both_sides_and_compute_the_same():
    model, gates = _prepared_cell()
    inst = instantiate(
        gates.program, onnx_names=gates.names, constants=gates.constants, opset=17, prefix="t/"
    )
    feeds = random_feeds(model)
    (plain,) = part_pairs(model, [gates], {gates.name: inst}, feeds)
    (pair,) = part_pairs(model, [gates], {gates.name: inst}, feeds, epilogues=True)
    assert "Sigmoid" not in {n.op_type for n in plain.original.graph.node}
    for side in (pair.original, pair.rewritten):
        assert [n.op_type for n in side.graph.node][-4:] == ["Sigmoid", "Sigmoid", "Tanh", "Sigmoid"]
        assert sorted(o.name for o in side.graph.output) == ["gate_f", "gate_g", "gate_i", "gate_o"]
    want = run_ort(pair.original, pair.original_feeds)
    got = run_ort(pair.rewritten, pair.rewritten_feeds)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_gemm_is_costed_with_the_activation_onnx_runtime_fuses_into_it():
    model, gates = _prepared_cell()
    candidate = Candidate(gates.program, (), (), 0.0)
    light, weights, _ = _light(candidate, gates)
    inits = {t.name: t for t in model.graph.initializer}
    costed = _with_epilogue(light, epilogue(model, gates), gates.names, inits)
    whats = [n.cost.what for n in node_costs(costed, weights) if n.cost.kind == "timed"]
    # Each gate's sum ends in an Add, which ONNX Runtime does not fuse an activation into.
    assert sum(w.startswith("Sigmoid") for w in whats) == 3 and sum(w.startswith("Tanh") for w in whats) == 1
    # Four Gemms, each the only producer of a gate, take their activation with them.
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["x", f"w{g}", f"b{g}"], [f"pre_{g}"], transB=1) for g in range(4)] + [
        helper.make_node("Tanh" if g == 2 else "Sigmoid", [f"pre_{g}"], [f"gate_{g}"]) for g in range(4)
    ]
    inits = {f"w{g}": rng.standard_normal((16, 16)).astype(np.float32) for g in range(4)}
    inits |= {f"b{g}": rng.standard_normal(16).astype(np.float32) for g in range(4)}
    fused = make(nodes, [("x", [2, 16])], [(f"gate_{g}", [2, 16]) for g in range(4)], inits)
    whats = [n.cost.what for n in node_costs(fused) if n.cost.kind == "timed"]
    assert whats == [f"Gemm 2x16 16x16 16 + {'Tanh' if g == 2 else 'Sigmoid'}" for g in range(4)]
