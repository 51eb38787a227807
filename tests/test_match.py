"""Operator matching on hand-built expressions in unusual layouts, and near misses with reasons.

Each accepted case asserts the operator and the derived attributes, then runs
the instantiated model in ONNX Runtime against the reference interpreter
(``run_onnx`` from ``test_instantiate``). Near misses assert which matcher
refuses and that its reason says why. Seeded random layouts check that every
MatMul/layout correspondence found is numerically right.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_instantiate import as_program, run_onnx

import einopt
from einopt.core import ir
from einopt.core.interp import eval_index
from einopt.instantiate.match import MATCHERS, match
from einopt.instantiate.match_layout import layout_plan
from einopt.instantiate.plan import (
    MatchContext,
    OperatorMatch,
    Pad,
    Refusal,
    Reshape,
    Slice,
    Transpose,
    apply_steps,
    normalize,
)
from einopt.instantiate.views import arrange, index_map, plan_map, simple_view, window_1d


def scope_of(text: str) -> ir.Scope:
    e = einopt.parse(text)
    assert isinstance(e, ir.Scope)
    return e


# --------------------------------------------------------------------------
# Accepted: operator and attributes
# --------------------------------------------------------------------------

U = "{L[n:1, c:2, i0:3, p0:1, i1:3, p1:1] X[n, c, i0, i1]}"

MATCH_CASES = [
    # (id, text, operator, attributes that must hold)
    ("matmul", "L[m:4, n:5] Sum[k:3] A[m,k]*B[k,n] where A:[4,3], B:[3,5]", "MatMul", {}),
    (
        "gemm_both_transposed",
        "L[m:4, n:5] Sum[k:3] B[n,k]*A[k,m] where A:[3,4], B:[5,3]",
        "Gemm",
        {"transA": 1, "transB": 1, "alpha": 1.0},
    ),
    (
        "gemm_scaled_output_transposed",
        "L[n:5, m:4] Sum[k:3] -(A[m,k]*B[k,n]) / 4.0 where A:[4,3], B:[3,5]",
        "Gemm",
        {"alpha": -0.25},
    ),
    (
        "gemm_bias_beta",
        "L[m:4, n:5] 3.0*C[m, 0] + {L[a:4, b:5] Sum[k:3] A[a,k]*B[k,b]}[m, n] where A:[4,3], B:[3,5], C:[4,1]",
        "Gemm",
        {"beta": 3.0, "transA": 0, "transB": 0},
    ),
    (
        # MatMul would transpose both operands; FusedMatMul reads them as they are
        "batched_matmul_permuted_operands",
        "L[b:2, n:5, m:4] Sum[k:3] A[k,b,m]*B[n,b,k] where A:[3,2,4], B:[5,2,3]",
        "com.microsoft.FusedMatMul",
        {"transA": 0, "transBatchA": 1, "transB": 0, "transBatchB": 1},
    ),
    (
        "matmul_summed_pair_merged",
        "L[m:4, n:5] Sum[k1:2, k2:3] A[m,k1*3+k2]*B[k2,n,k1] where A:[4,6], B:[3,5,2]",
        "MatMul",
        {},
    ),
    (
        "matmul_offset_and_strided_operands",
        "L[m:3, n:5] Sum[k:3] A[2*m+1, k]*B[k+1, n] where A:[7,3], B:[4,5]",
        "MatMul",
        {},
    ),
    (
        "conv_permuted_loops",
        "L[w:5, f:4, n:2, h:5] Sum[r:3, c:3, s:3] W[f,c,r,s]*X[n, c, h+r-1, w+s-1]"
        " where X:[2,3,5,5], W:[4,3,3,3]",
        "Conv",
        {"kernel_shape": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1), "group": 1},
    ),
    (
        "conv_strided_dilated",
        "L[n:1, f:2, h:4] Sum[c:3, r:3] X[n, c, 2*h+3*r-2]*W[f,c,r] where X:[1,3,11], W:[2,3,3]",
        "Conv",
        {"strides": (2,), "dilations": (3,), "pads": (2, 0)},
    ),
    (
        "conv_offset_range_shifts_pad",
        "L[n:1, f:2, h=-2:3] Sum[c:3, r:3] X[n, c, h+r]*W[f,c,r] where X:[1,3,5], W:[2,3,3]",
        "Conv",
        {"pads": (2, 0)},
    ),
    (
        "conv_negative_pad_slices",
        "L[n:1, f:2, h:3] Sum[c:3, r:2] X[n, c, h+r+2]*W[f,c,r] where X:[1,3,8], W:[2,3,2]",
        "Conv",
        {"pads": (0, 0)},
    ),
    (
        "reversed_kernel_is_a_conv_transpose",
        "L[n:1, f:2, h:4] Sum[c:3, r:3] X[n, c, h-2*r+4]*W[f,c,r] where X:[1,3,6], W:[2,3,3]",
        "ConvTranspose",
        {"dilations": (2,), "pads": (4, 2), "strides": (1,)},
    ),
    (
        "conv_strided_reversed_kernel_is_flipped",
        "L[n:1, f:2, h:4] Sum[c:3, r:3] X[n, c, 2*h-r+2]*W[f,c,r] where X:[1,3,9], W:[2,3,3]",
        "Conv",
        {"strides": (2,), "dilations": (1,), "pads": (0, 0)},
    ),
    (
        "conv_1x1_strided_reads_the_whole_input",  # the odd last row is rounded away, not sliced
        "L[n:1, f:4, o0:4, o1:4] Sum[c:3, r0:1, r1:1] X[n, c, 2*o0+r0, 2*o1+r1]*W[f,c,r0,r1]"
        " where X:[1,3,8,8], W:[4,3,1,1]",
        "Conv",
        {"kernel_shape": (1, 1), "strides": (2, 2), "pads": (0, 0, 0, 0)},
    ),
    (
        "conv_1x1_strided_without_kernel_iterators",
        "L[n:2, f:4, o0:4, o1:4] Sum[c:3] X[n, c, 2*o0, 2*o1]*W[f,c] where X:[2,3,8,7], W:[4,3]",
        "Conv",
        {"kernel_shape": (1, 1), "strides": (2, 2), "pads": (0, 0, 0, 0), "dilations": (1, 1)},
    ),
    (
        "conv_strided_without_kernel_offsets_slice_and_pad",
        "L[n:1, f:4, o0:4, o1:4] Sum[c:3] X[n, c, 2*o0+1, 2*o1-1]*W[f,c] where X:[1,3,8,7], W:[4,3]",
        "Conv",
        {"kernel_shape": (1, 1), "strides": (2, 2), "pads": (0, 1, 0, 0)},
    ),
    (
        "conv_strided_trailing_input_below_the_stride",
        "L[n:1, f:2, h:3] Sum[c:3, r:3] X[n, c, 2*h+r]*W[f,c,r] where X:[1,3,8], W:[2,3,3]",
        "Conv",
        {"strides": (2,), "pads": (0, 0)},
    ),
    (
        "conv_grouped",
        "L[n:1, f:6, h:4] Sum[c:2, r:3] X[n, c + 2*(f//2), h+r-1]*W[f,c,r] where X:[1,6,4], W:[6,2,3]",
        "Conv",
        {"group": 3},
    ),
    (
        "conv_grouped_one_output_per_group",
        "L[n:1, f:3, h:4] Sum[c:2, r:3] X[n, 2*f + c, h+r-1]*W[f,c,r] where X:[1,6,4], W:[3,2,3]",
        "Conv",
        {"group": 3},
    ),
    (
        "conv_depthwise_multiplier",
        "L[n:1, f:6, h:4] Sum[r:3] X[n, f // 2, h+r-1]*W[f,r] where X:[1,3,4], W:[6,3]",
        "Conv",
        {"group": 3},
    ),
    (
        "conv_bias_any_order",
        "L[f:4, h:5, n:1] B[f] + {L[n2:1, f2:4, h2:5] Sum[c:3, r:3] X[n2, c, h2+r-1]*W[f2,c,r]}[n, f, h]"
        " where X:[1,3,5], W:[4,3,3], B:[4]",
        "Conv",
        {"pads": (1, 1)},
    ),
    (
        "conv_transpose_stride1",
        "L[n:1, f:5, o:6] Sum[c:3, k:3] X[n, c, o - k] * W[c, f, k] where X:[1,3,4], W:[3,5,3]",
        "ConvTranspose",
        {"strides": (1,), "pads": (0, 0), "dilations": (1,)},
    ),
    (
        "conv_transpose_U_output_padding",
        f"L[n:1, f:4, o0:6, o1:7] Sum[c:2, k0:3, k1:3] {U}[n, c, (o0+1-k0)//2, (o0+1-k0)%2, (o1+1-k1)//2,"
        " (o1+1-k1)%2] * W[c, f, k0, k1] where X:[1,2,3,3], W:[2,4,3,3]",
        "ConvTranspose",
        {"strides": (2, 2), "pads": (1, 1, 0, 0), "output_padding": (0, 1)},
    ),
    (
        "conv_transpose_U_permuted_weight",
        f"L[n:1, o0:5, f:4, o1:5] Sum[c:2, k0:3, k1:3] W[k1, f, k0, c] * {U}[n, c, (o0+1-k0)//2,"
        " (o0+1-k0)%2, (o1+1-k1)//2, (o1+1-k1)%2] where X:[1,2,3,3], W:[3,4,3,2]",
        "ConvTranspose",
        {"strides": (2, 2), "pads": (1, 1, 1, 1)},
    ),
    (
        "conv_transpose_constant_bias_broadcast",
        "L[n:1, f:4, o:6] {L[n2:1, f2:4, o2:6] Sum[c:3, k:3] X[n2, c, o2 - k] * W[c, f2, k]}[n, f, o] + 0.5"
        " where X:[1,3,4], W:[3,4,3]",
        "ConvTranspose",
        {"strides": (1,)},
    ),
    (
        "conv_transpose_grouped_dilated",
        "L[n:1, f:6, o:7] Sum[c:2, k:3] X[n, c + 2*(f//3), o + 1 - 2*k] * W[c + 2*(f//3), f % 3, k]"
        " where X:[1,4,4], W:[4,3,3]",
        "ConvTranspose",
        {"group": 2, "dilations": (2,)},
    ),
    ("einsum_three", "L[i:4] Sum[j:3, k:5] A[i,j]*B[j,k]*C[k] where A:[4,3], B:[3,5], C:[5]", "Einsum", {}),
    ("reduce_sum_strided", "L[i:3] Sum[k:4] X[2*k, i] where X:[8,3]", "ReduceSum", {"keepdims": 0}),
    (
        "prelu_commuted",
        "L[i:4, j:3] min(0.0, X[i,j])*A[j] + max(0.0, X[i,j]) where X:[4,3], A:[3]",
        "PRelu",
        {},
    ),
    ("clip_reversed_form", "L[i:4] max(min(X[i], 1.0), -1.0) where X:[4]", "Clip", {}),
    ("concat", "L[i:10] A[i] + B[i-4] where A:[4], B:[6]", "Concat", {"axis": 0}),
]


@pytest.mark.parametrize(
    ("text", "op", "attrs"), [c[1:] for c in MATCH_CASES], ids=[c[0] for c in MATCH_CASES]
)
def test_match(text, op, attrs):
    m, failures = match(scope_of(text))
    assert isinstance(m, OperatorMatch), failures
    assert m.op_type == op, failures
    got = m.attrs
    assert {k: got.get(k) for k in attrs} == attrs
    run_onnx(text)


LAYOUT_CASES = [
    ("identity", "L[i:3, j:4] X[i, j] where X:[3,4]", []),
    ("slice_negative_step", "L[i:3] X[7 - 3*i] where X:[8]", [Slice]),
    ("pad_only", "L[i=-1:5] X[i + 1] where X:[4]", [Pad]),
    ("slice_and_pad", "L[i=-1:5] X[i + 2] where X:[4]", [Slice, Pad]),
    ("slice_then_transpose", "L[i:2, j:3] X[j, 2*i] where X:[3,4]", [Slice, Transpose]),
    ("flatten", "L[n:2, k:12] X[n, k // 4, k % 4] where X:[2,3,4]", [Reshape]),
    ("unflatten", "L[a:3, b:4] X[a*4 + b] where X:[12]", [Reshape]),
    (
        "transpose_then_flatten",
        "L[a:6, b:4] X[(a*4+b) % 3, (a*4+b) // 3] where X:[3,8]",
        [Transpose, Reshape],
    ),
    (
        "reshape_then_transpose",
        "L[i:3, j:4] X[(j*3+i) // 6, (j*3+i) % 6] where X:[2,6]",
        [Reshape, Transpose],
    ),
]


@pytest.mark.parametrize(("text", "steps"), [c[1:] for c in LAYOUT_CASES], ids=[c[0] for c in LAYOUT_CASES])
def test_layout_steps(text, steps):
    m, _ = match(scope_of(text))
    assert [type(s) for s in m.steps] == steps
    run_onnx(text)


# --------------------------------------------------------------------------
# Near misses: refused, with the reason
# --------------------------------------------------------------------------

NEAR_MISSES = [
    # (id, text, matcher, words of its reason, operator finally chosen or None for an eOperator)
    (
        "conv_wrong_group_coefficient",
        "L[n:1, f:8, h:3] Sum[c:2, r:3] X[n, c + 3*(f//4), h+r-1]*W[f,c,r] where X:[1,8,5], W:[8,2,3]",
        "Conv",
        "input channel index c+3*(f//4) is not c + Cg*(f // Fg) (Cg = 2",
        None,
    ),
    (
        "conv_channel_times_output_channel",
        "L[n:1, f:4, h:3] Sum[c:3, r:3] X[n, c + 2*f, h+r-1]*W[f,c,r] where X:[1,9,5], W:[4,3,3]",
        "Conv",
        "input channel index c+2*f is not c + Cg*(f // Fg) (Cg = 3, but the group term has coefficient 2)",
        None,
    ),
    (
        "conv_non_uniform_stride",
        "L[n:1, f:2, h:4] Sum[c:2, r:3] X[n, c, h + h//2 + r]*W[f,c,r] where X:[1,2,9], W:[2,2,3]",
        "Conv",
        "is not s*o + d*k + e",
        None,
    ),
    (
        "conv_bias_along_space",
        "L[n:1, f:4, h:5] {L[n2:1, f2:4, h2:5] Sum[c:3, r:3] X[n2, c, h2+r-1]*W[f2,c,r]}[n, f, h] + B[h]"
        " where X:[1,3,5], W:[4,3,3], B:[5]",
        "Conv",
        "not the output channel alone",
        "Add",
    ),
    (
        "strided_contraction_outside_conv_order",
        "L[m:3, n:5] Sum[k:3] A[2*m+1, k]*B[k, n] where A:[7,3], B:[3,5]",
        "Conv",
        "outside Conv's [batch, channel, spatial] order",
        "MatMul",
    ),
    (
        "matmul_non_contiguous_merge",
        "L[m1:2, m2:3, n:5] Sum[k:3] A[m1*4+m2, k]*B[k,n] where A:[8,3], B:[3,5]",
        "MatMul",
        "non-contiguously",
        None,
    ),
    (
        "matmul_reduction_inside_an_operand",
        "L[m:4, n:5] Sum[k:3, j:2] A[m,k,j]*B[k,n] where A:[4,3,2], B:[3,5]",
        "MatMul",
        "summed within one operand alone",
        "Einsum",
    ),
    (
        "conv_transpose_unpaired_modulo",
        "L[n:1, f:4, o:5] Sum[c:2, k:3] {L[n:1, c:2, i:3, p:1] X[n, c, i]}[n, c, (o+1-k)//2, (o-k)%2]"
        " * W[c, f, k] where X:[1,2,3], W:[2,4,3]",
        "ConvTranspose",
        "has no matching (..) // s",
        None,
    ),
    (
        "layout_non_uniform_stride",
        "L[i:4] X[i + i//2] where X:[6]",
        "Layout",
        "not a row-major (reshape) view",
        None,
    ),
    (
        "concat_overlap",
        "L[i:6] A[i] + B[i - 2] where A:[4], B:[4]",
        "Concat",
        "overlap",
        "Add",
    ),
    (
        "gemm_batched",
        "L[b:2, m:4, n:5] Sum[k:3] A[b,m,k]*B[b,k,n] where A:[2,4,3], B:[2,3,5]",
        "Gemm",
        "batched",
        "MatMul",
    ),
]


@pytest.mark.parametrize(
    ("text", "matcher", "reason", "chosen"), [c[1:] for c in NEAR_MISSES], ids=[c[0] for c in NEAR_MISSES]
)
def test_near_miss(text, matcher, reason, chosen):
    scope = scope_of(text)
    refused = MATCHERS[matcher](scope)
    assert isinstance(refused, Refusal)
    assert reason in refused.reason
    m, failures = match(scope)
    assert dict(failures)[matcher].reason == refused.reason
    assert (m.op_type if m else None) == chosen
    if chosen is None:
        pytest.importorskip("einopt.instantiate.eop")
    run_onnx(text)


# --------------------------------------------------------------------------
# Seeded random layouts: every correspondence found is numerically right
# --------------------------------------------------------------------------


def _perm(rng, xs):
    return [xs[i] for i in rng.permutation(len(xs))]


@pytest.mark.parametrize("seed", range(12))
def test_random_matmul_layouts(seed):
    """Batched products with every operand and the output in a random dimension order."""
    rng = np.random.default_rng(seed)
    b, m, n, k = ir.Iter("b", 0, 2), ir.Iter("m", 0, 3), ir.Iter("n", 0, 4), ir.Iter("k", 0, 5)
    a_dims = _perm(rng, [b, m, k] if rng.random() < 0.7 else [m, k])
    b_dims = _perm(rng, [b, k, n])
    A = ir.Tensor("A", tuple(d.extent for d in a_dims))
    B = ir.Tensor("B", tuple(d.extent for d in b_dims))
    out = ir.Scope(tuple(_perm(rng, [b, m, n])), (k,), A[tuple(a_dims)] * B[tuple(b_dims)])
    m_, failures = match(out)
    assert m_ is not None and m_.op_type in ("MatMul", "Gemm", "com.microsoft.FusedMatMul"), failures
    const = ("B",) if seed % 2 else ()
    run_onnx(einopt.program({"out": out}), const, seed=seed)


@pytest.mark.parametrize("seed", range(12))
def test_random_elementwise_broadcasts(seed):
    """Operands reading random subsets of the output iterators in random orders (ONNX broadcasting)."""
    rng = np.random.default_rng(200 + seed)
    its = [ir.Iter("a", 0, 2), ir.Iter("b", -1, 2), ir.Iter("c", 0, 4)]
    body = None
    for name in ("P", "Q", "R"):
        read = _perm(rng, its)[: int(rng.integers(1, 4))]
        t = ir.Tensor(name, tuple(it.extent for it in read))
        acc = t[tuple(it - it.lo for it in read)]
        if body is None:
            body = einopt.relu(acc) if rng.random() < 0.5 else acc
        else:
            body = ir.Binary(str(rng.choice(["+", "-", "*", "max", "min"])), body, acc)
    scope = ir.Scope(tuple(_perm(rng, its)), (), body)
    m, failures = match(scope)
    assert m is not None and m.ops and m.ops[-1].op_type in ("Add", "Sub", "Mul", "Max", "Min"), failures
    run_onnx(einopt.program({"out": scope}), ("R",) if seed % 3 == 0 else (), seed=seed)


@pytest.mark.parametrize("seed", range(40))
def test_random_layout_views(seed):
    """Strided, reversed, offset, constant-index and permuted single-access reads."""
    rng = np.random.default_rng(100 + seed)
    rank = int(rng.integers(1, 4))
    shape = tuple(int(rng.integers(1, 6)) for _ in range(rank))
    los = [int(rng.integers(-2, 2)) for _ in range(rank)]
    its = [ir.Iter(f"t{d}", lo, lo + int(rng.integers(1, 5))) for d, lo in enumerate(los)]
    idx = []
    for d, it in enumerate(_perm(rng, its)):  # source dimension d reads iterator it
        if rng.random() < 0.15:
            idx.append(ir.IConst(int(rng.integers(0, shape[d]))))
            continue
        s = int(rng.choice([-2, -1, 1, 1, 2]))
        start = int(rng.integers(0, shape[d]))  # where the first read lands
        idx.append(it * s + (start - s * it.lo))
    X = ir.Tensor("X", shape)
    scope = ir.Scope(tuple(_perm(rng, its)), (), X[tuple(idx)])
    steps = layout_plan(scope.traversal, scope.body)
    assert not isinstance(steps, Refusal), steps
    np.testing.assert_array_equal(plan_map(shape, steps), index_map(scope.traversal, scope.body))
    run_onnx(einopt.program({"out": scope}), seed=seed)


# --------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------


def test_window_1d_against_brute_force():
    for s, c, n, size in itertools.product([-3, -2, -1, 1, 2, 3], range(-6, 7), range(1, 5), range(1, 5)):
        x = np.arange(size) + 100
        want = np.array([x[c + s * p] if 0 <= c + s * p < size else 0 for p in range(n)])
        win = window_1d(s, c, n, size)
        if win is None:
            assert not want.any()
            continue
        sl, pad = win
        steps = ([Slice((sl[0],), (sl[1],), (0,), (sl[2],))] if sl else []) + [Pad(pad)]
        np.testing.assert_array_equal(apply_steps(steps, x), want, err_msg=str((s, c, n, size)))


def test_normalize_drops_and_merges():
    shape = (2, 1, 3)
    steps = [Transpose((0, 1, 2)), Reshape((2, 3)), Reshape((6,)), Transpose((0,))]
    assert normalize(steps, shape) == (Reshape((6,)),)
    # a transpose that only moves a size-1 dimension is a reshape
    assert normalize([Transpose((1, 0, 2))], shape) == (Reshape((1, 2, 3)),)
    assert normalize([Transpose((2, 0, 1)), Transpose((1, 2, 0))], shape) == ()


def test_arrange_groups_and_transposes():
    steps = arrange(["a", "b", "c"], (2, 3, 4), [("c",), ("a", "b")])
    assert steps == (Transpose((2, 0, 1)), Reshape((4, 6)))
    assert arrange(["a", "b"], (2, 3), [(), ("a",), ("b",)]) == (Reshape((1, 2, 3)),)


def test_simple_view_reasons():
    x = ir.Tensor("X", (4, 4))
    i, j = ir.Iter("i", 0, 4), ir.Iter("j", 0, 4)
    assert "jointly" in simple_view(x[i + j, i]).reason
    assert "only zeros" in simple_view(x[i, 7]).reason
    v = simple_view(x[j, 3 - i])
    assert v.labels == (j, i)


def test_bias_matchers_refuse_a_bound_product():
    prog = as_program(
        """S = L[m:4, n:5] Sum[k:3] A[m, k] * B[k, n]
        Y = L[m:4, n:5] S[m, n] + C[n]
        return Y
        where A: [4, 3], B: [3, 5], C: [5]"""
    )
    bound = MatchContext(bound=frozenset(s for _, s in prog.bindings))
    m, failures = match(prog.scope("Y"), bound)
    assert m.op_type == "Add" and "program binding" in dict(failures)["Gemm"].reason
    m2, _ = match(prog.scope("Y"))
    assert m2.op_type == "Gemm" and m2.consumes == (prog.scope("S"),)


@pytest.mark.parametrize(
    "case", ["conv_1x1_strided_reads_the_whole_input", "conv_strided_trailing_input_below_the_stride"]
)
def test_strided_conv_rounds_trailing_input_away(case):
    """Fewer than ``stride`` unread trailing positions need no Slice: Conv's output extent drops them."""
    text = next(c[1] for c in MATCH_CASES if c[0] == case)
    m, _ = match(scope_of(text))
    assert m.op_type == "Conv"
    assert not [st for o in m.operands for st in o.steps if isinstance(st, Slice)]


