"""Rewrites kept at the searched shape of a model's symbolic dimensions only
(:mod:`einopt.stages.specialize`): a run-time test of the input shapes runs the rewrite there and the
input's own nodes at every other shape."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace as NS

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx_models import assert_same_outputs, conv_block, disable_operators

from einopt.frontend.symbolic import declared_shapes
from einopt.frontend.translate import Part
from einopt.instantiate.emit import Instantiated
from einopt.opsets import KERNEL_DOMAIN
from einopt.pipeline import Options, optimize
from einopt.runtime import modelio
from einopt.runtime.verify import subgraph_model
from einopt.stages.export import assemble
from einopt.stages.select import Trial, choose
from einopt.stages.specialize import SHAPE_DOMAIN, specialized

VERIFIED = Options(max_depth=0, accept="verified", cache=False)


def _relu_then_scale() -> onnx.ModelProto:
    """``Relu(x) * s`` over ``x: [batch, 4]``."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "s"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.full([4], 3.0, np.float32), "s")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_the_rewrite_runs_at_the_searched_shape_and_the_input_nodes_at_every_other():
    model = _relu_then_scale()
    part = Part("p", "linear", (0, 1), NS(outputs=["y0"]), {"y0": "y"})
    # a "rewrite" that differs from the part on purpose: which branch ran shows in the output
    rewrite = Instantiated(
        (helper.make_node("Mul", ["x", "p/minus"], ["y"]),),
        (numpy_helper.from_array(np.full([4], -1.0, np.float32), "p/minus"),),
        (),
        (),
    )
    inst = specialized(model, part, rewrite, {"x": (2, 4)}, prefix="p/", taken=set())
    (call,) = inst.nodes
    assert call.domain == SHAPE_DOMAIN and list(call.input) == ["x", "s"] and list(call.output) == ["y"]
    assert not inst.initializers  # the rewrite's constants are its branch's own
    out = assemble(model, {(0, 1): inst})
    onnx.checker.check_model(out, full_check=True)
    assert [d.dim_param for d in out.graph.input[0].type.tensor_type.shape.dim] == ["batch", ""]
    for batch in (1, 2, 3, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        want = -x if batch == 2 else np.maximum(x, 0) * 3
        np.testing.assert_array_equal(_run(out, x), want)


def test_what_cannot_be_tested_at_run_time_is_not_specialized():
    model = _relu_then_scale()
    part = Part("p", "linear", (0, 1), NS(outputs=["y0"]), {"y0": "y"})
    rewrite = Instantiated((helper.make_node("Relu", ["x"], ["y"]),), (), (), ())
    assert specialized(model, part, rewrite, {}, prefix="p/", taken=set()) is None  # no symbolic input
    generated = dataclasses.replace(
        rewrite, nodes=(helper.make_node("K", ["x"], ["y"], domain=KERNEL_DOMAIN),)
    )
    assert specialized(model, part, generated, {"x": (2, 4)}, prefix="p/", taken=set()) is None  # found
    # among the graph's nodes only


def test_a_rewrite_that_holds_at_the_representative_batch_only_runs_there(monkeypatch):
    disable_operators(monkeypatch)  # eOperators: functions whose Reshapes are written for the batch of 1
    model = conv_block(batch="N")
    result = optimize(model, VERIFIED)
    assert result.changed()
    for p in (p for p in result.parts if p.kind != "passthrough"):
        assert p.status == "rewritten" and p.only_at == "N=1", p.reason
        assert "run at N=1 only (the input's nodes at other values)" in p.reason
        assert "holds at the representative shape only" in p.reason
        assert not any(op.startswith(SHAPE_DOMAIN) for op in p.new_ops)  # what runs at N=1
    assert {f.domain for f in result.model.functions} >= {SHAPE_DOMAIN}
    dims = [d.dim_value or d.dim_param for d in result.model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", 8, 6, 6]
    for batch in (1, 2, 5):
        assert_same_outputs(model, result.model, modelio.random_inputs(model, batch, {"x": (batch, 8, 6, 6)}))
    report = json.loads(json.dumps(result.report() | {"model": "m.onnx", "output": "o.onnx"}))
    section = report["symbolic"]
    assert section["searched_shape_only"] == [p.name for p in result.parts if p.only_at]
    assert section["left_out"] == []
    from einopt.reports.report import validate_report
    from einopt.reports.report_html import render_html

    validate_report(report)
    assert "at the searched values only" in render_html(report)


def test_a_tie_at_the_searched_shape_goes_to_the_rewrite_that_holds_at_every_shape():
    def trial(speedup: float, only_at) -> Trial:
        candidate = NS(depth=1, cost=1.0)
        return Trial(
            "p", candidate, instantiated=NS(nodes=[None], only_at=only_at), measured=NS(speedup=speedup)
        )

    general, special, faster = trial(1.50, None), trial(1.55, "b=1"), trial(1.80, "b=1")
    best, tried = choose([special, general], timed=True)
    assert best is general and "searched shape only" in tried[0].rejected
    assert choose([faster, general], timed=True)[0] is faster  # clearly faster there: kept there
    assert choose([special, general], timed=False)[0] is general


def test_parts_are_timed_with_their_inputs_declared_as_the_output_declares_them():
    model = conv_block(batch="N")
    declared = declared_shapes(model)
    assert declared["x"] == ("N", 8, 6, 6) and declared["y"][0] == "N"
    assert all(isinstance(d, int) for d in declared["c1"][1:])  # Conv keeps the size it can tell
    x = np.zeros((1, 8, 6, 6), np.float32)
    part = subgraph_model(model, [model.graph.node[1]], {"c1": x}, ["r1"], declared=declared)
    dims = [d.dim_param or d.dim_value for d in part.graph.input[0].type.tensor_type.shape.dim]
    assert dims == list(declared["c1"])
    static = subgraph_model(model, [model.graph.node[1]], {"c1": x}, ["r1"])
    assert [d.dim_value for d in static.graph.input[0].type.tensor_type.shape.dim] == [1, 8, 6, 6]


def test_a_model_that_keeps_symbolic_dimensions_times_its_parts_so(monkeypatch):
    from einopt.stages import context

    seen = []
    real = context.part_pairs

    def spy(*args, **kwargs):
        seen.append(kwargs.get("declared"))
        return real(*args, **kwargs)

    monkeypatch.setattr(context, "part_pairs", spy)
    disable_operators(monkeypatch)  # rewritten at depth 0: something to time
    options = Options(max_depth=0, cache=False, part_budget_s=0.1, model_budget_s=0.5)
    optimize(conv_block(batch="N"), options)
    assert seen and all(d and d["x"] == ("N", 8, 6, 6) for d in seen)
    seen.clear()
    optimize(conv_block(batch="N"), dataclasses.replace(options, input_shapes={"x": (1, 8, 6, 6)}))
    assert seen and not any(seen)  # pinned: a static output, timed static
