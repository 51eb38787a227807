"""Instantiation with generated kernels: the TVM backend's side of :mod:`einopt.instantiate.emit`.

A scope no predefined operator computes becomes an ``ai.einopt::TvmKernel`` node carrying the
scope's kernel description (:mod:`einopt.backends.tvm.ortkernel`), compiled by TVM for the CPU that
runs the model (:mod:`einopt.backends.tvm.kernels`); so does a match that would be two or more
element-wise nodes (a fused element-wise chain, :mod:`einopt.backends.tvm.kernelfusion`), and a
group of element-wise bindings that read one another (:mod:`einopt.backends.tvm.kernelgroups`:
one kernel, several outputs). A scope that cannot be a kernel (one reading a non-float tensor) is
emitted in the portable form.
"""

from __future__ import annotations

import logging
from typing import Any

from onnx import helper

from einopt.backends.tvm import kernels
from einopt.backends.tvm.ortkernel import (
    KernelUnsupported,
    OrtKernel,
    kernel_flops,
    ort_kernel,
    ort_kernel_group,
)
from einopt.core import ir
from einopt.core.ops import BINARY, UNARY
from einopt.core.rewrite import accesses
from einopt.instantiate import eop
from einopt.instantiate.emit import Choice, _Emitter
from einopt.instantiate.match import MATCHERS, match
from einopt.instantiate.plan import OperatorMatch
from einopt.rules.fusion import program_reads

__all__ = [
    "ELEMENTWISE_OPS",
    "elementwise",
    "generated_group",
    "generated_kernel",
    "inner_reductions",
    "kernel_reduction",
    "read_through_reshapes",
]

log = logging.getLogger(__name__)

ELEMENTWISE_OPS: frozenset[str] = frozenset(
    {op.onnx for op in UNARY.values()}
    | {name for op in BINARY.values() for name in (op.onnx, op.onnx_variadic) if name}
)
"""Default-domain operators that work element by element (a chain of them is one generated kernel)."""


def elementwise(m: OperatorMatch, inner: tuple[ir.Scope, ...]) -> bool:
    """Whether ``m`` runs as element-wise nodes that one generated kernel computes instead: two or
    more, or one after a reduction in ``inner`` (which the kernel computes too: see
    :func:`inner_reductions`)."""
    return len(m.ops) >= (1 if inner else 2) and all(
        op.domain in ("", "ai.onnx") and op.op_type in ELEMENTWISE_OPS for op in m.ops
    )


def generated_group(em: _Emitter, names: tuple[str, ...]) -> bool:
    """Bindings ``names`` (see :func:`einopt.backends.tvm.kernelgroups.kernel_groups`) as one
    ``ai.einopt::TvmKernel`` node writing those that are outputs or read by other bindings; False
    (nothing emitted) when they cannot be one kernel."""
    program = em.program
    members = set(names)
    scopes = tuple(program.scope(n) for n in names)
    reads = program_reads(program)
    written = tuple(
        n in program.outputs or any(n in r for o, r in reads.items() if o not in members) for n in names
    )
    try:
        k = _kernel(em, scopes, written)
    except KernelUnsupported as e:
        log.debug("%s: no kernel with several outputs, %s", ", ".join(names), e)
        return False
    label = names[0]
    inputs = [em.value_of(src, label) for src in k.sources]
    out_scopes = [s for s, w in zip(scopes, written, strict=True) if w]
    outs = [
        em.onnx_names[n] if n in program.outputs else em.fresh(n)
        for n, w in zip(names, written, strict=True)
        if w
    ]
    kind = eop.eop_name(scopes[-1])
    em.nodes.append(
        helper.make_node(
            kernels.OP_TYPE,
            inputs,
            outs,
            name=em.node_name(kind),
            domain=kernels.DOMAIN,
            **dict(_kernel_attributes(k, scopes)),
        )
    )
    for s, out in zip(out_scopes, outs, strict=True):
        em.scopes[s] = out
        em.shapes[out] = s.shape
    em.choices.append(Choice(label, f"kernel:{kind}", ()))
    return True


def generated_kernel(em: _Emitter, scope: ir.Scope, label: str, kind: str) -> tuple[str, str]:
    """``scope`` as an ``ai.einopt::TvmKernel`` node computing the reductions nested in it that no
    predefined operator computes too (light: not compiled)."""
    inner = inner_reductions(em, scope)
    if not inner:
        return _alone(em, scope, label, kind)
    members, written = (*inner, scope), (False,) * len(inner) + (True,)
    try:
        k = _kernel(em, members, written)
    except KernelUnsupported:
        return _alone(em, scope, label, kind)
    return _kernel_node(em, scope, members, k, label, kind)


