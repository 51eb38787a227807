"""The fuzzer's search mode and its ONNX Runtime optimizer check (``scripts/fuzz.py --max-depth N``).

An output einopt computes correctly can still be one that ONNX Runtime's
graph optimizer (``ORT_ENABLE_ALL``, what a user runs) refuses to load or
miscomputes; :func:`einopt.testing.graphs.check_case` counts that as its own
failure, ``ort``, unless the original model trips the optimizer too.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from einopt.testing import graphs
from einopt.testing.graphs import GraphCase, check_case, feeds, ort_optimizer_refusal

FUZZ = Path(__file__).resolve().parents[1] / "scripts" / "fuzz.py"


def _conv_model(weight_steps: list[str], pad_input: bool = False) -> onnx.ModelProto:
    """``Conv(x, steps(w))`` with ``w`` a graph input; a step is ``Pad`` (of the kernel's start),
    ``Mul`` (by 1) or ``Slice`` (the first 5 of 6 kernel positions); ``pad_input`` pads ``x`` first
    (the fuzzer's smallest case). The Conv's pads keep the output at ``[6, 4, 2]``."""
    nodes, inits, value = [], [], "w"
    constants = {
        "Pad": np.array([0, 0, 1, 0, 0, 0], dtype=np.int64),
        "Mul": np.array(1.0, dtype=np.float32),
    }
    for k, step in enumerate(weight_steps):
        if step == "Slice":
            ins = [numpy_helper.from_array(np.array([v], dtype=np.int64), f"s{k}_{v}") for v in (0, 5, 2)]
        else:
            ins = [numpy_helper.from_array(constants[step], f"c{k}")]
        inits += ins
        nodes.append(helper.make_node(step, [value, *(t.name for t in ins)], [f"w{k}"]))
        value = f"w{k}"
    w_shape = [4, 1, 6] if "Slice" in weight_steps else [4, 1, 5]
    x = "x"
    if pad_input:
        inits.append(numpy_helper.from_array(np.array([0, 1, 0, 2, 0, 1], dtype=np.int64), "pads"))
        nodes.append(helper.make_node("Pad", ["x", "pads"], ["p"]))
        x = "p"
    kernel = 5 + weight_steps.count("Pad")
    nodes.append(
        helper.make_node(
            "Conv",
            [x, value],
            ["y"],
            group=4,
            kernel_shape=[kernel],
            dilations=[2],
            pads=[2 * (kernel - 5), 2],
        )
    )
    x_shape = [4, 3, 7] if pad_input else [6, 4, 8]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, w_shape),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4, 2])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _case(model: onnx.ModelProto) -> GraphCase:
    return GraphCase(model, tuple(n.op_type for n in model.graph.node), frozenset({"zero", "int"}))


def _datasets(case: GraphCase) -> list[tuple[str, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)
    return [(kind, feeds(case, rng, kind)) for kind in ("ordinary", "special")]


def test_ort_optimizer_refusal_says_what_ort_does():
    # A Pad of the weight, also behind a Mul by 1 (ONNX Runtime drops that Mul first)
    for steps in (["Pad"], ["Pad", "Mul"]):
        padded = _case(_conv_model(steps))
        kind, detail = ort_optimizer_refusal(padded.model, _datasets(padded))
        assert kind == "" and "does not load at ORT_ENABLE_ALL" in detail
    for steps in (["Slice"], []):
        fine = _case(_conv_model(steps))
        assert ort_optimizer_refusal(fine.model, _datasets(fine)) is None, steps


def _fake_optimize(output: onnx.ModelProto):
    def optimize(model, options):
        return types.SimpleNamespace(model=output)

    return optimize


def test_check_case_counts_what_the_ort_optimizer_refuses(monkeypatch):
    # The fuzzer's smallest case and what einopt made of it at depth 3 before the Conv matcher
    # refused to pad a run-time weight: equal, but ONNX Runtime's Pad fusion breaks it.
    original = _case(_conv_model([], pad_input=True))
    monkeypatch.setattr(graphs, "optimize", _fake_optimize(_conv_model(["Pad"], pad_input=True)))
    assert check_case(original, 0).status == "ok"  # the check is asked for
    outcome = check_case(original, 0, ort_optimizer=True)
    assert outcome.status == "ort" and "the output does not load at ORT_ENABLE_ALL" in outcome.detail
    assert outcome.optimized is not None and not outcome.ort_input


def test_check_case_does_not_count_what_the_original_inherits(monkeypatch):
    original = _case(_conv_model(["Pad"]))
    monkeypatch.setattr(graphs, "optimize", _fake_optimize(original.model))
    outcome = check_case(original, 0, ort_optimizer=True)
    assert outcome.status == "ok"
    assert outcome.ort_input.startswith("the original does not load at ORT_ENABLE_ALL")


def test_check_case_searches_at_a_depth():
    # The fuzzer's smallest case: at depth 3 boundary relaxing widens the kernel of the run-time
    # weight; the rewrite must be one ONNX Runtime's optimizer loads (it was a Pad of the weight).
    case = _case(_conv_model([], pad_input=True))
    plain = check_case(case, 0, max_depth=0, ort_optimizer=True)
    assert plain.status == "ok", plain.detail
    assert [n.op_type for n in plain.optimized.graph.node] == ["Pad", "Conv"]
    searched = check_case(case, 0, max_depth=3, ort_optimizer=True)
    assert searched.status == "ok", searched.detail
    assert [n.op_type for n in searched.optimized.graph.node] != ["Pad", "Conv"]


def _fuzz_script() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_script", FUZZ)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fuzz_script_search_mode(tmp_path, capsys):
    fuzz = _fuzz_script()
    assert fuzz.main(["--graphs", "3", "--max-depth", "2", "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "3 graphs (seed 0, search depth 2," in out
    assert "0 outputs the ORT optimizer refuses" in out and "ORT refuses" in out
    with pytest.raises(SystemExit):
        fuzz.main(["--graphs", "1", "--max-depth", "-1"])
