"""Candidates: which states are instantiated, how they are costed, and how they are ranked.

A state becomes a candidate when every compute scope matches an operator
(distance 0); the input always is one. Each is instantiated once per key
(:func:`einopt.instantiate.program.program_model`) into its operator list and a cost in
seconds: FLOPs and bytes of its ONNX model's nodes at a nominal rate (nodes
reading only weights are folded) unless the caller passes a ``cost``
callable. The cheapest candidate per work done (its nodes' operators and
input shapes as a multiset: the order of independent nodes changes nothing)
is kept; the ranking is by cost, then depth, then key.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from einopt.core import ir
from einopt.core.cost import BANDWIDTH, PEAK_FLOPS
from einopt.search import costprocess
from einopt.search.distance import reads_only
from einopt.search.results import Candidate, Stats, TraceStep

__all__ = [
    "Costing",
    "program_flops",
    "contractions",
    "rank",
]

log = logging.getLogger(__name__)

ESTIMATE_SLACK = 4.0
"""How much more lenient the bytes-and-FLOPs bar is than the FLOPs bar: the analytic estimate is
crude (the next stage measures), so it only drops states far out of reach."""


def program_flops(program: ir.Program, constants: frozenset[str] = frozenset()) -> int:
    """Arithmetic of a program as written: per scope, its points times the operations of its body.
    Scopes that read only ``constants`` are left out (they are folded at compile time)."""
    return _sizes(program, constants)[0]


def _sizes(program: ir.Program, constants: frozenset[str]) -> tuple[int, int]:
    """FLOPs and the bytes a program moves at least: its inputs read once, and every scope written
    once (scopes that read only ``constants`` are folded at compile time and move nothing)."""
    flops = 0
    elements = sum(math.prod(t.shape) for t in program.inputs if t.name not in constants)
    for scope in ir.scopes_in(program):
        f, e = ir._cached(scope, ("sizes", constants), lambda s=scope: _scope_sizes(s, constants))
        flops += f
        elements += e
    return flops, 4 * elements


def _scope_sizes(scope: ir.Scope, constants: frozenset[str]) -> tuple[int, int]:
    """A scope's FLOPs and the elements it writes (none where it reads only ``constants``): once per
    scope, which the search's states share."""
    if constants and reads_only(scope, constants):
        return 0, 0
    points = math.prod(it.extent for it in (*scope.traversal, *scope.summation))
    return points * max(1, _ops(scope.body, constants) + (1 if scope.summation else 0)), math.prod(
        scope.shape
    )


def _seconds(flops: int, nbytes: int) -> float:
    return flops / PEAK_FLOPS + nbytes / BANDWIDTH


def contractions(program: ir.Program) -> int:
    """Scopes that sum a product (each one an operator or an eOperator to run)."""
    return sum(1 for s in ir.scopes_in(program) if s.summation and isinstance(s.body, ir.Binary))


def _ops(e: ir.ValueExpr, constants: frozenset[str] = frozenset()) -> int:
    """Operations per point of a body; a subterm of numbers and constant reads (``A[f] * B[f]``, a
    scaled bias) is folded at compile time and costs none."""
    if constants and reads_only(e, constants):
        return 0
    if isinstance(e, ir.Binary):
        return 1 + _ops(e.a, constants) + _ops(e.b, constants)
    if isinstance(e, ir.Unary):
        return 1 + _ops(e.x, constants)
    return 0


class _Found(NamedTuple):
    """A candidate found, waiting for its cost: its program and derivation, key, FLOPs as written,
    and the seconds since the search began and the states it had generated when it was found."""

    program: ir.Program
    trace: tuple[TraceStep, ...]
    key: str
    flops: int
    after: float
    generated: int
    is_input: bool


