"""The search engine (``einopt.search``): equivalence of every candidate and trace step, determinism,
limits, the expression distance and the normal form.

Searches are small (few-element shapes, depth 1-3) so the file runs in well under a minute; the
paper derivations contribute only their start programs and contexts, never their steps.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from rules_support import contractions

import einopt
from einopt.core import ir
from einopt.instantiate.plan import OperatorMatch
from einopt.instantiate.program import as_program
from einopt.rules import NO_CONTEXT, REGISTRY, Context, check_equivalent
from einopt.rules.paper import DERIVATIONS
from einopt.search import DEFAULT_SCHEDULE, Budget, SearchError, search
from einopt.search.candidates import program_flops
from einopt.search.distance import TARGETS, distance, matcher_context, nearest
from einopt.search.normal import normalize

# The HWC 3x3 convolution of einopt/examples/conv3x3.ein with few pixels and channels.
CONV3X3_SMALL = "L[h:5, w:4, f:3] Sum[r:3, s:3, c:2] A[h+r-1, w+s-1, c] * K[r, s, f, c] where A: [5, 4, 2], K: [3, 3, 3, 2]"
CONV_NCHW = (
    "L[n:1, f:4, h:5, w:5] Sum[c:3, r:3, s:3] X[n, c, h+r-1, w+s-1] * W[f, c, r, s]"
    " where X: [1, 3, 5, 5], W: [4, 3, 3, 3]"
)


def _text(text: str) -> tuple[ir.Program, Context]:
    return as_program(einopt.parse(text)), NO_CONTEXT


def _paper(name: str) -> tuple[ir.Program, Context]:
    d = DERIVATIONS[name]
    return d.program(), d.context()


# name -> (program and context, search limits). The ConvTranspose start program branches widely
# (depth 2 takes seconds), so it is searched one explorative step deep.
SEARCHES = {
    "conv3x3_hwc": (lambda: _text(CONV3X3_SMALL), {"max_depth": 2, "converge_depth": 3}),
    "conv3x3_nchw": (lambda: _text(CONV_NCHW), {"max_depth": 2, "converge_depth": 3}),
    "conv_transpose": (lambda: _paper("convtranspose_matmul"), {"max_depth": 1, "converge_depth": 3}),
    "prelu": (lambda: _paper("prelu_max"), {"max_depth": 3, "converge_depth": 3}),
    "gcn": (lambda: _paper("gcn_matmuls"), {"max_depth": 3, "converge_depth": 3}),
}


@pytest.fixture(scope="module")
def results():
    """Each search of :data:`SEARCHES` run once: name -> (input, context, result)."""
    out = {}
    for name, (make, limits) in SEARCHES.items():
        program, ctx = make()
        out[name] = (program, ctx, search(program, ctx=ctx, **limits))
    return out


def _explore_steps(cand) -> int:
    return sum(1 for s in cand.trace if s.phase == "explore")


def _is_input(cand, program: ir.Program) -> bool:
    return not cand.trace and cand.program == program


# ----------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("name", SEARCHES)
def test_every_candidate_equals_the_input(results, name):
    program, ctx, result = results[name]
    assert result.candidates
    for cand in result.candidates:
        modes = check_equivalent(program, cand.program, ctx)
        assert "float64" in modes


@pytest.mark.parametrize("name", SEARCHES)
def test_every_trace_step_equals_the_input_and_names_a_scheduled_rule(results, name):
    program, ctx, result = results[name]
    phases = DEFAULT_SCHEDULE.phases()
    steps = 0
    for cand in result.candidates:
        for step in cand.trace:
            assert step.rule in REGISTRY, step.rule
            assert step.phase in ("explore", "converge"), step.phase
            assert step.rule in {u.rule for u in phases[step.phase]}, (step.phase, step.rule)
            check_equivalent(program, step.program, ctx)
            steps += 1
        if cand.trace:
            # The last step's program is the candidate itself.
            assert cand.trace[-1].program == cand.program
    assert steps > 0 or name == "conv_transpose"


def test_int_mode_checks_the_integer_weighted_searches(results):
    # The seeded paper weights and the random inputs are integers, so the exact mode runs too.
    program, ctx, result = results["gcn"]
    for cand in result.candidates:
        assert check_equivalent(program, cand.program, ctx) == ("float64", "int")


@pytest.mark.parametrize("name", SEARCHES)
def test_the_input_is_among_the_candidates(results, name):
    program, _, result = results[name]
    assert sum(_is_input(c, program) for c in result.candidates) == 1


# A program whose normal form differs from it (a slack traversal range the cleanup tightens).
SLACK_RANGE = """P = L[i:8, j:3] X[i-2, j]
T = L[j:3, i:8] P[i, j]
return T
where X: [4, 3]"""


def test_the_input_survives_when_its_normal_form_differs():
    program = einopt.parse(SLACK_RANGE)
    assert normalize(program, NO_CONTEXT, DEFAULT_SCHEDULE) != program
    result = search(program, max_depth=0)
    assert any(_is_input(c, program) for c in result.candidates)


def test_the_searches_find_something_beyond_the_input(results):
    for name in ("conv3x3_hwc", "conv3x3_nchw", "prelu", "gcn"):
        program, _, result = results[name]
        assert any(c.trace for c in result.candidates), name


# ----------------------------------------------------------------------------- determinism


def _summary(result) -> list[tuple]:
    return [
        (c.key, c.operators, c.cost, tuple((s.phase, s.rule, s.where, s.summary) for s in c.trace))
        for c in result.candidates
    ]


def test_the_same_search_twice_gives_the_same_candidates(results):
    program, ctx, first = results["conv3x3_hwc"]
    again = search(program, ctx=ctx, **SEARCHES["conv3x3_hwc"][1])
    assert _summary(again) == _summary(first)


_SUBPROCESS_SEARCH = """
import json, sys
from einopt.rules.paper import DERIVATIONS
from einopt.search import search
d = DERIVATIONS["gcn_matmuls"]
r = search(d.program(), ctx=d.context(), max_depth=3, converge_depth=3)
json.dump([[c.key, list(c.operators), [[s.phase, s.rule, s.where] for s in c.trace]] for c in r.candidates], sys.stdout)
"""


def test_candidates_do_not_depend_on_the_hash_seed(tmp_path):
    runs = [
        subprocess.run(
            [sys.executable, "-P", "-c", _SUBPROCESS_SEARCH],
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=tmp_path,  # outside the checkout, so that the installed package is imported
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for seed in ("1", "2")
    ]
    assert json.loads(runs[0]) == json.loads(runs[1])
    assert len(json.loads(runs[0])) > 1


def test_jobs_do_not_change_the_candidates(monkeypatch):
    program, ctx = _paper("fig5")
    one = search(program, ctx=ctx, max_depth=3, converge_depth=3)
    submitted = []
    submit = concurrent.futures.ProcessPoolExecutor.submit

    def counting(self, *args, **kwargs):
        submitted.append(args[1])
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(concurrent.futures.ProcessPoolExecutor, "submit", counting)
    two = search(program, ctx=ctx, max_depth=3, converge_depth=3, jobs=2)
    # The frontier was large enough to be split over the workers at least once.
    assert submitted, "no frontier was split: make the search bigger"
    assert _summary(two) == _summary(one)
    assert two.stats.generated == one.stats.generated
    assert two.stats.per_depth == one.stats.per_depth


# ----------------------------------------------------------------------------- limits


@pytest.mark.parametrize("name", ["fig5", "convtranspose_matmul", "prelu_max"])
def test_max_depth_zero_takes_no_explorative_step(name):
    program, ctx = _paper(name)
    result = search(program, ctx=ctx, max_depth=0)
    assert any(_is_input(c, program) for c in result.candidates)
    for cand in result.candidates:
        assert _explore_steps(cand) == 0
        assert all(s.phase == "converge" for s in cand.trace)
        check_equivalent(program, cand.program, ctx)
    assert result.stats.per_depth == [{"depth": 0, "states": 1, "generated": 0}]


@pytest.mark.parametrize("depth", [1, 2])
def test_explorative_steps_stay_within_max_depth(depth):
    program, ctx = _text(CONV3X3_SMALL)
    result = search(program, ctx=ctx, max_depth=depth, converge_depth=2)
    assert max(_explore_steps(c) for c in result.candidates) <= depth
    assert len(result.stats.per_depth) <= depth + 1


def test_converge_depth_zero_takes_no_converging_step():
    program, ctx = _paper("gcn_matmuls")
    # 400 states: converging steps would come from the first explored states on (the unbounded search
    # takes 13 s and only shows the same thing longer)
    result = search(program, ctx=ctx, budget=Budget(max_depth=3, states_per_search=400), converge_depth=0)
    assert result.stats.converge_steps == 0 and result.stats.generated > 100
    for cand in result.candidates:
        assert all(s.phase != "converge" for s in cand.trace)
    assert any(_is_input(c, program) for c in result.candidates)


def test_a_state_budget_stops_at_exactly_that_many_states():
    # The ConvTranspose start program takes minutes at depth 3 without a budget.
    program, ctx = _paper("convtranspose_matmul")
    result = search(program, ctx=ctx, budget=Budget(max_depth=3, states_per_search=150))
    assert result.stats.generated == 150
    assert (result.stats.complete, result.stats.stopped) == (False, "states")
    assert any(_is_input(c, program) for c in result.candidates)
    for cand in result.candidates:
        check_equivalent(program, cand.program, ctx)
        assert cand.found_states <= 150


def test_a_search_within_its_states_is_complete_and_the_same_as_unbounded():
    program, ctx = _paper("fig5")
    free = search(program, ctx=ctx, max_depth=3, converge_depth=3)
    assert free.stats.complete and free.stats.stopped == ""
    n = free.stats.generated
    exact = search(program, ctx=ctx, budget=Budget(max_depth=3, states_per_search=n), converge_depth=3)
    assert exact.stats.complete and exact.stats.generated == n
    assert _summary(exact) == _summary(free)
    cut = search(program, ctx=ctx, budget=Budget(max_depth=3, states_per_search=n - 1), converge_depth=3)
    assert cut.stats.stopped == "states" and cut.stats.generated == n - 1


def test_a_bigger_state_budget_finds_what_a_smaller_one_found():
    """States are generated in one order: a budget's search is the first states of a larger one's."""
    program, ctx = _paper("convtranspose_matmul")
    small, large = (
        search(program, ctx=ctx, budget=Budget(max_depth=3, states_per_search=n), max_candidates=1000)
        for n in (60, 200)
    )
    assert large.stats.per_depth[: len(small.stats.per_depth) - 1] == small.stats.per_depth[:-1]
    # What the smaller one had found before its last batch of states, the larger one found too (or a
    # program doing the same work, found later, that it ranks before it).
    works = {c.work: c.cost for c in large.candidates}
    early = [c for c in small.candidates if c.found_states < 60]
    assert len(early) > 1
    assert all(c.work in works and works[c.work] <= c.cost for c in early)


@pytest.mark.parametrize("states", [1, 37, 200, 300])
def test_jobs_stop_at_the_same_state_with_the_same_candidates(states, monkeypatch):
    """Workers expand slices of a frontier without knowing what the slices before theirs use: the
    search still stops at its budget's state, the one a single process stops at."""
    program, ctx = _paper("convtranspose_matmul")
    budget = Budget(max_depth=3, states_per_search=states)
    one = search(program, ctx=ctx, budget=budget, converge_depth=3)
    submitted = []
    submit = concurrent.futures.ProcessPoolExecutor.submit

    def counting(self, *args, **kwargs):
        submitted.append(args[1])
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(concurrent.futures.ProcessPoolExecutor, "submit", counting)
    two = search(program, ctx=ctx, budget=budget, converge_depth=3, jobs=2)
    assert one.stats.generated == two.stats.generated == states
    assert one.stats.stopped == two.stats.stopped == "states"
    assert _summary(two) == _summary(one)
    assert two.stats.per_depth == one.stats.per_depth
    assert two.stats.expanded == one.stats.expanded
    if states > 100:
        assert submitted, "no frontier was split: make the search bigger"


