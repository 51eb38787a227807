"""What every stage after translation reads, built once by the pipeline (:class:`StageContext`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx

from einopt.frontend.symbolic import Dims, keep_symbolic
from einopt.instantiate.backend import PORTABLE, Backend
from einopt.instantiate.emit import AtShape
from einopt.runtime.timing import MODEL_NOISE, NOISE_BAND
from einopt.runtime.verify import Agreement, Tolerance, compare_models
from einopt.stages.export import assemble
from einopt.stages.generalize import Probe, generalized
from einopt.stages.postopt import postoptimize
from einopt.stages.specialize import specialized
from einopt.stages.timer import Timer
from einopt.stages.verify import PartPair, part_pairs

if TYPE_CHECKING:
    from einopt.frontend.translate import Part
    from einopt.instantiate.emit import Instantiated
    from einopt.search.results import Candidate

__all__ = ["ACCEPT_MODES", "ShapeCheck", "ShapeTiming", "StageContext"]

ACCEPT_MODES = ("measured", "verified")
"""``measured``: a rewrite is kept only when measured faster; ``verified``: every verified rewrite is
kept, untimed."""


@dataclasses.dataclass(frozen=True)
class ShapeCheck:
    """Verification inputs at other values of the symbolic dimensions than the representative ones,
    and the input model's outputs on them."""

    values: Mapping[str, int]  # dimension name -> its value here
    datasets: Sequence[Mapping[str, np.ndarray]]
    references: Sequence[Mapping[str, np.ndarray]]

    def text(self) -> str:
        return ", ".join(f"{n}={v}" for n, v in self.values.items())


@dataclasses.dataclass(frozen=True)
class ShapeTiming:
    """Timing inputs at other values of the symbolic dimensions (``--time-shapes``): the output must
    not be slower than the input there either."""

    values: Mapping[str, int]  # dimension name -> its value here
    feeds: Mapping[str, np.ndarray]

    def text(self) -> str:
        return ", ".join(f"{n}={v}" for n, v in self.values.items())


