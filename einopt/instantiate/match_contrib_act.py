"""ONNX Runtime's com.microsoft activation kernels: QuickGelu, FastGelu, Gelu and BiasGelu.

Each computes one function ``y = f(u)`` of one argument ``u`` per element: the input ``X``, or
``X + bias`` with ``bias`` one-dimensional over ``X``'s last dimension (FastGelu's optional
input, BiasGelu's). A scope matches when its body is such a function of such an argument and
the function is the operator's:

- ``QuickGelu(alpha)``: ``u * sigmoid(alpha * u)`` (SiLU/Swish for ``alpha = 1``);
- ``FastGelu``: ``0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))``, GELU's tanh approximation,
  never matched for the erf form it approximates (they differ by up to 5e-4);
- ``Gelu``/``BiasGelu``: ``0.5 u (1 + erf(u / sqrt 2))``, never matched for the tanh form.

How the body writes it does not matter (exporters and importers write these in several
arrangements and with float32 constants): the body with ``u`` as its only input is evaluated by
the reference interpreter on sample points and must agree with the operator's function to
``RTOL`` (float64), and stay finite in float32 wherever the function is. The functions it may
use are the operator's own (sigmoid, tanh or erf) and algebra (``neg``, ``pow``, ``sqrt`` and
``+ - * /``); a body using another (erf for FastGelu, tanh for Gelu) is refused by name, before
anything is evaluated (the search asks for every scope of every state).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.core.rewrite import accesses
from einopt.instantiate.plan import (
    CONTRIB_DOMAIN,
    NO_MATCH_CONTEXT,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
    kept_answer,
    normalize,
)
from einopt.instantiate.views import arranged, simple_view, to_traversal
from einopt.rules.traversal import inline

__all__ = [
    "ACTIVATION_MATCHERS",
    "RTOL",
    "flat_elementwise",
    "match_bias_gelu",
    "match_fast_gelu",
    "match_gelu",
    "match_quick_gelu",
]

RTOL = 1e-6
"""How closely a body must agree with an operator's function: ``|f - g| <= RTOL * (1 + |g|)`` at every
sample point, in float64. The float32 constants exporters write move a GELU by about 1e-7; GELU's
erf and tanh forms differ by up to 5e-4, so neither passes for the other."""

# Where the functions are compared: dense over the range where they bend, then large and tiny
# arguments of both signs (saturation, and the linear part near 0).
SAMPLES = np.concatenate(
    [[1.0], np.linspace(-10.0, 10.0, 201), [0.0, 1e-6, -1e-6, 1e-3, -1e-3, 30.0, -30.0, 1e3, -1e3, 1e4, -1e4]]
)
_ONE = 0  # SAMPLES[_ONE] == 1.0

_ALGEBRA = frozenset({"neg", "pow", "sqrt"})
"""Functions a body may use besides its operator's own (constant folding may leave ``sqrt(2.0)``)."""
_ARITHMETIC = frozenset({"+", "-", "*", "/"})


def _gelu_erf(u: np.ndarray) -> np.ndarray:
    return 0.5 * u * (1.0 + np.vectorize(math.erf, otypes=[float])(u / math.sqrt(2.0)))


def _gelu_tanh(u: np.ndarray) -> np.ndarray:
    return 0.5 * u * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3)))


def _quick_gelu(alpha: float) -> Callable[[np.ndarray], np.ndarray]:
    # u * sigmoid(alpha u), written without exp so that no argument overflows
    return lambda u: 0.5 * u * (1.0 + np.tanh(0.5 * alpha * u))


# --------------------------------------------------------------------------
# The body as a function of one argument
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class _Unary:
    """A body as ``f(u)``: the argument, what ``f`` uses, and ``f`` over :data:`SAMPLES` (evaluated
    by :func:`_values` only for a body that uses its operator's functions alone)."""

    arg: ir.ValueExpr  # an access, or the sum of two accesses
    functions: frozenset[str]
    sampled: ir.Scope  # f at the sample points
    sigmoid_args: tuple[ir.ValueExpr, ...]  # the arguments of its sigmoids, as functions of u
    placeholder: ir.Access


