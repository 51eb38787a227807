"""The pipeline's selection stage: which of a subprogram's candidates runs fastest, measured.

Per subprogram, some of the search's ranked candidates
(:class:`einopt.search.Candidate`) are tried, each trial a :class:`Trial`:
the input re-instantiated (preferring the original operators) and the best
``top_k`` derived programs whose predicted cost is within
:data:`PREDICTED_SLACK` of the input's (the analytic estimate is crude; the
measurement decides). Each is instantiated, verified on the values that
really reach the subprogram, and, in measured mode, timed against the
original nodes side by side (through the measurement cache). The trial
measured fastest is chosen; measured acceptance (:mod:`einopt.stages.accept`) then
decides whether it reaches the output at all. A candidate the search found
and the measurement rejected stays in the report with its timing: that is
how the report shows, e.g., a Conv3x3 as MatMul + OffsetReduce losing to
ONNX Runtime's own convolution.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence

import onnx

from einopt.frontend.translate import Part
from einopt.instantiate.backend import PORTABLE, Backend
from einopt.instantiate.emit import Instantiated, instantiate, original_ops
from einopt.opsets import KERNEL_DOMAIN, default_opset
from einopt.runtime.graphkey import content_key
from einopt.runtime.timing import NOISE_BAND, Comparison
from einopt.runtime.verify import Agreement, first_line
from einopt.search.results import Candidate
from einopt.stages.context import StageContext
from einopt.stages.partsearch import PartSearch
from einopt.stages.verify import verify_parts

__all__ = [
    "Trial",
    "Selection",
    "PREDICTED_SLACK",
    "DEFAULT_TOP_K",
    "BUDGET_S",
    "NOT_TIMED",
    "LEFT_OUT",
    "select",
    "try_trials",
    "choose",
]

log = logging.getLogger(__name__)

PREDICTED_SLACK = 2.0
"""A derived program is timed when its predicted cost is at most this many times the input's
(:data:`einopt.stages.predict.SLACK` costs nothing beyond that)."""
DEFAULT_TOP_K = 3
"""Derived programs timed per subprogram, at most (best predicted first)."""
SLOW_RUN = 4.0
"""A trial whose one verification run took this many times the original's (and over
:data:`SLOW_RUN_S`) is not timed: no noise hides a loss that large, and timing it would cost minutes."""
SLOW_RUN_S = 0.2
LEFT_OUT = "left out: "
"""How the reason of a trial that holds at the representative values of symbolic dimensions only
starts (:meth:`~einopt.stages.context.StageContext.shape_specific`)."""
NOT_TIMED = "not timed"
"""How the reason of a trial the selection had no time left for starts."""
BUDGET_S = 60.0
"""Seconds the stage may take for one model, verification included, before it stops timing: the
candidates predicted to save the most time go first, and those not timed by then are not chosen
(their parts keep the original)."""


@dataclasses.dataclass(frozen=True)
class Trial:
    """One candidate of a subprogram as selection tries it: instantiated, verified, timed, and why it
    was not chosen; the chosen one goes on to assembly."""

    part: str
    candidate: Candidate  # program, derivation trace, operators, predicted cost
    instantiated: Instantiated | None = None
    verified: Agreement | None = None
    measured: Comparison | None = None  # against the original nodes, side by side
    unchanged: bool = False  # instantiated as the original nodes again
    rejected: str = ""  # why it was not chosen ("" for the chosen one)
    backend: Backend = PORTABLE  # how its eOperators are written (einopt.backends)

    @property
    def label(self) -> str:
        return "input" if not self.candidate.trace else f"depth {self.candidate.depth}"

    def as_dict(self, input_predicted: float | None) -> dict:
        """The trial as the report's ``search.candidates`` entry (``input_predicted``: the cost of
        its part's input, for the predicted speedup)."""
        c, t = self.candidate, self.measured
        return {
            "depth": c.depth,
            "trace": [{"rule": s.rule, "where": s.where, "summary": s.summary} for s in c.trace],
            "operators": list(c.operators),
            "predicted_s": c.cost,
            "estimated_s": c.estimated_cost,
            "timed_share": c.timed_share,
            "predicted_speedup": _ratio(input_predicted, c.cost),
            "measured_speedup": t.speedup if t is not None else None,
            "verified": None if self.verified is None else self.verified.ok,
            "unchanged": self.unchanged,
            "rejected": self.rejected,
            "kernels": self.backend.name,
        }