@pytest.mark.parametrize(("inner", "one"), [("w", "r"), ("a", "z")])
def test_extent_one_iterator_merges_under_any_name(inner, one):
    """``X[.., w + r]`` with ``r`` of extent 1 is a view of ``w`` whichever name sorts first."""
    x = ir.Tensor("X", (8,))
    w, r = ir.Iter(inner, 0, 8), ir.Iter(one, 0, 1)
    v = simple_view(x[w + r])
    assert not isinstance(v, Refusal), v
    assert v.labels == (w, r) and v.shape == (8, 1)


def _enumerated_reads(acc, dims, it):
    """Every in-range read of ``acc`` along ``dims``, enumerated: ({position: flat source position},
    whether the whole-range fit of ``step * position + offset`` through the first two reads holds)."""
    src = acc.source
    sizes = [src.shape[d] for d in dims]
    env = {it: np.arange(it.lo, it.hi, dtype=np.int64)}
    flat = np.zeros(it.extent, dtype=np.int64)
    ok = np.ones(it.extent, dtype=bool)
    for d, n in zip(dims, sizes, strict=True):
        pos = np.broadcast_to(eval_index(acc.indices[d], env) - src.origin[d], (it.extent,))
        ok &= (pos >= 0) & (pos < n)
        flat = flat * n + pos
    where = np.flatnonzero(ok)
    reads = {int(p): int(flat[p]) for p in where}
    if where.size < 2:
        return reads, where.size == 1
    ds, dp = int(flat[where[1]] - flat[where[0]]), int(where[1] - where[0])
    if ds == 0 or ds % dp:
        return reads, False
    s = ds // dp
    expect = int(flat[where[0]]) - s * int(where[0]) + s * np.arange(it.extent)
    total = int(np.prod(sizes))
    fits = np.array_equal((expect >= 0) & (expect < total), ok) and np.array_equal(flat[ok], expect[ok])
    return reads, fits