_POINTS = ir.Iter("p", 0, len(SAMPLES))
_U = ir.Tensor("u", (len(SAMPLES),), "float32")


def _argument(body: ir.ValueExpr) -> ir.ValueExpr | Refusal:
    """The one sub-expression every tensor read of ``body`` is in: an access, or a sum of two."""
    reads = list(dict.fromkeys(e for e in ir.walk(body, stop=ir.Access) if isinstance(e, ir.Access)))
    if len(reads) == 1:
        return reads[0]
    if len(reads) == 2:
        sums = [
            e
            for e in ir.walk(body, stop=ir.Access)
            if isinstance(e, ir.Binary) and e.op == "+" and {e.a, e.b} == set(reads)
        ]
        if len(sums) == 1:
            return sums[0]
        if sums:
            return Refusal("reads its two inputs summed in two ways")
    return Refusal(f"reads {len(reads)} inputs: not a function of one input or of an input plus a bias")


def _substitute(e: ir.ValueExpr, old: ir.ValueExpr, new: ir.ValueExpr) -> ir.ValueExpr:
    if e is old:
        return new
    if isinstance(e, ir.Access):
        return e
    return ir.rebuild(e, lambda c: _substitute(c, old, new))


def _as_unary(body: ir.ValueExpr) -> _Unary | Refusal:
    arg = _argument(body)
    if isinstance(arg, Refusal):
        return arg
    u = _U[(_POINTS,)]
    f = _substitute(body, arg, u)
    functions: set[str] = set()
    sigmoids: list[ir.ValueExpr] = []
    for e in ir.walk(f, stop=ir.Access):
        if isinstance(e, ir.Access) and e is not u:
            return Refusal(f"reads {e} apart from its argument {arg}")
        if isinstance(e, ir.Binary) and e.op not in _ARITHMETIC:
            return Refusal(f"uses {e.op}: not one of the functions these operators compute")
        if isinstance(e, ir.Unary):
            functions.add(e.fn)
            if e.fn == "sigmoid":
                sigmoids.append(e.x)
    return _Unary(arg, frozenset(functions), ir.Scope((_POINTS,), (), f), tuple(sigmoids), u)


def _unary(body: ir.ValueExpr) -> _Unary | Refusal:
    """:func:`_as_unary`, memoised on the (interned) body: instantiation asks for every candidate."""
    return ir._cached(body, "contrib_unary", lambda: _as_unary(body))


def _sample(scope: ir.Scope) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(evaluate(scope, {"u": SAMPLES}), dtype=np.float64)
    with np.errstate(all="ignore"):
        low = np.asarray(evaluate(scope, {"u": SAMPLES.astype(np.float32)}, mode="float32"))
    return values, np.isfinite(low)


def _values(fn: _Unary) -> tuple[np.ndarray, np.ndarray]:
    """``f`` on :data:`SAMPLES` (float64), and where it is finite in float32; memoised on the
    (interned) sampled scope."""
    return ir._cached(fn.sampled, "contrib_unary_values", lambda: _sample(fn.sampled))


def _disagreement(fn: _Unary, want: np.ndarray, op_type: str) -> str | None:
    """Why ``fn`` is not the function with values ``want`` (None when it is)."""
    values, finite32 = _values(fn)
    off = np.abs(values - want) / (1.0 + np.abs(want))
    if not np.all(off <= RTOL):
        at = SAMPLES[int(np.argmax(np.where(np.isnan(off), np.inf, off)))]
        return f"computes another function than {op_type} (off by {float(np.nanmax(off)):.2g} at {at:g})"
    bad = ~finite32 & np.isfinite(want)
    if np.any(bad):
        return f"overflows in float32 at {SAMPLES[bad][0]:g}, where {op_type} does not"
    return None


