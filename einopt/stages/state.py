"""One record per subprogram, which each stage of the pipeline fills in.

A :class:`PartState` starts as the translated part and its original op
types; the search (and the cost stage) adds what was found, selection the
candidate chosen and every one tried, acceptance its verdict on its own and
whether it is in the output, and the final verification why it was dropped,
if it was. The report of a subprogram is shaped from its state alone
(:func:`einopt.reports.result.part_result`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

import onnx

from einopt.frontend.translate import Part
from einopt.runtime.timing import Comparison

if TYPE_CHECKING:
    from einopt.instantiate.emit import Instantiated
    from einopt.stages.partsearch import PartSearch
    from einopt.stages.select import Selection

__all__ = ["PartState", "Verdict", "start", "fill"]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What measured acceptance (:mod:`einopt.stages.accept`) decided for one rewritten subprogram."""

    name: str
    accepted: bool
    timing: Comparison
    reason: str


@dataclasses.dataclass(frozen=True)
class PartState:
    """A subprogram (or a node passed through) and what each stage decided about it."""

    part: Part
    ops: tuple[str, ...]  # the original nodes' op types
    search: PartSearch | None = None  # search, re-ranked by the cost stage (None: not searched)
    selection: Selection | None = None  # selection (None: not translated)
    verdict: Verdict | None = None  # acceptance, on its own (None: not timed)
    kept: bool = False  # acceptance: its rewrite is in the output
    dropped: str = ""  # why the assembled output's verification dropped it ("" if it did not)

    @property
    def name(self) -> str:
        return self.part.name

    @property
    def emitted(self) -> Instantiated | None:
        """The chosen candidate's nodes (None when selection chose nothing)."""
        chosen = self.selection.chosen if self.selection is not None else None
        return chosen.instantiated if chosen is not None else None


def start(model: onnx.ModelProto, parts: tuple[Part, ...] | list[Part]) -> dict[str, PartState]:
    """A fresh state per part, in part order."""
    return {p.name: PartState(p, tuple(model.graph.node[i].op_type for i in p.nodes)) for p in parts}


def fill(states: Mapping[str, PartState], **stage: Mapping[str, object]) -> dict[str, PartState]:
    """``states`` with what a stage produced: ``fill(states, search=searches)`` sets each state's
    ``search`` to ``searches[name]`` where a name has one (the others are unchanged)."""
    fields = {f.name for f in dataclasses.fields(PartState)}
    unknown = set(stage) - fields
    if unknown:
        raise TypeError(f"PartState has no field {', '.join(sorted(unknown))}")
    return {
        name: dataclasses.replace(s, **{k: v[name] for k, v in stage.items() if name in v})
        for name, s in states.items()
    }