def test_the_deadline_is_a_safety_net_and_says_so():
    # The ConvTranspose start program takes minutes at depth 3: the deadline stops it, not its states.
    program, ctx = _paper("convtranspose_matmul")
    t0 = time.perf_counter()
    result = search(program, ctx=ctx, budget=Budget(max_depth=3, states_per_search=10**9, deadline_s=0.05))
    assert time.perf_counter() - t0 < 10.0
    assert (result.stats.complete, result.stats.stopped) == (False, "deadline")
    assert result.stats.as_dict()["stopped"] == "deadline"
    assert any(_is_input(c, program) for c in result.candidates)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_depth": -1}, "max_depth"),
        ({"max_depth": 1.5}, "max_depth"),
        ({"max_depth": True}, "max_depth"),
        ({"converge_depth": -1}, "converge_depth"),
        ({"jobs": 0}, "jobs"),
        ({"jobs": -2}, "jobs"),
        ({"time_budget": 0}, "time_budget"),
        ({"time_budget": -1.0}, "time_budget"),
        ({"time_budget": float("nan")}, "time_budget"),
        ({"budget": Budget(), "max_depth": 2}, "inside the budget"),
        ({"budget": Budget(), "time_budget": 2.0}, "inside the budget"),
        ({"budget": 5}, "Budget"),
        ({"states": 0}, "states"),
    ],
)
def test_bad_limits_raise_search_error(kwargs, message):
    program, _ = _text(CONV3X3_SMALL)
    with pytest.raises(SearchError, match=message):
        search(program, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_depth": -1}, "max_depth must be a non-negative integer"),
        ({"states_per_search": 0}, "states_per_search must be a positive integer"),
        ({"states_per_model": 2.5}, "states_per_model must be a positive integer"),
        ({"states_per_search": True}, "states_per_search"),
        ({"deadline_s": 0}, "deadline_s must be positive seconds"),
        ({"deadline_s": float("inf")}, "deadline_s"),
    ],
)
def test_a_bad_budget_raises_search_error(kwargs, message):
    with pytest.raises(SearchError, match=message):
        Budget(**kwargs)


