"""Derivations: named rules applied in sequence, each step checked numerically.

A derivation is a list of :class:`Apply` requests (a rule name, and which of
its matches to take); :func:`derive` applies them one by one, checks every new
program against the previous one with the reference interpreter
(:func:`check_equivalent`), and records a readable :class:`Trace` of
:class:`TraceStep`: the rule, where it applied, what it did and the program
after it, in the text syntax. The search records its derivations with the same
:class:`TraceStep`, and the search cache keeps them without their programs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from einopt.core import ir
from einopt.core.interp import EvaluationError, evaluate
from einopt.rules.base import NO_CONTEXT, Context, Failure, Match

__all__ = [
    "DerivationError",
    "NotEquivalentError",
    "Apply",
    "Trace",
    "TraceStep",
    "apply_rule",
    "check_equivalent",
    "derive",
]

# Float64 results of equivalent programs differ only by summation order.
_RTOL = 1e-9
_INT_RANGE = 4


class DerivationError(ValueError):
    """A step cannot be taken (no such match, or several) or its result differs."""


class NotEquivalentError(DerivationError):
    """A rewritten program computes different values than the program it came from."""


def check_equivalent(
    before: ir.Program,
    after: ir.Program,
    ctx: Context = NO_CONTEXT,
    *,
    seed: int = 0,
    modes: Sequence[str] = ("float64", "int"),
) -> tuple[str, ...]:
    """Check that two programs compute the same outputs on seeded random inputs.

    Constant tensors take their values from ``ctx`` (the values constant-aware
    rules relied on); other inputs are random normals (float64) or random
    integers in ``[-4, 4]`` (``"int"``: exact arithmetic, so a rule that is only
    right up to rounding cannot pass). Integer mode is skipped when a program
    cannot be evaluated exactly (division, transcendental functions, or
    non-integer constants).

    Returns
    -------
    tuple of str
        The modes that were checked.

    Raises
    ------
    DerivationError
        If the outputs differ in names, shapes or values.
    """
    if before.outputs != after.outputs:
        raise NotEquivalentError(f"outputs differ: {list(before.outputs)} vs {list(after.outputs)}")
    tensors = {t.name: t for t in (*before.inputs, *after.inputs)}
    checked = []
    for mode in modes:
        rng = np.random.default_rng(seed)
        inputs = {}
        for name, t in sorted(tensors.items()):
            value = ctx.constants.get(name)
            if value is None:
                value = (
                    rng.integers(-_INT_RANGE, _INT_RANGE + 1, t.shape)
                    if mode == "int"
                    else rng.standard_normal(t.shape)
                )
            inputs[name] = np.asarray(value)
        try:
            want = evaluate(before, inputs, mode=mode)
            got = evaluate(after, inputs, mode=mode)
        except EvaluationError:
            if mode == "int":
                continue
            raise
        for name in before.outputs:
            a, b = want[name], got[name]
            if a.shape != b.shape:
                raise NotEquivalentError(f"output {name}: shape {list(a.shape)} became {list(b.shape)}")
            if mode == "int":
                ok = np.array_equal(a, b)
            else:
                # NaN (sqrt of a negative input) and infinities must appear at the same places.
                finite = np.abs(a[np.isfinite(a)])
                scale = max(1.0, float(finite.max(initial=0.0)))
                ok = np.allclose(a, b, rtol=_RTOL, atol=_RTOL * scale, equal_nan=True)
            if not ok:
                diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
                where = tuple(int(i) for i in np.unravel_index(np.argmax(diff), diff.shape))
                raise NotEquivalentError(
                    f"output {name} differs in {mode} mode: max |difference| {diff.max():.3g} "
                    f"at {list(where)} ({a[where]} vs {b[where]})"
                )
        checked.append(mode)
    return tuple(checked)


@dataclasses.dataclass(frozen=True)
class Apply:
    """A requested derivation step: apply ``rule`` at ``at`` (a scope label), taking the
    match whose summary contains ``choose`` (the one whose summary *is* ``choose`` when several
    contain it); each may be omitted when only one match is left. What it did is a :class:`TraceStep`."""

    rule: str
    at: str | None = None
    choose: str | None = None


def apply_rule(program: ir.Program, step: Apply | str, ctx: Context = NO_CONTEXT) -> tuple[ir.Program, Match]:
    """Apply one requested step (a rule name alone: its only match) to a program; exactly one match
    must fit it.

    Raises
    ------
    DerivationError
        When no match, or more than one, fits; the message lists the
        candidates and the rule's near misses.
    """
    # circle: einopt.rules (the registry) imports this module
    from einopt.rules import get

    if isinstance(step, str):
        step = Apply(step)
    rule = get(step.rule)
    found = list(rule.match(program, ctx))
    candidates = [
        m
        for m in found
        if isinstance(m, Match)
        and (step.at is None or m.where == step.at)
        and (step.choose is None or step.choose in m.summary)
    ]
    exact = [m for m in candidates if m.summary == step.choose]
    if len(candidates) > 1 and len(exact) == 1:
        candidates = exact
    if len(candidates) != 1:
        lines = [f"  {m}" for m in found if isinstance(m, Match)]
        lines += [f"  {f}" for f in found if isinstance(f, Failure)]
        what = "no match" if not candidates else f"{len(candidates)} matches"
        raise DerivationError(
            f"{step.rule} (at={step.at}, choose={step.choose!r}): {what}; the rule offers:\n"
            + ("\n".join(lines) or "  nothing")
        )
    match = candidates[0]
    return rule.apply(program, match, ctx), match


@dataclasses.dataclass(frozen=True)
class TraceStep:
    """A rule applied: which rule, where (a scope or binding label), what it did, and what is known
    of the program after it.

    ``program`` is the program after the step (None where only the step is kept: a found program
    read back from the search cache). ``phase`` is the search phase that took it (``"explore"``,
    ``"converge"`` or ``"cleanup"``; ``""`` outside a search), ``checked`` the interpreter modes
    :func:`derive` checked it in (``()`` when unchecked).
    """

    rule: str
    where: str
    summary: str
    program: ir.Program | None = None
    phase: str = ""
    checked: tuple[str, ...] = ()

    def text(self) -> str:
        """``rule @ where: summary`` (without ``@ where`` when it has no place)."""
        return f"{self.rule} @ {self.where}: {self.summary}" if self.where else f"{self.rule}: {self.summary}"


@dataclasses.dataclass(frozen=True)
class Trace:
    """A derivation: the start program and the steps taken from it."""

    start: ir.Program
    steps: tuple[TraceStep, ...]

    @property
    def result(self) -> ir.Program:
        return self.steps[-1].program if self.steps else self.start

    def programs(self) -> list[ir.Program]:
        return [self.start, *(s.program for s in self.steps)]

    def format(self) -> str:
        """The trace as text: ``E1``, then each rule and the expression it produced."""
        parts = ["E1:\n" + _indent(str(self.start))]
        for k, s in enumerate(self.steps, 2):
            checked = f" [checked: {', '.join(s.checked)}]" if s.checked else ""
            parts.append(f"E{k} = {s.rule} at {s.where}: {s.summary}{checked}\n" + _indent(str(s.program)))
        return "\n\n".join(parts)

    def __str__(self) -> str:
        return self.format()


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def derive(
    program: ir.Program,
    steps: Sequence[Apply | str],
    ctx: Context = NO_CONTEXT,
    *,
    verify: bool = True,
    seed: int = 0,
) -> Trace:
    """Take the requested ``steps`` (:class:`Apply`, or a rule name alone) in order, checking each
    result against the program before it.

    Raises
    ------
    DerivationError
        If a step does not fit exactly one match, or (with ``verify``) its
        result differs from the program it was applied to.
    """
    current, taken = program, []
    for k, step in enumerate(steps, 2):
        new, match = apply_rule(current, step, ctx)
        checked: tuple[str, ...] = ()
        if verify:
            try:
                checked = check_equivalent(current, new, ctx, seed=seed)
            except DerivationError as e:
                raise NotEquivalentError(f"E{k} ({match}) is not equivalent: {e}") from None
        taken.append(TraceStep(match.rule, match.where, match.summary, new, checked=checked))
        current = new
    return Trace(program, tuple(taken))
