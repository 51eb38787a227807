"""The rediscovery cases: plain operator expressions the search must transform by itself.

Each :class:`Case` is a start program (text syntax, at the paper's size or a
reduced one), which of its inputs are weights (seeded, finite: constant-aware
and zero-analysis rules rely on weights being known), and ``found``: what a
candidate must instantiate to for the transformation to count as
rediscovered, judged on the candidate's operator list and program only. The
search never reads this module; ``scripts/rediscover.py`` and
``tests/test_rediscover.py`` do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from einopt.core import ir
from einopt.core.parser import parse
from einopt.instantiate.match_band import Band, band_form
from einopt.instantiate.program import as_program
from einopt.rules import Context

__all__ = ["Case", "CASES", "Paper"]


@dataclasses.dataclass(frozen=True)
class Paper:
    """EinNet's published search figures (C++, depth 7, fingerprints): states, seconds, steps
    without/with converging derivation; ``None`` where the paper gives none."""

    states: int | None = None
    seconds: float | None = None
    steps: str = ""


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    title: str
    full: str
    small: str
    weights: tuple[str, ...]
    found: Callable[[tuple[str, ...], ir.Program], bool]
    want: str
    paper: Paper = Paper()
    positive: tuple[str, ...] = ()  # weights drawn in [0, 1] (PRelu slopes)
    assumed_finite: tuple[str, ...] = ()  # activations the transformation needs finite (Fig. 6)

    def context(self, program: ir.Program, seed: int = 0):
        """The rules' context: seeded weights, and the activations assumed finite."""
        return Context(self.constants(program, seed), assumed_finite=frozenset(self.assumed_finite))

    def program(self, size: str = "small") -> ir.Program:
        return as_program(parse(self.full if size == "full" else self.small))

    def constants(self, program: ir.Program, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        shapes = {t.name: t.shape for t in program.inputs}
        out = {}
        for name in self.weights:
            if name in self.positive:
                out[name] = rng.uniform(0.0, 1.0, shapes[name])
            else:
                out[name] = rng.standard_normal(shapes[name])
        return out


def _has(ops: tuple[str, ...], *parts: str) -> bool:
    return all(any(p in o for o in ops) for p in parts)


def _count(ops: tuple[str, ...], op: str) -> int:
    return sum(1 for o in ops if o == op)


def _compute(ops: tuple[str, ...]) -> list[str]:
    return [o for o in ops if o in ("MatMul", "Gemm", "Conv", "ConvTranspose")]


def _matmul_plus_eop(ops: tuple[str, ...], p: ir.Program) -> bool:
    return bool(_compute(ops)) and "ConvTranspose" not in ops and any(o.startswith("eop:") for o in ops)


def _matmul_offset_reduce(ops: tuple[str, ...], p: ir.Program) -> bool:
    # Fig. 5 exactly: the contraction as one operator, the window sums as an OffsetReduce, and no
    # re-layout eOperator (that would be the im2col form).
    return bool(_compute(ops)) and _has(ops, "OffsetReduce") and not _has(ops, "Relayout")


def _conv_with_more_outputs(ops: tuple[str, ...], p: ir.Program) -> bool:
    return "Conv" in ops and any(o.startswith("eop:") for o in ops)


def _band(ops: tuple[str, ...], p: ir.Program) -> bool:
    """A G2BMM with dilation 1 (a dilated one is a G2BMM too, whose lowering does the residue split
    itself; these cases ask the search for it)."""
    return any(
        isinstance(f := band_form(s), Band) and f.kind == "G2BMM" and f.dilation == 1 for s in ir.scopes_in(p)
    )


def _im2col(ops: tuple[str, ...], p: ir.Program) -> bool:
    return _has(ops, "eop:") and ("MatMul" in ops or "Gemm" in ops) and "Conv" not in ops


def _phases(ops: tuple[str, ...], p: ir.Program) -> bool:
    return "ConvTranspose" not in ops and ("DepthToSpace" in ops or _count(ops, "Conv") == 4)


def _one_matmul(ops: tuple[str, ...], p: ir.Program) -> bool:
    return len(_compute(ops)) == 1 and ("MatMul" in ops or "Gemm" in ops)


def _merged_head(ops: tuple[str, ...], p: ir.Program) -> bool:
    contractions = [o for o in ops if "Contract" in o]
    return len(_compute(ops)) == 1 and _has(ops, "OffsetReduce") and not contractions


def _prelu_max(ops: tuple[str, ...], p: ir.Program) -> bool:
    return "Max" in ops and "PRelu" not in ops and len(_compute(ops)) == 2


_CONV3 = "L[n:1, f:{f}, h:{h}, w:{h}] Sum[c:{c}, r:3, s:3] X[n, c, h+r-1, w+s-1] * W[f, c, r, s] where X: [1, {c}, {h}, {h}], W: [{f}, {c}, 3, 3]"

_CT = """\
U = L[n:{n}, c:{c}, i0:{i}, p0:1, i1:{i}, p1:1] X[n, c, i0, i1]
Y = L[n:{n}, f:{f}, h:{o}, w:{o}] Sum[c:{c}, kh:4, kw:4] U[n, c, (h+2-kh)//2, (h+2-kh)%2, (w+2-kw)//2, (w+2-kw)%2] * W[c, f, kh, kw]
return Y
where X: [{n}, {c}, {i}, {i}], W: [{c}, {f}, 4, 4]"""

# ONNX's own ConvTranspose k4 s2 p1, as the importer writes it: the output reads the zero-inserted
# input at (h + 1 - kh) // 2, so the phases read the input at different offsets (each its own pads).
_CT_ONNX = _CT.replace("h+2-kh", "h+1-kh").replace("w+2-kw", "w+1-kw")

_CONV5 = "L[n:{n}, f:1, h:{h}, w:{h}] Sum[c:{c}, r:5, s:5] X[n, c, h+r-2, w+s-2] * W[f, c, r, s] where X: [{n}, {c}, {h}, {h}], W: [1, {c}, 5, 5]"

_G2BMM = "L[b:{b}, m:{m}, w:{w}] Sum[k:{k}] A[b, m, k] * B[b, m + {d}*(w - {half}), k] where A: [{b}, {m}, {k}], B: [{b}, {m}, {k}]"

_LSTM_GATES = "\n".join(
    [
        *(
            line
            for g in "ifgo"
            for line in (
                f"mx_{g} = L[m:{{m}}, n:{{n}}] Sum[k:{{k}}] x[m, k] * Wx_{g}[k, n]",
                f"mh_{g} = L[m:{{m}}, n:{{n}}] Sum[k:{{k}}] h[m, k] * Wh_{g}[k, n]",
                f"pre_{g} = L[i0:{{m}}, i1:{{n}}] mx_{g}[i0, i1] + mh_{g}[i0, i1]",
            )
        ),
        "return pre_i, pre_f, pre_g, pre_o",
        "where x: [{m}, {k}], h: [{m}, {k}], "
        + ", ".join(f"W{s}_{g}: [{{k}}, {{n}}]" for s in "xh" for g in "ifgo"),
    ]
)

_GCN = """\
Y1 = L[n:1, f:{f}, h:{h}, w:{h}] Sum[c:{c}, r:{k}] X[n, c, h+r-{p}, w] * W1[f, c, r, 0]
Y2 = L[n:1, f:{f}, h:{h}, w:{h}] Sum[c:{c}, s:{k}] X[n, c, h, w+s-{p}] * W2[f, c, 0, s]
Z = L[n:1, f:{f}, h:{h}, w:{h}] Y1[n, f, h, w] + Y2[n, f, h, w]
return Z
where X: [1, {c}, {h}, {h}], W1: [{f}, {c}, {k}, 1], W2: [{f}, {c}, 1, {k}]"""

_PRELU = """\
Y = L[n:1, f:{f}, h:{h}, w:{h}] Sum[c:{c}] X[n, c, h, w] * W[f, c, 0, 0]
Z = L[n:1, f:{f}, h:{h}, w:{h}] max(Y[n, f, h, w], 0) + A[f, 0, 0] * min(Y[n, f, h, w], 0)
return Z
where X: [1, {c}, {h}, {h}], W: [{f}, {c}, 1, 1], A: [{f}, 1, 1]"""

_BAND = """\
S = L[b:{b}, i:{m}, j:{m}] Sum[k:{k}] Q[b, i, k] * K[b, j, k]
Y = L[b:{b}, i:{m}, w:{w}] S[b, i, i + w - {half}]
return Y
where Q: [{b}, {m}, {k}], K: [{b}, {m}, {k}]"""


CASES: dict[str, Case] = {
    c.name: c
    for c in [
        Case(
            "conv3x3",
            "Conv3x3 -> MatMul + OffsetReduce eOperator (Fig. 5/6)",
            _CONV3.format(f=512, c=512, h=7),
            _CONV3.format(f=8, c=8, h=5),
            ("W",),
            _matmul_offset_reduce,
            "a MatMul/Gemm (or 1x1 Conv) and an OffsetReduce eOperator, no re-layout",
            Paper(158_000, 7.0, "8 / 4"),
        ),
        Case(
            "convtranspose",
            "ConvTranspose k4 s2 p1 -> MatMul + eOperator",
            _CT.format(n=16, c=448, i=2, f=256, o=4),
            _CT.format(n=2, c=8, i=2, f=4, o=4),
            ("W",),
            _matmul_plus_eop,
            "a MatMul/Gemm/Conv (no ConvTranspose) and an eOperator",
            Paper(901_000, 52.7, "12 / 6"),
        ),
        Case(
            "conv5x5",
            "Conv5x5 -> Conv3x3 with 4x the outputs + eOperator (relaxed to 6x6)",
            _CONV5.format(n=16, c=32, h=224),
            _CONV5.format(n=1, c=4, h=8),
            ("W",),
            lambda ops, p: (
                _conv_with_more_outputs(ops, p)
                and any(it.extent == 3 for s in ir.scopes_in(p) for it in s.summation)
            ),
            "a Conv with 3x3 windows and an eOperator",
            Paper(2_230_000, 98.9, "11 / 7"),
            assumed_finite=("X",),
        ),
        Case(
            "g2bmm",
            "Dilated G2BMM (d = 4) -> G2BMM with dilation 1 + layout eOperators",
            _G2BMM.format(b=8, m=10000, k=64, w=1000, d=4, half=500),
            _G2BMM.format(b=2, m=16, k=3, w=7, d=4, half=3),
            (),
            _band,
            "a scope that is a G2BMM with dilation 1",
            Paper(18_000, 0.68, "7 / 4"),
        ),
        Case(
            "im2col",
            "Conv3x3 -> im2col eOperator + MatMul",
            _CONV3.format(f=512, c=512, h=7),
            _CONV3.format(f=8, c=8, h=5),
            ("W",),
            _im2col,
            "an eOperator and a MatMul/Gemm, no Conv",
        ),
        Case(
            "convtranspose_phases",
            "ConvTranspose k4 s2 p1 (DCGAN) -> 4 sub-pixel phase convolutions (+ DepthToSpace)",
            _CT.format(n=16, c=512, i=4, f=256, o=8),
            _CT.format(n=1, c=4, i=3, f=2, o=6),
            ("W",),
            _phases,
            "four Convs or one Conv + DepthToSpace, no ConvTranspose",
        ),
        Case(
            "convtranspose_onnx",
            "ONNX's ConvTranspose k4 s2 p1 (DCGAN) -> 4 phase Conv 2x2, each with its own pads",
            _CT_ONNX.format(n=16, c=512, i=4, f=256, o=8),
            _CT_ONNX.format(n=1, c=4, i=3, f=2, o=6),
            ("W",),
            _phases,
            "four Convs or one Conv + DepthToSpace, no ConvTranspose",
        ),
        Case(
            "lstm",
            "LSTM cell: 8 gate matmuls -> one MatMul on concat(x, h)",
            _LSTM_GATES.format(m=1, n=256, k=256),
            _LSTM_GATES.format(m=2, n=4, k=4),
            tuple(f"W{s}_{g}" for s in "xh" for g in "ifgo"),
            _one_matmul,
            "exactly one MatMul/Gemm",
        ),
        Case(
            "gcn_head",
            "Two skinny convs (k x 1 and 1 x k) of one input -> one merged matmul + offset sums",
            _GCN.format(f=21, c=2048, h=7, k=7, p=3),
            _GCN.format(f=2, c=4, h=6, k=3, p=1),
            ("W1", "W2"),
            _merged_head,
            "one MatMul/Gemm/Conv and OffsetReduce eOperators",
        ),
        Case(
            "prelu",
            "1x1 conv + PRelu (slopes in [0, 1]) -> max(conv(x, W), conv(x, a*W))",
            _PRELU.format(f=56, c=12, h=32),
            _PRELU.format(f=4, c=3, h=5),
            ("W", "A"),
            _prelu_max,
            "Max of two MatMul/Conv, no PRelu",
            positive=("A",),
        ),
        Case(
            "longformer_band",
            "Band attention as dense product then band gather -> G2BMM (band only; assumes Q, K finite)",
            _BAND.format(b=12, m=1024, k=64, w=257, half=128),
            _BAND.format(b=2, m=16, k=4, w=5, half=2),
            (),
            _band,
            "a scope that is a G2BMM with dilation 1",
            # Fused, the band reads K outside its rows (0) times Q: 0 * Q is 0 only for a finite Q.
            assumed_finite=("Q", "K"),
        ),
    ]
}
"""The cases, by name, in the order the paper gives them."""
