"""merge_summations: LSTM gates, shared factors, slicing, near misses, random contraction pairs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rules_support import Example, NearMiss, affine_index, apply_all, as_program, check_result, load

from einopt.core import ir
from einopt.core.parser import parse
from einopt.core.rewrite import substitute_iters
from einopt.rules import Apply, derive, get

GATES = "ifgo"


def lstm(gates: str = "if", bias: bool = False) -> str:
    """The LSTM gate pre-activations ``x @ Wx_g + h @ Wh_g`` (hidden 4, batch 2), one binding per matmul."""
    lines, decls = [], ["x: [2, 4]", "h: [2, 4]"]
    for g in gates:
        plus = f" + b_{g}[i1]" if bias else ""
        lines += [
            f"mx_{g} = L[m:2, n:4] Sum[k:4] x[m, k] * Wx_{g}[k, n]",
            f"mh_{g} = L[m:2, n:4] Sum[k:4] h[m, k] * Wh_{g}[k, n]",
            f"pre_{g} = L[i0:2, i1:4] mx_{g}[i0, i1] + mh_{g}[i0, i1]{plus}",
        ]
        decls += [f"Wx_{g}: [4, 4]", f"Wh_{g}: [4, 4]"] + ([f"b_{g}: [4]"] if bias else [])
    outputs = ", ".join(f"pre_{g}" for g in gates)
    return "\n".join(lines) + f"\nreturn {outputs}\nwhere " + ", ".join(decls)


def pair(p: str, q: str, outer: str = "L[i:2, j:3]", tau: str = "i, j", decls: str = "") -> str:
    """A scope adding two nested contractions ``p`` and ``q`` read at ``tau``."""
    return f"{outer} {{{p}}}[{tau}] + {{{q}}}[{tau}] where {decls}"


MATMULS = pair(
    "L[m:2, n:3] Sum[k:4] x[m, k] * W[k, n]",
    "L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n]",
    decls="x: [2, 4], W: [4, 3], h: [2, 2], U: [2, 3]",
)
# The shared factor is itself a scope; Q names its iterators differently.
SHARED = pair(
    "L[m:2, n:3] Sum[k:4] x[m, k] * W[k, n] * {L[j:3] s[j] * s[j]}[n]",
    "L[a:2, b:3] Sum[r:2] h[a, r] * U[r, b] * {L[j:3] s[j] * s[j]}[b]",
    decls="x: [2, 4], W: [4, 3], h: [2, 2], U: [2, 3], s: [3]",
)
# P only sums over the first 3 of x's 5 columns (and W's 5 rows): both must be sliced.
LONG = pair(
    "L[m:2, n:3] Sum[k:3] x[m, k] * W[k, n]",
    "L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n]",
    decls="x: [2, 5], W: [5, 3], h: [2, 2], U: [2, 3]",
)
# Two 3x3 convolutions of different inputs: only the channel iterator c is read plainly.
CONVS = pair(
    "L[y:4, z:4, f:2] Sum[r:3, s:3, c:2] A[y+r-1, z+s-1, c] * K[r, s, f, c]",
    "L[y:4, z:4, f:2] Sum[r:3, s:3, c:3] B[y+r-1, z+s-1, c] * G[r, s, f, c]",
    outer="L[y:4, z:4, f:2]",
    tau="y, z, f",
    decls="A: [4, 4, 2], K: [3, 3, 2, 2], B: [4, 4, 3], G: [3, 3, 2, 3]",
)
# Read at shifted indices inside a longer + chain under an activation.
CHAIN = (
    "L[i:3, j:3] relu(C[j] + {L[m:2, n:3] Sum[k:4] x[m, k] * W[k, n]}[i-1, j]"
    " + {L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n]}[i-1, j])"
    " where x: [2, 4], W: [4, 3], h: [2, 2], U: [2, 3], C: [3]"
)
# A's source is a scope whose k dimension starts below 0: only [0, 2) of it is summed.
SCOPE_SOURCE = pair(
    "L[m:2, n:3] Sum[k:3] {L[a:2, b=-1:2] x[a, b+1]}[m, k] * W[k, n]",
    "L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n]",
    decls="x: [2, 4], W: [3, 3], h: [2, 2], U: [2, 3]",
)
THREE = (
    "L[i:2, j:3] {L[m:2, n:3] Sum[k:3] x[m, k] * W[k, n]}[i, j] + {L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n]}[i, j]"
    " + {L[m:2, n:3] Sum[k:1] g[m, k] * V[k, n]}[i, j]"
    " where x: [2, 4], W: [3, 3], h: [2, 2], U: [2, 3], g: [2, 1], V: [1, 3]"
)

# The sum of the two reads is summed again (a scale by 3): the merged contraction stays a read.
SUMMED_AGAIN = (
    "L[i:2] Sum[y:3] {L[a:2] Sum[k:4] A[a, k] * W[k]}[i] + {L[b:2] Sum[k:5] B[b, k] * V[k]}[i]"
    " where A: [2, 4], W: [4], B: [2, 5], V: [5]"
)

EXAMPLES = {
    "merge_summations": [
        Example(SUMMED_AGAIN),
        Example(lstm(), min_matches=2),
        Example(lstm("i", bias=True)),
        Example(MATMULS),
        Example(SHARED),
        Example(LONG),
        Example(CONVS),
        Example(CHAIN),
        Example(SCOPE_SOURCE),
        Example(THREE, min_matches=3),
    ],
}

NEAR_MISSES = {
    "merge_summations": [
        NearMiss(
            pair(
                "L[m:2] Sum[k:3, l:2] x[m, k, l]",
                "L[m:2] Sum[k:2, l:3] h[m, k, l]",
                outer="L[i:2]",
                tau="i",
                decls="x: [2, 3, 2], h: [2, 2, 3]",
            ),
            "sum over different ranges in 2 iterators",
        ),
        NearMiss(
            pair(
                "L[m:2, n:3] Sum[k:3] x[m, k+1] * W[k, n]",
                "L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n]",
                decls="x: [2, 4], W: [3, 3], h: [2, 2], U: [2, 3]",
            ),
            "factor x[m, k+1] reads k not as a plain index",
        ),
        NearMiss(
            pair(
                "L[m:2, n:3] Sum[k:3] x[m, k] * W[k, n]",
                "L[m:2, n:3] Sum[k:2] h[m+1, k] * U[k, n]",
                decls="x: [2, 3], W: [3, 3], h: [3, 2], U: [2, 3]",
            ),
            "factors x[m, k] and h[m+1, k] differ in index 0",
        ),
        NearMiss(
            "L[i:2, j:3] {L[m:2, n:3] Sum[k:3] x[m, k] * W[k, n]}[i, j]"
            " + {L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n]}[i, j+1]"
            " where x: [2, 3], W: [3, 3], h: [2, 2], U: [2, 3]",
            "are read at different indices",
        ),
        NearMiss(
            pair(
                "L[m:2, n:3] Sum[k:3] x[m, k] + W[k, n]",
                "L[m:2, n:3] Sum[k:2] h[m, k] + U[k, n]",
                decls="x: [2, 3], W: [3, 3], h: [2, 2], U: [2, 3]",
            ),
            "Y.1 is not a product",
        ),
        NearMiss(
            pair(
                "L[m:2, n:3] Sum[k:3] x[m, k] * W[k, n] * s[n]",
                "L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n] * t[n]",
                decls="x: [2, 3], W: [3, 3], h: [2, 2], U: [2, 3], s: [3], t: [3]",
            ),
            "factors s[n] and t[n] differ",
        ),
        NearMiss(
            pair(
                "L[m:2, n:3] Sum[k=1:3] x[m, k] * W[k, n]",
                "L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n]",
                decls="x: [2, 3], W: [3, 3], h: [2, 2], U: [2, 3]",
            ),
            "concatenation needs ranges from 0",
        ),
        NearMiss(
            pair(
                "L[m:2, n:3] Sum[k:3] x[m, k] * W[k, n]",
                "L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n]",
                decls="x: [2, 3], W: [3, 3], h: [2, 2], U: [2, 4]",
            ),
            "different ranges in dimension 1",
        ),
        NearMiss(
            pair(
                "L[m:2, n:3] Sum[k:3] x[m, k] * W[k, n]",
                "L[m:2, n:3] Sum[k:2] h[k, m] * U[k, n]",
                decls="x: [2, 3], W: [3, 3], h: [2, 2], U: [2, 3]",
            ),
            "read k in different dimensions",
        ),
    ],
}


def _merge(program: ir.Program, where: str) -> ir.Program:
    (after,) = [a for m, a in apply_all("merge_summations", program) if m.where == where]
    return after


def test_lstm_gate_becomes_one_contraction_over_concatenated_operands():
    program = parse(lstm())
    (m,) = [m for m in get("merge_summations").matches(program) if m.where == "pre_i"]
    assert m.summary == "merge Sum k of mx_i and mh_i (4 + 4) into one contraction"
    after = _merge(program, "pre_i")
    assert str(after.scope("pre_i")) == (
        "L[i0:2, i1:4] Sum[k:8] {L[i0:2, i1:8] x[i0, i1] + h[i0, i1-4]}[i0, k]"
        " * {L[i0:8, i1:4] Wx_i[i0, i1] + Wh_i[i0-4, i1]}[k, i1]"
        " where x: [2, 4], h: [2, 4], Wx_i: [4, 4], Wh_i: [4, 4]"
    )
    # mx_i and mh_i are no longer read, so their bindings are dropped; pre_f is untouched.
    assert [n for n, _ in after.bindings] == ["pre_i", "mx_f", "mh_f", "pre_f"]
    assert after.scope("pre_f") is program.scope("pre_f")


def test_bias_stays_in_the_chain():
    after = _merge(parse(lstm("i", bias=True)), "pre_i")
    pre = after.scope("pre_i")
    assert not pre.summation
    assert str(pre).startswith("L[i0:2, i1:4] {L[m:2, n:4] Sum[k:8] ")
    assert "}[i0, i1] + b_i[i1]" in str(pre)


def test_special_case_keeps_the_pad_and_avoids_name_clashes():
    text = (
        "L[k:2, n:3 | pad 1:0, 0:0] {L[m:2, n:3] Sum[k:4] x[m, k] * W[k, n]}[k, n]"
        " + {L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n]}[k, n]"
        " where x: [2, 4], W: [4, 3], h: [2, 2], U: [2, 3]"
    )
    ((_, after),) = apply_all("merge_summations", load(text))
    y = after.scope("Y")
    assert [it.name for it in y.traversal] == ["k", "n"] and y.pad == ((1, 0), (0, 0))
    assert [(it.name, it.hi) for it in y.summation] == [("k1", 6)]


def test_shared_nested_factor_is_kept_once():
    ((_, after),) = apply_all("merge_summations", load(SHARED))
    y = after.scope("Y")
    assert [(it.name, it.hi) for it in y.summation] == [("k", 6)]
    assert str(y.body).endswith("}[k, j] * {L[j:3] s[j] * s[j]}[j]")
    assert "h[i0, i1-4]" in str(y.body) and "U[i0-4, i1]" in str(y.body)


def test_longer_operand_is_sliced_to_the_summed_range():
    ((_, after),) = apply_all("merge_summations", load(LONG))
    body = str(after.scope("Y").body)
    assert "{L[i0:2, i1:5] {L[i0:2, i1:3] x[i0, i1]}[i0, i1] + h[i0, i1-3]}[i, k]" in body
    assert "{L[i0:5, i1:3] {L[i0:3, i1:3] W[i0, i1]}[i0, i1] + U[i0-3, i1]}[k, j]" in body
    assert [(it.name, it.hi) for it in after.scope("Y").summation] == [("k", 5)]


def test_convolutions_concatenate_along_channels_only():
    program = load(CONVS)
    ((m, after),) = apply_all("merge_summations", program)
    assert m.summary == "merge Sum c of Y.1 and Y.2 (2 + 3) into one contraction"
    y = after.scope("Y")
    assert [(it.name, it.hi) for it in y.summation] == [("r", 3), ("s", 3), ("c", 5)]


def test_chain_under_activation_keeps_other_terms():
    ((_, after),) = apply_all("merge_summations", load(CHAIN))
    body = after.scope("Y").body
    assert isinstance(body, ir.Unary) and str(body).startswith("relu(C[j] + {L[m:2, n:3] Sum[k:6]")
    assert str(body).endswith("}[i-1, j])")


def test_contractions_of_unrelated_shape_are_not_candidates():
    text = "L[i:2, j:3] {L[m:2, n:3] x[m, n]}[i, j] + {L[m:2, n:3] Sum[k:2] h[m, k] * U[k, n]}[i, j]"
    program = load(text + " where x: [2, 3], h: [2, 2], U: [2, 3]")
    assert list(get("merge_summations").match(program)) == []


def test_gates_then_concat_merge_share_the_concatenated_input():
    program = parse(lstm(GATES))
    steps = [Apply("merge_summations", f"pre_{g}") for g in GATES]
    merged = derive(program, steps).result
    xh = {
        acc.source for g in GATES for acc in [merged.scope(f"pre_{g}").body.a] if isinstance(acc, ir.Access)
    }
    assert len(xh) == 1  # every gate reads the same concat(x, h) scope
    offered = [m.summary for m in get("merge_expressions").matches(merged)]
    assert "concat pre_i, pre_f along i1 into M" in offered
    fused = derive(
        merged,
        [
            Apply("merge_expressions", "pre_i, pre_f", "concat"),
            Apply("merge_expressions", "M, pre_g", "concat"),
            Apply("merge_expressions", "M1, pre_o", "concat"),
        ],
    ).result
    check_result(program, fused)
    # One matmul [2, 8] x [8, 16] computes all four gates; the gates read slices of it.
    (m,) = [s for _, s in fused.bindings if s.summation and s.shape == (2, 16)]
    assert [(it.name, it.hi) for it in m.summation] == [("k", 8)]
    pre_o = fused.scope("pre_o").body
    assert pre_o.source is m and str(pre_o).endswith("}[i0, i1+12]")


# --------------------------------------------------------------------------
# Random pairs of contractions that qualify
# --------------------------------------------------------------------------


def _chain(terms: list[ir.ValueExpr]) -> ir.ValueExpr:
    out = terms[0]
    for t in terms[1:]:
        out = out * t
    return out


@st.composite
def summed_pairs(draw) -> ir.Program:
    """``L[x] (C +) P[tau] + Q[tau]`` with P, Q contractions along k of random lengths and shapes."""
    trav = tuple(
        ir.Iter(n, lo, lo + draw(st.integers(1, 3)))
        for n, lo in zip(
            "mn", draw(st.lists(st.sampled_from([0, 0, -1, 1]), min_size=1, max_size=2)), strict=False
        )
    )
    others = tuple(
        ir.Iter(n, lo, lo + draw(st.integers(1, 2)))
        for n, lo in zip("s", draw(st.lists(st.sampled_from([0, -1]), max_size=1)), strict=False)
    )
    k1, k2 = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    kp, kq = ir.Iter("k", 0, k1), ir.Iter("k", 0, k2)
    at = draw(st.integers(0, len(others)))
    sums_p = others[:at] + (kp,) + others[at:]
    free = trav + others
    kinds = draw(st.lists(st.booleans(), min_size=1, max_size=3).filter(any))
    fp, fq = [], []
    for f, reads_k in enumerate(kinds):
        rank = draw(st.integers(1, 3))
        idx = [draw(affine_index(free)) for _ in range(rank)]
        shape = [draw(st.integers(1, 4)) for _ in range(rank)]
        if not reads_k:
            s = ir.Tensor(f"S{f}", tuple(shape))[tuple(idx)]
            fp.append(s)
            fq.append(s)
            continue
        e = draw(st.integers(0, rank - 1))
        idx[e] = kp
        a = ir.Tensor(f"A{f}", tuple(draw(st.integers(1, 5)) if j == e else n for j, n in enumerate(shape)))
        b = ir.Tensor(f"B{f}", tuple(draw(st.integers(1, 5)) if j == e else n for j, n in enumerate(shape)))
        fp.append(a[tuple(idx)])
        fq.append(substitute_iters(b[tuple(idx)], {kp: kq}))
    p = ir.Scope(trav, sums_p, _chain(fp))
    # Q names its iterators differently.
    rename = {it: ir.Iter(it.name + "2", it.lo, it.hi) for it in trav + others + (kq,)}
    q = ir.Scope(
        tuple(rename[it] for it in trav),
        tuple(rename[it] for it in others[:at] + (kq,) + others[at:]),
        substitute_iters(_chain(fq), rename),
    )
    if draw(st.booleans()):  # exactly the scope's traversal: the scope becomes the contraction
        outer, tau = tuple(ir.Iter(f"i{j}", it.lo, it.hi) for j, it in enumerate(trav)), None
    else:
        outer = tuple(ir.Iter(f"i{j}", -1, draw(st.integers(1, 4))) for j in range(len(trav)))
        tau = tuple(simplify_shift(it, draw(st.integers(-1, 1))) for it in outer)
    tau = tau or outer
    terms = [p[tau], q[tau]]
    if draw(st.booleans()):
        terms.insert(draw(st.integers(0, 2)), ir.Tensor("C", (3,))[outer[0]])
    body = terms[0]
    for t in terms[1:]:
        body = body + t
    return as_program(ir.Scope(outer, (), body))


def simplify_shift(it: ir.Iter, off: int) -> ir.IndexExpr:
    return it if off == 0 else ir.IAdd(it, ir.IConst(off))


@settings(max_examples=80, deadline=None)
@given(summed_pairs())
def test_random_contraction_pairs_merge(program):
    applied = apply_all("merge_summations", program)
    assert any("Sum k of Y.1 and Y.2" in m.summary for m, _ in applied), [
        str(f) for f in get("merge_summations").failures(program)
    ]
