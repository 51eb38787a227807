"""ONNX operator importers, checked numerically: ONNX Runtime (float32) vs the interpreter (float64).

Every case builds a one-node model, runs it in ONNX Runtime, translates it
with ``translate_single_node`` and evaluates the program with the reference
interpreter. Near misses must raise ``Unsupported`` with a telling reason.
The ONNX backend node suite adds its cases for the imported op types.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.frontend.importers import IMPORTERS, import_node, translate_single_node
from einopt.frontend.operand import NodeView, Operand, Unsupported, node_attrs

F32 = np.float32


def _ints(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class Typed:
    """A graph input of another element type than float32 (no feed is made: for refusal cases)."""

    shape: tuple[int, ...]
    elem_type: int


@dataclasses.dataclass
class Case:
    """A one-node model: ``inputs`` maps a name to a shape (random float32 graph input),
    a ``Typed`` graph input, an array (initializer) or None (an omitted optional input)."""

    id: str
    op: str
    inputs: list[tuple[str, tuple[int, ...] | Typed | np.ndarray | None]]
    attrs: dict = dataclasses.field(default_factory=dict)
    opset: int = 17
    outputs: int = 1
    positive: bool = False  # inputs in [0.5, 2) instead of [-2, 2)

    def __str__(self) -> str:
        return self.id


def build(case: Case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model and its random feeds."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    graph_inputs, inits, feeds, names = [], [], {}, []
    for name, spec in case.inputs:
        names.append(name if spec is not None else "")
        if spec is None:
            continue
        if isinstance(spec, np.ndarray):
            inits.append(numpy_helper.from_array(spec, name))
            continue
        if isinstance(spec, Typed):
            graph_inputs.append(helper.make_tensor_value_info(name, spec.elem_type, list(spec.shape)))
            continue
        lo, hi = (0.5, 2.0) if case.positive else (-2.0, 2.0)
        feeds[name] = rng.uniform(lo, hi, size=spec).astype(F32)
        graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(spec)))
    while names and not names[-1]:
        names.pop()
    outs = [f"y{k}" for k in range(case.outputs)]
    node = helper.make_node(case.op, names, outs, **case.attrs)
    graph = helper.make_graph(
        [node],
        case.id.replace("-", "_"),
        graph_inputs,
        [helper.make_tensor_value_info(o, _output_type(case), None) for o in outs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)], ir_version=8)
    return model, feeds


def _output_type(case: Case) -> int:
    first = case.inputs[0][1]
    return first.elem_type if isinstance(first, Typed) else TensorProto.FLOAT


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check_conventions(program: ir.Program, expected_shapes: list[tuple[int, ...]]) -> None:
    """Output scopes: traversal from 0 to the output dimension, in order, without pad."""
    for name, shape in zip(program.outputs, expected_shapes, strict=True):
        s = program.scope(name)
        assert s.pad == ()
        assert [(it.lo, it.hi) for it in s.traversal] == [(0, n) for n in shape], name
        for sub in ir.scopes_in(s):
            names = [it.name for it in sub.traversal + sub.summation]
            assert len(set(names)) == len(names)


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    np.testing.assert_allclose(got, want.astype(np.float64), rtol=rtol, atol=atol * scale)


def check(case: Case) -> ir.Program:
    """Translate, evaluate in float64 and compare with ONNX Runtime; returns the program."""
    model, feeds = build(case)
    expected = run_ort(model, feeds)
    program, arrays = translate_single_node(model)
    check_conventions(program, [e.shape for e in expected])
    got = evaluate(program, {**feeds, **arrays}, mode="float64")
    for name, want in zip(program.outputs, expected, strict=True):
        assert got[name].shape == want.shape
        assert_close(got[name], want)
    return program


def cases(*items: Case):
    return pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in items])


# --------------------------------------------------------------------------
# Element-wise
# --------------------------------------------------------------------------

SCALAR_TWO = np.array(2.0, dtype=F32)


@cases(
    Case("add-same", "Add", [("a", (2, 3, 4)), ("b", (2, 3, 4))]),
    Case("add-bcast-row", "Add", [("a", (2, 3, 4)), ("b", (4,))]),
    Case("sub-bcast-both", "Sub", [("a", (2, 1, 4)), ("b", (3, 1))]),
    Case("add-rank0-input", "Add", [("a", (2, 3)), ("b", ())]),
    Case("sub-const-left", "Sub", [("c", np.arange(4, dtype=F32)), ("a", (3, 4))]),
    Case("mul-scalar-const", "Mul", [("a", (3, 4)), ("c", SCALAR_TWO)]),
    Case("mul-one-elem-vector", "Mul", [("a", (3, 4)), ("c", np.array([0.5], F32))]),
    Case("div-bcast", "Div", [("a", (3, 4)), ("b", (1, 4))], positive=True),
    Case("div-by-const", "Div", [("a", (2, 5)), ("c", np.array([[3.0]], F32))]),
    Case("neg", "Neg", [("x", (2, 3))]),
    Case("sum-three-bcast", "Sum", [("a", (2, 3, 4)), ("b", (3, 1)), ("c", (4,))]),
    Case("sum-one", "Sum", [("a", (5,))]),
    Case("max-two-bcast", "Max", [("a", (2, 3)), ("b", (3,))]),
    Case("max-three", "Max", [("a", (4,)), ("b", (4,)), ("c", (1,))]),
    Case("min-two", "Min", [("a", (2, 3)), ("b", (2, 1))]),
    Case("min-with-const", "Min", [("a", (2, 3)), ("c", np.array(0.25, F32))]),
)
def test_arithmetic(case: Case) -> None:
    check(case)


def test_one_element_constant_is_inlined() -> None:
    program = check(Case("mul-scalar-const", "Mul", [("a", (3, 4)), ("c", SCALAR_TWO)]))
    body = program.scope("y0").body
    assert isinstance(body, ir.Binary) and body.op == "*"
    assert body.b is ir.Const(2.0)
    assert not program.inputs[1:], "the constant is not an input any more"


@cases(
    Case("relu", "Relu", [("x", (2, 3, 4))]),
    Case("sigmoid", "Sigmoid", [("x", (2, 3))]),
    Case("tanh", "Tanh", [("x", (2, 3))]),
    Case("exp", "Exp", [("x", (2, 3))]),
    Case("abs", "Abs", [("x", (2, 3))]),
    Case("sqrt", "Sqrt", [("x", (2, 3))], positive=True),
    Case("leaky-relu-default", "LeakyRelu", [("x", (2, 3, 4))]),
    Case("leaky-relu-alpha", "LeakyRelu", [("x", (2, 3))], {"alpha": 0.2}),
    Case("prelu-channel", "PRelu", [("x", (2, 3, 4, 5)), ("s", (3, 1, 1))]),
    Case("prelu-scalar-const", "PRelu", [("x", (2, 3)), ("s", np.array([0.1], F32))]),
    Case("prelu-full", "PRelu", [("x", (2, 3)), ("s", (2, 3))]),
    Case("clip-both", "Clip", [("x", (3, 4)), ("lo", np.array(-0.5, F32)), ("hi", np.array(0.7, F32))]),
    Case("clip-min-only", "Clip", [("x", (3, 4)), ("lo", np.array(-0.5, F32))]),
    Case("clip-max-only", "Clip", [("x", (3, 4)), ("lo", None), ("hi", np.array(0.5, F32))]),
    Case("clip-none", "Clip", [("x", (3, 4))]),
    Case("clip-min-above-max", "Clip", [("x", (3,)), ("lo", np.array(1.0, F32)), ("hi", np.array(0.0, F32))]),
    Case("clip-opset6-attrs", "Clip", [("x", (3, 4))], {"min": -0.3, "max": 0.4}, opset=6),
)
def test_activations(case: Case) -> None:
    check(case)


def _bn_params(c: int, seed: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        ("gamma", rng.uniform(0.5, 1.5, c).astype(F32)),
        ("beta", rng.uniform(-1, 1, c).astype(F32)),
        ("mean", rng.uniform(-1, 1, c).astype(F32)),
        ("var", rng.uniform(0.1, 2.0, c).astype(F32)),
    ]


@cases(
    Case("bn-4d", "BatchNormalization", [("x", (2, 3, 4, 5)), *_bn_params(3, 1)]),
    Case("bn-2d-eps", "BatchNormalization", [("x", (4, 6)), *_bn_params(6, 2)], {"epsilon": 0.1}),
    Case("bn-one-channel", "BatchNormalization", [("x", (2, 1, 3)), *_bn_params(1, 3)]),
    Case("bn-opset9", "BatchNormalization", [("x", (2, 3, 4)), *_bn_params(3, 4)], opset=9),
)
def test_batch_normalization(case: Case) -> None:
    program = check(case)
    assert {t.name for t in program.inputs} >= {"x"}
    assert not {"gamma", "beta", "mean", "var"} & {t.name for t in program.inputs}, "parameters are folded"


# --------------------------------------------------------------------------
# Contractions
# --------------------------------------------------------------------------


@cases(
    Case("matmul-2d", "MatMul", [("a", (3, 4)), ("b", (4, 5))]),
    Case("matmul-batched", "MatMul", [("a", (2, 3, 4)), ("b", (2, 4, 5))]),
    Case("matmul-bcast-batch", "MatMul", [("a", (3, 1, 2, 4)), ("b", (5, 4, 6))]),
    Case("matmul-bcast-2d-rhs", "MatMul", [("a", (2, 3, 4)), ("b", (4, 5))]),
    Case("matmul-1d-lhs", "MatMul", [("a", (4,)), ("b", (2, 4, 5))]),
    Case("matmul-1d-rhs", "MatMul", [("a", (2, 3, 4)), ("b", (4,))]),
    Case("matmul-1d-2d", "MatMul", [("a", (4,)), ("b", (4, 5))]),
    Case(
        "matmul-const-weight",
        "MatMul",
        [("a", (3, 4)), ("w", np.linspace(-1, 1, 20, dtype=F32).reshape(4, 5))],
    ),
    Case("matmul-unit-dims", "MatMul", [("a", (1, 1, 4)), ("b", (1, 4, 1))]),
)
def test_matmul(case: Case) -> None:
    check(case)


_GEMM_AB = [("a", (3, 4)), ("b", (4, 5))]


@cases(
    Case("gemm-plain", "Gemm", _GEMM_AB),
    Case("gemm-c-vector", "Gemm", [*_GEMM_AB, ("c", (5,))]),
    Case("gemm-c-matrix", "Gemm", [*_GEMM_AB, ("c", (3, 5))]),
    Case("gemm-c-column", "Gemm", [*_GEMM_AB, ("c", (3, 1))]),
    Case("gemm-c-scalar-const", "Gemm", [*_GEMM_AB, ("c", np.array([1.5], F32))]),
    Case("gemm-transA", "Gemm", [("a", (4, 3)), ("b", (4, 5))], {"transA": 1}),
    Case("gemm-transB", "Gemm", [("a", (3, 4)), ("b", (5, 4)), ("c", (5,))], {"transB": 1}),
    Case("gemm-transA-transB", "Gemm", [("a", (4, 3)), ("b", (5, 4))], {"transA": 1, "transB": 1}),
    Case("gemm-alpha", "Gemm", [*_GEMM_AB, ("c", (5,))], {"alpha": 0.5}),
    Case("gemm-beta", "Gemm", [*_GEMM_AB, ("c", (3, 5))], {"beta": -2.0}),
    Case("gemm-beta-zero", "Gemm", [*_GEMM_AB, ("c", (3, 5))], {"beta": 0.0}),
    Case(
        "gemm-all",
        "Gemm",
        [("a", (4, 3)), ("b", (5, 4)), ("c", (1, 5))],
        {"alpha": 0.25, "beta": 0.35, "transA": 1, "transB": 1},
    ),
)
def test_gemm(case: Case) -> None:
    check(case)


def test_gemm_form() -> None:
    """``alpha * (A * B)`` inside the sum; ``S[m, n] + beta * C`` outside."""
    program = check(Case("gemm-all", "Gemm", [*_GEMM_AB, ("c", (5,))], {"alpha": 0.5, "beta": 2.0}))
    out = program.scope("y0")
    assert not out.summation and isinstance(out.body, ir.Binary) and out.body.op == "+"
    inner = out.body.a.source
    assert [it.name for it in inner.summation] == ["k"]
    assert inner.body.a is ir.Const(0.5)
    assert out.body.b.a is ir.Const(2.0)


@cases(
    Case("einsum-matmul", "Einsum", [("a", (3, 4)), ("b", (4, 5))], {"equation": "ij,jk->ik"}),
    Case("einsum-bmm", "Einsum", [("a", (2, 3, 4)), ("b", (2, 4, 5))], {"equation": "bij,bjk->bik"}),
    Case("einsum-transpose", "Einsum", [("a", (3, 4))], {"equation": "ij->ji"}),
    Case("einsum-reduce", "Einsum", [("a", (3, 4))], {"equation": "ij->i"}),
    Case("einsum-implicit", "Einsum", [("a", (3, 4)), ("b", (4, 5))], {"equation": "ij,jk"}),
    Case(
        "einsum-chain", "Einsum", [("a", (2, 3)), ("b", (3, 4)), ("c", (4, 2))], {"equation": "ab,bc,cd->ad"}
    ),
    Case("einsum-outer", "Einsum", [("a", (3,)), ("b", (4,))], {"equation": "i,j->ij"}),
    Case("einsum-nt", "Einsum", [("a", (3, 4)), ("b", (5, 4))], {"equation": "ik, jk -> ij"}),
    Case("einsum-reserved-letter", "Einsum", [("a", (3, 4)), ("b", (4, 5))], {"equation": "Lj,jk->Lk"}),
)
def test_einsum(case: Case) -> None:
    check(case)


# --------------------------------------------------------------------------
# Convolutions
# --------------------------------------------------------------------------


def conv(id: str, x: tuple, w: tuple, bias: bool = False, **attrs) -> Case:
    inputs = [("x", x), ("w", w)] + ([("b", (w[0],))] if bias else [])
    return Case(id, "Conv", inputs, attrs)


@cases(
    conv("3x3-pad1", (1, 3, 6, 6), (4, 3, 3, 3), pads=[1, 1, 1, 1]),
    conv("3x3-nopad-bias", (2, 3, 5, 6), (4, 3, 3, 3), bias=True),
    conv("stride2", (1, 2, 7, 7), (3, 2, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1]),
    conv("dilation2", (1, 2, 8, 8), (3, 2, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2]),
    conv("asymmetric-pads", (1, 2, 5, 6), (3, 2, 3, 2), pads=[0, 1, 2, 0]),
    conv(
        "stride-dilation-rect",
        (1, 2, 9, 8),
        (2, 2, 2, 3),
        strides=[2, 3],
        dilations=[2, 1],
        pads=[1, 0, 0, 2],
    ),
    conv("groups2-bias", (1, 4, 5, 5), (6, 2, 3, 3), bias=True, group=2, pads=[1, 1, 1, 1]),
    conv("depthwise", (1, 3, 6, 6), (3, 1, 3, 3), group=3, pads=[1, 1, 1, 1]),
    conv("depthwise-mult2", (1, 3, 5, 5), (6, 1, 3, 3), group=3, strides=[2, 2]),
    conv("same-upper-s2", (1, 2, 6, 7), (3, 2, 4, 3), auto_pad="SAME_UPPER", strides=[2, 2]),
    conv("same-lower-s2", (1, 2, 6, 7), (3, 2, 4, 3), auto_pad="SAME_LOWER", strides=[2, 2]),
    conv("same-upper-s1", (1, 2, 5, 5), (3, 2, 2, 2), auto_pad="SAME_UPPER"),
    conv("valid", (1, 2, 5, 5), (3, 2, 3, 3), auto_pad="VALID", strides=[2, 1]),
    conv("kernel-shape-attr", (1, 2, 5, 5), (3, 2, 3, 3), kernel_shape=[3, 3]),
    conv("pointwise", (2, 4, 3, 3), (5, 4, 1, 1), bias=True),
    conv("1d", (2, 3, 9), (4, 3, 3), bias=True, strides=[2], pads=[1, 2]),
    conv("3d", (1, 2, 4, 5, 5), (3, 2, 2, 3, 3), pads=[0, 1, 1, 1, 0, 1], strides=[1, 2, 1]),
    conv("one-pixel", (1, 2, 1, 1), (3, 2, 3, 3), pads=[1, 1, 1, 1]),
)
def test_conv(case: Case) -> None:
    check(case)


def test_conv_bias_form() -> None:
    """``L n, f, o..: S[n, f, o..] + B[f]`` around the contraction."""
    program = check(conv("groups2-bias", (1, 4, 5, 5), (6, 2, 3, 3), bias=True, group=2, pads=[1, 1, 1, 1]))
    out = program.scope("y0")
    s = out.body.a.source
    assert [it.name for it in s.summation] == ["c", "r0", "r1"]
    assert out.body.b.source.name == "b" and out.body.b.indices == (out.traversal[1],)


def convt(id: str, x: tuple, w: tuple, bias: bool = False, **attrs) -> Case:
    """A ConvTranspose with a constant (finite) weight: a graph-input weight is refused (see below)."""
    weight = np.random.default_rng(zlib.crc32(id.encode())).uniform(-2, 2, w).astype(F32)
    inputs = [("x", x), ("w", weight)] + ([("b", (w[1] * attrs.get("group", 1),))] if bias else [])
    return Case(id, "ConvTranspose", inputs, attrs)


@cases(
    convt("s1", (1, 3, 4, 4), (3, 2, 3, 3)),
    convt("s1-pads-bias", (2, 3, 4, 5), (3, 2, 3, 3), bias=True, pads=[1, 1, 1, 1]),
    convt("s2-k3", (1, 2, 3, 3), (2, 3, 3, 3), strides=[2, 2]),
    convt("s4-k4", (1, 2, 3, 2), (2, 2, 4, 4), strides=[4, 4]),
    convt("k4-s2-p1", (2, 4, 2, 2), (4, 3, 4, 4), bias=True, strides=[2, 2], pads=[1, 1, 1, 1]),
    convt("output-padding", (1, 2, 3, 3), (2, 2, 3, 3), strides=[2, 2], output_padding=[1, 1]),
    convt("output-padding-rect", (1, 2, 3, 4), (2, 2, 3, 3), strides=[3, 2], output_padding=[2, 0]),
    convt("groups2-s2", (1, 4, 3, 3), (4, 3, 3, 3), bias=True, group=2, strides=[2, 2], pads=[1, 0, 0, 1]),
    convt("groups2-s1", (1, 4, 3, 3), (4, 1, 2, 2), group=2),
    convt("depthwise-s2", (1, 3, 3, 3), (3, 1, 4, 4), group=3, strides=[2, 2], pads=[1, 1, 1, 1]),
    convt("output-shape", (1, 2, 3, 3), (2, 2, 3, 3), strides=[2, 2], output_shape=[6, 6]),
    convt("output-shape-odd-total", (1, 2, 3, 3), (2, 2, 3, 3), strides=[3, 2], output_shape=[8, 6]),
    convt(
        "output-shape-ignores-pads",
        (1, 2, 3, 3),
        (2, 2, 3, 3),
        strides=[2, 2],
        output_shape=[5, 6],
        pads=[2, 2, 2, 2],
    ),
    convt("output-shape-larger", (1, 2, 3, 3), (2, 1, 3, 3), strides=[3, 2], output_shape=[10, 8]),
    convt("same-upper", (1, 2, 3, 3), (2, 2, 3, 3), auto_pad="SAME_UPPER", strides=[2, 2]),
    convt("same-lower", (1, 2, 3, 3), (2, 2, 3, 3), auto_pad="SAME_LOWER", strides=[2, 2]),
    convt(
        "same-upper-dilated",
        (1, 2, 3, 4),
        (2, 2, 3, 3),
        auto_pad="SAME_UPPER",
        strides=[2, 2],
        dilations=[2, 1],
    ),
    convt("same-kernel-below-stride", (1, 2, 3, 4), (2, 2, 1, 1), auto_pad="SAME_UPPER", strides=[2, 2]),
    convt("s3-k2", (1, 2, 3, 4), (2, 2, 2, 2), strides=[3, 3]),
    convt("valid", (1, 2, 3, 3), (2, 2, 3, 3), auto_pad="VALID", strides=[2, 1]),
    convt("dilation2", (1, 2, 4, 4), (2, 2, 3, 3), dilations=[2, 2], strides=[2, 1]),
    convt("asymmetric-pads", (1, 2, 4, 4), (2, 2, 3, 3), pads=[0, 1, 2, 0], strides=[2, 2]),
    convt("stride-rect", (1, 2, 3, 4), (2, 2, 3, 2), strides=[2, 1]),
    convt("1d-s2", (2, 3, 5), (3, 2, 4), bias=True, strides=[2], pads=[1, 1]),
    convt("3d-s2", (1, 2, 2, 3, 3), (2, 2, 2, 3, 3), strides=[2, 2, 1], pads=[0, 1, 1, 0, 0, 1]),
)
def test_conv_transpose(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("w", ["input", "inf"])
def test_conv_transpose_refuses_weights_that_may_be_infinite(w: str) -> None:
    # ONNX Runtime never multiplies the inserted zeros or border taps by W; the expression
    # would (0 * inf = NaN), so W must be a constant with finite entries.
    weight = (2, 3, 3, 1) if w == "input" else np.full((2, 3, 3, 1), np.inf, F32)
    model, _ = build(Case("ct", "ConvTranspose", [("x", (1, 2, 4, 3)), ("w", weight)], {"strides": [2, 1]}))
    with pytest.raises(Unsupported, match="not a constant known to be finite"):
        translate_single_node(model)


def test_conv_transpose_graph_input_weight_without_implicit_zeros() -> None:
    check(Case("ct-1x1", "ConvTranspose", [("x", (1, 2, 4, 3)), ("w", (2, 3, 1, 1))]))


def test_conv_transpose_stride_reads_zero_insertion_scope() -> None:
    program = check(convt("s2-k3", (1, 2, 3, 3), (2, 3, 3, 3), strides=[2, 2]))
    body = program.scope("y0").body
    u = body.a.source
    assert isinstance(u, ir.Scope)
    assert [it.name for it in u.traversal] == ["n", "c", "i0", "p0", "i1", "p1"]
    assert [(it.lo, it.hi) for it in u.traversal[3::2]] == [(0, 1), (0, 1)]
    assert isinstance(body.a.indices[2], ir.IFloorDiv) and isinstance(body.a.indices[3], ir.IMod)


# --------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------


@cases(
    Case("identity", "Identity", [("x", (2, 3))]),
    Case("transpose-default", "Transpose", [("x", (2, 3, 4))]),
    Case("transpose-perm", "Transpose", [("x", (2, 3, 4, 5))], {"perm": [0, 2, 3, 1]}),
    Case("reshape-merge", "Reshape", [("x", (2, 3, 4)), ("s", _ints(6, 4))]),
    Case("reshape-split", "Reshape", [("x", (6, 4)), ("s", _ints(2, 3, 2, 2))]),
    Case("reshape-zero-minus-one", "Reshape", [("x", (2, 3, 4)), ("s", _ints(0, -1, 2))]),
    Case("reshape-reorder", "Reshape", [("x", (2, 3, 4)), ("s", _ints(4, 3, 2))]),
    Case("reshape-allowzero-no-zeros", "Reshape", [("x", (2, 3, 4)), ("s", _ints(3, -1))], {"allowzero": 1}),
    Case("reshape-to-1d", "Reshape", [("x", (2, 3, 4)), ("s", _ints(-1))]),
    Case("flatten-default", "Flatten", [("x", (2, 3, 4))]),
    Case("flatten-axis0", "Flatten", [("x", (2, 3, 4))], {"axis": 0}),
    Case("flatten-axis-neg1", "Flatten", [("x", (2, 3, 4, 5))], {"axis": -1}),
    Case("flatten-axis-rank", "Flatten", [("x", (2, 3))], {"axis": 2}),
    Case("squeeze-axes", "Squeeze", [("x", (1, 3, 1, 4)), ("a", _ints(0, -2))]),
    Case("squeeze-all", "Squeeze", [("x", (1, 3, 1, 4))]),
    Case("squeeze-opset11", "Squeeze", [("x", (3, 1, 4))], {"axes": [1]}, opset=11),
    Case("unsqueeze", "Unsqueeze", [("x", (3, 4)), ("a", _ints(0, 3))]),
    Case("unsqueeze-negative", "Unsqueeze", [("x", (3, 4)), ("a", _ints(-1, 1))]),
    Case("unsqueeze-opset11", "Unsqueeze", [("x", (3, 4))], {"axes": [2]}, opset=11),
    Case("concat-axis1", "Concat", [("a", (2, 3)), ("b", (2, 1)), ("c", (2, 4))], {"axis": 1}),
    Case("concat-axis-neg", "Concat", [("a", (2, 3, 2)), ("b", (2, 3, 3))], {"axis": -1}),
    Case(
        "concat-const-part", "Concat", [("a", (2, 3)), ("c", np.array([[7.0, 8.0, 9.0]], F32))], {"axis": 0}
    ),
    Case("concat-one-elem-const", "Concat", [("a", (1, 3)), ("c", np.array([[5.0]], F32))], {"axis": 1}),
    Case("concat-one-input", "Concat", [("a", (2, 3))], {"axis": 0}),
    Case("split-equal", "Split", [("x", (6, 4))], {"axis": 0}, outputs=3),
    Case("split-sizes", "Split", [("x", (2, 7)), ("s", _ints(2, 4, 1))], {"axis": 1}, outputs=3),
    Case("split-opset11-attr", "Split", [("x", (5, 2))], {"split": [3, 2]}, opset=11, outputs=2),
    Case(
        "split-num-outputs-uneven",
        "Split",
        [("x", (2, 7))],
        {"axis": -1, "num_outputs": 3},
        opset=18,
        outputs=3,
    ),
    Case("slice-basic", "Slice", [("x", (5, 6)), ("s", _ints(1, 2)), ("e", _ints(4, 5))]),
    Case(
        "slice-negative-clamped",
        "Slice",
        [("x", (5, 6)), ("s", _ints(-3, -100)), ("e", _ints(1000, -1)), ("a", _ints(0, 1))],
    ),
    Case(
        "slice-negative-steps",
        "Slice",
        [
            ("x", (5, 6, 3)),
            ("s", _ints(-1, 4)),
            ("e", _ints(-100, 0)),
            ("a", _ints(0, -2)),
            ("t", _ints(-2, -1)),
        ],
    ),
    Case(
        "slice-reverse-all",
        "Slice",
        [("x", (5,)), ("s", _ints(-1)), ("e", _ints(-(2**63))), ("a", None), ("t", _ints(-1))],
    ),
    Case(
        "slice-step3",
        "Slice",
        [("x", (10, 2)), ("s", _ints(1)), ("e", _ints(10)), ("a", _ints(0)), ("t", _ints(3))],
    ),
    Case(
        "slice-opset9-attrs",
        "Slice",
        [("x", (4, 5))],
        {"starts": [1, -3], "ends": [3, 100], "axes": [0, 1]},
        opset=9,
    ),
    Case("pad-constant", "Pad", [("x", (2, 3)), ("p", _ints(1, 0, 2, 3))]),
    Case("pad-negative-crops", "Pad", [("x", (4, 5)), ("p", _ints(-1, 2, 0, -2))]),
    Case("pad-zero-value-input", "Pad", [("x", (2, 3)), ("p", _ints(0, 1, 1, 0)), ("v", np.array(0.0, F32))]),
    Case(
        "pad-axes-opset18",
        "Pad",
        [("x", (2, 3, 4)), ("p", _ints(1, 2, 0, 1)), ("v", None), ("a", _ints(0, -1))],
        opset=18,
    ),
    Case("pad-opset10-attr", "Pad", [("x", (2, 3))], {"pads": [0, 1, 1, 0]}, opset=10),
    Case("depth-to-space-dcr", "DepthToSpace", [("x", (1, 8, 2, 3))], {"blocksize": 2}),
    Case("depth-to-space-crd", "DepthToSpace", [("x", (2, 18, 2, 2))], {"blocksize": 3, "mode": "CRD"}),
    Case("space-to-depth", "SpaceToDepth", [("x", (2, 3, 4, 6))], {"blocksize": 2}),
)
def test_layout(case: Case) -> None:
    check(case)


# --------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------


def refusal(case: Case, reason: str):
    return pytest.param(case, reason, id=case.id)


@pytest.mark.parametrize(
    "case, reason",
    [
        refusal(
            Case("pad-reflect", "Pad", [("x", (2, 3)), ("p", _ints(1, 1, 1, 1))], {"mode": "reflect"}),
            "mode reflect",
        ),
        refusal(
            Case("pad-edge", "Pad", [("x", (2, 3)), ("p", _ints(1, 1, 1, 1))], {"mode": "edge"}), "mode edge"
        ),
        refusal(
            Case("pad-nonzero", "Pad", [("x", (2, 3)), ("p", _ints(1, 1, 1, 1)), ("v", np.array(1.5, F32))]),
            "nonzero constant value",
        ),
        refusal(
            Case("pad-dynamic-value", "Pad", [("x", (2, 3)), ("p", _ints(1, 1, 1, 1)), ("v", ())]),
            "not a constant",
        ),
        refusal(Case("einsum-diagonal", "Einsum", [("a", (3, 3))], {"equation": "ii->i"}), "diagonal"),
        refusal(
            Case(
                "einsum-ellipsis",
                "Einsum",
                [("a", (2, 3, 4)), ("b", (2, 4, 5))],
                {"equation": "...ij,...jk->...ik"},
            ),
            "ellipsis",
        ),
        refusal(Case("einsum-scalar", "Einsum", [("a", (3,)), ("b", (3,))], {"equation": "i,i->"}), "rank 0"),
        refusal(
            Case("reshape-dynamic-shape", "Reshape", [("x", (2, 3)), ("s", Typed((2,), TensorProto.INT64))]),
            "not a constant",
        ),
        refusal(Case("matmul-1d-1d", "MatMul", [("a", (4,)), ("b", (4,))]), "rank 0"),
        refusal(Case("slice-empty", "Slice", [("x", (5,)), ("s", _ints(4)), ("e", _ints(2))]), "zero-sized"),
        refusal(Case("split-zero-part", "Split", [("x", (4,)), ("s", _ints(4, 0))], outputs=2), "zero-sized"),
        refusal(Case("clip-dynamic-min", "Clip", [("x", (3,)), ("lo", ())]), "not a constant"),
        refusal(
            Case(
                "bn-training",
                "BatchNormalization",
                [("x", (2, 3, 4)), *_bn_params(3, 5)],
                {"training_mode": 1},
            ),
            "training",
        ),
        refusal(
            Case(
                "bn-dynamic-scale", "BatchNormalization", [("x", (2, 3)), ("g", (3,)), *_bn_params(3, 6)[1:]]
            ),
            "not a constant",
        ),
        refusal(
            conv("conv-same-dilated", (1, 2, 7, 6), (3, 2, 3, 2), auto_pad="SAME_LOWER", dilations=[2, 2]),
            "SAME_LOWER with dilations",
        ),
        # ONNX shape inference adds output_padding to in * stride, ONNX Runtime does not.
        refusal(
            convt(
                "convt-same-out-pad",
                (1, 2, 3, 4),
                (2, 2, 3, 3),
                auto_pad="SAME_LOWER",
                strides=[2, 3],
                output_padding=[1, 1],
            ),
            "shape inference says",
        ),
        refusal(
            Case("squeeze-empty-axes", "Squeeze", [("x", (1, 3)), ("a", np.zeros(0, np.int64))]), "empty axes"
        ),
        refusal(
            Case(
                "depth-to-space-bad-mode",
                "DepthToSpace",
                [("x", (1, 4, 2, 2))],
                {"blocksize": 2, "mode": "XYZ"},
            ),
            "mode XYZ",
        ),
        refusal(
            Case(
                "add-int64",
                "Add",
                [("a", Typed((2, 3), TensorProto.INT64)), ("b", Typed((3,), TensorProto.INT64))],
            ),
            "INT64 data",
        ),
        refusal(
            Case(
                "matmul-int32",
                "MatMul",
                [("a", Typed((2, 3), TensorProto.INT32)), ("b", Typed((3, 2), TensorProto.INT32))],
            ),
            "INT32 data",
        ),
        refusal(Case("max-float16", "Max", [("a", Typed((2, 3), TensorProto.FLOAT16))]), "FLOAT16 data"),
        refusal(
            Case(
                "sub-double",
                "Sub",
                [("a", Typed((2, 3), TensorProto.DOUBLE)), ("b", Typed((2, 3), TensorProto.DOUBLE))],
            ),
            "DOUBLE data",
        ),
        refusal(
            Case(
                "reshape-int64-data", "Reshape", [("a", Typed((2, 3), TensorProto.INT64)), ("s", _ints(3, 2))]
            ),
            "INT64 data",
        ),
    ],
)
def test_refused(case: Case, reason: str) -> None:
    model, _ = build(case)
    with pytest.raises(Unsupported, match=re.escape(reason)):
        translate_single_node(model)


def test_dynamic_shape_is_refused() -> None:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(Unsupported, match="unknown or dynamic shape"):
        translate_single_node(model)


def _view(op: str, operands: list[Operand], output_shapes, **attrs) -> NodeView:
    node = helper.make_node(op, [o.name for o in operands], ["y"], **attrs)
    return NodeView(node, tuple(operands), output_shapes, 17, node_attrs(node), lambda a, h: None)


def test_unknown_op_and_shape_disagreement() -> None:
    x = Operand("x", ir.Tensor("x", (2, 3)), (2, 3), TensorProto.FLOAT)
    with pytest.raises(Unsupported, match="no importer for Hardmax"):
        import_node(_view("Hardmax", [x], ((2, 3),)))
    with pytest.raises(Unsupported, match="shape inference says"):
        import_node(_view("Relu", [x], ((3, 2),)))
    (scope,) = import_node(_view("Relu", [x], (None,)))
    assert scope.shape == (2, 3)


def test_scope_operand_with_offset_origin() -> None:
    """An operand computed by a scope that starts below 0 is read at its origin plus the position."""
    (i,) = (ir.Iter("i", -1, 3),)
    t = ir.Tensor("t", (4,))
    s = ir.Scope((i,), (), ir.Access(t, (i + 1,)))
    x = Operand("x", s, (4,), TensorProto.FLOAT)
    (out,) = import_node(_view("Neg", [x], ((4,),)))
    arr = np.arange(4.0)
    np.testing.assert_array_equal(evaluate(out, {"t": arr}), -arr)


# --------------------------------------------------------------------------
# The ONNX backend node suite
# --------------------------------------------------------------------------

_BACKEND_MODULES = (
    "abs add batch_normalization clip concat conv convtranspose depthtospace div einsum exp flatten gemm "
    "gather gatherelements identity leakyrelu matmul max min mul neg pad prelu relu reshape sigmoid slice spacetodepth split "
    "sqrt squeeze sub sum tanh transpose unsqueeze "
    "reducesum reducemean reducesumsquare reducel2 globalaveragepool averagepool layernormalization "
    "erf pow reciprocal hardsigmoid hardswish gelu "
    "reducemax maxpool softmax cast expand where"
).split()

# Inputs the suite feeds as data that a real model has as constants.
# ConvTranspose: its weight is translated only as a constant known to be finite.
# Pow: only a constant exponent is translated.
_CONSTANT_INPUTS = {
    "BatchNormalization": {1, 2, 3, 4},
    "Clip": {1, 2},
    "Pad": {2},
    "ConvTranspose": {1},
    "Pow": {1},
    "Expand": {1},
    "Where": {0},  # a constant condition (a causal mask) is translated
}

_BACKEND_REFUSED = {
    "test_matmul_1d_1d": "rank 0",
    "test_where_long_example": "INT64 data (only float32)",
    **{
        f"test_pow{case}": "only one constant exponent"
        for case in ("", "_example", "_bcast_array", "_types_float32_int64", "_types_float32_int32")
        + ("_types_float32_uint64", "_types_float32_uint32")
    },
    "test_gather_0": "not an affine function",
    "test_gather_1": "not an affine function",
    "test_gather_negative_indices": "not an affine function",
    "test_gather_elements_0": "not an affine function",
    "test_gather_elements_1": "not an affine function",
    "test_gather_elements_negative_indices": "not an affine function",
    "test_reshape_allowzero_reordered": "zero-sized",
    "test_split_zero_size_splits_opset13": "zero-sized",
    "test_split_zero_size_splits_opset18": "zero-sized",
    "test_slice_start_out_of_bounds": "zero-sized",
    "test_constant_pad": "nonzero constant value",
    "test_constant_pad_axes": "nonzero constant value",
    "test_constant_pad_negative_axes": "nonzero constant value",
    "test_edge_pad": "mode edge",
    "test_reflect_pad": "mode reflect",
    "test_wrap_pad": "mode wrap",
    "test_identity_sequence": "non-tensor",
    "test_identity_opt": "non-tensor",
    "test_einsum_batch_diagonal": "ellipsis",
    "test_batchnorm_example_training_mode": "training mode",
    "test_batchnorm_epsilon_training_mode": "training mode",
    "test_reduce_sum_empty_set": "zero-sized",
    "test_reduce_sum_empty_set_non_reduced_axis_zero": "zero-sized",
    "test_reduce_sum_square_empty_set": "zero-sized",
    "test_reduce_l2_empty_set": "zero-sized",
    "test_reduce_max_empty_set": "zero-sized",
    "test_reduce_max_empty_set_bool": "only float32",
    "test_reduce_max_bool_inputs": "only float32",
    "test_maxpool_with_argmax_2d_precomputed_pads": "Indices output is used",
    "test_maxpool_with_argmax_2d_precomputed_strides": "Indices output is used",
}
# Refused by name prefix: every LayerNormalization case names its Mean and InvStdDev outputs.
_BACKEND_REFUSED_PREFIX = {
    "test_layer_normalization_": "Mean/InvStdDev outputs",
    "test_cast_": "data (only float32)",  # the suite feeds every Cast test its input as strings
}
_NON_FLOAT32 = re.compile(r"_(u?int\d+|float16|float64|bfloat16)(_|$)|^test_einsum_|_int32_trunc$")


def _backend_cases() -> list:
    from onnx.backend.test.case import node as node_cases

    for m in _BACKEND_MODULES:
        importlib.import_module(f"onnx.backend.test.case.node.{m}")
    found = {
        c.name: c
        for c in node_cases._NodeTestCases
        if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in IMPORTERS
    }
    return [pytest.param(c, id=name) for name, c in sorted(found.items())]


_BACKEND = _backend_cases()


def test_backend_suite_is_covered() -> None:
    assert len(_BACKEND) > 200
    ops = {p.values[0].model.graph.node[0].op_type for p in _BACKEND}
    assert ops == set(IMPORTERS)


@pytest.mark.parametrize("case", _BACKEND)
def test_backend_node(case) -> None:
    graph = case.model.graph
    node = graph.node[0]
    inputs, outputs = case.data_sets[0]
    feeds = {
        vi.name: arr if isinstance(arr, list) else np.asarray(arr)
        for vi, arr in zip(graph.input, inputs, strict=True)
    }
    constant_slots = _CONSTANT_INPUTS.get(node.op_type, set())
    constants = {
        name: feeds[name]
        for k, name in enumerate(node.input)
        if isinstance(feeds.get(name), np.ndarray) and (feeds[name].dtype != F32 or k in constant_slots)
    }
    refusal = _BACKEND_REFUSED.get(case.name) or next(
        (r for prefix, r in _BACKEND_REFUSED_PREFIX.items() if case.name.startswith(prefix)), None
    )
    if refusal is None and _NON_FLOAT32.search(case.name):
        refusal = "data (only float32)"
    if refusal is not None:
        with pytest.raises(Unsupported, match=re.escape(refusal)):
            translate_single_node(case.model, constants)
        return
    program, arrays = translate_single_node(case.model, constants)
    check_conventions(program, [np.asarray(o).shape for o in outputs])
    got = evaluate(program, {**feeds, **arrays})
    for name, want in zip(program.outputs, outputs, strict=True):
        assert_close(got[name], np.asarray(want), rtol=max(case.rtol, 1e-4), atol=max(case.atol, 1e-5))
