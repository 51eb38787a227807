"""What a derivation rule is: a named object with ``match`` and a pure ``apply``.

A rule rewrites a :class:`~einopt.core.ir.Program` (the search state) into an
equivalent one. ``match`` yields one :class:`Match` for every place and way the
rule applies, carrying everything ``apply`` needs (nothing passes through
``self``), and a :class:`Failure` with a reason for every near miss, so a
tracer can say why a rule did not fire. ``apply`` is a pure function of the
program, the match and the :class:`Context`.

Two kinds of rule share the plumbing here:

* :class:`ScopeRule` (intra-expression and constant-aware rules) rewrites one
  scope into an equal one: same traversal ranges, same value at every point.
  The scope is found anywhere in the program (bound or nested) and replaced
  wherever it occurs.
* :class:`Rule` subclasses that look at the program's bindings as a whole
  (inter-expression rules) implement ``match``/``apply`` directly.

Equivalence is every rule's whole contract; ``tests/test_rules_registry.py``
checks it numerically for every registered rule.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from einopt.core import ir
from einopt.core.rewrite import prune_bindings, replace_scopes

__all__ = [
    "FAMILIES",
    "PHASES",
    "Context",
    "TensorFacts",
    "Match",
    "Failure",
    "Hit",
    "hit",
    "NO_CONTEXT",
    "Rule",
    "ScopeRule",
    "scope_labels",
]

# Rule families, in the order ``einopt rules`` lists them.
FAMILIES: tuple[str, ...] = ("intra", "constant", "inter")

# What a rule does for the search (method.md section 5): ``explore`` rules change the mathematics
# (which sums, over which ranges, in how many expressions); ``converge`` rules only move data and
# iterators toward an operator's layout; ``cleanup`` rules bring a program to its normal form.
PHASES: tuple[str, ...] = ("explore", "converge", "cleanup")


@dataclasses.dataclass(frozen=True, slots=True)
class TensorFacts:
    """Facts about a constant tensor's values that constant-aware rules rely on."""

    min: float
    max: float
    uniform: float | None  # the value when every element is equal


