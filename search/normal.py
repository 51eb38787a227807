"""The normal form of a search state: equal programs meet before they are fingerprinted.

After every rule application the search brings the program to a fixed point
of the schedule's ``cleanup`` rules (by default: inline scopes that only
re-index another scope, and plain copies; tighten traversal ranges whose
extra points are provably never nonzero). Unread bindings are dropped by the
rules themselves. Substitution leaves a read-through scope behind on every
application; folding those here is what makes Fig. 5 three steps deep
instead of seven.
"""

from __future__ import annotations

from einopt.core import ir
from einopt.rules import REGISTRY, Context
from einopt.search.matching import matches
from einopt.search.schedule import Schedule

__all__ = ["normalize"]

# A cleanup step shrinks the program (one scope fewer, or a smaller range), so the fixed point comes
# quickly; the limit only guards against a pair of rules that would undo each other.
_MAX_STEPS = 64


def normalize(
    program: ir.Program, ctx: Context, schedule: Schedule, memo: dict | None = None, hits: dict | None = None
) -> ir.Program:
    """``program`` with the schedule's cleanup rules applied until none applies (equivalent to it).

    ``memo`` maps programs already normalized to their normal form (programs are interned, so the
    dictionary is keyed by identity); ``hits`` caches rule matches per scope (see ``matching``).
    """
    if memo is not None and program in memo:
        return memo[program]
    start = program
    for _ in range(_MAX_STEPS):
        step = _first_cleanup(program, ctx, schedule, {} if hits is None else hits)
        if step is None:
            break
        program = step
    if memo is not None:
        memo[start] = program
        memo[program] = program
    return program


def _first_cleanup(program: ir.Program, ctx: Context, schedule: Schedule, hits: dict) -> ir.Program | None:
    for use in schedule.cleanup:
        rule = REGISTRY[use.rule]
        for m in matches(rule, program, ctx, hits):
            if use.admits(program, m, ctx):
                return rule.apply(program, m, ctx)
    return None
