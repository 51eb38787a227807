"""einopt.bench: equality first, interleaved timing, profiles; einopt.cost: FLOPs and bytes.

No assertion here compares times (the machine is shared and noisy); only
counts, structure, and that the ratios are the ratios of the medians.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_models import conv_block

from einopt import bench
from einopt.cost import model_cost
from einopt.errors import ModelError
from einopt.pipeline import Options, optimize

QUICK = {"min_runs": 3, "max_runs": 4, "budget_s": 0.05, "warmup": 1}


def _model(nodes, inputs, outputs, inits=(), functions=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in inits],
    )
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("einopt.eop", 1)] if functions else [])
    m = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    m.ir_version = 8
    return m


W = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)


def matmul_model():
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [4, 32])], [("y", [4, 16])], [("w", W)]
    )


def transposed_matmul_model(w=W):
    nodes = [
        helper.make_node("Transpose", ["wt"], ["w"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    return _model(nodes, [("x", [4, 32])], [("y", [4, 16])], [("wt", np.ascontiguousarray(w.T))])


def test_equal_models_are_timed_and_described():
    s = bench.bench_models(matmul_model(), transposed_matmul_model(), **QUICK)
    assert s["equal"] and s["message"] == "" and s["max_error"] < 1e-5
    assert 3 <= s["runs"] <= 4
    assert s["speedup"] == pytest.approx(s["original"]["median_ms"] / s["optimized"]["median_ms"])
    for side in ("original", "optimized"):
        st = s[side]
        assert st["p10_ms"] <= st["median_ms"] <= st["p90_ms"] and st["min_ms"] <= st["median_ms"]
        assert st["flops"] == 2 * 4 * 16 * 32 and st["kernels"] >= 1
    assert s["original"]["nodes"] == 1 and s["optimized"]["nodes"] == 2
    assert set(s["machine"]) >= {"onnxruntime", "cpu", "threads", "cores", "python", "einopt", "platform"}


def test_models_that_differ_are_not_timed_unless_forced():
    other = transposed_matmul_model(W + 1)
    s = bench.bench_models(matmul_model(), other, **QUICK)
    assert not s["equal"] and "differs" in s["message"]
    assert s["speedup"] is None and s["original"]["median_ms"] is None and s["runs"] == 0
    forced = bench.bench_models(matmul_model(), other, force=True, **QUICK)
    assert not forced["equal"] and forced["speedup"] > 0


def test_signature_and_input_mismatches_are_model_errors():
    wider = _model(
        [helper.make_node("MatMul", ["z", "w"], ["y"])], [("z", [4, 32])], [("y", [4, 16])], [("w", W)]
    )
    with pytest.raises(ModelError, match="different inputs or outputs"):
        bench.bench_models(matmul_model(), wider, **QUICK)
    with pytest.raises(ModelError):
        bench.bench_models(matmul_model(), matmul_model(), {"x": np.ones((4, 31), np.float32)}, **QUICK)


def test_time_interleaved_rotates_and_respects_run_limits():
    calls = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "abc"}
    t = bench.time_interleaved(fns, warmup=1, min_runs=5, max_runs=5, budget_s=100)
    assert all(v.runs == 5 for v in t.values())
    timed = calls[3:]  # after one warm-up call each
    assert timed[:3] == ["a", "b", "c"] and timed[3:6] == ["b", "c", "a"] and timed[6:9] == ["c", "a", "b"]
    calls.clear()
    t = bench.time_interleaved(fns, warmup=0, min_runs=2, max_runs=1000, budget_s=0.0)
    assert all(v.runs == 2 for v in t.values())
    with pytest.raises(ValueError):
        bench.time_interleaved(fns, min_runs=3, max_runs=2)


def test_profile_counts_kernels_per_run():
    x = np.ones((4, 32), np.float32)
    assert bench.profile_model(matmul_model(), {"x": x}, runs=3)["kernels"] == 1
    p = bench.profile_model(conv_block(), {"x": np.ones((1, 8, 6, 6), np.float32)}, runs=3)
    assert p["kernels"] >= 1 and all(v >= 0 for v in p["time_by_op"].values())


def test_configure_threads_is_idempotent():
    n = bench.configure_threads()
    assert bench.configure_threads(n + 3) == n
    assert bench.machine_info(n)["thread_pool"] in {"global", "per-session"}


def test_cost_of_conv_and_conv_transpose():
    x = ("x", [1, 8, 6, 6])
    w = np.zeros((4, 8, 3, 3), np.float32)
    conv = _model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        [x],
        [("y", [1, 4, 6, 6])],
        [("w", w)],
    )
    c = model_cost(conv)
    assert c.flops == 2 * 4 * 36 * 8 * 9
    assert c.bytes == 4 * (8 * 36 + 4 * 8 * 9 + 4 * 36) and c.unknown == []
    wt = np.zeros((8, 4, 4, 4), np.float32)
    ct = _model(
        [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])],
        [x],
        [("y", [1, 4, 12, 12])],
        [("w", wt)],
    )
    assert model_cost(ct).flops == 2 * 8 * 36 * 4 * 16


def test_cost_of_views_and_eoperator_functions():
    reshape = _model(
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
    m = _model(
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
