"""What the stages after the search read, built once by the pipeline (:class:`StageContext`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from einopt.instantiate.backend import PORTABLE, Backend
from einopt.runtime.timing import NOISE_BAND
from einopt.runtime.verify import Tolerance
from einopt.stages.accept import Timer

__all__ = ["StageContext"]


@dataclasses.dataclass(frozen=True)
class StageContext:
    """The prepared model and how its rewrites are checked, timed and written, for selection and what
    follows it (:func:`einopt.stages.select.select`, a backend's ``after_selection``).

    Parameters
    ----------
    model : onnx.ModelProto
        The prepared model the parts were cut from.
    datasets : sequence
        Verification inputs (empty: nothing is verified).
    tolerance : Tolerance
        Verification tolerance.
    timer : Timer or None
        Times candidates against the original nodes; None: untimed (``--accept verified``).
    feeds : mapping or None
        Graph inputs the timings run on.
    taken : set of str
        Function names in the model; the stages add those of the programs they choose (the one
        mutable field: names taken are shared by every stage that writes functions).
    backend : Backend
        How eOperators are written (:mod:`einopt.backends`).
    noise : float
        With a backend whose ties go to ``fewer_nodes``, trials within ``1 + noise`` of the
        fastest are ties.
    """

    model: onnx.ModelProto
    datasets: Sequence[Mapping[str, np.ndarray]]
    tolerance: Tolerance
    timer: Timer | None
    feeds: Mapping[str, np.ndarray] | None
    taken: set[str] = dataclasses.field(default_factory=set)
    backend: Backend = PORTABLE
    noise: float = NOISE_BAND
