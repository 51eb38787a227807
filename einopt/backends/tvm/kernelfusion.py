"""Kernel fusion for ``--kernels tvm``: element-wise work inlined into the element-wise scope that reads it.

A program's scopes are its kernels: every binding, and every scope nested in
one, is materialised by an operator of its own. With generated kernels, an
element-wise scope that nothing else reads can be computed inside the scope
that reads it instead, in registers, without writing it to memory: the
LSTM cell's gates, activations, products and sum after its merged MatMul
become one or two kernels where ONNX Runtime runs nine nodes (and the Split
between them disappears: the fused kernel reads the MatMul's output at the
gates' offsets).

:func:`fuse_for_kernels` does that with the search's own vertical fusion
(``fuse_expressions``, :func:`einopt.rules.fusion.fuse`, with its legality):
a producer without reduction, not an output, read by exactly one binding
that has no reduction either, is inlined into it (not when a scope nested in
that binding reads it too: the producer would stay and be computed twice); a scope nested in such a
binding, without reduction, is inlined where it is read. Reductions are
never fused (a MatMul or a convolution stays the predefined operator that
runs it at the machine's FLOP rate). Whether the fused program is faster is
measured: selection times it beside the unfused one (:mod:`einopt.stages.select`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from einopt.core import ir
from einopt.core.rewrite import accesses, replace_scopes
from einopt.rules.derive import TraceStep
from einopt.rules.fusion import fuse, program_reads
from einopt.rules.traversal import inline
from einopt.search.results import Candidate

__all__ = ["fuse_for_kernels", "fused_candidates", "PHASE"]

PHASE = "kernels"
"""The trace phase of a fusion step (the search's phases are explore, converge and cleanup)."""


def fuse_for_kernels(program: ir.Program) -> tuple[ir.Program, tuple[TraceStep, ...]]:
    """``program`` with its element-wise chains fused (the module docstring), and the steps taken."""
    steps: list[TraceStep] = []
    while True:
        step = _one_fusion(program)
        if step is None:
            return program, tuple(steps)
        program = step.program
        steps.append(step)


def fused_candidates(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The ``candidates`` whose element-wise chains fuse into fewer generated kernels, fused (the
    fusion steps added to their traces), each program once and none already among ``candidates``."""
    out = []
    seen = {c.program for c in candidates}
    for c in candidates:
        fused, steps = fuse_for_kernels(c.program)
        if steps and fused not in seen:
            seen.add(fused)
            out.append(dataclasses.replace(c, program=fused, trace=c.trace + steps))
    return out


def _one_fusion(program: ir.Program) -> TraceStep | None:
    names = program.names()
    readers: dict[str, list[str]] = {}
    for consumer, reads in program_reads(program).items():
        for name in reads:
            readers.setdefault(name, []).append(consumer)
    for consumer, c in program.bindings:
        if c.summation:
            continue
        for a in accesses(c.body):
            src = a.source
            if not isinstance(src, ir.Scope) or src.summation or src is c:
                continue
            if src not in names:  # a nested scope: inline it where it is read
                new = inline(c, a, "a nested scope", labels=names)
                if isinstance(new, str):
                    continue
                out = replace_scopes(program, {c: new})
                return TraceStep(
                    "fuse_expressions", consumer, "inline a nested scope (one kernel)", out, PHASE
                )
            producer = names[src]
            if producer in program.outputs or readers.get(producer) != [consumer]:
                continue
            out = fuse(program, consumer, producer)
            if isinstance(out, str) or any(n == producer for n, _ in out.bindings):
                # Kept bound (a scope nested in the consumer still reads it): the kernel would
                # compute it again beside the producer's operator, which can round differently.
                continue
            return TraceStep(
                "fuse_expressions",
                consumer,
                f"inline {producer} into {consumer}, drop {producer} (one kernel)",
                out,
                PHASE,
            )
    return None
