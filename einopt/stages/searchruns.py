"""How a model's searches run (:func:`einopt.stages.partsearch.search_parts` decides which, allowed
how many states): in this process, in ``jobs`` worker processes or as Ray tasks, with the same
results everywhere.

A search is allowed, before it starts, the states the searches before it in
its pass left of the model's (:class:`Allowance`); searches run side by side
start before those before them are charged, so they are allowed what is
known to be left then, and one whose result that larger allowance changed is
run again with its due (:func:`einopt.search.budget.same_result`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from einopt.core import ir
from einopt.core.cost import estimate_seconds, model_cost
from einopt.core.parser import parse
from einopt.instantiate.program import as_program, program_model
from einopt.rules import Context
from einopt.search import search
from einopt.search.budget import same_result
from einopt.stages.searchsettings import Settings

__all__ = ["Allowance", "Progress", "RayUnavailable", "Runs", "Task", "finished"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where the searches of a model are, for a progress display.

    ``event`` is ``"searching"`` (after each frontier step of a search in this
    process), ``"done"`` (a search finished), ``"cached"`` (read from the
    cache), ``"skipped"`` (the model's states or its deadline were spent
    first) or ``"deeper"`` (a second, longer search of one the first pass cut
    short).
    """

    event: str
    part: str
    index: int  # of the distinct searches, from 0
    total: int  # distinct searches in the model
    states: int = 0
    seconds: float = 0.0
    best_speedup: float | None = None  # predicted: the input's estimate over the best candidate's


@dataclasses.dataclass(frozen=True)
class Task:
    """One distinct search: the canonical program (text) and its weights (canonical names)."""

    key: str
    text: str
    constants: Mapping[str, np.ndarray]


def finished(event: str, part: str, index: int, total: int, value: dict | None) -> Progress:
    """The :class:`Progress` of a search that ended (``value``: its stored form; None: not run)."""
    if value is None:
        return Progress(event, part, index, total)
    found = value["found"]
    base = next((f["predicted_s"] for f in found if not f["trace"]), None)
    best = min((f["predicted_s"] for f in found), default=None)
    speedup = base / best if base and best else None
    return Progress(event, part, index, total, value["stats"]["generated"], value["seconds"], speedup)


class Allowance:
    """The states a model's searches may still generate (None: no limit)."""

    def __init__(self, left: int | None) -> None:
        self.left = left

    def grant(self, cap: int | None) -> int | None:
        """What a search capped at ``cap`` may generate now."""
        if self.left is None:
            return cap
        return max(0, self.left if cap is None else min(cap, self.left))

    def charge(self, used: int) -> None:
        if self.left is not None:
            self.left = max(0, self.left - used)


@dataclasses.dataclass(frozen=True)
class Runs:
    """Runs a pass of searches (:meth:`__call__`), in this process or side by side."""

    settings: Settings
    jobs: int
    wall: float | None  # time.time() when the deadline stops the searches (None: none)
    owner: Mapping[str, str]
    progress: Callable[[Progress], None] | None
    order: Mapping[str, int]
    ray_address: str | None

    def __call__(
        self,
        todo: Sequence[Task],
        caps: Mapping[str, int | None],
        floors: Mapping[str, int],
        model: Allowance,
        event: str,
    ) -> Iterator[tuple[str, dict]]:
        """(task key, stored value) per search run, in the order of ``todo``; ``event`` is what
        progress calls a finished one.

        Each search is allowed ``model.grant(caps[key])`` states when every search before it is
        charged what it generated; a search that would be allowed no more than its floor (what an
        earlier pass already gave it) is not run. Side by side, a search starts before those before
        it are charged, allowed what is known to be left then (never less than its due); when that
        made a difference (:func:`~einopt.search.budget.same_result`) it is run again with its due,
        so the results are those of one process running them in order."""
        if self.ray_address is None and (self.jobs <= 1 or len(todo) < 2):
            for task in todo:
                allowed = model.grant(caps[task.key])
                if not self._worth(task, allowed, floors):
                    continue
                hook = None
                if self.progress is not None:
                    hook = _hook(self.progress, self.owner[task.key], self.order[task.key], len(self.order))
                value = _search_until(task, self.settings, allowed, self.wall, hook)
                yield from self._charge(task, value, model, event)
            return
        # Ray schedules over its cluster: every search is submitted at once there.
        ahead = len(todo) if self.ray_address is not None else self.jobs
        with _workers(self.jobs, self.ray_address) as submit:
            running: dict[int, tuple[int | None, object]] = {}
            started = 0
            for i, task in enumerate(todo):
                while started < len(todo) and started < i + ahead:
                    t = todo[started]
                    bound = model.grant(caps[t.key])  # the searches before it may still use some
                    if self._worth(t, bound, floors, report=False):
                        running[started] = (bound, submit(_search_until, t, self.settings, bound, self.wall))
                    started += 1
                allowed = model.grant(caps[task.key])
                ahead_run = running.pop(i, None)
                if not self._worth(task, allowed, floors):
                    if ahead_run is not None:
                        ahead_run[1].cancel()
                    continue
                value = ahead_run[1].result() if ahead_run is not None else None
                if value is not None and not same_result(
                    value["allowance"], value["stats"]["generated"], value["stats"]["stopped"], allowed
                ):
                    value = submit(_search_until, task, self.settings, allowed, self.wall).result()
                yield from self._charge(task, value, model, event)

    def _worth(self, task: Task, allowed: int | None, floors: Mapping[str, int], report: bool = True) -> bool:
        """Whether a search allowed ``allowed`` states may find more than it did with its floor (a
        first-pass search allowed none is reported skipped: it keeps its input)."""
        if allowed is None or allowed > floors.get(task.key, 0):
            return True
        if report and task.key not in floors:
            log.info("the model's search states are spent: %s keeps its input", self.owner[task.key])
            self._report(task, "skipped", None)
        return False

    def _charge(self, task: Task, value: dict | None, model: Allowance, event: str):
        if value is None:
            log.info("the search deadline passed: %s keeps its input", self.owner[task.key])
            self._report(task, "skipped", None)
            return
        model.charge(value["stats"]["generated"])
        self._report(task, event, value)
        yield task.key, value

    def _report(self, task: Task, event: str, value: dict | None) -> None:
        if self.progress is not None:
            self.progress(finished(event, self.owner[task.key], self.order[task.key], len(self.order), value))