@dataclasses.dataclass(frozen=True)
class Selection:
    """What selection made of one subprogram: the chosen trial and every one it made."""

    chosen: Trial | None
    tried: tuple[Trial, ...]
    search: PartSearch

    @property
    def predicted_speedup(self) -> float | None:
        base = self.search.input
        if self.chosen is None or base is None:
            return None
        return _ratio(base.cost, self.chosen.candidate.cost)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def select(
    ctx: StageContext,
    parts: Sequence[Part],
    searches: Mapping[str, PartSearch],
    *,
    top_k: int = DEFAULT_TOP_K,
    budget_s: float | None = None,
) -> dict[str, Selection]:
    """Instantiate, verify and (with the context's timer) time each part's candidates; choose the
    fastest.

    Parameters
    ----------
    ctx : StageContext
        The prepared model, verification and timing, the backend (its ``variants`` of the
        candidates are tried too, and a candidate with generated kernels also in the portable form:
        a kernel slower than the glue it replaces is not chosen) and the noise band (ties go to
        fewer nodes with a ``fewer_nodes`` backend: :func:`choose`).
    parts : sequence of Part
        The translated subprograms.
    searches : mapping
        Part name -> what its search found (a part without one has its input only).
    top_k : int
        Derived programs tried per part, at most.
    budget_s : float, optional
        Seconds the stage may take before it stops timing (default :data:`BUDGET_S`; the
        verification counts).

    Returns
    -------
    dict
        Part name -> its :class:`Selection`, for every translated part.
    """
    model, taken, backend = ctx.model, ctx.taken, ctx.backend
    budget_s = BUDGET_S if budget_s is None else budget_s
    deadline = time.monotonic() + budget_s
    opset = default_opset(model)
    pending: dict[str, list[Trial]] = {}
    for p in parts:
        tries = _worth_trying(p, searches.get(p.name), top_k)
        pending[p.name] = [_instantiated(ctx, p, c, opset, backend) for c in tries]
        pending[p.name] += _portable_forms(ctx, p, tries, pending[p.name], opset)
        pending[p.name] += [_instantiated(ctx, p, c, opset, backend) for c in backend.variants(tries)]
    by_name = {p.name: p for p in parts}
    alive = {
        (name, i): c
        for name, cs in pending.items()
        for i, c in enumerate(cs)
        if c.instantiated is not None and not c.unchanged
    }
    pseudo = {
        _pseudo(name, i): dataclasses.replace(by_name[name], name=_pseudo(name, i)) for name, i in alive
    }
    emitted = {_pseudo(name, i): c.instantiated for (name, i), c in alive.items()}
    timing = ctx.timed
    # Untimed, every trial is verified. Timed, trials go in rounds (every part's best predicted
    # one first, see _timing_order), each verified then timed, until the budget runs out: a slow
    # verification of runners-up (Longformer at batch 16) cannot leave every part's best untimed.
    rounds = _rounds(_timing_order(alive, pending)) if timing else [list(alive)]
    ran_out = f"{NOT_TIMED}: the selection's {budget_s:g} s ran out"
    for keys in rounds:
        if not keys:
            continue
        if timing and time.monotonic() > deadline:
            for name, i in keys:
                pending[name][i] = dataclasses.replace(pending[name][i], rejected=ran_out)
            continue
        ok = _verified(ctx, keys, pseudo, emitted, pending)
        if not timing or not ok:
            continue
        todo = [pseudo[_pseudo(name, i)] for name, i in ok]
        for pair in ctx.part_pairs(todo, {p.name: emitted[p.name] for p in todo}):
            name, i = _unpseudo(pair.name)
            if time.monotonic() > deadline:
                pending[name][i] = dataclasses.replace(pending[name][i], rejected=ran_out)
                continue
            t = ctx.timer.part(dataclasses.replace(pair, name=name))
            pending[name][i] = dataclasses.replace(pending[name][i], measured=t)
    out = {}
    for p in parts:
        if p.program is None:
            continue
        chosen, tried = choose(
            pending[p.name], timed=timing, fewer_nodes=backend.fewer_nodes, noise=ctx.noise
        )
        if chosen is not None:
            taken |= {f.name for f in chosen.instantiated.functions}
        out[p.name] = Selection(chosen, tuple(tried), searches.get(p.name) or PartSearch.not_searched())
    return out


