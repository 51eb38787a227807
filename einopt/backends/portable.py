"""The portable backend (``--kernels onnx``, the default): eOperators as model-local functions of
standard ONNX operators (domain ``einopt.eop``, :mod:`einopt.instantiate.eop`), in any ONNX Runtime.

Every hook leaves the stages as they are: no activations fused into subprograms, no generated
nodes, no further forms to time, nothing after selection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from einopt.core import ir
    from einopt.instantiate.emit import Instantiated, _Emitter
    from einopt.instantiate.plan import OperatorMatch
    from einopt.search.results import Candidate
    from einopt.stages.state import PartState

__all__ = ["PORTABLE", "PortableBackend"]


@dataclasses.dataclass(frozen=True)
class PortableBackend:
    """eOperators as functions of standard operators (:class:`einopt.backends.Backend`)."""

    name: ClassVar[str] = "onnx"
    fuse_activations: ClassVar[bool] = False
    generates_kernels: ClassVar[bool] = False
    fewer_nodes: ClassVar[bool] = False

    def check(self) -> None:
        pass  # standard operators: ONNX Runtime is all it needs

    def check_model(self, model: onnx.ModelProto) -> None:
        pass  # model-local functions are checked by onnx.checker with the rest of the model

    def kernel_build(self, inst: Instantiated) -> str | None:
        return None

    def groups(
        self, em: _Emitter, program: ir.Program, constants: Mapping[str, np.ndarray]
    ) -> list[tuple[str, ...]]:
        return []

    def emit_group(self, em: _Emitter, names: tuple[str, ...]) -> bool:
        return False

    def emit_match(
        self, em: _Emitter, scope: ir.Scope, m: OperatorMatch, label: str
    ) -> tuple[str, str] | None:
        return None

    def emit_eoperator(self, em: _Emitter, scope: ir.Scope, label: str, kind: str) -> tuple[str, str] | None:
        return None

    def finish(self, em: _Emitter, keep: set[str]) -> None:
        pass

    def variants(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        return []

    def after_selection(
        self, model: onnx.ModelProto, states: Mapping[str, PartState], **selection: Any
    ) -> Mapping[str, PartState]:
        return states

    def prepare_session(self, model: onnx.ModelProto, options: Any) -> None:
        pass  # its nodes are standard operators and local functions


PORTABLE = PortableBackend()
