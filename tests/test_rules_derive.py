"""The derivation machinery: equivalence checks, step selection, traces."""

from __future__ import annotations

import numpy as np
import pytest
from rules_support import load

from einopt.rules import Apply, Context, DerivationError, apply_rule, check_equivalent, derive

CONV = "L[h:5, w:4, f:2] Sum[r:3, s:3, c:2] A[h+r-1, w+s-1, c] * K[r, s, f, c] where A: [5, 4, 2], K: [3, 3, 2, 2]"


def test_equal_programs_pass_in_both_modes():
    p = load(CONV)
    assert check_equivalent(p, p) == ("float64", "int")


@pytest.mark.parametrize(
    "other",
    [
        "L[h:5, w:4, f:2] Sum[r:3, s:3, c:2] A[h+r-1, w+s, c] * K[r, s, f, c]",  # shifted read
        "L[h:5, w:4, f:2] Sum[r:3, s:2, c:2] A[h+r-1, w+s-1, c] * K[r, s, f, c]",  # a tap missing
    ],
    ids=["shifted", "missing-tap"],
)
def test_different_programs_are_caught(other):
    with pytest.raises(DerivationError, match="differs in float64 mode"):
        check_equivalent(load(CONV), load(other + " where A: [5, 4, 2], K: [3, 3, 2, 2]"))


def test_shape_change_is_caught():
    a = load("L[i:3] A[i] where A: [4]")
    b = load("L[i:4] A[i] where A: [4]")
    with pytest.raises(DerivationError, match="shape"):
        check_equivalent(a, b)


def test_constants_come_from_the_context_and_int_mode_is_skipped_for_fractions():
    a = load("L[i:3] max(X[i], 0) + S[i] * min(X[i], 0) where X: [3], S: [3]")
    b = load("L[i:3] max(X[i], S[i] * X[i]) where X: [3], S: [3]")
    ok = Context({"S": np.array([0.25, 0.5, 1.0])})
    assert check_equivalent(a, b, ok) == ("float64",)
    bad = Context({"S": np.array([0.25, 2.0, 1.0])})
    with pytest.raises(DerivationError):
        check_equivalent(a, b, bad)


def test_apply_rule_needs_exactly_one_match():
    p = load(CONV)
    with pytest.raises(DerivationError, match="6 matches") as e:
        apply_rule(p, "split_summation")
    assert "Sum[r, s] outside, Sum[c] inside" in str(e.value)
    new, match = apply_rule(p, Apply("split_summation", at="Y", choose="Sum[c] inside"))
    assert match.rule == "split_summation" and new is not p
    with pytest.raises(DerivationError, match="no match"):
        apply_rule(p, Apply("split_summation", at="Z"))


def test_derive_records_a_checked_trace():
    p = load(CONV)
    trace = derive(p, [Apply("split_summation", choose="Sum[c] inside")])
    assert trace.start is p and len(trace.steps) == 1
    assert trace.steps[0].checked == ("float64", "int")
    text = trace.format()
    assert text.startswith("E1:") and "E2 = split_summation at Y" in text
    assert str(trace.result).splitlines()[0] in text


def test_unknown_rule_names_the_known_ones():
    with pytest.raises(KeyError, match="split_summation"):
        apply_rule(load(CONV), "split_everything")
