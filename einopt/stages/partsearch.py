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

The searches of a model share one :class:`~einopt.search.budget.Budget`:
``states_per_search`` generated states per search and ``states_per_model`` for
all of them, given out deterministically (see :func:`search_parts`), so the
same model, budget and cache give the same searches on any machine, loaded or
not. ``jobs`` processes search distinct subprograms side by side; the results
do not depend on it either (each search is one process's work, charged in
part order).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from einopt.core import ir
from einopt.core.parser import parse
from einopt.core.rewrite import binding_program, put_binding, rename_tensors
from einopt.instantiate.program import as_program, program_model, weight_names
from einopt.rules.derive import TraceStep
from einopt.runtime.cache import MeasurementCache
from einopt.search.budget import Budget
from einopt.search.modelcost import analytic, operators
from einopt.search.results import Candidate
from einopt.stages.searchruns import Allowance, Progress, RayUnavailable, Runs, Task, finished
from einopt.stages.searchsettings import DEFAULT_BUDGET, Settings

__all__ = [
    "DEFAULT_BUDGET",
    "Settings",
    "PartSearch",
    "Progress",
    "RayUnavailable",
    "canonical_names",
    "search_parts",
    "weight_facts",
]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PartSearch:
    """What one subprogram's search found: its candidates in the subprogram's own names (ranked by
    cost, the input among them; their traces without programs, as the search cache keeps them)."""

    candidates: tuple[Candidate, ...]
    stats: Mapping[str, object]  # generated, pruned, expanded, complete, ... (einopt.search.Stats)
    seconds: float  # of the search that produced it (0 when it came from the cache in this run)
    cached: bool  # read from the cache file
    same_as: str = ""  # the subprogram whose search this one shares ("" : its own)

    @property
    def input(self) -> Candidate | None:
        return next((c for c in self.candidates if not c.trace), None)

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


def canonical_names(program: ir.Program) -> dict[str, str]:
    """The names a part is searched in: inputs ``x0, x1, ...`` and bindings ``y0, y1, ...`` in order."""
    return {t.name: f"x{i}" for i, t in enumerate(program.inputs)} | {
        n: f"y{i}" for i, (n, _) in enumerate(program.bindings)
    }


def search_parts(
    parts: Sequence,
    settings: Settings,
    store: MeasurementCache,
    *,
    jobs: int = 1,
    progress: Callable[[Progress], None] | None = None,
    ray_address: str | None = None,
    reuse: bool = True,
) -> dict[str, PartSearch]:
    """Search every translated part (``einopt.frontend.translate.Part``), sharing identical ones.

    The model's states (``settings.budget.states_per_model``) are given out in
    two passes, in a fixed order. First every distinct search not in the
    cache gets an equal share of half of them (at least :data:`MIN_SHARE`, at
    most ``states_per_search``), so none is starved by the ones before it.
    Then the searches that share cut short go again with the whole
    ``states_per_search`` (expressions before whole subprograms, the costliest
    by the input's estimate first), as long as states are left. Each search is
    allowed, before it starts, what the searches before it in that order left
    (they are charged the states they generated), so the searches are the
    same with any ``jobs`` and on any machine. ``budget.deadline_s`` is a
    safety net: no search starts after it, and one it cuts short is not
    stored.

    Parameters
    ----------
    parts : sequence of Part
        The subprograms (parts without a program are skipped).
    settings : Settings
        The budget and other search settings (part of the cache key).
    store : MeasurementCache
        Where searches are looked up first and stored after.
    jobs : int
        Processes searching distinct subprograms side by side.
    progress : callable, optional
        Called with a :class:`Progress` as the searches go.
    ray_address : str, optional
        Run the searches as Ray tasks on the cluster at this address
        (``"auto"``, ``"ray://host:10001"``, ...) instead of local processes.
        The results do not depend on where they ran.
    reuse : bool
        Take the searches stored in ``store`` instead of running them again
        (what runs is stored either way). A stored search is parsed back into
        candidates that only verification checks, so a run that verifies
        nothing searches afresh rather than trust the cache file.

    Returns
    -------
    dict
        Part name -> its :class:`PartSearch`, for every translated part.
    """
    budget = settings.budget
    wall = None if budget.deadline_s is None else time.time() + budget.deadline_s
    tasks: dict[str, Task] = {}
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
        found = store.found(k) if reuse else None
        if found is None:
            todo.append(task)
            continue
        stored[k] = (found, True)
        if progress is not None:
            progress(finished("cached", owner[k], i, len(tasks), found))
    run = Runs(settings, jobs, wall, owner, progress, {k: i for i, k in enumerate(tasks)}, ray_address)
    model = Allowance(budget.states_per_model)
    share = _first_share(len(todo), budget)
    ran = dict(run(todo, {t.key: share for t in todo}, {}, model, "done"))
    again = [t for t in todo if t.key in ran and _cut_by_share(ran[t.key], budget)]
    # One expression's search goes deeper before a whole subprogram's: the latter explores the same
    # rewrites of each of its expressions, combined (what only it finds are the merges of expressions,
    # a few steps deep). Then the costliest (by the input's estimate) first.
    whole = {k for k, _ in of_part.values()} - {k for ps in pieces.values() for _, k, _ in ps}
    again.sort(key=lambda t: (t.key in whole, -_input_estimate(ran[t.key])))
    caps = {t.key: budget.states_per_search for t in again}
    floors = {t.key: ran[t.key]["allowance"] for t in again}
    for k, value in run(again, caps, floors, model, "deeper"):
        if value["stats"]["complete"] or value["stats"]["generated"] > ran[k]["stats"]["generated"]:
            ran[k] = value
    for k, value in ran.items():
        stored[k] = (value, False)
        # A search cut short by its share, or by the deadline, is not what the key promises.
        if _finished_search(value, budget):
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
    tasks: dict[str, Task],
    owner: dict[str, str],
    label: str,
) -> tuple[str, dict[str, str]]:
    """The key of the search of ``program`` (added to ``tasks`` when new) and its canonical names."""
    names = canonical_names(program)
    weights = [t.name for t in program.inputs if t.name in constants]
    text = str(rename_tensors(program, names))
    k = _key(text, settings, weight_facts(constants, weights, settings.exact))
    if k not in tasks:
        tasks[k] = Task(k, text, {names[n]: constants[n] for n in weights})
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
    found = list(search.candidates)
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
        for c in [c for c in piece.candidates if c.trace][:PIECE_CANDIDATES]:
            try:
                program = put_binding(part.program, binding, c.program)
                steps = tuple(
                    TraceStep(s.rule, _relabel(s.where, labels), _relabel(s.summary, labels)) for s in c.trace
                )
                found.append(_costed(program, steps, part.constants))
            except (ir.IRError, ValueError) as e:
                log.info("%s: %s's candidate does not fit back: %s", part.name, binding, e)
    if search.input is None and len(found) > len(search.candidates):
        # The whole part was not searched: its input is a candidate all the same.
        found.append(_costed(part.program, (), part.constants))
    # One candidate per work (the whole part's search and a binding's may find the same program),
    # the cheapest and shallowest.
    found.sort(key=lambda c: (c.cost, c.depth))
    works: set[tuple[str, ...]] = set()
    unique = []
    for c in found:
        if not c.trace or not c.work or c.work not in works:
            unique.append(c)
            works.add(c.work)
    stats |= {"searched": True, "whole": whole, "pieces": details}
    return dataclasses.replace(search, candidates=tuple(unique), stats=stats, seconds=round(seconds, 3))


