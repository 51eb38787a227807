"""A scope as a kernel that ONNX Runtime runs: compiled by TVM, linked into a small shared library.

``ort_kernel(scope)`` gives what an ``ai.einopt::TvmKernel`` node needs (see
``einopt.runtime.kernels``): the kernel library's bytes, the kernel's symbol,
and the values to feed it, in order. The scope's direct sources (input
tensors and the nested scopes it reads, first read first) become the kernel's
parameters ``x000, x001, ...``; a nested scope is read as a tensor of its shape
(its traversal value ``v`` at array position ``v - lo``, as it is
materialised). The scope's ``pad`` is dropped: the node's output is the scope's
value, not a padded buffer.

Libraries are cached twice: per process by the stand-in scope, and on disk in
the user's cache directory (``kernels/<build fingerprint>/<symbol>.so``; the
fingerprint covers TVM's version, the target CPU, einopt's code generator, its
IR and operations (their TVM forms), and the shim), so a second run of a model compiles nothing.

``kernel_flops`` is the analytic work of a scope (the cost model's FLOPs of the
node); it needs no TVM.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import os
import re
import tempfile
import threading
from pathlib import Path

from einopt.core import ir
from einopt.core.keys import key
from einopt.core.ops import BINARY, UNARY
from einopt.core.rewrite import accesses

__all__ = [
    "KernelUnsupported",
    "OrtKernel",
    "ort_kernel",
    "ort_kernel_group",
    "compiled",
    "build_id",
    "stand_in",
    "stand_in_group",
    "kernel_flops",
]

log = logging.getLogger(__name__)

CODEGEN = Path(__file__).resolve().parent
CORE = CODEGEN.parent / "core"  # the IR and its operations' TVM forms


class KernelUnsupported(ValueError):
    """A scope that cannot be a generated kernel here (the message says why)."""


@dataclasses.dataclass(frozen=True)
class OrtKernel:
    """One compiled scope: ``library`` (shared-object bytes) exports ``__tvm_ffi_<symbol>``, called
    with ``sources`` (tensors and nested scopes, in order) and writing one float32 output of ``shape``."""

    symbol: str
    library: bytes
    sources: tuple[ir.Tensor | ir.Scope, ...]
    shape: tuple[int, ...]
    scheduled: bool


@dataclasses.dataclass(frozen=True)
class StandIn:
    """A scope rewritten to read its direct sources as the tensors ``x000, x001, ...``."""

    scope: ir.Scope
    sources: tuple[ir.Tensor | ir.Scope, ...]

    @property
    def symbol(self) -> str:
        return "einopt_" + key(self.scope)


def stand_in(scope: ir.Scope) -> StandIn:
    """``scope`` reading each distinct direct source (first read first) as a float32 tensor.

    Raises
    ------
    KernelUnsupported
        When a source is not float32 (einopt's ONNX Runtime operator takes float32 tensors).
    """
    group = stand_in_group((scope,), (True,))
    return StandIn(group.program.bindings[0][1], group.sources)


@dataclasses.dataclass(frozen=True)
class GroupStandIn:
    """Scopes computed by one kernel with several outputs: a program whose inputs are the scopes'
    outside sources as the tensors ``x000, x001, ...`` and whose bindings read one another."""

    program: ir.Program
    sources: tuple[ir.Tensor | ir.Scope, ...]

    @property
    def symbol(self) -> str:
        return (
            "einopt_"
            + hashlib.sha256(
                "\n".join(key(s) + " " + n for n, s in self.program.bindings).encode()
                + b"|"
                + " ".join(self.program.outputs).encode()
            ).hexdigest()[:24]
        )


def stand_in_group(scopes: tuple[ir.Scope, ...], outputs: tuple[bool, ...]) -> GroupStandIn:
    """``scopes`` (each reading only earlier ones among them, directly) as one program: their other
    sources, first read first, become float32 tensors; ``outputs`` says which scopes the kernel
    writes (the others stay inside it).

    Raises
    ------
    KernelUnsupported
        When a source is not float32, or a scope reads another one through a scope nested in it.
    """
    members = set(scopes)
    order: dict[ir.Tensor | ir.Scope, ir.Tensor] = {}
    for s in scopes:
        for src in dict.fromkeys(a.source for a in accesses(s.body)):
            if src in members or src in order:
                continue
            if isinstance(src, ir.Tensor) and src.dtype != "float32":
                raise KernelUnsupported(f"it reads {src.name}, a {src.dtype} tensor (kernels take float32)")
            if isinstance(src, ir.Scope) and not members.isdisjoint(ir.scopes_in(src)):
                raise KernelUnsupported("a scope of the group reads another one through a nested scope")
            order[src] = ir.Tensor(f"x{len(order):03d}", src.shape, "float32")
    rebuilt: dict[ir.Scope, ir.Scope] = {}

    def go(node: ir.Node) -> ir.Node:
        node = ir.rebuild(node, go) if not isinstance(node, ir.Access) else node
        if not isinstance(node, ir.Access):
            return node
        if node.source in rebuilt:
            return ir.Access(rebuilt[node.source], node.indices)
        indices = node.indices
        if isinstance(node.source, ir.Scope):
            indices = tuple(
                ir.ISub(i, ir.IConst(lo)) if lo else i
                for i, lo in zip(indices, node.source.origin, strict=True)
            )
        return ir.Access(order[node.source], indices)

    bindings = []
    for k, s in enumerate(scopes):
        rebuilt[s] = ir.Scope(s.traversal, s.summation, go(s.body), (), s.reduce)
        bindings.append((f"y{k}", rebuilt[s]))
    written = tuple(n for (n, _), w in zip(bindings, outputs, strict=True) if w)
    return GroupStandIn(ir.Program(tuple(order.values()), tuple(bindings), written), tuple(order))


def kernel_flops(scope: ir.Scope) -> int:
    """Arithmetic operations of one run of ``scope``: per point of its traversal and reduction, one per
    operator in its body (``einopt.core.ops``'s FLOPs of it) and one for the reduction."""
    ops = 0
    for e in ir.walk(scope.body, stop=ir.Access):
        if isinstance(e, ir.Binary):
            ops += BINARY[e.op].flops
        elif isinstance(e, ir.Unary):
            ops += UNARY[e.fn].flops
    points = math.prod(scope.shape) * math.prod(it.extent for it in scope.summation)
    return int(points * (ops + (1 if scope.summation else 0)))


_CACHE: dict[ir.Scope | ir.Program, tuple[bytes, bool]] = {}
_LOCK = threading.Lock()


def ort_kernel(scope: ir.Scope) -> OrtKernel:
    """Compile ``scope`` for this CPU into a kernel library (cached per process and on disk).

    Raises
    ------
    KernelUnsupported
        When the scope cannot be a kernel (see :func:`stand_in`).
    einopt.runtime.kernels.NativeBuildError
        When there is no C compiler to link the library with, or linking fails.
    """
    s = stand_in(scope)
    library, scheduled = compiled(s)
    return OrtKernel(s.symbol, library, s.sources, scope.shape, scheduled)


def ort_kernel_group(scopes: tuple[ir.Scope, ...], outputs: tuple[bool, ...]) -> OrtKernel:
    """Compile ``scopes`` (see :func:`stand_in_group`) into one kernel library writing the scopes
    ``outputs`` marks, in order (``shape`` is the first one's; cached like :func:`ort_kernel`)."""
    s = stand_in_group(scopes, outputs)
    library, scheduled = compiled(s)
    return OrtKernel(s.symbol, library, s.sources, scopes[0].shape, scheduled)


def compiled(s: StandIn | GroupStandIn) -> tuple[bytes, bool]:
    """The library of ``s`` (cached per process and on disk) and whether its loops are scheduled.

    Raises
    ------
    einopt.runtime.kernels.NativeBuildError
        As :func:`ort_kernel`.
    """
    at = s.scope if isinstance(s, StandIn) else s.program
    with _LOCK:
        done = _CACHE.get(at)
        if done is None:
            done = _CACHE[at] = _library(s)
    return done


def build_id() -> str:
    """What a compiled kernel depends on besides its scope (TVM's version, the target CPU, einopt's
    code generator, IR and shim), as a short digest: the name of the disk cache's folder."""
    return _disk_folder().name


def _library(s: StandIn | GroupStandIn) -> tuple[bytes, bool]:
    folder = _disk_folder()
    path = folder / f"{s.symbol}.so"
    if path.exists():
        return path.read_bytes(), True
    module, scheduled, alignment = _build(s)
    from einopt.runtime.kernels import link_kernels

    library = link_kernels([module], alignment=alignment)
    if scheduled:  # an unscheduled build is a fallback; it is tried again next time
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".tmp") as f:
            f.write(library)
        os.replace(f.name, path)  # atomic: a concurrent process reads a whole file
    return library, scheduled


def _build(s: StandIn | GroupStandIn) -> tuple[object, bool, int]:
    """The TVM module of ``s``, whether its loops are scheduled, and the alignment (bytes) its code
    assumes of its buffers."""
    import tvm

    from einopt.codegen.build import resolve_target
    from einopt.codegen.schedule import schedule_cpu
    from einopt.codegen.te import lower
    from einopt.runtime.kernels import TVM_ALIGNMENT

    lowered = lower(s.scope if isinstance(s, StandIn) else s.program)
    target = resolve_target("llvm")

    def built(func) -> tuple[object, int]:
        try:
            func, alignment = element_aligned(func)
        except Exception as e:  # noqa: BLE001 - TVM's parser raises several types; the aligned form works too
            log.debug(
                "%s: kept TVM's buffer alignment (its inputs are copied when misaligned): %s", s.symbol, e
            )
            alignment = TVM_ALIGNMENT  # the custom op copies the buffers less aligned than this
        func = func.with_attr("global_symbol", s.symbol)
        return tvm.tirx.build(tvm.IRModule({s.symbol: func}), target=target), alignment

    try:
        module, alignment = built(schedule_cpu(lowered).mod["main"])
        return module, True, alignment
    except Exception as e:  # noqa: BLE001 - a failed schedule must not fail the kernel
        log.debug("%s: scheduled build failed, building unscheduled loops: %s", s.symbol, e)
        module, alignment = built(lowered.func)
        return module, False, alignment


def element_aligned(func) -> tuple[object, int]:
    """``func`` with its buffer parameters declared aligned to their element (4 bytes for float32)
    instead of TVM's 64 bytes, so its code may be called on any buffer: a graph input fed from numpy
    starts 16 bytes past a 64-byte boundary, and a kernel compiled for TVM's alignment reads it
    through a copy (a GELU kernel on [128, 1024]: 36 us on aligned buffers, 85-160 us with the copy).
    On x86 an unaligned vector load of aligned memory costs the same as an aligned one.

    TVM keeps a buffer's alignment in its parameter's type and offers no primitive that changes it
    (``specialize`` refuses a different alignment), so the function goes through its TVMScript text:
    the signature's ``T.Buffer(shape, dtype)`` annotations gain ``align=``, and the text is parsed
    back. Returns the new function and the smallest alignment it declares; raises if the result does
    not declare the alignments asked for.
    """
    import tvm

    text = func.script()
    header = re.search(r"^def \w+\(.*?\):$", text, flags=re.MULTILINE | re.DOTALL)
    if header is None:
        raise ValueError("no function signature in the TVMScript text")

    def annotated(m: re.Match) -> str:
        return f'T.Buffer({m[1]}, "{m[2]}", align={tvm.runtime.DataType(m[2]).bits // 8})'

    signature = re.sub(r'T\.Buffer\((\([^()]*\)), "(\w+)"\)', annotated, header[0])
    out = tvm.script.from_source(text[: header.start()] + signature + text[header.end() :])
    wanted = [tvm.runtime.DataType(p.ty.dtype).bits // 8 for p in func.params]
    if len(out.params) != len(func.params) or [p.ty.data_alignment for p in out.params] != wanted:
        raise ValueError("the parsed function does not declare its buffers element-aligned")
    return out, min(wanted)


@functools.cache
def _disk_folder() -> Path:
    import tvm

    from einopt.codegen.build import resolve_target
    from einopt.runtime import kernels
    from einopt.runtime.cache import cache_dir

    h = hashlib.sha256()
    for part in (tvm.__version__, str(resolve_target("llvm")), " ".join(kernels.CFLAGS)):
        h.update(part.encode() + b"\0")
    for source in sorted([*CODEGEN.glob("*.py"), *CORE.glob("*.py"), kernels.SHIM_SOURCE]):
        h.update(source.read_bytes())
    return cache_dir() / "kernels" / h.hexdigest()[:16]