@settings(max_examples=300, deadline=None)
@given(
    extent=st.sampled_from([1, 5, 12, 60, 7000, 30000]),
    lo=st.integers(-3, 3),
    inner=st.sampled_from([1, 2, 3, 4, 5, 1000]),
    outer_size=st.integers(1, 40),
    scale=st.sampled_from([1, 2, -1]),
    shift=st.integers(-6, 6),
    form=st.sampled_from(["divmod", "mod_only", "div_only", "nested", "affine"]),
)
def test_single_iterator_agrees_with_enumerating_the_range(extent, lo, inner, outer_size, scale, shift, form):
    """The symbolic and sampled shortcuts accept exactly the strided views, with the right reads."""
    from einopt.instantiate.views import _single_iterator

    it = ir.Iter("z", lo, lo + extent)
    e = scale * it + shift
    if form == "divmod":
        idx, size = [e // inner, e % inner], [outer_size, inner]
    elif form == "mod_only":
        idx, size = [e % inner, e * 0 + 1], [inner, 3]
    elif form == "div_only":
        idx, size = [e // inner, e * 0], [outer_size, 2]
    elif form == "nested":
        idx, size = [e // (2 * inner), e % (2 * inner) // inner, e % inner], [outer_size, 2, inner]
    else:
        idx, size = [e * 0 + 1, e], [3, outer_size * inner]
    x = ir.Tensor("X", tuple(size))
    acc = x[tuple(idx)]
    dims = list(range(len(idx)))
    reads_all, fits = _enumerated_reads(acc, dims, it)
    got = _single_iterator(acc, dims, it, "X")

    def reads(fit):  # {position: flat source position} where the read is in range
        total, s, c = fit
        return {p: c + s * p for p in range(it.extent) if 0 <= c + s * p < total}

    if not isinstance(got, Refusal):  # sound: exactly the reads the access makes
        assert got[0] == int(np.prod(size)) and reads(got) == reads_all
    if fits:  # complete: every strided view the enumeration finds
        assert not isinstance(got, Refusal), got
