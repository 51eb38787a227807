"""tighten_boundary and relax_boundary, and the zero analysis they share (rules.boundary)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from rules_support import Example, NearMiss, apply_all, as_program, contractions, iterators, load, programs

from einopt import ir
from einopt.interp import evaluate
from einopt.parser import parse
from einopt.rewrite import map_accesses
from einopt.rules import get
from einopt.rules.boundary import is_zero, zero_at

from paper import fig5_texts

H, W, C, F = 6, 5, 3, 4
E4, E5, E6 = (load(t) for t in fig5_texts(H, W, C, F)[3:6])
# Fig. 5 E5 as the brief writes it: the inner scope laid out (r, s, t, t1, f).
INNER_PADDED = (
    "L[h:14, w:14, f:4] Sum[r:3, s:3] {L[r:3, s:3, t=-1:15, t1=-1:15, f:4] Sum[c:3] A[t, t1, c] * K[r, s, f, c]}"
    "[r, s, h+r-1, w+s-1, f] where A: [14, 14, 3], K: [3, 3, 4, 3]"
)
CONV5X5 = "L[h:8, w:8, f:2] Sum[r:5, s:5, c:3] A[h+r-2, w+s-2, c] * K[f, c, r, s] where A: [8, 8, 3], K: [2, 3, 5, 5]"
# A residue part of a strided ConvTranspose: only r = 1 reads the zero-insertion scope in range.
RESIDUE = "L[o:4] Sum[q:2, r:2] {L[i:4, p:1] X[i]}[o-q, (1-r)%2] * W[2*q+r] where X: [4], W: [4]"
PADDED_OUTPUT = "L[i=-1:5] A[i] where A: [4]"
NESTED_PADDED = "L[i:4] Sum[k=-2:6] {L[j=-1:5] A[j] * 2}[k] * B[i, k] where A: [4], B: [4, 6]"

EXAMPLES = {
    "tighten_boundary": [
        Example(fig5_texts(H, W, C, F)[4], min_matches=2),
        Example(INNER_PADDED, min_matches=2),
        Example(RESIDUE),
        Example(NESTED_PADDED, min_matches=2),
        Example("L[i:3] Sum[k=-3:7] max(A[i, k], 0) + relu(B[k]) where A: [3, 4], B: [5]"),
        Example("T = L[i=-2:6] A[i]\nY = L[j:4] T[j] * 3\nreturn Y\nwhere A: [4]"),
    ],
    "relax_boundary": [
        Example(CONV5X5, min_matches=4),
        Example(fig5_texts(H, W, C, F)[5], min_matches=2),
        Example(NESTED_PADDED, min_matches=1),
    ],
}

NEAR_MISSES = {
    "tighten_boundary": [
        NearMiss(PADDED_OUTPUT, "Y is a program output; its shape is fixed"),
        NearMiss("L[i:3] Sum[k=-1:1] A[i, k] * B[k+5] where A: [3, 4], B: [4]", "every value of k gives 0"),
    ],
    "relax_boundary": [
        NearMiss(
            "L[i:3] Sum[k=1:6] A[i, k] + B[k] where A: [3, 9], B: [9]", "the body is not provably 0 at k = 0"
        ),
        NearMiss("L[i:3] A[i] where A: [4]", "Y is a program output; its shape is fixed"),
    ],
}


def _only_match(name, program, choose=""):
    found = [(m, p) for m, p in apply_all(name, program) if choose in m.summary]
    assert len(found) == 1, [str(m) for m, _ in found]
    return found[0]


def _nested(program):
    outer = program.scope("Y")
    (inner,) = [s for s in ir.scopes_in(outer) if s is not outer]
    return inner


def test_fig5_e5_tightens_to_e6():
    step = _only_match("tighten_boundary", E5, "tighten t1")[1]
    assert [(it.lo, it.hi) for it in _nested(step).traversal[3:]] == [(0, H), (-2, W + 2)]
    final = _only_match("tighten_boundary", step, "tighten t2")[1]
    assert final is E6


def test_brief_e5_tightens_the_padded_inner_scope_to_the_input_range():
    program = load(INNER_PADDED)
    summaries = [m.summary for m, _ in apply_all("tighten_boundary", program)]
    assert summaries == ["tighten t from [-1, 15) to [0, 14)", "tighten t1 from [-1, 15) to [0, 14)"]


def test_fig6_relaxes_conv5x5_to_conv6x6():
    m, after = _only_match("relax_boundary", load(CONV5X5), "relax r from [0, 5) to [0, 6)")
    assert str(after.scope("Y")).startswith(
        "L[h:8, w:8, f:2] Sum[r:6, s:5, c:3] A[h+r-2, w+s-2, c] * K[f, c, r, s]"
    )
    both = _only_match("relax_boundary", after, "relax s from [0, 5) to [0, 6)")[1]
    assert both.scope("Y").summation == tuple(
        parse("L[x:1] Sum[r:6, s:6, c:3] A[r, s, c] where A: [6, 6, 3]").summation
    )


def test_relax_undoes_a_tightening_of_a_nested_scope():
    summaries = [m.summary for m, _ in apply_all("relax_boundary", E6)]
    assert "relax t1 from [0, 6) to [-1, 7)" in summaries


def test_collapsed_summation_is_substituted():
    m, after = _only_match("tighten_boundary", load(RESIDUE))
    assert m.summary == "tighten r from [0, 2) to [1, 2): Sum over r becomes r = 1"
    assert [it.name for it in after.scope("Y").summation] == ["q"]
    assert str(after.scope("Y").body) == "{L[i:4, p:1] X[i]}[o-q, 0] * W[2*q+1]"


def test_tightening_an_output_traversal_is_refused_but_a_bound_intermediate_is_tightened():
    assert not get("tighten_boundary").matches(load(PADDED_OUTPUT))
    program = load(f"T = {PADDED_OUTPUT.split(' where')[0]}\nY = L[j:6] T[j-1]\nreturn Y\nwhere A: [4]")
    m, after = _only_match("tighten_boundary", program)
    assert m.where == "T" and after.scope("T").shape == (4,)


def test_scope_without_zero_points_is_not_a_candidate():
    program = load("L[i:3, j:4] Sum[k:5] A[i, k] * B[k, j] where A: [3, 5], B: [5, 4]")
    assert list(get("tighten_boundary").match(program)) == []


# --------------------------------------------------------------------------
# The zero analysis never claims 0 where the interpreter computes non-zero
# --------------------------------------------------------------------------

_WRAPS = ("none", "relu", "sigmoid", "neg", "max0", "plus", "minus", "times_const", "abs")


@st.composite
def bodies(draw):
    """Contractions with their body wrapped in zero-preserving and non-zero-preserving operations."""
    scope = draw(contractions(max_sums=2))
    body = scope.body
    if draw(st.booleans()):
        # Read A through a scope over a random box that is not 0 outside A (``+ 1``) or is (``* 2``).
        (a,) = [t for t in ir.input_tensors(scope) if t.name == "A"]
        box = draw(iterators("xyz", a.rank, a.rank))
        inner = ir.Scope(box, (), draw(st.sampled_from([a[box] + 1.0, a[box] * 2.0])))
        body = map_accesses(body, lambda acc: inner[acc.indices] if acc.source is a else acc)
    its = scope.traversal + scope.summation
    d = ir.Tensor("D", (draw(st.integers(1, 4)),))
    for _ in range(draw(st.integers(0, 2))):
        wrap = draw(st.sampled_from(_WRAPS))
        other = d[draw(st.sampled_from(its))]
        body = {
            "none": body,
            "relu": ir.Unary("relu", body),
            "sigmoid": ir.Unary("sigmoid", body),
            "neg": ir.Unary("neg", body),
            "abs": ir.Unary("abs", body),
            "max0": ir.Binary("max", body, ir.Const(0.0)),
            "plus": ir.Binary("+", body, other),
            "minus": ir.Binary("-", other, body),
            "times_const": ir.Binary("*", body, ir.Const(draw(st.sampled_from([0.0, 2.0])))),
        }[wrap]
    return ir.Scope(scope.traversal, scope.summation, body)


def _inputs(scope, seed=0):
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape) + 3.0 for t in ir.input_tensors(scope)}


@settings(max_examples=80, deadline=None)
@given(bodies())
def test_zero_analysis_is_sound(scope):
    inputs = _inputs(scope)
    # Every iterator as a traversal iterator: the value at each point of the iteration space.
    its = scope.traversal + scope.summation
    pointwise = evaluate(ir.Scope(its, (), scope.body), inputs)
    if is_zero(scope.body):
        assert not pointwise.any()
    for d, it in enumerate(its):
        for v in range(it.lo, it.hi):
            if zero_at(scope, it, v):
                assert not np.take(pointwise, v - it.lo, axis=d).any(), f"{it.name} = {v} claimed 0"


def test_zero_analysis_looks_into_nested_scopes():
    inner = "{L[j=-1:5] A[j] * 2}"
    scope = parse(f"L[i:2] {inner}[i+4] + {inner}[i-3] where A: [4]")
    assert is_zero(scope.body)
    assert not is_zero(parse(f"L[i:2] {inner}[i+3] where A: [4]").body)
    assert not is_zero(parse("L[i:2] sigmoid(A[i+7]) where A: [4]").body)


@settings(max_examples=60, deadline=None)
@given(programs(max_sums=2))
def test_random_contractions(program):
    apply_all("tighten_boundary", program)
    apply_all("relax_boundary", program)


@settings(max_examples=40, deadline=None)
@given(bodies())
def test_random_nested_bodies(scope):
    # The scope as an intermediate read by an output, so traversal ranges may change too.
    reads = tuple(ir.Iter(f"x{d}", it.lo - 1, it.hi + 1) for d, it in enumerate(scope.traversal))
    outer = ir.Scope(reads, (), scope[reads])
    program = as_program(outer)
    apply_all("tighten_boundary", program)
    apply_all("relax_boundary", program)
