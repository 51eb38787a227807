"""What the tests, the fuzzer (``scripts/fuzz.py``) and the ONNX suite runner (``scripts/onnx_suite.py``)
share: random ONNX graphs with what they risk (:mod:`~einopt.testing.graphs`,
:mod:`~einopt.testing.hazards`) and ONNX's own node tests and light models run through einopt
(:mod:`~einopt.testing.onnx_suite`). Needs the test extra (``pip install 'einopt[test]'``: hypothesis)."""
