"""The reference interpreter, checked against a naive loop interpreter and numpy.

``naive`` below is a second, independent reading of the semantics: plain
Python loops over every point of every scope, for tiny shapes only.
"""

import itertools
import operator
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from einopt.api import (
    L,
    Sum,
    exp,
    iters,
    leaky_relu,
    maximum,
    minimum,
    program,
    relu,
    sigmoid,
    sqrt,
    tanh,
    tensor,
)
from einopt.core import interp
from einopt.core.interp import EvaluationError, evaluate
from einopt.core.ir import (
    Access,
    Binary,
    Const,
    IAdd,
    IConst,
    IFloorDiv,
    IMod,
    IMul,
    IRError,
    ISub,
    Iter,
    Program,
    Scope,
    Tensor,
    Unary,
)
from einopt.core.ops import BINARY, UNARY
from einopt.core.syntax import parse

from paper import conv_reference, fig5_chain
from strategies import programs, random_inputs, scopes

# --------------------------------------------------------------------------
# A naive reference: loops over every point
# --------------------------------------------------------------------------

_NAIVE_INDEX = {IAdd: operator.add, ISub: operator.sub, IMul: operator.mul}


def _naive_op(form, operands, param, exact):
    """A numpy form of einopt.core.ops at one point (the forms themselves are checked against ONNX
    Runtime and TVM in test_ops): Python numbers in and out, ints when ``exact``."""
    kind = np.int64 if exact else np.float64
    with np.errstate(all="ignore"):
        out = form(np, *(kind(v) for v in operands), *param)
    return int(out) if exact else float(out)


def naive(node, inputs, exact=False):
    """Evaluate with Python numbers (ints when ``exact``), one point at a time."""
    memo = {}

    def index(e, env):
        if isinstance(e, IConst):
            return e.value
        if isinstance(e, Iter):
            return env[e]
        if isinstance(e, IFloorDiv):
            return index(e.a, env) // e.k
        if isinstance(e, IMod):
            return index(e.a, env) % e.k
        return _NAIVE_INDEX[type(e)](index(e.a, env), index(e.b, env))

    def value(e, env):
        if isinstance(e, Const):
            return int(e.value) if exact else e.value
        if isinstance(e, Binary):
            return _naive_op(BINARY[e.op].numpy, (value(e.a, env), value(e.b, env)), (), exact)
        if isinstance(e, Unary):
            return _naive_op(UNARY[e.fn].numpy, (value(e.x, env),), (e.param,), exact)
        assert isinstance(e, Access)
        if isinstance(e.source, Tensor):
            data = inputs[e.source.name]
        else:
            data = scope(e.source)
        pos = [index(i, env) - o for i, o in zip(e.indices, e.source.origin, strict=True)]
        if all(0 <= p < n for p, n in zip(pos, data.shape, strict=True)):
            x = data[tuple(pos)]
            return int(x) if exact else float(x)
        return 0

    def scope(s):
        if s not in memo:
            out = np.zeros(s.shape, dtype=object)
            for point in itertools.product(*(range(it.lo, it.hi) for it in s.traversal)):
                env = dict(zip(s.traversal, point, strict=True))
                values = []
                for red in itertools.product(*(range(it.lo, it.hi) for it in s.summation)):
                    env.update(zip(s.summation, red, strict=True))
                    values.append(value(s.body, env))
                total = max(values) if s.reduce == "max" else sum(values)
                out[tuple(p - it.lo for p, it in zip(point, s.traversal, strict=True))] = total
            memo[s] = out
        return memo[s]

    if isinstance(node, Program):
        return {name: scope(node.scope(name)) for name in node.outputs}
    return scope(node)


