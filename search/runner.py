"""A frontier's work under a budget of states: in this process, or split over worker processes.

The engine hands :class:`Runner` a unit of work (``fn(state, env, stats) ->
value``: expand a state, or converge it) and a batch of states. The states
are charged in batch order, each allowed what the states before it left of
the batch's allowance, and the batch stops after the first state cut short.
Worker processes cannot know what the slices before their own will use, so a
worker runs each state allowed what its own slice left (never less than its
exact allowance); a state whose result that larger allowance changed is run
again here with the exact one (:func:`~einopt.search.budget.same_result`).
So a search stops at the same state, with the same states, whatever ``jobs``
is.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import NamedTuple

from einopt.search.budget import same_result
from einopt.search.results import Stats

__all__ = ["Runner"]


class _Done(NamedTuple):
    """One state's unit of work: what it gave, its own counts, and the states it was allowed."""

    value: object
    stats: Stats
    allowed: int | None


def _unit(fn: Callable, state, env, allowed: int | None) -> _Done:
    """``fn`` on one state, allowed to generate ``allowed`` states (None: no limit)."""
    stats = Stats()
    env.limit = allowed
    try:
        value = fn(state, env, stats)
    finally:
        env.limit = None
    return _Done(value, stats, allowed)


def _units(fn: Callable, states: Sequence, env, left: int | None) -> list[_Done]:
    """``fn`` on each state in order, each allowed what those before it left of ``left`` states;
    it stops after the first one cut short."""
    out: list[_Done] = []
    used = 0
    for state in states:
        out.append(_unit(fn, state, env, None if left is None else left - used))
        used += out[-1].stats.generated
        if out[-1].stats.stopped:
            break
    return out


# Worker processes keep their own environment (memos) across calls.
_WORKER_ENV = None


def _worker_init(env) -> None:
    global _WORKER_ENV
    _WORKER_ENV = env


def _worker(fn: Callable, states: Sequence, left: int | None) -> list[_Done]:
    return _units(fn, states, _WORKER_ENV, left)


class Runner:
    """Runs units of work on batches of states, in this process or split over ``jobs`` workers.

    ``env`` is this process's environment (its ``limit`` is set around each
    unit); ``worker_env`` the one each worker starts with (picklable)."""

    def __init__(self, env, jobs: int, worker_env=None) -> None:
        self.env = env
        self.jobs = jobs
        self.pool = None
        if jobs > 1:
            self.pool = concurrent.futures.ProcessPoolExecutor(
                jobs, initializer=_worker_init, initargs=(worker_env,)
            )

    def run(self, fn: Callable, states: Sequence, stats: Stats, left: int | None) -> list:
        """What ``fn`` gives for each state, in order, up to and including the first one cut short
        (``stats.stopped`` then says why); ``left`` states generated at most in all (None: no limit).
        Each state's counts are merged into ``stats``."""
        if self.pool is None or len(states) < 2 * self.jobs:
            done = _units(fn, states, self.env, left)
            for d in done:
                stats.merge(d.stats)
            return [d.value for d in done]
        size = -(-len(states) // (self.jobs * 4))
        chunks = [states[i : i + size] for i in range(0, len(states), size)]
        futures = [self.pool.submit(_worker, fn, c, left) for c in chunks]
        out: list = []
        used = 0
        try:
            for chunk, future in zip(chunks, futures, strict=True):
                part = future.result()
                for k, state in enumerate(chunk):
                    allowed = None if left is None else left - used
                    d = part[k] if k < len(part) else None
                    if d is None or not same_result(d.allowed, d.stats.generated, d.stats.stopped, allowed):
                        d = _unit(fn, state, self.env, allowed)
                    stats.merge(d.stats)
                    out.append(d.value)
                    used += d.stats.generated
                    if d.stats.stopped:
                        return out
        finally:
            for future in futures:
                future.cancel()
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
