"""The public API of the search: ``einopt.search`` (package and function) and ``einopt.to_onnx``."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import einopt
from einopt.cli.source import example_text
from einopt.instantiate.program import as_program
from einopt.rules import check_equivalent

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
MATMUL = "L[i:6, j:5] Sum[k:4] X[i, k] * W[k, j] where X: [6, 4], W: [4, 5]"


def conv3x3() -> einopt.Program:
    return as_program(einopt.parse(example_text("conv3x3")))


@pytest.fixture(scope="module")
def conv_result():
    return einopt.superoptimize(conv3x3(), max_depth=1)


def ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {k: v.astype(np.float32) for k, v in feeds.items()}), strict=True))


def random_inputs(program: einopt.Program, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape) for t in program.inputs}


def test_superoptimize_is_the_search_packages_function(conv_result):
    import einopt.search as package
    from einopt.search import Candidate, SearchResult, search

    assert einopt.search is package and not callable(einopt.search)
    assert einopt.superoptimize is package.search is search
    direct = search(conv3x3(), max_depth=1)
    assert isinstance(direct, SearchResult) and all(isinstance(c, Candidate) for c in direct.candidates)
    assert [c.key for c in direct.candidates] == [c.key for c in conv_result.candidates]


def test_lazy_public_names_in_a_fresh_interpreter(tmp_path):
    # Neither name may need `import einopt.search` / `import einopt.stages.export` first.
    code = (
        "import einopt, types\n"
        f"p = einopt.parse({MATMUL!r})\n"
        "r = einopt.superoptimize(p, max_depth=1)\n"
        "assert isinstance(einopt.search, types.ModuleType)\n"
        "assert r.best.operators == ('MatMul',), r.best.operators\n"
        "assert [n.op_type for n in einopt.to_onnx(r.best).graph.node] == ['MatMul']\n"
    )
    # Run outside the checkout: there `import einopt` would find the source folder, which has no
    # `search` subpackage (it is mapped from the top-level `search/` folder at install time).
    subprocess.run([sys.executable, "-P", "-c", code], check=True, cwd=tmp_path)


def test_search_takes_a_scope():
    result = einopt.superoptimize(einopt.parse(MATMUL), max_depth=1)
    assert result.best.program.outputs == ("Y",) and not result.best.trace


def test_bad_limits_raise_search_error():
    from einopt.search import SearchError

    with pytest.raises(SearchError, match="max_depth"):
        einopt.superoptimize(conv3x3(), max_depth=-1)
    with pytest.raises(ValueError, match="jobs"):
        einopt.superoptimize(conv3x3(), jobs=0)


def test_every_candidate_exports_runs_and_equals_the_interpreter(conv_result):
    before = conv3x3()
    feeds = random_inputs(before)
    want = einopt.evaluate(before, feeds)
    assert len(conv_result.candidates) > 1
    for cand in conv_result.candidates:
        check_equivalent(before, cand.program)
        model = einopt.to_onnx(cand)
        assert [i.name for i in model.graph.input] == ["A", "K"]
        assert [o.name for o in model.graph.output] == ["Y"]
        got = ort_outputs(model, feeds)
        np.testing.assert_allclose(got["Y"], want["Y"], rtol=1e-4, atol=1e-4, err_msg=cand.text())


def test_to_onnx_of_a_scope_and_a_program():
    scope = einopt.parse(MATMUL)
    feeds = random_inputs(as_program(scope))
    want = einopt.evaluate(scope, feeds)
    for source in (scope, as_program(scope)):
        model = einopt.to_onnx(source)
        assert [n.op_type for n in model.graph.node] == ["MatMul"]
        np.testing.assert_allclose(ort_outputs(model, feeds)["Y"], want, rtol=1e-5, atol=1e-5)


def test_to_onnx_with_constants_makes_weights_initializers():
    program = conv3x3()
    feeds = random_inputs(program, seed=3)
    model = einopt.to_onnx(program, constants={"K": feeds["K"]})
    assert [i.name for i in model.graph.input] == ["A"]
    assert model.graph.initializer  # K, folded or as it is
    got = ort_outputs(model, {"A": feeds["A"]})["Y"]
    np.testing.assert_allclose(got, einopt.evaluate(program, feeds)["Y"], rtol=1e-4, atol=1e-4)


def test_to_onnx_of_a_multi_output_program():
    text = "T = L[i:4, j:3] X[i, j] * 2.0\nU = L[i:4] Sum[j:3] T[i, j]\nreturn T, U\nwhere X: [4, 3]"
    program = einopt.parse(text)
    feeds = random_inputs(program)
    got = ort_outputs(einopt.to_onnx(program), feeds)
    want = einopt.evaluate(program, feeds)
    assert list(got) == ["T", "U"]
    for name in got:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_scope_output_name_avoids_an_input_named_y():
    scope = einopt.parse("L[i:3, j:2] Sum[k:4] X[i, k] * Y[k, j] where X: [3, 4], Y: [4, 2]")
    model = einopt.to_onnx(scope)
    assert [i.name for i in model.graph.input] == ["X", "Y"] and [o.name for o in model.graph.output] == [
        "Y_1"
    ]
    feeds = random_inputs(as_program(scope))
    np.testing.assert_allclose(
        ort_outputs(model, feeds)["Y_1"], feeds["X"] @ feeds["Y"], rtol=1e-5, atol=1e-5
    )


def test_to_onnx_refuses_other_things():
    with pytest.raises(TypeError, match="Scope or Program"):
        einopt.to_onnx("L[i:3] X[i] where X: [3]")


def test_readme_search_example_runs(capsys):
    if not README.exists():
        pytest.skip("README.md is not beside the tests (installed elsewhere)")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    block = next(b for b in blocks if "einopt.to_onnx(" in b)
    scope: dict = {}
    exec(block, scope)  # noqa: S102 - the README's own example
    assert isinstance(scope["model"], onnx.ModelProto) and isinstance(scope["same"], onnx.ModelProto)
    assert scope["result"].candidates[0] is scope["result"].best
    assert " at Y" in capsys.readouterr().out  # a derivation step was printed
