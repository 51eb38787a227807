"""The shared strategies produce valid, small, varied IR."""

import math

import numpy as np
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from einopt.core.ir import (
    Access,
    Binary,
    IFloorDiv,
    IMod,
    Program,
    Scope,
    Tensor,
    Unary,
    scopes_in,
    tensors_in,
)

from strategies import (
    INTEGER_BINARY_OPS,
    INTEGER_UNARY_FNS,
    programs,
    random_inputs,
    scopes,
)


def _values(node):
    """Every value node under ``node`` (through nested scopes)."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        if isinstance(n, Scope):
            stack.append(n.body)
        elif isinstance(n, Access):
            stack.append(n.source)
        elif isinstance(n, Binary):
            stack += [n.a, n.b]
        elif isinstance(n, Unary):
            stack.append(n.x)
        elif isinstance(n, Program):
            stack += [s for _, s in n.bindings]


def _indices(node):
    for n in _values(node):
        if isinstance(n, Access):
            for ix in n.indices:
                stack = [ix]
                while stack:
                    e = stack.pop()
                    yield e
                    stack += [getattr(e, f) for f in ("a", "b") if hasattr(e, f)]


def _check_small(root):
    for s in scopes_in(root):
        assert isinstance(s, Scope)
        assert math.prod(it.extent for it in s.traversal + s.summation) <= 240
    names = {}
    for t in tensors_in(root):
        assert names.setdefault(t.name, t) is t, f"two shapes for tensor {t.name}"
        assert math.prod(t.shape) <= 625


@given(scopes(), st.integers(0, 2**32 - 1))
@settings(max_examples=60)
def test_scopes_are_valid_and_small(s, seed):
    assert isinstance(s, Scope)
    _check_small(s)
    inputs = random_inputs(s, np.random.default_rng(seed))
    assert {t.name: t.shape for t in tensors_in(s)} == {k: v.shape for k, v in inputs.items()}
    assert all(v.dtype == np.float64 for v in inputs.values())


@given(scopes(integer_safe=True), st.integers(0, 2**32 - 1))
@settings(max_examples=40)
def test_integer_safe_scopes_use_exact_operators_only(s, seed):
    for n in _values(s):
        if isinstance(n, Binary):
            assert n.op in INTEGER_BINARY_OPS
        elif isinstance(n, Unary):
            assert n.fn in INTEGER_UNARY_FNS
    inputs = random_inputs(s, np.random.default_rng(seed), integer=True)
    for v in inputs.values():
        assert np.all(v == np.round(v)) and np.all(np.abs(v) <= 3)


@given(programs(), st.integers(0, 2**32 - 1))
@settings(max_examples=40)
def test_programs_are_valid(p, seed):
    assert isinstance(p, Program)
    assert 2 <= len(p.bindings) <= 3 and 1 <= len(p.outputs) <= 2
    _check_small(p)
    assert set(tensors_in(p)) <= set(p.inputs)
    inputs = random_inputs(p, np.random.default_rng(seed))
    assert list(inputs) == [t.name for t in p.inputs]


# Finding an example without shrinking it is fast; shrinking would take minutes.
quick = settings(max_examples=2000, database=None, phases=[Phase.generate], derandomize=True)


def test_strategies_cover_the_interesting_cases():
    find(
        scopes(),
        lambda s: any(isinstance(n, Access) and isinstance(n.source, Scope) for n in _values(s)),
        settings=quick,
    )
    find(scopes(), lambda s: bool(s.pad), settings=quick)
    find(scopes(), lambda s: any(it.lo < 0 for it in s.traversal), settings=quick)
    find(scopes(), lambda s: bool(s.summation), settings=quick)
    find(scopes(), lambda s: any(isinstance(e, (IFloorDiv, IMod)) for e in _indices(s)), settings=quick)
    find(
        scopes(),
        lambda s: any(isinstance(n, Unary) and n.fn == "leaky_relu" for n in _values(s)),
        settings=quick,
    )
    find(scopes(), lambda s: len(scopes_in(s)) >= 3, settings=quick)
    find(
        programs(),
        lambda p: any(isinstance(n, Access) and n.source in {s for _, s in p.bindings} for n in _values(p)),
        settings=quick,
    )
    find(programs(), lambda p: any(t not in tensors_in(p) for t in p.inputs), settings=quick)


def test_options_exclude_operators():
    s = find(
        scopes(binary_ops=("+",), allow_unary=False, allow_nested=False, allow_divmod=False),
        lambda s: len(list(_values(s))) > 6,
        settings=quick,
    )
    assert all(not isinstance(n, Unary) and (not isinstance(n, Binary) or n.op == "+") for n in _values(s))
    assert all(isinstance(n.source, Tensor) for n in _values(s) if isinstance(n, Access))
