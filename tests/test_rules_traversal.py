"""merge_traversal: inline nested scopes by composing index functions (rules.traversal)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rules_support import (
    Example,
    NearMiss,
    affine_index,
    apply_all,
    as_program,
    assert_needs_finite,
    contractions,
    iterators,
    load,
    weights,
)

from einopt.core import ir
from einopt.rules import get

from paper import fig5_texts

H, W, C, F = 6, 5, 3, 4
INNER = "{L[r:3, s:3, t=-1:15, t1=-1:15, f:4] Sum[c:3] A[t, t1, c] * K[r, s, f, c]}"
WHERE = "where A: [14, 14, 3], K: [3, 3, 4, 3]"
# Fig. 5 E4 as the brief writes it; inlining the middle scope gives E5.
BRIEF_E4 = f"L[h:14, w:14, f:4] Sum[r:3, s:3] {{L[r:3, s:3, h:14, w:14, f:4] {INNER}[r, s, h+r-1, w+s-1, f]}}[r, s, h, w, f] {WHERE}"
BRIEF_E5 = f"L[h:14, w:14, f:4] Sum[r:3, s:3] {INNER}[r, s, h+r-1, w+s-1, f] {WHERE}"
# A ConvTranspose residue part reading the zero-insertion scope U at remainder 0.
CONV_T = (
    "L[n:1, f:2, o:4] Sum[c:2, kk:2] {L[n:1, c:2, i:4, p:1] X[n, c, i]}[n, c, o+1-kk, 0] * W[c, f, 2*kk]"
    " where X: [1, 2, 4], W: [2, 2, 3]"
)
STRIDED = (
    "L[n:1, f:2, o:8] Sum[c:2, k:3] {L[n:1, c:2, i:4, p:1] X[n, c, i]}[n, c, (o+1-k)//2, (o+1-k)%2] * W[c, f, k]"
    " where X: [1, 2, 4], W: [2, 2, 3]"
)
SUMMING = "{L[i:3, j:4] Sum[k:5] A[i, k] * B[k, j]}"
# Read past the inner box, where X is out of range but W is not: 0 there only for a finite W.
PAST_BOX = "L[i:6] {L[j:4] X[j] * W[j]}[i-1] where X: [4], W: [6]"
SUMS_ABC = "where A: [3, 5], B: [5, 4], C: [4, 2]"

EXAMPLES = {
    "merge_traversal": [
        Example(fig5_texts(H, W, C, F)[2], min_matches=2),
        Example(BRIEF_E4, min_matches=2),
        Example(CONV_T),
        # Fig. 4: a matmul scope as a factor of the outer product; k is renamed away.
        Example(f"L[i:3, j:2] Sum[k:4] {SUMMING}[i, k] * C[k, j] {SUMS_ABC}"),
        Example("L[i:4] {L[j:4] A[j] * 2}[i] + relu({L[j:4] A[j] * 2}[3-i]) where A: [4]", min_matches=1),
        Example("L[i:6] sigmoid({L[j=-1:5] A[j]}[i-1]) where A: [4]"),
        Example(PAST_BOX, weights(PAST_BOX, "W")),
    ],
}

NEAR_MISSES = {
    "merge_traversal": [
        NearMiss(f"L[i:3, j:4] relu({SUMMING}[i, j]) {SUMS_ABC}", "it is read under relu"),
        NearMiss(f"L[i:3, j:4] {SUMMING}[i, j] + A[i, j] {SUMS_ABC}", "it is read under +"),
        NearMiss(f"L[i:3, j:4] {SUMMING}[i, j] * {SUMMING}[i, j] {SUMS_ABC}", "it is read 2 times"),
        NearMiss("L[i:6] {L[j:4] A[j] + 1}[i-1] where A: [4]", "outside [0, 4), where Y.1 is not provably 0"),
        NearMiss(STRIDED, "reads Y.1 at (o+1-k)%2 in [0, 1], outside [0, 1)"),
        NearMiss(PAST_BOX, "outside [0, 4), where Y.1 is 0 only if W is finite; W is not a constant"),
    ],
}


def test_fig5_e3_merges_to_e4():
    e3, e4 = (load(t) for t in fig5_texts(H, W, C, F)[2:4])
    found = {m.where: p for m, p in apply_all("merge_traversal", e3)}
    assert found["Y"] is e4


def test_brief_e4_merges_to_e5():
    m, after = next((m, p) for m, p in apply_all("merge_traversal", load(BRIEF_E4)) if m.where == "Y")
    assert m.summary == "inline Y.2 read at [r, s, h, w, f]"
    assert after is load(BRIEF_E5)


def test_conv_transpose_zero_insertion_scope_inlines():
    [(m, after)] = apply_all("merge_traversal", load(CONV_T))
    assert str(after.scope("Y").body) == "X[n, c, o-kk+1] * W[c, f, 2*kk]"


def test_summing_scope_joins_the_outer_summation_with_fresh_names():
    program = load(f"L[i:3, j:2] Sum[k:4] {SUMMING}[i, k] * C[k, j] {SUMS_ABC}")
    [(m, after)] = apply_all("merge_traversal", program)
    y = after.scope("Y")
    assert [it.name for it in y.summation] == ["k", "k1"]
    assert str(y.body) == "A[i, k1] * B[k1, k] * C[k, j]"


def test_reading_a_bound_scope_is_left_to_fusion():
    program = load("P = L[j:4] A[j] * 2\nY = L[i:4] P[i]\nreturn Y\nwhere A: [4]")
    assert list(get("merge_traversal").match(program)) == []


# --------------------------------------------------------------------------
# Random two-scope programs: a producer scope read by a consumer
# --------------------------------------------------------------------------


@st.composite
def nested_reads(draw, max_sums: int = 2) -> ir.Scope:
    """A random contraction read (at random affine indices) by a consumer of a random form."""
    inner = draw(contractions(max_sums=max_sums))
    traversal = draw(iterators("ijk", 1, 2))
    summation = draw(iterators("pq", 0, 1, 3))
    its = traversal + summation
    read = inner[tuple(draw(affine_index(its)) for _ in inner.traversal)]
    other = ir.Tensor("C", (4,))[draw(st.sampled_from(its))]
    body = draw(
        st.sampled_from(
            [read, read * other, ir.Unary("relu", read), read + other, other * (read * ir.Const(2.0))]
        )
    )
    return ir.Scope(traversal, summation, body)


@settings(max_examples=80, deadline=None)
@given(nested_reads())
def test_random_nested_reads(scope):
    program = as_program(scope)
    for m in get("merge_traversal").match(program):
        assert m.where == "Y"
    apply_all("merge_traversal", program)


def test_inlining_past_the_box_needs_a_finite_weight():
    assert_needs_finite(
        "merge_traversal",
        PAST_BOX,
        "W",
        (4,),
        "inline Y.1 read at [i-1]",
        "reads Y.1 at i-1 in [-1, 4], outside [0, 4), where Y.1 is 0 only if W is finite",
    )


def test_occurrences_count_every_use_of_a_shared_subterm():
    from einopt.rules.traversal import _occurrences

    i = ir.Iter("i", 0, 4)
    a, b = ir.Tensor("a", (4,))[i], ir.Tensor("b", (4,))[i]
    shared = a * b + a  # a twice here
    body = shared * shared - b  # shared twice: a four times, b three times
    assert _occurrences(body, a) == 4 and _occurrences(body, b) == 3
    assert _occurrences(shared, a) == 2 and _occurrences(a, a) == 1 and _occurrences(b, a) == 0