@pytest.mark.parametrize("bad", ["L[i:2] X[i] where X: [2]", None, 3, ir.Tensor("X", (2,))])
def test_a_non_program_raises_search_error(bad):
    with pytest.raises(SearchError, match="program or a scope"):
        search(bad)


# ----------------------------------------------------------------------------- distance

# name -> (scope text, the targets whose matcher takes it)
DISTANCE_TABLE = {
    "matmul": ("L[i:6, j:5] Sum[k:4] X[i, k] * W[k, j] where X: [6, 4], W: [4, 5]", {"MatMul"}),
    "conv_nchw": (CONV_NCHW, {"Conv"}),
    "conv_hwc": (CONV3X3_SMALL, {"Conv"}),
    "band_dilated": (
        "L[b:2, m:16, w:7] Sum[k:3] A[b, m, k] * B[b, m + 4*(w - 3), k] where A: [2, 16, 3], B: [2, 16, 3]",
        {"G2BMM"},
    ),
    "band": (
        "L[b:2, m:16, w:7] Sum[k:3] A[b, m, k] * B[b, m + w - 3, k] where A: [2, 16, 3], B: [2, 16, 3]",
        {"G2BMM"},
    ),
    "add": ("L[i:4, j:3] X[i, j] + Y[i, j] where X: [4, 3], Y: [4, 3]", {"Elementwise"}),
    "window": ("L[i:5, j:4] Sum[r:3] A[i + r, j] * B[2*r + j, i] where A: [7, 4], B: [8, 5]", set()),
}