@dataclasses.dataclass(frozen=True)
class StageContext:
    """The input and prepared models and how their rewrites are checked, timed and written: what the
    stages read (:func:`~einopt.stages.predict.predict`, :func:`~einopt.stages.select.select`, a
    backend's ``after_selection``, :func:`~einopt.stages.accept.accept`,
    :func:`~einopt.stages.output.verify_output`), each a function of it and of the part states.

    Parameters
    ----------
    original : onnx.ModelProto
        The input model: what the output must equal, and be faster than.
    model : onnx.ModelProto
        The prepared model the parts were cut from.
    datasets : sequence
        Verification inputs (empty: nothing is verified).
    references : sequence
        The original's outputs on each of ``datasets``.
    tolerance : Tolerance
        Verification tolerance.
    feeds : mapping or None
        Graph inputs the timings run on (None: nothing can be timed).
    timer : Timer or None
        Times candidates against the original nodes, and the output against the input; None:
        untimed (``--accept verified``, or no inputs to time on).
    accept : {"measured", "verified"}
        :data:`ACCEPT_MODES`.
    noise : float
        A rewrite must be measured at least ``1 + noise`` times faster on its own; with a backend
        whose ties go to ``fewer_nodes``, trials within ``1 + noise`` of the fastest are ties.
    model_noise : float
        The whole output must be faster than the input by more than ``1 + model_noise``, 95%
        confident.
    backend : Backend
        How eOperators are written (:mod:`einopt.backends`).
    taken : set of str
        Function names in the model; the stages add those of the programs they choose (the one
        mutable field: names taken are shared by every stage that writes functions).
    dims : Dims or None
        The input's symbolic dimensions the output keeps, searched at their representative values
        (``model`` is pinned to them; None: the output is as static as ``model``).
    checks : sequence of ShapeCheck
        Verification at other values of ``dims`` (:mod:`einopt.stages.shapes`).
    timings : sequence of ShapeTiming
        Whole-model timings at other values of ``dims``: the output is kept only where it is not
        slower at any of them either (:func:`einopt.stages.accept.accept_model`).
    probe : Probe or None
        The model translated at other values of ``dims``: a rewrite's sizes of them are written as
        run-time arithmetic where the two agree on what they are (:mod:`einopt.stages.generalize`).
    specialize : bool
        A rewrite that holds at the representative values of ``dims`` only is kept there, behind a
        run-time test of the input shapes (:mod:`einopt.stages.specialize`); False: left out.
    declared : mapping
        Value name -> its dims as the output declares them (a name for a symbolic one, None for one
        not known; :func:`~einopt.frontend.symbolic.declared_shapes`): parts are timed with their
        inputs declared so (:meth:`part_pairs`).
    """

    original: onnx.ModelProto
    model: onnx.ModelProto
    datasets: Sequence[Mapping[str, np.ndarray]] = ()
    references: Sequence[Mapping[str, np.ndarray]] = ()
    tolerance: Tolerance = Tolerance()
    feeds: Mapping[str, np.ndarray] | None = None
    timer: Timer | None = None
    accept: str = "measured"
    noise: float = NOISE_BAND
    model_noise: float = MODEL_NOISE
    backend: Backend = PORTABLE
    taken: set[str] = dataclasses.field(default_factory=set)
    dims: Dims | None = None
    checks: Sequence[ShapeCheck] = ()
    timings: Sequence[ShapeTiming] = ()
    probe: Probe | None = None
    specialize: bool = True
    declared: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    _specific: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    _written: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def output(self, rewrites: Mapping[tuple[int, ...], Instantiated]) -> onnx.ModelProto:
        """The prepared model with ``rewrites`` (a part's node indices -> its new nodes) in it, as the
        output is written: the input's symbolic dimensions declared again where the context keeps them
        (before the post-optimisation, which would fold a Shape of a pinned input into a constant)."""
        out = assemble(self.model, rewrites)
        if self.dims is not None and self.dims.values:
            out = keep_symbolic(out, self.original)
        return postoptimize(out)

    def part_pairs(self, parts: Sequence[Part], emitted: Mapping[str, Instantiated]) -> Iterator[PartPair]:
        """Each of ``parts`` (its nodes of :attr:`model`, and ``emitted``'s) as two models to time, on
        the values :attr:`feeds` produce, each with its epilogue, inputs declared as the output
        declares them."""
        return part_pairs(self.model, parts, emitted, self.feeds, epilogues=True, declared=self.declared)

    def for_any_shape(
        self, part: Part, candidate: Candidate, inst: Instantiated, opset: int, backend: Backend
    ) -> Instantiated:
        """``inst`` (``candidate`` of ``part``) with the sizes of the symbolic dimensions it holds
        computed at run time, where the probe tells which they are; as it is otherwise (the reason is
        kept for :meth:`shape_specific`'s message)."""
        if self.probe is None:
            return inst
        out, why = generalized(
            self.probe, part, candidate, inst, opset=opset, taken=self.taken, backend=backend
        )
        if why:
            self._written[id(out)] = (out, why)
        return out

    def shape_specific(self, nodes: tuple[int, ...], inst: Instantiated) -> str:
        """Why the rewrite of the part at ``nodes`` by ``inst`` holds at the representative values of
        the symbolic dimensions only: the first of :attr:`checks` where the output with it alone
        differs from the input, or cannot run ("" when it holds at every one)."""
        if not self.checks:
            return self._unchecked(inst)
        key = (nodes, id(inst))  # checked once: selection checks its trials, a later stage what it chose
        if key not in self._specific:
            self._specific[key] = (inst, self._first_difference(nodes, inst))
        return self._specific[key][1]

    def at_searched_shape(self, part: Part, inst: Instantiated, why: str, prefix: str) -> Instantiated | None:
        """``inst`` (a rewrite of ``part`` that holds at the representative values of the symbolic
        dimensions only, ``why``) run there only, and the part's own nodes at every other value, if
        it can be written so and holds at every checked value so; None otherwise."""
        if not self.specialize or self.dims is None or not self.dims.values:
            return None
        at = AtShape(inst, ", ".join(f"{n}={v}" for n, v in self.dims.values.items()), why)
        out = specialized(self.model, part, inst, self.dims.shapes(), prefix=prefix, taken=self.taken, at=at)
        if out is None or self.shape_specific(part.nodes, out):
            return None
        return out

    def _unchecked(self, inst: Instantiated) -> str:
        """Why a rewrite holds at the representative values only when nothing is verified at other
        values (no verification, or the input runs at none of them): the probe's word alone."""
        if self.dims is None or not self.dims.values or inst.only_at is not None:
            return ""  # run at the representative values only: the input's own nodes at the others
        if self.probe is None:
            return "not checked at other values of the symbolic dimensions (nothing is verified there)"
        why = self._not_written(inst)
        return f"holds at the representative shape only (its sizes stay as searched: {why})" if why else ""

    def _not_written(self, inst: Instantiated) -> str:
        """Why :meth:`for_any_shape` left ``inst``'s sizes as searched ("" when it did not)."""
        return self._written.get(id(inst), (None, ""))[1]

    def _first_difference(self, nodes: tuple[int, ...], inst: Instantiated) -> str:
        failed = self.first_failure(self.output({nodes: inst}), self.checks)
        if failed is None:
            return ""
        check, agreement = failed
        why = self._not_written(inst)
        written = f"; its sizes stay as searched: {why}" if why else ""
        return f"holds at the representative shape only (at {check.text()}: {agreement.message}{written})"

    def first_failure(
        self, model: onnx.ModelProto, checks: Sequence[ShapeCheck]
    ) -> tuple[ShapeCheck, Agreement] | None:
        """The first of ``checks`` where ``model`` differs from the input model (or cannot run), and
        how; None when it agrees at every one."""
        for check in checks:
            agreement = compare_models(check.references, model, check.datasets, self.tolerance)
            if not agreement.ok:
                return check, agreement
        return None

    @property
    def timed(self) -> bool:
        """Whether candidates and the output are timed (a timer, and inputs to time on)."""
        return self.timer is not None and self.feeds is not None