def _costed(
    program: ir.Program, trace: tuple[TraceStep, ...], constants: Mapping[str, np.ndarray]
) -> Candidate:
    """``program`` as a candidate, costed as the search costs its candidates."""
    model, inst = program_model(program, dict(constants), light=True)
    seconds, work = analytic(model, weight_names(constants, inst))
    return Candidate(program, trace, operators(model), seconds, work=work)


_NAME = re.compile(r"\b[xy]\d+")


def _relabel(text: str, labels: Mapping[str, str]) -> str:
    """``text`` (a step of a binding's own search) with the canonical names of that search (``x0``,
    ``y0`` and the names derived from them, ``y0s1``) in the part's canonical names."""
    return _NAME.sub(lambda m: labels.get(m.group(0), m.group(0)), text)


MIN_SHARE = 500
"""States a search gets at least in the first pass, however many searches the model has (GCN's 91
share 50,000: most need far fewer, and each is charged only what it used)."""


def _first_share(searches: int, budget: Budget) -> int | None:
    """States each search gets in the first pass: an equal share of half the model's (at least
    :data:`MIN_SHARE`, at most ``states_per_search``; None: no limit)."""
    if budget.states_per_model is None or searches == 0:
        return budget.states_per_search
    share = max(MIN_SHARE, budget.states_per_model // (2 * searches))
    return share if budget.states_per_search is None else min(share, budget.states_per_search)


def _cut_by_share(value: dict, budget: Budget) -> bool:
    """Whether a search stopped at its allowance while ``states_per_search`` would have let it go on."""
    per_search = budget.states_per_search
    return value["stats"]["stopped"] == "states" and (per_search is None or value["allowance"] < per_search)


def _finished_search(value: dict, budget: Budget) -> bool:
    """Whether a search is what its key promises: complete, or cut by the whole ``states_per_search``."""
    stats = value["stats"]
    return bool(stats["complete"]) or (
        stats["stopped"] == "states" and value["allowance"] == budget.states_per_search
    )


def _input_estimate(value: dict) -> float:
    return next((f["predicted_s"] for f in value["found"] if not f["trace"]), 0.0)


def _key(text: str, settings: Settings, facts: list) -> str:
    return hashlib.sha256(json.dumps([text, settings.key(), facts]).encode()).hexdigest()


def _part_search(value: dict | None, names: Mapping[str, str], cached: bool, same_as: str) -> PartSearch:
    """A stored search renamed into a part's names (``value`` None: not searched)."""
    if value is None:
        return PartSearch.not_searched(same_as)

    found = []
    for f in value["found"]:
        try:
            program = rename_tensors(as_program(parse(f["program"])), names)
        except (ir.IRError, ValueError) as e:  # a found name that clashes with the part's: skip it
            log.info("a stored candidate does not rename back: %s", e)
            continue
        steps = tuple(TraceStep(*s) for s in f["trace"])
        found.append(
            Candidate(program, steps, tuple(f["operators"]), float(f["predicted_s"]), work=tuple(f["work"]))
        )
    return PartSearch(tuple(found), dict(value["stats"]), float(value["seconds"]), cached, same_as)
