"""`einopt bench` and `einopt optimize --bench`: reports with timings, exit codes, no partial files.

Timings are never compared here (the machine is noisy); only that they exist,
are consistent (the speedup is the median of the paired runs' ratios, inside its 95% interval)
and that the reports render.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx_models import conv_block, disable_operators, lstm_cell

from einopt.cli import EXIT_CODES, main
from einopt.pipeline import Options, optimize
from einopt.reports.measure import measure_parts

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

QUICK = ("--budget", "0.3", "--min-runs", "3", "--max-runs", "5")


def run(*args):
    from click.testing import CliRunner

    return CliRunner().invoke(main, [str(a) for a in args])


def _save(model, path):
    onnx.save(model, str(path))
    return path


def test_optimize_bench_writes_timed_report_and_html(tmp_path, monkeypatch):
    disable_operators(monkeypatch)  # every subprogram becomes an eOperator, timed by acceptance
    src = _save(conv_block(), tmp_path / "in.onnx")
    out, report, html = tmp_path / "out.onnx", tmp_path / "r.json", tmp_path / "r.html"
    result = run("optimize", src, "-o", out, "--bench", *QUICK, "--report", report, "--html", html)
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["einopt_report"] == 3 and data["model"] == str(src) and data["output"] == str(out)
    b = data["bench"]
    assert b["equal"] and b["runs"] >= 3
    assert b["speedup_95"][0] <= b["speedup"] <= b["speedup_95"][1]
    assert b["original"]["kernels"] > 0 and b["original"]["flops"] > 0 and b["machine"]["onnxruntime"]
    rewritten = [p for p in data["subprograms"] if p["status"] in ("accepted", "not faster")]
    assert rewritten and all(p["bench"]["original_ms"] > 0 and p["bench"]["speedup"] > 0 for p in rewritten)
    assert "<svg" in html.read_text()
    assert "speedup" in result.output.lower()


def test_optimize_report_without_bench_has_no_timings(tmp_path):
    src = _save(conv_block(), tmp_path / "in.onnx")
    report, html = tmp_path / "r.json", tmp_path / "r.html"
    # depth 0: no subprogram changes, so acceptance times nothing either
    args = ("--report", report, "--html", html, "--max-depth", 0)
    result = run("optimize", src, "-o", tmp_path / "out.onnx", *args)
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["bench"] is None and all(p["bench"] is None for p in data["subprograms"])
    assert html.exists()


def test_bench_identical_models_are_equal(tmp_path):
    src = _save(conv_block(), tmp_path / "a.onnx")
    report = tmp_path / "r.json"
    result = run("bench", src, src, *QUICK, "--report", report)
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["bench"]["equal"] and data["subprograms"] == []
    assert data["bench"]["original"]["kernels"] == data["bench"]["optimized"]["kernels"]


def test_bench_refuses_models_that_differ(tmp_path):
    a = _save(conv_block(seed=0), tmp_path / "a.onnx")
    b = _save(conv_block(seed=1), tmp_path / "b.onnx")
    report = tmp_path / "r.json"
    result = run("bench", a, b, *QUICK, "--report", report)
    assert result.exit_code == EXIT_CODES["mismatch"], result.output
    assert "differs" in result.output and "Traceback" not in result.output
    assert json.loads(report.read_text())["bench"]["equal"] is False


def test_bench_with_wrong_inputs_is_a_clear_error(tmp_path):
    src = _save(conv_block(), tmp_path / "a.onnx")
    np.savez(tmp_path / "x.npz", y=np.ones((1, 8, 6, 6), np.float32))
    result = run("bench", src, src, *QUICK, "--inputs", tmp_path / "x.npz")
    assert result.exit_code == EXIT_CODES["bad_input"], result.output
    assert result.output.startswith("einopt: error:") and "Traceback" not in result.output


@pytest.mark.parametrize(
    "args, code",
    [
        (("--min-runs", "5", "--max-runs", "2"), EXIT_CODES["usage"]),
        (("--html", "no/such/dir/r.html"), EXIT_CODES["bad_input"]),
    ],
)
def test_bad_bench_options_fail_before_running(tmp_path, args, code):
    src = _save(conv_block(), tmp_path / "a.onnx")
    out = tmp_path / "out.onnx"
    result = run("optimize", src, "-o", out, "--bench", *args)
    assert result.exit_code == code, result.output
    assert not out.exists()


def test_measure_parts_times_every_rewritten_part(monkeypatch):
    disable_operators(monkeypatch)
    result = optimize(conv_block(), Options(seed=0, accept="verified"))
    timings = measure_parts(result, min_runs=3, max_runs=3, budget_s=0.1)
    rewritten = {p.name for p in result.parts if p.status == "rewritten"}
    assert set(timings) == rewritten
    for t in timings.values():
        assert t["original_ms"] > 0 and t["optimized_ms"] > 0
        assert t["speedup_95"][0] <= t["speedup"] <= t["speedup_95"][1]
    with_timings = result.with_part_timings(timings).report()
    assert {p["name"] for p in with_timings["subprograms"] if p["bench"]} == rewritten


def test_python_dash_m_runs_the_registered_commands():
    import subprocess
    import sys

    for module in ("einopt", "einopt.cli"):
        out = subprocess.run(
            [sys.executable, "-P", "-m", module, "bench", "--help"], capture_output=True, text=True
        )
        assert out.returncode == 0 and "ORIGINAL OPTIMIZED" in out.stdout, out.stderr


def test_part_pairs_in_small_capture_groups_match_one_big_capture():
    from einopt.runtime import modelio
    from einopt.stages.verify import part_pairs

    result = optimize(
        lstm_cell(hidden=8),
        Options(seed=0, accept="verified", states_per_search=1_000, states_per_model=2_000),
    )
    ws = result.workspace
    assert ws.parts, "no rewrite to pair"
    whole = list(part_pairs(ws.model, ws.parts, ws.emitted, ws.feeds))
    one_by_one = list(part_pairs(ws.model, ws.parts, ws.emitted, ws.feeds, max_bytes=0))
    assert [p.name for p in whole] == [p.name for p in one_by_one] == [p.name for p in ws.parts]
    for a, b in zip(whole, one_by_one, strict=True):
        assert a.original_feeds.keys() == b.original_feeds.keys()
        for k in a.original_feeds:
            np.testing.assert_array_equal(a.original_feeds[k], b.original_feeds[k])
        ref = modelio.run(b.original, b.original_feeds)
        got = modelio.run(b.rewritten, b.rewritten_feeds)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=1e-5)


def _relu_model(inputs, outputs, dtype=onnx.TensorProto.FLOAT):
    """Relu of each input ``(name, shape)`` into the output of the same position."""
    nodes = [onnx.helper.make_node("Relu", [i], [o]) for (i, _), (o, _) in zip(inputs, outputs, strict=True)]
    graph = onnx.helper.make_graph(
        nodes,
        "g",
        [onnx.helper.make_tensor_value_info(n, dtype, s) for n, s in inputs],
        [onnx.helper.make_tensor_value_info(n, dtype, s) for n, s in outputs],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(
    "optimized, message",
    [
        (
            _relu_model([("x", ["N", 3])], [("y", ["N", 3])], onnx.TensorProto.FLOAT16),
            "input 'x' float32[N,3] vs input 'x' float16[N,3]; output 'y' float32[N,3] vs output 'y' float16[N,3]",
        ),
        (
            _relu_model([("x", ["N", 3]), ("z", [2])], [("y", ["N", 3]), ("w", [2])]),
            "input 'z' float32[2] is only in the optimized model; output 'w' float32[2] is only in the optimized model",
        ),
        (
            _relu_model([("a", ["N", 3])], [("y", ["N", 3])]),
            "input 'x' float32[N,3] is only in the original; input 'a' float32[N,3] is only in the optimized model",
        ),
    ],
    ids=["element type", "extra input and output", "renamed input"],
)
def test_bench_names_what_differs_between_the_models(tmp_path, optimized, message):
    original = _save(_relu_model([("x", ["N", 3])], [("y", ["N", 3])]), tmp_path / "a.onnx")
    result = run("bench", original, _save(optimized, tmp_path / "b.onnx"), *QUICK)
    assert result.exit_code == EXIT_CODES["bad_input"], result.output
    assert f"different inputs or outputs: {message}\n" in result.output


def test_bench_names_inputs_in_another_order(tmp_path):
    original = _relu_model([("x", [2]), ("z", [2])], [("y", [2]), ("w", [2])])
    swapped = _relu_model([("z", [2]), ("x", [2])], [("w", [2]), ("y", [2])])
    result = run("bench", _save(original, tmp_path / "a.onnx"), _save(swapped, tmp_path / "b.onnx"), *QUICK)
    assert result.exit_code == EXIT_CODES["bad_input"], result.output
    assert (
        "in another order: inputs ['x', 'z'], outputs ['y', 'w'] vs inputs ['z', 'x'], outputs ['w', 'y']"
        in result.output
    )
