"""The command line: commands, exit codes, one-line errors, start-up time."""

import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from einopt.cli import EXIT_CODES, main

CONV = "L[h:6, w:6, f:4] Sum[r:3, s:3, c:3] A[h+r-1, w+s-1, c] * K[r, s, f, c] where A: [6, 6, 3], K: [3, 3, 4, 3]"


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_version():
    result = run("--version")
    assert result.exit_code == 0
    assert "einopt, version" in result.output


def test_eval_expression_text():
    result = run("eval", "-e", CONV)
    assert result.exit_code == 0, result.output
    assert "result: shape [6, 6, 4]" in result.output
    assert "key " in result.output


def test_eval_with_shapes_and_npz_roundtrip(tmp_path):
    out = tmp_path / "out.npz"
    text = "L[i:3, j:2] Sum[k:4] X[i, k] * Y[k, j]"
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    np.savez(tmp_path / "in.npz", X=x, Y=y)
    result = run(
        "eval",
        "-e",
        text,
        "--shape",
        "X=3,4",
        "--shape",
        "Y=4,2",
        "--inputs",
        str(tmp_path / "in.npz"),
        "-o",
        str(out),
    )
    assert result.exit_code == 0, result.output
    with np.load(out) as data:
        np.testing.assert_allclose(data["result"], x @ y)


def test_eval_exact_integer_mode():
    result = run("eval", "-e", CONV, "--mode", "int")
    assert result.exit_code == 0, result.output
    assert "(int)" in result.output


@pytest.mark.parametrize("example", ["conv3x3", "conv3x3_offset_reduce", "matmul_chain"])
def test_bundled_examples_evaluate(example):
    result = run("eval", "--example", example)
    assert result.exit_code == 0, result.output


def test_examples_listed():
    result = run("examples")
    assert "conv3x3" in result.output and "matmul_chain" in result.output


def test_key_is_invariant_under_renaming():
    a = run("key", "-e", "L[i:3] Sum[k:4] X[i, k] where X: [3, 4]").output
    b = run("key", "-e", "L[p:3] Sum[q:4] X[p, q] where X: [3, 4]").output
    assert a == b and len(a.strip()) == 32


def test_fmt_round_trips():
    out = run("fmt", "-e", CONV).output.strip()
    assert run("fmt", "-e", out).output.strip() == out


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["eval", "-e", "L[i:3] X[i"], "bad_input", "line 1, col"),
        (["eval", "-e", "L[i:3] X[i]"], "bad_input", "X"),
        (["eval", "/nonexistent/file.ein"], "bad_input", "cannot read"),
        (["eval", "--example", "nope"], "bad_input", "unknown example"),
        (["eval"], "bad_input", "exactly one of"),
        (["eval", "-e", "L[i:3] X[i]", "--shape", "X=three"], "bad_input", "bad --shape"),
        (
            ["eval", "-e", "L[i:3] X[i] where X: [4]", "--inputs", "/nonexistent.npz"],
            "bad_input",
            "cannot read inputs",
        ),
        (["eval", "-e", "L[i:3] X[i] / 2.0 where X: [4]", "--mode", "int"], "bad_input", "/"),
    ],
)
def test_errors_are_one_line_with_distinct_codes(args, code, message):
    result = run(*args)
    assert result.exit_code == EXIT_CODES[code], result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_wrong_npz_shape(tmp_path):
    np.savez(tmp_path / "in.npz", X=np.zeros(5))
    result = run("eval", "-e", "L[i:3] X[i] where X: [4]", "--inputs", str(tmp_path / "in.npz"))
    assert result.exit_code == EXIT_CODES["bad_input"]
    assert "expected [4]" in result.output


def test_startup_does_not_import_tvm_or_onnxruntime():
    # TVM takes over a second to import, ONNX Runtime a fraction; `einopt --help` must not pay for them.
    # (scripts/bench_startup.py measures the start-up time itself.)
    code = (
        "import sys, einopt.cli; from click.testing import CliRunner; "
        "assert CliRunner().invoke(einopt.cli.main, ['--help']).exit_code == 0; "
        "heavy = [m for m in ('tvm', 'onnxruntime') if m in sys.modules]; "
        "assert not heavy, f'{heavy} imported at start-up'"
    )
    subprocess.run([sys.executable, "-P", "-c", code], check=True)
    out = subprocess.run(
        [sys.executable, "-P", "-m", "einopt.cli", "--help"], check=True, capture_output=True, text=True
    )
    assert "Commands:" in out.stdout


@pytest.mark.tvm
def test_compile_checks_against_interpreter():
    result = run("compile", "--example", "conv3x3_offset_reduce")
    assert result.exit_code == 0, result.output
    assert "ok" in result.output and "MISMATCH" not in result.output


@pytest.mark.tvm
def test_compile_cuda_reports_missing_gpu():
    result = run("compile", "-e", CONV, "--target", "cuda")
    assert result.exit_code == EXIT_CODES["unavailable"], result.output
    assert "GPU" in result.output


@pytest.mark.tvm
def test_emit_cuda_source():
    result = run("compile", "-e", CONV, "--emit", "cuda", "--no-check")
    assert result.exit_code == 0, result.output
    assert "__global__" in result.output
