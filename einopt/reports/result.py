"""What ``optimize`` returns: the output model and, per subprogram, what happened to it and why.

:class:`Result` is the Python API's answer (``result.save(path)``,
``result.report()`` in einopt's report format, :mod:`einopt.reports.report`);
:func:`part_result` shapes one subprogram's :class:`PartResult` from the
record the stages filled in (:class:`einopt.stages.state.PartState`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from einopt.core.syntax import format_expr
from einopt.frontend.translate import Part
from einopt.instantiate.emit import Instantiated
from einopt.opsets import DEFAULT_DOMAINS
from einopt.reports.report import CHANGED, REPORT_VERSION, STATUSES
from einopt.runtime import modelio
from einopt.runtime.timing import Comparison
from einopt.stages.accept import ModelRound
from einopt.stages.select import LEFT_OUT, NOT_TIMED, Selection
from einopt.stages.state import PartState

__all__ = ["PartResult", "Result", "Workspace", "part_result", "part_bench", "search_summary"]


@dataclasses.dataclass(frozen=True)
class PartResult:
    """What happened to one subprogram (or one passed-through node)."""

    name: str
    kind: str  # linear | activation | passthrough
    ops: tuple[str, ...]  # original op types
    status: str  # one of STATUSES
    reason: str = ""
    new_ops: tuple[str, ...] = ()
    expression: str = ""
    max_error: float | None = None
    trace: str = ""  # the derivation that produced the rewrite ("" when no rule was applied)
    bench: Mapping[str, object] | None = (
        None  # original_ms, optimized_ms, speedup (and its speedup_95), cached, unreliable
    )
    search: Mapping[str, object] | None = None  # its search's counts and the candidates tried
    only_at: str = ""  # its rewrite runs at these values of the symbolic dimensions only ("": at all)


@dataclasses.dataclass(frozen=True)
class Workspace:
    """What measuring the rewritten parts on their own needs (kept off the report)."""

    model: onnx.ModelProto  # the prepared model the parts were cut from
    parts: tuple[Part, ...]  # the parts whose rewrite is in the output
    emitted: Mapping[str, Instantiated]
    feeds: Mapping[str, np.ndarray] | None  # the first verification inputs (None: unverified)
    declared: Mapping[str, tuple] = dataclasses.field(default_factory=dict)  # StageContext.declared


@dataclasses.dataclass(frozen=True)
class Result:
    model: onnx.ModelProto
    parts: tuple[PartResult, ...]
    notes: tuple[str, ...]
    verified: bool
    seconds: Mapping[str, float]
    blocked: str = ""  # why the whole model passed through untouched, if it did
    acceptance: Mapping[str, object] = dataclasses.field(default_factory=dict)
    workspace: Workspace | None = dataclasses.field(default=None, repr=False, compare=False)
    # The shapes of inputs with symbolic dimensions as the model was searched and timed (their
    # representative values; pinned ones too): where a benchmark of the result runs by default.
    shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    # Where the output keeps symbolic dimensions: each one's searched value and declared range, and
    # the values the output was verified and timed at (the report's ``symbolic`` section).
    symbolic: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def save(self, path: str | Path, *, external_data: bool | None = None) -> None:
        modelio.save_model(self.model, path, external_data=external_data)

    def counts(self) -> dict[str, int]:
        """Op counts (nodes, translated, passed_through) and subprogram counts by status.

        ``subprograms`` counts the translated subprograms; ``rewritten`` those
        whose new nodes differ from the original and were verified (accepted,
        not faster, rolled back, or kept untimed); the status counts follow.
        """
        c = {"nodes": 0, "translated": 0, "passed_through": 0, "subprograms": 0, "rewritten": 0}
        c |= {s.replace(" ", "_"): 0 for s in STATUSES if s not in ("passed through", "rewritten")}
        for p in self.parts:
            c["nodes"] += len(p.ops)
            if p.kind == "passthrough":
                c["passed_through"] += len(p.ops)
                continue
            c["translated"] += len(p.ops)
            c["subprograms"] += 1
            if p.status in CHANGED:
                c["rewritten"] += 1
            if p.status != "rewritten":
                c[p.status.replace(" ", "_")] += 1
        return c

    def changed(self) -> bool:
        """Whether the output differs from the input model."""
        return any(p.status in ("accepted", "rewritten") for p in self.parts)

    def report(self) -> dict:
        """A JSON-serialisable summary (the report format of ``einopt.reports.report``; ``bench`` filled by the caller)."""
        return {
            "einopt_report": REPORT_VERSION,
            "model": "",
            "output": "",
            "verified": self.verified,
            "blocked": self.blocked,
            "counts": self.counts(),
            "notes": list(self.notes),
            "seconds": dict(self.seconds),
            "acceptance": dict(self.acceptance),
            "subprograms": [_part_dict(p) for p in self.parts],
            "search": search_summary(self.parts),
            "bench": None,
            "symbolic": self._symbolic(),
        }

    def _symbolic(self) -> dict | None:
        if not self.symbolic:
            return None
        left_out = [p.name for p in self.parts if p.status == "left out"]
        only = [p.name for p in self.parts if p.only_at and p.status in ("accepted", "rewritten")]
        return dict(self.symbolic) | {"left_out": left_out, "searched_shape_only": only}

    def with_part_timings(self, timings: Mapping[str, Mapping[str, float]]) -> Result:
        """A copy whose parts carry ``timings[name]`` (see :func:`einopt.reports.measure.measure_parts`)."""
        parts = tuple(dataclasses.replace(p, bench=timings.get(p.name, p.bench)) for p in self.parts)
        return dataclasses.replace(self, parts=parts)


def search_summary(parts: Sequence[PartResult]) -> dict[str, object]:
    """Totals of a model's searches, and how well predicted speedups ranked the measured ones.

    ``rank_correlation`` is Spearman's over every candidate that was timed
    (predicted against measured speedup); None with fewer than 3 of them.
    """
    own = [p.search for p in parts if p.search and not p.search["same_as"]]
    timed = [
        (c["predicted_speedup"], c["measured_speedup"])
        for p in parts
        if p.search
        for c in p.search["candidates"]
        if c["predicted_speedup"] is not None and c["measured_speedup"] is not None
    ]
    pieces = [q for s in own for q in s["stats"].get("pieces", ()) if "generated" in q and not q["same_as"]]
    return {
        "searched": sum(1 for s in own if s["stats"].get("searched", True)),
        "expressions": sum(1 for q in pieces if not q["cached"]),
        "cached": sum(1 for s in own if s["cached"]),
        "states": sum(int(s["stats"].get("generated", 0)) for s in own),
        "seconds": round(sum(float(s["seconds"]) for s in own), 3),
        "incomplete": sum(1 for s in own if s["stats"].get("searched", True) and not s["stats"]["complete"]),
        "timed_candidates": len(timed),
        "rank_correlation": _spearman(timed) if len(timed) >= 3 else None,
    }


def _spearman(pairs: Sequence[tuple[float, float]]) -> float | None:
    a, b = (_ranks([p[k] for p in pairs]) for k in (0, 1))
    if a.std() == 0 or b.std() == 0:
        return None
    return round(float(np.corrcoef(a, b)[0, 1]), 3)


def _ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks from 0, ties sharing their mean rank."""
    v = np.asarray(values, dtype=float)
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v))
    ranks[order] = np.arange(len(v))
    for x in np.unique(v):
        ranks[v == x] = ranks[v == x].mean()
    return ranks