def assert_close(got, want, exact=False):
    if isinstance(want, dict):
        assert list(got) == list(want)
        for name in want:
            assert_close(got[name], want[name], exact)
        return
    assert got.shape == want.shape
    if exact:
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want.astype(np.int64))
    else:
        np.testing.assert_allclose(got, want.astype(np.float64), rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------
# Property tests against the naive reference
# --------------------------------------------------------------------------

SEEDS = st.integers(0, 2**32 - 1)


@settings(max_examples=200)
@given(scopes(), SEEDS)
def test_scope_matches_naive(s, seed):
    inputs = random_inputs(s, np.random.default_rng(seed))
    assert_close(evaluate(s, inputs), naive(s, inputs))


@settings(max_examples=100)
@given(scopes(integer_safe=True), SEEDS)
def test_int_mode_matches_naive_exactly(s, seed):
    inputs = random_inputs(s, np.random.default_rng(seed), integer=True)
    assert_close(evaluate(s, inputs, mode="int"), naive(s, inputs, exact=True), exact=True)


@settings(max_examples=60)
@given(programs(), SEEDS)
def test_program_matches_naive(p, seed):
    inputs = random_inputs(p, np.random.default_rng(seed))
    assert_close(evaluate(p, inputs), naive(p, inputs))


@settings(max_examples=40)
@given(scopes(finite=False), SEEDS)
def test_non_finite_values_evaluate_without_error(s, seed):
    # inf, nan and -0.0 constants follow IEEE arithmetic; there is no reference to compare with.
    got = evaluate(s, random_inputs(s, np.random.default_rng(seed)))
    assert got.shape == s.shape and got.dtype == np.float64


@settings(max_examples=60)
@given(scopes(), SEEDS)
def test_chunked_evaluation_matches_naive(s, seed):
    # A tiny budget forces the chunked path (summation ranges split into pieces).
    inputs = random_inputs(s, np.random.default_rng(seed))
    saved = interp._BUDGET
    interp._BUDGET = 4
    try:
        got = evaluate(s, inputs)
    finally:
        interp._BUDGET = saved
    assert_close(got, naive(s, inputs))


@settings(max_examples=150)
@given(scopes(allow_max=True), SEEDS)
def test_max_scopes_match_naive(s, seed):
    inputs = random_inputs(s, np.random.default_rng(seed))
    assert_close(evaluate(s, inputs), naive(s, inputs))


@settings(max_examples=80)
@given(scopes(integer_safe=True, allow_max=True), SEEDS)
def test_max_scopes_int_mode_matches_naive_exactly(s, seed):
    inputs = random_inputs(s, np.random.default_rng(seed), integer=True)
    assert_close(evaluate(s, inputs, mode="int"), naive(s, inputs, exact=True), exact=True)


@settings(max_examples=60)
@given(programs(allow_max=True), SEEDS)
def test_programs_with_max_scopes_match_naive(p, seed):
    inputs = random_inputs(p, np.random.default_rng(seed))
    assert_close(evaluate(p, inputs), naive(p, inputs))


@settings(max_examples=60)
@given(scopes(allow_max=True), SEEDS)
def test_chunked_max_evaluation_matches_naive(s, seed):
    inputs = random_inputs(s, np.random.default_rng(seed))
    saved = interp._BUDGET
    interp._BUDGET = 4
    try:
        got = evaluate(s, inputs)
    finally:
        interp._BUDGET = saved
    assert_close(got, naive(s, inputs))


@settings(max_examples=80)
@given(programs(allow_max=True), SEEDS)
def test_nested_scopes_evaluated_on_the_box_they_are_read_on_match_naive(p, seed):
    # Every nested scope goes through the box path, however much of it is read.
    inputs = random_inputs(p, np.random.default_rng(seed))
    saved = interp._PART
    interp._PART = 1.0
    try:
        got = evaluate(p, inputs)
    finally:
        interp._PART = saved
    assert_close(got, naive(p, inputs))


@settings(max_examples=80)
@given(scopes(allow_max=True), SEEDS, st.data())
def test_a_box_of_a_scope_is_that_part_of_the_whole(s, seed, data):
    inputs = random_inputs(s, np.random.default_rng(seed))
    box = []
    for it in s.traversal:
        lo = data.draw(st.integers(it.lo, it.hi - 1))
        box.append((lo, data.draw(st.integers(lo + 1, it.hi))))
    rows = tuple(slice(lo - it.lo, hi - it.lo) for (lo, hi), it in zip(box, s.traversal, strict=True))
    assert_close(evaluate(s, inputs, box=tuple(box)), naive(s, inputs)[rows])


def test_a_sampled_box_reads_its_producers_on_its_rows_alone(monkeypatch):
    # Attention-like: the batch's last two elements of a product read through a softmax-like max.
    s = parse(
        """L[b:16, i:4] {L[c:16, k:4] Sum[j:8] X[c, k, j] * W[j]}[b, i]
        - {L[c:16] Max[k:4] X[c, k, 0]}[b] where X: [16, 4, 8], W: [8]"""
    )
    box = interp.sample_box(s)
    assert box == ((14, 16), (0, 4))
    assert interp.sample_box(s, dims=()) == ((0, 16), (0, 4)) == interp.sample_box(s, size=16)
    x, w = np.random.default_rng(0).standard_normal((16, 4, 8)), np.arange(8.0)
    evaluated = []
    frame = interp._Frame
    monkeypatch.setattr(interp, "_Frame", lambda scope, dom: evaluated.append(dom) or frame(scope, dom))
    got = evaluate(s, {"X": x, "W": w}, box=box)
    np.testing.assert_allclose(got, (x @ w - x[:, :, 0].max(axis=1, keepdims=True))[14:])
    assert all(lo >= 14 for dom in evaluated for it, (lo, _) in dom.items() if it.name in ("b", "c"))
    with pytest.raises(EvaluationError, match="not within the traversal"):
        evaluate(s, {"X": x, "W": w}, box=((0, 17), (0, 4)))


def test_max_scope_takes_the_maximum_and_reads_zero_outside():
    x = np.array([[-3.0, -1.0, -2.0], [4.0, -5.0, 6.0]])
    inside = parse("L[i:2] Max[j:3] X[i, j] where X: [2, 3]")
    np.testing.assert_array_equal(evaluate(inside, {"X": x}), [-1.0, 6.0])
    # A window that leaves X reads 0 there: the row of negatives now has maximum 0 (no -inf padding).
    window = parse("L[i:2] Max[j:4] X[i, j - 1] where X: [2, 3]")
    np.testing.assert_array_equal(evaluate(window, {"X": x}), [0.0, 6.0])
    # An iterator the body does not read repeats one value: the maximum is that value (a sum would
    # multiply it by the extent).
    unread = parse("L[i:2] Max[j:3, k:5] X[i, j] where X: [2, 3]")
    np.testing.assert_array_equal(evaluate(unread, {"X": x}), [-1.0, 6.0])
    # Reading a max scope outside its traversal gives 0, like any scope.
    outer = parse("L[i:3] {L[a:2] Max[b:3] X[a, b]}[i] - 1.0 where X: [2, 3]")
    np.testing.assert_array_equal(evaluate(outer, {"X": x}), [-2.0, 5.0, -1.0])
    np.testing.assert_array_equal(evaluate(inside, {"X": x}, mode="int"), [-1, 6])


def test_max_scope_softmax_form():
    x = np.random.default_rng(0).standard_normal((3, 5)) * 50
    softmax = parse(
        "L[i:3, j:5] exp(X[i, j] - {L[a:3] Max[b:5] X[a, b]}[i])"
        " / {L[c:3] Sum[d:5] exp(X[c, d] - {L[a:3] Max[b:5] X[a, b]}[c])}[i] where X: [3, 5]"
    )
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(evaluate(softmax, {"X": x}), e / e.sum(1, keepdims=True), rtol=1e-12)


# --------------------------------------------------------------------------
# The paper's examples
# --------------------------------------------------------------------------


def test_fig4_matmul_chain():
    i, j, k, i2, k2, m = iters("i:5 j:3 k:6 i2:5 k2:6 m:4")
    A, B, C = tensor("A", (5, 4)), tensor("B", (4, 6)), tensor("C", (6, 3))
    ab = L(i2, k2)(Sum(m)(A[i2, m] * B[m, k2]))
    abc = L(i, j)(Sum(k)(ab[i, k] * C[k, j]))
    rng = np.random.default_rng(4)
    a, b, c = rng.standard_normal((5, 4)), rng.standard_normal((4, 6)), rng.standard_normal((6, 3))
    np.testing.assert_allclose(evaluate(abc, {"A": a, "B": b, "C": c}), a @ b @ c, rtol=1e-12)


@pytest.mark.parametrize("step", range(7), ids=[f"E{n}" for n in range(1, 8)])
def test_fig5_conv_chain(step):
    H, W, C, F = 14, 14, 16, 16
    rng = np.random.default_rng(5)
    a, k = rng.standard_normal((H, W, C)), rng.standard_normal((3, 3, F, C))
    e = fig5_chain(H, W, C, F)[step]
    got = evaluate(e, {"A": a, "K": k})
    if isinstance(e, Program):
        assert list(got) == ["Y"]
        got = got["Y"]
    np.testing.assert_allclose(got, conv_reference(a, k), rtol=1e-10, atol=1e-10)


def test_fig5_conv_chain_conv_sized():
    H, W, C, F = 56, 56, 64, 64
    rng = np.random.default_rng(6)
    a, k = rng.standard_normal((H, W, C)), rng.standard_normal((3, 3, F, C))
    want = conv_reference(a, k)
    start = time.perf_counter()
    for e in fig5_chain(H, W, C, F):
        got = evaluate(e, {"A": a, "K": k})
        got = got["Y"] if isinstance(got, dict) else got
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    # Loose sanity bound only: the whole chain takes about a second.
    assert time.perf_counter() - start < 120


def test_float32_mode():
    H, W, C, F = 8, 8, 16, 16
    rng = np.random.default_rng(7)
    a, k = rng.standard_normal((H, W, C)), rng.standard_normal((3, 3, F, C))
    got = evaluate(fig5_chain(H, W, C, F)[0], {"A": a, "K": k}, mode="float32")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, conv_reference(a, k), rtol=1e-4, atol=1e-4)
    x = tensor("X", (4,))
    (i,) = iters("i:4")
    got = evaluate(L(i)(sigmoid(x[i]) + tanh(x[i]) / 3 + exp(x[i]) * 0.5), {"X": a[0, 0, :4]}, mode="float32")
    assert got.dtype == np.float32


