"""The paper's derivations, reproduced by applying named rules in sequence.

Each entry of :data:`DERIVATIONS` is a start program (text syntax), the steps
that derive it (rule names, and which match to take) and seeded values for
its weights: in the paper's setting weights are constants, and the zero
analysis needs them to be known finite (``0 * W`` is 0 only for a finite
``W``). Activations are never constants; a derivation that needs one to be
finite says so in ``assumed_finite``. ``einopt derive --paper NAME`` prints the
checked trace; ``tests/test_derivations.py`` checks every step numerically
and instantiates the result; ``scripts/derivations.py`` writes all traces to
``docs/derivations.md``. Shapes are small so that every step can be checked
with the reference interpreter in well under a second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from einopt.core import ir
from einopt.core.parser import parse
from einopt.rules.base import Context
from einopt.rules.derive import Apply, Trace, derive

__all__ = ["PaperDerivation", "DERIVATIONS"]


@dataclasses.dataclass(frozen=True)
class PaperDerivation:
    """A derivation of the paper: start program, named steps, constant values."""

    name: str
    title: str
    text: str
    steps: tuple[Apply, ...]
    weights: tuple[str, ...] = ()  # inputs that are model weights (known when instantiating)
    constants: Callable[[], dict[str, np.ndarray]] | None = None  # values constant-aware rules rely on
    assumed_finite: tuple[str, ...] = ()  # activations the derivation assumes finite (see Context)

    def program(self) -> ir.Program:
        node = parse(self.text)
        if isinstance(node, ir.Scope):
            return ir.Program(tuple(ir.input_tensors(node)), (("Y", node),), ("Y",))
        return node

    def values(self) -> dict[str, np.ndarray]:
        """The constants: ``constants()`` when given, and seeded weights for the other weights."""
        given = self.constants() if self.constants else {}
        shapes = {t.name: t.shape for t in self.program().inputs}
        return {**_seeded(shapes, [w for w in self.weights if w not in given]), **given}

    def context(self) -> Context:
        return Context(self.values(), assumed_finite=frozenset(self.assumed_finite))

    def run(self, verify: bool = True) -> Trace:
        """Apply the steps, checking each against the program before it (see :func:`derive`)."""
        return derive(self.program(), self.steps, self.context(), verify=verify)


# Seeded weights are nonzero integers (finite, and exact in the interpreter's integer mode, so
# every step is still checked in both modes).
_WEIGHT_VALUES = np.array([-4.0, -3.0, -2.0, -1.0, 1.0, 2.0, 3.0, 4.0])


def _seeded(shapes: dict[str, tuple[int, ...]], names: list[str]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.choice(_WEIGHT_VALUES, shapes[n]) for n in sorted(names)}


def _s(rule: str, choose: str | None = None, at: str | None = None) -> Apply:
    return Apply(rule, at, choose)


_CONV3X3 = "L[h:6, w:5, f:4] Sum[r:3, s:3, c:3] A[h+r-1, w+s-1, c] * K[r, s, f, c] where A: [6, 5, 3], K: [3, 3, 4, 3]"

_CONV_TRANSPOSE = """\
U = L[n:1, c:3, i0:3, p0:1, i1:3, p1:1] X[n, c, i0, i1]
Y = L[n:1, f:2, h:6, w:6] Sum[c:3, kh:4, kw:4] U[n, c, (h+2-kh)//2, (h+2-kh)%2, (w+2-kw)//2, (w+2-kw)%2] * W[c, f, kh, kw]
return Y
where X: [1, 3, 3, 3], W: [3, 2, 4, 4]"""


def _fsrcnn_constants(equal: bool) -> Callable[[], dict[str, np.ndarray]]:
    def make() -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        slopes = np.full((4, 1, 1), 0.25) if equal else rng.uniform(0.0, 1.0, (4, 1, 1))
        return {"W": rng.standard_normal((4, 3, 1, 1)), "A": slopes}

    return make


_FSRCNN = """\
Y = L[n:1, f:4, h:5, w:5] Sum[c:3] X[n, c, h, w] * W[f, c, 0, 0]
Z = L[n:1, f:4, h:5, w:5] max(Y[n, f, h, w], 0) + A[f, 0, 0] * min(Y[n, f, h, w], 0)
return Z
where X: [1, 3, 5, 5], W: [4, 3, 1, 1], A: [4, 1, 1]"""


def _phase_steps(part: str) -> tuple[Apply, ...]:
    """Turn one residue part of a stride-2 ConvTranspose into a stride-1 2x2 convolution."""
    return (
        _s("substitute_variables", "split Sum kh by 2 into q, r", at=part),
        _s("substitute_variables", "split Sum kw by 2 into q1, r1", at=part),
        _s("tighten_boundary", "Sum over r becomes", at=part),
        _s("tighten_boundary", "Sum over r1 becomes", at=part),
        _s("fuse_expressions", "inline U", at=part),
    )


_LSTM_GATES = """\
mx_i = L[m:2, n:4] Sum[k:4] x[m, k] * Wx_i[k, n]
mh_i = L[m:2, n:4] Sum[k:4] h[m, k] * Wh_i[k, n]
pre_i = L[i0:2, i1:4] mx_i[i0, i1] + mh_i[i0, i1]
mx_f = L[m:2, n:4] Sum[k:4] x[m, k] * Wx_f[k, n]
mh_f = L[m:2, n:4] Sum[k:4] h[m, k] * Wh_f[k, n]
pre_f = L[i0:2, i1:4] mx_f[i0, i1] + mh_f[i0, i1]
mx_g = L[m:2, n:4] Sum[k:4] x[m, k] * Wx_g[k, n]
mh_g = L[m:2, n:4] Sum[k:4] h[m, k] * Wh_g[k, n]
pre_g = L[i0:2, i1:4] mx_g[i0, i1] + mh_g[i0, i1]
mx_o = L[m:2, n:4] Sum[k:4] x[m, k] * Wx_o[k, n]
mh_o = L[m:2, n:4] Sum[k:4] h[m, k] * Wh_o[k, n]
pre_o = L[i0:2, i1:4] mx_o[i0, i1] + mh_o[i0, i1]
return pre_i, pre_f, pre_g, pre_o
where x: [2, 4], h: [2, 4], Wx_i: [4, 4], Wh_i: [4, 4], Wx_f: [4, 4], Wh_f: [4, 4], Wx_g: [4, 4], Wh_g: [4, 4], \
Wx_o: [4, 4], Wh_o: [4, 4]"""

# GCN's global convolution block (Fig. 15): a k x 1 and a 1 x k convolution of one input, summed.
_GCN = """\
Y1 = L[n:1, f:2, h:6, w:6] Sum[c:4, r:3] X[n, c, h+r-1, w] * W1[f, c, r, 0]
Y2 = L[n:1, f:2, h:6, w:6] Sum[c:4, s:3] X[n, c, h, w+s-1] * W2[f, c, 0, s]
Z = L[n:1, f:2, h:6, w:6] Y1[n, f, h, w] + Y2[n, f, h, w]
return Z
where X: [1, 4, 6, 6], W1: [2, 4, 3, 1], W2: [2, 4, 1, 3]"""


def _merge(at: str, way: str) -> Apply:
    return _s("merge_expressions", way, at=at)


_LIST = [
    PaperDerivation(
        "fig5",
        "Fig. 5: Conv3x3 -> a matmul-shaped scope plus an OffsetReduce",
        _CONV3X3,
        (
            _s("split_summation", "Sum[r, s] outside, Sum[c] inside"),
            _s("substitute_variables", "fuse h+r-1 into t (replaces h)"),
            _s("substitute_variables", "fuse w+s-1 into t1 (replaces w)"),
            _s("merge_traversal", at="Y"),
            _s("merge_traversal", at="Y"),
            _s("tighten_boundary", "tighten t from"),
            _s("tighten_boundary", "tighten t1 from"),
        ),
        weights=("K",),
    ),
    PaperDerivation(
        "fig6",
        "Fig. 6: Conv5x5 -> (relax) Conv6x6 -> Conv3x3 with 4x the output channels plus an OffsetReduce "
        "(assumes the input A is finite)",
        "L[h:8, w:8, f:2] Sum[r:5, s:5, c:3] A[h+r-2, w+s-2, c] * K[f, c, r, s] where A: [8, 8, 3], K: [2, 3, 5, 5]",
        (
            _s("relax_boundary", "relax r from [0, 5) to [0, 6)"),
            _s("relax_boundary", "relax s from [0, 5) to [0, 6)"),
            _s("substitute_variables", "split Sum r by 3"),
            _s("substitute_variables", "split Sum s by 3"),
            _s("split_summation", "Sum[q, q1] outside, Sum[r1, r, c] inside"),
            _s("substitute_variables", "fuse h+3*q-2"),
            _s("substitute_variables", "fuse w+3*q1-2"),
            _s("merge_traversal", at="Y"),
            _s("merge_traversal", at="Y"),
            _s("materialize_access", "materialize K"),
        ),
        weights=("K",),
        # The relaxed taps read K out of range (0) and multiply A: 0 * A is 0 only for a finite A.
        assumed_finite=("A",),
    ),
    PaperDerivation(
        "convtranspose_matmul",
        "ConvTranspose k4 s2 p1 -> a matmul-shaped scope plus an eOperator (col2im-like OffsetReduce)",
        _CONV_TRANSPOSE,
        (
            _s("split_summation", "Sum[kh, kw] outside"),
            _s("substitute_variables", "fuse h-kh+2 into t (replaces h)"),
            _s("substitute_variables", "fuse w-kw+2 into t1 (replaces w)"),
            _s("merge_traversal", at="Y"),
            _s("merge_traversal", at="Y"),
            _s("substitute_variables", "split t by 2"),
            _s("substitute_variables", "split t1 by 2"),
            _s("merge_traversal", at="Y"),
            _s("merge_traversal", at="Y"),
            _s("tighten_boundary", "tighten r from"),
            _s("tighten_boundary", "tighten r1 from"),
            _s("merge_traversal", "inline U"),
            _s("tighten_boundary", "tighten q from"),
            _s("tighten_boundary", "tighten q1 from"),
        ),
        weights=("W",),
    ),
    PaperDerivation(
        "convtranspose_phases",
        "ConvTranspose k4 s2 p1 -> four stride-1 2x2 convolutions (residue splitting), merged back into one "
        "convolution with 4x the output channels plus a DepthToSpace",
        _CONV_TRANSPOSE,
        (
            _s("split_expression", "split h of Y by residue 2", at="Y"),
            _s("split_expression", "split w of Y0 by residue 2", at="Y0"),
            _s("split_expression", "split w of Y1 by residue 2", at="Y1"),
            *_phase_steps("Y00"),
            *_phase_steps("Y01"),
            *_phase_steps("Y10"),
            *_phase_steps("Y11"),
            _merge("Y00, Y01", "join"),
            _merge("Y10, Y11", "join"),
            _merge("M, M1", "join"),
            _merge("Y0, Y1", "join"),
            _s("substitute_variables", "merge f, hr into z", at="M2"),
            _s("substitute_variables", "merge z, wr into z1", at="M2.1"),
            _s("merge_traversal", at="M2"),
            _s("fuse_expressions", "inline M2", at="M"),
            _s("fuse_expressions", "inline M", at="Y"),
            _s("substitute_variables", "reverse Sum q (", at="Y.1"),
            _s("substitute_variables", "reverse Sum q1 (", at="Y.1"),
            _s("materialize_access", "materialize W"),
        ),
        weights=("W",),
    ),
    PaperDerivation(
        "gcn_matmuls",
        "Fig. 15: GCN's k x 1 and 1 x k convolutions of one input -> matmul + offset sums each, "
        "the two matmuls merged into one over stacked weights",
        _GCN,
        (
            _s("split_summation", "Sum[r] outside, Sum[c] inside", at="Y1"),
            _s("substitute_variables", "fuse h+r-1 into t (replaces h)"),
            _s("merge_traversal", at="Y1"),
            _s("tighten_boundary", "tighten t from"),
            _s("split_summation", "Sum[s] outside, Sum[c] inside", at="Y2"),
            _s("substitute_variables", "fuse w+s-1 into t (replaces w)"),
            _s("merge_traversal", at="Y2"),
            _s("tighten_boundary", "tighten t from"),
            _s("materialize_access", "materialize W1", at="Y1.1"),
            _s("materialize_access", "materialize W2", at="Y2.1"),
            _merge("Y1.2, Y2.2", "concat Y1.2, Y2.2 along r"),
        ),
        weights=("W1", "W2"),
    ),
    PaperDerivation(
        "lstm_gates",
        "LSTM cell: the 8 gate matmuls (4 on x, 4 on h) -> one matmul on concat(x, h)",
        _LSTM_GATES,
        (
            *(_s("merge_summations", at=f"pre_{g}") for g in "ifgo"),
            _merge("pre_i, pre_f", "concat"),
            _merge("M, pre_g", "concat"),
            _merge("M1, pre_o", "concat"),
        ),
        weights=tuple(f"W{s}_{g}" for s in "xh" for g in "ifgo"),
    ),
    PaperDerivation(
        "lstm_gates_batched",
        "LSTM cell: the 4 gate matmuls on x and the 4 on h -> one batched matmul (x and h stacked)",
        _LSTM_GATES,
        (
            _merge("mx_i, mx_f", "concat"),
            _merge("M, mx_g", "concat"),
            _merge("M1, mx_o", "concat"),
            _merge("mh_i, mh_f", "concat"),
            _merge("M1, mh_g", "concat"),
            _merge("M2, mh_o", "concat"),
            _merge("M, M1", "batch"),
        ),
        weights=tuple(f"W{s}_{g}" for s in "xh" for g in "ifgo"),
    ),
    PaperDerivation(
        "g2bmm_dilated",
        "Fig. 14: dilated G2BMM (d = 4) -> a non-dilated G2BMM on re-laid-out tensors plus inverse layouts",
        "L[b:2, m:16, w:7] Sum[k:3] A[b, m, k] * B[b, m + 4*(w - 3), k] where A: [2, 16, 3], B: [2, 16, 3]",
        (
            _s("substitute_variables", "split m by 4"),
            _s("split_dimension", "of A by 4"),
            _s("split_dimension", "of B by 4"),
        ),
    ),
    PaperDerivation(
        "im2col",
        "Fig. 7 (i): Conv3x3 -> im2col buffer (an eOperator) plus a matmul",
        _CONV3X3,
        (_s("materialize_access", "materialize A"),),
        weights=("K",),
    ),
    PaperDerivation(
        "grouped_conv",
        "Fig. 7 (k): a convolution as a grouped convolution over a replicated input",
        "L[n:1, f:4, h:4, w:4] Sum[c:3, kh:3, kw:3] X[n, c, h+kh-1, w+kw-1] * W[f, c, kh, kw]"
        " where X: [1, 3, 4, 4], W: [4, 3, 3, 3]",
        (
            _s("replicate_access", "replicate X along f"),
            _s("merge_dimensions", "merge dimensions 1, 2 of scope"),
        ),
        weights=("W",),
    ),
    PaperDerivation(
        "prelu_max",
        "FSRCNN: 1x1 conv + PRelu (slopes in [0, 1]) -> max(conv(x, W), conv(x, a*W))",
        _FSRCNN,
        (_s("rewrite_prelu_max"), _s("fold_channel_scale")),
        constants=_fsrcnn_constants(equal=False),
        weights=("W", "A"),
    ),
    PaperDerivation(
        "prelu_leaky",
        "FSRCNN: 1x1 conv + PRelu with equal slopes -> conv + LeakyRelu",
        _FSRCNN,
        (_s("rewrite_prelu_leaky"),),
        constants=_fsrcnn_constants(equal=True),
        weights=("W", "A"),
    ),
]

DERIVATIONS: dict[str, PaperDerivation] = {d.name: d for d in _LIST}
"""The paper's derivations by name."""