def _assert_distance_agrees_with_matchers(scope: ir.Scope) -> set[str]:
    ctx = matcher_context(as_program(scope), frozenset())
    zero = set()
    for target, matcher in TARGETS.items():
        d = distance(scope, target, ctx)
        assert isinstance(d, int)
        if isinstance(matcher(scope, ctx), OperatorMatch):
            assert d == 0, target
            zero.add(target)
        else:
            assert d > 0, target
    # The nearest target: the smallest distance, the first in table order on ties.
    assert nearest(scope, ctx) == min((distance(scope, t, ctx), k, t) for k, t in enumerate(TARGETS))[::2]
    return zero


@pytest.mark.parametrize("name", DISTANCE_TABLE)
def test_distance_is_zero_exactly_where_the_matcher_takes_the_scope(name):
    text, expected = DISTANCE_TABLE[name]
    assert _assert_distance_agrees_with_matchers(einopt.parse(text)) == expected


def test_a_dilated_band_is_a_g2bmm_whose_lowering_splits_the_residues():
    from einopt.instantiate.match_band import band_form

    dilated, band = (einopt.parse(DISTANCE_TABLE[k][0]) for k in ("band_dilated", "band"))
    for s, d in ((dilated, 4), (band, 1)):
        assert nearest(s, matcher_context(as_program(s), frozenset())) == (0, "G2BMM")
        assert band_form(s).dilation == d


