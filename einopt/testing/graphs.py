"""Random *valid* ONNX models over every operator the importers translate, and their input data.

    >>> from einopt.testing.graphs import graphs, feeds
    >>> @given(graphs(), st.integers(0, 2**32 - 1))
    ... def test_x(case, seed):
    ...     data = feeds(case, np.random.default_rng(seed), "special")

A graph is a chain or DAG of 2-8 operators (opset 17, or 20 with Gelu; float32), each drawn
from :data:`OP_BUILDERS` (one builder per op type of
``einopt.frontend.importers.IMPORTERS``) and applied to a value made so far
(usually the newest one, so chains are long; sometimes an older one, so
values fan out). A second operand is a new graph input, a constant
initializer or an existing value of a fitting shape. Every value has at most
``MAX_ELEMENTS`` elements. The builder computes every shape itself and
declares the outputs with them; :func:`build_graph` checks the model with
``onnx.checker`` (full check, so ONNX shape inference must agree), so a
generator mistake fails loudly instead of producing a vacuous test.

The same builders run on two sources of choices: :func:`graphs` (a
Hypothesis strategy, which shrinks failures) and :class:`RngDraw` (a numpy
generator, for ``scripts/fuzz.py``: graph ``k`` of seed ``s`` is
reproducible from ``(s, k)`` alone).

Input data (:func:`feeds`): ``"ordinary"`` values in ``[-2, 2)``,
``"integer"`` exact small integers in ``[-3, 3]`` and ``"special"``
values: ordinary ones mixed with ``0``, ``-0``, ``+-inf``, NaN, huge
``+-1e30``, ``3e38`` and small integers. What "equal" means on them, and
which (operator, value) combinations are left out and why, is in
:data:`SPECIAL_VALUES` and the builders' ``exclude`` arguments; the same
values computed inside the graph are kept out through ``einopt.testing.hazards``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from einopt.pipeline import Options, optimize
from einopt.runtime.sessions import prepare_options
from einopt.runtime.verify import Tolerance, compare
from einopt.testing.hazards import ANY_DATA, FINITE, INPUT, Risks, computed

__all__ = [
    "OPSET",
    "MAX_ELEMENTS",
    "SPECIAL_VALUES",
    "OP_BUILDERS",
    "GraphCase",
    "RngDraw",
    "build_graph",
    "symbolic_case",
    "BATCHES",
    "graphs",
    "feeds",
    "check_case",
    "ort_optimizer_refusal",
]

T = TypeVar("T")

OPSET = 17
MAX_ELEMENTS = 1024
MIN_OPS, MAX_OPS = 2, 8

# Special input values by class. A class can be excluded per graph by a builder (see ``exclude``).
#   zero: 0 and -0 (-0 may come back as +0: compare() sees no difference, and neither does IEEE ==)
#   inf: +-inf; nan: NaN (its positions must match exactly)
#   huge: +-1e30 (products of two overflow in every evaluation order; sums of a few do not), and
#         3e38, next to FLT_MAX, where a sum of two overflows
#   int: exact small integers
SPECIAL_VALUES: dict[str, tuple[float, ...]] = {
    "zero": (0.0, -0.0),
    "inf": (math.inf, -math.inf),
    "nan": (math.nan,),
    "huge": (1e30, -1e30, 3e38),
    "int": (-3.0, -1.0, 1.0, 2.0, 3.0),
}


class Draw(Protocol):
    """The choices a builder makes: integers (inclusive bounds), one of a sequence, a coin."""

    def integer(self, lo: int, hi: int) -> int: ...

    def choice(self, options: Sequence[T]) -> T: ...

    def coin(self, percent: int) -> bool: ...


class RngDraw:
    """Choices from a numpy generator (for the fuzzing script)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def choice(self, options: Sequence[T]) -> T:
        return options[int(self.rng.integers(len(options)))]

    def coin(self, percent: int) -> bool:
        return int(self.rng.integers(100)) < percent


class _HypothesisDraw:
    """Choices from Hypothesis (shrinks towards small integers, the first option, False)."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def choice(self, options: Sequence[T]) -> T:
        return options[self.draw(st.integers(0, len(options) - 1))]

    def coin(self, percent: int) -> bool:
        return self.draw(st.integers(0, 99)) >= 100 - percent


@dataclasses.dataclass(frozen=True)
class Value:
    name: str
    shape: tuple[int, ...]
    risks: Risks = FINITE  # the infinities and NaN it may hold (einopt.testing.hazards)


@dataclasses.dataclass(frozen=True)
class GraphCase:
    """A generated model, the op types it uses (in order) and the special-value classes its inputs may get."""

    model: onnx.ModelProto
    ops: tuple[str, ...]
    specials: frozenset[str]

    def __repr__(self) -> str:  # Hypothesis prints failing examples with this
        return (
            f"GraphCase({' -> '.join(self.ops)}; specials {sorted(self.specials)})\n"
            + helper.printable_graph(self.model.graph)
        )


class _Graph:
    """The graph under construction."""

    def __init__(self, d: Draw, rng: np.random.Generator) -> None:
        self.d = d
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.inputs: list[Value] = []
        self.values: list[Value] = []
        self.by_name: dict[str, Value] = {}  # graph inputs and node outputs (constants are not values)
        self.read: set[str] = set()
        self.ops: list[str] = []
        self.specials = set(SPECIAL_VALUES)
        self.opset = OPSET  # raised by an operator of a newer opset (Gelu: 20), see ``allows``
        self._count = 0

    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def pick(self, ok: Callable[[Value], bool] = lambda v: True) -> Value | None:
        """The newest value (usually) or an earlier one that ``ok`` accepts."""
        found = [v for v in self.values if v.shape and ok(v)]  # scalars (rank-0 operands) are never read
        if not found:
            return None
        return found[-1] if self.d.coin(60) else self.d.choice(found)

    def new_input(self, shape: Sequence[int]) -> str:
        v = Value(self.fresh("in"), tuple(shape), INPUT)
        self.inputs.append(v)
        self.values.append(v)
        self.by_name[v.name] = v
        return v.name

    def const(self, array: np.ndarray, prefix: str = "c") -> str:
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weights(self, shape: Sequence[int]) -> np.ndarray:
        return self.rng.uniform(-2, 2, tuple(shape)).astype(np.float32)

    def operand(self, shape: Sequence[int], reuse: bool = True) -> str:
        """A float32 operand of exactly ``shape``: an existing value, a new graph input or a constant."""
        shape = tuple(shape)
        if reuse and self.d.coin(30):
            v = self.pick(lambda v: v.shape == shape)
            if v is not None:
                return v.name
        if self.d.coin(50):
            return self.new_input(shape)
        return self.const(self.weights(shape))

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(values, dtype=np.int64), "k")

    def node(
        self,
        op: str,
        inputs: Sequence[str],
        shapes: Sequence[Sequence[int]],
        *,
        nan_on_any_data: bool = False,
        **attrs: Any,
    ) -> list[Value]:
        """A node and its outputs, with their risks (``nan_on_any_data``: see ``hazards.computed``)."""
        risks = computed(op, (self.by_name[i].risks for i in inputs if i in self.by_name), nan_on_any_data)
        outs = [Value(self.fresh("v"), tuple(int(n) for n in s), risks) for s in shapes]
        self.nodes.append(helper.make_node(op, list(inputs), [o.name for o in outs], **attrs))
        self.read.update(i for i in inputs if i)
        self.values.extend(outs)
        self.by_name.update((o.name, o) for o in outs)
        return outs

    def exclude(self, *classes: str) -> None:
        """Keep special values of ``classes`` out of this graph's inputs (the builder says why)."""
        self.specials -= set(classes)

    def keep_out(self, x: Value, inf: bool = False, nan: bool = False) -> bool:
        """Keep computed infinities (``inf``) and NaN (``nan``) out of ``x`` as ``exclude`` keeps them
        out of the inputs: exclude the input classes under which ``x`` may hold one. False (``x``
        cannot be kept clean) when ordinary data can make one.
        """
        classes = (x.risks.inf if inf else frozenset()) | (x.risks.nan if nan else frozenset())
        if ANY_DATA in classes:
            return False
        self.exclude(*classes)
        return True

    def allows(self, op: str, opset: int | None = None) -> bool:
        """Whether ``op`` means at ``opset`` (default: the graph's) what its builder builds (at
        :data:`OPSET`): its schema did not change in between. An op newer than :data:`OPSET`
        (Gelu) raises the graph's opset itself."""
        built = _schema_version(op, OPSET)
        return built is None or built == _schema_version(op, opset or self.opset)

    def raise_opset(self, opset: int) -> bool:
        """Move the graph to ``opset`` if every node in it means the same there."""
        if not all(self.allows(n.op_type, opset) for n in self.nodes):
            return False
        self.opset = max(self.opset, opset)
        return True


