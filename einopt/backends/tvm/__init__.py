"""The TVM backend (``--kernels tvm``): eOperators and element-wise chains as generated kernels.

A kernel is described in the model (its einopt program, shapes and schedule; no machine code),
compiled by TVM on the machine that runs the model, and run in ONNX Runtime by einopt's custom-op
library. Its parts, in pipeline order:

- partition: element-wise activations join the subprogram before them (``fuse_activations``);
- :mod:`~einopt.backends.tvm.kernelfusion`: element-wise work inlined into the element-wise scope
  that reads it (the fused forms selection times beside each candidate);
- :mod:`~einopt.backends.tvm.emit` and :mod:`~einopt.backends.tvm.kernelgroups`: scopes, chains
  and groups of bindings as ``ai.einopt::TvmKernel`` nodes;
- :mod:`~einopt.backends.tvm.partmerge`: after selection, adjacent subprograms whose seam one
  kernel can close are merged;
- :mod:`~einopt.backends.tvm.ortkernel` (kernel descriptions and libraries),
  :mod:`~einopt.backends.tvm.kernels` (the custom-op library, and the session hook of the domain
  ``ai.einopt`` that ``einopt.runtime.session`` finds by its entry point),
  :mod:`~einopt.backends.tvm.build` and ``native/`` (the C sources).

"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from einopt.backends.tvm.emit import (
    elementwise,
    generated_group,
    generated_kernel,
    inner_reductions,
    kernel_reduction,
    read_through_reshapes,
)
from einopt.backends.tvm.kernelfusion import fused_candidates
from einopt.backends.tvm.kernelgroups import kernel_groups
from einopt.backends.tvm.kernels import described, library_path
from einopt.backends.tvm.ortkernel import KernelUnsupported, build_id
from einopt.backends.tvm.partmerge import merge_parts
from einopt.instantiate import eop
from einopt.runtime.modelio import uses_generated_kernels

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from einopt.core import ir
    from einopt.instantiate.emit import Instantiated, _Emitter
    from einopt.instantiate.plan import OperatorMatch
    from einopt.search.results import Candidate
    from einopt.stages.context import StageContext
    from einopt.stages.state import PartState

__all__ = ["TVM", "TvmBackend"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TvmBackend:
    """Generated kernels run by einopt's custom-op library (:class:`einopt.backends.Backend`)."""

    name: ClassVar[str] = "tvm"
    fuse_activations: ClassVar[bool] = True  # a kernel computes an operator's work and its activation
    generates_kernels: ClassVar[bool] = True
    fewer_nodes: ClassVar[bool] = True  # the point of generated kernels is to remove kernels

    def check(self) -> None:
        """No C compiler (or an untrusted cache): one clear error before any work."""

        library_path()

    def check_model(self, model: onnx.ModelProto) -> None:
        """An einopt output: its kernels' descriptions are checked."""

        if uses_generated_kernels(model):
            described(model)

    def kernel_build(self, inst: Instantiated) -> str | None:
        """The code generator's build (compiled kernels depend on it)."""
        if not inst.has_generated_kernels:
            return None

        return build_id()

    def groups(
        self, em: _Emitter, program: ir.Program, constants: Mapping[str, np.ndarray]
    ) -> list[tuple[str, ...]]:
        """Element-wise bindings that read one another: one kernel, several outputs; reductions that
        are generated kernels in any case are computed with the element-wise work after them."""

        outputs = set(program.outputs)
        reductions = {n for n, s in program.bindings if n not in outputs and kernel_reduction(em, s)}
        return kernel_groups(program, set(constants), reductions)

    def emit_group(self, em: _Emitter, names: tuple[str, ...]) -> bool:

        return generated_group(em, names)

    def emit_match(
        self, em: _Emitter, scope: ir.Scope, m: OperatorMatch, label: str
    ) -> tuple[str, str] | None:
        """One generated kernel instead of a chain of element-wise nodes."""

        if not elementwise(m, inner_reductions(em, scope)):
            return None
        try:
            return generated_kernel(em, scope, label, eop.eop_name(scope))
        except KernelUnsupported:
            return None

    def emit_eoperator(self, em: _Emitter, scope: ir.Scope, label: str, kind: str) -> tuple[str, str] | None:

        try:
            return generated_kernel(em, scope, label, kind)
        except KernelUnsupported as e:
            log.debug("%s: no generated kernel, %s", label, e)
            return None

    def finish(self, em: _Emitter, keep: set[str]) -> None:

        read_through_reshapes(em, keep)

    def variants(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The candidates whose element-wise chains fuse into fewer generated kernels
        (:func:`einopt.backends.tvm.kernelfusion.fuse_for_kernels`), fused, each program once."""

        return fused_candidates(candidates)

    def after_selection(self, ctx: StageContext, states: Mapping[str, PartState]) -> Mapping[str, PartState]:
        """Seams between subprograms that one generated kernel can close
        (:func:`einopt.backends.tvm.partmerge.merge_parts`)."""

        return merge_parts(ctx, states)


TVM = TvmBackend()
