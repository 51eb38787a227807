"""Rediscovery by the search alone, at reduced sizes (``einopt.examples.rediscover``).

Each found candidate is checked against the input with the reference
interpreter (float64 and exact integers). Cases the search does not reach
yet are expected failures with the reason; ``scripts/rediscover.py`` prints
the same cases at the paper's sizes with the search statistics.
"""

from __future__ import annotations

import pytest

from einopt.examples.rediscover import CASES
from einopt.rules import check_equivalent
from einopt.search import search

# Seconds per case: the found cases finish well inside it on 2 cores.
BUDGET = 20.0

NOT_YET = {
    "convtranspose": "not reached: 1,560 states in 30 s at small size without the MatMul form; the missing "
    "step is not diagnosed yet (the paper's path: split_summation, 2 fuses, 2 splits by the stride)",
    "convtranspose_phases": "not reached: 3 residue splits then about 5 steps per phase, beyond depth 7 as the "
    "rules stand",
    "g2bmm": "not reached (2 states): probably because split m by 4 alone does not lower the distance (the "
    "band stays dilated until both inputs are re-laid out), so converging never takes it",
    "lstm": "4 commuting merge_summations and 3 merges: the commuting orders fill the budget "
    "(no partial-order reduction yet)",
    "gcn_head": "not reached: the search ends after 33 states with two separate matmuls + offset sums; why "
    "merge_expressions does not merge them is not diagnosed yet",
    "conv5x5": "found at depth 5 but only after about 30 s at this size (relax x 2, split x 2, split_summation)",
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_search_rediscovers(name):
    if name in NOT_YET:
        pytest.xfail(NOT_YET[name])
    case = CASES[name]
    program = case.program("small")
    ctx = case.context(program)
    result = search(program, ctx=ctx, time_budget=BUDGET, max_candidates=10_000)
    found = [c for c in result.candidates if case.found(c.operators, c.program)]
    assert found, (
        f"{name}: no candidate has {case.want}; candidates: {[c.operators for c in result.candidates]}"
    )
    best = min(found, key=lambda c: c.depth)
    assert best.depth <= 7 + 6
    check_equivalent(program, best.program, ctx)
    assert any(not c.trace and c.program is program for c in result.candidates)


def test_every_case_names_what_it_must_find():
    for case in CASES.values():
        assert case.want and case.small and case.full
        assert case.program("small").outputs == case.program("full").outputs
