"""What the stages ask of an eOperator backend (:class:`Backend`), and the portable one (:data:`PORTABLE`,
``--kernels onnx``, the default): eOperators as model-local functions of standard ONNX operators
(domain ``einopt.eop``, :mod:`einopt.instantiate.eop`), which any ONNX Runtime runs.

The interface lives here, below the stages and beside the emitter that calls most of its hooks, so that
nothing below :mod:`einopt.backends` (the registry and the TVM backend, which use the stages) imports
it. The portable backend is the emitter's own form: every hook leaves the stages as they are (no
activations fused into subprograms, no generated nodes, no further forms to time, nothing after
selection). Hook arguments typed ``Any`` are the emitter (:class:`einopt.instantiate.emit._Emitter`),
instantiations (:class:`~einopt.instantiate.emit.Instantiated`), operator matches
(:class:`~einopt.instantiate.plan.OperatorMatch`), candidates (:class:`einopt.search.Candidate`)
and part states (:class:`einopt.stages.state.PartState`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from einopt.core import ir

__all__ = ["PORTABLE", "Backend", "PortableBackend"]


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

    def kernel_build(self, inst: Any) -> str | None:
        """The build the generated kernels of ``inst`` are timed under (None: it has none; see
        :func:`einopt.runtime.opcost.node_costs`)."""

    def groups(
        self, em: Any, program: ir.Program, constants: Mapping[str, np.ndarray]
    ) -> list[tuple[str, ...]]:
        """Bindings of ``program`` to emit as one node each group (tried before each binding alone)."""

    def emit_group(self, em: Any, names: tuple[str, ...]) -> bool:
        """Emit the bindings ``names`` as one node; False (nothing emitted) when they cannot be."""

    def emit_match(self, em: Any, scope: ir.Scope, m: Any, label: str) -> tuple[str, str] | None:
        """``scope``, which the predefined operators of ``m`` compute, emitted otherwise: its value and
        how (:class:`einopt.instantiate.emit.Choice`); None to emit ``m``."""

    def emit_eoperator(self, em: Any, scope: ir.Scope, label: str, kind: str) -> tuple[str, str] | None:
        """``scope``, which no predefined operator computes, emitted: its value and how; None for the
        portable form (a call of a model-local function of standard operators)."""

    def finish(self, em: Any, keep: set[str]) -> None:
        """Last changes to the emitted nodes (the values in ``keep`` are the program's outputs)."""

    def variants(self, candidates: Sequence[Any]) -> list[Any]:
        """Further forms of ``candidates`` that selection instantiates and times beside them."""

    def after_selection(self, ctx: Any, states: Mapping[str, Any]) -> Mapping[str, Any]:
        """The parts' states after selection, changed where this backend does better across parts
        (``ctx``: the :class:`einopt.stages.context.StageContext` selection ran in)."""


@dataclasses.dataclass(frozen=True)
class PortableBackend:
    """eOperators as functions of standard operators: every hook leaves the stages as they are."""

    name: ClassVar[str] = "onnx"
    fuse_activations: ClassVar[bool] = False
    generates_kernels: ClassVar[bool] = False
    fewer_nodes: ClassVar[bool] = False

    def check(self) -> None:
        pass  # standard operators: ONNX Runtime is all it needs

    def check_model(self, model: onnx.ModelProto) -> None:
        pass  # model-local functions are checked by onnx.checker with the rest of the model

    def kernel_build(self, inst: Any) -> str | None:
        return None

    def groups(
        self, em: Any, program: ir.Program, constants: Mapping[str, np.ndarray]
    ) -> list[tuple[str, ...]]:
        return []

    def emit_group(self, em: Any, names: tuple[str, ...]) -> bool:
        return False

    def emit_match(self, em: Any, scope: ir.Scope, m: Any, label: str) -> tuple[str, str] | None:
        return None

    def emit_eoperator(self, em: Any, scope: ir.Scope, label: str, kind: str) -> tuple[str, str] | None:
        return None

    def finish(self, em: Any, keep: set[str]) -> None:
        pass

    def variants(self, candidates: Sequence[Any]) -> list[Any]:
        return []

    def after_selection(self, ctx: Any, states: Mapping[str, Any]) -> Mapping[str, Any]:
        return states


PORTABLE = PortableBackend()
