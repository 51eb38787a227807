"""Constant-aware rules: PRelu as max/min or leaky ReLU, and folding a channel scale into weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rules_support import Example, NearMiss, affine_index, apply_all, as_program, context, iterators, load

from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.rules import Apply, derive, get

PRELU = "L[n:2, c:3, h:4] max(X[n, c, h], 0) + A[c] * min(X[n, c, h], 0) where X: [2, 3, 4], A: [3]"
# The same form with every operand order flipped.
PRELU_COMMUTED = "L[n:2, c:3, h:4] min(0, X[n, c, h]) * A[c] + max(0, X[n, c, h]) where X: [2, 3, 4], A: [3]"
PRELU_CONST = "L[i:5] max(X[i], 0) + 0.2 * min(X[i], 0) where X: [5]"

# FSRCNN: a 1x1 convolution followed by a PRelu with one slope per output channel.
FSRCNN = """Y = L[n:1, f:4, h:5, w:5] Sum[c:3] X[n, c, h, w] * W[f, c, 0, 0]
Z = L[n:1, f:4, h:5, w:5] max(Y[n, f, h, w], 0) + A[f, 0, 0] * min(Y[n, f, h, w], 0)
return Z
where X: [1, 3, 5, 5], W: [4, 3, 1, 1], A: [4, 1, 1]"""
FSRCNN_MAX = """Y = L[n:1, f:4, h:5, w:5] Sum[c:3] X[n, c, h, w] * W[f, c, 0, 0]
Z = L[n:1, f:4, h:5, w:5] max(Y[n, f, h, w], {scaled})
return Z
where X: [1, 3, 5, 5], W: [4, 3, 1, 1], A: [4, 1, 1]"""

_RNG = np.random.default_rng(7)
W_INT = _RNG.integers(-3, 4, (4, 3, 1, 1)).astype(np.float64)
A_INT = np.array([2.0, -1.0, 3.0, 0.0]).reshape(4, 1, 1)
A_UNIT = np.array([0.25, 0.0, 1.0, 0.5]).reshape(4, 1, 1)

SLOPES_UNIT = {"A": np.array([0.25, 0.0, 1.0])}
SLOPES_NEGATIVE = {"A": np.array([-0.5, 0.3, -2.0])}
SLOPES_STEEP = {"A": np.array([1.0, 1.5, 3.0])}
SLOPES_MIXED = {"A": np.array([0.2, 1.5, 0.7])}
SLOPES_UNIFORM = {"A": np.full(3, 0.2)}

# FSRCNN's convolution with its bias, inlined into the PRelu (what fuse_expressions makes of the two).
FSRCNN_BIASED = """Z = L[n:1, f:4, h:5, w:5] max({CONV}[n, f, h, w] + B[f], 0) + A[f, 0, 0] * min({CONV}[n, f, h, w] + B[f], 0)
return Z
where X: [1, 3, 5, 5], W: [4, 3, 1, 1], A: [4, 1, 1], B: [4]""".replace(
    "{CONV}", "{L[n2:1, f2:4, h2:5, w2:5] Sum[c:3] X[n2, c, h2, w2] * W[f2, c, 0, 0]}"
)
B_INT = np.array([1.0, -2.0, 0.0, 3.0])

MATMUL_SCALE = (
    "L[i:3, j:4] {L[i2:3, j2:4] Sum[k:5] X[i2, k] * V[k, j2]}[i, j] * B[j] where X: [3, 5], V: [5, 4], B: [4]"
)

# Both PRelu forms apply to slopes on one side of 1 (both sides when every slope is 1), either order.
PRELU_EXAMPLES = [
    Example(PRELU, SLOPES_UNIT),
    Example(PRELU, SLOPES_NEGATIVE),
    Example(PRELU_COMMUTED, SLOPES_UNIT),
    Example(PRELU, SLOPES_STEEP),
    Example(PRELU_CONST),
    Example(PRELU, {"A": np.ones(3)}, min_matches=2),
]

EXAMPLES = {
    "rewrite_prelu_max": [
        *PRELU_EXAMPLES,
        Example(FSRCNN, {"W": W_INT, "A": A_UNIT}),
    ],
    "rewrite_prelu_relu": [
        *PRELU_EXAMPLES,
        Example(FSRCNN_BIASED, {"W": W_INT, "A": A_UNIT, "B": B_INT}),
    ],
    "rewrite_prelu_leaky": [
        Example(PRELU, SLOPES_UNIFORM),
        Example(PRELU_COMMUTED, {"A": np.full(3, -0.5)}),
        Example(PRELU_CONST),
    ],
    "fold_channel_scale": [
        Example(FSRCNN_MAX.format(scaled="A[f, 0, 0] * Y[n, f, h, w]"), {"W": W_INT, "A": A_INT}),
        Example(FSRCNN_MAX.format(scaled="Y[n, f, h, w] * A[f, 0, 0]"), {"W": W_INT, "A": A_INT}),
        Example(MATMUL_SCALE, {"V": _RNG.integers(-3, 4, (5, 4)).astype(np.float64), "B": np.arange(4.0)}),
        # An expression of constants as the scale, and a constant bias added to the scaled read.
        Example(FSRCNN_MAX.format(scaled="(1 - A[f, 0, 0]) * Y[n, f, h, w]"), {"W": W_INT, "A": A_INT}),
        Example(
            "L[n:1, f:4, h:5, w:5] A[f, 0, 0] * ({L[n2:1, f2:4, h2:5, w2:5] Sum[c:3] "
            "X[n2, c, h2, w2] * W[f2, c, 0, 0]}[n, f, h, w] + B[f]) "
            "where X: [1, 3, 5, 5], W: [4, 3, 1, 1], A: [4, 1, 1], B: [4]",
            {"W": W_INT, "A": A_INT, "B": B_INT},
        ),
    ],
}

NEAR_MISSES = {
    "rewrite_prelu_max": [
        NearMiss(PRELU, "slope tensor A has values up to 1.5 > 1", SLOPES_MIXED),
        NearMiss(PRELU, "slope A is not a constant"),
        # Slopes >= 1 but some reads fall outside A and give 0 < 1.
        NearMiss(
            "L[c:4] max(X[c], 0) + A[c] * min(X[c], 0) where X: [4], A: [3]",
            "reads outside it give 0",
            SLOPES_STEEP,
        ),
    ],
    "rewrite_prelu_relu": [
        NearMiss(PRELU, "the ReLU's scale 1 - a changes sign", SLOPES_MIXED),
        NearMiss(PRELU, "slope A is not a constant"),
    ],
    "rewrite_prelu_leaky": [
        NearMiss(
            PRELU,
            "slopes are not all equal: slope tensor A has values in [-0.5, 1.5]",
            {"A": np.array([-0.5, 1.5, 1.0])},
        ),
        NearMiss(PRELU, "slope A is not a constant"),
    ],
    "fold_channel_scale": [
        NearMiss(
            FSRCNN_MAX.format(scaled="A[f, 0, 0] * Y[n, f, h, w]"),
            "operands X, W of the scope scaled by A[f, 0, 0] are not constant",
            {"A": A_INT},
        ),
        NearMiss(
            FSRCNN_MAX.format(scaled="A[h, 0, 0] * Y[n, f, h+1, w]"),
            "scale index h of A[h, 0, 0] is not an index of the scaled read",
            {"W": W_INT, "A": A_INT},
        ),
        NearMiss(
            "L[f:4, h:2] A[f] * {L[f2:4, h2:2] Sum[c:3] X[c, h2] * W[c, 2*f2]}[f, h] "
            "where X: [3, 2], W: [3, 8], A: [4]",
            "iterator f2 of the scaled scope is not a plain index of W[c, 2*f2]",
            {"W": np.ones((3, 8)), "A": np.ones(4)},
        ),
        NearMiss(
            "L[f:4, h:2] A[f] * {L[f2:4, h2:2] Sum[c:3] X[c, h2] * W[c, f2] + B[f2]}[f, h] "
            "where X: [3, 2], W: [3, 4], A: [4], B: [4]",
            "is not a product",
            {"W": np.ones((3, 4)), "A": np.ones(4), "B": np.ones(4)},
        ),
    ],
}


# --------------------------------------------------------------------------
# PRelu
# --------------------------------------------------------------------------


def _prelu_reference(x: np.ndarray, a: np.ndarray) -> np.ndarray:
    return np.where(x >= 0, x, a[None, :, None] * x)


@pytest.mark.parametrize(
    "slopes", [SLOPES_UNIT, SLOPES_NEGATIVE, SLOPES_STEEP], ids=["unit", "negative", "steep"]
)
def test_prelu_as_max_or_min_equals_prelu_on_both_signs(slopes):
    program = load(PRELU)
    ctx = context(slopes)
    [(m, after)] = apply_all("rewrite_prelu_max", program, ctx)
    op = "min" if slopes is SLOPES_STEEP else "max"
    assert str(after.scope("Y").body) == f"{op}(X[n, c, h], A[c] * X[n, c, h])"
    x = np.linspace(-3.0, 3.0, 24).reshape(2, 3, 4)  # both signs and zero-adjacent values
    assert (x < 0).any() and (x > 0).any()
    inputs = {"X": x, **slopes}
    want = _prelu_reference(x, slopes["A"])
    for p in (program, after):
        np.testing.assert_allclose(evaluate(p, inputs)["Y"], want, rtol=0, atol=1e-15)


def test_negative_slopes_are_at_most_one_so_max_applies():
    [m] = get("rewrite_prelu_max").matches(load(PRELU), context(SLOPES_NEGATIVE))
    assert m["op"] == "max" and "[-2, 0.3]" in m.summary


def test_mixed_slopes_refuse_both_forms():
    rule = get("rewrite_prelu_max")
    program = load(PRELU)
    assert rule.matches(program, context(SLOPES_MIXED)) == []
    [f] = rule.failures(program, context(SLOPES_MIXED))
    assert "up to 1.5 > 1 and down to 0.2 < 1" in f.reason


@pytest.mark.parametrize(
    "slopes, body",
    [
        (SLOPES_UNIT, "A[c] * X[n, c, h] + relu((1.0 - A[c]) * X[n, c, h])"),
        (SLOPES_NEGATIVE, "A[c] * X[n, c, h] + relu((1.0 - A[c]) * X[n, c, h])"),
        (SLOPES_STEEP, "A[c] * X[n, c, h] - relu((A[c] - 1.0) * X[n, c, h])"),
    ],
    ids=["unit", "negative", "steep"],
)
def test_prelu_as_scale_plus_relu_equals_prelu_on_both_signs(slopes, body):
    program = load(PRELU)
    [(m, after)] = apply_all("rewrite_prelu_relu", program, context(slopes))
    assert str(after.scope("Y").body) == body
    x = np.linspace(-3.0, 3.0, 24).reshape(2, 3, 4)
    got = evaluate(after, {"X": x, **slopes})["Y"]
    np.testing.assert_allclose(got, _prelu_reference(x, slopes["A"]), rtol=0, atol=1e-14)


def test_mixed_slopes_refuse_the_relu_form():
    [f] = get("rewrite_prelu_relu").failures(load(PRELU), context(SLOPES_MIXED))
    assert "values up to 1.5 > 1 and down to 0.2 < 1" in f.reason


def test_uniform_slope_becomes_leaky_relu():
    [(m, after)] = apply_all("rewrite_prelu_leaky", load(PRELU), context(SLOPES_UNIFORM))
    assert after.scope("Y").body is ir.Unary("leaky_relu", load(PRELU).scope("Y").body.a.a, 0.2)
    x = np.linspace(-2.0, 2.0, 24).reshape(2, 3, 4)
    got = evaluate(after, {"X": x, **SLOPES_UNIFORM})["Y"]
    np.testing.assert_allclose(got, np.where(x > 0, x, 0.2 * x))


def test_leaky_relu_with_uniform_slope_read_out_of_range_is_refused():
    text = "L[c:4] max(X[c], 0) + A[c] * min(X[c], 0) where X: [4], A: [3]"
    assert get("rewrite_prelu_leaky").matches(load(text), context(SLOPES_UNIFORM)) == []


def test_prelu_inside_a_larger_body_is_found():
    text = "L[c:3] relu(max(X[c], 0) + A[c] * min(X[c], 0)) + X[c] where X: [3], A: [3]"
    [(m, after)] = apply_all("rewrite_prelu_max", load(text), context(SLOPES_UNIT))
    assert str(after.scope("Y").body) == "relu(max(X[c], A[c] * X[c])) + X[c]"


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 4),
    slopes=st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.25, 1.0, 1.5, 4.0]), min_size=1, max_size=4),
    flip=st.booleans(),
)
def test_random_prelu_slopes(n, slopes, flip):
    c = len(slopes)
    text = (PRELU_COMMUTED if flip else PRELU).replace("c:3", f"c:{c}").replace("n:2", f"n:{n}")
    text = text.replace("X: [2, 3, 4], A: [3]", f"X: [{n}, {c}, 4], A: [{c}]")
    ctx = context({"A": np.array(slopes)})
    program = load(text)
    forms = {m["op"] for m, _ in apply_all("rewrite_prelu_max", program, ctx)}
    assert ("max" in forms) == (max(slopes) <= 1) and ("min" in forms) == (min(slopes) >= 1)
    leaky = apply_all("rewrite_prelu_leaky", program, ctx)
    assert bool(leaky) == (len(set(slopes)) == 1)


# --------------------------------------------------------------------------
# Folding a channel scale
# --------------------------------------------------------------------------


def test_fsrcnn_prelu_becomes_max_of_two_convolutions():
    ctx = context({"W": W_INT, "A": A_UNIT})
    trace = derive(load(FSRCNN), ["rewrite_prelu_max", "fold_channel_scale"], ctx)
    z = trace.result.scope("Z")
    y = trace.result.scope("Y")
    assert isinstance(z.body, ir.Binary) and z.body.op == "max"
    assert z.body.a is y[z.traversal]
    y2 = z.body.b.source
    assert y2.traversal == y.traversal and y2.summation == y.summation
    assert (
        str(y2.body) == "X[n, c, h, w] * {L[i:4, i1:3, i2:1, i3:1] A[i, 0, 0] * W[i, i1, i2, i3]}[f, c, 0, 0]"
    )
    # Numerically: the scaled weights are A * W.
    x = np.random.default_rng(0).standard_normal((1, 3, 5, 5))
    inputs = {"X": x, "W": W_INT, "A": A_UNIT}
    conv = np.einsum("nchw,fc->nfhw", x, W_INT[:, :, 0, 0])
    want = np.where(conv >= 0, conv, A_UNIT[None] * conv)
    np.testing.assert_allclose(evaluate(trace.result, inputs)["Z"], want, rtol=1e-12)


def test_fsrcnn_prelu_becomes_two_convolutions_and_a_relu():
    """conv(x, W) + b under PRelu -> conv(x, a*W) + a*b + relu(conv(x, (1-a)*W) + (1-a)*b)."""
    consts = {"W": W_INT, "A": A_UNIT, "B": B_INT}
    ctx = context(consts)
    steps = [
        "rewrite_prelu_relu",
        Apply("fold_channel_scale", choose="fold A[f, 0, 0] into"),
        "fold_channel_scale",
    ]
    trace = derive(load(FSRCNN_BIASED), steps, ctx)
    body = trace.result.scope("Z").body
    assert isinstance(body, ir.Binary) and body.op == "+"
    convs = [s for s in ir.scopes_in(trace.result) if s.summation]
    assert len(convs) == 2  # each reads scaled weights: no scale is left on a convolution's result
    assert "relu({L" in str(body) and "(1.0 - A[f, 0, 0]) * B[f]" in str(body)
    x = np.random.default_rng(1).standard_normal((1, 3, 5, 5))
    conv = np.einsum("nchw,fc->nfhw", x, W_INT[:, :, 0, 0]) + B_INT[None, :, None, None]
    want = np.where(conv >= 0, conv, A_UNIT[None] * conv)
    np.testing.assert_allclose(evaluate(trace.result, {"X": x, **consts})["Z"], want, rtol=1e-12)


def test_scale_reading_a_constant_index_keeps_it():
    text = (
        "L[i:3, j:4] C[0, j] * {L[i2:3, j2:4] Sum[k:5] X[i2, k] * V[k, j2]}[i, j] "
        "where X: [3, 5], V: [5, 4], C: [2, 4]"
    )
    ctx = context({"V": np.ones((5, 4)), "C": np.arange(8.0).reshape(2, 4)})
    [(m, after)] = apply_all("fold_channel_scale", load(text), ctx)
    [(read, dims)] = m["dims"]
    assert str(read) == "C[0, j]" and dims == (None, 1)
    assert "{L[i:5, i1:4] C[0, i1] * V[i, i1]}[k, j2]" in str(after)


def test_squared_weight_is_scaled_once():
    text = "L[f:3] A[f] * {L[g:3] Sum[c:2] W[g, c] * W[g, c]}[f] where W: [3, 2], A: [3]"
    ctx = context({"W": np.arange(6.0).reshape(3, 2), "A": np.array([2.0, 3.0, -1.0])})
    applied = apply_all("fold_channel_scale", load(text), ctx)
    assert len(applied) == 1


def test_non_constant_scale_is_not_a_candidate():
    text = FSRCNN_MAX.format(scaled="A[f, 0, 0] * Y[n, f, h, w]")
    assert list(get("fold_channel_scale").match(load(text), context({"W": W_INT}))) == []


@st.composite
def scaled_contractions(draw):
    """``Z = L[o] C[..] * S[o]``: S a contraction ``X[affine] * W[..]`` whose constant weight ``W``
    reads some traversal iterators plainly; the scale ``C`` reads some of them (and constants)."""
    traversal = draw(iterators("ijk", 1, 3))
    summation = draw(iterators("pq", 0, 2, 3))
    its = traversal + summation
    x = ir.Tensor("X", tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 2)))))
    x_read = x[tuple(draw(affine_index(its)) for _ in x.shape)]
    plain = draw(st.lists(st.sampled_from(its), min_size=1, max_size=3, unique=True))
    w_indices = [*plain, *(draw(affine_index(its)) for _ in range(draw(st.integers(0, 1))))]
    w_indices = draw(st.permutations(w_indices))
    w = ir.Tensor("W", tuple(draw(st.integers(1, 4)) for _ in w_indices))
    factors = [x_read, w[tuple(w_indices)]]
    s = ir.Scope(traversal, summation, ir.Binary("*", *draw(st.permutations(factors))))
    outer = tuple(ir.Iter(f"o{k}", it.lo, it.hi) for k, it in enumerate(traversal))
    scaled = [j for j, it in enumerate(traversal) if it in plain] or [0]
    picked = draw(st.lists(st.sampled_from(scaled), min_size=1, max_size=2, unique=True))
    g = [outer[j] for j in picked] + [ir.IConst(0)] * draw(st.integers(0, 1))
    c = ir.Tensor("C", tuple(draw(st.integers(1, 4)) for _ in g))
    body = ir.Binary("*", *draw(st.permutations([c[tuple(g)], s[outer]])))
    z = ir.Scope(outer, (), body)
    program = ir.Program(tuple(ir.input_tensors(z)), (("Z", z),), ("Z",))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    constants = {t.name: rng.integers(-3, 4, t.shape).astype(np.float64) for t in (w, c)}
    return program, constants, any(it in plain for it in traversal)


@settings(max_examples=60, deadline=None)
@given(scaled_contractions())
def test_random_channel_scales(case):
    program, constants, foldable = case
    applied = apply_all("fold_channel_scale", program, context(constants))
    assert bool(applied) == foldable
    for m, after in applied:
        assert after.scope("Z").body is not program.scope("Z").body, m


def test_as_program_roundtrip_for_fold_results():
    # The FSRCNN fold result prints and parses back (checked by apply_all too); the scale scope is nested.
    program = as_program(load(FSRCNN_MAX.format(scaled="A[f, 0, 0] * Y[n, f, h, w]")))
    [(m, after)] = apply_all("fold_channel_scale", program, context({"W": W_INT, "A": A_INT}))
    assert [n for n, _ in after.bindings] == ["Y", "Z"]
