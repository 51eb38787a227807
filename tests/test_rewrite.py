"""The generic transformations of einopt.core.rewrite that the rules are built from."""

from einopt import L, Sum, iters, tensor
from einopt.core import ir
from einopt.core.rewrite import accesses, map_accesses, replace_subterm, transform


def _body():
    i, j = iters("i:4 j:3")
    A, B = tensor("A", (4, 3)), tensor("B", (3,))
    inner = L(i)(Sum(j)(A[i, j]))
    a, b, c = A[i, j], B[j], inner[i]
    return (i, j), (a, b, c), ir.Unary("relu", a * b) + (c - a) * 2.0


def test_accesses_are_distinct_in_reading_order_and_scopes_are_not_entered():
    _, (a, b, c), e = _body()
    assert accesses(e) == [a, b, c]
    assert accesses(ir.Const(1.0)) == []
    assert accesses(a) == [a]


def test_transform_replaces_where_visit_answers_and_enters_elsewhere():
    (i, j), (a, b, c), e = _body()
    seen = []

    def visit(x):
        seen.append(x)
        return ir.Const(0.0) if x is a else None

    out = transform(e, visit)
    assert out is ir.Unary("relu", ir.Const(0.0) * b) + (c - ir.Const(0.0)) * 2.0
    # Each distinct subterm once; an access is a leaf (its indices are not visited).
    assert len(seen) == len(set(map(id, seen)))
    assert not any(isinstance(x, ir.IndexExpr) for x in seen)
    assert transform(e, lambda x: None) is e


def test_map_accesses_and_replace_subterm():
    (i, j), (a, b, c), e = _body()
    out = map_accesses(e, lambda x: x if x is not b else ir.Const(1.0))
    assert out is ir.Unary("relu", a * 1.0) + (c - a) * 2.0
    assert replace_subterm(e, c - a, a) is ir.Unary("relu", a * b) + a * 2.0
    assert replace_subterm(e, ir.Const(5.0), a) is e