# --------------------------------------------------------------------------
# Exact integer mode
# --------------------------------------------------------------------------


def test_int_mode_is_exact_beyond_float64():
    # Products near 2**50 summed 16 times exceed float64's 53-bit mantissa.
    i, j, k = iters("i:3 j:3 k:16")
    A, B = tensor("A", (3, 16)), tensor("B", (16, 3))
    rng = np.random.default_rng(8)
    a = rng.integers(2**24, 2**25, size=(3, 16)) + 1
    b = rng.integers(2**24, 2**25, size=(16, 3)) + 1
    e = L(i, j)(Sum(k)(A[i, k] * B[k, j] + 1))
    want = a @ b + 16
    got = evaluate(e, {"A": a, "B": b}, mode="int")
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    assert np.any(evaluate(e, {"A": a, "B": b}).astype(np.int64) != want)


def test_int_mode_accepts_integral_floats_and_integral_constants():
    (i,) = iters("i:4")
    x = tensor("X", (4,))
    e = L(i)(leaky_relu(x[i], 3.0) * 2.0 - maximum(x[i], -1) + minimum(x[i], 1) + relu(-x[i]))
    xs = np.array([-2.0, -1.0, 0.0, 5.0])
    want = [3 * v * 2 if v <= 0 else v * 2 for v in xs]
    want = [w - max(v, -1) + min(v, 1) + max(-v, 0) for w, v in zip(want, xs, strict=True)]
    np.testing.assert_array_equal(evaluate(e, {"X": xs}, mode="int"), want)


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda v: v / 2, "division"),
        (lambda v: sqrt(v), "sqrt"),
        (lambda v: exp(v), "exp"),
        (lambda v: tanh(v), "tanh"),
        (lambda v: sigmoid(v), "sigmoid"),
        (lambda v: leaky_relu(v, 0.1), "leaky_relu"),
        (lambda v: v * 0.5, "constant 0.5"),
    ],
)
def test_int_mode_refuses_inexact_operations(make, what):
    (i,) = iters("i:4")
    e = L(i)(make(tensor("X", (4,))[i]))
    with pytest.raises(EvaluationError, match=what):
        evaluate(e, {"X": np.arange(4)}, mode="int")


