"""substitute_variables: fuse, merge and split iterators through a checked bijection."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rules_support import (
    Example,
    NearMiss,
    apply_all,
    as_program,
    assert_needs_finite,
    check_result,
    contractions,
    iterators,
    load,
    weights,
)

from einopt.core import ir
from einopt.core.rewrite import substitute_iters
from einopt.rules import get

RULE = "substitute_variables"

# Fig. 5 E2: the inner scope left by split_summation on a 3x3 convolution.
FIG5_E2 = (
    "L[r:3, s:3, h:14, w:14, f:32] Sum[c:16] A[h+r-1, w+s-1, c] * K[r, s, f, c] "
    "where A: [14, 14, 16], K: [3, 3, 32, 16]"
)
FIG5_SMALL = "L[r:3, s:3, h:4, w:3, f:2] Sum[c:2] A[h+r-1, w+s-1, c] * K[r, s, f, c] where A: [4, 3, 2], K: [3, 3, 2, 2]"
# Fig. 14: dilated G2BMM (dilation 4).
G2BMM = "L[b:2, m:16, w:7] Sum[k:3] A[b, m, k] * B[b, m + 4*(w - 3), k] where A: [2, 16, 3], B: [2, 16, 3]"
MATMUL = "L[i:3, j:4] Sum[k:5] A[i, k] * B[k, j] where A: [3, 5], B: [5, 4]"
# Sum k split by 2 adds a term k = 5 where X is out of range but W[3] is not: 0 only for a finite W.
SPLIT_W = "L[i:2] Sum[k:5] X[i, k] * W[(k+1)//2] where X: [2, 5], W: [4]"


def conv_transpose(kernel: int) -> str:
    """A 1-D ConvTranspose (stride 2, pad 1) as the importer writes it: through the zero-insertion scope U."""
    return (
        "U = L[n:1, c:2, i:3, p:1] X[n, c, i]\n"
        f"Y = L[n:1, f:2, h:{2 + kernel}] Sum[c:2, kh:{kernel}] "
        "U[n, c, (h+1-kh)//2, (h+1-kh)%2] * W[c, f, kh]\n"
        f"return Y\nwhere X: [1, 2, 3], W: [2, 2, {kernel}]"
    )


EXAMPLES = {
    RULE: [
        Example(FIG5_SMALL, min_matches=10),
        Example(G2BMM, min_matches=5),
        Example(conv_transpose(4), min_matches=4),
        Example(conv_transpose(3), min_matches=4),
        Example(MATMUL, min_matches=1),
        Example(
            "L[m:3, b:2, n:4] Sum[k:5] A[b, m, k] * B[b, k, n] where A: [2, 3, 5], B: [2, 5, 4]",
            min_matches=3,
        ),
        # Concat-like shifted reads; ranges below zero.
        Example("L[i:6, j=-1:2] A[i, j+1] + B[i - 3, j] where A: [3, 3], B: [3, 2]", min_matches=3),
        Example("L[i:4, j:8] Sum[k:6] A[i, k//2] * B[k%2, j] where A: [4, 3], B: [2, 8]", min_matches=1),
        Example(SPLIT_W, weights(SPLIT_W, "W")),
    ],
}

NEAR_MISSES = {
    RULE: [
        NearMiss(
            "L[h:4] Sum[r:3] A[h+r-1] * K[r] where A: [4], K: [3]", "index h+r-1 reads summation iterator r"
        ),
        NearMiss("L[h:4] A[2*h+1] where A: [9]", "coefficient 2 of h in 2*h+1: not a bijection onto a box"),
        NearMiss(
            "L[i:2] Sum[k:3] A[k//2] * B[i] where A: [2], B: [2]", "does not split into whole blocks of 2"
        ),
        NearMiss(SPLIT_W, "would not be zero (they are 0 only if W is finite; W is not a constant"),
    ],
}


def _only(program: ir.Program, summary: str) -> ir.Program:
    (after,) = [p for m, p in apply_all(RULE, program) if m.summary == summary]
    return after


def _inner(scope: ir.Scope) -> ir.Scope:
    assert not scope.summation
    assert isinstance(scope.body, ir.Access) and isinstance(scope.body.source, ir.Scope)
    return scope.body.source


def _reads(scope: ir.Scope) -> list[str]:
    """The indices at which a scope reads its inner scope, as text."""
    return [it.name if isinstance(it, ir.Iter) else str(it) for it in scope.body.indices]


def _ranges(scope: ir.Scope) -> list[tuple[str, int, int]]:
    return [(it.name, it.lo, it.hi) for it in scope.traversal]


def test_fig5_e2_to_e3_fuses_h_plus_r_into_a_box_from_minus_one():
    outer = _only(load(FIG5_E2), "fuse h+r-1 into t (replaces h)").scope("Y")
    assert _ranges(outer) == [("r", 0, 3), ("s", 0, 3), ("h", 0, 14), ("w", 0, 14), ("f", 0, 32)]
    assert _reads(outer) == ["r", "s", "h+r-1", "w", "f"]
    inner = _inner(outer)
    assert _ranges(inner) == [("r", 0, 3), ("s", 0, 3), ("t", -1, 15), ("w", 0, 14), ("f", 0, 32)]
    assert [it.name for it in inner.summation] == ["c"]
    assert str(inner.body) == "A[t, w+s-1, c] * K[r, s, f, c]"


def test_two_fuses_give_the_offset_box_over_t_and_t1():
    rule = get(RULE)
    program = _only(load(FIG5_E2), "fuse h+r-1 into t (replaces h)")
    inner = _inner(program.scope("Y"))
    (m,) = [
        m
        for m in rule.matches(program)
        if m.target is inner and m.summary == "fuse w+s-1 into t1 (replaces w)"
    ]
    after = rule.apply(program, m)
    check_result(program, after)
    middle = _inner(after.scope("Y"))
    assert _reads(middle) == ["r", "s", "t", "w+s-1", "f"]
    innermost = _inner(middle)
    assert _ranges(innermost) == [("r", 0, 3), ("s", 0, 3), ("t", -1, 15), ("t1", -1, 15), ("f", 0, 32)]
    assert str(innermost.body) == "A[t, t1, c] * K[r, s, f, c]"


def test_dilated_g2bmm_splits_m_by_the_dilation():
    outer = _only(load(G2BMM), "split m by 4 into q, r").scope("Y")
    assert _reads(outer) == ["b", "m//4", "m%4", "w"]
    inner = _inner(outer)
    assert _ranges(inner) == [("b", 0, 2), ("q", 0, 4), ("r", 0, 4), ("w", 0, 7)]
    assert str(inner.body) == "A[b, 4*q+r, k] * B[b, 4*q+r+4*w-12, k]"


def test_split_of_an_uneven_extent_covers_it_with_a_box():
    text = "L[b:2, m:10, w:3] Sum[k:3] A[b, m, k] * B[b, m + 4*w, k] where A: [2, 10, 3], B: [2, 20, 3]"
    inner = _inner(_only(load(text), "split m by 4 into q, r").scope("Y"))
    assert _ranges(inner) == [("b", 0, 2), ("q", 0, 3), ("r", 0, 4), ("w", 0, 3)]


def test_conv_transpose_summation_split_is_in_place():
    # Kernel 3: the extra term kh = 3 reads W outside its range, 0 only for a finite U (never known).
    assert not [m for m in get(RULE).matches(load(conv_transpose(3))) if "split Sum kh" in m.summary]
    for kernel in (4,):
        before = load(conv_transpose(kernel))
        y = _only(before, "split Sum kh by 2 into q, r").scope("Y")
        assert y.traversal == before.scope("Y").traversal
        assert [(it.name, it.lo, it.hi) for it in y.summation] == [("c", 0, 2), ("q", 0, 2), ("r", 0, 2)]
        assert "W[c, f, 2*q+r]" in str(y.body)


def test_merge_then_split_restores_the_iterators():
    rule = get(RULE)
    before = load(MATMUL)
    merged = _only(before, "merge i, j into z")
    outer = merged.scope("Y")
    assert _reads(outer) == ["4*i+j"]
    inner = _inner(outer)
    assert _ranges(inner) == [("z", 0, 12)]
    (m,) = [m for m in rule.matches(merged) if m.target is inner and m.summary == "split z by 4 into q, r"]
    after = rule.apply(merged, m)
    check_result(before, after)
    innermost = _inner(_inner(after.scope("Y")))
    assert _ranges(innermost) == [("q", 0, 3), ("r", 0, 4)]
    q, r = innermost.traversal
    i, j = before.scope("Y").traversal
    assert innermost.body is substitute_iters(before.scope("Y").body, {i: q, j: r})
    assert str(innermost.body) == "A[q, k] * B[k, r]"


def test_merge_with_offsets_reads_zero_based_positions():
    text = "L[i=-1:2, j=1:4] A[i+1, j-1] where A: [3, 3]"
    outer = _only(load(text), "merge i, j into z").scope("Y")
    assert _reads(outer) == ["3*i+j+2"]
    assert _ranges(_inner(outer)) == [("z", 0, 9)]


def test_outer_scope_keeps_the_pad():
    text = "L[i:4, j:3 | pad 1:1, 0:2] Sum[k:2] A[i+j, k] where A: [6, 2]"
    for m, after in apply_all(RULE, load(text)):
        assert after.scope("Y").pad == ((1, 1), (0, 2)), m
        assert after.scope("Y").traversal == load(text).scope("Y").traversal


def test_pure_reindexing_scope_is_left_alone():
    program = _only(load(FIG5_E2), "fuse h+r-1 into t (replaces h)")
    outer = program.scope("Y")
    assert all(m.target is not outer for m in get(RULE).match(program))


def test_summation_iterator_and_odd_coefficients_are_refused_not_matched():
    program = load("L[h:4, w:3] Sum[r:3] A[h+r-1, 2*w+h] * K[r] where A: [6, 10], K: [3]")
    found = [str(m) for m in get(RULE).match(program)]
    assert any("reads summation iterator r" in f for f in found)
    assert any("fuse 2*w+h into t (replaces h)" in f for f in found)
    assert any("coefficient 2 of w in 2*w+h" in f for f in found)


@settings(max_examples=80, deadline=None)
@given(contractions(max_sums=2))
def test_random_contractions(scope):
    applied = apply_all(RULE, as_program(scope))
    assert len(applied) <= 40


@st.composite
def strided_reads(draw) -> ir.Scope:
    """Reads through ``(a*x + b*s + c) // k`` and ``% k`` (ConvTranspose/Reshape-like) and dilations."""
    traversal = draw(iterators("ijl", 1, 2, 6))
    summation = draw(iterators("pq", 1, 1, 5))
    its = traversal + summation
    k = draw(st.integers(2, 3))
    e: ir.IndexExpr = ir.IConst(draw(st.integers(-1, 2)))
    for it in its:
        e = e + draw(st.sampled_from([1, -1, 2, 3])) * it
    a = ir.Tensor("A", (draw(st.integers(1, 4)), k))
    b = ir.Tensor("B", (draw(st.integers(1, 6)),))
    dil = draw(st.sampled_from([2, 3]))
    body = a[e // k, e % k] * b[summation[0] + dil * traversal[0]]
    return ir.Scope(traversal, summation, body)


@settings(max_examples=80, deadline=None)
@given(strided_reads())
def test_random_strided_reads(scope):
    apply_all(RULE, as_program(scope))


@settings(max_examples=25, deadline=None)
@given(st.one_of(contractions(max_sums=2), strided_reads()), st.data())
def test_two_steps_compose(scope, data):
    rule = get(RULE)
    before = as_program(scope)
    first = rule.matches(before)
    if not first:
        return
    middle = rule.apply(before, data.draw(st.sampled_from(first)))
    second = rule.matches(middle)
    if not second:
        return
    after = rule.apply(middle, data.draw(st.sampled_from(second)))
    check_result(before, after)


def test_reversing_a_flipped_kernel_tap_gives_a_correlation():
    program = load("L[o:4] Sum[k:3] X[o-k+1] * W[k] where X: [4], W: [3]")
    [(m, after)] = [(m, p) for m, p in apply_all("substitute_variables", program) if "reverse" in m.summary]
    assert m.summary == "reverse Sum k (k -> 2-k)"
    assert str(after.scope("Y").body) == "X[o+k-1] * W[-k+2]"


def test_splitting_a_sum_past_its_end_needs_a_finite_weight():
    assert_needs_finite(
        RULE,
        SPLIT_W,
        "W",
        (3,),
        "split Sum k by 2 into q, r",
        "the extra terms k in [5, 6) would not be zero (they are 0 only if W is finite",
    )


def test_a_flipped_tap_splits_into_blocks_read_forward():
    """``kh = 3 - (2*q + r)``: ONNX's ConvTranspose reads ``(h + 1 - kh) // 2``; the blocks read forward."""
    before = load(conv_transpose(4))
    [(m, after)] = [
        (m, p)
        for m, p in apply_all(RULE, before)
        if m.summary == "split Sum kh by 2 into q, r from its end (kh = -2*q-r+3)"
    ]
    assert get(RULE).variant(m) == "split_sum_flipped"
    y = after.scope("Y")
    assert [(it.name, it.lo, it.hi) for it in y.summation] == [("c", 0, 2), ("q", 0, 2), ("r", 0, 2)]
    assert "[n, c, q+(h+r)//2-1, (h+r)%2]" in str(y.body) and "W[c, f, -2*q-r+3]" in str(y.body)


def test_a_flipped_split_is_offered_only_for_a_flipped_tap():
    program = load("L[o:4] Sum[k:4] X[(o+k)//2] * W[k] where X: [4], W: [4]")
    assert not [m for m in get(RULE).matches(program) if "from its end" in m.summary]


def test_a_flipped_split_past_its_end_needs_a_finite_weight():
    # k = 6 - (2*q + r) for k in [1, 6): the block q = 0, r = 0 is k = 6, where X is read out of range
    # but W[6 // 2] = W[3] (read by no other term) is not.
    assert_needs_finite(
        RULE,
        "L[i:2] Sum[k=1:6] X[i, 5-k] * W[k//2] where X: [2, 5], W: [5]",
        "W",
        (3,),
        "split Sum k by 2 into q, r from its end",
        "the extra terms k in [6, 7) would not be zero (they are 0 only if W is finite",
    )
