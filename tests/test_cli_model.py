"""`einopt optimize` and `einopt inspect`: outputs, reports, exit codes, no partial files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx_models import conv_block

from einopt.cli import EXIT_CODES, main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _save(model, path):
    onnx.save(model, str(path))
    return path


def test_optimize_writes_a_verified_model_and_report(tmp_path):
    src = _save(conv_block(), tmp_path / "in.onnx")
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    # depth 0: every subprogram comes back as its own nodes (the search's rewrites: test_optimize_search)
    result = run("optimize", src, "-o", out, "--report", report, "--seed", 3, "--max-depth", 0)
    assert result.exit_code == 0, result.output
    assert "accepted 0 / rewritten 0 / total 4" in result.output and "verified equal" in result.output
    assert "the output is the input" in result.output
    data = json.loads(report.read_text())
    assert data["verified"] and data["counts"]["subprograms"] == 4 and data["counts"]["unchanged"] == 4
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(0).standard_normal((1, 8, 6, 6)).astype(np.float32)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_optimize_with_inputs_npz_and_input_shape(tmp_path):
    src = _save(conv_block(batch="N"), tmp_path / "in.onnx")
    np.savez(tmp_path / "x.npz", x=np.ones((2, 8, 6, 6), np.float32))
    out = tmp_path / "out.onnx"
    result = run("optimize", src, "-o", out, "--input-shape", "x=2,8,6,6", "--inputs", tmp_path / "x.npz")
    assert result.exit_code == 0, result.output
    assert "total 4" in result.output
    # nothing was rewritten, so the output is the input: its symbolic batch dimension stays
    assert onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


def test_bad_input_file_is_a_clear_error_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model at all")
    out = tmp_path / "out.onnx"
    result = run("optimize", bad, "-o", out)
    assert result.exit_code == EXIT_CODES["bad_input"]
    assert result.output.startswith("einopt: error:") and "Traceback" not in result.output
    assert not out.exists() and list(tmp_path.iterdir()) == [bad]


def test_missing_file(tmp_path):
    result = run("optimize", tmp_path / "nope.onnx", "-o", tmp_path / "o.onnx")
    assert result.exit_code == EXIT_CODES["bad_input"]
    assert "nope.onnx" in result.output


def test_bad_input_shape_spec(tmp_path):
    src = _save(conv_block(), tmp_path / "in.onnx")
    result = run("optimize", src, "-o", tmp_path / "o.onnx", "--input-shape", "x=1,two")
    assert result.exit_code == EXIT_CODES["bad_input"]
    result = run("optimize", src, "-o", tmp_path / "o.onnx", "--input-shape", "nosuch=1,2")
    assert result.exit_code == EXIT_CODES["bad_input"] and "nosuch" in result.output


@pytest.mark.parametrize(
    ("flag", "spec", "says"),
    [
        ("--dim", "N=two", "is not NAME=VALUE, NAME=LO..HI or NAME=LO..HI/STEP"),
        ("--dim", "N=0", "a dimension is at least 1"),
        ("--time-shapes", "N=2,M", "is not NAME=VALUE"),
        ("--time-shapes", "N=1..4", "give one value (NAME=VALUE), not a range"),
    ],
)
def test_a_bad_dimension_value_is_a_usage_error_and_writes_nothing(tmp_path, flag, spec, says):
    src = _save(conv_block(batch="N"), tmp_path / "in.onnx")
    result = run("optimize", src, "-o", tmp_path / "o.onnx", flag, spec)
    assert result.exit_code == 2 and says in result.output and flag in result.output
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("opset", [1, 6, 99])
def test_an_unsupported_opset_exits_6_with_one_line_and_writes_nothing(opset, tmp_path):
    model = conv_block()
    model.opset_import[0].version = opset
    src = _save(model, tmp_path / "in.onnx")
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    said = (
        f"einopt: error: {src} imports default-domain opset {opset}; einopt supports opsets 7 to "
        f"{onnx.defs.onnx_opset_version()} (onnx.version_converter can convert a model between opsets)"
    )
    for args in (
        ("optimize", src, "-o", out, "--report", report),
        ("optimize", src, "-o", out, "--no-verify", "--accept", "verified"),
        ("bench", src, src, "--report", report),
        ("inspect", src),
    ):
        result = run(*args)
        assert result.exit_code == EXIT_CODES["unsupported"], (args, result.output)
        assert result.output.splitlines() == [said], args
    assert list(tmp_path.iterdir()) == [src]


def test_search_controls_are_checked_in_cli_and_api_alike(tmp_path):
    from einopt.pipeline import Options

    src = _save(conv_block(), tmp_path / "in.onnx")
    for flag, value in (
        ("--max-depth", -1),
        ("--jobs", 0),
        ("--time-budget", 0),
        ("--max-states", 0),
        ("--model-states", -5),
        ("--top-k", -2),
    ):
        result = run("optimize", src, "-o", tmp_path / "o.onnx", flag, value)
        assert result.exit_code == EXIT_CODES["usage"], (flag, result.output)
        assert not (tmp_path / "o.onnx").exists()
    for bad in (
        {"max_depth": -1},
        {"jobs": 0},
        {"deadline_s": 0.0},
        {"states_per_search": 0},
        {"states_per_model": 1.5},
        {"top_k": True},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Options(**bad)


def test_accept_verified_and_cache_flags(tmp_path, monkeypatch):
    from onnx_models import disable_operators

    disable_operators(monkeypatch)  # every subprogram becomes an eOperator, so there is something to time
    src = _save(conv_block(), tmp_path / "in.onnx")
    cache, report = tmp_path / "c" / "m.sqlite", tmp_path / "r.json"
    for _ in range(2):
        result = run("optimize", src, "-o", tmp_path / "o.onnx", "--cache", cache, "--report", report)
        assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["acceptance"]["cache"]["path"] == str(cache)
    assert data["acceptance"]["cache"]["measured"] == 0 and data["acceptance"]["cache"]["hits"] >= 3
    assert "0 timings made" in result.output and "from the cache" in result.output
    result = run("optimize", src, "-o", tmp_path / "o.onnx", "--accept", "verified", "--report", report)
    assert result.exit_code == 0 and "not timed" in result.output
    assert json.loads(report.read_text())["acceptance"]["mode"] == "verified"
    result = run("optimize", src, "-o", tmp_path / "o.onnx", "--cache", cache, "--no-cache")
    assert result.exit_code == EXIT_CODES["usage"]


def test_no_verify(tmp_path):
    src = _save(conv_block(), tmp_path / "in.onnx")
    result = run("optimize", src, "-o", tmp_path / "o.onnx", "--no-verify")
    assert result.exit_code == 0, result.output
    assert "NOT verified" in result.output


def test_inspect_prints_expressions(tmp_path):
    src = _save(conv_block(), tmp_path / "in.onnx")
    result = run("inspect", src, "--all")
    assert result.exit_code == 0, result.output
    assert result.output.count("# sp") == 4
    assert "Sum[" in result.output and "relu(" in result.output


def test_missing_output_directory_fails_before_optimizing(tmp_path, monkeypatch):
    from einopt import pipeline

    src = _save(conv_block(), tmp_path / "in.onnx")
    monkeypatch.setattr(pipeline, "optimize", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    result = run("optimize", src, "-o", tmp_path / "no" / "out.onnx")
    assert result.exit_code == EXIT_CODES["bad_input"] and "does not exist" in result.output


def _into_closed_pipe(cwd, *args) -> subprocess.CompletedProcess:
    """Run ``einopt ARGS`` with stdout a pipe whose reader has already gone (like ``| head`` done early).

    It runs in ``cwd``, away from the checkout: ``python -m`` puts the working directory first on
    ``sys.path``, where the source tree's ``einopt/`` (without ``rules/`` and ``models/``, which
    are mapped in at install time) would shadow the installed package.
    """
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-P", "-m", "einopt", *map(str, args)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize("command", [["inspect", "IN", "--all"], ["examples"], ["rules"], ["models"]])
def test_closed_stdout_pipe_is_a_quiet_normal_exit(tmp_path, command):
    # click.echo writes `inspect` and `examples`, rich the tables of `rules` and `models`
    src = _save(conv_block(), tmp_path / "in.onnx")
    out = _into_closed_pipe(tmp_path, *(src if arg == "IN" else arg for arg in command))
    assert out.returncode == EXIT_CODES["ok"], out.stderr
    assert out.stderr == ""


def test_head_reading_two_lines_of_inspect_is_quiet(tmp_path):
    src = _save(conv_block(), tmp_path / "in.onnx")
    einopt = subprocess.Popen(
        [sys.executable, "-P", "-m", "einopt", "inspect", str(src), "--all"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,  # away from the source tree (see _into_closed_pipe)
    )
    head = [einopt.stdout.readline() for _ in range(2)]
    einopt.stdout.close()
    stderr = einopt.stderr.read().decode()
    assert einopt.wait() == EXIT_CODES["ok"], stderr
    assert all(line.startswith(b"#") for line in head)
    assert "Error" not in stderr and "Exception" not in stderr


@pytest.mark.parametrize("alias", ["same", "dot-slash", "symlink", "hard link"])
def test_output_naming_the_input_is_refused(tmp_path, monkeypatch, alias):
    monkeypatch.chdir(tmp_path)
    src = _save(conv_block(), tmp_path / "in.onnx")
    before = src.read_bytes()
    out = {"same": "in.onnx", "dot-slash": "./in.onnx", "symlink": "link.onnx", "hard link": "hard.onnx"}[
        alias
    ]
    if alias == "symlink":
        os.symlink(src, tmp_path / out)
    elif alias == "hard link":
        os.link(src, tmp_path / out)
    result = run("optimize", "in.onnx", "-o", out)
    assert result.exit_code == EXIT_CODES["bad_input"], result.output
    assert "is the input model" in result.output and "--force" in result.output
    assert src.read_bytes() == before


def test_force_overwrites_the_input_with_the_verified_model(tmp_path):
    src = _save(conv_block(), tmp_path / "in.onnx")
    original = onnx.load(str(src))
    result = run("optimize", src, "-o", src, "--force", "--accept", "verified", "--input-shape", "x=1,8,6,6")
    assert result.exit_code == 0, result.output
    optimized = onnx.load(str(src))
    x = np.random.default_rng(0).standard_normal((1, 8, 6, 6)).astype(np.float32)
    cpu = ["CPUExecutionProvider"]
    want = ort.InferenceSession(original.SerializeToString(), providers=cpu).run(None, {"x": x})[0]
    got = ort.InferenceSession(optimized.SerializeToString(), providers=cpu).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_search_flag_defaults_are_the_api_defaults():
    """The CLI writes its defaults out (einopt --help stays fast without the pipeline): they must be
    Options' own."""
    from einopt.cli.model import optimize as command
    from einopt.pipeline import Options
    from einopt.search import Budget

    defaults = {p.name: p.default for p in command.params}
    o = Options()
    names = ("max_depth", "states_per_search", "states_per_model", "deadline_s", "noise", "model_noise")
    assert [defaults[n] for n in names] == [getattr(o, n) for n in names]
    assert o.budget == Budget(o.max_depth, o.states_per_search, o.states_per_model, o.deadline_s)
    assert (defaults["jobs"], defaults["top_k"]) == (o.jobs, o.top_k) and o.ray is None


def test_noise_flags_reach_the_options_and_are_checked(tmp_path, monkeypatch):
    from einopt import pipeline

    src = _save(conv_block(), tmp_path / "in.onnx")
    seen = []

    def capture(source, options, progress=None):
        seen.append(options)
        raise KeyboardInterrupt  # stop before anything is written

    monkeypatch.setattr(pipeline, "optimize", capture)
    run("optimize", src, "-o", tmp_path / "o.onnx", "--noise", "0.1", "--model-noise", "0.03")
    assert (seen[0].noise, seen[0].model_noise) == (0.1, 0.03)
    for flag in ("--noise", "--model-noise"):
        result = run("optimize", src, "-o", tmp_path / "o.onnx", flag, "1.5")
        assert result.exit_code == EXIT_CODES["usage"] and flag in result.output
    with pytest.raises(ValueError, match="model_noise"):
        pipeline.Options(model_noise=-0.01)
