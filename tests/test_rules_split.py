"""split_expression: examples, near misses, residue and range splits of random contractions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rules_support import Example, NearMiss, apply_all, as_program, contractions, load

from einopt.core import ir
from einopt.rules import get

CONV3X3 = "L[h:6, w:5, f:4] Sum[r:3, s:3, c:3] A[h+r-1, w+s-1, c] * K[r, s, f, c] where A: [6, 5, 3], K: [3, 3, 4, 3]"

# ConvTranspose k4 s2 p1 in the importer's form: X read through the zero-insertion scope U.
U = "{L[n:1, c:3, i0:4, p0:1, i1:4, p1:1] X[n, c, i0, i1]}"
CONV_TRANSPOSE = (
    f"L[n:1, f:2, h:8, w:8] Sum[c:3, kh:4, kw:4] {U}[n, c, (h+1-kh)//2, (h+1-kh)%2, (w+1-kw)//2, (w+1-kw)%2]"
    " * W[c, f, kh, kw] where X: [1, 3, 4, 4], W: [3, 2, 4, 4]"
)

# The same ConvTranspose inside its bias epilogue, as the translator writes DCGAN's layers.
NESTED_CONV_TRANSPOSE = (
    f"Z = L[n:1, f:2, h:8, w:8] {{L[n:1, f:2, h:8, w:8] Sum[c:3, kh:4, kw:4] "
    f"{U}[n, c, (h+1-kh)//2, (h+1-kh)%2, (w+1-kw)//2, (w+1-kw)%2] * W[c, f, kh, kw]}}[n, f, h, w] + B[f]"
    "\nreturn Z\nwhere X: [1, 3, 4, 4], W: [3, 2, 4, 4], B: [2]"
)

EXAMPLES = {
    "split_expression": [
        Example(NESTED_CONV_TRANSPOSE, min_matches=3),
        Example(CONV3X3, min_matches=7),
        Example(CONV_TRANSPOSE, min_matches=2),
        # Dilation 2: residue 2 on h; an odd range starting below 0.
        Example("L[h=-3:4, f:2] Sum[r:3, c:2] A[h+2*r, c] * K[r, f, c] where A: [6, 2], K: [3, 2, 2]"),
        Example(
            "T = L[i:6, j:4 | pad 1:0, 0:0] A[i, j] * 2\nY = L[i:6] Sum[j:4] T[i, j]\nreturn Y where A: [6, 4]"
        ),
    ],
}

NEAR_MISSES = {
    "split_expression": [
        NearMiss("L[i:1, j:1] Sum[k:4] A[i, k] * B[k, j] where A: [1, 4], B: [4, 1]", "single value"),
    ],
}


def _split(text: str, summary: str) -> ir.Program:
    program = load(text)
    (after,) = [
        a
        for m, a in apply_all("split_expression", program)
        if summary in m.summary
        and all((mode in summary) == (mode in m.summary) for mode in ("stacked", "interleaved"))
    ]
    return after


def test_split_by_residue_gives_phase_parts_and_a_strided_recombination():
    after = _split(CONV_TRANSPOSE, "split h of Y by residue 2")
    assert [n for n, _ in after.bindings] == ["Y0", "Y1", "Y"]
    for p, name in enumerate(("Y0", "Y1")):
        part = after.scope(name)
        assert [(it.name, it.lo, it.hi) for it in part.traversal[2:4]] == [("hr", p, p + 1), ("hq", 0, 4)]
    assert "Y = L[n:1, f:2, h:8, w:8] Y0[n, f, h%2, h//2, w] + Y1[n, f, h%2, h//2, w]" in str(after)
    # The residue is a constant in each part: h = 2*hq + p.
    assert "hq+(-kh+1)//2" in str(after.scope("Y0").body)
    assert "hq+(-kh//2)+1, -kh%2" in str(after.scope("Y1").body)


def test_split_by_every_residue_at_once_gives_the_four_phases():
    after = _split(CONV_TRANSPOSE, "split h, w of Y by residue 2")
    assert [n for n, _ in after.bindings] == ["Y0", "Y1", "Y2", "Y3", "Y"]
    ranges = [
        [(it.name, it.lo, it.hi) for it in after.scope(n).traversal if it.name in ("hr", "wr")]
        for n in ("Y0", "Y1", "Y2", "Y3")
    ]
    assert ranges == [[("hr", ph, ph + 1), ("wr", pw, pw + 1)] for ph in (0, 1) for pw in (0, 1)]
    assert "Y3[n, f, h%2, h//2, w%2, w//2]" in str(after)


def test_a_nested_contraction_is_bound_then_split_into_its_phases():
    after = _split(NESTED_CONV_TRANSPOSE, "split h, w of Zs (nested in Z) by residue 2")
    assert [n for n, _ in after.bindings] == ["Zs0", "Zs1", "Zs2", "Zs3", "Zs", "Z"]
    assert "Z = L[n:1, f:2, h:8, w:8] Zs[n, f, h, w] + B[f]" in str(after)
    assert "Zs3[n, f, h%2, h//2, w%2, w//2]" in str(after)


def test_stacked_phases_are_a_channel_concat_read_as_depth_to_space():
    after = _split(CONV_TRANSPOSE, "stacked along f as Yc")
    assert [n for n, _ in after.bindings] == ["Y0", "Y1", "Y2", "Y3", "Yc", "Y"]
    assert (
        "Yc = L[n:1, f:8, hq:4, wq:4] Y0[n, f, hq, wq] + Y1[n, f-2, hq, wq]"
        " + Y2[n, f-4, hq, wq] + Y3[n, f-6, hq, wq]"
    ) in str(after)
    # DepthToSpace, DCR: channel (h%2*2 + w%2)*F + f of the concatenation.
    assert "Y = L[n:1, f:2, h:8, w:8] Yc[n, (h%2*2+w%2)*2+f, h//2, w//2]" in str(after)


def test_stacked_phases_of_a_nested_contraction_carry_its_epilogue():
    after = _split(NESTED_CONV_TRANSPOSE, "stacked along f as Zsc, each with Z's epilogue")
    assert [n for n, _ in after.bindings] == ["Zs0", "Zs1", "Zs2", "Zs3", "Zsc", "Z"]
    # Each phase is a 4-D contraction with the bias added: a Conv with a bias, no residue axes.
    for name in ("Zs0", "Zs1", "Zs2", "Zs3"):
        part = after.scope(name)
        assert [(it.name, it.extent) for it in part.traversal] == [("n", 1), ("f", 2), ("hq", 4), ("wq", 4)]
        assert "}[n, f, hq, wq] + B[f] where" in str(part)
    assert "Z = L[n:1, f:2, h:8, w:8] Zsc[n, (h%2*2+w%2)*2+f, h//2, w//2]" in str(after)


def test_interleaved_phases_fill_unit_residue_slots_read_back_as_a_reshape():
    after = _split(NESTED_CONV_TRANSPOSE, "interleaved as Zsc, each with Z's epilogue")
    assert [n for n, _ in after.bindings] == ["Zs0", "Zs1", "Zs2", "Zs3", "Zsc", "Z"]
    # Phase (1, 0): rows 2*hq + 1, columns 2*wq; its residue axes hold that one slot each.
    part = after.scope("Zs2")
    slots = [(it.name, it.lo, it.hi) for it in part.traversal]
    assert slots == [("n", 0, 1), ("f", 0, 2), ("hq", 0, 4), ("hr", 1, 2), ("wq", 0, 4), ("wr", 0, 1)]
    assert "}[n, f, hq, wq] + B[f] where" in str(part)
    assert (
        "Zsc = L[n:1, f:2, hq:4, hr:2, wq:4, wr:2] Zs0[n, f, hq, hr, wq, wr] + Zs1[n, f, hq, hr, wq, wr]"
    ) in str(after)
    # h = 2*hq + hr: the [.., hq, hr, wq, wr] layout is the output's own, so the read is a reshape.
    assert "Z = L[n:1, f:2, h:8, w:8] Zsc[n, f, h//2, h%2, w//2, w%2]" in str(after)


def test_stacking_needs_a_channel_axis_before_the_split_axes():
    program = load("L[h:6, w:6] Sum[r:3] A[(h+r)//2, (w+r)//2] where A: [4, 4]")
    summaries = [m.summary for m, _ in apply_all("split_expression", program)]
    assert any("split h, w of Y by residue 2" in s for s in summaries)
    assert not [s for s in summaries if "stacked" in s]


def test_a_nested_scope_without_a_summation_is_not_split():
    program = load("Z = L[i:8] {L[i:8] X[i//2]}[i] + 1\nreturn Z\nwhere X: [4]")
    summaries = [m.summary for m, _ in apply_all("split_expression", program)]
    assert summaries and not [s for s in summaries if "nested" in s]


def test_every_residue_at_once_needs_two_axes():
    program = load("L[h:6, f:2] Sum[r:3, c:2] A[(h+r)//2, c] * K[r, f, c] where A: [4, 2], K: [3, 2, 2]")
    summaries = [m.summary for m in get("split_expression").matches(program)]
    assert "split h of Y by residue 2 into Y0, Y1" in summaries
    assert not any(", f of Y by residue" in s or "h, " in s for s in summaries)


def test_split_at_padding_boundaries_and_middle():
    summaries = [m.summary for m in get("split_expression").matches(load(CONV3X3))]
    assert "split h of Y at 1 into Y0, Y1" in summaries  # row 0 reads the padding above
    assert "split h of Y at 5 into Y0, Y1" in summaries  # row 5 reads the padding below
    assert "split h of Y at 3 into Y0, Y1" in summaries  # the middle
    after = _split(CONV3X3, "split h of Y at 5")
    assert [(it.lo, it.hi) for it in (after.scope("Y0").traversal[0], after.scope("Y1").traversal[0])] == [
        (0, 5),
        (5, 6),
    ]
    assert "Y = L[h:6, w:5, f:4] Y0[h, w, f] + Y1[h, w, f]" in str(after)


def test_readers_keep_reading_the_rebound_scope():
    text = "T = L[i:6, j:4] A[i, j] * 2\nY = L[i:6] Sum[j:4] T[i, j]\nreturn Y where A: [6, 4]"
    after = _split(text, "split i of T at 3")
    assert [n for n, _ in after.bindings] == ["T0", "T1", "T", "Y"]
    assert after.scope("T") in ir.scopes_in(after.scope("Y"))


def test_residue_larger_than_range_is_refused():
    program = load("L[h:2] Sum[r:3] A[h+3*r] where A: [9]")
    failures = [str(f) for f in get("split_expression").failures(program)]
    assert any("fewer than the residue 3" in f for f in failures)


@st.composite
def strided(draw):
    """A random contraction times ``D[(c*x + o) // k, (c*x + o) % k]`` for a traversal iterator x."""
    scope = draw(contractions(max_sums=2))
    x = draw(st.sampled_from(scope.traversal))
    k = draw(st.integers(2, 3))
    c = draw(st.sampled_from([1, 1, 2, -1]))
    inner = ir.IAdd(ir.IMul(ir.IConst(c), x), ir.IConst(draw(st.integers(-1, 2))))
    d = ir.Tensor("D", (draw(st.integers(1, 4)), k))
    body = scope.body * d[ir.IFloorDiv(inner, k), ir.IMod(inner, k)]
    return as_program(ir.Scope(scope.traversal, scope.summation, body)), x, k, c


@settings(max_examples=40, deadline=None)
@given(strided())
def test_random_residue_splits(case):
    program, x, k, c = case
    applied = apply_all("split_expression", program)
    residue = [m for m, _ in applied if f"split {x.name} of Y by residue {k}" in m.summary]
    assert residue or x.extent < k or c % k == 0


@settings(max_examples=40, deadline=None)
@given(contractions(max_sums=2))
def test_random_range_splits(scope):
    applied = apply_all("split_expression", as_program(scope))
    splittable = [it for it in scope.traversal if it.extent > 1]
    assert len(applied) >= len(splittable)
