"""Layout rules: split, merge and swap one dimension of one access (Fig. 14)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rules_support import Example, NearMiss, apply_all, as_program, iterators, load, programs

from einopt.core import ir
from einopt.core.rewrite import accesses
from einopt.core.syntax import format_expr
from einopt.rules import get
from einopt.rules.layout import split_factors

# Fig. 14: a batched matmul-like expression whose operands are read through k*q + r.
FIG14 = "L[b:2, q:4, r:4, w:7] Sum[k:3] A[b, 4*q + r, k] * B[b, 4*q + r + 4*w - 12, k] where A: [2, 16, 3], B: [2, 16, 3]"
CONV_HWC = "L[h:5, w:4, f:3] Sum[r:3, s:3, c:2] A[h+r-1, w+s-1, c] * K[r, s, f, c] where A: [5, 4, 2], K: [3, 3, 3, 2]"
# A 1-D convolution along each row: nothing merges (w+s-1 leaves [0, 4)), nothing is out of order.
ROW_CONV = "L[h:4, w:4] Sum[s:3] A[h, w+s-1] * K[s] where A: [4, 4], K: [3]"
MATMUL_T = "L[i:3, j:4] Sum[k:5] A[k, i] * B[k, j] where A: [5, 3], B: [5, 4]"
# The Fig. 5 intermediate: a scope whose ranges start below zero, read at offsets.
OFFSET_REDUCE = (
    "L[h:4, w:3, f:2] Sum[r:3, s:3] "
    "{L[r:3, s:3, f:2, t1=-1:5, t2=-1:4] Sum[c:2] A[t1, t2, c] * K[r, s, f, c]}[r, s, f, h+r-1, w+s-1] "
    "where A: [4, 3, 2], K: [3, 3, 2, 2]"
)
RESHAPED = "L[i:4, j:3] Sum[k:6] A[i, k//2, k%2] * B[k, j] where A: [4, 3, 2], B: [6, 3]"
STRIDED_SCOPE = (
    "L[p:3, t:2] Sum[u:2] {L[x=-2:5, y:2] Sum[c:2] A[x, c] * B[c, y]}[2*p + u - 1, t] "
    "where A: [5, 2], B: [2, 2]"
)

EXAMPLES = {
    "split_dimension": [
        Example(FIG14, min_matches=2),
        Example(RESHAPED),
        Example(STRIDED_SCOPE),
        Example("L[i:3, j:2] Sum[k:4] A[3*i + k, j] * B[k] where A: [9, 2], B: [4]", min_matches=1),
    ],
    "merge_dimensions": [
        Example(FIG14, min_matches=3),
        Example(RESHAPED, min_matches=3),
        Example(OFFSET_REDUCE, min_matches=2),
        Example(STRIDED_SCOPE),
    ],
    "swap_dimensions": [
        Example(MATMUL_T, min_matches=2),
        Example(OFFSET_REDUCE, min_matches=1),
        Example("L[i:3, j:4] relu(A[j, i]) + B[i, j] where A: [4, 3], B: [3, 4]"),
    ],
}

NEAR_MISSES = {
    "split_dimension": [NearMiss(CONV_HWC, "no index of A has a stride to split by")],
    "merge_dimensions": [
        NearMiss(ROW_CONV, "index w+s-1 of dimension 1 of A may leave [0, 4): merging would alias")
    ],
    "swap_dimensions": [NearMiss(ROW_CONV, "A is read in the scope's iterator order: nothing to swap")],
}


def _results(rule: str, text: str) -> dict[str, ir.Program]:
    return {m.summary: p for m, p in apply_all(rule, load(text))}


def _indices(a: ir.Access) -> list[str]:
    return [i.name if isinstance(i, ir.Iter) else str(i) for i in a.indices]


def _read_of(program: ir.Program, tensor: str) -> ir.Access:
    """The access in Y's body that reads the new layout scope over ``tensor``."""
    [read] = [
        a
        for a in accesses(program.scope("Y").body)
        if isinstance(a.source, ir.Scope) and any(t.name == tensor for t in ir.tensors_in(a.source))
    ]
    return read


# --------------------------------------------------------------------------
# Split
# --------------------------------------------------------------------------


def test_fig14_split_gives_plain_reads():
    found = _results("split_dimension", FIG14)
    assert sorted(found) == ["split dimension 1 of A by 4", "split dimension 1 of B by 4"]
    a = _read_of(found["split dimension 1 of A by 4"], "A")
    assert _indices(a) == ["b", "q", "r", "k"]
    assert format_expr(a.source, declare=False) == "L[i:2, q:4, r:4, i1:3] A[i, 4*q+r, i1]"
    b = _read_of(found["split dimension 1 of B by 4"], "B")
    assert _indices(b) == ["b", "q+w-3", "r", "k"]
    assert b.source.shape == (2, 4, 4, 3)


def test_split_of_a_scope_with_negative_range_covers_it():
    [(m, after)] = apply_all("split_dimension", load(STRIDED_SCOPE))
    assert m.summary == "split dimension 0 of scope by 2"
    outer = after.scope("Y")
    [read] = accesses(outer.body)
    layout = read.source
    # x ranges over [-2, 5): q over [floor(-2/2), ceil(5/2)) = [-1, 3), r over [0, 2).
    assert [(it.lo, it.hi) for it in layout.traversal] == [(-1, 3), (0, 2), (0, 2)]
    # u-1 covers [-1, 1), so the quotient and remainder keep a // and a %.
    assert _indices(read) == ["p+(u+1)//2-1", "(u+1)%2", "t"]


