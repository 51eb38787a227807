"""Lower, schedule and build an expression for a target.

This module imports TVM; ``einopt.codegen`` imports it only when compiling.
"""

from __future__ import annotations

import functools
import logging

import tvm
from tvm.target import codegen as llvm_codegen

from einopt.codegen.kernel import CompiledKernel, OutputSpec
from einopt.codegen.schedule import schedule_cpu, schedule_gpu
from einopt.codegen.te import Lowered, lower
from einopt.core.ir import Program, Scope

__all__ = ["build", "resolve_target"]

log = logging.getLogger(__name__)

# Compile flags only: without a GPU the CUDA arch cannot be detected, and any
# recent one gives the same source.
DEFAULT_CUDA_ARCH = "sm_70"


@functools.cache
def resolve_target(target: str) -> tvm.target.Target:
    """The TVM target for an einopt target name.

    ``"llvm"`` is the host CPU with its instruction set (TVM's plain ``llvm``
    target assumes SSE2 only); ``"cuda"`` is an NVIDIA GPU (the local one's
    architecture if there is one). Anything else goes to ``tvm.target.Target``.
    """
    if target == "llvm":
        cpu = llvm_codegen.llvm_get_system_cpu()
        return tvm.target.Target({"kind": "llvm", "mcpu": cpu} if cpu and cpu != "generic" else "llvm")
    if target == "cuda":
        dev = tvm.cuda()
        arch = "sm_" + dev.compute_version.replace(".", "") if dev.exist else DEFAULT_CUDA_ARCH
        return tvm.target.Target({"kind": "cuda", "arch": arch}, host=resolve_target("llvm"))
    try:
        return tvm.target.Target(target)
    except Exception as e:  # noqa: BLE001 - TVM reports bad targets with several error types
        raise ValueError(f"unknown target {target!r}: {e}") from None


def build(node: Scope | Program, target: str) -> CompiledKernel:
    """Compile ``node`` for ``target`` (no caching; see ``einopt.codegen.compile``)."""
    tgt = resolve_target(target)
    lowered = lower(node)
    device_source = None
    scheduled = True
    if tgt.kind.name == "cuda":
        mod = schedule_gpu(lowered).mod
        module = tvm.tirx.build(mod, target=tgt)
        device_source = "\n".join(m.inspect_source() for m in module.imports)
    else:
        try:
            mod = schedule_cpu(lowered).mod
            module = tvm.tirx.build(mod, target=tgt)
        except Exception as e:  # noqa: BLE001 - a failed schedule must not fail the compile
            log.debug("scheduled build failed, building unscheduled loops: %s", e)
            mod = tvm.IRModule({"main": lowered.func})
            module = tvm.tirx.build(mod, target=tgt)
            scheduled = False
    return CompiledKernel(
        node=node,
        target=target,
        inputs=lowered.inputs,
        outputs=_output_specs(lowered),
        module=module,
        source=mod.script(),
        device_source=device_source,
        scheduled=scheduled,
    )


def _output_specs(lowered: Lowered) -> tuple[OutputSpec, ...]:
    params: dict[Scope, int] = {}
    out = []
    for o in lowered.outputs:
        p = params.setdefault(o.scope, len(params))
        out.append(OutputSpec(o.name, p, o.buffer_shape, o.view))
    return tuple(out)
