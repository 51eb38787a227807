"""``einopt search``: JSON shape, candidates equal to the input, the ONNX output, the schedule, errors."""

from __future__ import annotations

import io
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from rich.console import Console

import einopt
from einopt.cli import EXIT_CODES, main
from einopt.cli import search as cli_search
from einopt.cli.source import example_text
from einopt.instantiate.program import as_program
from einopt.rules import check_equivalent
from einopt.search import DEFAULT_CONVERGE_DEPTH, DEFAULT_MAX_DEPTH, DEFAULT_SCHEDULE, Stats

MATMUL = "L[i:6, j:5] Sum[k:4] X[i, k] * W[k, j] where X: [6, 4], W: [4, 5]"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def conv3x3() -> einopt.Program:
    return as_program(einopt.parse(example_text("conv3x3")))


@pytest.fixture(scope="module")
def conv_json():
    result = run("search", "--example", "conv3x3", "--max-depth", 1, "--top", 10, "--json", "--trace")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # the whole of stdout is one JSON object


def test_json_shape(conv_json):
    assert set(conv_json) == {"candidates", "stats"}
    cands = conv_json["candidates"]
    assert [c["rank"] for c in cands] == list(range(len(cands)))
    for c in cands:
        assert isinstance(c["program"], str) and isinstance(c["cost"], float) and c["cost"] > 0
        assert isinstance(c["depth"], int) and c["depth"] == len(c["trace"])
        assert c["operators"] and all(isinstance(op, str) for op in c["operators"])
        for step in c["trace"]:
            assert {"rule", "where", "summary", "phase", "program"} <= set(step)
            assert step["rule"] in {u.rule for u in (*DEFAULT_SCHEDULE.explore, *DEFAULT_SCHEDULE.converge)}
    assert [c["cost"] for c in cands] == sorted(c["cost"] for c in cands)
    stats = conv_json["stats"]
    assert set(stats) == set(Stats().as_dict())
    assert stats["generated"] > 0 and stats["expanded"] >= 1 and stats["complete"] is True
    assert isinstance(stats["pruned"], int) and isinstance(stats["seconds"], float)


def test_candidates_parse_back_and_equal_the_input(conv_json):
    before = conv3x3()
    cands = conv_json["candidates"]
    assert any(c["depth"] == 0 for c in cands), "the input is always among the candidates"
    assert any(c["depth"] > 0 for c in cands), "depth 1 finds rewrites of a 3x3 convolution"
    for c in cands:
        after = einopt.parse(c["program"])
        assert isinstance(after, einopt.Program)
        assert after.outputs == before.outputs
        assert {(t.name, t.shape) for t in after.inputs} == {(t.name, t.shape) for t in before.inputs}
        assert "float64" in check_equivalent(before, after)
        for step in c["trace"]:  # every program on the way is equal too
            check_equivalent(before, einopt.parse(step["program"]), modes=("float64",))


