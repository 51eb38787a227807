"""The Python examples of the README and of docs/ run as written."""

import pathlib
import re

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _python_blocks() -> list[str]:
    """Every ```python block of the README and of the pages in docs/."""
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    return [b for page in pages for b in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]


@pytest.mark.tvm
def test_readme_api_example_runs(capsys):
    if not README.exists():
        pytest.skip("README.md is not beside the tests (installed elsewhere)")
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    scope: dict = {}
    exec(block, scope)  # noqa: S102 - the README's own example
    assert scope["same"] is scope["conv"]
    np.testing.assert_allclose(scope["out"], scope["ref"], rtol=1e-3, atol=1e-3)
    assert "__global__" in capsys.readouterr().out


def test_readme_onnx_example_runs(tmp_path, monkeypatch, capsys):
    if not README.exists():
        pytest.skip("README.md is not beside the tests (installed elsewhere)")
    import onnx
    from onnx_models import conv_block

    block = next(b for b in _python_blocks() if "einopt.optimize(" in b)
    monkeypatch.chdir(tmp_path)
    onnx.save(conv_block(), "model.onnx")
    scope: dict = {}
    exec(block, scope)  # noqa: S102 - the README's own example
    assert scope["report"]["counts"]["subprograms"] == 4
    assert (tmp_path / "out.onnx").exists()
    assert "Sum[" in capsys.readouterr().out


def test_readme_rules_example_runs_and_lists_every_rule(capsys):
    if not README.exists():
        pytest.skip("README.md is not beside the tests (installed elsewhere)")
    from einopt.rules import REGISTRY

    text = README.read_text()
    for name in REGISTRY:
        assert f"`{name}`" in text, f"rule {name} is missing from the README's rule table"
    block = next(b for b in _python_blocks() if "from einopt.rules import" in b)
    scope: dict = {}
    exec(block, scope)  # noqa: S102 - the README's own example
    assert len(scope["trace"].steps) == 2
    assert "E3 = substitute_variables" in capsys.readouterr().out


def test_readme_benchmark_example_runs(tmp_path, monkeypatch):
    if not README.exists():
        pytest.skip("README.md is not beside the tests (installed elsewhere)")
    import onnx
    from onnx_models import conv_block

    block = next(b for b in _python_blocks() if "benchmark_result(" in b)
    monkeypatch.chdir(tmp_path)
    onnx.save(conv_block(), "model.onnx")
    scope: dict = {}
    exec(block, scope)  # noqa: S102 - the README's own example
    assert scope["report"]["bench"]["equal"] and scope["report"]["bench"]["speedup"] > 0
    assert "<svg" in (tmp_path / "report.html").read_text()
