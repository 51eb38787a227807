"""The search (method.md section 5): explorative derivation, converging derivation, fingerprints.

One :func:`search` call turns a program into ranked :class:`Candidate` programs:

1. **Explore**: breadth first from the input, every match the schedule's
   ``explore`` uses admit, up to ``max_depth`` steps. Every new program is
   brought to its normal form (:mod:`einopt.search.normal`) and pruned when
   its key (:func:`einopt.core.keys.key`) was seen before, or when its analytic
   estimate is hopeless against the best candidate found (``cost_slack``
   times more).
2. **Converge**: from every unique explored state, steps of the ``converge``
   uses that lower the program's expression distance
   (:mod:`einopt.search.distance`), best first, up to ``converge_depth`` steps.
3. **Candidates**: every state whose compute scopes all match an operator
   (distance 0), and the input itself (:mod:`einopt.search.candidates`).
   What a search returns is in :mod:`einopt.search.results`.

Everything is deterministic: states are visited in the order rules, matches
and frontiers produce them, and ``jobs`` worker processes only expand slices
of a frontier whose results are merged back in frontier order. The work is
bounded by a :class:`~einopt.search.budget.Budget`: a search stops at exactly
its ``states_per_search``-th generated state, the same state in generation
order whatever ``jobs`` is and however loaded the machine; its wall-clock
``deadline_s`` is only a safety net (see :func:`search`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Iterator

from einopt.core import ir
from einopt.core.keys import key
from einopt.instantiate.program import as_program
from einopt.rules import NO_CONTEXT, REGISTRY, Context, Match, ScopeRule
from einopt.search import costprocess
from einopt.search.budget import DEFAULT_MAX_DEPTH, Budget, in_time
from einopt.search.candidates import Costing, contractions, program_flops
from einopt.search.distance import compute_scopes, matcher_context, nearest_memo, program_distance
from einopt.search.matching import matches
from einopt.search.normal import normalize
from einopt.search.results import Candidate, RuleStats, SearchError, SearchResult, Stats, TraceStep
from einopt.search.runner import Runner
from einopt.search.schedule import DEFAULT_SCHEDULE, Schedule, Use

__all__ = [
    "Budget",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_CONVERGE_DEPTH",
    "TraceStep",
    "Candidate",
    "RuleStats",
    "Stats",
    "SearchResult",
    "SearchError",
    "search",
    "program_flops",
]

log = logging.getLogger(__name__)

DEFAULT_CONVERGE_DEPTH = 6
"""Converging steps per explored state (each lowers the distance, so few are ever needed)."""
DEFAULT_MAX_CANDIDATES = 32
DEFAULT_COST_SLACK = 2.0
DEFAULT_BEAM = 256
CONVERGE_WIDTH = 8
"""Moves applied at each converging step (the ones estimated closest), and states that go on."""
DEADLINE_GRACE = 0.1
"""Past its deadline, a search still costs the states it reached for this share of its time."""


# --------------------------------------------------------------------------
# Matching, with per-scope caches
# --------------------------------------------------------------------------


@dataclasses.dataclass
class _Env:
    """What one search process shares across states: the rules' context, the schedule, memos."""

    ctx: Context
    schedule: Schedule
    constants: frozenset[str]
    hits: dict = dataclasses.field(default_factory=dict)  # (rule, scope[, facts]) -> [Hit]
    normal: dict = dataclasses.field(default_factory=dict)  # program -> normal form
    distances: dict = dataclasses.field(default_factory=dict)  # scope -> nearest distance
    keys: dict = dataclasses.field(default_factory=dict)  # program -> key
    deadline: float | None = None  # time.monotonic() when the safety net stops the search
    limit: int | None = None  # states the unit of work under way may generate (None: no limit)
    local: dict = dataclasses.field(default_factory=dict)  # scope -> distance of the scope alone
    drops: dict = dataclasses.field(default_factory=dict)  # (rule, scope, summary) -> distance drop
    contexts: dict = dataclasses.field(default_factory=dict)  # program or scope -> matcher context
    explore: tuple = ()  # the explorative uses (with the converging ones when converging is off)

    def key(self, program: ir.Program) -> str:
        """A state's key: the program's (its inputs and outputs) and which scopes are bound. The
        program's key alone is blind to the bindings (a scope is the same whether bound or nested),
        and what instantiates differently is a different state: a ``fuse_cone`` step that nests a
        GELU's five scopes into its last product (one BiasGelu) changes nothing else."""
        found = self.keys.get(program)
        if found is None:
            bound = sorted({key(s) for _, s in program.bindings})
            found = self.keys[program] = key(program) + ":" + _digest(bound)
        return found

    def matcher_context(self, root: ir.Program | ir.Scope):
        found = self.contexts.get(root)
        if found is None:
            found = self.contexts[root] = matcher_context(root, self.constants, self.ctx.constants)
        return found

    def distance(self, root: ir.Program | ir.Scope) -> int:
        """The distance of a program, or of a scope on its own (memoised per scope)."""
        return program_distance(root, self.matcher_context(root), self.distances)

    def open_scopes(self, program: ir.Program) -> frozenset[ir.Scope]:
        """The compute scopes of ``program`` no operator takes yet (where converging steps apply)."""
        mctx = self.matcher_context(program)
        return frozenset(
            s for s in compute_scopes(program, mctx) if nearest_memo(s, mctx, self.distances) > 0
        )


