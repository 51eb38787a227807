"""What a search returns: ranked candidates with their derivations, and the search's statistics."""

from __future__ import annotations

import dataclasses

from einopt import ir

__all__ = ["SearchError", "TraceStep", "Candidate", "RuleStats", "Stats", "SearchResult"]


class SearchError(ValueError):
    """The search cannot run (bad limits, or an input that is not a program)."""


@dataclasses.dataclass(frozen=True)
class TraceStep:
    """One derivation step: the rule, where it applied, what it did, and the program after it
    (in its normal form)."""

    rule: str
    where: str
    summary: str
    program: ir.Program
    phase: str


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A fully instantiable program equal to the input, with how it was derived and what it runs as.

    ``operators`` lists what it instantiates to: ONNX op types (layout ops
    included) and eOperators as ``"eop:NAME"``; scopes folded at compile time
    are left out. ``cost`` is in seconds (estimated or measured, see
    :func:`search`).
    """

    program: ir.Program
    trace: tuple[TraceStep, ...]
    operators: tuple[str, ...]
    cost: float
    key: str
    flops: int

    @property
    def depth(self) -> int:
        return len(self.trace)

    def text(self) -> str:
        """The program in the text syntax (``einopt.parse`` reads it back)."""
        return str(self.program)


@dataclasses.dataclass
class RuleStats:
    """How one rule (in one phase) fared: states tried, admitted matches, new unique states, seconds."""

    tries: int = 0
    matches: int = 0
    new_states: int = 0
    seconds: float = 0.0

    def add(self, other: RuleStats) -> None:
        self.tries += other.tries
        self.matches += other.matches
        self.new_states += other.new_states
        self.seconds += other.seconds


@dataclasses.dataclass
class Stats:
    """Counts of one search. ``generated`` counts every program a rule produced; ``pruned`` those
    dropped by fingerprint (seen before, after the normal form) or by cost; ``expanded`` the states
    whose matches were enumerated."""

    generated: int = 0
    pruned_fingerprint: int = 0
    pruned_cost: int = 0
    expanded: int = 0
    converge_steps: int = 0
    commuted: int = 0  # matches not taken because the same state is reached in the other order
    pruned_beam: int = 0  # states past the beam width at their depth
    candidates_costed: int = 0
    per_depth: list[dict[str, int]] = dataclasses.field(default_factory=list)
    rules: dict[str, RuleStats] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    complete: bool = True  # False when the time budget ran out

    @property
    def pruned(self) -> int:
        return self.pruned_fingerprint + self.pruned_cost + self.pruned_beam

    @property
    def pruned_fraction(self) -> float:
        return self.pruned / self.generated if self.generated else 0.0

    def rule(self, label: str) -> RuleStats:
        return self.rules.setdefault(label, RuleStats())

    def merge(self, other: Stats) -> None:
        self.generated += other.generated
        self.pruned_fingerprint += other.pruned_fingerprint
        self.pruned_cost += other.pruned_cost
        self.expanded += other.expanded
        self.converge_steps += other.converge_steps
        self.commuted += other.commuted
        self.complete = self.complete and other.complete
        for label, rs in other.rules.items():
            self.rule(label).add(rs)

    def as_dict(self) -> dict:
        return {
            "generated": self.generated,
            "pruned": self.pruned,
            "pruned_fingerprint": self.pruned_fingerprint,
            "pruned_cost": self.pruned_cost,
            "pruned_beam": self.pruned_beam,
            "expanded": self.expanded,
            "converge_steps": self.converge_steps,
            "commuted": self.commuted,
            "candidates_costed": self.candidates_costed,
            "per_depth": self.per_depth,
            "rules": {k: dataclasses.asdict(v) for k, v in self.rules.items()},
            "seconds": round(self.seconds, 3),
            "complete": self.complete,
        }


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Candidates (ranked, best first; the input is always among them) and the search's statistics."""

    candidates: tuple[Candidate, ...]
    stats: Stats

    @property
    def best(self) -> Candidate:
        return self.candidates[0]