def try_trials(ctx: StageContext, part: Part, trials: Sequence[Trial]) -> list[Trial]:
    """One part's ``trials``, each instantiated (unless it already is), verified, and (with a
    ``timer``) timed against the part's original nodes: :func:`select`'s steps for a part that
    is not among the ones it was given (a merged group, :mod:`einopt.backends.tvm.partmerge`); a trial is
    instantiated with its own backend."""
    model = ctx.model
    opset = default_opset(model)
    pending = {
        part.name: [
            t if t.instantiated is not None else _instantiated(ctx, part, t.candidate, opset, t.backend)
            for t in trials
        ]
    }
    keys = [
        (part.name, i)
        for i, t in enumerate(pending[part.name])
        if t.instantiated is not None and not t.rejected
    ]
    pseudo = {_pseudo(part.name, i): dataclasses.replace(part, name=_pseudo(part.name, i)) for _, i in keys}
    emitted = {_pseudo(n, i): pending[n][i].instantiated for n, i in keys}
    ok = _verified(ctx, keys, pseudo, emitted, pending)
    if ctx.timed and ok:
        todo = [pseudo[_pseudo(n, i)] for n, i in ok]
        for pair in ctx.part_pairs(todo, {p.name: emitted[p.name] for p in todo}):
            name, i = _unpseudo(pair.name)
            t = ctx.timer.part(dataclasses.replace(pair, name=name))
            pending[name][i] = dataclasses.replace(pending[name][i], measured=t)
    return pending[part.name]


def _verified(
    ctx: StageContext,
    keys: list[tuple[str, int]],
    pseudo: dict[str, Part],
    emitted: dict[str, Instantiated],
    pending: dict[str, list[Trial]],
) -> list[tuple[str, int]]:
    """Verify the trials ``keys`` on the values that reach their parts, and (where the output keeps
    symbolic dimensions) in the output at the other shapes the context checks (recorded in
    ``pending``; one that differs, or runs too slowly to time, is rejected, before any timing; one
    that holds at the representative shape only (:meth:`StageContext.shape_specific`) is kept
    there, behind a run-time shape test, where it can be (:meth:`StageContext.at_searched_shape`:
    ``emitted`` then holds that form), and left out where not); the keys that passed, in order."""
    parts = [pseudo[_pseudo(n, i)] for n, i in keys]
    # unverified: only what the probe tells of other shapes (StageContext._unchecked)
    checks = verify_parts(ctx.model, parts, emitted, ctx.datasets, ctx.tolerance) if ctx.datasets else {}
    ok = []
    for name, i in keys:
        check = checks.get(_pseudo(name, i))
        c = pending[name][i] if check is None else dataclasses.replace(pending[name][i], verified=check)
        slow = _slow(check.run_seconds) if check is not None else ""
        if check is not None and not check.ok:
            log.warning("%s (%s): candidate differs from the original: %s", name, c.label, check.message)
            c = dataclasses.replace(c, rejected=f"verification failed: {check.message}")
        elif slow:
            c = dataclasses.replace(c, rejected=slow)
        elif specific := ctx.shape_specific(pseudo[_pseudo(name, i)].nodes, c.instantiated):
            there = ctx.at_searched_shape(pseudo[_pseudo(name, i)], c.instantiated, specific, name + "/")
            if there is None:
                c = dataclasses.replace(c, rejected=LEFT_OUT + specific)
            else:  # kept at the representative shape only, the part's own nodes elsewhere
                c = dataclasses.replace(c, instantiated=there)
                emitted[_pseudo(name, i)] = there
                ok.append((name, i))
        else:
            ok.append((name, i))
        pending[name][i] = c
    return ok


