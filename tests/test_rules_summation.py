"""split_summation: examples, near misses, random contractions."""

from __future__ import annotations

from hypothesis import given, settings
from rules_support import Example, NearMiss, apply_all, load, programs

from einopt.core import ir
from einopt.rules import get

CONV3X3 = "L[h:6, w:5, f:4] Sum[r:3, s:3, c:3] A[h+r-1, w+s-1, c] * K[r, s, f, c] where A: [6, 5, 3], K: [3, 3, 4, 3]"

EXAMPLES = {
    "split_summation": [
        Example(CONV3X3, min_matches=6),
        Example(
            "L[i:3, j:4] Sum[k:5, l=-1:2] relu(A[i, k+l]) * B[k, j] where A: [3, 6], B: [5, 4]", min_matches=2
        ),
    ],
}

NEAR_MISSES = {
    "split_summation": [
        NearMiss("L[i:3, j:4] Sum[k:5] A[i, k] * B[k, j] where A: [3, 5], B: [5, 4]", "at least two"),
    ],
}


def test_conv3x3_splits_into_a_five_dimensional_partial_sum():
    program = load(CONV3X3)
    (m, after) = next(
        (m, p) for m, p in apply_all("split_summation", program) if m.summary.endswith("Sum[c] inside")
    )
    outer = after.scope("Y")
    assert [it.name for it in outer.summation] == ["r", "s"]
    (inner,) = [s for s in ir.scopes_in(outer) if s is not outer]
    assert [it.name for it in inner.traversal] == ["r", "s", "h", "w", "f"]
    assert [it.name for it in inner.summation] == ["c"]


def test_scope_without_summation_is_not_a_candidate():
    program = load("L[i:3] A[i] where A: [3]")
    assert list(get("split_summation").match(program)) == []


@settings(max_examples=60, deadline=None)
@given(programs(min_sums=2))
def test_random_contractions(program):
    applied = apply_all("split_summation", program)
    n = len(program.scope("Y").summation)
    assert len(applied) == 2**n - 2