def _digest(parts: list[str]) -> str:
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()


def _admitted(
    use: Use, rule, program: ir.Program, env: _Env, stats: Stats, rs: RuleStats, only: frozenset | None = None
) -> Iterator[Match]:
    """The matches of ``use``'s rule it takes (its variants), less those its restriction refuses
    (counted as ``restricted``); each one taken counts in ``rs.matches``."""
    for m in matches(rule, program, env.ctx, env.hits, only):
        if not use.takes_variant(m):
            continue
        if not use.allows(program, m, env.ctx):
            stats.restricted += 1
            continue
        rs.matches += 1
        yield m


def _children(
    program: ir.Program,
    uses: tuple[Use, ...],
    env: _Env,
    stats: Stats,
    phase: str,
    skip: Callable[[Match], bool] | None = None,
    offered: list | None = None,
) -> Iterator[tuple[TraceStep, ir.Program]]:
    """Every program one admitted match of ``uses`` leads to, normalized, with its trace step.
    ``skip`` drops matches before they are applied; ``offered`` collects the signature of every
    admitted match."""
    for use in uses:
        rule = REGISTRY[use.rule]
        rs = stats.rule(f"{phase}:{use.rule}")
        t0 = time.perf_counter()
        rs.tries += 1
        for m in _admitted(use, rule, program, env, stats, rs):
            if offered is not None:
                offered.append(_signature(m))
            if skip is not None and skip(m):
                stats.commuted += 1
                continue
            new = _apply(rule, m, program, env, stats)
            if new is None:
                continue
            rs.seconds += time.perf_counter() - t0
            yield TraceStep(rule.name, m.where, m.summary, new, phase), new
            t0 = time.perf_counter()
        rs.seconds += time.perf_counter() - t0


# --------------------------------------------------------------------------
# Converging derivation
# --------------------------------------------------------------------------


def _local_distance(scope: ir.Scope, env: _Env) -> int:
    found = env.local.get(scope)
    if found is None:
        found = env.local[scope] = env.distance(scope)
    return found


def _drop(rule: ScopeRule, m: Match, env: _Env) -> int:
    """How much rewriting ``m``'s scope alone lowers its distance (0 when it does not; memoised)."""
    k = (rule.name, m.target, m.summary, id(m.params))
    hit = env.drops.get(k)
    if hit is not None and hit[0] is m.params:  # the params object is kept, so its id is not reused
        return hit[1]
    try:
        new = rule.rewrite(m.target, m.params, env.ctx)
    except (ValueError, ir.IRError):
        found = 0
    else:
        found = max(0, _local_distance(m.target, env) - _local_distance(new, env))
    env.drops[k] = (m.params, found)
    return found


