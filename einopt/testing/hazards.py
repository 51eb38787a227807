"""Which infinities and NaN a generated graph's values may hold beyond those of its inputs.

A builder in ``einopt.testing.graphs`` keeps special input values away from an
operator whose ONNX Runtime kernel treats them otherwise than the IR
(``exclude``: MaxPool lets a NaN through only as a window's first value,
ReduceMax likewise, and so on). The graph can still compute such a value
from ordinary data: ``Sqrt`` of a negative number is NaN, ``Reciprocal`` of
an exact 0 (integer data) is inf, ``3e38 + 3e38`` overflows. So every value
carries its :class:`Risks`: the special input classes under which it may
hold a computed infinity or NaN, or :data:`ANY_DATA` when ordinary data
suffices. A builder excludes the classes of its operand's risks too, and
refuses an operand at risk on any data (seed 0 graph 268 of
``scripts/fuzz.py``: ``Reciprocal`` of a negative constant, ``Sqrt``, then
a MaxPool whose window held ``[5.12, NaN]``: 5.12 in ONNX Runtime, NaN in
the IR).

The tables below classify every op the builders build, erring towards risk
(an op left out of a safe set is assumed to make anything). One known
approximation: ordinary data (``|x| <= 3``, weights below 2) is taken not to
overflow in products and sums alone; a chain of eight self-multiplications
could, but the ops that overflow on small operands (``Exp``, ``Pow``, and
division by 0) are at risk on any data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

__all__ = ["ANY_DATA", "FINITE", "INPUT", "Risks", "computed"]

ANY_DATA = "any data"
"""A risk class of its own: ordinary or integer data suffices (no special input value is needed)."""


@dataclasses.dataclass(frozen=True)
class Risks:
    """The classes of special input values (``graphs.SPECIAL_VALUES`` keys, or
    :data:`ANY_DATA`) under which a value may hold an infinity (``inf``) or a NaN (``nan``)."""

    inf: frozenset[str] = frozenset()
    nan: frozenset[str] = frozenset()


FINITE = Risks()
"""A constant's risks: the builders' constants are finite (``Clip``'s infinite bounds are not data)."""

INPUT = Risks(frozenset({"inf"}), frozenset({"nan"}))
"""A graph input's risks: its own infinities and NaN, when the graph allows those classes."""

# Ops whose every output element is an operand element (or a constant 0 of padding).
_MOVES = frozenset(
    {
        "Cast",
        "Concat",
        "DepthToSpace",
        "Expand",
        "Flatten",
        "Gather",
        "GatherElements",
        "Identity",
        "Pad",
        "Reshape",
        "Slice",
        "SpaceToDepth",
        "Split",
        "Squeeze",
        "Transpose",
        "Unsqueeze",
    }
)
# Monotone or selecting ops: a value no larger than an operand's.
_SELECTS = frozenset({"Abs", "Clip", "Max", "MaxPool", "Min", "Neg", "ReduceMax", "Relu"})
# Ops whose output is finite whatever their operands' infinities (NaN aside).
_BOUNDED = frozenset({"Erf", "HardSigmoid", "Sigmoid", "Softmax", "Tanh"})

NAN_SAFE = _MOVES | _SELECTS | (_BOUNDED - {"Softmax"}) | {"Exp", "LeakyRelu", "Reciprocal"}
"""Ops that never make a NaN from operands without one, infinities included: each element is a
selection, or a function defined at +-inf (``exp(-inf) = 0``, ``1/inf = 0``; HardSigmoid's and
LeakyRelu's slopes are never 0). Every other op may (``inf - inf``, ``0 * inf``, a Softmax or a
normalisation of a row holding inf, Gelu and HardSwish at ``-inf``: ``-inf * 0``)."""

NO_OVERFLOW = _MOVES | _SELECTS | _BOUNDED | {"Sqrt", "Where"}
"""Ops whose finite operands give a finite output. Every other op may overflow on huge operands
(``3e38 + 3e38``, ``1.5 * 3e38`` in LeakyRelu)."""

INF_ON_ANY_DATA = frozenset({"Div", "Exp", "Pow", "Reciprocal"})
"""Ops that may give an infinity on ordinary or integer data: a division by an exact 0 (integer data
has zeros; a negative power is one), or growth fast enough to overflow along a short chain."""

NAN_ON_ANY_DATA = frozenset({"Div", "Sqrt"})
"""Ops that may give a NaN on ordinary or integer data: ``0 / 0``, the square root of a negative
number (and Pow with a fractional exponent: its builder says so, see :func:`computed`)."""

SIGNED_SUMS = frozenset(
    {
        "AveragePool",
        "Conv",
        "ConvTranspose",
        "Einsum",
        "Gemm",
        "GlobalAveragePool",
        "LayerNormalization",
        "MatMul",
        "ReduceMean",
        "ReduceSum",
    }
)
"""Ops that add up many terms of either sign: two partial sums (or products) that overflow to
``+inf`` and ``-inf`` give a NaN, so an overflow inside the node risks a NaN too. A sum of two
finite values (Add) overflows once, to one infinity."""


def computed(op: str, operands: Iterable[Risks], nan_on_any_data: bool = False) -> Risks:
    """The risks of the outputs of an ``op`` node reading values with risks ``operands``.

    ``nan_on_any_data``: this node gives a NaN on ordinary data although ``op`` in general does
    not (Pow with a fractional exponent).
    """
    read = Risks()
    for r in operands:
        read = Risks(read.inf | r.inf, read.nan | r.nan)
    made = frozenset({ANY_DATA} if op in INF_ON_ANY_DATA else ()) | frozenset(
        () if op in NO_OVERFLOW else {"huge"}
    )
    nan = read.nan
    if op not in NAN_SAFE:
        nan |= read.inf  # inf - inf, 0 * inf
    if op in SIGNED_SUMS:
        nan |= made
    if op in NAN_ON_ANY_DATA or nan_on_any_data:
        nan |= {ANY_DATA}
    return Risks(frozenset() if op in _BOUNDED else read.inf | made, nan)