def _rounds(order: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    """``order`` cut where a part comes again: each round holds at most one trial per part."""
    out: list[list[tuple[str, int]]] = []
    for key in order:
        if not out or any(name == key[0] for name, _ in out[-1]):
            out.append([])
        out[-1].append(key)
    return out


def _timing_order(
    alive: dict[tuple[str, int], Trial], pending: dict[str, list[Trial]]
) -> list[tuple[str, int]]:
    """Trials in the order they are timed: those predicted to save time before those predicted
    not to (the prediction is crude, so they are still timed when the budget allows); within each,
    every part's best predicted one first (the parts predicted to save the most first), then every
    part's second, and so on; so one part's runners-up cannot use up the budget before another
    part's best is timed."""
    saving = {key: _predicted_saving(pending[key[0]], c) for key, c in alive.items()}
    rank: dict[tuple[str, int], int] = {}
    for name in {name for name, _ in alive}:
        mine = sorted((key for key in alive if key[0] == name), key=lambda key: -saving[key])
        rank.update({key: r for r, key in enumerate(mine)})
    return sorted(alive, key=lambda key: (saving[key] <= 0, rank[key], -saving[key], key))


def _predicted_saving(trials: list[Trial], trial: Trial) -> float:
    """Seconds ``trial`` is predicted to save against its part's input (the first trial)."""
    base = trials[0].candidate.cost if trials else 0.0
    return (base or 0.0) - (trial.candidate.cost or 0.0)


def _slow(run_seconds: tuple[float, float] | None) -> str:
    """Why a trial is too slow to be worth timing ("" if it may be)."""
    if run_seconds is None:
        return ""
    before, after = run_seconds
    if after > SLOW_RUN_S and after > SLOW_RUN * before:
        return f"one run took {after:.2g} s against the original's {before:.2g} s: not timed"
    return ""


def _worth_trying(p: Part, search: PartSearch | None, top_k: int) -> list[Candidate]:
    """The input, then the best ``top_k`` derived programs predicted within the slack of it."""
    if p.program is None:
        return []
    base = search.input if search is not None else None
    if base is None:
        base = Candidate(p.program, (), (), 0.0)
    derived = [
        c
        for c in (search.candidates if search is not None else ())
        if c.trace and (not base.cost or c.cost <= PREDICTED_SLACK * base.cost)
    ]
    return [base, *derived[:top_k]]


def _portable_forms(
    ctx: StageContext, p: Part, candidates: list[Candidate], trials: list[Trial], opset: int
) -> list[Trial]:
    """The ``candidates`` again with their eOperators as standard ops (the portable backend), each
    only where its trial has generated kernels: so that the choice between "predefined operators +
    glue" and "a generated kernel" is measured, and a kernel slower than the glue it replaces is not
    chosen."""
    return [
        _instantiated(ctx, p, c, opset, PORTABLE)
        for c, t in zip(candidates, trials, strict=True)
        if t.instantiated is not None and t.instantiated.has_generated_kernels
    ]


def _instantiated(ctx: StageContext, p: Part, candidate: Candidate, opset: int, backend: Backend) -> Trial:
    """``candidate`` of ``p`` as a trial: instantiated (where the output keeps symbolic dimensions,
    with the sizes of those computed at run time where it can be, :mod:`einopt.stages.generalize`),
    or rejected with the reason."""
    model = ctx.model
    trial = Trial(p.name, candidate, backend=backend)
    try:
        inst = instantiate(
            candidate.program,
            onnx_names=p.names,
            constants=p.constants,
            opset=opset,
            prefix=p.name + "/",
            taken_function_names=ctx.taken,
            preferred=original_ops(model, p) if not candidate.trace else None,
            backend=backend,
        )
    except Exception as e:  # noqa: BLE001 - one bad candidate must not sink the part; the report says why
        log.warning("%s (%s): instantiation failed: %s", p.name, trial.label, first_line(e))
        return dataclasses.replace(trial, rejected=f"instantiation failed: {first_line(e)}")
    unchanged = not inst.functions and _same_nodes(model, p, inst, opset)
    if not unchanged:
        inst = ctx.for_any_shape(p, candidate, inst, opset, backend)
    if backend.generates_kernels:  # the search listed what its program runs as in the portable form
        trial = dataclasses.replace(
            trial, candidate=dataclasses.replace(candidate, operators=_operators(inst))
        )
    return dataclasses.replace(
        trial,
        instantiated=inst,
        unchanged=unchanged,
        rejected="re-instantiated as the same nodes" if unchanged else "",
    )


def _operators(inst: Instantiated) -> tuple[str, ...]:
    """What an instantiation runs as: ONNX op types, ``DOMAIN.NAME`` for other domains' operators,
    ``kernel:KIND`` for generated kernels (in the order their choices were made)."""
    kinds = iter(c.how for c in inst.choices if c.how.startswith("kernel:"))
    out = []
    for n in inst.nodes:
        if n.domain == KERNEL_DOMAIN:
            out.append(next(kinds, "kernel:?"))
        else:
            out.append(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}")
    return tuple(out)


def _same_nodes(model: onnx.ModelProto, p: Part, inst: Instantiated, opset: int) -> bool:
    nodes = list(model.graph.node)
    inits = {t.name: t for t in model.graph.initializer}
    return is_unchanged(
        [nodes[i] for i in p.nodes],
        inst.nodes,
        inits,
        inst.initializers,
        [p.names[o] for o in p.program.outputs],
        opset,
    )


def is_unchanged(
    nodes: Sequence[onnx.NodeProto],
    new_nodes: Sequence[onnx.NodeProto],
    constants: Mapping[str, onnx.TensorProto],
    new_constants: Sequence[onnx.TensorProto],
    outputs: Sequence[str],
    opset: int,
) -> bool:
    """Whether a re-instantiation is the original nodes again (same ops, wiring, attributes and data).

    Parameters
    ----------
    nodes : sequence
        The original nodes of the subprogram.
    new_nodes, new_constants : sequence
        Its instantiation and the initializers that came with it.
    constants : mapping
        The model's initializers by name (both node groups may read them).
    outputs : sequence
        The subprogram's output names (shared by both groups).
    opset : int
        The default-domain opset (attribute defaults depend on it).
    """
    if [n.op_type for n in nodes] != [n.op_type for n in new_nodes]:
        return False
    return content_key(nodes, constants, outputs, opset) == content_key(
        new_nodes, dict(constants) | {t.name: t for t in new_constants}, outputs, opset
    )


def choose(
    trials: list[Trial], timed: bool, fewer_nodes: bool = False, noise: float = NOISE_BAND
) -> tuple[Trial | None, list[Trial]]:
    """The fastest measured trial (untimed: the best predicted) among those verified and changed;
    the others marked with why they lost.

    With ``fewer_nodes`` (generated kernels, whose point is to remove kernels), the trial with the
    fewest nodes among those measured within ``1 + noise`` of the fastest (default :data:`NOISE_BAND`:
    ties on this machine) is chosen instead: InfoGAN's phases as four Convs and one kernel rather
    than four Convs, four Reshapes and one kernel, measured 2.70x against 2.77x. A trial that runs
    its rewrite at the searched shape only (:mod:`einopt.stages.specialize`) gives way to one that
    holds at every shape and is measured within ``1 + noise`` of it (untimed: to any that holds).
    """
    ok = [c for c in trials if c.instantiated is not None and not c.unchanged and not c.rejected]
    if timed:
        ok = [c for c in ok if c.measured is not None]
        best = max(ok, key=lambda c: (c.measured.speedup, -c.candidate.depth), default=None)
        if fewer_nodes and best is not None:
            ties = [c for c in ok if c.measured.speedup * (1 + noise) >= best.measured.speedup]
            best = min(ties, key=lambda c: (len(c.instantiated.nodes), -c.measured.speedup))
        if best is not None and best.instantiated.only_at is not None:
            everywhere = [c for c in ok if c.instantiated.only_at is None]
            general = max(everywhere, key=lambda c: c.measured.speedup, default=None)
            if general is not None and general.measured.speedup * (1 + noise) >= best.measured.speedup:
                best = general  # a tie at the searched shape: the rewrite that holds at every shape
    else:
        # untimed, the forms of one candidate cost the same: generated kernels go to fewer nodes
        best = min(
            ok,
            key=lambda c: (
                c.instantiated.only_at is not None,  # what holds at every shape first
                c.candidate.cost,
                len(c.instantiated.nodes) if fewer_nodes else 0,
                c.candidate.depth,
            ),
            default=None,
        )
    tried = []
    for c in trials:
        if c is best or c.rejected:
            tried.append(c)
        elif timed and c.measured is not None and c.measured.speedup > best.measured.speedup:
            if c.instantiated.only_at is not None and best.instantiated.only_at is None:
                why = (
                    f"measured {c.measured.speedup:.2f}x, a tie with the chosen within noise, at the "
                    f"searched shape only (the chosen holds at every shape)"
                )
                tried.append(dataclasses.replace(c, rejected=why))
                continue
            why = (
                f"measured {c.measured.speedup:.2f}x, a tie with the chosen within noise, with more nodes "
                f"({len(c.instantiated.nodes)} against {len(best.instantiated.nodes)})"
            )
            tried.append(dataclasses.replace(c, rejected=why))
        elif timed and c.measured is not None:
            tried.append(
                dataclasses.replace(c, rejected=f"measured {c.measured.speedup:.2f}x, slower than the chosen")
            )
        else:
            tried.append(dataclasses.replace(c, rejected="predicted slower than the chosen"))
    return best, tried


def _pseudo(name: str, i: int) -> str:
    return f"{name}#{i}"


def _unpseudo(name: str) -> tuple[str, int]:
    base, _, i = name.rpartition("#")
    return base, int(i)