def test_tiny_matmul_json():
    result = run("search", "-e", MATMUL, "--max-depth", 2, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (first, *_) = data["candidates"]
    assert first["operators"] == ["MatMul"] and first["depth"] == 0
    check_equivalent(as_program(einopt.parse(MATMUL)), einopt.parse(first["program"]))


def test_table_and_trace():
    result = run("search", "--example", "conv3x3", "--max-depth", 1, "--top", 2, "--trace")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "einopt search: the best 2 candidates" in out and "operators" in out and "vs input" in out
    assert "1.00x" in out  # the input's own row
    assert "states generated" in out and "pruned" in out
    assert " at Y" in out and "(explore)" in out  # a derivation step: rule at where: summary (phase)
    assert "return Y" in out  # the program after a step


def test_progress_line_on_a_terminal(monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(
        cli_search, "console", lambda min_width=0: Console(file=buffer, force_terminal=True, width=140)
    )
    result = run("search", "--example", "conv3x3", "--max-depth", 1, "--top", 1)
    assert result.exit_code == 0, result.output
    text = buffer.getvalue()
    assert "searching: depth 1/1" in text and "states (" in text and "/s), best" in text
    assert "einopt search: the best 1 candidate (" in text


def test_quiet_prints_nothing():
    result = run("-q", "search", "-e", MATMUL, "--max-depth", 1)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


def test_max_states_returns_what_was_found_by_then():
    # conv3x3_offset_reduce generates 656 states to depth 4
    args = ("search", "--example", "conv3x3_offset_reduce", "--max-depth", 4, "--max-states", 120)
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert (stats["generated"], stats["complete"], stats["stopped"]) == (120, False, "states")
    text = run(*args)
    assert "the search stopped at its --max-states" in text.stdout


def test_max_states_gives_the_same_candidates_with_jobs():
    args = (
        "search",
        "--example",
        "conv3x3_offset_reduce",
        "--max-depth",
        4,
        "--max-states",
        300,
        "--top",
        10,
    )
    args += ("--json",)
    one, two = (json.loads(run(*args, "--jobs", jobs).stdout) for jobs in (1, 2))
    assert one["candidates"] == two["candidates"]
    assert one["stats"]["generated"] == two["stats"]["generated"] == 300


def test_time_budget_is_a_safety_net_that_says_so():
    result = run("search", "--example", "conv3x3", "--max-depth", 5, "--time-budget", 1e-6, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["stats"]["complete"], data["stats"]["stopped"]) == (False, "deadline")
    assert [c["depth"] for c in data["candidates"]] == [0]  # only the input, costed before any step


def test_jobs_do_not_change_the_candidates(conv_json):
    result = run("search", "--example", "conv3x3", "--max-depth", 1, "--top", 10, "--json", "--jobs", 2)
    assert result.exit_code == 0, result.output
    got = [(c["program"], c["cost"]) for c in json.loads(result.stdout)["candidates"]]
    assert got == [(c["program"], c["cost"]) for c in conv_json["candidates"]]


def test_onnx_output_runs_and_equals_the_interpreter(tmp_path):
    out = tmp_path / "best.onnx"
    result = run("search", "--example", "conv3x3", "--max-depth", 1, "--onnx", out, "--json")
    assert result.exit_code == 0, result.output
    best = json.loads(result.stdout)["candidates"][0]  # --onnx leaves stdout one JSON object
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    got_ops = [f"eop:{n.op_type}" if n.domain else n.op_type for n in model.graph.node]
    assert got_ops == best["operators"]
    rng = np.random.default_rng(1)
    feeds = {"A": rng.standard_normal((14, 14, 16)), "K": rng.standard_normal((3, 3, 32, 16))}
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {k: v.astype(np.float32) for k, v in feeds.items()})
    want = einopt.evaluate(conv3x3(), feeds)["Y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert [p.name for p in tmp_path.iterdir()] == ["best.onnx"]  # no temporary file left behind


def test_onnx_that_differs_from_the_interpreter_is_not_written(tmp_path, monkeypatch):
    wrong = einopt.to_onnx(
        einopt.parse("L[i:6, j:5] Sum[k:4] X[i, k] * W[k, j] * 2.0 where X: [6, 4], W: [4, 5]")
    )
    monkeypatch.setattr(einopt, "to_onnx", lambda source, constants=None: wrong)
    out = tmp_path / "best.onnx"
    result = run("search", "-e", MATMUL, "--max-depth", 1, "--onnx", out)
    assert result.exit_code == EXIT_CODES["mismatch"], result.output
    assert "differs from the interpreter" in result.output and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_explain_schedule_names_every_phase_and_rule():
    result = run("search", "--explain-schedule")
    assert result.exit_code == 0, result.output
    for phase, uses in DEFAULT_SCHEDULE.phases().items():
        assert f"{phase}:" in result.stdout
        for use in uses:
            assert use.label() in result.stdout


def test_help_states_the_search_defaults():
    text = " ".join(run("search", "--help").stdout.split())
    assert f"DEFAULT_MAX_DEPTH, {DEFAULT_MAX_DEPTH}" in text
    assert f"DEFAULT_CONVERGE_DEPTH, {DEFAULT_CONVERGE_DEPTH}" in text


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["-e", "L[i:3] X[i"], "bad_input", "line 1, col"),
        (["-e", "L[i:3] X[i] +"], "bad_input", "<expr>"),
        (["--example", "nope"], "bad_input", "unknown example"),
        ([], "bad_input", "exactly one of"),
        (["/nonexistent/file.ein"], "bad_input", "cannot read"),
        (["-e", MATMUL, "--max-depth", "-1"], "usage", "--max-depth must be a non-negative integer"),
        (["-e", MATMUL, "--converge-depth", "-2"], "usage", "--converge-depth must be"),
        (["-e", MATMUL, "--jobs", "0"], "usage", "--jobs must be at least 1"),
        (["-e", MATMUL, "--jobs", "-3"], "usage", "--jobs"),
        (["-e", MATMUL, "--time-budget", "0"], "usage", "--time-budget must be positive"),
        (["-e", MATMUL, "--time-budget", "-5"], "usage", "--time-budget must be positive"),
        (["-e", MATMUL, "--max-states", "0"], "usage", "--max-states must be a positive integer"),
        (["-e", MATMUL, "--top", "0"], "usage", "--top must be at least 1"),
        (["-e", MATMUL, "--onnx", "/nonexistent/dir/out.onnx"], "bad_input", "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(args, code, message):
    result = run("search", *args)
    assert result.exit_code == EXIT_CODES[code] != 0, result.output
    assert result.stdout == "" and "Traceback" not in result.output
    assert result.stderr.startswith("einopt: error:") and message in result.stderr
    if code == "usage":
        assert len(result.stderr.splitlines()) == 1


def test_ctrl_c_is_one_line_and_exit_130_with_no_output_file(tmp_path, monkeypatch):
    """An interrupted search prints no traceback and leaves no partial model."""
    import einopt.search as search_package

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(search_package, "search", interrupted)
    out = tmp_path / "best.onnx"
    result = run("search", "-e", MATMUL, "--onnx", out)
    assert result.exit_code == EXIT_CODES["interrupted"] == 130
    assert result.output.strip() == "einopt: error: interrupted" and "Traceback" not in result.output
    assert not list(tmp_path.iterdir())
