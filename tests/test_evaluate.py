"""The evaluation (einopt.evaluation: run, tables, checks) without timing: targets, selection, tables, the PyTorch
reference check, and the OpenVINO column (n/a without the package)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from einopt.evaluation import checks, run, tables

GENERATED = ["dcgan", "lstm"]
SHARED = ["bert_tiny", "espcn_x3", "se_block"]


def _model(path: Path) -> Path:
    """x0 [2, 3] -> relu (Relu) and neg (Neg): two outputs, so the output order and names are checked."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x0"], ["relu"]), helper.make_node("Neg", ["x0"], ["neg"])],
        "tiny",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("relu", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("neg", TensorProto.FLOAT, [2, 3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _row(name: str, **over) -> dict:
    row = {
        "model": name,
        "exporter": "dynamo",
        "file": f"{name}.json",
        "ort_ms": 2.0,
        "einopt_ms": 1.6,
        "speedup": 1.25,
        "kernels": [10, 8],
        "found": 1,
        "subprograms": 4,
        "optimize_s": 12.5,
        "verified": True,
        "ort_equal": True,
        "pytorch": {"input": {"ok": True}, "output": {"ok": True, "max_error": 1e-7, "message": ""}},
        "passed_through": {"nodes": 0, "reasons": {}},
        "openvino": {"speedup": 1.14, "equal": True, "max_error": 1e-6},
    }
    return row | over


# ----------------------------------------------------------------------------- targets


@pytest.mark.parametrize(
    "name, goal",
    [
        ("lstm_linear_cell", 1.2),
        ("lstm_linear_cell_dynamo", 1.2),
        ("bert_tiny", 1.1),
        ("gpt2_tiny_dynamo", 1.1),
        ("vit_tiny_dynamo", 1.1),
        ("large_kernel_block", 1.0),
        ("dcgan_tiny_b4", 1.0),
        ("prelu_net", 1.0),
        ("espcn_x3", 1.0),
        ("unet_tiny", 0.99),
        ("mobilenet_v3_small", 0.99),
    ],
)
def test_shared_targets_come_from_the_targets_file(name, goal):
    assert tables.shared_target(name) == goal


def test_a_target_is_met_only_when_verified_and_timed():
    assert tables.met(1.2, 1.2) == "met"
    assert tables.met(1.19, 1.2) == "**missed**"
    assert tables.met(1.5, 1.2, verified=False) == "**missed**"
    assert tables.met(None, 0.99) == "**missed**"


# ----------------------------------------------------------------------------- selection


def test_models_default_to_both_sections_and_take_names_or_section_words():
    folder = Path("shared")
    assert run.select(None, GENERATED, SHARED, folder) == (GENERATED, SHARED)
    assert run.select(["shared"], GENERATED, SHARED, folder) == ([], SHARED)
    assert run.select(["generated"], GENERATED, SHARED, folder) == (GENERATED, [])
    assert run.select(["se_block", "lstm", "bert_tiny"], GENERATED, SHARED, folder) == (
        ["lstm"],
        ["bert_tiny", "se_block"],
    )


def test_unknown_models_and_an_absent_shared_folder_are_clear_errors():
    folder = Path("/nowhere/shared/models")
    with pytest.raises(
        ValueError, match=r"unknown model nope; choose from .*dcgan.*bert_tiny.*generated / shared"
    ):
        run.select(["nope", "lstm"], GENERATED, SHARED, folder)
    with pytest.raises(ValueError, match=r"/nowhere/shared/models is absent.*bert_tiny"):
        run.select(["bert_tiny"], GENERATED, None, folder)
    with pytest.raises(ValueError, match="absent"):
        run.select(["shared"], GENERATED, None, folder)
    # without --models, an absent folder skips the section
    assert run.select(None, GENERATED, None, folder) == (GENERATED, [])


def test_read_index(tmp_path):
    assert run.read_index(tmp_path / "absent") is None
    with pytest.raises(SystemExit, match="cannot read the shared models' index"):
        run.read_index(tmp_path)
    (tmp_path / "index.json").write_text(
        json.dumps({"tiny": {"exporter": "dynamo", "inputs": {"x0": [2, 3]}}})
    )
    with pytest.raises(SystemExit, match=r"missing: tiny.onnx, tiny.npz"):
        run.read_index(tmp_path)
    _model(tmp_path / "tiny.onnx")
    np.savez(tmp_path / "tiny.npz", x0=np.zeros((2, 3), np.float32))
    assert run.read_index(tmp_path) == {"tiny": {"exporter": "dynamo", "inputs": {"x0": [2, 3]}}}


# ----------------------------------------------------------------------------- PyTorch's outputs


def test_split_reference_separates_inputs_from_pytorchs_outputs():
    a, b, c = (np.full(2, k, np.float32) for k in range(3))
    feeds, outputs = checks.split_reference({"y1": c, "x0": a, "y0": b})
    assert list(feeds) == ["x0"] and feeds["x0"] is a
    assert [o[0] for o in outputs] == [1, 2]  # y0, y1 in order
    with pytest.raises(ValueError, match="'z' is neither"):
        checks.split_reference({"x0": a, "z": b}, "m.npz")
    with pytest.raises(ValueError, match=r"y0..y1, got \[0, 2\]"):
        checks.split_reference({"x0": a, "y0": b, "y2": c})


def test_reference_agreement_uses_the_verification_tolerance():
    ref = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    near = ref + np.float32(1e-5)  # within atol 1e-4 * max(1, |ref|max) + rtol 1e-3 * |ref|
    ok = checks.reference_agreement({"out": near}, [ref])
    assert ok["ok"] and ok["max_error"] == pytest.approx(1e-5, rel=0.1)
    far = ref.copy()
    far[1, 2] += 0.1
    bad = checks.reference_agreement({"out": far}, [ref])
    assert not bad["ok"] and "y0 (out)" in bad["message"] and "[1, 2]" in bad["message"]
    count = checks.reference_agreement({"a": ref, "b": ref}, [ref])
    assert not count["ok"] and count["message"] == "the model has 2 outputs, PyTorch's reference 1"


def test_side_checks_compare_the_input_and_the_output_with_pytorchs_outputs(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # not installed: no OpenVINO timing either
    model = _model(tmp_path / "m.onnx")
    x = np.array([[-1, 0, 2], [3, -4, 5]], np.float32)
    np.savez(tmp_path / "in.npz", x0=x)
    np.savez(tmp_path / "good.npz", x0=x, y0=np.maximum(x, 0), y1=-x)
    np.savez(tmp_path / "swapped.npz", x0=x, y0=-x, y1=np.maximum(x, 0))
    job = checks.SideJob(model, tmp_path / "in.npz", 1, 0.1, True, tmp_path / "good.npz", model)
    out = checks.side_checks(job)
    assert out["pytorch"]["input"]["ok"] and out["pytorch"]["output"]["ok"]
    assert out["openvino"] == {"speedup": None, "note": "n/a (pip install openvino)"}
    swapped = checks.side_checks(
        checks.SideJob(model, tmp_path / "in.npz", 1, 0.1, False, tmp_path / "swapped.npz")
    )
    assert not swapped["pytorch"]["output"]["ok"] and "y0 (relu)" in swapped["pytorch"]["output"]["message"]
    assert swapped["openvino"] is None


# ----------------------------------------------------------------------------- OpenVINO


def test_without_openvino_the_column_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    assert checks.import_openvino() is None
    result = checks.compare_openvino(
        Path("unused.onnx"), None, {}, 2, 1.0
    )  # returns before any model is read
    assert result == {"speedup": None, "note": checks.OPENVINO_MISSING}
    assert checks.openvino_text(result) == "n/a (pip install openvino)"
    table = tables.shared_markdown([_row("bert_tiny", openvino=result)], {}, "cmd")
    assert "| n/a (pip install openvino) |" in table


def test_openvino_text():
    assert checks.openvino_text(None) == "-"
    assert checks.openvino_text({"speedup": 1.2345, "equal": True, "max_error": 0.0}) == "1.23x"
    differs = checks.openvino_text({"speedup": 0.9, "equal": False, "max_error": 0.0123})
    assert differs == "0.90x (outputs differ from ORT's: 0.012)"


def test_openvino_runs_with_einopts_threads_in_float32():
    config = checks.openvino_config(3)
    assert config["INFERENCE_NUM_THREADS"] == 3 and config["INFERENCE_PRECISION_HINT"] == "f32"
    assert config["NUM_STREAMS"] == 1 and config["PERFORMANCE_HINT"] == "LATENCY"


def test_openvino_outputs_are_taken_by_their_onnx_names(tmp_path):
    ov = pytest.importorskip(
        "openvino", reason="openvino is the optional bench extra (pip install -e .[bench])"
    )
    model = _model(tmp_path / "m.onnx")
    x = np.array([[-1, 0, 2], [3, -4, 5]], np.float32)
    _, got = checks.run_openvino(ov, model, {"x0": x}, 1, ["neg", "relu"])  # the graph's order is relu, neg
    assert list(got) == ["neg", "relu"]
    np.testing.assert_array_equal(got["neg"], -x)
    np.testing.assert_array_equal(got["relu"], np.maximum(x, 0))


# ----------------------------------------------------------------------------- tables


def test_passthrough_counts_nodes_by_reason():
    report = {
        "counts": {"passed_through": 4},
        "subprograms": [
            {"kind": "passthrough", "ops": ["Softmax"], "reason": "no importer for Softmax"},
            {"kind": "linear", "ops": ["MatMul"], "reason": ""},
            {"kind": "passthrough", "ops": ["Erf"], "reason": "no importer for Erf"},
            {"kind": "passthrough", "ops": ["Softmax"], "reason": "no importer for Softmax"},
            {"kind": "passthrough", "ops": ["Cast"], "reason": ""},
        ],
    }
    p = run.passthrough(report)
    assert p == {
        "nodes": 4,
        "reasons": {"no importer for Softmax": 2, "no importer for Erf": 1, "no reason given": 1},
    }
    text = tables.passthrough_text(p)
    assert text == "4: no importer for Softmax x2; no importer for Erf; no reason given"
    assert tables.passthrough_text({"nodes": 0, "reasons": {}}) == "0"
    assert tables.passthrough_text({"nodes": 1, "reasons": {"a | b": 1}}) == "1: a \\| b"


def test_shared_markdown_rows_marks_and_reasons():
    rows = [
        _row("bert_tiny", speedup=1.12),
        _row(
            "gpt2_tiny_dynamo",
            speedup=1.05,
            passed_through={"nodes": 3, "reasons": {"no importer for Softmax": 2, "no importer for Erf": 1}},
        ),
        _row(
            "se_block",
            verified=False,
            pytorch={
                "input": {"ok": True},
                "output": {"ok": False, "message": "output 'y0 (40)' differs at [0, 1]: 1 vs 2"},
            },
            openvino={"speedup": 0.8, "equal": False, "max_error": 0.5},
        ),
        {"model": "unet_tiny", "exporter": "torchscript", "file": "unet_tiny.json", "error": "exit 3"},
    ]
    table = tables.shared_markdown(rows, {"cpu": "CPU X", "threads": 2, "onnxruntime": "1.2"}, "cmd")
    lines = table.splitlines()
    assert lines[0].startswith("Measured ") and "CPU X, 2 threads" in lines[0] and "`cmd`" in lines[0]
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header[:7] == ["model", "exporter", "ORT ms", "einopt ms", "speedup", "target", "OpenVINO vs ORT"]
    body = {line.split("|")[1].strip(): line for line in lines[4:8]}
    assert "| 1.12x | >= 1.10x met | 1.14x |" in body["bert_tiny"]
    assert "| >= 1.10x **missed** |" in body["gpt2_tiny_dynamo"]
    assert "| 3: no importer for Softmax x2; no importer for Erf |" in body["gpt2_tiny_dynamo"]
    assert "| yes / yes |" in body["bert_tiny"]
    se = body["se_block"]
    assert "| >= 0.99x **missed** |" in se  # 1.25x, but not equal to PyTorch's outputs
    assert "| yes / NO: output 'y0 (40)' differs at [0, 1]: 1 vs 2 |" in se
    assert "0.80x (outputs differ from ORT's: 0.5)" in se
    assert "failed: exit 3" in body["unet_tiny"] and ">= 0.99x **missed**" in body["unet_tiny"]
    assert lines[-1] == "Targets met: 1 of 4. Geometric mean of the speedups: 1.14x."
    assert len(header) == len(body["bert_tiny"].strip().strip("|").split(" | "))


def test_generated_markdown_has_the_openvino_column():
    row = _row("lstm", batch=1, confirmation=None, accepted=1, rewritten=1, rolled_back=0)
    table = tables.markdown([row], {}, "cmd")
    header, _, line = table.split("\n\n")[1].splitlines()[:3]
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells[7] == "OpenVINO vs ORT"
    assert [c.strip() for c in line.strip("|").split("|")][7] == "1.14x"


def test_an_output_identical_to_its_input_counts_as_one_and_shows_the_noise():
    same = _row("unet_tiny", speedup=0.93, identical=True)
    slower = _row("se_block", speedup=0.93, identical=False)
    table = tables.shared_markdown([same, slower], {}, "cmd")
    body = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "| 1.00x (output = input; read 0.93x) | >= 0.99x met |" in body["unet_tiny"]
    assert "| 0.93x | >= 0.99x **missed** |" in body["se_block"]
    assert tables.speedup(same) == 1.0 and tables.speedup(slower) == 0.93
    assert table.splitlines()[-1] == "Targets met: 1 of 2. Geometric mean of the speedups: 0.96x."
    # a transformer's bar stays out of reach of an output that is its input
    vit = _row("vit", batch=16, speedup=0.93, identical=True, confirmation=None, accepted=0, rewritten=6)
    line = tables.markdown([vit | {"rolled_back": 6}], {}, "cmd").split("\n\n")[1].splitlines()[2]
    assert "| 1.00x (output = input; read 0.93x) | >= 1.10x **missed** |" in line


def test_render_rewrites_the_tables_and_finds_identical_outputs_from_the_files(tmp_path, monkeypatch):
    out, build, shared = tmp_path / "results", tmp_path / "build", tmp_path / "shared"
    for d in (out, build, shared):
        d.mkdir()
    machine = {"cpu": "CPU X", "threads": 2, "onnxruntime": "1.2"}
    original = {"time_by_op": {"MatMul": 3.0, "Softmax": 1.0}}  # a row measured before the bound
    (out / "bert_tiny.json").write_text(json.dumps({"bench": {"machine": machine, "original": original}}))
    for name, output in (("bert_tiny", b"model"), ("se_block", b"other")):
        (shared / f"{name}.onnx").write_bytes(b"model")
        (build / f"{name}.einopt.onnx").write_bytes(output)
    rows = [_row("bert_tiny", speedup=0.97), _row("se_block", file="bert_tiny.json", speedup=0.97)]
    run.write_summary([], rows, "cmd", out, "abc", "2026-11-28")
    args = SimpleNamespace(out=out, build=build, shared=shared, size="full", no_readme=True, kernels="onnx")
    assert run.render(args, {"bert_tiny": {}, "se_block": {}}) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [r["identical"] for r in summary["shared_rows"]] == [True, False]
    assert [r["dense_bound"] for r in summary["shared_rows"]] == [pytest.approx(4 / 3)] * 2
    assert (summary["code"], summary["date"], summary["command"]) == ("abc", "2026-11-28", "cmd")
    assert "1.00x (output = input; read 0.97x)" in (out / "results.md").read_text()


def test_write_summary_keeps_both_sections(tmp_path):
    machine = {"cpu": "CPU X", "threads": 2, "onnxruntime": "1.2"}
    (tmp_path / "bert_tiny.json").write_text(json.dumps({"bench": {"machine": machine}}))
    table, shared = run.write_summary([], [_row("bert_tiny")], "cmd", tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rows"] == [] and summary["shared_rows"][0]["model"] == "bert_tiny"
    assert summary["machine"] == machine
    assert table == "" and "| bert_tiny | dynamo |" in shared
    assert (tmp_path / "results.md").read_text() == "## Shared exporter models\n\n" + shared


def test_a_resumed_run_keeps_the_finished_rows_of_the_same_command_and_code(tmp_path):
    machine = {"cpu": "CPU X", "threads": 2, "onnxruntime": "1.2"}
    (tmp_path / "bert_tiny.json").write_text(json.dumps({"bench": {"machine": machine}}))
    done = _row("bert_tiny", measured="2026-11-28T13:00:00+00:00", sitting="2026-11-28T12:00:00+00:00")
    failed = {"model": "se_block", "exporter": "dynamo", "error": "exit 1"}
    generated = {"model": "lstm", "batch": 16, "measured": "2026-11-29T01:00:00+00:00", "sitting": "s2"}
    generated |= {"accepted": 1, "rewritten": 1, "rolled_back": 0}
    run.write_summary(
        [generated | _row("lstm", file="bert_tiny.json")], [done, failed], "cmd", tmp_path, "abc"
    )
    kept = run.resumable(tmp_path, "cmd", "abc")
    assert list(kept) == [("lstm", 16), ("bert_tiny", None)]  # the failed row runs again
    assert run.resumable(tmp_path / "none", "cmd", "abc") == {}
    with pytest.raises(ValueError, match="other code"):
        run.resumable(tmp_path, "cmd", "abd")
    with pytest.raises(ValueError, match="another command"):
        run.resumable(tmp_path, "cmd --batch 1", "abc")
    # the tables say the run was resumed, over which days
    table = tables.shared_markdown([done, generated | _row("x")], machine, "cmd")
    assert "Measured 2026-11-28 to 2026-11-29 (one run of the same code, resumed: 2 sittings" in table


def test_the_code_fingerprint_names_the_installed_package():
    first = run.code_fingerprint()
    assert len(first) == 16 and first == run.code_fingerprint()


def test_replace_block_replaces_only_its_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        f"a\n{tables.START}\nold\n{tables.END}\nb\n{tables.SHARED_START}\nold shared\n{tables.SHARED_END}\nc\n"
    )
    tables.replace_block(readme, "new shared\n", tables.SHARED_START, tables.SHARED_END)
    assert readme.read_text() == (
        f"a\n{tables.START}\nold\n{tables.END}\nb\n{tables.SHARED_START}\nnew shared\n{tables.SHARED_END}\nc\n"
    )
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="shared-results:start"):
        tables.replace_block(readme, "x", tables.SHARED_START, tables.SHARED_END)


def test_a_run_publishes_a_section_only_when_it_covers_every_model(tmp_path, monkeypatch):
    readme, page = tmp_path / "README.md", tmp_path / "results.md"
    readme.write_text(f"{tables.START}\nold\n{tables.END}\n")
    page.write_text(f"{tables.SHARED_START}\nold shared\n{tables.SHARED_END}\n")
    monkeypatch.setattr(run, "README", readme)
    monkeypatch.setattr(run, "TABLES", page)
    compared = []
    monkeypatch.setattr(run, "compare_kernels", lambda rows, command, args, whole: compared.append(whole))
    args = SimpleNamespace(kernels="onnx", no_readme=False, size="full")
    run.publish(args, "cmd", ([], []), ("generated\n", "shared\n"), (False, True))
    assert "old\n" in readme.read_text() and "\nshared\n" in page.read_text()
    run.publish(args, "cmd", ([], []), ("generated\n", "shared again\n"), (True, False))
    assert "\ngenerated\n" in readme.read_text() and "shared again" not in page.read_text()
    run.publish(
        SimpleNamespace(**(args.__dict__ | {"no_readme": True})),
        "cmd",
        ([], []),
        ("x\n", "y\n"),
        (True, True),
    )
    assert "\ngenerated\n" in readme.read_text() and "\nshared\n" in page.read_text()
    # another backend's run writes its comparison, never the portable run's blocks
    tvm = SimpleNamespace(**(args.__dict__ | {"kernels": "tvm"}))
    run.publish(tvm, "cmd", ([], []), ("x\n", "y\n"), (True, False))
    run.publish(tvm, "cmd", ([], []), ("x\n", "y\n"), (True, True))
    assert compared == [False, True]
    assert "\ngenerated\n" in readme.read_text() and "\nshared\n" in page.read_text()


def test_a_failed_side_process_shows_in_the_openvino_column():
    failed = run._side_openvino({"error": "the measuring process died (out of memory?)"})
    assert checks.openvino_text(failed) == "failed: the measuring process died (out of memory?)"
    assert run._side_openvino({"openvino": None}) is None  # --no-openvino: "-"


@pytest.mark.parametrize(
    "model, batch, goal",
    [("lstm", 1, 1.25), ("bert", 1, 1.1), ("gpt2", 16, 1.1), ("vit", 16, 1.1), ("resnet18", 16, 0.99)],
)
def test_generated_targets(model, batch, goal):
    assert tables.target({"model": model, "batch": batch}) == goal


def test_kernels_table_sets_each_tvm_row_beside_the_onnx_row_with_its_target():
    onnx_rows = [
        _row("lstm", batch=1, speedup=1.5, kernels=[21, 12]),
        _row("gcn", batch=1, speedup=1.05, kernels=[71, 80]),
        _row("se_block", speedup=1.0, identical=True),
    ]
    tvm_rows = [
        _row("lstm", batch=1, speedup=2.1, kernels=[21, 5], dense_bound=1.65),  # meets 2.0x
        _row("gcn", batch=1, speedup=1.11, kernels=[71, 94]),  # above onnx, below 1.15x
        _row("se_block", speedup=0.93),  # not identical: a real reading below the onnx row
        _row("dcgan", batch=16, error="exit 1"),
    ]
    table = tables.kernels_markdown(onnx_rows, tvm_rows, {}, "python scripts/evaluate.py --kernels tvm")
    lines = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert (
        "2.10x" in lines["lstm"]
        and ">= 2.00x and >= onnx met" in lines["lstm"]
        and "21 -> 12 / 5" in lines["lstm"]
    )
    assert "1.05x" in lines["gcn"] and ">= 1.15x and >= onnx **missed**" in lines["gcn"]
    assert "| 1.65x |" in lines["lstm"] and "| - |" in lines["gcn"]  # no profile: no bound
    assert all(line.count("|") == lines["model"].count("|") for line in lines.values())
    assert "1.00x (output = input" in lines["se_block"] and "**missed**" in lines["se_block"]  # 0.93 < 0.99
    assert "failed: exit 1" in lines["dcgan"]
    assert "Geometric mean with `--kernels tvm`" in table and "target >= 1.4x" in table


def test_the_dense_op_bound_is_the_profile_over_its_convolutions_and_products():
    # a transformer layer's profile: 8 ms of GEMMs (MatMul, Gemm, FusedMatMul), 2 ms of the rest
    profile = {"Gemm": 5.0, "MatMul": 2.0, "FusedMatMul": 1.0, "SkipLayerNormalization": 1.5, "Gelu": 0.5}
    assert run.dense_bound({"time_by_op": profile}) == pytest.approx(10.0 / 8.0)
    nchwc = {"time_by_op": {"Conv": 3.0, "ReorderOutput": 1.0}}
    assert run.dense_bound(nchwc) == pytest.approx(4.0 / 3.0)
    assert run.dense_bound({"time_by_op": {"Relu": 1.0}}) is None and run.dense_bound({}) is None


def test_a_side_by_side_reading_decides_whether_a_tvm_row_is_slower_than_its_onnx_row():
    onnx_rows = [_row("lstm", batch=1, speedup=2.3, kernels=[21, 12]), _row("gcn", batch=1, speedup=1.2)]
    tvm_rows = [_row("lstm", batch=1, speedup=2.05, kernels=[21, 3]), _row("gcn", batch=1, speedup=1.3)]
    paired = [
        # the two runs' columns differ by 11% (read hours apart), the outputs side by side tie
        {"model": "lstm", "batch": 1, "speedup": 0.99, "speedup_95": [0.98, 1.0], "unreliable": ""},
        # the columns say tvm is faster; side by side it is slower
        {"model": "gcn", "batch": 1, "speedup": 0.9, "speedup_95": [0.89, 0.91], "unreliable": "",
         "measured": "2026-11-30T01:02:03+00:00"},
    ]  # fmt: skip
    table = tables.kernels_markdown(onnx_rows, tvm_rows, {}, "cmd", paired)
    lines = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "0.99x (95% 0.98-1.00x)" in lines["lstm"] and ">= 2.00x and >= onnx met" in lines["lstm"]
    assert "0.90x (95% 0.89-0.91x)" in lines["gcn"] and "**missed**" in lines["gcn"]
    assert "side by side" in lines["model"] and "2026-11-30 01:02" in table
    assert all(line.count("|") == lines["model"].count("|") for line in lines.values())
    # without the readings, the columns decide (and the table has no side-by-side column)
    plain = tables.kernels_markdown(onnx_rows, tvm_rows, {}, "cmd")
    assert "side by side" not in plain and "**missed**" in plain.split("| lstm |")[1].splitlines()[0]


def _run(results: Path, name: str, output: Path, inputs: Path, **over) -> None:
    """A results folder holding one finished row of ``name`` whose report names ``output`` and ``inputs``."""
    results.mkdir(exist_ok=True)
    report = {
        "output": str(output),
        "command": f"einopt -q optimize m.onnx -o {output} --inputs {inputs} --bench",
    }
    (results / f"{name}.json").write_text(json.dumps(report))
    row = _row(name, **over)
    (results / "summary.json").write_text(json.dumps({"rows": [], "shared_rows": [row]}))


def test_compare_forms_times_the_two_outputs_against_each_other(tmp_path):
    from einopt.evaluation import forms as compare_forms

    model = _model(tmp_path / "model.onnx")
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x0=np.arange(6, dtype=np.float32).reshape(2, 3) - 2)
    other = onnx.load(model)
    other.graph.name = "renamed"  # other bytes, the same function
    onnx.save(other, tmp_path / "other.onnx")
    _run(tmp_path / "onnx", "se_block", model, inputs)
    _run(tmp_path / "tvm", "se_block", tmp_path / "other.onnx", inputs)
    (reading,) = compare_forms.compare(tmp_path / "onnx", tmp_path / "tvm", None, budget=0.1)
    assert (
        reading["speedup"] > 0 and reading["speedup_95"][0] <= reading["speedup"] <= reading["speedup_95"][1]
    )
    assert "tvm" in compare_forms.describe(reading)
    # the same file: 1.00x untimed; a file gone: an error naming it
    _run(tmp_path / "tvm", "se_block", model, inputs)
    (same,) = compare_forms.compare(tmp_path / "onnx", tmp_path / "tvm", None, budget=0.1)
    assert same["identical"] and same["speedup"] == 1.0
    _run(tmp_path / "tvm", "se_block", tmp_path / "gone.onnx", inputs)
    (gone,) = compare_forms.compare(tmp_path / "onnx", tmp_path / "tvm", None, budget=0.1)
    assert "gone.onnx" in gone["error"]
    assert compare_forms.compare(tmp_path / "onnx", tmp_path / "tvm", ["lstm"], budget=0.1) == []


def test_compare_forms_replaces_only_the_rows_it_measured_again(tmp_path):
    from einopt.evaluation import forms as compare_forms

    path = tmp_path / "forms.json"
    path.write_text(
        json.dumps({"rows": [{"model": "a", "batch": 1, "speedup": 1.0}, {"model": "b", "speedup": 2.0}]})
    )
    merged = compare_forms.merge(path, [{"model": "b", "speedup": 3.0}])
    assert merged["rows"] == [{"model": "a", "batch": 1, "speedup": 1.0}, {"model": "b", "speedup": 3.0}]


def test_einopt_evaluate_is_the_evaluation_on_the_command_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from einopt.cli import main

    monkeypatch.chdir(tmp_path)
    shown = CliRunner().invoke(main, ["evaluate", "--help"])
    assert shown.exit_code == 0 and "--resume" in shown.output and "einopt evaluate" in shown.output
    refused = CliRunner().invoke(
        main, ["evaluate", "--models", "no_such", "--shared", str(tmp_path / "none")]
    )
    assert refused.exit_code == 2