# The phase conv of a stride-2 transposed convolution, before its output channels merge.
PHASE_CONV = (
    "L[n:1, f:2, q:3, r:2, t:3, s:2] Sum[c:4, a:2, b:2] X[n, c, q-a+1, t-b+1] * W[c, f, 2*a+r, 2*b+s]"
    " where X: [1, 4, 3, 3], W: [4, 2, 4, 4]"
)


def test_distance_counts_a_weight_layout_once_and_each_extra_output_channel():
    """A constant's indices cost one materialisation at most; f, r, s are two merges from a Conv."""
    scope = einopt.parse(PHASE_CONV)
    weights = matcher_context(as_program(scope), frozenset({"W"}))
    activations = matcher_context(as_program(scope), frozenset())
    # Two output iterators too many, plus the weight's layout (1 as a constant, 4 index positions' worth
    # as an activation).
    assert distance(scope, "Conv", weights) == 1 + 1 + 2
    assert distance(scope, "Conv", activations) == 1 + 4 + 2


@settings(max_examples=60)
@given(contractions())
def test_distance_agrees_with_matchers_on_random_contractions(scope):
    _assert_distance_agrees_with_matchers(scope)


# ----------------------------------------------------------------------------- normal form


def _raw_children(program: ir.Program, ctx: Context) -> list[ir.Program]:
    """Programs one explore or converge rule makes of ``program``, before any normal form."""
    out = []
    for phase in ("explore", "converge"):
        for use in DEFAULT_SCHEDULE.phases()[phase]:
            rule = REGISTRY[use.rule]
            for m in rule.matches(program, ctx):
                if use.admits(program, m, ctx):
                    out.append(rule.apply(program, m, ctx))
    return out


@pytest.mark.parametrize("name", SEARCHES)
def test_normalize_is_idempotent_and_equivalent(results, name):
    program, ctx, result = results[name]
    programs = {program}
    programs |= {s.program for c in result.candidates for s in c.trace}
    programs |= set(_raw_children(program, ctx)[:12])
    for p in sorted(programs, key=str):
        once = normalize(p, ctx, DEFAULT_SCHEDULE)
        assert normalize(once, ctx, DEFAULT_SCHEDULE) == once
        check_equivalent(program, once, ctx)


def test_fig5_reaches_an_operator_plus_offset_reduce_within_depth_3():
    program, ctx = _paper("fig5")
    result = search(program, ctx=ctx, max_depth=3, converge_depth=3)
    found = [
        c
        for c in result.candidates
        if any(op in ("MatMul", "Conv") for op in c.operators)
        and any(op.startswith("eop:") and "OffsetReduce" in op for op in c.operators)
    ]
    assert found
    assert any(len(c.trace) <= 3 for c in found)
    for c in found:
        assert _explore_steps(c) <= 3
        check_equivalent(program, c.program, ctx)


def test_fig5_explorative_only_reaches_an_operator_plus_offset_reduce():
    program, ctx = _paper("fig5")
    result = search(program, ctx=ctx, max_depth=3, converge_depth=0)
    assert any(
        any(op in ("MatMul", "Conv") for op in c.operators)
        and any("OffsetReduce" in op for op in c.operators)
        for c in result.candidates
    )


# ----------------------------------------------------------------------------- importer expressions

EVALUATION_MODELS = ("infogan", "dcgan", "fsrcnn", "gcn", "resnet18", "csrnet", "longformer", "lstm")


def _largest_parts(model_name: str, limit: int = 3):
    from einopt.frontend.fold import prepare
    from einopt.frontend.translate import translate_graph
    from einopt.models import build

    prepared = prepare(build(model_name, size="small"), {})
    parts = [p for p in translate_graph(prepared.model) if p.program is not None]
    parts.sort(key=lambda p: -len(list(ir.scopes_in(p.program))))
    return parts[:limit]


