"""tighten_boundary and relax_boundary, and the zero analysis they share (rules.boundary)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from rules_support import (
    Example,
    NearMiss,
    apply_all,
    as_program,
    assert_needs_finite,
    context,
    contractions,
    iterators,
    load,
    programs,
    weights,
)

from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.core.parser import parse
from einopt.core.rewrite import map_accesses
from einopt.rules import NO_CONTEXT, Context, get
from einopt.rules.boundary import is_zero, zero_at, zero_only_if_finite

from paper import fig5_texts

H, W, C, F = 6, 5, 3, 4
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
E5_TEXT, E6_TEXT = fig5_texts(H, W, C, F)[4:6]
E5, E6 = load(E5_TEXT), load(E6_TEXT)
# The padding reads (A out of range) multiply the weights: 0 only for finite weights.
K_E5, K_PADDED, W_RESIDUE, K_CONV5X5 = (
    weights(E5_TEXT, "K"),
    weights(INNER_PADDED, "K"),
    weights(RESIDUE, "W"),
    weights(CONV5X5, "K"),
)
# The sub-pixel phases of a stride-2 transposed convolution, output and taps split: only r1 = r
# reads the zero-insertion scope in range (a diagonal), for any weight with finite values.
PHASES = (
    "U = L[i:3, p:1] X[i]\n"
    "Y = L[q:3, r:2] Sum[q1:2, r1:2] U[q-q1+(r-r1)//2+1, (r-r1)%2] * W[2*q1+r1]\n"
    "return Y\nwhere X: [3], W: [4]"
)
# Small cases whose zero points are 0 only if the weight W is finite.
TIGHTEN_W = "L[i:2] Sum[k:4] X[k] * W[k] where X: [2], W: [4]"
RELAX_W = "L[i:2] Sum[k:2] X[k] * W[k+1] where X: [2], W: [5]"

EXAMPLES = {
    "tighten_boundary": [
        Example(E5_TEXT, K_E5, min_matches=2),
        Example(INNER_PADDED, K_PADDED, min_matches=2),
        Example(RESIDUE, W_RESIDUE),
        Example(NESTED_PADDED, min_matches=2),
        Example("L[i:3] Sum[k=-3:7] max(A[i, k], 0) + relu(B[k]) where A: [3, 4], B: [5]"),
        Example("T = L[i=-2:6] A[i]\nY = L[j:4] T[j] * 3\nreturn Y\nwhere A: [4]"),
        Example(TIGHTEN_W, weights(TIGHTEN_W, "W")),
        Example(PHASES, weights(PHASES, "W")),
    ],
    "relax_boundary": [
        # Fig. 6: the relaxed taps read K out of range and multiply the activation A.
        Example(CONV5X5, K_CONV5X5, min_matches=4, assumed_finite=frozenset({"A"})),
        Example(E6_TEXT, K_E5, min_matches=2),
        Example(NESTED_PADDED, min_matches=1),
        Example(RELAX_W, weights(RELAX_W, "W")),
    ],
}

NEAR_MISSES = {
    "tighten_boundary": [
        NearMiss(PADDED_OUTPUT, "Y is a program output; its shape is fixed"),
        NearMiss("L[i:3] Sum[k=-1:1] A[i, k+5] * B[k+5] where A: [3, 4], B: [4]", "every value of k gives 0"),
        NearMiss(E5_TEXT, "cannot drop t1 = -2: the body is 0 there only if K is finite"),
        NearMiss(TIGHTEN_W, "cannot drop k = 3: the body is 0 there only if W is finite"),
        # The same diagonal with W not known to be finite: 0 * W is not 0.
        NearMiss(PHASES, "only if W is finite"),
    ],
    "relax_boundary": [
        NearMiss(
            "L[i:3] Sum[k=1:6] A[i, k] + B[k] where A: [3, 9], B: [9]", "the body is not provably 0 at k = 0"
        ),
        NearMiss("L[i:3] A[i] where A: [4]", "Y is a program output; its shape is fixed"),
        # Relaxed kernel taps multiply the activation A by 0: not 0 where A is infinite.
        NearMiss(
            "L[h:4] Sum[r:3] A[h+r-1] * K[r] where A: [4], K: [3]",
            "the body is 0 at r = -1 only if A is finite; A is not a constant known to be finite",
            {"K": np.array([1.0, 2.0, 3.0])},
        ),
        # A constant with a NaN is not finite either.
        NearMiss(
            RELAX_W, "the body is 0 at k = -1 only if W is finite", {"W": np.array([1.0, 2, 3, np.nan, 1])}
        ),
    ],
}


def _only_match(name, program, choose="", ctx=NO_CONTEXT):
    found = [(m, p) for m, p in apply_all(name, program, ctx) if choose in m.summary]
    assert len(found) == 1, [str(m) for m, _ in found]
    return found[0]


def _nested(program):
    outer = program.scope("Y")
    (inner,) = [s for s in ir.scopes_in(outer) if s is not outer]
    return inner


def test_fig5_e5_tightens_to_e6():
    ctx = context(K_E5)
    step = _only_match("tighten_boundary", E5, "tighten t1", ctx)[1]
    assert [(it.lo, it.hi) for it in _nested(step).traversal[3:]] == [(0, H), (-2, W + 2)]
    final = _only_match("tighten_boundary", step, "tighten t2", ctx)[1]
    assert final is E6


def test_brief_e5_tightens_the_padded_inner_scope_to_the_input_range():
    program = load(INNER_PADDED)
    summaries = [m.summary for m, _ in apply_all("tighten_boundary", program, context(K_PADDED))]
    assert summaries == ["tighten t from [-1, 15) to [0, 14)", "tighten t1 from [-1, 15) to [0, 14)"]


def test_fig6_relaxes_conv5x5_to_conv6x6_only_for_a_finite_input():
    # The new taps multiply A by K read out of range: 0 only where A is finite.
    ctx = Context(K_CONV5X5, assumed_finite=frozenset({"A"}))
    without = get("relax_boundary").matches(load(CONV5X5), context(K_CONV5X5))
    assert not [m for m in without if m.summary.startswith(("relax r", "relax s"))]
    m, after = _only_match("relax_boundary", load(CONV5X5), "relax r from [0, 5) to [0, 6)", ctx)
    assert str(after.scope("Y")).startswith(
        "L[h:8, w:8, f:2] Sum[r:6, s:5, c:3] A[h+r-2, w+s-2, c] * K[f, c, r, s]"
    )
    both = _only_match("relax_boundary", after, "relax s from [0, 5) to [0, 6)", ctx)[1]
    assert both.scope("Y").summation == tuple(
        parse("L[x:1] Sum[r:6, s:6, c:3] A[r, s, c] where A: [6, 6, 3]").summation
    )


def test_relax_undoes_a_tightening_of_a_nested_scope():
    summaries = [m.summary for m, _ in apply_all("relax_boundary", E6, context(K_E5))]
    assert "relax t1 from [0, 6) to [-1, 7)" in summaries


def test_collapsed_summation_is_substituted():
    m, after = _only_match("tighten_boundary", load(RESIDUE), ctx=context(W_RESIDUE))
    assert m.summary == "tighten r from [0, 2) to [1, 2): Sum over r becomes r = 1"
    assert [it.name for it in after.scope("Y").summation] == ["q"]
    assert str(after.scope("Y").body) == "{L[i:4, p:1] X[i]}[o-q, 0] * W[2*q+1]"


def test_tightening_an_output_traversal_is_refused_but_a_bound_intermediate_is_tightened():
    assert not get("tighten_boundary").matches(load(PADDED_OUTPUT))
    program = load(f"T = {PADDED_OUTPUT.split(' where')[0]}\nY = L[j:6] T[j-1]\nreturn Y\nwhere A: [4]")
    m, after = _only_match("tighten_boundary", program)
    assert m.where == "T" and after.scope("T").shape == (4,)


def test_without_reasons_an_output_traversal_is_not_even_scanned(monkeypatch):
    """The search runs without reasons: an output's traversal is skipped before its values are
    scanned, and the matches are the same as with reasons (only the near miss is gone)."""
    import dataclasses

    import einopt.rules.boundary as boundary

    rule = get("tighten_boundary")
    program = load(
        f"Y = {NESTED_PADDED.split(' where')[0]}\nZ = L[z=-1:5] Y[z]\nreturn Y, Z\nwhere A: [4], B: [4, 6]"
    )
    quiet = dataclasses.replace(NO_CONTEXT, reasons=False)
    with_reasons = [str(m) for m in rule.match(program, NO_CONTEXT) if not hasattr(m, "reason")]
    scanned = []
    real = boundary.nonzero_span
    monkeypatch.setattr(
        boundary, "nonzero_span", lambda s, it, **kw: scanned.append(it.name) or real(s, it, **kw)
    )
    without = [str(m) for m in rule.match(program, quiet)]
    assert without == with_reasons and with_reasons
    assert "z" not in scanned and "i" not in scanned and "k" in scanned  # Z and Y are outputs


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


# --------------------------------------------------------------------------
# 0 * x is 0 only for a finite x: infinities and NaN in inputs not known finite
# --------------------------------------------------------------------------

_SPECIAL = np.array([np.inf, -np.inf, np.nan])


@st.composite
def special_bodies(draw):
    """Bodies multiplied by reads of a fourth tensor, functions of it and special constants, and
    which input tensors are known to be finite."""
    scope = draw(bodies())
    its = scope.traversal + scope.summation
    body = scope.body
    d = ir.Tensor("E", (draw(st.integers(1, 4)),))
    for _ in range(draw(st.integers(1, 2))):
        other = d[draw(st.sampled_from(its))]
        factor = draw(
            st.sampled_from(
                [
                    other,
                    ir.Unary("tanh", other),
                    ir.Unary("sqrt", other),
                    ir.Unary("leaky_relu", other, 0.1),
                    ir.Binary("max", other, ir.Const(1.0)),
                    other + other,
                    other * other,
                    ir.Const(float("inf")),
                    ir.Const(float("nan")),
                    ir.Const(3.0),
                ]
            )
        )
        body = ir.Binary("*", factor, body) if draw(st.booleans()) else ir.Binary("*", body, factor)
    scope = ir.Scope(scope.traversal, scope.summation, body)
    names = sorted(t.name for t in ir.input_tensors(scope))
    finite = frozenset(draw(st.lists(st.sampled_from(names), unique=True)))
    return scope, finite


def _special_inputs(scope, finite, seed=0):
    """Finite tensors hold normals; every other tensor holds only infinities and NaN."""
    rng = np.random.default_rng(seed)
    return {
        t.name: rng.standard_normal(t.shape) * 3 if t.name in finite else rng.choice(_SPECIAL, t.shape)
        for t in ir.input_tensors(scope)
    }


@settings(max_examples=150, deadline=None)
@given(special_bodies())
def test_zero_analysis_is_sound_with_infinities_and_nan(case):
    scope, finite = case
    known = context({}, finite).is_finite
    its = scope.traversal + scope.summation
    pointwise = evaluate(ir.Scope(its, (), scope.body), _special_inputs(scope, finite))
    if is_zero(scope.body, finite=known):
        assert (pointwise == 0).all(), f"claimed 0 but computed {pointwise}"
    for d, it in enumerate(its):
        for v in range(it.lo, it.hi):
            if zero_at(scope, it, v, known):
                assert (np.take(pointwise, v - it.lo, axis=d) == 0).all(), f"{it.name} = {v} claimed 0"


_PADDED_PRODUCT = "L[i:2] A[i+5] * B[i] where A: [4], B: [2]"
_FINITE_CASES = [
    # (body, tensors known finite, provably 0)
    (_PADDED_PRODUCT, (), False),
    (_PADDED_PRODUCT, ("B",), True),
    (_PADDED_PRODUCT, ("A",), False),  # A is the zero factor; B may be infinite
    ("L[i:2] A[i+5] * 3 where A: [4]", (), True),
    ("L[i:2] A[i+5] * inf where A: [4]", (), False),
    ("L[i:2] A[i+5] * nan where A: [4]", (), False),
    ("L[i:2] A[i+5] * A[i+6] where A: [4]", (), True),  # both factors 0, so both finite
    ("L[i:2] A[i+5] * tanh(B[i]) where A: [4], B: [2]", ("B",), True),
    ("L[i:2] A[i+5] * relu(max(B[i], -1)) where A: [4], B: [2]", ("B",), True),
    ("L[i:2] A[i+5] * leaky_relu(B[i], 0.5) where A: [4], B: [2]", ("B",), True),
    ("L[i:2] A[i+5] * leaky_relu(B[i], 3.0) where A: [4], B: [2]", ("B",), False),  # 3 * B may overflow
    ("L[i:2] A[i+5] * sqrt(B[i]) where A: [4], B: [2]", ("B",), False),  # sqrt(-1) is NaN
    ("L[i:2] A[i+5] * exp(B[i]) where A: [4], B: [2]", ("B",), False),  # overflows
    ("L[i:2] A[i+5] * (B[i] + B[i]) where A: [4], B: [2]", ("B",), False),  # may overflow
    ("L[i:2] A[i+5] * (B[i] * B[i]) where A: [4], B: [2]", ("B",), False),
    # A scope without summation over finite values is finite; with a summation it may overflow.
    ("L[i:2] A[i+5] * {L[j:2] relu(B[j])}[i] where A: [4], B: [2]", ("B",), True),
    ("L[i:2] A[i+5] * {L[j:2] Sum[k:2] B[k]}[i] where A: [4], B: [2]", ("B",), False),
    ("L[i:2] A[i+5] * {L[j:2] B[j] * 2}[i] where A: [4], B: [2]", ("B",), False),
    # The scope read is 0 where it is read: 0 * 0.
    ("L[i:2] A[i+5] * {L[j:4] B[j] * C[j]}[i+2] where A: [4], B: [2], C: [4]", ("C",), True),
    ("L[i:2] A[i+5] * {L[j:4] B[j] * C[j]}[i+2] where A: [4], B: [2], C: [4]", (), False),
]


def test_products_are_zero_only_with_finite_other_factors():
    for text, finite, zero in _FINITE_CASES:
        body = parse(text).body
        known = context({}, frozenset(finite)).is_finite
        assert is_zero(body, finite=known) is zero, (text, finite)


def test_context_knows_finite_constants_only():
    a, b, c, x = (ir.Tensor(n, (3,)) for n in "ABCX")
    ctx = Context({"A": np.ones(3), "B": np.array([1.0, np.inf, 0.0]), "C": np.array([np.nan, 1.0, 2.0])})
    assert [ctx.is_finite(t) for t in (a, b, c, x)] == [True, False, False, False]
    assert Context({}, assumed_finite=frozenset({"X"})).is_finite(x)
    # An assumption does not override a constant's actual values.
    assert not Context({"B": np.array([np.inf])}, assumed_finite=frozenset({"B"})).is_finite(b)


def test_what_is_missing_is_named():
    body = parse("L[i:2] Sum[k:2] A[i+5] * B[k] * C[i] where A: [4], B: [2], C: [2]").body
    assert [t.name for t in zero_only_if_finite(body)] == ["B", "C"]
    assert [t.name for t in zero_only_if_finite(body, finite=lambda t: t.name == "B")] == ["C"]
    assert zero_only_if_finite(body, finite=lambda t: t.name in "BC") == ()
    assert zero_only_if_finite(parse("L[i:2] A[i] * B[i] where A: [2], B: [2]").body) is None


def test_tighten_needs_a_finite_weight():
    assert_needs_finite(
        "tighten_boundary",
        TIGHTEN_W,
        "W",
        (3,),
        "tighten k from [0, 4) to [0, 2)",
        "cannot drop k = 3: the body is 0 there only if W is finite; W is not a constant known to be finite",
    )


def test_relax_needs_a_finite_weight():
    assert_needs_finite(
        "relax_boundary",
        RELAX_W,
        "W",
        (3,),
        "relax k from [0, 2) to [0, 3)",
        "the body is 0 at k = -1 only if W is finite; W is not a constant known to be finite",
    )


def test_fig5_tightening_needs_a_finite_kernel():
    assert_needs_finite(
        "tighten_boundary",
        E5_TEXT,
        "K",
        (0, 0, 0, 0),
        "tighten t1 from",
        "the body is 0 there only if K is finite",
    )


def test_diagonal_collapses_the_phase_taps():
    """r1 is substituted by r (every other tap reads the zero insertion out of range), and only then."""
    ctx = context(weights(PHASES, "W"))
    m, after = _only_match("tighten_boundary", load(PHASES), "diagonal", ctx)
    assert m.params["way"] == "diagonal" and m.params["partner"].name == "r"
    (y,) = [s for n, s in after.bindings if n == "Y"]
    assert [it.name for it in y.summation] == ["q1"] and "r1" not in str(y)
    assert get("tighten_boundary").variant(m) == "diagonal"


def test_diagonal_needs_one_live_value_per_partner_value():
    """Two live taps per output value (a plain stride-1 window) is no diagonal."""
    program = load("L[q:3] Sum[k:2] {L[i:3, p:1] X[i]}[q+k-1, 0] * W[k] where X: [3], W: [2]")
    ctx = context(weights("L[q:3] Sum[k:2] X[q+k-1] * W[k] where X: [3], W: [2]", "W"))
    assert not [m for m in get("tighten_boundary").matches(program, ctx) if m.params["way"] == "diagonal"]


# A stride-2 ConvTranspose's tap split from its end with the output not split: only r = h % 2
# reads the zero-insertion scope in range (a residue diagonal).
PHASE_RESIDUE = (
    "U = L[i:3, p:1] X[i]\n"
    "Y = L[h:6] Sum[q:2, r:2] U[q+(h+r)//2-1, (h+r)%2] * W[-2*q-r+3]\n"
    "return Y\nwhere X: [3], W: [4]"
)


def test_diagonal_by_residue_collapses_the_tap_residue_onto_the_output_parity():
    ctx = context(weights(PHASE_RESIDUE, "W"))
    program = load(PHASE_RESIDUE)
    found = [(m, p) for m, p in apply_all("tighten_boundary", program, ctx) if m.params["way"] == "diagonal"]
    [(m, after)] = found
    assert m.params["iterator"].name == "r" and str(m.params["value"]) == "h%2"
    y = after.scope("Y")
    assert [it.name for it in y.summation] == ["q"] and "W[-2*q-h%2+3]" in str(y.body)


def test_diagonal_by_residue_needs_a_finite_weight():
    assert_needs_finite(
        "tighten_boundary",
        PHASE_RESIDUE,
        "W",
        (3,),
        "nonzero only at r = h%2",
        "nonzero only at r = h%2 only if W is finite",
    )
