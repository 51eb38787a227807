"""Merging adjacent subprograms whose chosen programs fuse further (``einopt.backends.tvm.partmerge``)."""

from __future__ import annotations

import shutil
from types import SimpleNamespace as NS

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_models import lstm_cell

from einopt import L, Sum, iters, program, sigmoid, tensor
from einopt.backends.tvm import kernels
from einopt.backends.tvm.partmerge import MAX_OTHERS, MERGE_RULE, _convex, _pair, _runners_up, _Side, compose
from einopt.core.interp import evaluate
from einopt.models import build, sample_inputs

needs_cc = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler on this machine"
)


def _two_programs():
    """A MatMul with its bias at two offsets (``first``), and an element-wise tail reading both
    pieces and a tensor of its own (``second``)."""
    m, n, k = iters("m:2 n:4 k:3")
    (wide,) = iters("n:8")
    X, W, B = tensor("X", (2, 3)), tensor("W", (3, 8)), tensor("B", (8,))
    M = L(m, wide)(Sum(k)(X[m, k] * W[k, wide]))
    lo = L(m, n)(M[m, n] + B[n])
    hi = L(m, n)(M[m, n + 4] + B[n + 4])
    first = program({"lo": lo, "hi": hi}, {"M": M})
    a, b, c = tensor("a", (2, 4)), tensor("b", (2, 4)), tensor("X", (2, 4))  # X: a clash of names
    y = L(m, n)(sigmoid(a[m, n]) * b[m, n] + c[m, n])
    second = program({"y": y})
    first_names = {"X": "x", "W": "w", "B": "bias", "lo": "v_lo", "hi": "v_hi"}
    second_names = {"a": "v_lo", "b": "v_hi", "X": "other", "y": "out"}
    return first, first_names, second, second_names


def test_compose_reads_the_first_programs_scopes_where_the_second_reads_its_outputs():
    first, fn, second, sn = _two_programs()
    rename = {"a": "a", "b": "b", "X": "X1", "y": "y"}
    both = compose(first, fn, second, sn, ["y", "lo"], rename)
    assert both.outputs == ("y", "lo")
    assert {t.name for t in both.inputs} == {"X", "W", "B", "X1"}  # a and b are read from first's scopes
    rng = np.random.default_rng(0)
    feeds = {"X": rng.standard_normal((2, 3)), "W": rng.standard_normal((3, 8)), "B": rng.standard_normal(8)}
    other = rng.standard_normal((2, 4))
    mid = evaluate(first, feeds)
    want = evaluate(second, {"a": mid["lo"], "b": mid["hi"], "X": other})["y"]
    got = evaluate(both, {**feeds, "X1": other})
    np.testing.assert_allclose(got["y"], want, rtol=1e-12)
    np.testing.assert_allclose(got["lo"], mid["lo"], rtol=1e-12)


