"""Matching on the search's hot path: every match of a rule on a program, cached per interned scope.

A scope rule's hits depend only on the scope and the rules' context, so they
are computed once per distinct scope and reused by every state that contains
it. A program-scope rule (``merge_traversal``, ``tighten_boundary``, ...) also
sees the program around the scope; its hits are cached under the facts it
reads: whether the scope is bound or an output, which scopes it reads are
bound, and what reads it. Failure reasons are never built here (the search
runs with ``Context.reasons`` off). A cached hit keeps the summary of the
first program it was computed in; ``where`` is always the current label.
"""

from __future__ import annotations

from collections.abc import Iterator

from einopt.core import ir
from einopt.core.rewrite import accesses
from einopt.rules import Context, Match, Rule, ScopeRule
from einopt.rules.base import Hit
from einopt.rules.boundary import ProgramFacts, ProgramScopeRule

__all__ = ["matches"]


def _facts_key(scope: ir.Scope, facts: ProgramFacts) -> tuple:
    reads = frozenset(a.source for a in accesses(scope.body) if a.source in facts.bound)
    return (scope in facts.bound, scope in facts.outputs, reads, facts.readers.get(scope, ()))


def matches(
    rule: Rule, program: ir.Program, ctx: Context, cache: dict, only: frozenset | None = None
) -> Iterator[Match]:
    """Every match of ``rule`` on ``program`` (at the scopes in ``only``, when given)."""
    if not isinstance(rule, ScopeRule):
        for m in rule.match(program, ctx):
            if isinstance(m, Match) and (only is None or m.target in only):
                yield m
        return
    facts = ProgramFacts.of(program)
    program_wide = isinstance(rule, ProgramScopeRule)
    for scope, where in facts.labels.items():
        if only is not None and scope not in only:
            continue
        key = (rule.name, scope, _facts_key(scope, facts)) if program_wide else (rule.name, scope)
        found = cache.get(key)
        if found is None:
            hits = rule.match_in(scope, facts, ctx) if program_wide else rule.match_scope(scope, ctx)
            found = cache[key] = [h for h in hits if isinstance(h, Hit)]
        for h in found:
            yield Match(rule.name, where, h.summary, h.params, scope)