class Costing:
    """Instantiates and costs candidate programs, once per key; keeps the best per work done (the
    multiset of its nodes' operators and input shapes).

    With the analytic cost and ``beside``, once this search has spent a moment costing, its
    candidates are sent to a second process (:mod:`einopt.search.costprocess`) and the search goes
    on; at its end this process costs what is still waiting, from the last one found, while the
    other goes on from the first. Which process costs a candidate changes nothing: its cost is the
    same, and the ranking is by cost, depth and key."""

    def __init__(
        self,
        env,
        cost,
        constants: Mapping[str, np.ndarray],
        stats: Stats,
        slack: float = float("inf"),
        started: float | None = None,
        beside: bool = False,
    ) -> None:
        self.slack = slack
        self.started = time.perf_counter() if started is None else started
        self.env = env
        self.cost = cost
        self.constants = constants
        self.stats = stats
        self.done: dict[str, Candidate | None] = {}
        self.by_work: dict[tuple[str, ...], Candidate] = {}
        self.best_estimate: float | None = None
        self.best_flops: int | None = None
        self.input: Candidate | None = None
        self.estimates: dict = {}
        # Costing beside the search: after ``handoff`` seconds of it here, when ``beside``.
        self.handoff = costprocess.handoff_after() if beside and cost is None else None
        self.spent = 0.0
        self.beside: costprocess.CostProcess | None = None
        self.search = 0
        self.sent = 0
        self.waiting: dict[int, _Found] = {}  # sent and not back yet, by number

    def add(
        self, program: ir.Program, trace: tuple[TraceStep, ...], k: str | None = None, is_input: bool = False
    ) -> None:
        k = k or self.env.key(program)
        if k in self.done:
            return
        # No clock here: what is instantiated depends on the states generated, never on the time.
        self.done[k] = None
        if not is_input and self.env.distance(program) != 0:
            return
        # The program as written bounds what is hopeless (cheap, before any instantiation): a
        # candidate that skips the zeros of a strided transposed convolution lowers the FLOPs bar.
        flops, nbytes = _sizes(program, self.env.constants)
        guess = _seconds(flops, nbytes)
        self.best_flops = flops if self.best_flops is None else min(self.best_flops, flops)
        self.best_estimate = guess if self.best_estimate is None else min(self.best_estimate, guess)
        if not is_input and self._beyond(flops, guess):
            return
        found = _Found(
            program, trace, k, flops, time.perf_counter() - self.started, self.stats.generated, is_input
        )
        if not is_input and self._send(found):
            return
        self._settle(found, self._here(found))

    def _here(self, found: _Found) -> costprocess.Outcome:
        """Cost ``found`` in this process."""
        t = time.perf_counter()
        try:
            return costprocess.candidate_cost(found.program, self.constants, self.estimates, self.cost)
        finally:
            self.spent += time.perf_counter() - t

    def _send(self, found: _Found) -> bool:
        """Send ``found`` to the second process, when this search costs there (now or from now on)."""
        if self.handoff is None or (self.beside is None and self.spent < self.handoff):
            return False
        if self.beside is None:
            self.beside = costprocess.shared()
            if self.beside is None:
                self.handoff = None
                return False
            try:
                self.search = self.beside.begin(self.constants)
            except OSError as e:
                self._lost(e)
                return False
            log.debug("costing goes on in a second process after %.2f s", self.spent)
        number = self.sent
        self.sent += 1
        self.waiting[number] = found
        try:
            self.beside.submit(number, found.program)
        except OSError as e:
            self._lost(e)
        else:
            self._collect(block=False)
        return True

    def _collect(self, block: bool) -> None:
        """Settle the outcomes the second process has sent back. With ``block``, until none is
        waiting: meanwhile this process costs the last ones waiting (the two work from either end)."""
        while self.waiting and self.beside is not None:
            try:
                got = self.beside.receive()
            except (EOFError, OSError) as e:
                self._lost(e)
                return
            if got is None:
                if not block:
                    return
                found = self.waiting.pop(next(reversed(self.waiting)))
                self._settle(found, self._here(found))
                continue
            search, number, outcome = got
            if search != self.search or number not in self.waiting:
                continue  # an earlier search's, or costed here meanwhile
            if isinstance(outcome, Exception):
                raise outcome
            self._settle(self.waiting.pop(number), outcome)

    def close(self) -> None:
        """The search is over (ranked, or stopped early): the second process may skip what is left."""
        if self.beside is not None:
            self.waiting.clear()
            try:
                self.beside.done()
            except OSError as e:
                costprocess.lost(e)
            self.beside = None

    def _lost(self, why: BaseException) -> None:
        """The second process is gone: what it had not sent back is costed here, in order."""
        costprocess.lost(why)
        self.beside = None
        self.handoff = None
        for number in sorted(self.waiting):
            found = self.waiting.pop(number)
            self._settle(found, self._here(found))

    def _settle(self, found: _Found, outcome: costprocess.Outcome) -> None:
        if outcome.skipped:
            log.info("candidate %s not instantiable: %s", found.key[:8], outcome.skipped)
            return
        self.stats.candidates_costed += 1
        cand = Candidate(
            found.program,
            found.trace,
            outcome.operators,
            float(outcome.seconds),
            found.key,
            found.flops,
            found.after,
            found.generated,
            outcome.work,
        )
        self.done[found.key] = cand
        if found.is_input:
            self.input = cand
            return
        old = self.by_work.get(outcome.work)
        if old is None or rank(cand) < rank(old):
            self.by_work[outcome.work] = cand

    def hopeless(self, program: ir.Program) -> bool:
        """Whether ``program``'s FLOPs are more than ``slack`` times the best candidate's, or its
        analytic estimate (FLOPs and bytes) more than ``ESTIMATE_SLACK * slack`` times: a 20 GB
        re-layout of a band product is never instantiated; an im2col buffer or a col2im-like
        OffsetReduce, which the analytic estimate overrates, still is."""
        flops, nbytes = _sizes(program, self.env.constants)
        return self._beyond(flops, _seconds(flops, nbytes))

    def _beyond(self, flops: int, seconds: float) -> bool:
        if self.best_flops is None or self.best_estimate is None:
            return False
        return (
            flops > self.slack * self.best_flops or seconds > ESTIMATE_SLACK * self.slack * self.best_estimate
        )

    def best(self) -> Candidate | None:
        """The best candidate costed so far (outcomes still on their way from the second process are
        not waited for)."""
        self._collect(block=False)
        return min(self._all(), key=rank, default=None)

    def _all(self) -> list[Candidate]:
        return [*self.by_work.values(), *([self.input] if self.input else [])]

    def ranked(self, limit: int) -> tuple[Candidate, ...]:
        """The best ``limit`` candidates, best first, and the input after them when it is not among them."""
        self._collect(block=True)
        ranked = sorted(self._all(), key=rank)
        out = ranked[:limit]
        if self.input is not None and self.input not in out:
            out.append(self.input)
        return tuple(out)


def rank(c: Candidate) -> tuple:
    return (c.cost, len(c.trace), c.key)
