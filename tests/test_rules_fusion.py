"""fuse_expressions: vertical fusion of a bound producer into its consumer; bind_scope, its
inverse; fuse_cone, the producers only a consumer reads nested into it (rules.fusion)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rules_support import (
    Example,
    NearMiss,
    affine_index,
    apply_all,
    assert_needs_finite,
    contractions,
    iterators,
    load,
    weights,
)

from einopt.core import ir
from einopt.core.rewrite import accesses
from einopt.rules import Context, get
from einopt.rules.fusion import bind_scope, producer_cone

OFFSET_REDUCE = "Y = L[h:6, w:6, f:2] Sum[r:3, s:3] T[r, s, f, h+r-1, w+s-1]"
WHERE_T = "where T: [3, 3, 2, 6, 6], S: [2]"
RELU_AFTER = f"{OFFSET_REDUCE}\nZ = L[h:6, w:6, f:2] relu(Y[h, w, f])\nreturn Z\n{WHERE_T}"
SCALE_AFTER = f"{OFFSET_REDUCE}\nZ = L[h:6, w:6, f:2] Y[h, w, f] * S[f]\nreturn Z\n{WHERE_T}"
# Transpose, then reshape, then a scale: two fusions make one expression.
LAYOUT_CHAIN = (
    "P = L[j:3, i:4] X[i, j]\nQ = L[k:12] P[k//4, k%4]\nZ = L[m:12] Q[m] * 2\nreturn Z\nwhere X: [4, 3]"
)
# A zero-padded shift read outside its range: legal because X is 0 there too.
SHIFT = "P = L[i:4] X[i] * 3\nZ = L[m:6] P[m-1] + P[m]\nreturn Z, P\nwhere X: [4]"
# Read past P's box, where X is out of range but W is not: 0 there only for a finite W.
PAST_BOX = "P = L[j:4] X[j] * W[j]\nY = L[i:6] P[i-1]\nreturn Y\nwhere X: [4], W: [6]"

# A contraction written inside its bias epilogue (how the translator writes Conv/ConvTranspose + bias).
NESTED_BIAS = (
    "Z = L[i:3, j:4] {L[i:3, j:4] Sum[k:5] A[i, k] * B[k, j]}[i, j] + C[j]\nreturn Z\n"
    "where A: [3, 5], B: [5, 4], C: [4]"
)
# Two nested sums, one read shifted and under relu, one read twice (interned: bound once).
NESTED_TWO = (
    "Z = L[i:4] relu({L[m:4] Sum[k:3] A[m, k]}[3-i]) + {L[m:4] Sum[k:2] B[m, k]}[i] * "
    "{L[m:4] Sum[k:2] B[m, k]}[i]\nreturn Z\nwhere A: [4, 3], B: [4, 2]"
)

# A chain only Z reads (P, then Q), a weight's projection W feeding it, and R that Z and V read.
CONE = (
    "W = L[i:4] Sum[k:3] A[i, k] * M[k]\nP = L[i:4] W[i] + 1\nQ = L[i:4] exp(P[i] - {L[r:1] Max[j:4] P[j]}[0])\n"
    "R = L[i:4] X[i] * 2\nZ = L[i:4] Q[i] * R[i]\nV = L[i:4] R[3-i]\nreturn Z, V\n"
    "where A: [4, 3], M: [3], X: [4]"
)

EXAMPLES = {
    "fuse_cone": [Example(CONE, weights(CONE, "M"), min_matches=2), Example(LAYOUT_CHAIN, min_matches=2)],
    "bind_scope": [Example(NESTED_BIAS), Example(NESTED_TWO, min_matches=2)],
    "fuse_expressions": [
        Example(SCALE_AFTER),
        Example(LAYOUT_CHAIN, min_matches=2),
        Example(SHIFT),
        Example(
            "P = L[i:3, k:5] A[i, k] + 1\nY = L[i:3, j:4] Sum[k:5] P[i, k] * B[k, j]\nreturn Y\nwhere A: [3, 5], B: [5, 4]"
        ),
        Example(PAST_BOX, weights(PAST_BOX, "W")),
    ],
}

NEAR_MISSES = {
    "fuse_cone": [
        NearMiss(
            "P = L[i:4] X[i] + 1\nZ = L[i:4] P[i]\nreturn Z, P\nwhere X: [4]", "no binding only it reads"
        )
    ],
    "bind_scope": [
        NearMiss(
            "Z = L[i:4] {L[m:4] X[m] * 2}[i] + 1\nreturn Z\nwhere X: [4]",
            "no binding reads a nested scope that sums",
        ),
        NearMiss(
            "P = L[i:3] Sum[k:5] A[i, k]\nZ = L[i:3] P[i] + 1\nreturn Z\nwhere A: [3, 5]",
            "no binding reads a nested scope that sums",
        ),
    ],
    "fuse_expressions": [
        NearMiss(
            RELU_AFTER,
            "Y sums over r, s: it can only be inlined as a factor of a product, but it is read under relu",
        ),
        NearMiss(
            "P = L[i:4] X[i] + 1\nZ = L[m:6] P[m-1]\nreturn Z\nwhere X: [4]",
            "reads P at m-1 in [-1, 4], outside [0, 4), where P is not provably 0",
        ),
        NearMiss(PAST_BOX, "outside [0, 4), where P is 0 only if W is finite; W is not a constant"),
    ],
}


def test_scale_fuses_into_the_offset_reduction_and_drops_it():
    [(m, after)] = apply_all("fuse_expressions", load(SCALE_AFTER))
    assert m.summary == "inline Y into Z, drop Y"
    assert [n for n, _ in after.bindings] == ["Z"]
    z = after.scope("Z")
    assert [it.name for it in z.summation] == ["r", "s"]
    assert str(z.body) == "T[r, s, f, h+r-1, w+s-1] * S[f]"


def test_layout_chain_becomes_one_expression():
    program = load(LAYOUT_CHAIN)
    rule = get("fuse_expressions")
    [first] = [m for m in rule.matches(program) if m.where == "Q"]
    once = rule.apply(program, first)
    [second] = rule.matches(once)
    twice = rule.apply(once, second)
    assert [n for n, _ in twice.bindings] == ["Z"]
    assert str(twice.scope("Z").body) == "X[m%4, m//4] * 2.0"


def test_an_output_producer_is_kept():
    [(m, after)] = apply_all("fuse_expressions", load(SHIFT))
    assert m.summary == "inline P into Z"
    assert [n for n, _ in after.bindings] == ["P", "Z"]
    assert str(after.scope("Z").body) == "X[m-1] * 3.0 + X[m] * 3.0"


def test_a_producer_read_elsewhere_is_kept():
    text = "P = L[i:4] X[i] * 3\nZ = L[m:4] P[m] + 1\nV = L[m:4] P[3-m]\nreturn Z, V\nwhere X: [4]"
    found = {m.where: p for m, p in apply_all("fuse_expressions", load(text))}
    assert [n for n, _ in found["Z"].bindings] == ["P", "Z", "V"]
    assert [n for n, _ in found["V"].bindings] == ["P", "Z", "V"]


def test_cone_is_what_only_the_consumer_reads():
    program = load(CONE)
    assert producer_cone(program, "Z") == ("W", "P", "Q")  # not R: V reads it too
    weight = next(t for t in program.inputs if t.name == "M")
    assert producer_cone(program, "Z", lambda s: weight in {a.source for a in accesses(s.body)}) == ("P", "Q")
    assert producer_cone(program, "V") == ()  # R is read by Z as well
    assert producer_cone(program, "Q") == ("W", "P")


def test_fuse_cone_nests_the_scopes_and_keeps_the_rest():
    ctx = Context(constants=weights(CONE, "M"))
    found = {(m.where, m["way"]): (m, after) for m, after in apply_all("fuse_cone", load(CONE), ctx)}
    m, after = found[("Z", "whole")]
    assert m.summary == "nest W, P, Q into Z"
    assert [n for n, _ in after.bindings] == ["R", "Z", "V"]
    # The scopes are the very nodes that were bound (interned), now read nested.
    assert load(CONE).scope("Q") in ir.scopes_in(after.scope("Z"))
    m, after = found[("Z", "activations")]
    assert m.summary == "nest P, Q into Z"
    assert [n for n, _ in after.bindings] == ["W", "R", "Z", "V"]


def test_fuse_cone_keeps_producers_first_when_a_nested_scope_is_bound_again_later():
    # Fuzzer, seed 11 graph 92 at depth 2: Y0 and Y2 bind one (interned) scope; nesting Y0 into Y1
    # made Y1 read Y2, bound after it (an IRError).
    i = ir.Iter("i", 0, 4)
    x = ir.Tensor("X", (4,))
    a = ir.Scope((i,), (), ir.Unary("abs", ir.Access(x, (i,))))
    y1 = ir.Scope((i,), (), ir.Unary("sigmoid", ir.Access(a, (i,))))
    program = ir.Program((x,), (("Y0", a), ("Y1", y1), ("Y2", a)), ("Y1", "Y2"))
    rule = get("fuse_cone")
    [m] = [m for m in rule.matches(program) if m.where == "Y1"]
    after = rule.apply(program, m)
    assert [n for n, _ in after.bindings] == ["Y2", "Y1"]


def test_fuse_cone_refuses_a_cone_read_elsewhere():
    program = load(CONE)
    rule = get("fuse_cone")
    [m] = [m for m in rule.matches(program) if m.where == "Q" and m["way"] == "whole"]
    bad = type(m)(m.rule, "Z", m.summary, {**m.params, "consumer": "Z", "cone": ("R",)})
    with pytest.raises(ValueError, match="R: read outside the cone of Z"):
        rule.apply(program, bad)


def test_bind_scope_names_the_nested_contraction():
    program = load(NESTED_BIAS)
    [(m, after)] = apply_all("bind_scope", program)
    assert m.summary == "bind a summing scope nested in Z as Zs"
    assert [n for n, _ in after.bindings] == ["Zs", "Z"]
    assert "Z = L[i:3, j:4] Zs[i, j] + C[j]" in str(after)
    assert [it.name for it in after.scope("Zs").summation] == ["k"]
    # A summing producer under "+" is not inlined back (fusion only takes it as a factor).
    assert not apply_all("fuse_expressions", after)


def test_bind_scope_binds_a_scope_read_twice_once():
    found = {str(m.params["scope"].body): after for m, after in apply_all("bind_scope", load(NESTED_TWO))}
    after = found["B[m, k]"]
    assert [n for n, _ in after.bindings] == ["Zs", "Z"]
    assert "Zs[i] * Zs[i]" in str(after)


def test_bind_scope_refuses_a_taken_name():
    program = load(NESTED_BIAS)
    [m] = get("bind_scope").matches(program)
    with pytest.raises(ValueError, match="taken"):
        bind_scope(program, "Z", m["scope"], "A")


# --------------------------------------------------------------------------
# Random producers (contractions, layout and shift scopes) read by a contraction
# --------------------------------------------------------------------------


@st.composite
def producer_consumer(draw) -> ir.Program:
    producer = draw(contractions(max_sums=2))
    traversal = draw(iterators("ijk", 1, 2))
    summation = draw(iterators("pq", 0, 1, 3))
    its = traversal + summation
    read = producer[tuple(draw(affine_index(its)) for _ in producer.traversal)]
    other = ir.Tensor("C", (4,))[draw(st.sampled_from(its))]
    body = draw(st.sampled_from([read, read * other, ir.Unary("relu", read), read + other]))
    consumer = ir.Scope(traversal, summation, body)
    outputs = draw(st.sampled_from([("Y",), ("Y", "P")]))
    inputs = tuple(ir.input_tensors(consumer))
    return ir.Program(inputs, (("P", producer), ("Y", consumer)), outputs)


@settings(max_examples=80, deadline=None)
@given(producer_consumer())
def test_random_producers(program):
    for _, after in apply_all("fuse_expressions", program):
        kept = [n for n, _ in after.bindings]
        assert kept == (["P", "Y"] if "P" in program.outputs else ["Y"])


def test_fusing_past_the_box_needs_a_finite_weight():
    assert_needs_finite(
        "fuse_expressions",
        PAST_BOX,
        "W",
        (4,),
        "inline P into Y",
        "reads P at i-1 in [-1, 4], outside [0, 4), where P is 0 only if W is finite",
    )


def test_fuse_cone_activations_keep_only_the_projections_bound():
    # An added constant (a bias, an attention mask) is no projection: only the sum over a weight
    # stays bound.
    text = (
        "W = L[i:4] Sum[k:3] A[i, k] * M[k]\nS = L[i:4] W[i] + B[i]\nZ = L[i:4] S[i] * 2\nreturn Z\n"
        "where A: [4, 3], M: [3], B: [4]"
    )
    ctx = Context(constants=weights(text, "M", "B"))
    found = {m["way"]: m["cone"] for m in get("fuse_cone").matches(load(text), ctx) if m.where == "Z"}
    assert found == {"whole": ("W", "S"), "activations": ("S",)}