def _part_dict(p: PartResult) -> dict:
    d = dataclasses.asdict(p)
    d["bench"] = dict(p.bench) if p.bench is not None else None
    d["search"] = dict(p.search) if p.search is not None else None
    return d


def part_result(state: PartState, rounds: Sequence[ModelRound], accept: str) -> PartResult:
    """What happened to one subprogram, from its state (``rounds``: the whole-model timings, for the
    reason of a rollback; ``accept``: the acceptance mode)."""
    p, ops, selection = state.part, state.ops, state.selection
    if not p.translated or selection is None:
        return PartResult(p.name, p.kind, ops, "passed through", p.reason or "", (), "", None)
    text = format_expr(p.program)
    chosen = selection.chosen
    verdict = state.verdict
    bench = part_bench(verdict.timing) if verdict else None
    search = _search_report(selection)
    if chosen is None:
        first = selection.tried[0] if selection.tried else None
        if first is not None and first.unchanged:
            status, reason = "unchanged", "re-instantiated as the same nodes"
            if len(selection.tried) > 1:
                reason += "; no candidate the search found was verified and timed"
        elif first is not None and first.rejected.startswith(NOT_TIMED):
            status, reason = "not faster", f"could not be timed ({first.rejected}): the original nodes stay"
        else:
            status = "failed"
            reason = first.rejected if first is not None else "nothing to instantiate"
            specific = next((t.rejected for t in selection.tried if t.rejected.startswith(LEFT_OUT)), "")
            if specific and not any(t.verified is not None and not t.verified.ok for t in selection.tried):
                status, reason = "left out", specific[len(LEFT_OUT) :]
        new_ops = _new_ops(first.instantiated) if first is not None and first.instantiated else ()
        return PartResult(p.name, p.kind, ops, status, reason, new_ops, text, None, search=search)
    err = chosen.verified.max_abs_error if chosen.verified is not None else None
    new_ops = _new_ops(chosen.instantiated)
    trace = chosen.candidate.trace_text()
    at = chosen.instantiated.only_at
    if state.kept:
        status = "accepted" if accept == "measured" else "rewritten"
        reason = verdict.reason if verdict else "verified, not timed"
        if at is not None:
            reason += f"; run at {at.values} only (the input's nodes at other values): it {at.why}"
    elif state.dropped.startswith(LEFT_OUT):
        status, reason, new_ops = "left out", state.dropped[len(LEFT_OUT) :], ()
    elif state.dropped:
        status, reason, new_ops = "failed", state.dropped, ()
    elif verdict is not None and verdict.accepted:
        status, reason = "rolled back", _rollback_reason(p.name, rounds)
    elif verdict is not None:
        status, reason = "not faster", verdict.reason
    else:
        status, reason = "not faster", "could not be timed: the original nodes stay"
    only_at = at.values if at is not None else ""
    return PartResult(p.name, p.kind, ops, status, reason, new_ops, text, err, trace, bench, search, only_at)


