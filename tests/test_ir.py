"""The IR's contract: interning, immutability, validation with clear messages."""

import dataclasses
import pickle

import pytest
from hypothesis import given, settings

from einopt import L, Sum, iters, program, tensor
from einopt.core.ir import (
    Access,
    Binary,
    Const,
    IConst,
    IRError,
    Iter,
    Program,
    Scope,
    Tensor,
    Unary,
    scopes_in,
    tensors_in,
)

from strategies import programs


def conv(n=8, c=4, f=5):
    h, w, ff, r, s, cc = iters(f"h:{n} w:{n} f:{f} r:3 s:3 c:{c}")
    A, K = tensor("A", (n, n, c)), tensor("K", (3, 3, f, c))
    return L(h, w, ff)(Sum(r, s, cc)(A[h + r - 1, w + s - 1, cc] * K[r, s, ff, cc]))


def test_equal_nodes_are_the_same_object():
    assert conv() is conv()
    assert Iter("h", 0, 4) is Iter("h", 0, 4)
    assert Iter("h", 0, 4) is not Iter("h", 0, 5)
    assert Const(1.0) is Const(1.0)
    assert Const(0.0) is not Const(-0.0)  # they print differently
    assert conv(8) is not conv(9)


def test_constructors_never_simplify():
    (x,) = iters("x:4")
    assert isinstance(x + 0, type(x + 1))
    assert (x + 0).b is IConst(0)
    A = tensor("A", (4,))
    e = A[x] * 1.0
    assert isinstance(e, Binary) and e.b is Const(1.0)


def test_nodes_are_immutable():
    s = conv()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.body = Const(1.0)
    assert s.replace(body=s.body) is s
    other = s.replace(body=Const(2.0))
    assert other is not s and other.traversal is s.traversal


def test_pickle_and_copy_keep_identity():
    import copy

    s = conv()
    assert pickle.loads(pickle.dumps(s)) is s
    assert copy.deepcopy(s) is s


def test_scope_shape_and_origin():
    t, u = iters("t=-1:5 u:3")
    A = tensor("A", (4, 3))
    s = L(t, u)(A[t, u])
    assert s.shape == (6, 3)
    assert s.origin == (-1, 0)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Iter("h", 3, 3), "empty range"),
        (lambda: Iter("h h", 0, 3), "identifier"),
        (lambda: Tensor("A", (0, 3)), "positive ints"),
        (lambda: Tensor("A", (2,), "complex64"), "unsupported dtype"),
        (lambda: tensor("A", (2, 3))[Iter("i", 0, 2)], "rank 2"),
        (
            lambda: L(Iter("i", 0, 2))(tensor("A", (2, 3))[Iter("i", 0, 2), Iter("j", 0, 3)]),
            "does not bind: j=0:3",
        ),
        (lambda: L(Iter("i", 0, 2), Iter("i", 0, 3))(Const(1.0)), "bound twice"),
        (lambda: Iter("i", 0, 2) // 0, "positive integer"),
        (lambda: Iter("i", 0, 2) % Iter("j", 0, 2), "positive integer"),
        (lambda: Unary("gelu", Const(1.0)), "unknown function"),
        (lambda: Unary("leaky_relu", Const(1.0)), "float parameter"),
        (lambda: Binary("**", Const(1.0), Const(2.0)), "unknown binary operator"),
        (lambda: Scope((), (), Const(1.0)), "at least one traversal"),
        (lambda: Scope((Iter("i", 0, 2),), (), Const(1.0), ((0, 0),)), "all zeros"),
        (lambda: Scope((Iter("i", 0, 2),), (), Const(1.0), ((1, -1),)), "before, after"),
        (lambda: Scope((Iter("i", 0, 2),), (), Const(1.0), ((True, 0),)), "before, after"),
        (
            lambda: L(Iter("i", 0, 2))(
                tensor("A", (2,))[Iter("i", 0, 2)] + tensor("A", (3,))[Iter("i", 0, 2)]
            ),
            "two different tensors named A",
        ),
    ],
)
def test_malformed_nodes_are_refused_with_a_reason(build, message):
    with pytest.raises(IRError, match=message):
        build()


def test_program_bindings_inputs_outputs():
    i, j, k = iters("i:3 j:4 k:5")
    A, B = tensor("A", (3, 5)), tensor("B", (5, 4))
    T = L(i, k)(A[i, k] * 2.0)
    Y = L(i, j)(Sum(k)(T[i, k] * B[k, j]))
    p = program(outputs={"Y": Y}, intermediates={"T": T})
    assert [n for n, _ in p.bindings] == ["T", "Y"]
    assert p.inputs == (A, B)
    assert p.scope("Y") is Y
    assert scopes_in(p)[-1] is p or scopes_in(Y) == [T, Y]
    assert tensors_in(Y) == [A, B]
    with pytest.raises(IRError, match="not a program input"):
        Program((A,), (("T", T), ("Y", Y)), ("Y",))
    with pytest.raises(IRError, match="bound after it"):
        Program((A, B), (("Y", Y), ("T", T)), ("Y",))
    with pytest.raises(IRError, match="not a bound expression"):
        Program((A, B), (("T", T), ("Y", Y)), ("Z",))


def test_free_iterators_of_values():
    i, j = iters("i:3 j:4")
    A = tensor("A", (3, 4))
    inner = L(i, j)(A[i, j])
    (x,) = iters("x:3")
    e = Access(inner, (x, IConst(1))) + A[x, x]
    assert e.iters() == {x}
    assert inner.iters() == frozenset()


def _plain_walk(root):
    """Every node reachable from ``root`` once, children before parents, left to right."""
    from einopt.core.ir import _children

    seen, out = set(), []

    def visit(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        for child in _children(node):
            visit(child)
        out.append(node)

    visit(root)
    return out


def _first_use(root):
    """Tensors in first-use order: a pre-order walk, left to right."""
    from einopt.core.ir import Tensor, _children

    seen, out = set(), []

    def visit(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, Tensor):
            out.append(node)
        for child in _children(node):
            visit(child)

    visit(root)
    return out


@settings(max_examples=150, deadline=None)
@given(programs(max_depth=2))
def test_scopes_and_tensors_in_follow_a_plain_walk(p):
    """``scopes_in`` and ``tensors_in`` are built from nested scopes' memoised lists: the same
    nodes in the same order as walking the whole tree."""
    from einopt.core.ir import Scope, scopes_in, tensors_in

    for root in [p, *(s for _, s in p.bindings)]:
        assert scopes_in(root) == [n for n in _plain_walk(root) if isinstance(n, Scope)]
        assert tensors_in(root) == _first_use(root)