def _schema_version(op: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op, opset).since_version
    except onnx.defs.SchemaError:  # not in the default domain at that opset yet
        return None


Builder = Callable[[_Graph, Value], bool]


def _contraction(g: _Graph) -> None:
    """A sum of products: huge values (1e30, 3e38) would make the comparison meaningless.

    Whether ``a*b + c*d`` overflows when ``a*b`` alone would depends on the
    kernel, not on the translation: ONNX Runtime's MLAS kernels fuse
    multiply-add (``fma(3e38, 1.3, -2.4e38)`` is finite, ``3e38 * 1.3`` is
    inf) and every kernel sums in its own order, so two correct evaluations of
    one contraction give -inf, NaN or a finite value on the same input (seen:
    ConvTranspose vs its Einsum eOperator). Infinities and NaN stay in: they
    propagate the same way in every order.
    """
    g.exclude("huge")


def _size(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _fits(shape: Sequence[int]) -> bool:
    return 1 <= len(shape) <= 5 and all(n >= 1 for n in shape) and _size(shape) <= MAX_ELEMENTS


def _broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    """The broadcast shape, or ``()`` (which never fits) when the shapes clash."""
    try:
        return tuple(int(n) for n in np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError:
        return ()


def _partner_shape(g: _Graph, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape broadcasting with ``shape``: a suffix with some dims 1, or widening size-1 dims of ``shape``."""
    k = g.d.integer(0, len(shape))
    mine = shape[len(shape) - k :]
    out = [g.d.integer(2, 3) if n == 1 and g.d.coin(20) else (1 if g.d.coin(25) else n) for n in mine]
    if len(out) == len(shape) and len(shape) < 4 and g.d.coin(10):
        out = [g.d.integer(2, 3), *out]
    return tuple(out)


# --------------------------------------------------------------------------
# Builders: one per op type; False when the op does not apply to ``x``
# --------------------------------------------------------------------------


def _unary(op: str, **attrs: Any) -> Builder:
    def build(g: _Graph, x: Value) -> bool:
        g.node(op, [x.name], [x.shape], **attrs)
        return True

    return build


def _leaky_relu(g: _Graph, x: Value) -> bool:
    g.node("LeakyRelu", [x.name], [x.shape], alpha=g.d.choice([0.01, 0.2, 1.5]))
    return True


def _binary(op: str) -> Builder:
    def build(g: _Graph, x: Value) -> bool:
        other = _partner_shape(g, x.shape)
        out = _broadcast(x.shape, other)
        if not _fits(out):
            return False
        if op == "Div":
            # Div is the one op that tells -0 from +0 (x / -0 = -inf), and kernels disagree on the
            # sign of an exact-zero result (ONNX Runtime's Einsum sums from +0, so 0 * -1 comes out
            # +0; Mul gives -0): a computed divisor could turn equal zeros into opposite infinities.
            # So the divisor is a graph input or a constant (both reach the two models unchanged,
            # special zeros included) and the computed value is the dividend.
            g.node(op, [x.name, g.operand(other, reuse=False)], [out])
            return True
        y = g.operand(other)
        args = [x.name, y] if g.d.coin(70) else [y, x.name]
        g.node(op, args, [out])
        return True

    return build


def _variadic(op: str) -> Builder:
    def build(g: _Graph, x: Value) -> bool:
        others = [_partner_shape(g, x.shape) for _ in range(g.d.integer(0, 2))]
        out = _broadcast(x.shape, *others)
        if not _fits(out):
            return False
        g.node(op, [x.name, *(g.operand(s) for s in others)], [out])
        return True

    return build


def _pow(g: _Graph, x: Value) -> bool:
    exponent = g.d.choice([2.0, 3.0, 0.5, -1.0, 1.0, 0.0, 1.5, -0.5, 4.0])
    dtype = np.int64 if exponent.is_integer() and g.d.coin(30) else np.float32
    if exponent == 0.5:
        # Imported as sqrt, which gives NaN at -inf where ONNX Runtime's powf gives inf (a -inf
        # the graph computes too).
        if not g.keep_out(x, inf=True):
            return False
        g.exclude("inf", "huge")
    # Like Div's divisor: a negative power of a computed zero depends on the zero's sign, which
    # kernels disagree on; the base is a graph input or a constant.
    base = g.operand(x.shape, reuse=False) if exponent < 0 else x.name
    fractional = not exponent.is_integer()  # of a negative base: NaN
    g.node("Pow", [base, g.const(np.array(exponent, dtype))], [x.shape], nan_on_any_data=fractional)
    return True


def _reciprocal(g: _Graph, x: Value) -> bool:
    # 1 / x: a graph input or a constant, as Div's divisor (the sign of a computed zero).
    g.node("Reciprocal", [g.operand(x.shape, reuse=False)], [x.shape])
    return True


def _hard_sigmoid(g: _Graph, x: Value) -> bool:
    attrs = {}
    if g.d.coin(60):
        attrs = {"alpha": g.d.choice([0.2, 1 / 6, 0.5, -0.3]), "beta": g.d.choice([0.5, 0.0, -0.2])}
    g.node("HardSigmoid", [x.name], [x.shape], **attrs)
    return True


def _gelu(g: _Graph, x: Value) -> bool:
    if not g.raise_opset(20):  # Gelu is a default-domain operator from opset 20
        return False
    attrs = {"approximate": g.d.choice(["none", "tanh"])} if g.d.coin(70) else {}
    g.node("Gelu", [x.name], [x.shape], **attrs)
    return True


def _prelu(g: _Graph, x: Value) -> bool:
    k = g.d.integer(0, len(x.shape))
    slope = g.operand(tuple(n if g.d.coin(50) else 1 for n in x.shape[len(x.shape) - k :]))
    # einopt's PRelu is max(X, 0) + slope * min(X, 0): ONNX Runtime's for a finite slope (an
    # infinite or NaN one times the zero of min(X, 0) is NaN where ORT gives X).
    if slope in g.by_name and not g.keep_out(g.by_name[slope], inf=True, nan=True):
        return False
    g.node("PRelu", [x.name, slope], [x.shape])
    return True


def _clip(g: _Graph, x: Value) -> bool:
    # Infinite bounds mean "no bound"; a lower bound of +inf or an upper one of -inf would make the
    # output an infinity everywhere, which the risks (einopt.testing.hazards) do not track.
    lo = g.const(np.float32(g.d.choice([-1.0, 0.0, 0.5, 2.0, -math.inf]))) if g.d.coin(50) else ""
    hi = g.const(np.float32(g.d.choice([-1.0, 0.0, 0.5, 2.0, math.inf]))) if g.d.coin(50) else ""
    g.node("Clip", [x.name, lo, hi] if hi else ([x.name, lo] if lo else [x.name]), [x.shape])
    return True


def _batch_normalization(g: _Graph, x: Value) -> bool:
    if len(x.shape) < 2:
        return False
    c = x.shape[1]
    scale, bias, mean = (g.const(g.weights([c])) for _ in range(3))
    var = g.const(g.rng.uniform(0.1, 2.0, c).astype(np.float32))
    g.node(
        "BatchNormalization", [x.name, scale, bias, mean, var], [x.shape], epsilon=g.d.choice([1e-5, 1e-3])
    )
    return True


def _matmul(g: _Graph, x: Value) -> bool:
    k = x.shape[-1]
    n = g.d.integer(1, 4)
    if len(x.shape) == 1:
        other = (k, n) if g.d.coin(70) else (g.d.integer(1, 2), k, n)
    else:
        batch = x.shape[:-2] if len(x.shape) > 2 and g.d.coin(50) else ()
        other = (*batch, k, n) if g.d.coin(80) else (k,)
    a, b = np.zeros(x.shape), np.zeros(other)
    out = np.matmul(a, b).shape
    if not out or not _fits(out):
        return False
    _contraction(g)
    g.node("MatMul", [x.name, g.operand(other)], [out])
    return True


def _gemm(g: _Graph, x: Value) -> bool:
    if len(x.shape) != 2:
        return False
    trans_a, trans_b = g.d.coin(30), g.d.coin(40)
    m, k = x.shape[::-1] if trans_a else x.shape
    n = g.d.integer(1, 4)
    attrs: dict[str, Any] = {}
    if trans_a:
        attrs["transA"] = 1
    if trans_b:
        attrs["transB"] = 1
    if g.d.coin(30):
        attrs["alpha"] = g.d.choice([0.5, 2.0])
    inputs = [x.name, g.operand((n, k) if trans_b else (k, n))]
    if g.d.coin(60):
        inputs.append(g.operand(g.d.choice([(n,), (1, n), (m, 1), (m, n), (1,)])))
        if g.d.coin(30):
            attrs["beta"] = g.d.choice([0.5, 2.0, 0.0])
    _contraction(g)
    g.node("Gemm", inputs, [(m, n)], **attrs)
    return True


def _einsum(g: _Graph, x: Value) -> bool:
    if len(x.shape) > 3:
        return False
    letters = "abcdef"
    xs = letters[: len(x.shape)]
    sizes = dict(zip(xs, x.shape, strict=True))
    terms, inputs = [xs], [x.name]
    if g.d.coin(80):  # a second operand: some letters of x, some new ones
        shared = [c for c in xs if g.d.coin(60)]
        new = letters[len(xs) : len(xs) + g.d.integer(0, 2)]
        for c in new:
            sizes[c] = g.d.integer(1, 3)
        ys = list(shared + list(new))
        if not ys:
            ys = [xs[0]]
        order = list(ys)
        g.rng.shuffle(order)
        terms.append("".join(order))
        inputs.append(g.operand([sizes[c] for c in order]))
    used = list(dict.fromkeys("".join(terms)))
    out = [c for c in used if g.d.coin(60)]
    if not out:
        out = [used[-1]]
    g.rng.shuffle(out)
    shape = [sizes[c] for c in out]
    if not _fits(shape):
        return False
    _contraction(g)
    g.node("Einsum", inputs, [shape], equation=",".join(terms) + "->" + "".join(out))
    return True


def _conv_attrs(g: _Graph, rank: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if g.d.coin(50):
        attrs["strides"] = [g.d.integer(1, 2) for _ in range(rank)]
    if g.d.coin(25):
        attrs["dilations"] = [g.d.integer(1, 2) for _ in range(rank)]
    if g.d.coin(50):
        attrs["pads"] = [g.d.integer(0, 2) for _ in range(2 * rank)]
    return attrs


def _conv(g: _Graph, x: Value) -> bool:
    if len(x.shape) not in (3, 4):
        return False
    n, c, *spatial = x.shape
    rank = len(spatial)
    group = g.d.choice([d for d in (1, 2, c) if c % d == 0])
    f = group * g.d.integer(1, 2)
    kernel = [g.d.integer(1, 3) for _ in range(rank)]
    attrs = _conv_attrs(g, rank)
    if group > 1:
        attrs["group"] = group
    strides = attrs.get("strides", [1] * rank)
    dil = attrs.get("dilations", [1] * rank)
    if g.d.coin(15) and "pads" not in attrs and all(d == 1 for d in dil):
        attrs["auto_pad"] = g.d.choice(["SAME_UPPER", "SAME_LOWER", "VALID"])
    auto = attrs.get("auto_pad", "NOTSET")
    pads = attrs.get("pads", [0] * 2 * rank)
    out = []
    for d in range(rank):
        ext = dil[d] * (kernel[d] - 1) + 1
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-spatial[d] // strides[d]))
        else:
            total = spatial[d] + pads[d] + pads[d + rank] - ext
            if total < 0:
                return False
            out.append(total // strides[d] + 1)
    shape = (n, f, *out)
    if not _fits(shape):
        return False
    inputs = [x.name, g.operand((f, c // group, *kernel), reuse=False)]
    if g.d.coin(40):
        inputs.append(g.operand((f,), reuse=False))
    _contraction(g)
    g.node("Conv", inputs, [shape], **attrs)
    return True


def _conv_transpose(g: _Graph, x: Value) -> bool:
    if len(x.shape) not in (3, 4):
        return False
    n, c, *spatial = x.shape
    rank = len(spatial)
    group = g.d.choice([d for d in (1, 2, c) if c % d == 0])
    fg = g.d.integer(1, 2)
    kernel = [g.d.integer(1, 3) for _ in range(rank)]
    attrs = _conv_attrs(g, rank)
    if group > 1:
        attrs["group"] = group
    strides = attrs.get("strides", [1] * rank)
    dil = attrs.get("dilations", [1] * rank)
    if g.d.coin(30) and any(s > 1 for s in strides):
        attrs["output_padding"] = [g.d.integer(0, s - 1) for s in strides]  # ONNX Runtime: below the stride
    pads = attrs.get("pads", [0] * 2 * rank)
    opad = attrs.get("output_padding", [0] * rank)
    out = [
        strides[d] * (spatial[d] - 1) + opad[d] + dil[d] * (kernel[d] - 1) + 1 - pads[d] - pads[d + rank]
        for d in range(rank)
    ]
    shape = (n, fg * group, *out)
    if min(out) < 1 or not _fits(shape):
        return False
    inputs = [x.name, g.operand((c, fg, *kernel), reuse=False)]
    if g.d.coin(40):
        inputs.append(g.operand((fg * group,), reuse=False))
    _contraction(g)
    g.node("ConvTranspose", inputs, [shape], **attrs)
    return True


def _concat(g: _Graph, x: Value) -> bool:
    axis = g.d.integer(0, len(x.shape) - 1)
    others = []
    for _ in range(g.d.integer(1, 2)):
        s = list(x.shape)
        s[axis] = g.d.integer(1, 3)
        others.append(tuple(s))
    shape = list(x.shape)
    shape[axis] += sum(s[axis] for s in others)
    if not _fits(shape):
        return False
    inputs = [x.name, *(g.operand(s) for s in others)]
    if g.d.coin(30):
        inputs = inputs[::-1]
    g.node("Concat", inputs, [shape], axis=axis - len(x.shape) if g.d.coin(30) else axis)
    return True


def _flatten(g: _Graph, x: Value) -> bool:
    axis = g.d.integer(0, len(x.shape))
    shape = (_size(x.shape[:axis]), _size(x.shape[axis:]))
    negative = 0 < axis < len(x.shape) and g.d.coin(30)
    g.node("Flatten", [x.name], [shape], axis=axis - len(x.shape) if negative else axis)
    return True


def _affine_indices(g: _Graph, n: int, count: int) -> np.ndarray:
    """``count`` indices into ``[0, n)``: affine in their position (translatable) or random (passes through)."""
    if g.d.coin(75):
        step = g.d.choice([s for s in (1, -1, 2, 0) if (count - 1) * abs(s) < n] or [0])
        start = (
            g.d.integer(0, n - 1 - (count - 1) * step)
            if step >= 0
            else g.d.integer((count - 1) * -step, n - 1)
        )
        idx = start + step * np.arange(count)
    else:
        idx = g.rng.integers(0, n, count)
    if g.d.coin(20):
        idx = idx - n  # negative indices count from the end
    return idx.astype(np.int64)


def _gather(g: _Graph, x: Value) -> bool:
    axis = g.d.integer(0, len(x.shape) - 1)
    n = x.shape[axis]
    if g.d.coin(20):
        idx = _affine_indices(g, n, 1).reshape(())
    else:
        count = g.d.integer(1, 4)
        idx = _affine_indices(g, n, count)
        if g.d.coin(20) and count % 2 == 0:
            idx = idx.reshape(2, count // 2)
    shape = (*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :])
    if not _fits(shape):
        return False
    g.node("Gather", [x.name, g.ints(idx) if idx.ndim else g.const(idx, "k")], [shape], axis=axis)
    return True


def _gather_elements(g: _Graph, x: Value) -> bool:
    axis = g.d.integer(0, len(x.shape) - 1)
    shape = [g.d.integer(1, n) for n in x.shape]
    n = x.shape[axis]
    if g.d.coin(70):  # affine in the position along the axis (and constant along the others)
        line = _affine_indices(g, n, shape[axis])
        view = [1] * len(shape)
        view[axis] = shape[axis]
        idx = np.broadcast_to(line.reshape(view), shape).copy()
    else:
        idx = g.rng.integers(0, n, shape).astype(np.int64)
    g.node("GatherElements", [x.name, g.const(idx, "k")], [shape], axis=axis)
    return True


def _pad(g: _Graph, x: Value) -> bool:
    rank = len(x.shape)
    pads = [g.d.integer(-1, 2) for _ in range(2 * rank)]
    shape = [n + pads[d] + pads[d + rank] for d, n in enumerate(x.shape)]
    if not _fits(shape):
        return False
    inputs = [x.name, g.ints(pads)]
    if g.d.coin(30):
        inputs.append(g.const(np.float32(0.0)))
    g.node("Pad", inputs, [shape], mode="constant")
    return True


def _reshape(g: _Graph, x: Value) -> bool:
    total = _size(x.shape)
    dims = []
    rest = total
    for _ in range(g.d.integer(0, 3)):
        divisors = [d for d in range(1, min(rest, 8) + 1) if rest % d == 0]
        d = g.d.choice(divisors)
        dims.append(d)
        rest //= d
    dims.append(rest)
    g.rng.shuffle(dims)
    target = list(dims)
    if g.d.coin(30):
        target[g.d.integer(0, len(target) - 1)] = -1
    elif g.d.coin(20) and len(target) <= len(x.shape) and target[0] == x.shape[0]:
        target[0] = 0
    if len(dims) > 5:
        return False
    g.node("Reshape", [x.name, g.ints(target)], [dims])
    return True


def _expand(g: _Graph, x: Value) -> bool:
    # Repeat size-1 dimensions, and sometimes add a leading one (numpy broadcasting).
    shape = [n if n > 1 or not g.d.coin(60) else g.d.integer(2, 3) for n in x.shape]
    if len(shape) < 4 and g.d.coin(30):
        shape.insert(0, g.d.integer(1, 3))
    if _size(tuple(shape)) > MAX_ELEMENTS:
        return False
    target = [
        1 if n == m and g.d.coin(30) else n for n, m in zip(shape[-len(x.shape) :], x.shape, strict=True)
    ]
    g.node("Expand", [x.name, g.ints(shape[: len(shape) - len(x.shape)] + target)], [shape])
    return True


def _where(g: _Graph, x: Value) -> bool:
    # A constant condition (transformers' causal masks): x where it holds, another value elsewhere.
    # The IR has no selection: Where is arithmetic with the 0/1 condition, equal for finite values
    # (0 * inf is NaN where Where drops the infinity), so infinities and NaN stay out of both.
    cond_shape = _partner_shape(g, x.shape)
    other = _partner_shape(g, x.shape)
    out = _broadcast(x.shape, cond_shape, other)
    if not _fits(out) or not g.keep_out(x, inf=True, nan=True):
        return False
    y = g.operand(other)
    if y in g.by_name and not g.keep_out(g.by_name[y], inf=True, nan=True):
        return False
    g.exclude("nan", "inf")
    cond = g.const(g.rng.random(cond_shape) < 0.6, "mask")
    args = [cond, x.name, y] if g.d.coin(70) else [cond, y, x.name]
    g.node("Where", args, [out])
    return True


def _slice(g: _Graph, x: Value) -> bool:
    rank = len(x.shape)
    axes = sorted({g.d.integer(0, rank - 1) for _ in range(g.d.integer(1, rank))})
    starts, ends, steps, shape = [], [], [], list(x.shape)
    for a in axes:
        n = x.shape[a]
        step = g.d.choice([1, 1, 2, -1, -2])
        if step > 0:
            s = g.d.integer(0, n - 1)
            end = g.d.choice([g.d.integer(s + 1, n), n + 5, 2**62])
            start = s - n if g.d.coin(30) else s
            count = -(-(min(end, n) - s) // step)
        else:  # from s down to e (exclusive); "through 0" needs an end below -n (-1 is the last element)
            s = g.d.integer(0, n - 1)
            e = g.d.integer(0, s - 1) if s > 0 and g.d.coin(50) else -1
            start = s - n if g.d.coin(30) else s
            end = e if e >= 0 else -(2**62)
            count = -(-(s - e) // -step)
        if count < 1:
            return False
        starts.append(start)
        ends.append(end)
        steps.append(step)
        shape[a] = count
    inputs = [x.name, g.ints(starts), g.ints(ends), g.ints(axes)]
    if any(s != 1 for s in steps) or g.d.coin(30):
        inputs.append(g.ints(steps))
    g.node("Slice", inputs, [shape])
    return True


def _split(g: _Graph, x: Value) -> bool:
    axis = g.d.integer(0, len(x.shape) - 1)
    n = x.shape[axis]
    if n < 2:
        return False
    if g.d.coin(50):
        parts = g.d.integer(2, min(n, 3))
        if n % parts:
            return False
        sizes = [n // parts] * parts
        inputs = [x.name]
    else:
        cut = g.d.integer(1, n - 1)
        sizes = [cut, n - cut]
        inputs = [x.name, g.ints(sizes)]
    shapes = [tuple(s if d == axis else m for d, m in enumerate(x.shape)) for s in sizes]
    g.node("Split", inputs, shapes, axis=axis)
    return True


def _squeeze(g: _Graph, x: Value) -> bool:
    ones = [d for d, n in enumerate(x.shape) if n == 1]
    if not ones or len(ones) == len(x.shape):
        return False
    axes = [d for d in ones if g.d.coin(70)] or ones[:1]
    shape = [n for d, n in enumerate(x.shape) if d not in axes]
    g.node("Squeeze", [x.name, g.ints(axes)], [shape])
    return True


def _unsqueeze(g: _Graph, x: Value) -> bool:
    if len(x.shape) >= 5:
        return False
    rank = len(x.shape) + 1
    axes = [g.d.integer(0, rank - 1)]
    shape = list(x.shape)
    shape.insert(axes[0], 1)
    g.node("Unsqueeze", [x.name, g.ints(axes)], [shape])
    return True


def _transpose(g: _Graph, x: Value) -> bool:
    if len(x.shape) < 2:
        return False
    perm = list(range(len(x.shape)))
    g.rng.shuffle(perm)
    if g.d.coin(20):
        g.node("Transpose", [x.name], [x.shape[::-1]])
    else:
        g.node("Transpose", [x.name], [[x.shape[p] for p in perm]], perm=perm)
    return True


def _depth_to_space(g: _Graph, x: Value) -> bool:
    if len(x.shape) != 4 or x.shape[1] % 4:
        return False
    n, c, h, w = x.shape
    g.node(
        "DepthToSpace", [x.name], [(n, c // 4, 2 * h, 2 * w)], blocksize=2, mode=g.d.choice(["DCR", "CRD"])
    )
    return True


def _space_to_depth(g: _Graph, x: Value) -> bool:
    if len(x.shape) != 4 or x.shape[2] % 2 or x.shape[3] % 2:
        return False
    n, c, h, w = x.shape
    g.node("SpaceToDepth", [x.name], [(n, 4 * c, h // 2, w // 2)], blocksize=2)
    return True


def _reduced(g: _Graph, x: Value) -> tuple[list[int], bool, tuple[int, ...]]:
    """Random distinct axes of ``x`` (drawn in ``[-rank, rank)``, made non-negative), ``keepdims``
    and the reduced shape."""
    rank = len(x.shape)
    axes = sorted({g.d.integer(-rank, rank - 1) % rank for _ in range(g.d.integer(1, rank))})
    keepdims = g.d.coin(50)
    out = tuple(1 if d in axes else n for d, n in enumerate(x.shape) if keepdims or d not in axes)
    return axes, keepdims, out


def _reduce_max(g: _Graph, x: Value) -> bool:
    # ONNX Runtime lets a NaN through a maximum only as the first value it compares; the IR's
    # maximum is NaN wherever one is read. That holds for a NaN the graph computes too.
    if not g.keep_out(x, nan=True):
        return False
    g.exclude("nan")
    axes, keepdims, out = _reduced(g, x)
    if not _fits(out):
        return False
    g.node("ReduceMax", [x.name], [out], axes=axes, keepdims=int(keepdims))
    return True


def _pool_window(g: _Graph, x: Value, dilated: bool) -> tuple[dict[str, Any], tuple[int, ...], bool] | None:
    """Per spatial dimension of ``x`` a kernel, stride, (dilation if ``dilated``) and pads: the
    pooling attributes, output shape and ``ceil_mode``, or None where a window does not fit."""
    attrs: dict[str, Any] = {"kernel_shape": [], "strides": [], "pads": []}
    if dilated:
        attrs["dilations"] = []
    ceil = g.d.coin(20)
    out, ends = [], []
    for n in x.shape[2:]:
        k, s = g.d.integer(1, 3), g.d.integer(1, 2)
        dil = g.d.choice([1, 1, 2]) if dilated else 1
        pb, pe = g.d.integer(0, k - 1), g.d.integer(0, k - 1)
        span = n + pb + pe - dil * (k - 1) - 1
        if span < 0:
            return None
        o = -(-span // s) + 1 if ceil else span // s + 1
        if ceil and (o - 1) * s >= n + pb:
            return None  # ONNX Runtime drops that last window; ONNX's shape inference does not
        attrs["kernel_shape"].append(k)
        attrs["strides"].append(s)
        if dilated:
            attrs["dilations"].append(dil)
        attrs["pads"].append(pb)
        ends.append(pe)
        out.append(o)
    attrs["pads"] += ends
    shape = (*x.shape[:2], *out)
    return (attrs, shape, ceil) if _fits(shape) else None


def _max_pool(g: _Graph, x: Value) -> bool:
    # Padding is -inf in ONNX (a penalty scope in the IR). A window of -inf values alone is
    # float32's lowest value in ONNX Runtime but -inf in the IR, and ONNX Runtime lets a NaN through
    # only as a window's first value: infinities and NaN stay out, those the graph computes too.
    if not 3 <= len(x.shape) <= 4 or not g.keep_out(x, inf=True, nan=True):
        return False
    g.exclude("nan", "inf")
    window = _pool_window(g, x, dilated=True)
    if window is None:
        return False
    attrs, shape, ceil = window
    g.node("MaxPool", [x.name], [shape], **attrs, **({"ceil_mode": 1} if ceil else {}))
    return True


def _reduce(op: str) -> Builder:
    # ReduceSum takes its axes as an input (opset 13 on), the others as an attribute until 18.
    def build(g: _Graph, x: Value) -> bool:
        if not g.allows(op):
            return False
        axes, keepdims, out = _reduced(g, x)
        if not _fits(out):
            return False
        if op == "ReduceSum":
            g.node(op, [x.name, g.ints(axes)], [out], keepdims=int(keepdims))
        else:
            g.node(op, [x.name], [out], axes=axes, keepdims=int(keepdims))
        return True

    return build


def _global_average_pool(g: _Graph, x: Value) -> bool:
    if not 3 <= len(x.shape) <= 4:
        return False
    g.node("GlobalAveragePool", [x.name], [(*x.shape[:2], *(1 for _ in x.shape[2:]))])
    return True


def _average_pool(g: _Graph, x: Value) -> bool:
    if not 3 <= len(x.shape) <= 4:
        return False
    window = _pool_window(g, x, dilated=False)
    if window is None:
        return False
    attrs, shape, ceil = window
    extra = {"ceil_mode": 1} if ceil else {}
    g.node("AveragePool", [x.name], [shape], **attrs, **extra, count_include_pad=int(g.d.coin(50)))
    return True


def _layer_normalization(g: _Graph, x: Value) -> bool:
    # A row of infinities is NaN either way, but a huge finite row's variance overflows in float32
    # differently in ONNX Runtime (two passes, the mean in double) than in the interpreter.
    g.exclude("nan", "inf", "huge")
    rank = len(x.shape)
    axis = g.d.integer(-rank, rank - 1)
    normalized = x.shape[axis % rank :]
    inputs = [x.name, g.const(g.weights(normalized))]
    if g.d.coin(70):
        inputs.append(g.const(g.weights(normalized)))
    g.node("LayerNormalization", inputs, [x.shape], axis=axis, epsilon=g.d.choice([1e-5, 1e-3]))
    return True


def _softmax(g: _Graph, x: Value) -> bool:
    g.node("Softmax", [x.name], [x.shape], axis=g.d.integer(-len(x.shape), len(x.shape) - 1))
    return True


OP_BUILDERS: dict[str, Builder] = {
    **{op: _binary(op) for op in ("Add", "Sub", "Mul", "Div")},
    **{op: _variadic(op) for op in ("Sum", "Max", "Min")},
    **{op: _unary(op) for op in ("Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Sqrt", "Identity")},
    **{op: _unary(op) for op in ("Erf", "HardSwish")},
    "Cast": _unary("Cast", to=1),  # float32 to float32: a copy
    "Expand": _expand,
    "Where": _where,
    "Pow": _pow,
    "Reciprocal": _reciprocal,
    "HardSigmoid": _hard_sigmoid,
    "Gelu": _gelu,
    "LeakyRelu": _leaky_relu,
    "PRelu": _prelu,
    "Clip": _clip,
    "BatchNormalization": _batch_normalization,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Einsum": _einsum,
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "Concat": _concat,
    "Flatten": _flatten,
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "Pad": _pad,
    "Reshape": _reshape,
    "Slice": _slice,
    "Split": _split,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Transpose": _transpose,
    "DepthToSpace": _depth_to_space,
    "SpaceToDepth": _space_to_depth,
    "ReduceMax": _reduce_max,
    **{op: _reduce(op) for op in ("ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2")},
    "GlobalAveragePool": _global_average_pool,
    "AveragePool": _average_pool,
    "LayerNormalization": _layer_normalization,
    "MaxPool": _max_pool,
    "Softmax": _softmax,
}
"""Graph builder per ONNX op type: every op the importers translate (``test_fuzz`` checks the two agree)."""


# Shapes of new graph inputs for ops that take few shapes (so that they are not rare).
_INPUT_SHAPES: dict[str, Callable[[Draw], tuple[int, ...]]] = {
    "DepthToSpace": lambda d: (d.integer(1, 2), 4 * d.integer(1, 2), d.integer(1, 3), d.integer(1, 3)),
    "SpaceToDepth": lambda d: (d.integer(1, 2), d.integer(1, 2), 2 * d.integer(1, 2), 2 * d.integer(1, 2)),
    "Conv": lambda d: (d.integer(1, 2), d.integer(1, 4), *(d.integer(2, 5) for _ in range(d.integer(1, 2)))),
    "ConvTranspose": lambda d: (
        d.integer(1, 2),
        d.integer(1, 4),
        *(d.integer(1, 4) for _ in range(d.integer(1, 2))),
    ),
    "Gemm": lambda d: (d.integer(1, 4), d.integer(1, 4)),
    "MaxPool": lambda d: (
        d.integer(1, 2),
        d.integer(1, 3),
        *(d.integer(2, 6) for _ in range(d.integer(1, 2))),
    ),
    "Squeeze": lambda d: (d.integer(1, 4), 1, d.integer(1, 4)),
    "BatchNormalization": lambda d: (d.integer(1, 3), d.integer(1, 4), d.integer(1, 4)),
    "Transpose": lambda d: tuple(d.integer(1, 4) for _ in range(d.integer(2, 4))),
    "Einsum": lambda d: tuple(d.integer(1, 4) for _ in range(d.integer(1, 3))),
}


def build_graph(d: Draw, rng: np.random.Generator, ops: Sequence[str] | None = None) -> GraphCase:
    """One random model: 2-8 ops (or the given op types in order, each applied where it fits).

    Raises
    ------
    onnx.checker.ValidationError, onnx.shape_inference.InferenceError
        When the generator built an invalid model (a bug in this module).
    """
    g = _Graph(d, rng)
    rank = d.integer(1, 4)
    shape = [d.integer(1, 4) for _ in range(rank)]
    g.new_input(shape)
    wanted = list(ops) if ops is not None else None
    count = len(wanted) if wanted is not None else d.integer(MIN_OPS, MAX_OPS)
    names = sorted(OP_BUILDERS)
    for k in range(count):
        op = wanted[k] if wanted is not None else d.choice(names)
        for attempt in range(30):  # an op that does not fit a value tries two more before another op
            if attempt % 3 == 0 and attempt and wanted is None:
                op = d.choice(names)
            x = g.pick()
            if attempt % 3 == 2 and op in _INPUT_SHAPES:  # a new graph input of a shape the op takes
                shape = _INPUT_SHAPES[op](d)
                x = g.by_name[g.new_input(shape)]
            assert x is not None
            if g.allows(op) and OP_BUILDERS[op](g, x):
                g.ops.append(op)
                break
    outputs = [v for v in g.values if v.name not in g.read and v not in g.inputs]
    outputs += [v for v in g.values if v.name in g.read and v not in g.inputs and d.coin(10)]
    if not outputs:  # every op was refused: read the input once
        outputs = g.node("Identity", [g.inputs[0].name], [g.inputs[0].shape])
        g.ops.append("Identity")
    graph = helper.make_graph(
        g.nodes,
        "fuzz",
        [helper.make_tensor_value_info(v.name, TensorProto.FLOAT, v.shape) for v in g.inputs],
        [helper.make_tensor_value_info(v.name, TensorProto.FLOAT, v.shape) for v in outputs],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", g.opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return GraphCase(model, tuple(g.ops), frozenset(g.specials))


@st.composite
def graphs(draw: st.DrawFn, ops: Sequence[str] | None = None) -> GraphCase:
    """Hypothesis strategy: a random valid model, opset 17 or 20 (see :func:`build_graph`)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return build_graph(_HypothesisDraw(draw), rng, ops)


BATCHES = (1, 2, 3, 5)
"""The values of the symbolic batch a :func:`symbolic_case` is compared at (the input model runs at
some of them: a Reshape or a Concat with a constant of its first dimension ties it to one)."""


def symbolic_case(case: GraphCase) -> GraphCase:
    """``case`` with the first dimension of every graph input declared as the symbolic ``batch`` (its
    outputs' sizes left unknown): einopt searches it at batch 1 and must write rewrites that hold at any
    batch the input runs at, or leave them out."""
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    for vi in m.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_param = "batch"
    for vi in m.graph.output:  # of unknown size, of the same rank
        for d in vi.type.tensor_type.shape.dim:
            d.Clear()
    return GraphCase(m, case.ops, case.specials)


def _valid_at(case: GraphCase, batch: int) -> bool:
    """Whether ONNX's strict shape inference accepts ``case`` at ``batch`` (ONNX Runtime runs some
    models that do not fit, a Concat of 0 rows, reading memory nothing wrote)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(
            _at_batch(case, batch).model, strict_mode=True, data_prop=True
        )
    except Exception:  # noqa: BLE001 - any refusal: the batch is not one the model takes
        return False
    return _einsum_letters_agree(inferred.graph) and _prelu_slopes_fit(inferred.graph)


def _shapes(graph: onnx.GraphProto) -> dict[str, list[int | None]]:
    out = {
        vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        for vi in (*graph.input, *graph.value_info, *graph.output)
    }
    return out | {t.name: list(t.dims) for t in graph.initializer}


def _prelu_slopes_fit(graph: onnx.GraphProto) -> bool:
    """Whether every PRelu's slope broadcasts to its input (ONNX's rule; ONNX Runtime also takes a
    slope its input broadcasts to, and shape inference says the output has the input's shape)."""
    shapes = _shapes(graph)
    for node in graph.node:
        if node.op_type != "PRelu":
            continue
        x, slope = shapes.get(node.input[0]), shapes.get(node.input[1])
        if x is None or slope is None:
            continue
        if len(slope) > len(x) or any(
            s not in (1, d) for s, d in zip(reversed(slope), reversed(x), strict=False) if None not in (s, d)
        ):
            return False
    return True


def _einsum_letters_agree(graph: onnx.GraphProto) -> bool:
    """Whether every Einsum's letter labels dimensions of one size (ONNX's rule: only an ellipsis
    broadcasts). Shape inference does not check it, and ONNX Runtime broadcasts a 1 anyway, where
    inference keeps the 1: a batch of 1 against a letter bound to 4 elsewhere."""
    shapes = _shapes(graph)
    for node in graph.node:
        if node.op_type != "Einsum":
            continue
        equation = next(a.s.decode() for a in node.attribute if a.name == "equation").replace(" ", "")
        sizes: dict[str, int] = {}
        for term, name in zip(equation.split("->")[0].split(","), node.input, strict=False):
            if "." in term:  # an ellipsis: its dimensions broadcast
                continue
            for letter, n in zip(term, shapes.get(name) or [], strict=False):
                if letter.isalpha() and n is not None and sizes.setdefault(letter, n) != n:
                    return False
    return True


def _at_batch(case: GraphCase, batch: int) -> GraphCase:
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    for vi in m.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[0].dim_param == "batch":
            dims[0].dim_value = batch
    return GraphCase(m, case.ops, case.specials)


def feeds(case: GraphCase, rng: np.random.Generator, kind: str) -> dict[str, np.ndarray]:
    """Input data for every graph input: ``"ordinary"``, ``"integer"`` or ``"special"`` values.

    Special data is ordinary data with about a third of the elements replaced
    by values of the classes the graph allows (``case.specials``).
    """
    out = {}
    specials = np.array([v for c in sorted(case.specials) for v in SPECIAL_VALUES[c]], dtype=np.float32)
    for vi in case.model.graph.input:
        shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        if kind == "integer":
            arr = rng.integers(-3, 4, shape).astype(np.float32)
        else:
            arr = rng.uniform(-2, 2, shape).astype(np.float32)
        if kind == "special" and specials.size:
            mask = rng.random(shape) < 0.35
            arr = np.where(mask, rng.choice(specials, shape), arr).astype(np.float32)
        out[vi.name] = arr
    return out


# --------------------------------------------------------------------------
# The oracle: optimize without verification, compare in ONNX Runtime
# --------------------------------------------------------------------------

DATA_KINDS = ("ordinary", "integer", "special")


SEARCH_STATES = 2_000
"""States one subprogram's search may generate when :func:`check_case` searches (random graphs are
small: most searches at depth 3 generate a few hundred at most)."""
SEARCH_STATES_PER_GRAPH = 6_000
"""States the searches of one graph may generate together."""
SEARCH_DEADLINE_S = 60.0
"""Wall-clock seconds after which a graph's searches stop anyway (a safety net; the state budgets
keep what is searched independent of the machine)."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one graph; ``detail`` says how.

    ``status``: ``ok``, ``wrong`` (an output differs), ``exception`` (einopt
    raised, or its output does not load or run), ``ort`` (ONNX Runtime's
    graph optimizer refuses the output: it does not load or run at
    ``ORT_ENABLE_ALL``, or computes something else there than unoptimized,
    while the original passes the same check) or ``invalid`` (the generated
    model itself does not run: a generator bug). ``ort_input`` says how ONNX
    Runtime's optimizer mishandles the original model itself, when it does
    and the output inherits that (not the output's failure).
    """

    status: str
    detail: str = ""
    kind: str = ""  # the data kind that showed a wrong output
    optimized: onnx.ModelProto | None = None
    ort_input: str = ""


def _unoptimized_session(model: onnx.ModelProto) -> Any:
    """An ONNX Runtime CPU session without graph optimizations (its kernels, not its rewriter).

    ONNX Runtime's graph optimizer has bugs of its own: with it, ``Transpose
    -> MatMul`` with a 1-D second operand computes a wrong result
    (onnxruntime 1.32.0; ``scripts/fuzz.py --seed 2``, graph 3193), and einopt's
    correct output then "differs". Both models run unoptimized, so the
    comparison is between the kernels, which define the operators' results.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    return _session(model, options)


def _optimized_session(model: onnx.ModelProto) -> Any:
    """An ONNX Runtime CPU session with every graph optimization on (``ORT_ENABLE_ALL``)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    return _session(model, options)


def _session(model: onnx.ModelProto, options: Any) -> Any:
    """A CPU session of ``model``, with its generated kernels built and einopt's library registered
    where it has any."""
    prepare_options(model, options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ort_optimizer_refusal(
    model: onnx.ModelProto, datasets: Sequence[tuple[str, dict[str, np.ndarray]]]
) -> tuple[str, str] | None:
    """How ONNX Runtime's graph optimizer mishandles ``model``, as ``(data kind, detail)``; None when
    it loads it at ``ORT_ENABLE_ALL`` and computes what ``ORT_DISABLE_ALL`` computes on every data set
    of ``datasets`` (``(kind, feeds)`` pairs; :func:`einopt.runtime.verify.compare`, default tolerance).
    """
    names = [o.name for o in model.graph.output]
    try:
        session = _optimized_session(model)
    except Exception as e:  # noqa: BLE001 - every refusal is reported
        return "", f"does not load at ORT_ENABLE_ALL: {type(e).__name__}: {e}"
    plain = _unoptimized_session(model)
    for kind, data in datasets:
        want = dict(zip(names, plain.run(names, data), strict=True))
        try:
            got = dict(zip(names, session.run(names, data), strict=True))
        except Exception as e:  # noqa: BLE001
            return kind, f"does not run at ORT_ENABLE_ALL: {type(e).__name__}: {e}"
        c = compare(want, got, Tolerance())
        if not c.ok:
            return kind, f"differs between ORT_ENABLE_ALL and ORT_DISABLE_ALL: {c.message}"
    return None


def check_case(
    case: GraphCase,
    seed: int,
    kinds: Sequence[str] = DATA_KINDS,
    max_depth: int = 0,
    ort_optimizer: bool = False,
    kernels: str = "onnx",
) -> Outcome:
    """``einopt.optimize`` with verification off, then the output against the original on every data kind.

    Equal means :func:`einopt.runtime.verify.compare` with the default tolerance:
    NaN and infinity positions must match exactly. ``max_depth`` > 0 searches
    every subprogram to that depth (without the measurement cache, within
    :data:`SEARCH_STATES` states per subprogram, :data:`SEARCH_STATES_PER_GRAPH`
    per graph and :data:`SEARCH_DEADLINE_S` seconds). With
    ``ort_optimizer``, an output that passes is also loaded with ONNX
    Runtime's graph optimizations on (:func:`ort_optimizer_refusal`): status
    ``ort`` when it mishandles the output but not the original. ``kernels`` is
    how einopt writes eOperators (``--kernels``; with generated kernels the model runs with its
    kernel library registered). A :func:`symbolic_case` is compared at each of :data:`BATCHES` the
    input model runs at.
    """
    options = Options(max_depth=max_depth, verify=False, accept="verified", kernels=kernels)
    if max_depth:
        options = dataclasses.replace(
            options,
            cache=False,
            states_per_search=SEARCH_STATES,
            states_per_model=SEARCH_STATES_PER_GRAPH,
            deadline_s=SEARCH_DEADLINE_S,
        )
    try:
        result = optimize(case.model, options)
    except Exception as e:  # noqa: BLE001 - the fuzzer reports every exception
        return Outcome("exception", f"{type(e).__name__}: {e}")
    names = [o.name for o in case.model.graph.output]
    try:
        original = _unoptimized_session(case.model)
    except Exception as e:  # noqa: BLE001
        return Outcome("invalid", f"the original does not load: {e}")
    try:
        optimized = _unoptimized_session(result.model)
    except Exception as e:  # noqa: BLE001
        return Outcome(
            "exception", f"the output does not load: {type(e).__name__}: {e}", optimized=result.model
        )
    rng = np.random.default_rng(seed)
    datasets = []
    symbolic = any(
        d.dim_param == "batch" for vi in case.model.graph.input for d in vi.type.tensor_type.shape.dim
    )
    batches = [b for b in BATCHES if _valid_at(case, b)] if symbolic else [None]
    for kind, batch in [(k, b) for k in kinds for b in batches]:
        data = feeds(_at_batch(case, batch) if batch else case, rng, kind)
        try:
            ref = dict(zip(names, original.run(names, data), strict=True))
        except Exception as e:  # noqa: BLE001
            if batch is not None:  # the input model does not take that batch: nothing to compare there
                continue
            return Outcome("invalid", f"the original does not run: {e}")
        datasets.append((kind, data))
        try:
            got = dict(zip(names, optimized.run(names, data), strict=True))
        except Exception as e:  # noqa: BLE001
            at = f" at batch {batch}" if batch else ""
            return Outcome("exception", f"the output does not run{at}: {e}", kind, result.model)
        c = compare(ref, got, Tolerance())
        if not c.ok:
            return Outcome("wrong", c.message + (f" (at batch {batch})" if batch else ""), kind, result.model)
    if ort_optimizer:
        refused = ort_optimizer_refusal(result.model, datasets)
        if refused is not None:
            inherited = ort_optimizer_refusal(case.model, datasets)
            if inherited is None:
                return Outcome("ort", f"the output {refused[1]}", refused[0], result.model)
            return Outcome("ok", optimized=result.model, ort_input=f"the original {inherited[1]}")
    return Outcome("ok", optimized=result.model)
