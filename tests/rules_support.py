"""Shared test support for derivation rules: example tables, checks, hypothesis strategies.

Every ``tests/test_rules_*.py`` module defines two tables that
``tests/test_rules_registry.py`` collects and runs for every registered rule:

* ``EXAMPLES = {rule_name: [Example(...), ...]}``: programs the rule must match;
  every match is applied and the result checked against the input with the
  reference interpreter (float64 and exact integer mode), its canonical key
  and its text round trip.
* ``NEAR_MISSES = {rule_name: [NearMiss(...), ...]}``: programs the rule must
  refuse, with a reason containing the given text.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from hypothesis import event
from hypothesis import strategies as st

from einopt.core import ir
from einopt.core.interp import evaluate
from einopt.core.keys import key
from einopt.core.parser import parse
from einopt.rules import NO_CONTEXT, Context, Failure, Match, check_equivalent, get


@dataclasses.dataclass(frozen=True)
class Example:
    """A program (text syntax) the rule must match; ``constants`` (and ``assumed_finite``
    inputs) become the Context."""

    text: str
    constants: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    shapes: Mapping[str, list[int]] | None = None
    min_matches: int = 1
    assumed_finite: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class NearMiss:
    """A program the rule must not match, refusing it with ``reason`` in a failure message."""

    text: str
    reason: str
    constants: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    shapes: Mapping[str, list[int]] | None = None
    assumed_finite: frozenset[str] = frozenset()


def as_program(node: ir.Scope | ir.Program, name: str = "Y") -> ir.Program:
    """A scope as a one-binding program (programs pass through)."""
    if isinstance(node, ir.Program):
        return node
    return ir.Program(tuple(ir.input_tensors(node)), ((name, node),), (name,))


def load(text: str, shapes: Mapping[str, list[int]] | None = None) -> ir.Program:
    return as_program(parse(text, shapes))


def check_result(before: ir.Program, after: ir.Program, ctx: Context = NO_CONTEXT) -> tuple[str, ...]:
    """The checks every rule result passes: equal values, a well-formed key, a text round trip."""
    checked = check_equivalent(before, after, ctx)
    assert "float64" in checked
    assert re.fullmatch(r"[0-9a-f]{32}", key(after))
    assert parse(str(after)) is after, f"text does not round-trip:\n{after}"
    return checked


def random_walk(
    start: ir.Program,
    choices: Sequence[tuple[int, int]],
    rules: Sequence,
    check: Callable[[ir.Program, ir.Program], object] = check_result,
) -> None:
    """Rules applied in sequence from ``start``, each program checked against it.

    Per ``(rule_pick, match_pick)``: the first rule from ``rules[rule_pick]`` on (cyclically) that
    offers a match applies its ``match_pick``-th (modulo) match; the walk ends where none does.
    A failing ``check(start, program)`` raises AssertionError with every step that led there.
    """
    program = start
    trail = [str(start)]
    for rule_pick, match_pick in choices:
        offered = []
        for k in range(len(rules)):
            rule = rules[(rule_pick + k) % len(rules)]
            offered = [m for m in rule.match(program) if isinstance(m, Match)]
            if offered:
                break
        if not offered:
            break
        m = offered[match_pick % len(offered)]
        program = rule.apply(program, m)
        trail.append(f"-- {m}\n{program}")
        event(f"applied {rule.name}")
        try:
            check(start, program)
        except AssertionError as e:
            raise AssertionError("\n".join(trail) + f"\n{e}") from None


def apply_all(
    rule_name: str, program: ir.Program, ctx: Context = NO_CONTEXT
) -> list[tuple[Match, ir.Program]]:
    """Apply every match of a rule to ``program``, checking each result; returns (match, result)."""
    rule = get(rule_name)
    out = []
    for m in rule.matches(program, ctx):
        after = rule.apply(program, m, ctx)
        assert after is not program, f"{m} changed nothing"
        try:
            check_result(program, after, ctx)
        except AssertionError as e:
            raise AssertionError(f"{m}\nbefore:\n{program}\nafter:\n{after}\n{e}") from None
        out.append((m, after))
    return out


def context(constants: Mapping[str, np.ndarray], assumed_finite: frozenset[str] = frozenset()) -> Context:
    if not constants and not assumed_finite:
        return NO_CONTEXT
    return Context(dict(constants), assumed_finite=frozenset(assumed_finite))


def weights(text: str, *names: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded finite constants for the named inputs of ``text``: nonzero integers in [-4, 4], so
    the rule is still checked in the interpreter's exact integer mode."""
    shapes = {t.name: t.shape for t in load(text).inputs}
    rng = np.random.default_rng(seed)
    values = np.array([-4.0, -3.0, -2.0, -1.0, 1.0, 2.0, 3.0, 4.0])
    return {n: rng.choice(values, shapes[n]) for n in names}