def test_a_group_with_an_outside_node_between_its_parts_is_not_convex():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"]),  # outside: between node 0 and node 2
        helper.make_node("Add", ["a", "b"], ["c"]),
    ]
    v = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [v("x", TensorProto.FLOAT, [2])], [v("c", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph)
    assert not _convex(model, {0, 2})
    assert _convex(model, {0, 1}) and _convex(model, {1, 2}) and _convex(model, {0, 1, 2})


@pytest.mark.tvm
@needs_cc
def test_the_lstm_cells_linear_part_and_tail_merge_into_one_matmul_and_generated_kernels():
    from einopt.pipeline import Options, optimize
    from einopt.runtime.modelio import session

    model = build("lstm", 1, size="small")
    result = optimize(model, Options(kernels="tvm", max_depth=0, accept="verified", cache=False))
    merged = [p for p in result.parts if "+" in p.name]
    assert len(merged) == 1 and merged[0].status == "rewritten"
    assert MERGE_RULE in merged[0].trace
    kinds = [n.op_type for n in result.model.graph.node]
    # The bias Adds of the gates are computed inside the tail's kernels, reading the MatMuls' outputs.
    assert "Add" not in kinds and "Sigmoid" not in kinds and kinds.count(kernels.OP_TYPE) == 1
    feeds = sample_inputs(model, seed=3)
    names = [o.name for o in model.graph.output]
    want = dict(zip(names, session(model).run(None, feeds), strict=True))
    got = dict(zip(names, session(result.model).run(None, feeds), strict=True))
    for name in names:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    assert isinstance(result.model, onnx.ModelProto)


@pytest.mark.tvm
@needs_cc
def test_no_pair_is_tried_once_the_merge_budget_has_run_out(monkeypatch):
    from einopt.backends.tvm import partmerge
    from einopt.pipeline import Options, optimize

    monkeypatch.setattr(partmerge, "BUDGET_S", -1.0)
    model = build("lstm", 1, size="small")
    result = optimize(model, Options(kernels="tvm", max_depth=0, accept="verified", cache=False))
    assert not [p for p in result.parts if "+" in p.name]
    assert len(result.parts) == 2


def test_with_generated_kernels_selection_prefers_fewer_nodes_among_ties():
    from einopt.stages.select import Trial, choose

    def trial(speedup: float, nodes: int) -> Trial:
        return Trial(
            "p",
            NS(depth=3),
            instantiated=NS(nodes=[None] * nodes, only_at=None),
            measured=NS(speedup=speedup),
        )

    many, few, slow = trial(2.77, 9), trial(2.70, 5), trial(2.40, 3)
    best, tried = choose([many, few, slow], timed=True, fewer_nodes=True)
    assert best is few  # 2.70x is a tie with 2.77x (within the 5% noise band); 2.40x is not
    assert "tie with the chosen" in tried[0].rejected and "9 against 5" in tried[0].rejected
    assert "slower than the chosen" in tried[2].rejected
    assert choose([many, few, slow], timed=True)[0] is many  # the portable form: the fastest


def _merged_gates(model, part, gates: str):
    """``part``'s program with ``merge_summations`` applied at each gate of ``gates`` ("if": the
    input and forget gates), as a candidate with its trace."""
    from einopt.rules.derive import Apply, TraceStep, apply_rule
    from einopt.search.results import Candidate

    program, trace = part.program, []
    for g in gates:
        program, match = apply_rule(program, Apply("merge_summations", at=f"pre_{g}"))
        trace.append(TraceStep("merge_summations", f"pre_{g}", match.summary, program))
    return Candidate(program, tuple(trace), (), 1e-5)


def test_a_merged_pair_also_composes_a_members_runner_up_with_the_other_chosen_program():
    from einopt.frontend.fold import prepare
    from einopt.frontend.translate import translate_graph
    from einopt.search.results import Candidate

    model = prepare(lstm_cell(hidden=16), {}, fold=True).model
    gates, tail = [p for p in translate_graph(model, fuse_activations=True) if p.translated]
    chosen = _merged_gates(model, gates, "if")
    runners_up = tuple(_merged_gates(model, gates, g) for g in ("i", "ifgo", "ifg"))
    p = _Side(gates, chosen, (gates.name,), runners_up)
    c = _Side(tail, Candidate(tail.program, (), (), 1e-6), (tail.name,))
    group = _pair(model, p, c)
    assert group is not None and group.members == (gates.name, tail.name)
    # The compositions that fuse into the fewest bindings, at most MAX_OTHERS: all four gates, three.
    assert len(group.others) == MAX_OTHERS == 2
    merged = [[s.rule for s in o.trace].count("merge_summations") for o in group.others]
    assert merged == [4, 3]
    other = group.others[0]
    assert [s.rule for s in group.chosen.trace].count("merge_summations") == 2
    assert MERGE_RULE in [s.rule for s in other.trace] and other.program != group.chosen.program
    rng = np.random.default_rng(0)
    feeds = {
        t.name: group.part.constants.get(t.name, rng.standard_normal(t.shape))
        for prog in (group.part.program, other.program)
        for t in prog.inputs
    }
    want = evaluate(group.part.program, {t.name: feeds[t.name] for t in group.part.program.inputs})
    for prog in (group.chosen.program, other.program):
        got = evaluate(prog, {t.name: feeds[t.name] for t in prog.inputs})
        for name in group.part.program.outputs:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-12)


def test_a_part_offers_merging_every_other_derived_program_it_timed():
    from einopt.stages.select import Trial

    def trial(speedup, program, trace=("step",), unchanged=False):
        candidate = NS(program=program, trace=trace)
        measured = NS(speedup=speedup) if speedup is not None else None
        return Trial("p", candidate, instantiated=NS(nodes=()), measured=measured, unchanged=unchanged)

    chosen = trial(1.24, "partial merge")
    tried = [
        trial(1.10, "four gates"),  # slower on its own: its Split is what a tail's kernel absorbs
        chosen,
        trial(1.30, "three gates"),
        trial(1.30, "three gates"),  # the same program in its portable form: offered once
        trial(1.80, "input", trace=()),  # the input is not a derived program
        trial(1.75, "same nodes", unchanged=True),
        trial(None, "not timed"),  # failed verification, or too slow to time
    ]
    others = _runners_up(NS(chosen=chosen, tried=tried))
    assert [o.program for o in others] == ["three gates", "four gates"]  # fastest first
    assert _runners_up(NS(chosen=trial(None, "untimed"), tried=tried)) == ()  # untimed: none
    assert _runners_up(NS(chosen=None, tried=tried)) == ()