def test_int_mode_refuses_non_integer_inputs():
    (i,) = iters("i:3")
    e = L(i)(tensor("X", (3,))[i])
    with pytest.raises(EvaluationError, match=r"X .*non-integer"):
        evaluate(e, {"X": [1.0, 2.5, 3.0]}, mode="int")
    with pytest.raises(EvaluationError, match="non-integer"):
        evaluate(e, {"X": [1.0, np.nan, 3.0]}, mode="int")


# --------------------------------------------------------------------------
# Out-of-range reads, offsets, div/mod and strided indices
# --------------------------------------------------------------------------

X = tensor("X", (4,))
XS = np.array([1.0, 2.0, 3.0, 4.0])


def at(*values):
    return np.array(values, dtype=np.float64)


def test_tensor_read_out_of_range_is_zero():
    (i,) = iters("i=-2:6")
    np.testing.assert_array_equal(evaluate(L(i)(X[i]), {"X": XS}), at(0, 0, 1, 2, 3, 4, 0, 0))
    (j,) = iters("j:3")
    np.testing.assert_array_equal(evaluate(L(j)(X[10] + X[-1] + X[2 * j + 3]), {"X": XS}), at(4, 0, 0))


def test_scope_with_negative_lo_is_indexed_by_value():
    t, h, r = Iter("t", -1, 5), Iter("h", 0, 4), Iter("r", 0, 3)
    s = L(t)(X[t] + 1)  # 1 where X reads out of range, 0 outside the scope
    assert s.shape == (6,)
    np.testing.assert_array_equal(evaluate(s, {"X": XS}), at(1, 2, 3, 4, 5, 1))
    # In-range reads (the strided-view path) are offset by lo too.
    u, v = Iter("u", -1, 5), Iter("v", 0, 3)
    np.testing.assert_array_equal(evaluate(L(u)(s[u]), {"X": XS}), at(1, 2, 3, 4, 5, 1))
    np.testing.assert_array_equal(evaluate(L(v)(s[2 * v - 1]), {"X": XS}), at(1, 3, 5))
    out = L(h)(Sum(r)(s[h + r - 2]))
    # h=0 reads t=-2 (outside the scope: 0), -1 and 0.
    np.testing.assert_array_equal(evaluate(out, {"X": XS}), at(0 + 1 + 2, 1 + 2 + 3, 2 + 3 + 4, 3 + 4 + 5))


