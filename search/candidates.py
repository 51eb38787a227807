"""Candidates: which states are instantiated, how they are costed, and how they are ranked.

A state becomes a candidate when every compute scope matches an operator
(distance 0); the input always is one. Each is instantiated once per key
(:func:`einopt.export.program_model`) into its operator list and a cost in
seconds: :func:`einopt.cost.estimate_seconds` of its ONNX model unless the
caller passes a ``cost`` callable. The cheapest candidate per operator list is
kept; the ranking is by cost, then depth, then key.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

import numpy as np

from einopt import ir
from einopt.search.results import Candidate, Stats, TraceStep

__all__ = ["Costing", "program_flops", "contractions", "rank", "in_time"]

log = logging.getLogger(__name__)


def in_time(deadline: float | None) -> bool:
    """Whether the ``time.monotonic()`` deadline (None: none) has not passed."""
    return deadline is None or time.monotonic() < deadline


def program_flops(program: ir.Program, constants: frozenset[str] = frozenset()) -> int:
    """Arithmetic of a program as written: per scope, its points times the operations of its body.
    Scopes that read only ``constants`` are left out (they are folded at compile time)."""
    total = 0
    for scope in ir.scopes_in(program):
        if constants and all(t.name in constants for t in ir.input_tensors(scope)):
            continue
        points = math.prod(it.extent for it in (*scope.traversal, *scope.summation))
        total += points * max(1, _ops(scope.body) + (1 if scope.summation else 0))
    return total


def contractions(program: ir.Program) -> int:
    """Scopes that sum a product (each one an operator or an eOperator to run)."""
    return sum(1 for s in ir.scopes_in(program) if s.summation and isinstance(s.body, ir.Binary))


def _ops(e: ir.ValueExpr) -> int:
    if isinstance(e, ir.Binary):
        return 1 + _ops(e.a) + _ops(e.b)
    if isinstance(e, ir.Unary):
        return 1 + _ops(e.x)
    return 0


def _analytic(model, inst) -> float:
    from einopt.cost import estimate_seconds, model_cost

    return estimate_seconds(model_cost(model))


def _operators(model, inst) -> tuple[str, ...]:
    out = []
    for node in model.graph.node:
        out.append(f"eop:{node.op_type}" if node.domain else node.op_type)
    return tuple(out)


class Costing:
    """Instantiates and costs candidate programs, once per key; keeps the best per operator list."""

    def __init__(self, env, cost, constants: Mapping[str, np.ndarray], stats: Stats) -> None:
        self.env = env
        self.cost = cost
        self.constants = constants
        self.stats = stats
        self.done: dict[str, Candidate | None] = {}
        self.by_ops: dict[tuple[str, ...], Candidate] = {}
        self.best_flops: int | None = None
        self.input: Candidate | None = None

    def add(
        self, program: ir.Program, trace: tuple[TraceStep, ...], k: str | None = None, is_input: bool = False
    ) -> None:
        from einopt.export import program_model
        from einopt.instantiate.emit import InstantiationError

        k = k or self.env.key(program)
        if k in self.done:
            return
        if not is_input and not in_time(self.env.deadline):
            self.stats.complete = False
            return
        self.done[k] = None
        if not is_input and self.env.distance(program) != 0:
            return
        try:
            model, inst = program_model(program, self.constants)
        except (InstantiationError, ValueError) as e:
            log.info("candidate %s not instantiable: %s", k[:8], e)
            return
        self.stats.candidates_costed += 1
        seconds = float(self.cost(program, model, inst) if self.cost else _analytic(model, inst))
        flops = program_flops(program, self.env.constants)
        cand = Candidate(program, trace, _operators(model, inst), seconds, k, flops)
        self.done[k] = cand
        if self.best_flops is None or flops < self.best_flops:
            self.best_flops = flops
        if is_input:
            self.input = cand
            return
        old = self.by_ops.get(cand.operators)
        if old is None or rank(cand) < rank(old):
            self.by_ops[cand.operators] = cand

    def hopeless(self, program: ir.Program, slack: float) -> bool:
        return (
            self.best_flops is not None
            and program_flops(program, self.env.constants) > slack * self.best_flops
        )

    def best(self) -> Candidate | None:
        return min(self._all(), key=rank, default=None)

    def _all(self) -> list[Candidate]:
        return [*self.by_ops.values(), *([self.input] if self.input else [])]

    def ranked(self, limit: int) -> tuple[Candidate, ...]:
        """The best ``limit`` candidates, best first, and the input after them when it is not among them."""
        ranked = sorted(self._all(), key=rank)
        out = ranked[:limit]
        if self.input is not None and self.input not in out:
            out.append(self.input)
        return tuple(out)


def rank(c: Candidate) -> tuple:
    return (c.cost, len(c.trace), c.key)