def _alone(em: _Emitter, scope: ir.Scope, label: str, kind: str) -> tuple[str, str]:
    """``scope`` as a kernel of its own, each scope nested in it an input."""
    return _kernel_node(em, scope, (scope,), _kernel(em, (scope,)), label, kind)


def _kernel(em: _Emitter, scopes: tuple[ir.Scope, ...], written: tuple[bool, ...] | None = None) -> OrtKernel:
    """The kernel of one scope (``written`` None) or of a group writing the scopes ``written``
    marks, compiled now unless light (a session compiles what it was not, from the node)."""
    if written is None:
        return ort_kernel(scopes[0], build=not em.light)
    return ort_kernel_group(scopes, written, build=not em.light)


def inner_reductions(em: _Emitter, scope: ir.Scope) -> tuple[ir.Scope, ...]:
    """The reductions nested in ``scope`` that its kernel computes inside itself: read by it
    directly, not materialised yet, and each a generated kernel of its own otherwise
    (:func:`kernel_reduction`: an OffsetReduce under its bias and activation)."""
    bound = em.program.names()
    return tuple(
        src
        for src in dict.fromkeys(a.source for a in accesses(scope.body))
        if isinstance(src, ir.Scope)
        and src not in bound
        and src not in em.scopes
        and kernel_reduction(em, src)
    )


def kernel_reduction(em: _Emitter, scope: ir.Scope) -> bool:
    """Whether ``scope`` is a reduction that only a generated kernel computes: no padding, not
    of constants only, and no matcher accepts it (asked once per scope)."""
    if not scope.summation or scope.pad or em.reads_constants(scope):
        return False
    found = em.unmatched_scopes.get(scope)
    if found is None:
        found = em.unmatched_scopes[scope] = match(scope, em.ctx, MATCHERS)[0] is None
    return found


def _kernel_node(
    em: _Emitter,
    scope: ir.Scope,
    members: tuple[ir.Scope, ...],
    k: OrtKernel,
    label: str,
    kind: str,
) -> tuple[str, str]:
    inputs = [em.value_of(s, label) for s in k.sources]
    attrs = _kernel_attributes(k, members)
    out = em.node(kernels.OP_TYPE, inputs, attrs, domain=kernels.DOMAIN, base=kind)
    em.shapes[out] = scope.shape
    return out, f"kernel:{kind}"


def _kernel_attributes(k: OrtKernel, members: tuple[ir.Scope, ...]) -> tuple[tuple[str, Any], ...]:
    """A ``TvmKernel`` node's attributes (see ``einopt/backends/tvm/native/einopt_ort.c``): its
    description and the SHA-256 by which its compiled library is known, its entry point, the shapes
    it reads and writes, and the FLOPs of the scopes it computes (for the cost model)."""
    d = k.description
    return (
        ("kernel", d.text),
        ("kernel_sha256", d.sha256),
        ("symbol", d.symbol),
        ("output_ranks", tuple(len(s) for s in d.outputs)),
        ("output_shapes", tuple(x for s in d.outputs for x in s)),
        ("input_ranks", tuple(len(s) for s in d.inputs)),
        ("input_shapes", tuple(x for s in d.inputs for x in s)),
        ("flops", sum(kernel_flops(s) for s in members)),
    )


def read_through_reshapes(em: _Emitter, keep: set[str]) -> None:
    """A generated kernel reads the input of a Reshape instead of its output: the same bytes, which
    the kernel library hands the kernel in the shape it was compiled for (the node declares it).
    A Reshape that nothing reads then, and whose value is not in ``keep``, is dropped (a node less:
    the Reshapes a matched Conv's phase ends with, in front of the kernel interleaving the phases)."""
    reshapes = {n.output[0]: n for n in em.nodes if n.op_type == "Reshape" and n.domain in ("", "ai.onnx")}
    changed = False
    for node in em.nodes:
        if node.domain != kernels.DOMAIN:
            continue
        for i in range(len(node.input)):
            source = reshapes.get(node.input[i])  # of float32 values: the kernel reads float32
            if source is not None:
                node.input[i] = source.input[0]
                changed = True
    if not changed:
        return
    while True:
        read = {i for n in em.nodes for i in n.input}
        dead = [n for n in em.nodes if n.output[0] in reshapes and not {*n.output} & (read | keep)]
        if not dead:
            break
        em.nodes = [n for n in em.nodes if all(n is not d for d in dead)]
    em.drop_unread_integer_constants()
