"""Every row of ``einopt.core.ops`` round-trips through every place that derives from it.

Per element-wise operation: the text syntax prints and parses it and the Python API builds it; the
interpreter computes its numpy form (exactly, in every mode; the integer mode refuses it unless it
is exact); TVM code (marked ``tvm``) and the ONNX model einopt emits, run in ONNX Runtime, agree
with the interpreter; its ONNX operator imports back to it; and its facts (``zero``, ``finite``,
``exact``, ``commutative``) hold on sample points (0, -0, small, large, the float32 limits,
infinities). A new row is tested here without a new line.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import einopt
from einopt import api
from einopt.core import ir, ops
from einopt.core.cost import FLOPS
from einopt.core.interp import EvaluationError, evaluate
from einopt.core.ops import BINARY, UNARY, BinaryOp, UnaryOp
from einopt.core.syntax import RESERVED, parse
from einopt.frontend.importers import translate_single_node
from einopt.frontend.partition import ABSORBED, ACTIVATIONS
from einopt.instantiate import BINARY_OPS, UNARY_OPS, UNARY_PARAM, UNARY_PARAM_INPUT

from strategies import tame

F32_MAX = float(np.finfo(np.float32).max)
# Finite sample points (the last two are float32's limits), then infinities.
FINITE = (0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 7.5, 1e30, -1e30, F32_MAX, -F32_MAX)
INFINITE = (np.inf, -np.inf)
# Parameters beyond the sample ones, probing a finiteness that depends on the parameter.
STEEP = (4.0, -4.0)

UNARY_ROWS = [pytest.param(op, id=op.name) for op in UNARY.values()]
BINARY_ROWS = [pytest.param(op, id=op.title) for op in BINARY.values()]


def _params(op: UnaryOp) -> tuple[float | None, ...]:
    return op.sample_params if op.param else (None,)


def _steep(op: UnaryOp) -> tuple[float, ...]:
    return STEEP if op.param else ()


def _in_range(op: UnaryOp, points) -> np.ndarray:
    lo, hi = op.sample_range
    return np.array([x for x in points if lo <= x <= hi], dtype=np.float64)


def _unary(op: UnaryOp, n: int, param: float | None) -> ir.Scope:
    (i,) = einopt.iters(f"i:{n}")
    return einopt.L(i)(ir.Unary(op.name, einopt.tensor("A", (n,))[i], param))


def _binary(op: BinaryOp, n: int) -> ir.Scope:
    (i,) = einopt.iters(f"i:{n}")
    a, b = einopt.tensor("A", (n,)), einopt.tensor("B", (n,))
    return einopt.L(i)(ir.Binary(op.name, a[i], b[i]))


def _finite(dtype=np.float32) -> np.ndarray:
    """The finite sample points, with the limits of ``dtype`` last."""
    top = float(np.finfo(dtype).max)
    return np.array(FINITE[:-2] + (top, -top), dtype=dtype)


def _pairs(dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of finite sample points."""
    a, b = np.meshgrid(_finite(dtype), _finite(dtype), indexing="ij")
    return a.ravel(), b.ravel()


def _numpy(form, *args, dtype=np.float64):
    with np.errstate(all="ignore"):
        return form(np, *(np.asarray(a, dtype=dtype) for a in args[:-1]), args[-1])


def _run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.astype(np.float32) for k, v in feeds.items()})[0]


def _op_types(model: onnx.ModelProto) -> set[str]:
    nodes = list(model.graph.node) + [n for f in model.functions for n in f.node]
    return {n.op_type for n in nodes}


