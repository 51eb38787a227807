"""einopt.runtime.bench: equality first, interleaved timing, profiles (einopt.core.cost: tests/test_cost.py).

No assertion here compares times (the machine is shared and noisy); only
counts, structure, and that the ratios are the ratios of the medians.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx_models import conv_block, tiny_model

from einopt.errors import ModelError
from einopt.runtime import bench

QUICK = {"min_runs": 3, "max_runs": 4, "budget_s": 0.05, "warmup": 1}


W = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)


def matmul_model():
    return tiny_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [4, 32])], [("y", [4, 16])], [("w", W)]
    )


def transposed_matmul_model(w=W):
    nodes = [
        helper.make_node("Transpose", ["wt"], ["w"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    return tiny_model(nodes, [("x", [4, 32])], [("y", [4, 16])], [("wt", np.ascontiguousarray(w.T))])


def test_equal_models_are_timed_and_described():
    s = bench.bench_models(matmul_model(), transposed_matmul_model(), **QUICK)
    assert s["equal"] and s["message"] == "" and s["max_error"] < 1e-5
    assert 3 <= s["runs"] <= 4
    low, high = s["speedup_95"]  # the speedup is the paired runs' median ratio, inside its interval
    assert low <= s["speedup"] <= high
    for side in ("original", "optimized"):
        st = s[side]
        assert st["p10_ms"] <= st["median_ms"] <= st["p90_ms"] and st["min_ms"] <= st["median_ms"]
        assert st["flops"] == 2 * 4 * 16 * 32 and st["kernels"] >= 1
    assert s["original"]["nodes"] == 1 and s["optimized"]["nodes"] == 2
    # ORT folds the Transpose of a constant weight: both run one MatMul kernel
    assert s["original"]["kernels"] == s["optimized"]["kernels"] == 1
    assert set(s["original"]["time_by_op"]) == {"MatMul"}
    assert set(s["machine"]) >= {"onnxruntime", "cpu", "threads", "cores", "python", "einopt", "platform"}


def test_models_that_differ_are_not_timed_unless_forced():
    other = transposed_matmul_model(W + 1)
    s = bench.bench_models(matmul_model(), other, **QUICK)
    assert not s["equal"] and "differs" in s["message"]
    assert s["speedup"] is None and s["original"]["median_ms"] is None and s["runs"] == 0
    forced = bench.bench_models(matmul_model(), other, force=True, **QUICK)
    assert not forced["equal"] and forced["speedup"] > 0


def test_signature_and_input_mismatches_are_model_errors():
    wider = tiny_model(
        [helper.make_node("MatMul", ["z", "w"], ["y"])], [("z", [4, 32])], [("y", [4, 16])], [("w", W)]
    )
    with pytest.raises(ModelError, match="different inputs or outputs"):
        bench.bench_models(matmul_model(), wider, **QUICK)
    with pytest.raises(ModelError):
        bench.bench_models(matmul_model(), matmul_model(), {"x": np.ones((4, 31), np.float32)}, **QUICK)
    with pytest.raises(ModelError, match=r"unknown names \['z'\], missing \['x'\]"):
        bench.bench_models(matmul_model(), matmul_model(), {"z": np.ones((4, 32), np.float32)}, **QUICK)


def test_profile_counts_kernels_per_run():
    x = np.ones((4, 32), np.float32)
    assert bench.profile_model(matmul_model(), {"x": x}, runs=3)["kernels"] == 1
    chain = [
        helper.make_node(op, [a], [b])
        for op, a, b in (("Sin", "x", "s"), ("Cos", "s", "c"), ("Sin", "c", "y"))
    ]
    p = bench.profile_model(tiny_model(chain, [("x", [4, 32])], [("y", [4, 32])]), {"x": x}, runs=4)
    assert p["kernels"] == 3 and set(p["time_by_op"]) == {"Sin", "Cos"}
    p = bench.profile_model(conv_block(), {"x": np.ones((1, 8, 6, 6), np.float32)}, runs=3)
    assert p["kernels"] >= 1 and all(v >= 0 for v in p["time_by_op"].values())


def test_global_thread_pool_in_a_fresh_process(tmp_path):
    """The CLI's mode: one global pool, every einopt session joins it (own process: pools are per process)."""
    import os
    import subprocess
    import sys

    import onnx

    onnx.save(matmul_model(), str(tmp_path / "m.onnx"))
    code = (
        "from einopt.runtime import bench, modelio\n"
        "import numpy as np, onnx\n"
        f"m = onnx.load({str(tmp_path / 'm.onnx')!r})\n"
        "s = bench.bench_models(m, m, min_runs=2, max_runs=2, budget_s=0.01, warmup=0)\n"
        "assert s['equal'] and s['machine']['thread_pool'] == 'global', s['machine']\n"
        "modelio.run(modelio.session(m), {'x': np.ones((4, 32), np.float32)})\n"
        "print('ok', s['machine']['threads'])\n"
    )
    env = dict(os.environ, EINOPT_THREAD_POOL="global")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr


def test_time_models_in_blocks_when_both_do_not_fit(monkeypatch):
    """Big models are timed one session at a time, in alternating blocks, with the same result shape."""
    monkeypatch.setattr(bench.modelio, "available_bytes", lambda: 1)
    x = {"x": np.ones((4, 32), np.float32)}
    c = bench.time_models(matmul_model(), transposed_matmul_model(), x, min_runs=5, max_runs=6, budget_s=0.05)
    assert c.before.runs >= 5 and c.after.runs >= 5 and c.speedup > 0


def test_bench_reports_warmup_and_reliability():
    s = bench.bench_models(matmul_model(), matmul_model(), **QUICK)
    assert s["warmup_rounds"] >= 1 and isinstance(s["unreliable"], str)


def test_time_models_pairs_its_rounds():
    """Interleaved timing keeps one ratio per round: as many pairs as runs, the interval around the
    median (no ratio is asserted)."""
    m = conv_block()
    x = {"x": np.zeros((1, 8, 6, 6), np.float32)}
    c = bench.time_models(m, m, x, min_runs=30, max_runs=30, budget_s=0.0)
    assert c.ratio is not None and c.ratio.pairs == 30 == c.before.runs
    assert c.ratio.low <= c.ratio.median <= c.ratio.high and c.gain_interval == (c.ratio.low, c.ratio.high)
