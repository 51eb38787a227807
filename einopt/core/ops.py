"""The element-wise operations of the IR: one record per operation, from which every other table derives.

``UNARY`` holds the functions a ``Unary`` node applies (``relu(x)``, ``leaky_relu(x, 0.1)``) and
``BINARY`` the operators of a ``Binary`` node (``a + b``, ``max(a, b)``). Each record gives the
operation's forms (numpy for the reference interpreter, TVM for code generation, ONNX for
instantiation and import) and the facts the rest of einopt reads (whether ``f(0) = 0``, whether
finite values stay finite, whether it is exact on integers, its FLOPs, whether an ONNX node of it
ends a linear subprogram). Nothing else in the library keeps a list of them; the places that
derive from here:

* ``einopt.core.ir`` (``UNARY_FUNCS``, ``BINARY_OPS``, ``COMMUTATIVE_OPS``, reserved words),
  hence the text syntax (``einopt.core.parser``, ``einopt.core.syntax``) and canonical keys;
* ``einopt.api`` and ``einopt`` (one constructor per function: ``einopt.relu``, ``einopt.absolute``);
* ``einopt.core.interp`` (numpy forms, the exact integer mode) and ``einopt.codegen.te`` (TVM);
* ``einopt.instantiate`` (ONNX op types and parameter attributes) and
  ``einopt.frontend.importers_elementwise`` (ONNX op type -> operation);
* ``einopt.frontend.partition`` (activations, tails), ``einopt.core.cost`` (FLOPs),
  ``einopt.rules.boundary`` (zero and finiteness analysis);
* the tests: ``tests/test_ops.py`` round-trips every row (syntax, API, interpreter, TVM, ONNX
  Runtime, ONNX import, the facts on sample points); ``tests/strategies.py`` draws every row.

Adding an element-wise function is one ``UnaryOp`` row in ``UNARY`` and nothing else. A row needs
``name`` (a new word of the text syntax), ``onnx`` (a default-domain ONNX op type of the same
meaning), ``numpy`` and ``tvm`` forms, and the three facts ``zero``, ``finite`` and ``exact``
(``tests/test_ops.py`` checks them numerically, so a wrong one fails there). A function with one
constant float parameter also gives ``param`` (its name in the Python API), ``onnx_param`` (the
ONNX attribute), ``param_default`` (the attribute's ONNX default) and ``sample_params``; when the
ONNX operator takes the parameter as its second input instead (Pow's exponent), ``param_input``
says so, ``onnx_param`` names that input and ``param_default`` is None (the instantiation writes
the parameter as a one-element initializer). The rest has defaults: ``flops`` (4 for a
transcendental function), ``activation`` (False only for a linear function such as ``neg``),
``tail``, ``api`` (when the Python name must differ, as ``absolute`` for ``abs``) and
``sample_range`` (where the function is finite and moderate, for random tests).

ONNX operators that are compositions of these (HardSigmoid, HardSwish, Gelu, Reciprocal, Pow with
the exponents 2, 3, 1/2 and -1) are no rows: ``einopt.frontend.importers_elementwise`` imports them
as the expression ONNX Runtime computes, and ``einopt.instantiate.match_elementwise.PATTERNS``
recognises that expression to write the one operator back (when the opset has it: Gelu needs 20).

TVM is imported lazily (``import einopt`` must not load it, nor numpy): a form receives the
namespace it computes with, ``numpy`` or ``tvm.tirx``, as its first argument.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["UnaryOp", "BinaryOp", "UNARY", "BINARY", "ZERO_RULES", "TVM_DTYPE", "tvm_opaque"]

# How a binary operator's result is 0 (the zero analysis of einopt.rules.boundary):
# "both": where both operands are 0; "either": where one is and the other is finite
# (0 * inf is NaN); "never": not provably (0 / 0 is NaN).
ZERO_RULES: tuple[str, ...] = ("both", "either", "never")

TVM_DTYPE = "float32"
"""The dtype of TVM code (``einopt.codegen.te`` generates float32); constants in TVM forms have it."""


def _tvm_const(t: Any, v: float) -> Any:
    return t.const(v, TVM_DTYPE)


# Transcendental functions in plain arithmetic, so that a kernel's loop vectorises: TVM writes
# ``exp`` as LLVM's intrinsic, which this CPU runs as a scalar call of libm's expf (4.5 ns per
# sigmoid on 2 threads; ONNX Runtime's vectorised Sigmoid is about ten times faster).

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375  # ln 2 split so that n * _LN2_HI is exact for |n| <= 2^9
_LN2_LO = -2.12194440054690583e-4
_EXP_MAX = 88.72283  # exp overflows float32 beyond it
_ERF_ONE = 4.0  # erf(x) rounds to 1 in float32 from about 3.92 on
_EXP_MIN = -87.33654  # and is below the smallest normal float32 beyond this
_TANH_ONE = 9.0  # beyond it, tanh is 1 in float32


def tvm_opaque(t: Any, x: Any, side: int) -> Any:
    """``x`` behind a bit-cast round trip that TVM's simplifier does not see through and LLVM removes.

    TVM's simplifier rewrites float arithmetic as if it were exact: ``x - x`` and ``0 * x`` become 0,
    ``(x + y) - x`` becomes ``y``, so an inf or NaN ``x`` (or a cancelling sum) reads differently
    from numpy and ONNX Runtime. The two operands of a binary take different ``side``s (0 and 1:
    through int32 and uint32), so that equal operands stay different expressions to the simplifier.
    """
    return t.reinterpret(TVM_DTYPE, t.reinterpret(("int32", "uint32")[side], x))


def _tvm_nan_first(t: Any, y: Any, *args: Any) -> Any:
    """``y``, or the first NaN among ``args``: TVM's ``max`` and ``min`` return the other operand of a
    NaN (LLVM's ``maxnum``), numpy's and ONNX Runtime's return NaN (``Relu``, ``Max``, ``Clip``)."""
    for a in reversed(args):
        y = t.Select(t.isnan(a), a, y)
    return y


def _tvm_clamp(t: Any, x: Any, lo: float, hi: float) -> Any:
    """``x`` clamped to ``[lo, hi]`` (a NaN becomes a bound: callers restore it with :func:`_tvm_nan_first`)."""
    return t.max(t.min(x, _tvm_const(t, hi)), _tvm_const(t, lo))


def _tvm_exp(t: Any, x: Any) -> Any:
    """``exp(x) = 2^n e^r`` with ``n = round(x / ln 2)``, ``|r| <= ln(2)/2`` and ``e^r`` by its Taylor
    polynomial of degree 7 (truncation below 5e-9 relative); ``2^n`` is built in the exponent bits.
    Overflow gives inf, underflow 0, NaN stays NaN."""
    c = lambda v: _tvm_const(t, v)  # noqa: E731 - a local shorthand
    clamped = _tvm_clamp(t, x, _EXP_MIN, _EXP_MAX)
    n = t.floor(clamped * c(_LOG2E) + c(0.5))
    r = clamped - n * c(_LN2_HI) - n * c(_LN2_LO)
    p = c(1.0 / 5040)
    for k in (720, 120, 24, 6, 2, 1, 1):
        p = p * r + c(1.0 / k)
    bits = t.shift_left(t.Cast("int32", n) + t.const(127, "int32"), t.const(23, "int32"))
    y = p * t.reinterpret(TVM_DTYPE, bits)
    y = t.Select(x > c(_EXP_MAX), c(math.inf), t.Select(x < c(_EXP_MIN), c(0.0), y))
    return _tvm_nan_first(t, y, x)


# erf and tanh as odd rational functions ``x P(x^2) / Q(x^2)`` on a clamped argument: one branch,
# no exp, no table, about 15 multiply-adds and a division per element (the form through exp and a
# Taylor branch took about 70 operations, and made a GELU kernel half as fast as ONNX Runtime's).
# Fitted for einopt by ``scripts/fit_activations.py`` (iteratively reweighted least squares with
# Lawson's minimax weights, on 6000 points of [0, clamp]): the float64 fits are within 1.5e-9
# (erf) and 1.8e-8 (tanh) of the functions; evaluated in float32 they are within 4e-7 absolute
# and relative (a few ulps). Q has no root at t = x^2 >= 0. ``tests/test_codegen.py`` checks
# both against ``math`` and against the script.
_ERF_P = (
    1.1283791821076974,
    0.18471036843120878,
    0.05433261286387638,
    0.0038395316266383525,
    0.00038269286627582637,
    4.7805558973375604e-06,
    -1.3666868949856337e-08,
)
_ERF_Q = (
    1.0,
    0.49702884742525044,
    0.113826328691234,
    0.015453523200387185,
    0.0013095803935910604,
    6.40094257246125e-05,
)
_TANH_P = (
    0.9999999063488515,
    0.13373197892117736,
    0.003486582090565147,
    2.047183254201724e-05,
    1.3184224469268349e-08,
)
_TANH_Q = (
    1.0,
    0.4670649475750234,
    0.025841980030110585,
    0.00032713856552974433,
    7.702664186084947e-07,
)


def _tvm_odd_rational(t: Any, x: Any, bound: float, p: tuple[float, ...], q: tuple[float, ...]) -> Any:
    """``z P(z^2) / Q(z^2)`` with ``z = x`` clamped to ``[-bound, bound]`` (Horner's rule); NaN kept."""
    c = lambda v: _tvm_const(t, v)  # noqa: E731 - a local shorthand
    z = _tvm_clamp(t, x, -bound, bound)
    z2 = z * z
    num = c(p[-1])
    for k in reversed(p[:-1]):
        num = num * z2 + c(k)
    den = c(q[-1])
    for k in reversed(q[:-1]):
        den = den * z2 + c(k)
    return _tvm_nan_first(t, z * num / den, x)


def _tvm_tanh(t: Any, x: Any) -> Any:
    """tanh by :data:`_TANH_P` / :data:`_TANH_Q` on ``[-9, 9]`` (it is +-1 in float32 beyond)."""
    return _tvm_odd_rational(t, x, _TANH_ONE, _TANH_P, _TANH_Q)


def _tvm_erf(t: Any, x: Any) -> Any:
    """erf by :data:`_ERF_P` / :data:`_ERF_Q` on ``[-4, 4]`` (it is +-1 in float32 beyond): plain
    arithmetic, so that a kernel's loop vectorises (TVM's erf calls libm's scalar ``erff``)."""
    return _tvm_odd_rational(t, x, _ERF_ONE, _ERF_P, _ERF_Q)


def _tvm_sigmoid(t: Any, x: Any) -> Any:
    return _tvm_const(t, 1.0) / (_tvm_const(t, 1.0) + _tvm_exp(t, -x))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UnaryOp:
    """An element-wise function ``f(x)`` or ``f(x, p)`` with a constant float parameter ``p``.

    Attributes
    ----------
    name : str
        Its name in the IR and the text syntax (``relu(x)``, ``leaky_relu(x, 0.1)``).
    onnx : str
        The default-domain ONNX operator computing it.
    numpy : callable
        ``numpy(np, x, p)``: the reference form on an array ``x`` (``p`` is None without a
        parameter). Constants are made with ``x.dtype.type`` so that float32 stays float32.
    tvm : callable
        ``tvm(tirx, x, p)``: the TVM form on a ``tvm.tirx`` expression (float32).
    zero : bool
        ``f(0) = 0`` (for every parameter): a read of a zero region stays zero.
    finite : bool or callable
        Finite arguments give finite results; a callable decides per parameter value.
    exact : bool
        Exact on integers: the interpreter's integer mode evaluates it (with an integral
        parameter), otherwise it refuses it.
    flops : int
        FLOPs per element in the analytic cost (4 for a transcendental function).
    activation : bool
        Non-linear: an ONNX node of it is a subprogram of its own (``frontend.partition``),
        unless a target operator absorbs it with the linear work around it
        (``frontend.partition.ABSORBED``: Erf and Pow, for Gelu).
    tail : bool
        A maximum of linear functions with constant slopes that joins the subprogram of the
        linear node it reads (``frontend.partition.TAILS``).
    api : str
        Its name in the Python API (``einopt.<api>``); defaults to ``name``.
    param : str or None
        The parameter's name in the Python API (``slope``), None without a parameter.
    onnx_param : str or None
        The ONNX attribute carrying the parameter (``alpha``), or with ``param_input`` the name of
        the ONNX operator's input carrying it (``Y``).
    param_default : float or None
        The ONNX attribute's default (None with ``param_input``: an input has none).
    param_input : bool
        The ONNX operator takes the parameter as its second input, not as an attribute (Pow's
        exponent): the instantiation writes it as a one-element float32 initializer.
    sample_params : tuple of float
        Parameter values random tests use.
    sample_range : (float, float)
        Arguments on which the function is finite and moderate in float32; random tests feed it
        only these (sqrt: ``[0, inf)``; exp: up to 8, so that sums of its values stay exact enough).
    """

    name: str
    onnx: str
    numpy: Callable[..., Any]
    tvm: Callable[..., Any]
    zero: bool
    finite: bool | Callable[[float], bool]
    exact: bool
    flops: int = 1
    activation: bool = True
    tail: bool = False
    api: str = ""
    param: str | None = None
    onnx_param: str | None = None
    param_default: float | None = None
    param_input: bool = False
    sample_params: tuple[float, ...] = ()
    sample_range: tuple[float, float] = (-math.inf, math.inf)

    def __post_init__(self) -> None:
        _check_words(self.name, self.onnx, self.api or self.name)
        given = (self.param, self.onnx_param, self.sample_params or None)
        if any(v is None for v in given) and any(v is not None for v in given):
            raise ValueError(
                f"unary op {self.name}: a parameter needs param, onnx_param and sample_params "
                "together (or none of them)"
            )
        if self.param is None and (self.param_default is not None or self.param_input):
            raise ValueError(f"unary op {self.name}: param_default and param_input need a parameter")
        if self.param is not None and (self.param_default is None) != self.param_input:
            raise ValueError(
                f"unary op {self.name}: a parameter given as an ONNX attribute needs its "
                "param_default, one given as an input (param_input) has none"
            )
        if callable(self.finite) and self.param is None:
            raise ValueError(f"unary op {self.name}: finite can depend only on a parameter it has")
        lo, hi = self.sample_range
        if not lo < hi:
            raise ValueError(f"unary op {self.name}: empty sample_range {self.sample_range}")
        if not self.api:
            object.__setattr__(self, "api", self.name)

    def keeps_finite(self, param: float | None) -> bool:
        """Whether finite arguments give finite results with parameter ``param``."""
        return self.finite(param) if callable(self.finite) else self.finite


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BinaryOp:
    """An element-wise binary operator ``a op b`` (infix) or ``op(a, b)`` (a call).

    Attributes
    ----------
    name : str
        Its name in the IR; the text syntax writes it infix (``+ - * /``, the grammar's own
        arithmetic) or, for a word, as a call ``max(a, b)``.
    title : str
        The operation in words, for messages (``division``).
    onnx : str
        The default-domain ONNX operator computing it on two inputs.
    numpy : callable
        ``numpy(np, a, b)``: the reference form on arrays.
    tvm : callable
        ``tvm(tirx, a, b)``: the TVM form.
    commutative : bool
        Commutative and associative (up to rounding): canonical keys flatten and sort chains of
        it, and matching tries both operand orders.
    zero : str
        One of :data:`ZERO_RULES`: where the result is provably 0.
    finite : bool
        Finite operands give a finite result (no overflow, no division by zero).
    exact : bool
        Exact on integers (the interpreter's integer mode).
    activation : bool
        Non-linear: an ONNX node of it is a subprogram of its own (``frontend.partition``).
    onnx_variadic : str or None
        The ONNX operator that folds any number of inputs with it (``Sum`` for ``+``), imported.
    api : str or None
        The Python API's constructor (``einopt.maximum``) for a call-syntax operator; infix
        operators are built with Python's operators.
    flops : int
        FLOPs per element in the analytic cost.
    """

    name: str
    title: str
    onnx: str
    numpy: Callable[..., Any]
    tvm: Callable[..., Any]
    commutative: bool
    zero: str
    finite: bool
    exact: bool
    activation: bool = False
    onnx_variadic: str | None = None
    api: str | None = None
    flops: int = 1

    def __post_init__(self) -> None:
        if self.zero not in ZERO_RULES:
            raise ValueError(f"binary op {self.name}: zero must be one of {ZERO_RULES}, got {self.zero!r}")
        if self.infix == (self.api is not None):
            raise ValueError(f"binary op {self.name}: a word operator needs an api name, a symbol none")
        _check_words(self.onnx, *(w for w in (self.api, self.onnx_variadic) if w is not None))

    @property
    def infix(self) -> bool:
        """Written between its operands (a symbol), not as a call (a word)."""
        return not self.name.isidentifier()


def _erf(np: Any, x: Any, p: None) -> Any:
    """erf in numpy (which has none): ``math.erf`` (float64, within an ulp) per element, rounded
    once to ``x``'s dtype. Slow (a Python call per element), but the interpreter is the
    specification: ONNX Runtime's Erf is within one float32 ulp of this."""
    wide = np.frompyfunc(math.erf, 1, 1)(np.asarray(x, dtype=np.float64))
    return np.asarray(wide, dtype=np.float64).astype(x.dtype)


def _power(np: Any, x: Any, p: float) -> Any:
    """``x ** p`` computed in float64 and rounded once to ``x``'s dtype: what ONNX Runtime computes
    for an integer or float64 exponent (``std::pow`` in double), and within an ulp of its float32
    ``powf``; numpy's own float32 power is several ulps off."""
    return np.power(np.asarray(x, dtype=np.float64), float(p)).astype(x.dtype)


def _check_words(*words: str) -> None:
    for w in words:
        if not isinstance(w, str) or not w.isidentifier():
            raise ValueError(f"element-wise op: {w!r} is not an identifier")


def _table(rows: Iterable[UnaryOp] | Iterable[BinaryOp]) -> dict[str, Any]:
    """Rows by name; two rows may not share a name, an ONNX op type or an API name."""
    out: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for row in rows:
        for key in (row.name, row.onnx, row.api):
            if key and seen.setdefault(key, row.name) != row.name:
                raise ValueError(f"element-wise ops {seen[key]} and {row.name} both use {key!r}")
        out[row.name] = row
    return out


UNARY: dict[str, UnaryOp] = _table(
    [
        UnaryOp(
            name="neg",
            onnx="Neg",
            numpy=lambda np, x, p: np.negative(x),
            tvm=lambda t, x, p: -x,
            zero=True,
            finite=True,
            exact=True,
            activation=False,  # linear: joins the linear subprograms
        ),
        UnaryOp(
            name="relu",
            onnx="Relu",
            numpy=lambda np, x, p: np.maximum(x, x.dtype.type(0)),
            tvm=lambda t, x, p: _tvm_nan_first(t, t.max(x, _tvm_const(t, 0.0)), x),
            zero=True,
            finite=True,
            exact=True,
        ),
        UnaryOp(
            name="sigmoid",
            onnx="Sigmoid",
            numpy=lambda np, x, p: x.dtype.type(1) / (x.dtype.type(1) + np.exp(-x)),
            tvm=lambda t, x, p: _tvm_sigmoid(t, x),
            zero=False,  # sigmoid(0) = 1/2
            finite=True,
            exact=False,
            flops=4,
        ),
        UnaryOp(
            name="tanh",
            onnx="Tanh",
            numpy=lambda np, x, p: np.tanh(x),
            tvm=lambda t, x, p: _tvm_tanh(t, x),
            zero=True,
            finite=True,
            exact=False,
            flops=4,
        ),
        UnaryOp(
            name="exp",
            onnx="Exp",
            numpy=lambda np, x, p: np.exp(x),
            tvm=lambda t, x, p: _tvm_exp(t, x),
            zero=False,  # exp(0) = 1
            finite=False,  # overflows
            exact=False,
            flops=4,
            sample_range=(-math.inf, 8.0),
        ),
        UnaryOp(
            name="abs",
            onnx="Abs",
            numpy=lambda np, x, p: np.abs(x),
            tvm=lambda t, x, p: t.abs(x),
            zero=True,
            finite=True,
            exact=True,
            api="absolute",  # not Python's abs
        ),
        UnaryOp(
            name="sqrt",
            onnx="Sqrt",
            numpy=lambda np, x, p: np.sqrt(x),
            tvm=lambda t, x, p: t.sqrt(x),
            zero=True,
            finite=False,  # sqrt(-1) is NaN
            exact=False,
            sample_range=(0.0, math.inf),
        ),
        UnaryOp(
            name="leaky_relu",
            onnx="LeakyRelu",
            numpy=lambda np, x, p: np.where(x > 0, x, x.dtype.type(p) * x),
            # x if x > 0 else slope * x; both sides are pure, so a Select is safe.
            tvm=lambda t, x, p: t.Select(x > _tvm_const(t, 0.0), x, x * tvm_opaque(t, _tvm_const(t, p), 1)),
            zero=True,
            finite=lambda slope: abs(slope) <= 1.0,  # a steeper slope can overflow
            exact=True,
            tail=True,
            param="slope",
            onnx_param="alpha",
            param_default=0.01,
            sample_params=(0.01, 0.1, 0.2, 0.5),
        ),
        UnaryOp(
            name="erf",
            onnx="Erf",
            numpy=_erf,
            tvm=lambda t, x, p: _tvm_erf(t, x),
            zero=True,  # erf(0) = 0
            finite=True,  # |erf(x)| <= 1
            exact=False,
            flops=4,
        ),
        UnaryOp(
            name="pow",
            onnx="Pow",
            numpy=_power,
            tvm=lambda t, x, p: t.pow(x, _tvm_const(t, p)),
            zero=False,  # 0 ** p is 0 only for p > 0 (inf for p < 0, 1 for p = 0)
            # x ** 0 = 1 and x ** 1 = x; any other exponent overflows (p > 1), divides by 0 (p < 0)
            # or takes a fractional power of a negative number (NaN).
            finite=lambda exponent: exponent in (0.0, 1.0),
            exact=False,
            flops=4,
            api="power",  # not Python's pow
            param="exponent",
            onnx_param="Y",
            param_input=True,
            # Exponents the importer keeps as pow: 2, 3, 1/2, -1 and 1 become x*x, x*x*x,
            # sqrt(x), 1/x and x.
            sample_params=(1.5, -0.5, 2.5, 4.0),
            sample_range=(0.25, 8.0),
        ),
    ]
)
"""The element-wise functions, by IR name."""

BINARY: dict[str, BinaryOp] = _table(
    [
        BinaryOp(
            name="+",
            title="addition",
            onnx="Add",
            numpy=lambda np, a, b: np.add(a, b),
            tvm=lambda t, a, b: a + b,
            commutative=True,
            zero="both",
            finite=False,
            exact=True,
            onnx_variadic="Sum",
        ),
        BinaryOp(
            name="-",
            title="subtraction",
            onnx="Sub",
            numpy=lambda np, a, b: np.subtract(a, b),
            tvm=lambda t, a, b: a - b,
            commutative=False,
            zero="both",
            finite=False,
            exact=True,
        ),
        BinaryOp(
            name="*",
            title="multiplication",
            onnx="Mul",
            numpy=lambda np, a, b: np.multiply(a, b),
            tvm=lambda t, a, b: a * b,
            commutative=True,
            zero="either",
            finite=False,
            exact=True,
        ),
        BinaryOp(
            name="/",
            title="division",
            onnx="Div",
            numpy=lambda np, a, b: np.true_divide(a, b),
            tvm=lambda t, a, b: a / b,
            commutative=False,
            zero="never",
            finite=False,
            exact=False,
        ),
        BinaryOp(
            name="max",
            title="maximum",
            onnx="Max",
            numpy=lambda np, a, b: np.maximum(a, b),
            tvm=lambda t, a, b: _tvm_nan_first(t, t.max(a, b), a, b),
            commutative=True,
            zero="both",
            finite=True,
            exact=True,
            activation=True,
            onnx_variadic="Max",
            api="maximum",
        ),
        BinaryOp(
            name="min",
            title="minimum",
            onnx="Min",
            numpy=lambda np, a, b: np.minimum(a, b),
            tvm=lambda t, a, b: _tvm_nan_first(t, t.min(a, b), a, b),
            commutative=True,
            zero="both",
            finite=True,
            exact=True,
            activation=True,
            onnx_variadic="Min",
            api="minimum",
        ),
    ]
)
"""The element-wise binary operators, by IR name."""
