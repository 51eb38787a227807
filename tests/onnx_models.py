"""Small ONNX models built with onnx.helper for pipeline and CLI tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _w(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def make(nodes, inputs, outputs, inits, opset: int = 17, name: str = "m") -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def conv_block(seed: int = 0, batch: int | str = 1) -> onnx.ModelProto:
    """Conv(+bias) -> Relu -> Conv -> Add(residual) -> Relu: two linear subprograms, two activations."""
    rng = np.random.default_rng(seed)
    inits = {"W1": _w(rng, 8, 8, 3, 3), "B1": _w(rng, 8), "W2": _w(rng, 8, 8, 3, 3)}
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu2"),
    ]
    m = make(nodes, [("x", [batch, 8, 6, 6])], [("y", [batch, 8, 6, 6])], inits, name="conv_block")
    m.doc_string = "a residual block"
    helper.set_model_props(m, {"author": "einopt tests"})
    return m


def lstm_cell(seed: int = 0, hidden: int = 16, form: str = "matmul", batch: int = 2) -> onnx.ModelProto:
    """The fused-LSTM example's cell: per gate x Wx + h Wh (+ biases), sigmoid/tanh gates, c' = f*c + i*g,
    h' = o*tanh(c').

    ``form`` is how the gate products are written: "matmul" (8 MatMul + 4 Add, no bias, the
    hand-written form), "gemm" (``nn.Linear`` as torch.onnx exports it: Gemm with transB=1 and a
    bias, 8 Gemm + 4 Add) or "linear" (MatMul by the transposed weight, then Add of the bias).
    """
    rng = np.random.default_rng(seed)
    inits = {}
    nodes = []
    for g in "ifgo":
        pre = []
        for src in "xh":
            w, b, out = f"W{src}_{g}", f"B{src}_{g}", f"m{src}_{g}"
            if form == "matmul":
                inits[w] = _w(rng, hidden, hidden)
                nodes.append(helper.make_node("MatMul", [src, w], [out], name=out))
            elif form == "gemm":
                inits[w], inits[b] = _w(rng, hidden, hidden), _w(rng, hidden)
                nodes.append(helper.make_node("Gemm", [src, w, b], [out], name=out, transB=1))
            elif form == "linear":
                inits[w], inits[b] = _w(rng, hidden, hidden), _w(rng, hidden)
                nodes += [
                    helper.make_node("MatMul", [src, w], [f"{out}_p"], name=f"{out}_p"),
                    helper.make_node("Add", [f"{out}_p", b], [out], name=out),
                ]
            else:
                raise ValueError(f"unknown LSTM form {form!r}")
            pre.append(out)
        nodes.append(helper.make_node("Add", pre, [f"pre_{g}"], name=f"add_{g}"))
        act = "Tanh" if g == "g" else "Sigmoid"
        nodes.append(helper.make_node(act, [f"pre_{g}"], [f"gate_{g}"], name=f"act_{g}"))
    nodes += [
        helper.make_node("Mul", ["gate_f", "c"], ["fc"], name="fc"),
        helper.make_node("Mul", ["gate_i", "gate_g"], ["ig"], name="ig"),
        helper.make_node("Add", ["fc", "ig"], ["c_next"], name="c_next"),
        helper.make_node("Tanh", ["c_next"], ["tc"], name="tanh_c"),
        helper.make_node("Mul", ["gate_o", "tc"], ["h_next"], name="h_next"),
    ]
    shape = [batch, hidden]
    return make(
        nodes,
        [("x", shape), ("h", shape), ("c", shape)],
        [("h_next", shape), ("c_next", shape)],
        inits,
        name="lstm_cell",
    )


def deconv_block(seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """ConvTranspose k4 s2 p1 (DCGAN's up-sampling step) -> Relu, at a small size."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node(
            "ConvTranspose",
            ["x", "W"],
            ["t"],
            name="deconv",
            kernel_shape=[4, 4],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", ["t"], ["y"], name="relu"),
    ]
    return make(
        nodes, [("x", [batch, 8, 4, 4])], [("y", [batch, 4, 8, 8])], {"W": _w(rng, 8, 4, 4, 4)}, name="deconv"
    )


def prelu_block(seed: int = 0, batch: int | str = 1) -> onnx.ModelProto:
    """1x1 Conv -> PRelu with per-channel slopes in [0, 1] (FSRCNN's shrinking layer), at a small size."""
    rng = np.random.default_rng(seed)
    inits = {"W": _w(rng, 6, 4, 1, 1), "A": rng.uniform(0, 1, (6, 1, 1)).astype(np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
        helper.make_node("PRelu", ["c", "A"], ["y"], name="prelu"),
    ]
    return make(nodes, [("x", [batch, 4, 8, 8])], [("y", [batch, 6, 8, 8])], inits, name="prelu_block")


def tiny_model(nodes, inputs, outputs, inits=(), functions=()) -> onnx.ModelProto:
    """A float32 opset-17 model from ``(name, shape)`` inputs/outputs and ``(name, array)`` initializers."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in outputs],
        initializer=[onnx.numpy_helper.from_array(a, n) for n, a in inits],
    )
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("einopt.eop", 1)] if functions else [])
    m = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    m.ir_version = 8
    return m


def disable_operators(monkeypatch) -> None:
    """No predefined operator matches: every subprogram becomes an eOperator (so it differs from the original)."""
    from einopt.instantiate import emit, match
    from einopt.instantiate.plan import Refusal

    monkeypatch.setattr(
        emit, "MATCHERS", {"Nothing": lambda scope, ctx=None: Refusal("disabled for this test")}
    )
    monkeypatch.setattr(match, "PREFERRED", {})


def append_to_output(monkeypatch, part: str, extra) -> None:
    """Make ``select.instantiate`` end the instantiation of ``part`` (a name fragment) with more nodes.

    The instantiated nodes now write ``OUT + "_first"``; ``extra(first, out, prefix)`` returns
    ``(nodes, initializers)`` that compute ``out`` from it (a wrong or a slow rewrite, for tests).
    """
    import dataclasses

    from einopt.stages import select

    real = select.instantiate

    def patched(program, **kw):
        inst = real(program, **kw)
        if part not in kw["prefix"]:
            return inst
        out = kw["onnx_names"][program.outputs[0]]
        nodes = []
        for n in inst.nodes:
            m = onnx.NodeProto()
            m.CopyFrom(n)
            m.output[:] = [o + "_first" if o == out else o for o in m.output]
            nodes.append(m)
        more, inits = extra(out + "_first", out, kw["prefix"])
        return dataclasses.replace(inst, nodes=(*nodes, *more), initializers=(*inst.initializers, *inits))

    monkeypatch.setattr(select, "instantiate", patched)


def run_ort(model: onnx.ModelProto, feeds) -> list:
    """All outputs of one quiet ONNX Runtime CPU run."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def random_feeds(model: onnx.ModelProto, seed: int = 3) -> dict[str, np.ndarray]:
    """Seeded float32 normal values for every graph input (symbolic dims as 1)."""
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal([d.dim_value or 1 for d in i.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for i in model.graph.input
    }


def assert_same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, feeds, rtol=1e-4, atol=1e-5) -> None:
    """Both models compute the same outputs on ``feeds`` in ONNX Runtime."""
    for x, y in zip(run_ort(a, feeds), run_ort(b, feeds), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
