"""Generated kernels with transcendental functions against ONNX Runtime's own operators.

Three kernels written by ``--kernels tvm`` (``einopt.instantiate.program.program_model``), each a single
``ai.einopt::TvmKernel`` node run through einopt's custom-op library, timed side by side with what
ONNX Runtime would run instead (interleaved, medians):

- GELU, exact form, of a scaled input ``0.5 s x (1 + erf(s x / sqrt 2))`` on [128, 1024] (the scale
  keeps ORT's operators from taking it whole) against ORT's ``Mul`` + com.microsoft ``Gelu``;
- GELU, tanh form, of the same against ``Mul`` + com.microsoft ``FastGelu``;
- an LSTM cell's tail ``sigmoid(f) c + sigmoid(i) tanh(g)`` on [16, 512] against the same in
  standard ops (``--kernels onnx``).

Run it alone on the machine::

    python scripts/bench_activations.py [--runs 2000]

Measured 2026-11-29 (AMD EPYC VM, 2 threads, load average 0.4-1.1, 2000 runs; three runs, the
first with a script of the same models): GELU 72-73 us against 79-114 us for Mul + Gelu (whose
times are bimodal here: p10 61 us), tanh GELU 59-74 us against 79-97 us for Mul + FastGelu, the
LSTM tail 13-17 us against 22 us. The erf and tanh of ``einopt.core.ops`` before their rational
forms: 158 and 109 us (first run).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper

from einopt import program
from einopt.backends import backend
from einopt.core.parser import parse
from einopt.instantiate.program import program_model
from einopt.runtime import modelio
from einopt.runtime.timing import Timing, load_average, sample_interleaved

GELU = "0.5 * (x[i, j] * s[j]) * (1.0 + erf(x[i, j] * s[j] * 0.7071067811865476))"
SCALED = "(x[i, j] * s[j])"
GELU_TANH = (
    f"0.5 * {SCALED} * (1.0 + tanh(0.7978845608 * ({SCALED} + 0.044715 * {SCALED} * {SCALED} * {SCALED})))"
)
LSTM_TAIL = "sigmoid(g[b, j + 512]) * c[b, j] + sigmoid(g[b, j]) * tanh(g[b, j + 1024])"
GELU_SHAPES = {"x": [128, 1024], "s": [1024]}


def written(text: str, shapes: dict[str, list[int]], kernels: str) -> onnx.ModelProto:
    """The expression ``text`` as einopt writes it with ``kernels`` ("tvm" or "onnx")."""
    model, _ = program_model(program({"y": parse(text, shapes)}), backend=backend(kernels))
    return model


def scaled_ort(op: str) -> onnx.ModelProto:
    """``op(x * s)`` with ORT's com.microsoft ``op`` (Gelu or FastGelu)."""
    nodes = [
        helper.make_node("Mul", ["x", "s"], ["m"]),
        helper.make_node(op, ["m"], ["y"], domain="com.microsoft"),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in GELU_SHAPES.items()]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 1024])
    graph = helper.make_graph(nodes, op, inputs, [output])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def compare(title: str, models: dict[str, onnx.ModelProto], runs: int) -> None:
    """Check the models agree on one random input, then time them interleaved."""
    rng = np.random.default_rng(0)
    sessions = {name: modelio.session(m) for name, m in models.items()}
    feeds: dict[str, np.ndarray] = {}
    calls = {}
    outputs = {}
    for name, sess in sessions.items():
        for arg in sess.get_inputs():
            feeds.setdefault(arg.name, rng.standard_normal(arg.shape).astype(np.float32))
        own = {arg.name: feeds[arg.name] for arg in sess.get_inputs()}
        outputs[name] = sess.run(None, own)[0]
        calls[name] = lambda sess=sess, own=own: sess.run(None, own)
    first = next(iter(outputs))
    for name, out in outputs.items():
        np.testing.assert_allclose(out, outputs[first], rtol=1e-5, atol=1e-5, err_msg=name)
    samples, _ = sample_interleaved(calls, min_runs=runs, max_runs=runs, budget_s=0.0)
    print(title)
    for name, seconds in samples.items():
        t = Timing.of(seconds)
        print(
            f"  {name:28s} {t.median_ms * 1e3:8.1f} us  (p10 {t.p10_ms * 1e3:.1f}, p90 {t.p90_ms * 1e3:.1f})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000, help="timed runs per model (default 2000)")
    args = ap.parse_args()
    print(f"load average before: {load_average()}")
    compare(
        "GELU (erf) of x * s, [128, 1024]",
        {
            "generated kernel": written(f"L[i:128, j:1024] {GELU}", GELU_SHAPES, "tvm"),
            "ORT Mul + Gelu": scaled_ort("Gelu"),
        },
        args.runs,
    )
    compare(
        "GELU (tanh) of x * s, [128, 1024]",
        {
            "generated kernel": written(f"L[i:128, j:1024] {GELU_TANH}", GELU_SHAPES, "tvm"),
            "ORT Mul + FastGelu": scaled_ort("FastGelu"),
        },
        args.runs,
    )
    lstm = {"g": [16, 2048], "c": [16, 512]}
    text = f"L[b:16, j:512] {LSTM_TAIL}"
    compare(
        "LSTM cell tail, [16, 512]",
        {"generated kernel": written(text, lstm, "tvm"), "standard ops": written(text, lstm, "onnx")},
        args.runs,
    )
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