# --------------------------------------------------------------------------
# Operands: X in the traversal's order, the bias over its last dimension
# --------------------------------------------------------------------------


def _operands(
    scope: ir.Scope, arg: ir.ValueExpr, bias_ok: bool
) -> tuple[tuple[Operand, ...], tuple[int, ...], tuple] | Refusal:
    """``(operands, X's shape, post)``: X arranged in traversal order (the dimensions it reads), the
    bias (if ``arg`` is a sum) as a vector over X's last one, and the steps to the traversal."""
    if isinstance(arg, ir.Access):
        x, bias = arg, None
    else:
        if not bias_ok:
            return Refusal("the argument is a sum of two inputs, and this operator takes no bias")
        x, bias = _split_bias(scope, arg)
        if x is None:
            return Refusal("neither term of the sum is a bias over the last dimension the other reads")
    view = simple_view(x)
    if isinstance(view, Refusal):
        return Refusal(f"input: {view.reason}")
    order = [t for t in scope.traversal if t in view.labels]
    if not order:  # ONNX Runtime's kernels refuse a 0-d input at run time
        return Refusal(
            "its input is one value for every output element: the operator needs 1 or more dimensions"
        )
    steps = arranged(view, [(t,) for t in order])
    shape = tuple(t.extent for t in order)
    operands = (Operand(x.source, steps),)
    if bias is not None:
        bview = simple_view(bias)
        if isinstance(bview, Refusal):
            return Refusal(f"bias: {bview.reason}")
        operands += (Operand(bias.source, normalize(bview.steps, tuple(bias.source.shape))),)
    return operands, shape, to_traversal(order, shape, scope.traversal)


def _split_bias(scope: ir.Scope, arg: ir.Binary) -> tuple[ir.Access | None, ir.Access | None]:
    """``(X, bias)`` of ``X + bias``: the bias reads exactly X's last iterator in traversal order."""
    for x, b in ((arg.a, arg.b), (arg.b, arg.a)):
        xv, bv = simple_view(x), simple_view(b)
        if isinstance(xv, Refusal) or isinstance(bv, Refusal):
            continue
        order = [t for t in scope.traversal if t in xv.labels]
        if order and bv.labels == (order[-1],) and order[-1].extent > 1:
            return x, b
    return None, None


def flat_elementwise(scope: ir.Scope, ctx: MatchContext) -> ir.Scope:
    """``scope`` with its reads of nested element-wise scopes inlined (not those of bound or constant
    scopes, which are computed anyway): a GELU whose five nodes a ``fuse_cone`` step nested into its
    last product is one body again.

    Kept per scope with the questions it asked of the context (:func:`~einopt.instantiate.plan.kept_answer`):
    every activation matcher asks it of the same scope, and the search of every candidate."""
    return kept_answer(scope, "flat_elementwise", ctx, lambda c: _flat_elementwise(scope, c))


def _flat_elementwise(scope: ir.Scope, ctx: MatchContext) -> ir.Scope:
    for _ in range(_FLAT_MAX):
        acc = next(
            (
                a
                for a in accesses(scope.body)
                if isinstance(a.source, ir.Scope)
                and not a.source.summation
                and a.source not in ctx.bound
                and a.source not in ctx.constant
            ),
            None,
        )
        if acc is None:
            return scope
        found = inline(scope, acc, "a nested scope")
        if isinstance(found, str):
            return scope
        scope = found
    return scope


_FLAT_MAX = 16
"""Nested scopes inlined at most (GELU's erf form nests four)."""