def _same(got, want, what: str, rtol: float = 0.0) -> None:
    """Equal (or within ``rtol``), with infinities and NaN in the same places."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0.0, equal_nan=True, err_msg=what)


# --------------------------------------------------------------------------
# Unary functions
# --------------------------------------------------------------------------


@pytest.mark.parametrize("op", UNARY_ROWS)
def test_unary_syntax_and_api(op: UnaryOp) -> None:
    assert op.name in RESERVED and ir.UNARY_FUNCS[op.name] == (op.param is not None)
    make = getattr(einopt, op.api)
    assert make is api.FUNCTIONS[op.api] and op.api in einopt.__all__
    (i,) = einopt.iters("i:3")
    x = einopt.tensor("A", (3,))[i]
    for p in _params(op):
        e = _unary(op, 3, p)
        assert parse(str(e)) is e, str(e)
        built = make(x) if p is None else make(x, p)
        assert built is e.body
        if p is not None:
            assert make(x=x, **{op.param: p}) is e.body
    one_too_many = (x, _params(op)[0], 1.0) if op.param else (x, 1.0)
    with pytest.raises(TypeError):
        make(*one_too_many)


@pytest.mark.parametrize("op", UNARY_ROWS)
def test_unary_interpreter_computes_the_numpy_form(op: UnaryOp) -> None:
    xs = np.array(FINITE + INFINITE)
    for p in _params(op):
        e = _unary(op, len(xs), p)
        for mode, dtype in (("float64", np.float64), ("float32", np.float32)):
            got = evaluate(e, {"A": xs}, mode=mode)
            assert got.dtype == dtype
            _same(got, _numpy(op.numpy, xs, p, dtype=dtype), f"{op.name}({p}) in {mode}")


@pytest.mark.parametrize("op", UNARY_ROWS)
def test_unary_integer_mode(op: UnaryOp) -> None:
    ints = np.array([-3.0, -1.0, 0.0, 2.0, 5.0])
    e = _unary(op, len(ints), 2.0 if op.param else None)  # an integral parameter
    if op.exact:
        got = evaluate(e, {"A": ints}, mode="int")
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, evaluate(e, {"A": ints}))
    else:
        with pytest.raises(EvaluationError, match=f"function {op.name}"):
            evaluate(e, {"A": ints}, mode="int")


@pytest.mark.tvm
@pytest.mark.parametrize("op", UNARY_ROWS)
def test_unary_tvm_matches_interpreter(op: UnaryOp) -> None:
    xs = _in_range(op, FINITE[:-2])  # float32's limits overflow inside the math libraries' formulas
    for p in _params(op)[-1:]:
        e = _unary(op, len(xs), p)
        got = einopt.compile(e)(A=xs)
        _same(got, evaluate(e, {"A": xs}, mode="float32"), f"{op.name}({p})", rtol=1e-5)


@pytest.mark.parametrize("op", UNARY_ROWS)
def test_unary_onnx_runtime_matches_interpreter(op: UnaryOp) -> None:
    xs = np.concatenate([_in_range(op, FINITE), _in_range(op, INFINITE)])
    for p in _params(op):
        e = _unary(op, len(xs), p)
        model = einopt.to_onnx(e)
        assert op.onnx in _op_types(model)
        got = _run_ort(model, {"A": xs})
        _same(got, evaluate(e, {"A": xs}, mode="float32"), f"{op.name}({p})", rtol=1e-6)


def _onnx_forms(op: UnaryOp) -> list[tuple[float | None, dict, list]]:
    """``(param, attributes, initializers)`` of the ONNX nodes computing ``op`` with each sample
    parameter (and without, where the parameter is an attribute with a default)."""
    if op.param_input:
        return [(p, {}, [numpy_helper.from_array(np.array(p, np.float32), "p")]) for p in op.sample_params]
    forms = [(op.param_default, {}, [])]
    return forms + [(float(np.float32(p)), {op.onnx_param: p}, []) for p in op.sample_params]


@pytest.mark.parametrize("op", UNARY_ROWS)
def test_unary_onnx_import(op: UnaryOp) -> None:
    xs = np.concatenate([_in_range(op, FINITE), _in_range(op, INFINITE)]).astype(np.float32)
    for param, attr, inits in _onnx_forms(op):
        node = helper.make_node(op.onnx, ["x", *(i.name for i in inits)], ["y"], **attr)
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs.shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, xs.shape)],
            initializer=inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        program, _ = translate_single_node(model)
        body = program.scope("y").body
        assert isinstance(body, ir.Unary) and (body.fn, body.param) == (op.name, param)
        got = evaluate(program, {"x": xs}, mode="float32")["y"]
        _same(got, _run_ort(model, {"x": xs}), f"{op.onnx} {attr}", rtol=1e-6)


@pytest.mark.parametrize("op", UNARY_ROWS)
def test_unary_facts_hold_on_sample_points(op: UnaryOp) -> None:
    for dtype in (np.float64, np.float32):
        # zero: f(0) = 0 for every parameter (pow's 0 ** -4 is inf).
        at_zero = {p: _numpy(op.numpy, [0.0, -0.0], p, dtype=dtype) for p in _params(op) + _steep(op)}
        zero = all(bool(np.all(v == 0)) for v in at_zero.values())
        assert op.zero == zero, f"zero: {op.name} at 0 is {at_zero}"
        for p in _params(op) + _steep(op):
            values = _numpy(op.numpy, _finite(dtype), p, dtype=dtype)
            finite = bool(np.all(np.isfinite(values)))
            assert op.keeps_finite(p) == finite, f"finite: {op.name}({p}) on {_finite(dtype)} is {values}"
    # The sample range is where tests may feed it: finite and moderate there.
    inside = _numpy(op.numpy, _in_range(op, FINITE[:-2]), *_params(op)[:1], dtype=np.float32)
    assert np.all(np.isfinite(inside)) and np.all(np.abs(inside) < 1e31)


@pytest.mark.parametrize("op", UNARY_ROWS)
def test_unary_derived_tables(op: UnaryOp) -> None:
    assert UNARY_OPS[op.name] == op.onnx
    assert UNARY_PARAM.get(op.name) == (None if op.param_input else op.onnx_param)
    assert (op.name in UNARY_PARAM_INPUT) == op.param_input
    # A non-linear function ends subprograms unless a target operator absorbs it (erf: Gelu).
    assert (op.onnx in ACTIVATIONS) == (op.activation and op.onnx not in ABSORBED)
    assert FLOPS[op.onnx]((), (10,), helper.make_node(op.onnx, [], [])) == 10 * op.flops


@pytest.mark.parametrize("op", [pytest.param(op, id=op.name) for op in UNARY.values() if op.param_input])
def test_parameter_input_in_an_eoperator(op: UnaryOp) -> None:
    # A sum matches no operator: the eOperator's body writes the parameter as an input too.
    i, k = einopt.iters("i:3 k:4")
    a = einopt.tensor("A", (3, 4))
    e = einopt.L(i)(einopt.Sum(k)(ir.Unary(op.name, a[i, k], op.sample_params[0]) * a[i, k]))
    model = einopt.to_onnx(e)
    nodes = [n for f in model.functions for n in f.node if n.op_type == op.onnx]
    assert model.functions and nodes and all(len(n.input) == 2 for n in nodes)
    xs = np.random.default_rng(0).uniform(*op.sample_range, size=(3, 4))
    _same(_run_ort(model, {"A": xs}), evaluate(e, {"A": xs}, mode="float32"), op.name, rtol=1e-5)


def test_tame_reads_arguments_inside_the_sample_range() -> None:
    (i,) = einopt.iters("i:4")
    x = einopt.tensor("A", (4,))[i]
    for op in UNARY.values():
        got = evaluate(einopt.L(i)(tame(op.name, x)), {"A": np.array([-1e3, -1.0, 0.0, 1e3])})
        lo, hi = op.sample_range
        assert np.all((lo <= got) & (got <= hi)), op.name


# --------------------------------------------------------------------------
# Binary operators
# --------------------------------------------------------------------------


@pytest.mark.parametrize("op", BINARY_ROWS)
def test_binary_syntax_and_api(op: BinaryOp) -> None:
    e = _binary(op, 3)
    assert parse(str(e)) is e, str(e)
    a, b = e.body.a, e.body.b
    if op.infix:
        assert op.api is None and op.name not in RESERVED
        assert f" {op.name} " in str(e)
    else:
        assert op.name in RESERVED and getattr(einopt, op.api)(a, b) is e.body
        assert str(e.body) == f"{op.name}({a}, {b})"


@pytest.mark.parametrize("op", BINARY_ROWS)
def test_binary_interpreter_computes_the_numpy_form(op: BinaryOp) -> None:
    xs, ys = _pairs()
    e = _binary(op, len(xs))
    for mode, dtype in (("float64", np.float64), ("float32", np.float32)):
        got = evaluate(e, {"A": xs, "B": ys}, mode=mode)
        with np.errstate(all="ignore"):
            want = op.numpy(np, xs.astype(dtype), ys.astype(dtype))
        _same(got, want, f"{op.title} in {mode}")


@pytest.mark.parametrize("op", BINARY_ROWS)
def test_binary_integer_mode(op: BinaryOp) -> None:
    xs, ys = np.array([-3.0, 0.0, 2.0, 5.0]), np.array([2.0, -1.0, 2.0, 0.0])
    e = _binary(op, len(xs))
    if op.exact:
        got = evaluate(e, {"A": xs, "B": ys}, mode="int")
        np.testing.assert_array_equal(got, evaluate(e, {"A": xs, "B": ys}))
    else:
        with pytest.raises(EvaluationError, match=f"{op.title} '"):
            evaluate(e, {"A": xs, "B": ys}, mode="int")


@pytest.mark.tvm
@pytest.mark.parametrize("op", BINARY_ROWS)
def test_binary_tvm_matches_interpreter(op: BinaryOp) -> None:
    xs, ys = _pairs()
    keep = (np.abs(xs) < 1e20) & (np.abs(ys) < 1e20)
    xs, ys = xs[keep], ys[keep]
    e = _binary(op, len(xs))
    got = einopt.compile(e)(A=xs, B=ys)
    _same(got, evaluate(e, {"A": xs, "B": ys}, mode="float32"), op.title, rtol=1e-6)


@pytest.mark.parametrize("op", BINARY_ROWS)
def test_binary_onnx_runtime_matches_interpreter(op: BinaryOp) -> None:
    xs, ys = _pairs()
    e = _binary(op, len(xs))
    model = einopt.to_onnx(e)
    assert op.onnx in _op_types(model)
    got = _run_ort(model, {"A": xs, "B": ys})
    _same(got, evaluate(e, {"A": xs, "B": ys}, mode="float32"), op.title, rtol=1e-6)


@pytest.mark.parametrize("op", BINARY_ROWS)
def test_binary_onnx_import(op: BinaryOp) -> None:
    xs, ys = (v.astype(np.float32) for v in _pairs())
    arrays = {"a": xs, "b": ys, "c": ys[::-1].copy()}
    forms = [(op.onnx, "ab")] + ([(op.onnx_variadic, "abc")] if op.onnx_variadic else [])
    for onnx_op, names in forms:
        node = helper.make_node(onnx_op, list(names), ["y"])
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, xs.shape) for n in names],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, xs.shape)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        program, _ = translate_single_node(model)
        body = program.scope("y").body
        assert isinstance(body, ir.Binary) and body.op == op.name
        feeds = {n: arrays[n] for n in names}
        got = evaluate(program, feeds, mode="float32")["y"]
        _same(got, _run_ort(model, feeds), onnx_op, rtol=1e-6)


@pytest.mark.parametrize("op", BINARY_ROWS)
def test_binary_facts_hold_on_sample_points(op: BinaryOp) -> None:
    xs, ys = _pairs()
    f = op.numpy
    zeros = np.zeros(len(FINITE), dtype=np.float32)
    with np.errstate(all="ignore"):
        both = f(np, np.zeros(2), np.array([0.0, -0.0]))
        either = np.concatenate([f(np, zeros, _finite()), f(np, _finite(), zeros)])
        for dtype in (np.float64, np.float32):
            values = f(np, *_pairs(dtype))
            assert op.finite == bool(np.all(np.isfinite(values))), f"finite: {op.title}"
        commutes = np.array_equal(f(np, xs, ys), f(np, ys, xs), equal_nan=True)
    assert (op.zero != "never") == bool(np.all(both == 0)), f"zero: {op.title}(0, 0) is {both}"
    assert (op.zero == "either") == bool(np.all(either == 0)), f"zero: {op.title} with one 0 operand"
    assert op.commutative == commutes, op.title
    assert (op.name in ir.COMMUTATIVE_OPS) == op.commutative


@pytest.mark.parametrize("op", BINARY_ROWS)
def test_binary_derived_tables(op: BinaryOp) -> None:
    assert BINARY_OPS[op.name] == op.onnx and op.name in ir.BINARY_OPS
    for name in {op.onnx, op.onnx_variadic} - {None}:
        assert (name in ACTIVATIONS) == op.activation
        assert FLOPS[name]((), (10,), helper.make_node(name, [], [])) == 10 * op.flops


# --------------------------------------------------------------------------
# The table itself
# --------------------------------------------------------------------------


def _row(**changes) -> UnaryOp:
    """A row like relu's, changed."""
    relu = UNARY["relu"]
    fields = ("name", "onnx", "numpy", "tvm", "zero", "finite", "exact")
    return UnaryOp(**{**{f: getattr(relu, f) for f in fields}, **changes})


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: _row(param="slope"), "needs param, onnx_param"),
        (lambda: _row(param_input=True), "need a parameter"),
        (lambda: _row(param_default=0.5), "need a parameter"),
        (lambda: _row(param="p", onnx_param="p", sample_params=(1.0,)), "needs its param_default"),
        (
            lambda: _row(
                param="p", onnx_param="Y", sample_params=(1.0,), param_default=1.0, param_input=True
            ),
            "needs its param_default",
        ),
        (lambda: _row(sample_range=(1.0, 1.0)), "empty sample_range"),
        (lambda: _row(onnx="Not An Op"), "not an identifier"),
        (lambda: _row(finite=lambda p: True), "depend only on a parameter"),
        (lambda: ops._table([UNARY["relu"], _row(name="relu2")]), "both use 'Relu'"),
        (lambda: BinaryOp(**{**_binary_fields("max"), "zero": "sometimes"}), "zero must be one of"),
        (lambda: BinaryOp(**{**_binary_fields("max"), "api": None}), "needs an api name"),
    ],
)
def test_malformed_rows_are_refused(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def _binary_fields(name: str) -> dict:
    op = BINARY[name]
    return {f: getattr(op, f) for f in op.__dataclass_fields__}


def test_import_einopt_loads_neither_numpy_nor_tvm() -> None:
    # The forms receive their namespace: the table imports neither.
    code = "import sys, einopt; heavy = [m for m in ('numpy', 'tvm') if m in sys.modules]; assert not heavy, heavy"
    subprocess.run([sys.executable, "-P", "-c", code], check=True)