def test_pad_does_not_change_values():
    (t,) = iters("t=-1:5")
    (h,) = iters("h=-3:8")
    plain, padded = L(t)(X[t] + 1), L(t, pad=[(2, 3)])(X[t] + 1)
    assert plain is not padded
    np.testing.assert_array_equal(evaluate(L(h)(padded[h]), {"X": XS}), evaluate(L(h)(plain[h]), {"X": XS}))


def test_div_and_mod_indices_floor():
    (i,) = iters("i=-3:5")
    np.testing.assert_array_equal(evaluate(L(i)(X[i // 2]), {"X": XS}), at(0, 0, 0, 1, 1, 2, 2, 3))
    np.testing.assert_array_equal(evaluate(L(i)(X[i % 3]), {"X": XS}), at(1, 2, 3, 1, 2, 3, 1, 2))
    np.testing.assert_array_equal(evaluate(L(i)(X[(i - 5) % 4]), {"X": XS}), at(1, 2, 3, 4, 1, 2, 3, 4))


def test_scope_read_through_strided_and_modulo_indices():
    (t,) = iters("t=-1:9")
    sq = L(t)(X[t // 2] * 10 + 1)  # t -> 10 * X[t // 2] + 1
    vals = {v: (10 * XS[v // 2] if 0 <= v // 2 < 4 else 0) + 1 for v in range(-1, 9)}
    (i,) = iters("i:6")
    for idx, want in [
        (2 * i, [vals.get(2 * v, 0) for v in range(6)]),
        (3 * i - 2, [vals.get(3 * v - 2, 0) for v in range(6)]),
        (i % 4 - 1, [vals[v % 4 - 1] for v in range(6)]),
        ((i * i) // 3, [vals.get(v * v // 3, 0) for v in range(6)]),
    ]:
        np.testing.assert_array_equal(evaluate(L(i)(sq[idx]), {"X": XS}), np.array(want, dtype=float))


def test_repeated_iterator_reads_diagonal():
    i, j = iters("i:3 j:3")
    M = tensor("M", (3, 3))
    m = np.arange(9.0).reshape(3, 3)
    np.testing.assert_array_equal(evaluate(L(i)(M[i, i]), {"M": m}), np.diag(m))
    np.testing.assert_array_equal(evaluate(L(i, j)(M[j, i]), {"M": m}), m.T)


def test_general_body_over_summation():
    i, k = iters("i:3 k:5")
    A, B = tensor("A", (3, 5)), tensor("B", (5,))
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((3, 5)), rng.standard_normal(5)
    got = evaluate(L(i)(Sum(k)(maximum(A[i, k], B[k]) * relu(A[i, k]) + 2)), {"A": a, "B": b})
    np.testing.assert_allclose(got, (np.maximum(a, b) * np.maximum(a, 0) + 2).sum(axis=1))
    # A summation iterator the body does not read multiplies by its extent.
    np.testing.assert_allclose(evaluate(L(i)(Sum(k)(A[i, 0])), {"A": a, "B": b}), 5 * a[:, 0])


def test_shared_scope_is_evaluated_once(monkeypatch):
    i, j = iters("i:3 j:3")
    s = L(i)(X[i] * 2)
    e = L(i, j)(s[i] * s[j] + s[j])
    evaluated = []
    original = interp._Evaluator.term

    def spy(self, frame, coef, factors):
        evaluated.append(frame.scope)
        return original(self, frame, coef, factors)

    monkeypatch.setattr(interp._Evaluator, "term", spy)
    got = evaluate(e, {"X": XS})
    np.testing.assert_array_equal(got, np.outer(2 * XS[:3], 2 * XS[:3]) + 2 * XS[:3])
    assert evaluated.count(s) == 1  # s has a single term


def test_program_outputs_in_order():
    (i,) = iters("i:4")
    a = L(i)(X[i] + 1)
    b = L(i)(a[i] * 2)
    p = program(outputs={"B": b, "A": a})
    got = evaluate(p, {"X": XS, "unused": 1})
    assert list(got) == ["B", "A"]
    np.testing.assert_array_equal(got["A"], XS + 1)
    np.testing.assert_array_equal(got["B"], 2 * (XS + 1))
    twice = Program((X,), (("P", a), ("Q", a)), ("P", "Q"))
    got = evaluate(twice, {"X": XS})
    assert got["P"] is not got["Q"]
    np.testing.assert_array_equal(got["Q"], XS + 1)


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


def test_missing_input():
    (i,) = iters("i:4")
    with pytest.raises(EvaluationError, match=r"missing input X \(expected shape \(4,\)\)"):
        evaluate(L(i)(X[i]), {"Y": XS})


def test_wrong_shape():
    (i,) = iters("i:4")
    with pytest.raises(EvaluationError, match=r"input X \(expected shape \(4,\)\) has shape \(2, 2\)"):
        evaluate(L(i)(X[i]), {"X": XS.reshape(2, 2)})


def test_non_numeric_input_and_bad_arguments():
    (i,) = iters("i:4")
    with pytest.raises(EvaluationError, match="X .*not a real numeric array"):
        evaluate(L(i)(X[i]), {"X": ["a", "b", "c", "d"]})
    with pytest.raises(EvaluationError, match="X .*not an array"):
        evaluate(L(i)(X[i]), {"X": [[1.0], [2.0, 3.0]]})
    with pytest.raises(EvaluationError, match="unknown mode"):
        evaluate(L(i)(X[i]), {"X": XS}, mode="float16")
    with pytest.raises(EvaluationError, match="Scope or a Program"):
        evaluate(X[i], {"X": XS})
    other = tensor("X", (5,))
    with pytest.raises(IRError, match="two different tensors named X"):
        L(i)(X[i] + other[i])  # refused when the scope is built
    assert issubclass(EvaluationError, IRError)
    assert isinstance(L(i)(X[i]), Scope)


def test_eval_index_uses_floor_division_and_modulo():
    from einopt.core.interp import eval_index

    i = Iter("i", -3, 3)
    vals = np.arange(-3, 3)
    np.testing.assert_array_equal(
        eval_index((i * 2 - 1) // 4 + i % 3, {i: vals}), (vals * 2 - 1) // 4 + vals % 3
    )