@pytest.mark.slow
@pytest.mark.parametrize("model_name", EVALUATION_MODELS)
def test_search_on_translated_subprograms_keeps_them_equal(model_name):
    parts = _largest_parts(model_name)
    assert parts
    for part in parts:
        ctx = Context(dict(part.constants))
        result = search(
            part.program, budget=Budget(max_depth=1, states_per_search=500), converge_depth=2, ctx=ctx
        )
        assert any(_is_input(c, part.program) for c in result.candidates), part.name
        for cand in result.candidates:
            try:
                check_equivalent(part.program, cand.program, ctx)
            except Exception as e:  # name the subprogram and the derivation in the failure
                trace = ", ".join(f"{s.phase}:{s.rule}@{s.where}" for s in cand.trace)
                raise AssertionError(f"{model_name} {part.name}: [{trace}]: {e}") from e


def test_a_light_model_costs_what_the_runnable_one_does(monkeypatch):
    """Candidates are costed on a light instantiation (large weights and folded constants as typed
    inputs, no values): the same nodes, FLOPs and bytes as the model that runs."""
    from einopt.core.cost import model_cost
    from einopt.instantiate import emit
    from einopt.instantiate.program import program_model

    monkeypatch.setattr(emit, "LIGHT_LIMIT", 64)
    program = as_program(einopt.parse(PHASE_CONV))
    w = np.random.default_rng(0).standard_normal((4, 2, 4, 4))
    full, _ = program_model(program, {"W": w})
    light, inst = program_model(program, {"W": w}, light=True)
    assert not [t for t in light.graph.initializer if t.dims and np.prod(t.dims) * 4 > 64]
    assert [n.op_type for n in light.graph.node] == [n.op_type for n in full.graph.node]
    assert model_cost(light) == model_cost(full)


@pytest.mark.parametrize("name", ["convtranspose", "conv5x5", "g2bmm", "convtranspose_phases", "lstm"])
def test_every_candidate_costs_the_same_light(name, monkeypatch):
    """The light instantiation skips folding large constants and computing eOperators' Gather
    indices (their shapes come from the index's bounds): every candidate of a search costs exactly
    what its runnable model does, node for node."""
    from einopt.core.cost import model_cost
    from einopt.examples.rediscover import CASES
    from einopt.instantiate import emit
    from einopt.instantiate.program import program_model

    monkeypatch.setattr(emit, "LIGHT_LIMIT", 64)
    case = CASES[name]
    program = case.program("small")
    ctx = case.context(program)
    constants = dict(ctx.constants)
    # 800 states: 10 of the 11 operator mixes 3000 reach on the phase convolution, in 6 s, not 15
    result = search(program, ctx=ctx, budget=Budget(max_depth=2, states_per_search=800), max_candidates=1000)
    assert len(result.candidates) > 1
    for cand in result.candidates:
        full, _ = program_model(cand.program, constants)
        light, _ = program_model(cand.program, constants, light=True)
        assert [n.op_type for n in light.graph.node] == [n.op_type for n in full.graph.node]
        assert model_cost(light) == model_cost(full), cand.operators


def test_states_refused_before_they_are_built_are_counted():
    """Restrictions and the distance guidance refuse matches: counted apart from what was built."""
    stats = search(einopt.parse(CONV3X3_SMALL), max_depth=2).stats
    assert stats.restricted > 0 and stats.unguided > 0
    assert stats.considered == stats.generated + stats.restricted + stats.commuted + stats.unguided
    gone = stats.restricted + stats.commuted + stats.unguided + stats.pruned
    assert stats.avoided_fraction == pytest.approx(gone / stats.considered)
    assert stats.as_dict()["considered"] == stats.considered


