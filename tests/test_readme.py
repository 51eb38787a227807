"""The README's Python API example runs as written."""

import pathlib
import re

import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


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
