"""The IR's contract: interning, immutability, validation with clear messages."""

import dataclasses
import pickle

import pytest
from hypothesis import given, settings

from einopt import L, Max, Sum, iters, program, tensor
from einopt.core.ir import (
    Access,
    Binary,
    Const,
    IConst,
    IndexExpr,
    IRError,
    Iter,
    Node,
    Program,
    Scope,
    Tensor,
    Unary,
    ValueExpr,
    children,
    rebuild,
    scopes_in,
    tensors_in,
    walk,
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


def test_max_scope_is_its_own_node_and_keeps_its_kind():
    i, j = iters("i:2 j:3")
    A = tensor("A", (2, 3))
    peak, total = L(i)(Max(j)(A[i, j])), L(i)(Sum(j)(A[i, j]))
    assert peak is not total and (peak.reduce, total.reduce) == ("max", "sum")
    assert peak.is_max and not total.is_max
    assert Scope((i,), (j,), A[i, j], (), "max") is peak
    # replace, rebuild and pickling keep the reduction.
    assert peak.replace(body=A[i, j] * 2.0).reduce == "max"
    assert rebuild(peak, lambda b: b * 2.0).reduce == "max"
    assert pickle.loads(pickle.dumps(peak)) is peak


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
        (lambda: Scope((Iter("i", 0, 2),), (Iter("j", 0, 2),), Const(1.0), (), "min"), "unknown reduction"),
        (lambda: Scope((Iter("i", 0, 2),), (), Const(1.0), (), "max"), "at least one reduction iterator"),
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


def _reads(node):
    """The nodes a scope's value depends on directly: an access's source, else the children."""
    return (node.source,) if isinstance(node, Access) else children(node)


def _plain_walk(root):
    """Every node reachable from ``root`` once, children before parents, left to right."""
    seen, out = set(), []

    def visit(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        for child in _reads(node):
            visit(child)
        out.append(node)

    visit(root)
    return out


def _first_use(root):
    """Tensors in first-use order: a pre-order walk, left to right."""
    seen, out = set(), []

    def visit(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, Tensor):
            out.append(node)
        for child in _reads(node):
            visit(child)

    visit(root)
    return out


@settings(max_examples=150, deadline=None)
@given(programs(max_depth=2))
def test_scopes_and_tensors_in_follow_a_plain_walk(p):
    """``scopes_in`` and ``tensors_in`` are built from nested scopes' memoised lists: the same
    nodes in the same order as walking the whole tree."""
    for root in [p, *(s for _, s in p.bindings)]:
        assert scopes_in(root) == [n for n in _plain_walk(root) if isinstance(n, Scope)]
        assert tensors_in(root) == _first_use(root)


# --------------------------------------------------------------------------
# The generic traversal: children, walk, rebuild
# --------------------------------------------------------------------------


def _kinds():
    """One node of every class, with its children as written."""
    i, j = Iter("i", 0, 4), Iter("j", 0, 3)
    A = Tensor("A", (4, 3))
    a, b = A[i, j], A[i, 2]
    s = Scope((i,), (j,), a * 2.0)
    t = Scope((j,), (), Access(s, (j + 1,)))
    p = Program((A,), (("S", s), ("T", t)), ("T",))
    return [
        (i, ()),
        (IConst(3), ()),
        (i + j, (i, j)),
        (i - 1, (i, IConst(1))),
        (2 * j, (IConst(2), j)),
        (i // 2, (i,)),
        (j % 2, (j,)),
        (Const(1.5), ()),
        (a + b, (a, b)),
        (Unary("relu", a), (a,)),
        (Unary("leaky_relu", b, 0.1), (b,)),
        (a, (i, j)),
        (A, ()),
        (s, (s.body,)),
        (p, (s, t)),
    ]


def _replacement(child):
    """A different node of the same kind as ``child``."""
    if isinstance(child, Scope):
        return child.replace(body=Const(7.0))
    if isinstance(child, ValueExpr):
        return Unary("neg", child)
    return child + 1


KINDS = _kinds()


@pytest.mark.parametrize("node, kids", KINDS, ids=[type(n).__name__ for n, _ in KINDS])
def test_children_of_every_node_kind(node, kids):
    assert children(node) == kids
    assert all(x is y for x, y in zip(children(node), kids, strict=True))


def test_every_node_class_has_children():
    """A new node class without a row in the traversal table fails here."""

    import einopt.core.ir as ir

    def concrete(cls):
        for sub in cls.__subclasses__():
            yield from concrete(sub)
            # ``slots=True`` makes dataclasses anew: only the classes the module holds count.
            if getattr(ir, sub.__name__, None) is sub and sub not in (IndexExpr, ValueExpr):
                yield sub

    assert set(concrete(Node)) == {type(n) for n, _ in KINDS}


@pytest.mark.parametrize("node, kids", KINDS, ids=[type(n).__name__ for n, _ in KINDS])
def test_rebuild_is_the_node_itself_when_nothing_changes(node, kids):
    assert rebuild(node, lambda c: c) is node
    # An equal (interned) replacement is no change either.
    assert rebuild(node, lambda c: pickle.loads(pickle.dumps(c))) is node


@pytest.mark.parametrize("node, kids", [(n, k) for n, k in KINDS if k], ids=lambda x: type(x).__name__)
def test_rebuild_replaces_each_child_and_keeps_the_other_fields(node, kids):
    out = rebuild(node, _replacement)
    assert out is not node and type(out) is type(node)
    assert children(out) == tuple(_replacement(c) for c in kids)
    # Interned: building the same node again gives the same object.
    assert rebuild(node, _replacement) is out
    for name in ("op", "fn", "param", "k", "source", "traversal", "summation", "pad", "inputs", "outputs"):
        if hasattr(node, name):
            assert getattr(out, name) is getattr(node, name) or getattr(out, name) == getattr(node, name)
    if isinstance(node, Program):
        assert [n for n, _ in out.bindings] == [n for n, _ in node.bindings]


def test_rebuild_calls_fn_once_per_child_and_never_on_a_leaf():
    (i,) = iters("i:4")
    A = tensor("A", (4,))
    calls = []
    e = A[i] * A[i]
    rebuild(e, lambda c: calls.append(c) or c)
    assert calls == [A[i], A[i]]
    calls.clear()
    for leaf in (i, IConst(1), Const(1.0), A):
        assert rebuild(leaf, lambda c: calls.append(c) or c) is leaf
    assert calls == []


def test_rebuild_validates_the_new_node():
    (i,) = iters("i:4")
    A = tensor("A", (4,))
    with pytest.raises(IRError, match="value expression"):
        rebuild(A[i] + 1.0, lambda c: i)
    with pytest.raises(IRError, match="index expression"):
        rebuild(i + 1, lambda c: Const(1.0))
    with pytest.raises(IRError, match="does not bind"):
        rebuild(L(i)(A[i]), lambda body: A[Iter("k", 0, 4)])


def test_traversal_refuses_what_is_not_a_node():
    for bad in (3, "x", None):
        with pytest.raises(TypeError, match="not an IR node"):
            children(bad)
        with pytest.raises(TypeError, match="not an IR node"):
            rebuild(bad, lambda c: c)


def test_walk_is_pre_order_left_to_right_and_each_node_once():
    i, j = iters("i:4 j:3")
    A = tensor("A", (4, 3))
    a = A[i, j]
    e = Unary("relu", a) * (a + 2.0)
    assert list(walk(e)) == [e, Unary("relu", a), a, i, j, a + 2.0, Const(2.0)]
    assert list(walk(e, stop=Access)) == [e, Unary("relu", a), a, a + 2.0, Const(2.0)]
    idx = (i + j) // 2 + (i + j) % 2
    assert list(walk(idx)) == [idx, (i + j) // 2, i + j, i, j, (i + j) % 2]
    assert list(walk(i)) == [i]


def test_walk_does_not_enter_the_scopes_a_body_reads():
    i, j = iters("i:4 j:3")
    A = tensor("A", (4, 3))
    inner = L(i)(Sum(j)(A[i, j]))
    (x,) = iters("x:4")
    e = inner[x] * 3.0
    assert A not in list(walk(e)) and inner not in list(walk(e))
    outer = L(x)(e)
    assert list(walk(outer)) == [outer, e, inner[x], x, Const(3.0)]


def test_walk_of_a_program_visits_its_bindings_once():
    (i,) = iters("i:4")
    A = tensor("A", (4,))
    s = L(i)(A[i] * 2.0)
    p = Program((A,), (("S", s), ("T", s)), ("T",))
    assert [n for n in walk(p) if isinstance(n, Scope)] == [s]


def test_walk_and_rebuild_handle_long_chains():
    """Bodies can be chains of thousands of operations: no recursion."""
    (i,) = iters("i:4")
    A = tensor("A", (4,))
    e = A[i]
    for k in range(5000):
        e = e + float(k)
    assert sum(1 for _ in walk(e, stop=Access)) == 1 + 2 * 5000
    assert e.iters() == {i}


def test_scopes_and_tensors_in_of_deeply_nested_scopes():
    """A translated model nests one scope per node, hundreds deep: no recursion over the nesting."""
    i, j, k = iters("i:3 j:3 k:3")
    X, W = tensor("X", (3, 3)), tensor("W", (3, 3))
    chain = []
    for _ in range(3000):
        chain.append(L(i, j)(Sum(k)((chain[-1] if chain else X)[i, k] * W[k, j])))
    assert tensors_in(chain[-1]) == [X, W]
    assert scopes_in(chain[-1]) == chain  # producers first
    assert scopes_in(chain[1500]) == chain[:1501]


@settings(max_examples=100, deadline=None)
@given(programs(max_depth=2))
def test_walk_and_rebuild_agree_with_children_on_random_programs(p):
    """``walk`` yields exactly the closure of ``children``, once each, and rebuilding any node
    with its own children is that node."""
    nodes = list(walk(p))
    assert len(nodes) == len(set(map(id, nodes)))
    seen = {id(n) for n in nodes}
    for n in nodes:
        assert all(id(c) in seen for c in children(n))
        assert rebuild(n, lambda c: c) is n
        assert rebuild(n, lambda c: pickle.loads(pickle.dumps(c))) is n