def test_a_small_slice_of_a_large_folded_weight_stays_shape_only_when_light():
    """A layout step of a folded weight without values (light) gives a value without values, even
    one small enough to be kept with values had it been computed (a merged LSTM gate's weights)."""
    from einopt.core.cost import model_cost
    from einopt.instantiate.program import program_model

    x = "{L[i0:2, i1:16] x9[i0, i1] + x8[i0, i1-8]}[i0, k]"
    gates = "{L[i0:16, i1:8] x%d[i0, i1] + x%d[i0-8, i1]}"
    w = (
        f"{{L[i0:16, i1:24] {gates % (6, 2)}[i0, i1] + {{L[i0:16, i1:16] {gates % (5, 1)}[i0, i1]"
        f" + {gates % (7, 3)}[i0, i1-8]}}[i0, i1-8]}}[k, i1]"
    )
    text = (
        f"M1 = L[i0:2, i1:24] Sum[k:16] {x} * {w}\n"
        f"y2 = L[i0:2, i1:8] Sum[k:16] {x} * {w}\n"
        f"y5 = L[i0:2, i1:8] Sum[k:16] {x} * {gates % (4, 0)}[k, i1]\n"
        "y8 = L[i0:2, i1:8] M1[i0, i1+8]\ny11 = L[i0:2, i1:8] M1[i0, i1+16]\n"
        "return y2, y5, y8, y11\nwhere "
        + ", ".join(f"x{i}: [8, 8]" for i in range(8))
        + ", x8: [2, 8], x9: [2, 8]"
    )
    program = as_program(einopt.parse(text))
    rng = np.random.default_rng(0)
    arrays = {
        t.name: rng.standard_normal(t.shape).astype(np.float32) for t in program.inputs if t.name < "x8"
    }
    full, _ = program_model(program, arrays)
    light, _ = program_model(program, arrays, light=True)
    assert [n.op_type for n in light.graph.node] == [n.op_type for n in full.graph.node]
    assert model_cost(light) == model_cost(full)


def test_flops_leave_out_what_reads_only_constants():
    """A subterm of numbers and constant reads (a scaled bias ``A[f] * B[f]``) is folded at compile
    time: it costs no FLOPs, so the two-convolution PRelu form is not pruned for them."""
    text = "L[f:4, h:6] {L[f2:4, h2:6] Sum[c:3] X[c, h2] * W[f2, c]}[f, h] + {bias} where X: [3, 6], W: [4, 3], A: [4], B: [4]"
    scaled = einopt.parse(text.replace("{bias}", "(1 - A[f]) * B[f]"))
    plain = einopt.parse(text.replace("{bias}", "B[f]"))
    weights = frozenset({"W", "A", "B"})
    assert program_flops(as_program(scaled), weights) == program_flops(as_program(plain), weights)
    # With nothing constant, the scale is arithmetic per point: 2 more operations on 24 points.
    assert program_flops(as_program(scaled)) == program_flops(as_program(plain)) + 2 * 24


def test_the_search_finds_prelu_as_two_convolutions_and_a_relu():
    """Conv + bias + PRelu -> conv(x, a*W) + a*b + relu(conv(x, (1-a)*W) + (1-a)*b), found at depth 4
    (fuse, rewrite_prelu_relu, fold_channel_scale twice): doubling the convolution's FLOPs is within
    the FLOPs bar once the scaled biases, folded at compile time, count nothing."""
    text = (
        "Y = L[n:1, f:4, h:6, w:6] {L[n2:1, f2:4, h2:6, w2:6] Sum[c:3, r:3, s:3] "
        "X[n2, c, h2+r-1, w2+s-1] * W[f2, c, r, s]}[n, f, h, w] + B[f]\n"
        "Z = L[n:1, f:4, h:6, w:6] max(Y[n, f, h, w], 0) + A[f, 0, 0] * min(Y[n, f, h, w], 0)\n"
        "return Z\nwhere X: [1, 3, 6, 6], W: [4, 3, 3, 3], A: [4, 1, 1], B: [4]"
    )
    rng = np.random.default_rng(0)
    constants = {
        "W": rng.standard_normal((4, 3, 3, 3)),
        "A": rng.uniform(0.0, 0.5, (4, 1, 1)),
        "B": rng.standard_normal(4),
    }
    program = as_program(einopt.parse(text))
    result = search(program, ctx=Context(constants), max_depth=4, max_candidates=64)
    traces = {tuple(s.rule for s in c.trace): c for c in result.candidates}
    found = [t for t in traces if t.count("fold_channel_scale") == 2 and "rewrite_prelu_relu" in t]
    assert found, sorted(traces)
    c = traces[found[0]]
    assert c.operators.count("Conv") == 2 and "Relu" in c.operators and "PRelu" not in c.operators
    x = {"X": rng.standard_normal((1, 3, 6, 6))}
    check_equivalent(program, c.program, Context(constants))
    want = einopt.evaluate(program, {**x, **constants})["Z"]
    np.testing.assert_allclose(einopt.evaluate(c.program, {**x, **constants})["Z"], want, rtol=1e-10)
