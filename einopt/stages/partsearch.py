"""The pipeline's search stage: every translated subprogram searched, once per canonical form.

A subprogram is searched in canonical names (its inputs ``x0, x1, ...`` and
bindings ``y0, y1, ...`` in order), so two subprograms with the same program,
shapes and weight facts (:func:`weight_facts`) share one search: ResNet's
repeated blocks are searched once per shape. What a search found is kept in
the measurement cache's SQLite file (:class:`einopt.runtime.cache.MeasurementCache`),
so a second run of a model, or another model with the same layers, searches
nothing it has searched before. Found programs are renamed back to each
part's own names; every one is verified on that part's own weights before it
can reach an output, so a derivation that held for the weights it was found
on and not for these fails verification and never gets further.

``jobs`` processes search distinct subprograms side by side; the results do
not depend on it (each search is one process's work, merged in part order).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from einopt.core import ir
from einopt.core.rewrite import binding_program, put_binding, rename_tensors
from einopt.runtime.cache import MeasurementCache
from einopt.search.engine import DEFAULT_CONVERGE_DEPTH, DEFAULT_MAX_DEPTH

__all__ = [
    "Settings",
    "Step",
    "Found",
    "PartSearch",
    "Progress",
    "RayUnavailable",
    "search_parts",
    "weight_facts",
]

log = logging.getLogger(__name__)

FORMAT = 3
"""Version of what is stored per search; bump it when the search's output for a program changes."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a subprogram's search depends on besides the subprogram.

    Parameters
    ----------
    max_depth, converge_depth : int
        Explorative and converging steps (see :func:`einopt.search.search`).
    part_budget_s : float
        Seconds one subprogram's search may take at most (the candidates
        found by then are kept; the report says the search was cut short).
    candidates : int
        Ranked candidates kept per search (one per distinct work: the multiset
        of its nodes' operators and shapes). The analytic ranking is crude, so
        many are kept: the measured cost stage (:mod:`einopt.stages.predict`) re-ranks them.
    exact : bool
        Share a search only between subprograms whose weights are equal
        (when nothing is verified, nothing may rest on verification).
    """

    max_depth: int = DEFAULT_MAX_DEPTH
    converge_depth: int = DEFAULT_CONVERGE_DEPTH
    part_budget_s: float = 60.0
    candidates: int = 32
    exact: bool = False

    def key(self) -> list:
        return [FORMAT, self.max_depth, self.converge_depth, self.part_budget_s, self.candidates, self.exact]


@dataclasses.dataclass(frozen=True)
class Step:
    """One derivation step of a found program: the rule, where it applied, and what it did."""

    rule: str
    where: str
    summary: str

    def text(self) -> str:
        return f"{self.rule} @ {self.where}: {self.summary}" if self.where else f"{self.rule}: {self.summary}"


@dataclasses.dataclass(frozen=True)
class Found:
    """A program the search found equal to a subprogram, in that subprogram's names."""

    program: ir.Program
    trace: tuple[Step, ...]
    operators: tuple[str, ...]
    predicted_s: (
        float  # seconds: the search's analytic estimate, or measured operators' (einopt.stages.predict)
    )
    estimated_s: float | None = None  # the search's analytic estimate, once predicted_s is measured
    work: tuple[str, ...] = ()  # its nodes (operator and input shapes), sorted: one work, one candidate
    timed_share: float | None = None  # of predicted_s, from nodes timed alone (the rest estimated)

    @property
    def depth(self) -> int:
        return len(self.trace)

    def trace_text(self) -> str:
        return "; ".join(s.text() for s in self.trace)


@dataclasses.dataclass(frozen=True)
class PartSearch:
    """What one subprogram's search found (ranked by predicted cost, the input among them)."""

    found: tuple[Found, ...]
    stats: Mapping[str, object]  # generated, pruned, expanded, complete, ... (einopt.search.Stats)
    seconds: float  # of the search that produced it (0 when it came from the cache in this run)
    cached: bool  # read from the cache file
    same_as: str = ""  # the subprogram whose search this one shares ("" : its own)

    @property
    def input(self) -> Found | None:
        return next((f for f in self.found if not f.trace), None)

    @classmethod
    def not_searched(cls, same_as: str = "") -> PartSearch:
        """What a part that was not searched has (depth 0, or the whole-model budget ran out)."""
        return cls((), {"complete": False, "searched": False}, 0.0, False, same_as)


def weight_facts(constants: Mapping[str, np.ndarray], names: Sequence[str], exact: bool) -> list:
    """What a shared search may assume about the weights ``names``: shape, element type, and the
    facts constant-aware rules read (finite, signs, within [0, 1], zeros, a uniform value); with
    ``exact``, a digest of the values themselves."""
    out: list = []
    for n in names:
        a = np.asarray(constants[n])
        if exact:
            out.append(
                [list(a.shape), str(a.dtype), hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()]
            )
            continue
        finite = bool(np.isfinite(a).all())
        lo, hi = (float(a.min()), float(a.max())) if finite and a.size else (0.0, 0.0)
        out.append(
            [
                list(a.shape),
                str(a.dtype),
                finite,
                lo >= 0,
                hi <= 0,
                lo >= 0 and hi <= 1,
                bool((a == 0).any()),
                lo if lo == hi else None,
            ]
        )
    return out


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where the searches of a model are, for a progress display.

    ``event`` is ``"searching"`` (after each frontier step of a search in this
    process), ``"done"`` (a search finished), ``"cached"`` (read from the
    cache), ``"skipped"`` (the whole-model budget was spent first) or
    ``"deeper"`` (a second, longer search of one the first pass cut short).
    """

    event: str
    part: str
    index: int  # of the distinct searches, from 0
    total: int  # distinct searches in the model
    states: int = 0
    seconds: float = 0.0
    best_speedup: float | None = None  # predicted: the input's estimate over the best candidate's


@dataclasses.dataclass(frozen=True)
class _Task:
    """One distinct search: the canonical program (text) and its weights (canonical names)."""

    key: str
    text: str
    constants: Mapping[str, np.ndarray]


def _canonical_names(program: ir.Program) -> dict[str, str]:
    return {t.name: f"x{i}" for i, t in enumerate(program.inputs)} | {
        n: f"y{i}" for i, (n, _) in enumerate(program.bindings)
    }


def search_parts(
    parts: Sequence,
    settings: Settings,
    store: MeasurementCache,
    *,
    jobs: int = 1,
    deadline: float | None = None,
    progress: Callable[[Progress], None] | None = None,
    ray_address: str | None = None,
) -> dict[str, PartSearch]:
    """Search every translated part (``einopt.frontend.translate.Part``), sharing identical ones.

    Parameters
    ----------
    parts : sequence of Part
        The subprograms (parts without a program are skipped).
    settings : Settings
        Search limits (they are part of the cache key).
    store : MeasurementCache
        Where searches are looked up first and stored after.
    jobs : int
        Processes searching distinct subprograms side by side.
    deadline : float, optional
        ``time.monotonic()`` after which no new search starts (the parts not
        searched by then keep only their input); a search running then stops
        at its own budget.
    progress : callable, optional
        Called with a :class:`Progress` as the searches go.
    ray_address : str, optional
        Run the searches as Ray tasks on the cluster at this address
        (``"auto"``, ``"ray://host:10001"``, ...) instead of local processes.
        The results do not depend on where they ran.

    Returns
    -------
    dict
        Part name -> its :class:`PartSearch`, for every translated part.
    """
    tasks: dict[str, _Task] = {}
    owner: dict[str, str] = {}  # task key -> the first part (or part/binding) with it
    of_part: dict[str, tuple[str, dict[str, str]]] = {}  # part -> (task key, canonical names)
    pieces: dict[str, list[tuple[str, str, dict[str, str]]]] = {}  # part -> (binding, key, names)
    for p in parts:
        if p.program is None:
            continue
        of_part[p.name] = _task(p.program, p.constants, settings, tasks, owner, p.name)
        if len(p.program.bindings) > 1:
            pieces[p.name] = [
                (name, *_task(sub, p.constants, settings, tasks, owner, f"{p.name}/{name}"))
                for name, sub in _pieces(p.program)
            ]
    stored: dict[str, tuple[dict, bool]] = {}
    todo = []
    for i, (k, task) in enumerate(tasks.items()):
        found = store.found(k)
        if found is None:
            todo.append(task)
            continue
        stored[k] = (found, True)
        if progress is not None:
            progress(_finished("cached", owner[k], i, len(tasks), found))
    order = {k: i for i, k in enumerate(tasks)}
    # Two passes when the whole-model budget is tight: every search first gets an equal share of half
    # of it (so none is starved by the ones before it), then the searches that share cut short go
    # again, with their own budget, the costliest subprograms (by the input's estimate) first.
    first = _first_share(len(todo), deadline, settings.part_budget_s)
    ran = dict(_run(todo, first, settings, jobs, deadline, owner, progress, order, "done", ray_address))
    again = [t for t in todo if t.key in ran and not _finished_search(ran[t.key], settings)]
    # One expression's search goes deeper before a whole subprogram's: the latter explores the same
    # rewrites of each of its expressions, combined (what only it finds are the merges of expressions,
    # a few steps deep). Then the costliest (by the input's estimate) first.
    whole = {k for k, _ in of_part.values()} - {k for ps in pieces.values() for _, k, _ in ps}
    again.sort(key=lambda t: (t.key in whole, -_input_estimate(ran[t.key])))
    if again and first < settings.part_budget_s:
        for k, value in _run(
            again,
            settings.part_budget_s,
            settings,
            jobs,
            deadline,
            owner,
            progress,
            order,
            "deeper",
            ray_address,
        ):
            if value["stats"]["complete"] or value["budget_s"] > ran[k]["budget_s"]:
                ran[k] = value
    for k, value in ran.items():
        stored[k] = (value, False)
        # A search cut shorter than its own budget (by the whole model's) is not what the key promises.
        if _finished_search(value, settings):
            store.keep(k, value)
    out: dict[str, PartSearch] = {}
    by_name = {p.name: p for p in parts}
    for name, (k, names) in of_part.items():
        value, cached = stored.get(k, (None, False))
        same_as = owner[k] if owner[k] != name else ""
        found = _part_search(value, {v: n for n, v in names.items()}, cached, same_as)
        out[name] = _with_pieces(by_name[name], found, pieces.get(name, ()), stored, names, owner)
    return out


PIECE_CANDIDATES = 8
"""Derived programs of one expression's own search put into its subprogram, at most (best first)."""


def _pieces(program: ir.Program) -> list[tuple[str, ir.Program]]:
    """Each binding of ``program`` on its own (see :func:`einopt.core.rewrite.binding_program`)."""
    return [(name, binding_program(program, name)) for name, _ in program.bindings]


def _task(
    program: ir.Program,
    constants: Mapping[str, np.ndarray],
    settings: Settings,
    tasks: dict[str, _Task],
    owner: dict[str, str],
    label: str,
) -> tuple[str, dict[str, str]]:
    """The key of the search of ``program`` (added to ``tasks`` when new) and its canonical names."""
    names = _canonical_names(program)
    weights = [t.name for t in program.inputs if t.name in constants]
    text = str(rename_tensors(program, names))
    k = _key(text, settings, weight_facts(constants, weights, settings.exact))
    if k not in tasks:
        tasks[k] = _Task(k, text, {names[n]: constants[n] for n in weights})
        owner[k] = label
    return k, names


def _with_pieces(
    part,
    search: PartSearch,
    pieces: Sequence[tuple[str, str, dict[str, str]]],
    stored: Mapping[str, tuple[dict, bool]],
    names: Mapping[str, str],
    owner: Mapping[str, str],
) -> PartSearch:
    """``search`` with, for each binding searched on its own, its best derived programs put in place
    of that binding in the part (the other bindings as they are), ranked with the rest.

    The stats count the part's own searches (the whole part's and those of its bindings that no other
    part owns): ``whole`` and ``pieces`` give each one's."""
    if not pieces:
        return search
    found = list(search.found)
    stats = dict(search.stats)
    whole = {k: stats[k] for k in ("generated", "complete", "searched") if k in stats} | {
        "seconds": search.seconds
    }
    details, seconds = [], search.seconds
    for binding, k, piece_names in pieces:
        value, cached = stored.get(k, (None, False))
        own = owner[k] == f"{part.name}/{binding}"
        if value is None:
            details.append({"binding": binding, "searched": False})
            stats["complete"] = False
            continue
        details.append(
            {
                "binding": binding,
                "generated": value["stats"]["generated"],
                "complete": value["stats"]["complete"],
                "seconds": value["seconds"],
                "cached": cached,
                "same_as": "" if own else owner[k],
            }
        )
        stats["complete"] = stats.get("complete", True) and value["stats"]["complete"]
        if own:
            stats["generated"] = stats.get("generated", 0) + value["stats"]["generated"]
            seconds += 0.0 if cached else value["seconds"]
        # The piece's names (canonical there) as the part's own search labels them.
        labels = {v: names[n] for n, v in piece_names.items()}
        piece = _part_search(value, {v: n for n, v in piece_names.items()}, cached, "")
        for f in [f for f in piece.found if f.trace][:PIECE_CANDIDATES]:
            try:
                program = put_binding(part.program, binding, f.program)
                steps = tuple(
                    Step(s.rule, _relabel(s.where, labels), _relabel(s.summary, labels)) for s in f.trace
                )
                found.append(_costed(program, steps, part.constants))
            except (ir.IRError, ValueError) as e:
                log.info("%s: %s's candidate does not fit back: %s", part.name, binding, e)
    if search.input is None and len(found) > len(search.found):
        # The whole part was not searched: its input is a candidate all the same.
        found.append(_costed(part.program, (), part.constants))
    # One candidate per work (the whole part's search and a binding's may find the same program),
    # the cheapest and shallowest.
    found.sort(key=lambda f: (f.predicted_s, f.depth))
    works: set[tuple[str, ...]] = set()
    unique = []
    for f in found:
        if not f.trace or not f.work or f.work not in works:
            unique.append(f)
            works.add(f.work)
    stats |= {"searched": True, "whole": whole, "pieces": details}
    return dataclasses.replace(search, found=tuple(unique), stats=stats, seconds=round(seconds, 3))


def _costed(program: ir.Program, trace: tuple[Step, ...], constants: Mapping[str, np.ndarray]) -> Found:
    """``program`` as a found program, costed as the search costs its candidates."""
    from einopt.search.candidates import analytic, operators
    from einopt.stages.export import program_model, weight_names

    model, inst = program_model(program, dict(constants), light=True)
    seconds, work = analytic(model, weight_names(constants, inst))
    return Found(program, trace, operators(model), seconds, work=work)


_NAME = re.compile(r"\b[xy]\d+")


def _relabel(text: str, labels: Mapping[str, str]) -> str:
    """``text`` (a step of a binding's own search) with the canonical names of that search (``x0``,
    ``y0`` and the names derived from them, ``y0s1``) in the part's canonical names."""
    return _NAME.sub(lambda m: labels.get(m.group(0), m.group(0)), text)


def _first_share(searches: int, deadline: float | None, part_budget_s: float) -> float:
    """Seconds each search gets in the first pass: an equal share of half the time left (at least
    :data:`MIN_SHARE`, at most its own budget)."""
    if deadline is None or searches == 0:
        return part_budget_s
    left = deadline - time.monotonic()
    return min(part_budget_s, max(MIN_SHARE, 0.5 * left / searches))


MIN_SHARE = 2.0
"""Seconds a subprogram's search gets at least in the first pass."""


def _finished_search(value: dict, settings: Settings) -> bool:
    return bool(value["stats"]["complete"]) or value["budget_s"] >= settings.part_budget_s


def _input_estimate(value: dict) -> float:
    return next((f["predicted_s"] for f in value["found"] if not f["trace"]), 0.0)


def _key(text: str, settings: Settings, facts: list) -> str:
    return hashlib.sha256(json.dumps([text, settings.key(), facts]).encode()).hexdigest()


def _finished(event: str, part: str, index: int, total: int, value: dict | None) -> Progress:
    if value is None:
        return Progress(event, part, index, total)
    found = value["found"]
    base = next((f["predicted_s"] for f in found if not f["trace"]), None)
    best = min((f["predicted_s"] for f in found), default=None)
    speedup = base / best if base and best else None
    return Progress(event, part, index, total, value["stats"]["generated"], value["seconds"], speedup)


def _run(
    todo: Sequence[_Task],
    budget: float,
    settings: Settings,
    jobs: int,
    deadline: float | None,
    owner: Mapping[str, str],
    progress: Callable[[Progress], None] | None,
    order: Mapping[str, int],
    event: str,
    ray_address: str | None,
):
    """(task key, stored value) per search run (``budget`` seconds each, at most), in the order of
    ``todo``; ``event`` is what progress calls a finished one."""
    total = len(order)

    def report(task: _Task, event: str, value: dict | None) -> None:
        if progress is not None:
            progress(_finished(event, owner[task.key], order[task.key], total, value))

    if ray_address is None and (jobs <= 1 or len(todo) < 2):
        for task in todo:
            if deadline is not None and time.monotonic() >= deadline:
                log.info("search budget spent: %s keeps its input", owner[task.key])
                report(task, "skipped", None)
                continue
            hook = None
            if progress is not None:
                hook = _hook(progress, owner[task.key], order[task.key], total)
            value = _search_one(task, settings, _bounded(budget, deadline), hook)
            report(task, event, value)
            yield task.key, value
        return
    # In other processes (or on a Ray cluster) the whole-model deadline travels as wall-clock time.
    wall = None if deadline is None else time.time() + (deadline - time.monotonic())
    with _workers(jobs, ray_address) as submit:
        results = [submit(_search_until, task, settings, budget, wall) for task in todo]
        for task, result in zip(todo, results, strict=True):
            value = result()
            if value is None:
                report(task, "skipped", None)
                continue
            report(task, event, value)
            yield task.key, value


@contextlib.contextmanager
def _workers(jobs: int, ray_address: str | None):
    """``submit(fn, *args) -> result()``: on a Ray cluster when an address is given, else in ``jobs``
    local processes. Leaving early (an error, Ctrl-C) cancels what has not started."""
    if ray_address is not None:
        ray = _ray(ray_address)
        remote = ray.remote(_search_until)
        refs: list = []

        def submit_ray(fn, *args):
            ref = remote.remote(*args)
            refs.append(ref)
            return lambda: ray.get(ref)

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
            return future.result

        try:
            yield submit_local
        except BaseException:
            for f in futures:
                f.cancel()
            raise


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


def _search_until(task: _Task, settings: Settings, budget: float, wall_deadline: float | None) -> dict | None:
    """:func:`_search_one` in a worker: the budget left at its start (None when none is)."""
    if wall_deadline is not None:
        left = wall_deadline - time.time()
        if left <= 0:
            return None
        budget = min(budget, left)
    return _search_one(task, settings, budget)


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


def _search_one(task: _Task, settings: Settings, budget: float, hook=None) -> dict:
    """Search one canonical program; the stored form of what it found (programs as text)."""
    from einopt.core.parser import parse
    from einopt.rules import Context
    from einopt.search import search
    from einopt.stages.export import as_program

    program = as_program(parse(task.text))
    if hook is not None:
        hook.base.append(_input_cost(program, task.constants))
    t0 = time.perf_counter()
    result = search(
        program,
        ctx=Context(dict(task.constants)),
        max_depth=settings.max_depth,
        converge_depth=settings.converge_depth,
        time_budget=budget,
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
        },
        "seconds": round(time.perf_counter() - t0, 3),
        "budget_s": budget,
    }


