"""eOperator backends: how the eOperators a search finds are written, and what the stages do for it.

A backend is chosen once, from ``Options.kernels`` (the CLI's ``--kernels``), by :func:`backend`;
every stage that depends on it calls its hooks (:class:`Backend`) and never tests its name:

- ``onnx`` (:mod:`einopt.backends.portable`): eOperators as model-local functions of standard ONNX
  operators; the model runs in any ONNX Runtime.
- ``tvm`` (:mod:`einopt.backends.tvm`): eOperators and element-wise chains as generated kernels,
  described in the model, compiled by TVM where it runs, and run in ONNX Runtime by einopt's
  custom-op library.

>>> backend("onnx").fuse_activations
False
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from einopt.backends.portable import PORTABLE
from einopt.backends.tvm import TVM

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from einopt.core import ir
    from einopt.instantiate.emit import Instantiated, _Emitter
    from einopt.instantiate.plan import OperatorMatch
    from einopt.search.results import Candidate
    from einopt.stages.state import PartState

__all__ = ["BACKENDS", "KERNEL_DOMAIN", "Backend", "backend"]

KERNEL_DOMAIN = "ai.einopt"
"""The domain of the nodes of einopt's generated kernels (whichever backend wrote them)."""


class Backend(Protocol):
    """What a backend decides, one hook per place a stage depends on it (in pipeline order)."""

    name: str
    """Its ``--kernels`` name (the report's ``kernels`` of a trial)."""
    fuse_activations: bool
    """Partition: an element-wise activation joins the subprogram of the node it reads
    (:func:`einopt.frontend.partition.group_nodes`), for one kernel to compute both."""
    generates_kernels: bool
    """Its instantiations may hold generated kernels: a trial's operators are listed from its nodes,
    not from the search's portable form."""
    fewer_nodes: bool
    """Selection: trials measured within the noise band of the fastest are ties, won by the one with
    the fewest nodes (:func:`einopt.stages.select.choose`)."""

    def check(self) -> None:
        """Raise what keeps this backend from running on this machine (before any work)."""

    def check_model(self, model: onnx.ModelProto) -> None:
        """Raise :class:`~einopt.errors.ModelError` when ``model`` (an input) holds nodes of this
        backend that are not what it would write."""

    def kernel_build(self, inst: Instantiated) -> str | None:
        """The build the generated kernels of ``inst`` are timed under (None: it has none; see
        :func:`einopt.runtime.opcost.node_costs`)."""

    def groups(
        self, em: _Emitter, program: ir.Program, constants: Mapping[str, np.ndarray]
    ) -> list[tuple[str, ...]]:
        """Bindings of ``program`` to emit as one node each group (tried before each binding alone)."""

    def emit_group(self, em: _Emitter, names: tuple[str, ...]) -> bool:
        """Emit the bindings ``names`` as one node; False (nothing emitted) when they cannot be."""

    def emit_match(
        self, em: _Emitter, scope: ir.Scope, m: OperatorMatch, label: str
    ) -> tuple[str, str] | None:
        """``scope``, which the predefined operators of ``m`` compute, emitted otherwise: its value and
        how (:class:`einopt.instantiate.emit.Choice`); None to emit ``m``."""

    def emit_eoperator(self, em: _Emitter, scope: ir.Scope, label: str, kind: str) -> tuple[str, str] | None:
        """``scope``, which no predefined operator computes, emitted: its value and how; None for the
        portable form (a call of a model-local function of standard operators)."""

    def finish(self, em: _Emitter, keep: set[str]) -> None:
        """Last changes to the emitted nodes (the values in ``keep`` are the program's outputs)."""

    def variants(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """Further forms of ``candidates`` that selection instantiates and times beside them."""

    def after_selection(
        self, model: onnx.ModelProto, states: Mapping[str, PartState], **selection: Any
    ) -> Mapping[str, PartState]:
        """The parts' states after selection, changed where this backend does better across parts
        (``selection``: what :func:`einopt.stages.select.try_trials` needs, and ``noise``)."""

    def prepare_session(self, model: onnx.ModelProto, options: Any) -> None:
        """Make ``options`` (``onnxruntime.SessionOptions``) able to run ``model``'s nodes of this
        backend (nothing when it has none)."""


def backend(name: str) -> Backend:
    """The backend called ``name`` (a key of :data:`BACKENDS`).

    Raises
    ------
    ValueError
        No backend has that name.
    """
    found = BACKENDS.get(name)
    if found is None:
        raise ValueError(f"kernels must be one of {', '.join(BACKENDS)}, not {name!r}")
    return found


BACKENDS: dict[str, Backend] = {b.name: b for b in (PORTABLE, TVM)}
"""Every backend, by name (the CLI's ``--kernels`` choices)."""