def test_split_factors_come_from_the_index_function():
    q, r, w = ir.Iter("q", 0, 4), ir.Iter("r", 0, 4), ir.Iter("w", 0, 7)
    assert split_factors(4 * q + r + 4 * w - 12) == [4]
    assert split_factors(16 * q + 4 * r + w) == [4, 16]
    assert split_factors(q // 3 + r) == [3]
    assert split_factors(q + r - 1) == []


def test_layout_scopes_are_not_re_laid_out():
    found = _results("split_dimension", FIG14)
    after = found["split dimension 1 of A by 4"]
    # The new layout scope reads A[i, 4*q+r, i1] but is itself not offered for splitting again.
    summaries = [m.summary for m in get("split_dimension").matches(after)]
    assert summaries == ["split dimension 1 of B by 4"]


# --------------------------------------------------------------------------
# Merge
# --------------------------------------------------------------------------


def test_merge_of_div_mod_reads_gives_a_plain_read():
    found = _results("merge_dimensions", RESHAPED)
    assert sorted(found) == [
        "merge dimensions 0, 1 of A",
        "merge dimensions 0, 1 of B",
        "merge dimensions 1, 2 of A",
    ]
    read = _read_of(found["merge dimensions 1, 2 of A"], "A")
    assert _indices(read) == ["i", "k"]
    assert format_expr(read.source, declare=False) == "L[i:4, z:6] A[i, z//2, z%2]"


def test_merge_refused_when_inner_index_may_alias():
    rule = get("merge_dimensions")
    program = load(CONV_HWC)
    failures = [f.reason for f in rule.failures(program)]
    assert "index w+s-1 of dimension 1 of A may leave [0, 4): merging would alias" in failures
    merged = [m.summary for m in rule.matches(program)]
    assert "merge dimensions 0, 1 of A" not in merged
    assert "merge dimensions 1, 2 of A" in merged  # c stays in [0, 2)


def test_merge_of_a_scope_with_negative_ranges_keeps_value_indexing():
    found = _results("merge_dimensions", OFFSET_REDUCE)
    after = found["merge dimensions 0, 1 of scope"]
    [read] = accesses(after.scope("Y").body)
    assert _indices(read) == ["3*r+s", "f", "h+r-1", "w+s-1"]
    # Dimensions 3, 4 (t1 over [-1, 5), t2 over [-1, 4)) merge: w+s-1 stays in [-1, 4).
    assert "merge dimensions 3, 4 of scope" in found


# --------------------------------------------------------------------------
# Swap
# --------------------------------------------------------------------------


def test_swap_transposes_an_operand_read_out_of_order():
    found = _results("swap_dimensions", MATMUL_T)
    assert sorted(found) == ["swap dimensions 0, 1 of A", "swap dimensions 0, 1 of B"]
    read = _read_of(found["swap dimensions 0, 1 of A"], "A")
    assert _indices(read) == ["i", "k"]
    assert format_expr(read.source, declare=False) == "L[i1:3, i:5] A[i, i1]"


def test_swap_is_not_offered_for_reads_in_order():
    program = load("L[i:3, j:4] Sum[k:5] A[i, k] * B[k, j] where A: [3, 5], B: [5, 4]")
    summaries = [m.summary for m in get("swap_dimensions").matches(program)]
    assert summaries == ["swap dimensions 0, 1 of B"]


# --------------------------------------------------------------------------
# Random contractions
# --------------------------------------------------------------------------


@st.composite
def strided_programs(draw) -> ir.Program:
    """Contractions whose operands are read at ``k*x + y + c`` and at permuted iterators."""
    traversal = draw(iterators("ijk", 2, 3))
    summation = draw(iterators("pq", 0, 2, 3))
    its = traversal + summation
    factors = []
    for name in "AB":
        indices = []
        for _ in range(draw(st.integers(1, 3))):
            x, y = draw(st.permutations(its))[:2]
            k = draw(st.sampled_from([2, 3, 4]))
            c = draw(st.integers(-2, 2))
            indices.append(
                draw(
                    st.sampled_from(
                        [x, ir.IAdd(ir.IMul(ir.IConst(k), x), ir.IAdd(y, ir.IConst(c))), x // k, x % k]
                    )
                )
            )
        shape = tuple(draw(st.integers(1, 9)) for _ in indices)
        factors.append(ir.Tensor(name, shape)[tuple(indices)])
    return as_program(ir.Scope(traversal, summation, ir.Binary("*", *factors)))


@settings(max_examples=60, deadline=None)
@given(strided_programs())
def test_random_strided_reads(program):
    for rule in ("split_dimension", "merge_dimensions", "swap_dimensions"):
        apply_all(rule, program)


@settings(max_examples=80, deadline=None)
@given(programs())
def test_random_contractions(program):
    for rule in ("split_dimension", "merge_dimensions", "swap_dimensions"):
        for m, after in apply_all(rule, program):
            assert after.scope("Y").traversal == program.scope("Y").traversal, m
