"""The paper's Fig. 4 and Fig. 5 written in the text syntax and with the Python API.

Both forms must be the same node; every E_i evaluates equal to a numpy
convolution (see test_interp.py for the interpreter side at two sizes), and
compiled by TVM equals the interpreter.
"""

import numpy as np
import pytest

import einopt
from einopt.core.ir import Program

from paper import conv_reference, fig4, fig4_text, fig5_chain, fig5_texts

H, W, C, F = 8, 8, 6, 5
STEPS = [f"E{n}" for n in range(1, 8)]


def test_fig4_text_is_the_api_expression():
    assert einopt.parse(fig4_text()) is fig4()


@pytest.mark.parametrize("step", range(7), ids=STEPS)
def test_fig5_text_is_the_api_expression(step):
    text = fig5_texts(H, W, C, F)[step]
    node = fig5_chain(H, W, C, F)[step]
    assert einopt.parse(text) is node
    assert einopt.parse(str(node)) is node


def _inputs():
    rng = np.random.default_rng(11)
    return {"A": rng.standard_normal((H, W, C)), "K": rng.standard_normal((3, 3, F, C))}


def _only(result):
    return result["Y"] if isinstance(result, dict) else result


@pytest.mark.parametrize("step", range(7), ids=STEPS)
def test_fig5_text_form_evaluates_to_the_convolution(step):
    inputs = _inputs()
    got = _only(einopt.evaluate(einopt.parse(fig5_texts(H, W, C, F)[step]), inputs))
    np.testing.assert_allclose(got, conv_reference(inputs["A"], inputs["K"]), rtol=1e-10, atol=1e-10)


@pytest.mark.tvm
@pytest.mark.parametrize("step", range(7), ids=STEPS)
def test_fig5_compiled_equals_interpreter(step):
    node = fig5_chain(H, W, C, F)[step]
    inputs = _inputs()
    want = _only(einopt.evaluate(node, inputs))
    got = _only(einopt.compile(node)(**inputs))
    assert isinstance(node, Program) == (step == 6)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.tvm
def test_fig4_compiled_equals_interpreter():
    rng = np.random.default_rng(12)
    inputs = {
        "A": rng.standard_normal((5, 4)),
        "B": rng.standard_normal((4, 6)),
        "C": rng.standard_normal((6, 3)),
    }
    node = fig4()
    np.testing.assert_allclose(
        einopt.compile(node)(**inputs), einopt.evaluate(node, inputs), rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(
        einopt.evaluate(node, inputs), inputs["A"] @ inputs["B"] @ inputs["C"], rtol=1e-10
    )