@contextlib.contextmanager
def _workers(jobs: int, ray_address: str | None):
    """``submit(fn, *args) -> future`` (with ``result()`` and ``cancel()``): on a Ray cluster when an
    address is given, else in ``jobs`` local processes. Leaving early (an error, Ctrl-C) cancels what
    has not started."""
    if ray_address is not None:
        ray = _ray(ray_address)
        remote = ray.remote(_search_until)
        refs: list = []

        def submit_ray(fn, *args):
            ref = remote.remote(*args)
            refs.append(ref)
            return _RayFuture(ray, ref)

        try:
            yield submit_ray
        except BaseException:
            for ref in refs:
                ray.cancel(ref)
            raise
        return
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        futures: list = []

        def submit_local(fn, *args):
            future = pool.submit(fn, *args)
            futures.append(future)
            return future

        try:
            yield submit_local
        except BaseException:
            for f in futures:
                f.cancel()
            raise


@dataclasses.dataclass(frozen=True)
class _RayFuture:
    ray: object
    ref: object

    def result(self):
        return self.ray.get(self.ref)

    def cancel(self) -> None:
        self.ray.cancel(self.ref)


def _ray(address: str):
    """The ``ray`` module, connected to the cluster at ``address`` (a clear error without it)."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray: pip install 'einopt[ray]'") from None
    if not ray.is_initialized():
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        except Exception as e:  # noqa: BLE001 - Ray raises several kinds for an unreachable cluster
            raise RayUnavailable(f"cannot connect to the Ray cluster at {address}: {e}") from None
    return ray


class RayUnavailable(RuntimeError):
    """``--ray`` was given but Ray is not installed or its cluster cannot be reached."""


def _search_until(
    task: Task, settings: Settings, allowed: int | None, wall: float | None, hook=None
) -> dict | None:
    """:func:`_search_one`, unless the deadline (``time.time()``) has passed (then None)."""
    if wall is not None and time.time() >= wall:
        return None
    return _search_one(task, settings, allowed, wall, hook)


def _hook(progress: Callable[[Progress], None], part: str, index: int, total: int):
    """The search's progress callback as :class:`Progress` events; ``base`` (the input's predicted
    cost) is filled in before the search starts."""
    start = time.perf_counter()
    base: list[float] = []

    def hook(stats, depth: int, best) -> None:
        speedup = base[0] / best.cost if best is not None and base and best.cost else None
        elapsed = time.perf_counter() - start
        progress(Progress("searching", part, index, total, stats.generated, elapsed, speedup))

    hook.base = base
    return hook


def _search_one(task: Task, settings: Settings, allowed: int | None, wall: float | None, hook=None) -> dict:
    """Search one canonical program, allowed ``allowed`` states of ``settings.budget``, until the
    deadline ``wall`` (``time.time()``); the stored form of what it found (programs as text)."""
    program = as_program(parse(task.text))
    if hook is not None:
        hook.base.append(_input_cost(program, task.constants))
    t0 = time.perf_counter()
    result = search(
        program,
        ctx=Context(dict(task.constants)),
        budget=settings.budget,
        states=allowed,
        until=wall,
        converge_depth=settings.converge_depth,
        max_candidates=settings.candidates,
        progress=hook,
    )
    stats = result.stats
    return {
        "found": [
            {
                "program": str(c.program),
                "trace": [[s.rule, s.where, s.summary] for s in c.trace],
                "operators": list(c.operators),
                "predicted_s": c.cost,
                "work": list(c.work),
            }
            for c in result.candidates
        ],
        "stats": {
            "generated": stats.generated,
            "pruned": stats.pruned,
            "expanded": stats.expanded,
            "avoided_fraction": round(stats.avoided_fraction, 4),
            "complete": stats.complete,
            "stopped": stats.stopped,
        },
        "seconds": round(time.perf_counter() - t0, 3),
        "allowance": allowed,
    }


def _input_cost(program: ir.Program, constants: Mapping[str, np.ndarray]) -> float:
    """The analytic estimate the search gives its input (what progress compares the best with)."""
    try:
        model, _ = program_model(program, constants, light=True)
    except ValueError:
        return 0.0
    return estimate_seconds(model_cost(model))
