"""materialize_access (im2col) and replicate_access (grouped-conv input copies)."""

from __future__ import annotations

from hypothesis import given, settings
from rules_support import Example, NearMiss, apply_all, load, programs

from einopt.core import ir

CONV = "L[h:5, w:4, f:6] Sum[r:3, s:3, c:2] A[h+r-1, w+s-1, c] * K[r, s, f, c] where A: [5, 4, 2], K: [3, 3, 6, 2]"
NCHW = (
    "L[n:1, f:4, h:4, w:4] Sum[c:3, kh:3, kw:3] X[n, c, h+kh-1, w+kw-1] * W[f, c, kh, kw]"
    " where X: [1, 3, 4, 4], W: [4, 3, 3, 3]"
)

EXAMPLES = {
    "materialize_access": [
        Example(CONV),
        Example("L[i:4, j:3] Sum[k:6] A[i, k//2, k%2] * B[k, j] where A: [4, 3, 2], B: [6, 3]"),
    ],
    "replicate_access": [Example(CONV, min_matches=3), Example(NCHW, min_matches=2)],
}

NEAR_MISSES = {
    "materialize_access": [
        NearMiss("L[i:3, j:2] Sum[k:4] A[i, k] * B[k, j] where A: [3, 4], B: [4, 2]", "only copy")
    ],
    "replicate_access": [NearMiss("L[i:3, j:2] A[i, j] where A: [3, 2]", "every traversal iterator")],
}


def _inner(program: ir.Program) -> ir.Scope:
    outer = program.scope("Y")
    (inner,) = [s for s in ir.scopes_in(outer) if s is not outer]
    return inner


def test_materializing_the_conv_input_gives_the_im2col_buffer():
    [(m, after)] = [(m, p) for m, p in apply_all("materialize_access", load(CONV)) if "A[" in m.summary]
    assert m.summary == "materialize A[...] over (h, w, r, s, c)"
    im2col = _inner(after)
    assert [it.name for it in im2col.traversal] == ["h", "w", "r", "s", "c"] and not im2col.summation
    # The outer scope is now a matmul: both operands read plain iterators.
    outer = after.scope("Y")
    assert str(outer.body).startswith("{L[h:5, w:4, r:3, s:3, c:2] A[h+r-1, w+s-1, c]}[h, w, r, s, c] * K")


def test_replicating_the_input_places_the_copy_before_the_channel():
    found = {m.summary: p for m, p in apply_all("replicate_access", load(NCHW))}
    after = found["replicate X along f (new dimension 1)"]
    copies = _inner(after)
    assert copies.shape == (1, 4, 3, 4, 4)
    assert "[n, f, c, h+kh-1, w+kw-1]" in str(after.scope("Y").body)


@settings(max_examples=60, deadline=None)
@given(programs())
def test_random_contractions(program):
    apply_all("materialize_access", program)
    apply_all("replicate_access", program)