def _search_report(selection: Selection) -> dict[str, object]:
    """The report's ``search`` entry of a part: the search's counts and every candidate tried."""
    s = selection.search
    base = s.input.cost if s.input is not None else None
    return {
        "stats": dict(s.stats),
        "seconds": s.seconds,
        "cached": s.cached,
        "same_as": s.same_as,
        "predicted_speedup": selection.predicted_speedup,
        "candidates": [c.as_dict(base) for c in selection.tried],
    }


def part_bench(t: Comparison) -> dict[str, object]:
    """A subprogram's ``bench`` entry of the report from its side-by-side timing."""
    return {
        "original_ms": t.before.median_ms,
        "optimized_ms": t.after.median_ms,
        "speedup": t.speedup,
        "speedup_95": list(t.gain_interval),
        "cached": t.cached,
        "unreliable": t.unreliable(),
    }


def _rollback_reason(name: str, rounds: Sequence[ModelRound]) -> str:
    for r in rounds:
        if name in r.rolled_back:
            t = r.timing
            if r.stage != "round":
                return f"faster on its own, but rolled back with the whole model: {r.reason}"
            if t.unreliable():
                return f"faster on its own, but the whole-model timing was disturbed by other work ({t.unreliable()}): rolled back"
            return (
                f"faster on its own, but the whole model with it ran {t.after.median_ms:.3g} ms "
                f"against the input's {t.before.median_ms:.3g} ms ({r.reason}): rolled back"
            )
    return "rolled back with the whole model"


def _new_ops(inst: Instantiated) -> tuple[str, ...]:
    if inst.only_at is not None:  # what runs at the searched shape (the input's nodes elsewhere)
        inst = inst.only_at.rewrite
    return tuple(n.op_type if n.domain in DEFAULT_DOMAINS else f"{n.domain}.{n.op_type}" for n in inst.nodes)