def _bounded(budget: float, deadline: float | None) -> float:
    """``budget`` seconds, or what is left before ``deadline`` if that is less (at least 0.1)."""
    return budget if deadline is None else max(0.1, min(budget, deadline - time.monotonic()))


def _input_cost(program: ir.Program, constants: Mapping[str, np.ndarray]) -> float:
    """The analytic estimate the search gives its input (what progress compares the best with)."""
    from einopt.core.cost import estimate_seconds, model_cost
    from einopt.stages.export import program_model

    try:
        model, _ = program_model(program, constants, light=True)
    except ValueError:
        return 0.0
    return estimate_seconds(model_cost(model))


def _part_search(value: dict | None, names: Mapping[str, str], cached: bool, same_as: str) -> PartSearch:
    """A stored search renamed into a part's names (``value`` None: not searched)."""
    if value is None:
        return PartSearch.not_searched(same_as)
    from einopt.core.parser import parse
    from einopt.stages.export import as_program

    found = []
    for f in value["found"]:
        try:
            program = rename_tensors(as_program(parse(f["program"])), names)
        except (ir.IRError, ValueError) as e:  # a found name that clashes with the part's: skip it
            log.info("a stored candidate does not rename back: %s", e)
            continue
        steps = tuple(Step(*s) for s in f["trace"])
        found.append(
            Found(program, steps, tuple(f["operators"]), float(f["predicted_s"]), work=tuple(f["work"]))
        )
    return PartSearch(tuple(found), dict(value["stats"]), float(value["seconds"]), cached, same_as)