class _Spent(Exception):
    """The unit of work under way may not generate another state: ``reason`` is ``"states"`` (its
    allowance is used up) or ``"deadline"`` (the safety net)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _check_clock(env: _Env) -> None:
    if not in_time(env.deadline):
        raise _Spent("deadline")


def _apply(rule, m: Match, program: ir.Program, env: _Env, stats: Stats) -> ir.Program | None:
    """``m`` applied and normalized: one generated state (``stats`` counts the unit's states).
    Raises :class:`_Spent` instead when the unit may not generate it."""
    if env.limit is not None and stats.generated >= env.limit:
        raise _Spent("states")
    _check_clock(env)
    try:
        new = normalize(rule.apply(program, m, env.ctx), env.ctx, env.schedule, env.normal, env.hits)
    except (ValueError, ir.IRError) as e:  # a match its apply refuses: a rule bug, never a result
        log.warning("%s at %s: apply failed: %s", rule.name, m.where, e)
        return None
    stats.generated += 1
    return new


def _moves(program: ir.Program, d: int, env: _Env, stats: Stats) -> list[tuple[int, object, Match]]:
    """The converging moves of ``program`` (distance ``d``): ``(estimated distance after, rule,
    match)`` for every admitted match at a scope no operator takes yet whose rewrite, of that scope
    alone, lowers its distance. Nothing is applied to the program yet."""
    only = env.open_scopes(program)
    out = []
    for use in env.schedule.converge:
        rule = REGISTRY[use.rule]
        rs = stats.rule(f"converge:{use.rule}")
        t0 = time.perf_counter()
        rs.tries += 1
        for m in _admitted(use, rule, program, env, stats, rs, only):
            if isinstance(rule, ScopeRule):
                drop = _drop(rule, m, env)
            else:  # no scope alone to judge by: apply it and measure
                new = _apply(rule, m, program, env, stats)
                drop = 0 if new is None else max(0, d - env.distance(new))
            if drop > 0:
                out.append((max(0, d - drop), rule, m))
            else:
                stats.unguided += 1
        rs.seconds += time.perf_counter() - t0
    return out


def _converge(
    program: ir.Program, trace: tuple[TraceStep, ...], env: _Env, limit: int, stats: Stats
) -> list[tuple[ir.Program, tuple[TraceStep, ...]]]:
    """States reached from ``program`` by steps that each lower the distance: every one that reaches
    distance 0 (all compute scopes are operators), else the closest one; at most ``limit`` steps.

    Each step first ranks the moves of the whole frontier by the distance their scope alone would
    have (cheap, memoised per scope); only the best ``CONVERGE_WIDTH`` of them (those estimated to
    reach 0 first) are applied to their programs and brought to the normal form. When the unit's
    states run out, what was reached by then is returned (``stats.stopped`` says why)."""
    start_d = env.distance(program)
    if start_d == 0:
        return [(program, trace)]
    done: list[tuple[ir.Program, tuple[TraceStep, ...]]] = []
    closest = [(start_d, program, trace)]
    try:
        _converge_steps(env, limit, stats, done, closest)
    except _Spent as e:
        stats.stop(e.reason)
    if done:
        return done
    _, best, steps = closest[0]
    return [(best, steps)] if best is not program else []


def _converge_steps(env: _Env, limit: int, stats: Stats, done: list, closest: list) -> None:
    """The steps of :func:`_converge` from ``closest[0]`` (distance, program, trace): states at
    distance 0 go to ``done``, and ``closest[0]`` becomes the closest other one reached (both stay
    as they are when :class:`_Spent` stops it)."""
    seen: set[str] = {env.key(closest[0][1])}
    frontier = list(closest)
    for _ in range(limit):
        moves = []
        for i, (d, p, _tr) in enumerate(frontier):
            _check_clock(env)
            moves += [(est, i, j, rule, m) for j, (est, rule, m) in enumerate(_moves(p, d, env, stats))]
        moves.sort(key=lambda x: x[:3])
        nxt: list[tuple[int, ir.Program, tuple[TraceStep, ...]]] = []
        for n, (_est, i, _j, rule, m) in enumerate(moves):
            if n >= CONVERGE_WIDTH:
                stats.unguided += len(moves) - n  # ranked out: never built
                break
            d, p, tr = frontier[i]
            t0 = time.perf_counter()
            new = _apply(rule, m, p, env, stats)
            stats.rule(f"converge:{rule.name}").seconds += time.perf_counter() - t0
            if new is None:
                continue
            k = env.key(new)
            if k in seen:
                stats.pruned_fingerprint += 1
                continue
            seen.add(k)
            nd = env.distance(new)
            if nd >= d:
                continue
            step = TraceStep(rule.name, m.where, m.summary, new, "converge")
            stats.converge_steps += 1
            stats.rule(f"converge:{rule.name}").new_states += 1
            if nd == 0:
                done.append((new, (*tr, step)))
            else:
                nxt.append((nd, new, (*tr, step)))
                if nd < closest[0][0]:
                    closest[0] = (nd, new, (*tr, step))
        if not nxt:
            break
        nxt.sort(key=lambda x: x[0])
        frontier = nxt[:CONVERGE_WIDTH]


# --------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _State:
    program: ir.Program
    trace: tuple[TraceStep, ...]
    converged: bool = False  # reached by converging: only the schedule's after_converge uses go on
    prior: frozenset = frozenset()  # signatures of the matches the parent state offered


def _signature(m: Match) -> tuple[str, str, str]:
    return (m.rule, m.where, m.summary)


def _binding(where: str) -> str:
    return where.split(".")[0]


def _commuted(st: _State) -> Callable[[Match], bool] | None:
    """Partial-order reduction: a match the parent already offered, at another binding than the
    step that led here and ordered before it, leads to a state reached the other way round (that
    match first, then this step), so it is not taken again here."""
    if not st.trace or not st.prior:
        return None
    last = st.trace[-1]

    def skip(m: Match) -> bool:
        return (
            _binding(m.where) != _binding(last.where)
            and (m.rule, m.where) < (last.rule, last.where)
            and _signature(m) in st.prior
        )

    return skip


def _expand(st: _State, env: _Env, stats: Stats) -> tuple[list, frozenset]:
    """A state's explored children (step, program, key), and the signatures of the matches it offered
    (the children generated before the budget stopped it, if it did)."""
    uses = env.schedule.after_converge if st.converged else env.explore
    offered: list = []
    children = []
    try:
        _check_clock(env)
        stats.expanded += 1
        for step, new in _children(st.program, uses, env, stats, "explore", _commuted(st), offered):
            children.append((step, new, env.key(new)))
    except _Spent as e:
        stats.stop(e.reason)
    return children, frozenset(offered)


def _converged(st: _State, env: _Env, stats: Stats, depth: int) -> list:
    """A state's converged states (program, trace, key), at most ``depth`` converging steps."""
    return [(p, tr, env.key(p)) for p, tr in _converge(st.program, st.trace, env, depth, stats)]


def search(
    program: ir.Program | ir.Scope,
    *,
    budget: Budget | None = None,
    states: int | None = None,
    until: float | None = None,
    max_depth: int | None = None,
    time_budget: float | None = None,
    converge_depth: int = DEFAULT_CONVERGE_DEPTH,
    jobs: int = 1,
    cost: Callable[[ir.Program, object, object], float] | None = None,
    ctx: Context | None = None,
    schedule: Schedule = DEFAULT_SCHEDULE,
    max_candidates: int = DEFAULT_MAX_CANDIDATES,
    cost_slack: float = DEFAULT_COST_SLACK,
    beam: int | None = DEFAULT_BEAM,
    progress: Callable[[Stats, int, Candidate | None], None] | None = None,
) -> SearchResult:
    """Search for programs equal to ``program`` that instantiate to faster operators.

    Parameters
    ----------
    program : ir.Program or ir.Scope
        What to optimise (a scope is the program ``Y = scope``).
    budget : Budget, optional
        Explorative depth, states this search may generate
        (``budget.states_per_search``) and a wall-clock safety net
        (``budget.deadline_s``); ``states_per_model`` is not used here.
        Default: ``Budget()``, depth 7 and no other limit. The search stops
        at exactly its last allowed generated state, the same one whatever
        ``jobs`` is or the machine's load; the candidates found by then are
        returned (``stats.complete`` False, ``stats.stopped == "states"``).
        When the deadline stops it instead, ``stats.stopped == "deadline"``
        (what it found then depends on the machine).
    states : int, optional
        This search's share of a larger budget: it generates at most this
        many states (and at most ``budget.states_per_search``).
    until : float, optional
        ``time.time()`` at which a caller's whole deadline runs out (a
        search among several that share one): the search stops then, if its
        own ``budget.deadline_s`` has not stopped it first.
    max_depth, time_budget : optional
        Shorthands, without ``budget``, for ``Budget(max_depth=max_depth,
        deadline_s=time_budget)``.
    converge_depth : int
        Converging steps per explored state; 0 turns converging derivation off.
    jobs : int
        Worker processes that expand slices of each frontier. The candidates
        and their order do not depend on it.
    cost : callable, optional
        ``cost(program, model, instantiated) -> seconds`` of a candidate (the
        next stage passes measured costs); default: the analytic estimate from
        FLOPs and bytes of its ONNX instantiation.
    ctx : Context, optional
        Constant tensors (weights) for constant-aware rules; constants are
        folded at instantiation.
    schedule : Schedule
        Which rules run in which phase (:data:`~einopt.search.schedule.DEFAULT_SCHEDULE`).
    max_candidates : int
        Length of the ranked list (one candidate per distinct operator list).
    cost_slack : float
        States with more than ``cost_slack`` times the FLOPs of the best
        candidate, or ``4 * cost_slack`` times its analytic estimate (FLOPs
        and bytes of the program as written), are pruned and not instantiated.
    beam : int, optional
        At most this many new states go on from each depth: those with the
        fewest contractions, then the fewest FLOPs (None: all of them).
    progress : callable, optional
        Called as ``progress(stats, depth, best)`` after each frontier step.

    Returns
    -------
    SearchResult
    """
    t_start = time.perf_counter()
    if isinstance(program, ir.Scope):
        program = as_program(program)
    if not isinstance(program, ir.Program):
        raise SearchError(f"search takes a program or a scope, not {type(program).__name__}")
    budget = _budget(budget, max_depth, time_budget)
    if beam is not None and (not isinstance(beam, int) or isinstance(beam, bool) or beam < 1):
        raise SearchError(f"beam must be a positive integer or None, got {beam!r}")
    for name, value in (("converge_depth", converge_depth), ("jobs", jobs)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SearchError(f"{name} must be a non-negative integer, got {value!r}")
    if jobs < 1:
        raise SearchError(f"jobs must be at least 1, got {jobs}")
    if states is not None and (not isinstance(states, int) or isinstance(states, bool) or states < 1):
        raise SearchError(f"states must be a positive integer, got {states!r}")
    cap = min((n for n in (budget.states_per_search, states) if n is not None), default=None)
    deadline = _deadline(budget.deadline_s, until)
    ctx = dataclasses.replace(ctx or NO_CONTEXT, reasons=False)
    constants = frozenset(n for n in ctx.constants if n in {t.name for t in program.inputs})
    # Without converging derivation, its rules join the blind exploration (how much deeper it must go
    # is what converging saves).
    explore = schedule.explore + (schedule.converge if converge_depth == 0 else ())
    env = _Env(ctx, schedule, constants, deadline=deadline, explore=explore)
    converge = functools.partial(_converged, depth=converge_depth)
    stats = Stats()
    beside = jobs == 1 and costprocess.wanted()
    costing = Costing(env, cost, dict(ctx.constants), stats, cost_slack, started=t_start, beside=beside)

    def left() -> int | None:
        return None if cap is None else cap - stats.generated

    costing.add(program, (), is_input=True)
    start = normalize(program, ctx, schedule, env.normal, env.hits)
    seen = {env.key(program), env.key(start)}
    runner = Runner(env, jobs, _Env(ctx, schedule, constants, deadline=deadline, explore=explore))
    try:
        frontier = [_State(start, ())]
        pending = [_State(start, ())]  # explored states not yet converged
        stats.per_depth.append({"depth": 0, "states": 1, "generated": 0})
        for depth in range(1, budget.max_depth + 1):
            if not in_time(deadline):
                stats.stop("deadline")
                break
            # Converged states are states too: inter-expression rules can still merge what
            # converging turned into operators (two matmuls split off two convolutions).
            converged = runner.run(converge, pending, stats, left())
            for found in converged:
                for p, tr, k in found:
                    costing.add(p, tr, k)
                    if k not in seen and tr:
                        seen.add(k)
                        frontier.append(_State(p, tr, converged=True))
            pending = pending[len(converged) :]
            if stats.stopped:
                break
            before = stats.generated
            children = runner.run(_expand, frontier, stats, left())
            nxt = []
            # The children stop where the budget did.
            for st, (kids, offered) in zip(frontier[: len(children)], children, strict=True):
                for step, new, k in kids:
                    rs = stats.rule(f"explore:{step.rule}")
                    if k in seen:
                        stats.pruned_fingerprint += 1
                        continue
                    seen.add(k)
                    if costing.hopeless(new):
                        stats.pruned_cost += 1
                        continue
                    rs.new_states += 1
                    state = _State(new, (*st.trace, step), st.converged, offered)
                    nxt.append(state)
            if beam is not None and len(nxt) > beam:
                # A beam: the most promising states go on (fewest contractions, then fewest FLOPs).
                nxt.sort(
                    key=lambda st: (
                        contractions(st.program),
                        program_flops(st.program, env.constants),
                        env.key(st.program),
                    )
                )
                stats.pruned_beam += len(nxt) - beam
                # Past the beam a state is not expanded or converged, but it is still a candidate
                # when every compute scope is already an operator. (Thousands of them, each
                # instantiated, took GPT-2 bs16's search 230 s past a 150 s deadline: the clock is
                # read here too.)
                for st in nxt[beam:]:
                    if not in_time(deadline):
                        stats.stop("deadline")
                        break
                    costing.add(st.program, st.trace, env.key(st.program))
                nxt = nxt[:beam]
            stats.per_depth.append(
                {"depth": depth, "states": len(nxt), "generated": stats.generated - before}
            )
            if progress is not None:
                progress(stats, depth, costing.best())
            frontier = pending = nxt
            if stats.stopped or not frontier:
                break
        if pending and not stats.stopped:
            if in_time(deadline):
                converged = runner.run(converge, pending, stats, left())
                pending = pending[len(converged) :]
                for found in converged:
                    for p, tr, k in found:
                        costing.add(p, tr, k)
            else:
                stats.stop("deadline")
        if stats.stopped:
            # Cut short: the states left unconverged whose compute scopes are all operators already
            # are candidates all the same (converging them would generate nothing). Past the
            # deadline, only for a grace of a tenth of the search's time: a frontier of thousands
            # of states, each instantiated, took GPT-2 bs16's search 245 s past a 150 s deadline.
            grace = None if deadline is None else deadline + DEADLINE_GRACE * (time.perf_counter() - t_start)
            for st in pending:
                if stats.stopped == "deadline" and not in_time(grace):
                    break
                if env.distance(st.program) == 0:
                    costing.add(st.program, st.trace, env.key(st.program))
        ranked = costing.ranked(max_candidates)
    finally:
        runner.close()
        costing.close()
    stats.seconds = time.perf_counter() - t_start
    return SearchResult(ranked, stats)


def _budget(budget: Budget | None, max_depth: int | None, time_budget: float | None) -> Budget:
    """The budget of a search: ``budget``, or the one its shorthands stand for."""
    if budget is not None:
        if max_depth is not None or time_budget is not None:
            raise SearchError("pass max_depth and the deadline inside the budget, not beside it")
        if not isinstance(budget, Budget):
            raise SearchError(f"budget must be an einopt.search.Budget, not {type(budget).__name__}")
        return budget
    if time_budget is not None and not (
        isinstance(time_budget, int | float) and not isinstance(time_budget, bool) and time_budget > 0
    ):
        raise SearchError(f"time_budget must be positive seconds, got {time_budget!r}")
    return Budget(
        max_depth=DEFAULT_MAX_DEPTH if max_depth is None else max_depth,
        deadline_s=None if time_budget is None else float(time_budget),
    )


def _deadline(deadline_s: float | None, until: float | None) -> float | None:
    """The ``time.monotonic()`` at which the safety net stops the search (None: never)."""
    now = time.monotonic()
    ends = [now + deadline_s] if deadline_s is not None else []
    if until is not None:
        ends.append(now + (until - time.time()))
    return min(ends, default=None)