def _match(
    scope: ir.Scope,
    ctx: MatchContext,
    op_type: str,
    own: str,
    other: str | None,
    bias_ok: bool,
    function: Callable[[_Unary], tuple[np.ndarray, tuple] | Refusal],
) -> OperatorMatch | Refusal:
    """The scope as ``op_type``: a body of ``own`` (not ``other``) over one argument, equal to
    ``function``'s values (which also gives the attributes)."""
    if scope.summation:
        return Refusal("sums over iterators: not an element-wise function")
    scope = flat_elementwise(scope, ctx)
    fn = _unary(scope.body)
    if isinstance(fn, Refusal):
        return fn
    if other is not None and other in fn.functions:
        return Refusal(f"uses {other}: not the {own} form {op_type} computes")
    extra = fn.functions - _ALGEBRA - {own}
    if own not in fn.functions or extra:
        shown = ", ".join(sorted(extra)) or f"no {own}"
        return Refusal(f"uses {shown}: not the function {op_type} computes")
    found = function(fn)
    if isinstance(found, Refusal):
        return found
    want, attrs = found
    why = _disagreement(fn, want, op_type)
    if why is not None:
        return Refusal(why)
    built = _operands(scope, fn.arg, bias_ok)
    if isinstance(built, Refusal):
        return built
    operands, shape, post = built
    op = OpNode(op_type, tuple(range(len(operands))), attrs, CONTRIB_DOMAIN, shape)
    return OperatorMatch(f"{CONTRIB_DOMAIN}.{op_type}", operands, (op,), post)


# --------------------------------------------------------------------------
# The matchers
# --------------------------------------------------------------------------


def _quick_gelu_function(fn: _Unary) -> tuple[np.ndarray, tuple] | Refusal:
    if len(set(fn.sigmoid_args)) != 1:
        return Refusal(f"has {len(set(fn.sigmoid_args))} different sigmoids: QuickGelu has one")
    # alpha is the sigmoid's argument at u = 1 (QuickGelu's is alpha * u: checked with the rest)
    probe = ir.Scope((_POINTS,), (), fn.sigmoid_args[0])
    alpha = float(np.float32(np.asarray(evaluate(probe, {"u": SAMPLES}))[_ONE]))
    if not np.isfinite(alpha):
        return Refusal("its sigmoid's argument is not finite at 1")
    return _quick_gelu(alpha)(SAMPLES), (("alpha", alpha),)


def match_quick_gelu(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``L x: X[..] * sigmoid(alpha * X[..])`` (any arrangement) as com.microsoft ``QuickGelu``."""
    return _match(scope, ctx, "QuickGelu", "sigmoid", None, False, _quick_gelu_function)


def match_fast_gelu(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """GELU's tanh approximation of ``X[..]`` or ``X[..] + bias[last]`` as com.microsoft ``FastGelu``."""
    return _match(scope, ctx, "FastGelu", "tanh", "erf", True, lambda fn: (_gelu_tanh(SAMPLES), ()))


def match_gelu(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """GELU (the erf form) of ``X[..]`` as com.microsoft ``Gelu``."""
    return _match(scope, ctx, "Gelu", "erf", "tanh", False, lambda fn: (_gelu_erf(SAMPLES), ()))


def match_bias_gelu(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """GELU (the erf form) of ``X[..] + bias[last]`` as com.microsoft ``BiasGelu``."""
    fn = _unary(flat_elementwise(scope, ctx).body) if not scope.summation else None
    if isinstance(fn, _Unary) and isinstance(fn.arg, ir.Access):
        return Refusal("no bias: Gelu computes it")
    return _match(scope, ctx, "BiasGelu", "erf", "tanh", True, lambda fn: (_gelu_erf(SAMPLES), ()))


ACTIVATION_MATCHERS: dict[str, Callable[[ir.Scope, MatchContext], OperatorMatch | Refusal]] = {
    "QuickGelu": match_quick_gelu,
    "FastGelu": match_fast_gelu,
    "BiasGelu": match_bias_gelu,
    "Gelu": match_gelu,
}
"""The activation matchers, in the order the table tries them (BiasGelu before Gelu takes the bias)."""