@dataclasses.dataclass(frozen=True)
class Context:
    """What a rule may know besides the expression: the values of constant tensors.

    ``constants`` maps input tensor names to their arrays (weights). Facts are
    computed from the arrays on first use and cached. Only constants can be
    known to be finite (:meth:`is_finite`); every other input may hold an
    infinity or a NaN unless it is named in ``assumed_finite``.
    """

    constants: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    # Non-constant inputs the caller declares finite: an assumption the zero analysis then relies
    # on (a paper derivation that needs an activation finite says so); the pipeline sets none.
    assumed_finite: frozenset[str] = frozenset()
    # Whether rules spell out why a near miss failed (Failure reasons). The search turns it off:
    # it never reads them, and some (which factor is not provably finite) cost a second analysis.
    reasons: bool = True
    _facts: dict[str, TensorFacts] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # Results of rules' pure analyses of interned scopes, kept for this context's lifetime (one search:
    # the search makes a context of its own, with reasons off). Rules key them by their own name first.
    memo: dict = dataclasses.field(default_factory=dict, init=False, compare=False, repr=False)

    def remembered(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per ``key`` while reasons are off (the search's context; a result then
        need not carry the names a reason would show); always afresh with reasons on."""
        if self.reasons:
            return compute()
        found = self.memo.get(key, _MISSING)
        if found is _MISSING:
            found = self.memo[key] = compute()
        return found

    def is_constant(self, t: ir.Tensor) -> bool:
        return t.name in self.constants

    def facts(self, t: ir.Tensor) -> TensorFacts | None:
        """Min, max and uniform value of a constant tensor; ``None`` if ``t`` is not constant."""
        arr = self.constants.get(t.name)
        if arr is None:
            return None
        found = self._facts.get(t.name)
        if found is None:
            a = np.asarray(arr, dtype=np.float64)
            lo, hi = float(a.min()), float(a.max())
            found = self._facts[t.name] = TensorFacts(lo, hi, lo if lo == hi else None)
        return found

    def is_finite(self, t: ir.Tensor) -> bool:
        """Whether ``t`` is a constant whose values are all finite (a NaN or an infinity is not),
        or a non-constant input named in ``assumed_finite``.

        ``0 * x`` is 0 only for a finite ``x``; the zero analysis
        (:func:`einopt.rules.boundary.is_zero`) asks this of every tensor it
        multiplies by a provable 0.
        """
        if t.name in self.assumed_finite and t.name not in self.constants:
            return True
        facts = self.facts(t)
        return facts is not None and math.isfinite(facts.min) and math.isfinite(facts.max)


_MISSING = object()
NO_CONTEXT = Context()


@dataclasses.dataclass(frozen=True)
class Match:
    """One place and way a rule applies.

    ``target`` is the scope an intra-expression rule rewrites (``None`` for
    rules over bindings), ``where`` names it for people, ``params`` are the
    rule's bindings (read-only), ``summary`` says in one line what ``apply``
    will do.
    """

    rule: str
    where: str
    summary: str
    params: Mapping[str, Any]
    target: ir.Scope | None = None

    def __getitem__(self, name: str) -> Any:
        return self.params[name]

    def __str__(self) -> str:
        return f"{self.rule} at {self.where}: {self.summary}"


@dataclasses.dataclass(frozen=True)
class Failure:
    """A near miss: the rule almost applied at ``where`` but ``reason`` says why not."""

    rule: str
    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rule} at {self.where}: not applicable: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Hit:
    """What :meth:`ScopeRule.match_scope` yields for each way it applies to one scope."""

    summary: str
    params: Mapping[str, Any]


def hit(summary: str, **params: Any) -> Hit:
    return Hit(summary, types.MappingProxyType(params))


class Rule:
    """A derivation rule. Subclasses set ``name`` (verb_noun), ``family`` and ``math``.

    The class docstring states the rule's mathematics and legality conditions;
    ``math`` is its one-line summary for ``einopt rules``.
    """

    name: ClassVar[str]
    family: ClassVar[str]
    math: ClassVar[str]
    # What a search schedule reads (see einopt.search.schedule): the rule's natural phase, the
    # rules whose effect it can reverse, whether it can enlarge the computation (more points, more
    # bytes), and the typed variants of its matches (the value of ``params[variant_param]``).
    phase: ClassVar[str] = "explore"
    undoes: ClassVar[tuple[str, ...]] = ()
    grows: ClassVar[bool] = False
    variants: ClassVar[tuple[str, ...]] = ()
    variant_param: ClassVar[str] = "way"

    def variant(self, match: Match) -> str:
        """Which of :attr:`variants` ``match`` is (``""`` for a rule with one way of applying)."""
        return str(match.params[self.variant_param]) if self.variants else ""

    def match(self, program: ir.Program, ctx: Context = NO_CONTEXT) -> Iterator[Match | Failure]:
        """Every way the rule applies to ``program`` (``Match``) and every near miss (``Failure``)."""
        raise NotImplementedError

    def apply(self, program: ir.Program, match: Match, ctx: Context = NO_CONTEXT) -> ir.Program:
        """The program rewritten as ``match`` says; equivalent to ``program``."""
        raise NotImplementedError

    def matches(self, program: ir.Program, ctx: Context = NO_CONTEXT) -> list[Match]:
        """Only the matches of :meth:`match`."""
        return [m for m in self.match(program, ctx) if isinstance(m, Match)]

    def failures(self, program: ir.Program, ctx: Context = NO_CONTEXT) -> list[Failure]:
        """Only the near misses of :meth:`match`."""
        return [m for m in self.match(program, ctx) if isinstance(m, Failure)]

    def __repr__(self) -> str:
        return f"<rule {self.name}>"


class ScopeRule(Rule):
    """A rule that rewrites one scope into an equal one (same traversal, same values).

    Subclasses implement :meth:`match_scope` and :meth:`rewrite`; matching
    visits every distinct scope of the program, producers first.
    """

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        """Each way the rule applies to ``scope`` (``Hit``) or a near-miss reason (``str``)."""
        raise NotImplementedError

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        """``scope`` rewritten with the bindings ``params`` of one of its hits."""
        raise NotImplementedError

    def match(self, program: ir.Program, ctx: Context = NO_CONTEXT) -> Iterator[Match | Failure]:
        for scope, where in scope_labels(program).items():
            for found in self.match_scope(scope, ctx):
                if isinstance(found, str):
                    yield Failure(self.name, where, found)
                else:
                    yield Match(self.name, where, found.summary, found.params, scope)

    def apply(self, program: ir.Program, match: Match, ctx: Context = NO_CONTEXT) -> ir.Program:
        if match.rule != self.name or match.target is None:
            raise ValueError(f"{self.name} cannot apply a match of {match.rule}")
        new = self.rewrite(match.target, match.params, ctx)
        # A rewrite can leave a binding unread (a scope inlined, two sums merged): drop it.
        return prune_bindings(replace_scopes(program, {match.target: new}))


def scope_labels(program: ir.Program) -> dict[ir.Scope, str]:
    """Every distinct scope of a program, producers first, with a label for people.

    A bound scope is labelled by its binding name; a nested one by the binding
    that first reaches it and a number (``Y.1``), so labels are stable.
    """
    out: dict[ir.Scope, str] = {}
    names = program.names()
    for name, s in program.bindings:
        nested = [x for x in ir.scopes_in(s) if x not in out and x not in names and x is not s]
        for k, x in enumerate(nested, 1):
            out[x] = f"{name}.{k}"
        out.setdefault(s, name)
    return out
