"""Measured acceptance: a rewrite reaches the output only when it is measured faster.

Equal is not enough: a rewritten subprogram replaces its original nodes only
when it differs from them and is measured faster than them, on the values
that really reach it, beyond the noise band (:func:`judge_parts`). The
assembled model is then timed against the input side by side
(:func:`accept_model`), and it is kept only when it is faster beyond the
whole-model band with 95% confidence: the interval of the per-round ratios
of interleaved runs lies above ``1 + band``. While it is not, the accepted
rewrites are rolled back, a kind at a time (rewrites with the same original
and new operators, such as a network's channel shuffles, go together),
smallest measured gain first, half of the kinds at a time while many
remain. A round whose input ran slower or faster than in the timing before
it by more than the band (the machine changed under the measurement) is
retaken, not compared, until two timings in a row agree (when the input keeps moving, the least
of the timings is judged: the gain must hold at every speed the machine ran at). The model that survives is timed against the input
once more in each of three fresh Python processes (:mod:`einopt.runtime.fresh`: a
reading moves from one process to the next by more than the band, and more
runs in one process cannot see that); unless every one of them confirms the
gain, the output is the input. Local timings cannot
see layout interactions inside ONNX Runtime (a Reshape between two
convolutions breaks its blocked NCHWc chain): the whole-model measurement
decides.

Every timing goes through the context's :class:`~einopt.stages.timer.Timer`, which consults the
measurement cache first; tests pass a timer of their own.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import onnx

from einopt.opsets import DEFAULT_DOMAINS
from einopt.runtime.fresh import least
from einopt.runtime.timing import NOISE_BAND, Comparison, configure_threads
from einopt.stages.context import StageContext
from einopt.stages.state import PartState, Verdict
from einopt.stages.timer import Timer
from einopt.stages.verify import PartPair

if TYPE_CHECKING:
    from einopt.frontend.translate import Part
    from einopt.instantiate.emit import Instantiated

log = logging.getLogger(__name__)

BISECT_FROM = 8
"""With more kinds of accepted rewrites than this, a slow whole model rolls back half of them at a time."""

MAX_RETAKES = 2
"""Whole-model timings retaken while the input's own time has drifted from the first round's."""


ROUND_STAGES = ("round", "retake", "confirm", "shape")
"""A whole-model timing compared (``round``), not compared because the input's own time drifted
(``retake``), one fresh process's reading of the surviving model in the final check (``confirm``),
or the confirmed model at another shape of its symbolic dimensions (``shape``, ``--time-shapes``)."""


@dataclasses.dataclass(frozen=True)
class ModelRound:
    """One whole-model timing: which rewrites were in the model, which it rolled back, and why."""

    kept: tuple[str, ...]
    timing: Comparison
    rolled_back: tuple[str, ...]
    stage: str = "round"  # one of ROUND_STAGES
    reason: str = ""

    def as_dict(self) -> dict:
        return {
            "kept": list(self.kept),
            "rolled_back": list(self.rolled_back),
            "stage": self.stage,
            "reason": self.reason,
        } | self.timing.as_dict()


def judge_parts(
    pairs: Iterable[PartPair | tuple[str, Comparison]], timer: Timer, band: float = NOISE_BAND
) -> dict[str, Verdict]:
    """Time each part pair (or take a ``(name, timing)`` already made); a rewrite is accepted when it
    is faster than the original beyond ``band``."""
    verdicts: dict[str, Verdict] = {}
    for pair in pairs:
        name, t = pair if isinstance(pair, tuple) else (pair.name, timer.part(pair))
        # A disturbed timing is trusted only when even its spread cannot close the gap.
        ok = t.faster(band) and (not t.unreliable() or t.separated(band))
        if ok and t.unreliable():
            reason = (
                f"measured {t.speedup:.2f}x faster on its own (a disturbed timing, {t.unreliable()}, "
                "but its median's 95% interval lies beyond the original's)"
            )
        elif ok:
            reason = f"measured {t.speedup:.2f}x faster on its own"
        elif t.unreliable():
            reason = (
                f"not accepted: its timing was disturbed by other work ({t.speedup:.2f}x; {t.unreliable()})"
            )
        else:
            reason = f"not faster than the original nodes ({t.speedup:.2f}x; needs >= {1 + band:.2f}x)"
        verdicts[name] = Verdict(name, ok, t, reason)
        log.info("%s: %s", name, reason)
    return verdicts


def accept_model(
    ctx: StageContext,
    build: Callable[[frozenset[str]], onnx.ModelProto],
    gains: Mapping[str, float],
    kinds: Mapping[str, str] | None = None,
) -> tuple[frozenset[str], list[ModelRound]]:
    """Roll back accepted rewrites until the assembled model is faster than the input, for sure.

    A model is kept when :meth:`Comparison.confirms` the whole-model band
    (``ctx.model_noise``: its 95% speedup interval lies above ``1 + band``);
    then it is timed once more in fresh processes (:meth:`Timer.confirm`),
    and kept only when every one of them confirms it too (when one does not,
    nothing is kept), then timed at each other shape of ``ctx.timings``
    (``--time-shapes``): slower than the input beyond the band at one of them,
    the kind of least gain is rolled back and the rest timed again from the
    start. Otherwise a kind of rewrites is rolled back (all of it
    at once; the kind whose smallest gain is smallest first; half of the
    kinds at a time while more than :data:`BISECT_FROM` remain) and the rest
    is timed again. A timing that stays disturbed after a second try (see
    :meth:`Timer.model`) and does not confirm a gain rolls back everything:
    what cannot be measured is not kept. A timing whose input ran more than
    the band away from the input of the timing before it is retaken
    (:data:`MAX_RETAKES` times), not compared, until two in a row agree; when
    the input keeps moving, the least of those timings (the lowest bound on
    the speedup) is the one judged.

    Parameters
    ----------
    ctx : StageContext
        The input model (``original``: what the output must be faster than), the inputs both models
        run on (``feeds``), how they are timed (``timer``) and the band (``model_noise``).
    build : callable
        The assembled model with exactly the given rewrites in it.
    gains : mapping
        Accepted rewrite -> its measured speedup on its own (rollback order).
    kinds : mapping, optional
        Rewrite -> its kind (rewrites of one kind are rolled back together);
        default: each rewrite a kind of its own.

    Returns
    -------
    (frozenset, list)
        The rewrites kept (empty: the output is the input), and every
        whole-model timing made (the last one, when anything is kept, the
        confirmation).
    """
    band = ctx.model_noise
    units = _units(gains, kinds or {})
    rounds: list[ModelRound] = []
    reference: list[float] = []  # the input's median in the first round compared
    while units:
        kept = tuple(sorted(n for u in units for n in u))
        model = build(frozenset(kept))
        t = _steady(ctx, model, kept, reference, rounds)
        if t.confirms(band):
            rounds.append(ModelRound(kept, t, (), "round", _verdict(t, band)))
            kept_now, rounds = _confirmed(ctx, model, kept, rounds)
            if not kept_now or not _slower_elsewhere(ctx, model, kept, units[0], rounds):
                return kept_now, rounds
            units = units[1:]  # slower at another shape: the kind of least gain goes, the rest is timed again
            continue
        if t.unreliable():  # what cannot be measured is not kept
            log.info("whole-model timing disturbed (%s): rolling back every rewrite", t.unreliable())
            drop = units
        else:
            drop = units[: len(units) // 2] if len(units) > BISECT_FROM else units[:1]
        dropped = tuple(sorted(n for u in drop for n in u))
        log.info("whole model %s: rolling back %s", _verdict(t, band), ", ".join(dropped))
        rounds.append(ModelRound(kept, t, dropped, "round", _verdict(t, band)))
        units = units[len(drop) :]
    return frozenset(), rounds


def _confirmed(
    ctx: StageContext, model: onnx.ModelProto, kept: tuple[str, ...], rounds: list[ModelRound]
) -> tuple[frozenset[str], list[ModelRound]]:
    """The model that survived the rounds, timed once more in fresh processes (:meth:`Timer.confirm`):
    kept when every reading confirms the gain, that is when the least of them does (each reading is a
    ``confirm`` round; the least one, when it fails, rolls back every rewrite)."""
    band = ctx.model_noise
    readings = ctx.timer.confirm(ctx.original, model, ctx.feeds)
    worst = least(readings)
    ok = worst.confirms(band)
    for k, c in enumerate(readings):
        where = f"fresh process {k + 1} of {len(readings)}" if len(readings) > 1 else "the fresh confirmation"
        if c is worst and not ok:
            why = f"{where} did not establish the gain ({_verdict(c, band)})"
            rounds.append(ModelRound(kept, c, kept, "confirm", why))
            log.info("whole model: %s: rolling back every rewrite", why)
        else:
            rounds.append(ModelRound(kept, c, (), "confirm", f"{where}: {_verdict(c, band)}"))
    return (frozenset(kept) if ok else frozenset()), rounds


def _slower_elsewhere(
    ctx: StageContext,
    model: onnx.ModelProto,
    kept: tuple[str, ...],
    unit: tuple[str, ...],
    rounds: list[ModelRound],
) -> bool:
    """Whether the confirmed ``model`` runs slower than the input beyond the band at one of the other
    shapes of ``ctx.timings`` (a ``shape`` round each, up to the first slower one, which rolls back
    ``unit``: the kind of rewrites of least gain)."""
    band = ctx.model_noise
    for timing in ctx.timings:
        t = ctx.timer.model(ctx.original, model, timing.feeds)
        slower = t.speedup * (1 + band) < 1
        why = f"at {timing.text()}: {t.speedup:.3f}x" + (
            f", slower beyond the {band:.0%} band" if slower else ""
        )
        rounds.append(ModelRound(kept, t, unit if slower else (), "shape", why))
        if slower:
            log.info("whole model: %s: rolling back %s", why, ", ".join(unit))
            return True
    return False


def _units(gains: Mapping[str, float], kinds: Mapping[str, str]) -> list[tuple[str, ...]]:
    """The accepted rewrites grouped by kind, in rollback order: the kind whose smallest gain is
    smallest first (ties by name); a rewrite without a kind is a kind of its own."""
    groups: dict[str, list[str]] = {}
    for n in gains:
        groups.setdefault(kinds.get(n, f"\0{n}"), []).append(n)
    units = [tuple(sorted(g)) for g in groups.values()]
    return sorted(units, key=lambda u: (min(gains[n] for n in u), u))


def _steady(
    ctx: StageContext,
    model: onnx.ModelProto,
    kept: tuple[str, ...],
    reference: list[float],
    rounds: list[ModelRound],
) -> Comparison:
    """``model`` timed against the input model, compared only once the input's median agrees within
    the band with the input's median of the timing before it (``reference``: the last one compared in
    this run; one from the cache was made on another run and says nothing about the machine now).

    A timing whose input drifted from the one before it is recorded as a retake and made again; the
    retake is compared when its input agrees with the drifted one (the machine has settled at another
    speed: an input 4% faster for good is no reason to distrust paired ratios). When the input still
    moves after :data:`MAX_RETAKES` retakes (a machine whose speed swings by 10-25% from one timing
    to the next, as a shared VM's can), the timing returned is the least of those made: the one with
    the lowest 95% bound on its speedup, so a gain is kept only when it held at every speed the
    machine ran at."""
    band, original, feeds = ctx.model_noise, ctx.original, ctx.feeds
    t = ctx.timer.model(original, model, feeds)
    if t.cached:
        return t
    previous = reference[-1] if reference else None
    made = [t]
    for attempt in range(MAX_RETAKES + 1):
        drift = t.before.median_ms / previous if previous else 1.0
        if abs(drift - 1.0) <= band:
            reference.append(t.before.median_ms)
            return t
        why = (
            f"the input ran {t.before.median_ms:.3g} ms against {previous:.3g} ms in the timing before "
            f"({drift:.2f}x, beyond the {band:.0%} band): the machine changed under the measurement"
        )
        if attempt == MAX_RETAKES:
            worst = least(made)
            why += f", and kept changing: judged on the least of its {len(made)} timings"
            log.info("whole model: %s", why)
            rounds.append(ModelRound(kept, t, (), "retake", why))
            reference.append(t.before.median_ms)
            return worst
        log.info("whole model: %s; timing it again", why)
        rounds.append(ModelRound(kept, t, (), "retake", why))
        previous = t.before.median_ms
        t = ctx.timer.model(original, model, feeds, fresh=True)
        made.append(t)
    return t  # not reached


def _verdict(t: Comparison, band: float) -> str:
    low, high = t.gain_interval
    return f"{t.speedup:.3f}x, 95% interval {low:.3f}-{high:.3f}x against > {1 + band:.2f}x"


def rewrite_kind(model: onnx.ModelProto, part: Part, inst: Instantiated) -> str:
    """What a rewrite does, whatever its position and shapes: its original op types -> its new ones,
    an eOperator by the op types of its body (a network's channel shuffles are one kind)."""
    bodies = {f.name: f for f in inst.functions}

    def op(n: onnx.NodeProto) -> str:
        if n.op_type in bodies and n.domain == bodies[n.op_type].domain:
            return "{" + " ".join(op(m) for m in bodies[n.op_type].node) + "}"
        return n.op_type if n.domain in DEFAULT_DOMAINS else f"{n.domain}.{n.op_type}"

    old = " ".join(model.graph.node[i].op_type for i in part.nodes)
    return f"{old} -> {' '.join(op(n) for n in inst.nodes)}"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What acceptance kept, what it measured, and what the report says about it."""

    kept: frozenset[str]
    verdicts: Mapping[str, Verdict]
    rounds: tuple[ModelRound, ...]
    notes: tuple[str, ...]
    report: Mapping[str, object]


def accept(ctx: StageContext, states: Mapping[str, PartState]) -> Decision:
    """Measured acceptance of the chosen rewrites (verified, and different from their original nodes).

    Each part's chosen candidate (``states``: a state whose selection chose one) is judged on its
    own, on the timing selection made of it against the original nodes (a candidate chosen without
    one is timed here), and the accepted ones together in the whole model
    (:func:`accept_model`). With ``ctx.accept == "verified"`` every chosen rewrite is kept, untimed;
    without ``ctx.timer`` or ``ctx.feeds`` none is.
    """
    chosen = {n: s.selection.chosen for n, s in states.items() if s.emitted is not None and not s.dropped}
    parts = {n: states[n].part for n in chosen}
    emitted = {n: c.instantiated for n, c in chosen.items()}
    report: dict[str, object] = {
        "mode": ctx.accept,
        "timed": False,
        "noise_band": ctx.noise,
        "model_band": ctx.model_noise,
    }
    if ctx.accept == "verified":
        note = "the output was not timed (--accept verified): it may be slower than the input"
        return Decision(frozenset(emitted), {}, (), (note,) if emitted else (), report)
    if not emitted:
        return Decision(frozenset(), {}, (), (), report | {"rounds": [], "cache": None})
    if not ctx.timed:
        note = "no inputs to time the rewrites on: every subprogram keeps its original nodes"
        return Decision(frozenset(), {}, (), (note,), report)
    configure_threads()
    made = {n: c.measured for n, c in chosen.items() if c.measured}
    pairs = ctx.part_pairs([parts[n] for n in emitted if n not in made], emitted)
    verdicts = judge_parts([*made.items(), *pairs], ctx.timer, ctx.noise)
    gains = {n: v.timing.speedup for n, v in verdicts.items() if v.accepted}

    def build(names: frozenset[str]) -> onnx.ModelProto:
        return ctx.output({parts[n].nodes: emitted[n] for n in names})

    kinds = {n: rewrite_kind(ctx.model, parts[n], emitted[n]) for n in gains}
    kept, rounds = accept_model(ctx, build, gains, kinds) if gains else (frozenset(), [])
    unreliable = [f"{n}: {v.timing.unreliable()}" for n, v in verdicts.items() if v.timing.unreliable()]
    unreliable += [f"whole model: {r.timing.unreliable()}" for r in rounds if r.timing.unreliable()]
    notes = (_disturbed_note(unreliable),) if unreliable else ()
    confirms = [r for r in rounds if r.stage == "confirm"]  # the least reading is the one that decided
    confirm = min(confirms, key=lambda r: r.timing.gain_interval[0]) if confirms else None
    elsewhere = next((r for r in rounds if r.stage == "shape" and r.rolled_back), None)
    if elsewhere is not None and not kept:
        notes += (f"the whole model was not kept: it ran slower {elsewhere.reason}; the output is the input",)
    elif elsewhere is not None:
        notes += (f"rewrites were rolled back where the model ran slower {elsewhere.reason}",)
    elif confirm is not None and not kept:
        notes += (f"the whole model was not kept: {confirm.reason}; the output is the input",)
    report |= {
        "timed": True,
        "confirmation": confirm.as_dict() if confirm is not None else None,
        "rounds": [r.as_dict() for r in rounds],
        "cache": ctx.timer.cache.describe(),
        "unreliable": unreliable,
    }
    return Decision(kept, verdicts, tuple(rounds), notes, report)


def _disturbed_note(unreliable: Sequence[str], shown: int = 3) -> str:
    """One line on the disturbed timings (the report's ``acceptance.unreliable`` lists them all)."""
    names = [u.split(":", 1)[0] for u in unreliable]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return (
        f"{len(names)} timings were disturbed by other work ({', '.join(names[:shown])}{more}; first: "
        f"{unreliable[0].split(': ', 1)[1]}): treat them with care, or measure again on a quiet machine"
    )
