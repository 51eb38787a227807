"""Index analysis: linear forms, bounds and simplify, checked by enumeration."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from einopt.core.index import bounds, linear_form, simplify
from einopt.core.ir import IAdd, IConst, IFloorDiv, IMod, IMul, ISub, Iter

X = Iter("x", -2, 7)
Y = Iter("y", 0, 4)
Z = Iter("z", 1, 3)
ITERS = (X, Y, Z)


def value(e, env):
    if isinstance(e, IConst):
        return e.value
    if isinstance(e, Iter):
        return env[e]
    if isinstance(e, IAdd):
        return value(e.a, env) + value(e.b, env)
    if isinstance(e, ISub):
        return value(e.a, env) - value(e.b, env)
    if isinstance(e, IMul):
        return value(e.a, env) * value(e.b, env)
    if isinstance(e, IFloorDiv):
        return value(e.a, env) // e.k
    if isinstance(e, IMod):
        return value(e.a, env) % e.k
    raise TypeError(e)


def points():
    for vals in itertools.product(*(range(it.lo, it.hi) for it in ITERS)):
        yield dict(zip(ITERS, vals, strict=True))


def index_exprs():
    leaves = st.one_of(st.sampled_from(ITERS), st.integers(-5, 5).map(IConst))

    def extend(children):
        k = st.integers(1, 5)
        return st.one_of(
            st.builds(IAdd, children, children),
            st.builds(ISub, children, children),
            st.builds(IMul, st.integers(-3, 3).map(IConst), children),
            st.builds(IMul, children, children),
            st.builds(IFloorDiv, children, k),
            st.builds(IMod, children, k),
        )

    return st.recursive(leaves, extend, max_leaves=8)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(index_exprs())
def test_simplify_preserves_value_and_bounds_are_sound(e):
    s = simplify(e)
    lo, hi = bounds(e)
    values = []
    for env in points():
        v = value(e, env)
        assert value(s, env) == v, (str(e), str(s))
        values.append(v)
    assert lo <= min(values) and max(values) <= hi


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(ITERS), st.integers(-4, 4)), max_size=4), st.integers(-9, 9))
def test_bounds_are_exact_for_affine_expressions(terms, const):
    e = IConst(const)
    for it, c in terms:
        e = IAdd(e, IMul(IConst(c), it))
    values = [value(e, env) for env in points()]
    assert bounds(e) == (min(values), max(values))


def test_linear_form_collects_terms():
    lf = linear_form(X + Y * 2 - X - 1 + (X // 2) * 3)
    assert lf.coeffs == ((Y, 2),)
    assert lf.const == -1
    assert lf.atoms == ((IFloorDiv(X, 2), 3),)
    assert not lf.is_affine


def test_simplify_rules():
    y4 = Iter("y4", 0, 4)
    x = Iter("x", 0, 100)
    assert simplify(4 * (x // 4) + x % 4) is x
    assert simplify((4 * x + y4) // 4) is x
    assert simplify((4 * x + y4) % 4) is y4
    assert simplify(x // 1) is x
    assert simplify(x % 1) is IConst(0)
    assert simplify(x + 2 - 2) is x
    assert simplify((x + 1) * 3 - x * 3) is IConst(3)
    assert str(simplify(x + 1 - 2)) == "x-1"


def test_substitute_replaces_only_mapped_iterators():
    from einopt.core.index import substitute

    h, w, t = Iter("h", 0, 4), Iter("w", 0, 3), Iter("t", 0, 12)
    e = (h * 3 + w) // 2 + h % 2
    assert substitute(e, {h: t // 3}) is (t // 3 * 3 + w) // 2 + (t // 3) % 2
    assert substitute(e, {}) is e


def test_floor_and_mod_of_an_index_in_one_block_fold():
    """``r // k`` and ``r % k`` for ``r`` within one block ``[k*c, k*c + k)``: ``c`` and ``r - k*c``."""
    hr, q, r = Iter("hr", 1, 2), Iter("q", 0, 3), Iter("r", 0, 2)
    assert simplify(IFloorDiv(hr + 1, 2)) is IConst(1)
    assert str(simplify(IMod(hr + 1, 2))) == "hr-1"
    assert str(simplify(IFloorDiv(2 * q + hr + 1, 2))) == "q+1"
    for e in (IMod(hr + 1, 2), IFloorDiv(2 * q + hr + 1, 2)):
        for env in ({hr: 1, q: v} for v in range(3)):
            assert value(simplify(e), env) == value(e, env)
    # Across two blocks nothing folds.
    assert str(simplify(IFloorDiv(r + 1, 2))) == "(r+1)//2"