def with_special_values(arr: np.ndarray, at: tuple[int, ...], value: float = float("inf")) -> np.ndarray:
    """A copy of ``arr`` holding ``value`` (an infinity or NaN) at position ``at``."""
    out = np.array(arr, dtype=np.float64)
    out[at] = value
    return out


# --------------------------------------------------------------------------
# Hypothesis strategies: small random expressions of the shapes rules see
# --------------------------------------------------------------------------

_NAMES = "ijklmn"
_SUM_NAMES = "pqrs"


@st.composite
def iterators(draw, names: str, min_size: int, max_size: int, max_extent: int = 4) -> tuple[ir.Iter, ...]:
    n = draw(st.integers(min_size, max_size))
    out = []
    for name in names[:n]:
        lo = draw(st.sampled_from([0, 0, 0, -1, 1]))
        out.append(ir.Iter(name, lo, lo + draw(st.integers(1, max_extent))))
    return tuple(out)


@st.composite
def affine_index(draw, its: tuple[ir.Iter, ...]) -> ir.IndexExpr:
    """``c1*x1 + c2*x2 + k`` over one or two iterators (or a constant)."""
    chosen = draw(st.lists(st.sampled_from(its), min_size=0, max_size=2, unique=True)) if its else []
    terms: list[ir.IndexExpr] = []
    for it in chosen:
        c = draw(st.sampled_from([1, 1, 1, 2, -1]))
        terms.append(it if c == 1 else ir.IMul(ir.IConst(c), it))
    offset = draw(st.integers(-1, 1))
    if offset or not terms:
        terms.append(ir.IConst(offset))
    e = terms[0]
    for t in terms[1:]:
        e = ir.IAdd(e, t)
    return e


@st.composite
def contractions(draw, max_tensors: int = 2, max_sums: int = 3, min_sums: int = 0) -> ir.Scope:
    """``L[traversal] Sum[summation] A[..] * B[..]`` with random affine indices.

    Tensor shapes are drawn independently of the index ranges, so some reads
    fall outside (padding) and some elements are never read.
    """
    traversal = draw(iterators(_NAMES, 1, 3))
    summation = draw(iterators(_SUM_NAMES, min_sums, max_sums, 3))
    its = traversal + summation
    factors = []
    for k in range(draw(st.integers(1, max_tensors))):
        rank = draw(st.integers(1, 3))
        shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
        t = ir.Tensor("ABC"[k], shape)
        factors.append(t[tuple(draw(affine_index(its)) for _ in range(rank))])
    body = factors[0]
    for f in factors[1:]:
        body = body * f
    return ir.Scope(traversal, summation, body)


@st.composite
def programs(draw, **kwargs) -> ir.Program:
    return as_program(draw(contractions(**kwargs)))


def assert_needs_finite(
    rule_name: str, text: str, weight: str, at: tuple[int, ...], choose: str, reason: str
) -> None:
    """The rewrite ``choose`` of ``text`` is justified only by ``0 * weight = 0``.

    The rule refuses it (with ``reason``) while ``weight`` is an input, and
    while it is a constant holding an infinity; it applies once ``weight`` is
    a finite constant; and that rewrite, applied anyway, changes the
    interpreter's result when ``weight`` holds an infinity at ``at``.
    """
    program = load(text)
    rule = get(rule_name)
    finite = weights(text, weight)
    infinite = {weight: with_special_values(finite[weight], at)}
    for ctx in (NO_CONTEXT, context(infinite)):
        found = list(rule.match(program, ctx))
        taken = [m for m in found if isinstance(m, Match) and choose in m.summary]
        assert not taken, f"{rule_name} took {taken[0]} without a finite {weight}"
        reasons = [str(f) for f in found if isinstance(f, Failure)]
        assert any(reason in r for r in reasons), f"no failure mentions {reason!r}: {reasons}"
    ctx = context(finite)
    (m,) = [m for m in rule.matches(program, ctx) if choose in m.summary]
    after = rule.apply(program, m, ctx)
    check_result(program, after, ctx)
    rng = np.random.default_rng(0)
    inputs = {t.name: rng.standard_normal(t.shape) for t in program.inputs} | infinite
    want, got = evaluate(program, inputs), evaluate(after, inputs)
    assert any(not np.array_equal(want[o], got[o], equal_nan=True) for o in program.outputs), (
        f"{m} gave the same values with {weight} infinite at {at}"
    )
