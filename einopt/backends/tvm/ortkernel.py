"""A scope as a kernel that ONNX Runtime runs: described in the model, compiled by TVM on the machine
that runs it.

A model carries what to compute, never machine code. ``ort_kernel(scope)`` gives what an
``ai.einopt::TvmKernel`` node needs (see :mod:`einopt.backends.tvm.kernels`): the kernel's
:class:`KernelDescription` (its program in einopt's expression syntax, its input and output shapes and
its schedule, as one canonical JSON text, and the SHA-256 of that text), and the values to feed it,
in order. The scope's direct sources (input tensors and the nested scopes it reads, first read first)
become the kernel's parameters ``x000, x001, ...``; a nested scope is read as a tensor of its shape
(its traversal value ``v`` at array position ``v - lo``, as it is materialised). The scope's ``pad``
is dropped: the node's output is the scope's value, not a padded buffer.

:func:`library` compiles a description for this CPU (TVM's LLVM code linked with einopt's shim) into
a kernel library. Libraries are cached per process by the description's SHA-256, and on disk in the
user's cache directory (``kernels/<build fingerprint>/<sha256>.so``, the fingerprint covering TVM's
version, the target CPU, einopt's code generator, its IR and operations (their TVM forms), and the
shim), each file beside the SHA-256 of its bytes recorded when it was built: a file whose bytes differ
from the record, or that others could have written, is refused and built again.
:func:`read_description` parses a description back out of a node, checking it against its SHA-256 and
against what einopt itself would write for it.

``kernel_flops`` is the analytic work of a scope (the cost model's FLOPs of the node); it needs no TVM.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import re
import threading
from pathlib import Path

from einopt.backends.tvm.build import CFLAGS, SHIM_SOURCE, TVM_ALIGNMENT, NativeBuildError, link_kernels
from einopt.core import ir
from einopt.core.ops import BINARY, UNARY
from einopt.core.parser import parse
from einopt.core.rewrite import accesses
from einopt.core.syntax import format_expr
from einopt.runtime.cache import cache_dir, cache_folder, read_recorded, write_recorded

__all__ = [
    "KERNEL_FORMAT",
    "KernelDescription",
    "KernelDescriptionError",
    "KernelUnsupported",
    "OrtKernel",
    "StandIn",
    "build_id",
    "describe",
    "is_cached",
    "kernel_flops",
    "library",
    "ort_kernel",
    "ort_kernel_group",
    "read_description",
    "stand_in",
    "stand_in_group",
]

log = logging.getLogger(__name__)

CODEGEN = Path(__file__).resolve().parent
CORE = CODEGEN.parent / "core"  # the IR and its operations' TVM forms

KERNEL_FORMAT = "einopt-kernel/1"
"""The version of a description's layout (its ``format`` field)."""
SCHEDULES = ("cpu",)
"""The schedules a description may ask for (``cpu``: :func:`einopt.codegen.schedule.schedule_cpu`)."""


class KernelUnsupported(ValueError):
    """A scope that cannot be a generated kernel here (the message says why)."""


class KernelDescriptionError(ValueError):
    """A node's kernel description is damaged, altered, or not one einopt writes (the message says why)."""


@dataclasses.dataclass(frozen=True)
class KernelDescription:
    """What one ``TvmKernel`` node computes: ``program`` (reading the float32 tensors ``x000, x001,
    ...``, writing its outputs in order), as the canonical JSON ``text`` a node carries, and the
    SHA-256 of that text (hex), by which the kernel's compiled library is known everywhere."""

    program: ir.Program
    text: str
    sha256: str

    @property
    def symbol(self) -> str:
        """The kernel's entry point in its library (``__tvm_ffi_<symbol>``)."""
        return "einopt_" + self.sha256[:24]

    @property
    def inputs(self) -> tuple[tuple[int, ...], ...]:
        return tuple(t.shape for t in self.program.inputs)

    @property
    def outputs(self) -> tuple[tuple[int, ...], ...]:
        return tuple(self.program.scope(n).shape for n in self.program.outputs)


@dataclasses.dataclass(frozen=True)
class OrtKernel:
    """One kernel: its ``description``, called with ``sources`` (tensors and nested scopes, in order)
    and writing float32 outputs, the first of ``shape``."""

    description: KernelDescription
    sources: tuple[ir.Tensor | ir.Scope, ...]
    shape: tuple[int, ...]

    @property
    def symbol(self) -> str:
        return self.description.symbol


@dataclasses.dataclass(frozen=True)
class StandIn:
    """Scopes computed by one kernel: a program whose inputs are the scopes' outside sources as the
    tensors ``x000, x001, ...`` and whose bindings (``y0, y1, ...``) read one another."""

    program: ir.Program
    sources: tuple[ir.Tensor | ir.Scope, ...]

    @property
    def scope(self) -> ir.Scope:
        """The first scope (a one-scope stand-in's only one)."""
        return self.program.bindings[0][1]

    @property
    def symbol(self) -> str:
        return describe(self).symbol


def stand_in(scope: ir.Scope) -> StandIn:
    """``scope`` reading each distinct direct source (first read first) as a float32 tensor.

    Raises
    ------
    KernelUnsupported
        When a source is not float32 (einopt's ONNX Runtime operator takes float32 tensors).
    """
    return stand_in_group((scope,), (True,))


def stand_in_group(scopes: tuple[ir.Scope, ...], outputs: tuple[bool, ...]) -> StandIn:
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
    if not order:
        raise KernelUnsupported("it reads no tensor (a kernel reads at least one)")
    return StandIn(ir.Program(tuple(order.values()), tuple(bindings), written), tuple(order))


def describe(s: StandIn) -> KernelDescription:
    """The description of stand-in ``s`` (its CPU schedule), as a node carries it."""
    return _described(s.program)


@functools.lru_cache(maxsize=4096)
def _described(program: ir.Program) -> KernelDescription:
    text = _canonical(
        {
            "format": KERNEL_FORMAT,
            "program": format_expr(program),
            "inputs": [list(t.shape) for t in program.inputs],
            "outputs": [list(program.scope(n).shape) for n in program.outputs],
            "schedule": "cpu",
        }
    )
    return KernelDescription(program, text, hashlib.sha256(text.encode()).hexdigest())


def _canonical(fields: dict) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def read_description(text: str, sha256: str) -> KernelDescription:
    """The description ``text`` (a node's ``kernel`` attribute), checked: its SHA-256 is ``sha256``,
    and it is exactly what :func:`describe` writes for the program it holds (so one kernel has one
    text, and a parsed program is never anything einopt would not have written).

    Raises
    ------
    KernelDescriptionError
        What is wrong with it, in one line.
    """
    if hashlib.sha256(text.encode()).hexdigest() != sha256:
        raise KernelDescriptionError(
            "its description does not match its SHA-256 (the file was altered or damaged)"
        )
    try:
        fields = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise KernelDescriptionError(f"its description is not JSON ({e})") from None
    if not isinstance(fields, dict) or fields.get("format") != KERNEL_FORMAT:
        found = fields.get("format") if isinstance(fields, dict) else None
        raise KernelDescriptionError(
            f"its description is of format {found!r}; this einopt reads {KERNEL_FORMAT!r} (optimize the "
            "original model again with this einopt)"
        )
    if fields.get("schedule") not in SCHEDULES:
        raise KernelDescriptionError(
            f"its description asks for an unknown schedule {fields.get('schedule')!r}"
        )
    program_text = fields.get("program")
    if not isinstance(program_text, str):
        raise KernelDescriptionError("its description has no program")
    try:
        program = parse(program_text)
    except Exception as e:  # noqa: BLE001 - the text is the file's: whatever it makes the parser raise is its fault
        raise KernelDescriptionError(f"its program does not parse: {e}") from None
    if not isinstance(program, ir.Program):
        raise KernelDescriptionError("its program is a single expression, not a program")
    expected = [ir.Tensor(f"x{i:03d}", t.shape, "float32") for i, t in enumerate(program.inputs)]
    if list(program.inputs) != expected:
        raise KernelDescriptionError("its program's inputs are not the float32 tensors x000, x001, ...")
    d = _described(program)
    if d.text != text:
        raise KernelDescriptionError("its description is not the one einopt writes for its program")
    return d


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


def ort_kernel(scope: ir.Scope, build: bool = True) -> OrtKernel:
    """``scope`` as a kernel, compiled for this CPU now unless ``build`` is False (cached per process
    and on disk; a session builds what was not built, see :func:`einopt.backends.tvm.kernels.prepare`).

    Raises
    ------
    KernelUnsupported
        When the scope cannot be a kernel (see :func:`stand_in`).
    einopt.backends.tvm.build.NativeBuildError
        When there is no C compiler to link the library with, or linking fails.
    """
    return _kernel(stand_in(scope), scope.shape, build)


def ort_kernel_group(
    scopes: tuple[ir.Scope, ...], outputs: tuple[bool, ...], build: bool = True
) -> OrtKernel:
    """``scopes`` (see :func:`stand_in_group`) as one kernel writing the scopes ``outputs`` marks, in
    order (``shape`` is the first one's; built like :func:`ort_kernel`)."""
    return _kernel(stand_in_group(scopes, outputs), scopes[0].shape, build)


def _kernel(s: StandIn, shape: tuple[int, ...], build: bool) -> OrtKernel:
    d = describe(s)
    if build:
        library(d)
    return OrtKernel(d, s.sources, shape)


_CACHE: dict[str, bytes] = {}  # description's SHA-256 -> its library
_LOCK = threading.Lock()


def library(d: KernelDescription) -> bytes:
    """The kernel library of ``d`` for this CPU (shared-object bytes exporting ``__tvm_ffi_<symbol>``),
    from this process's cache, else from einopt's disk cache (checked), else built now.

    Raises
    ------
    einopt.backends.tvm.build.NativeBuildError
        When there is no C compiler to link the library with, or linking fails.
    einopt.runtime.cache.CacheTrustError
        When the cache folder is not private to this user.
    """
    with _LOCK:
        done = _CACHE.get(d.sha256)
        if done is None:
            done = _CACHE[d.sha256] = _library(d)
    return done


def is_cached(d: KernelDescription) -> bool:
    """Whether the library of ``d`` is in this process's cache or on disk (not checked here: loading it
    checks it)."""
    if d.sha256 in _CACHE:
        return True
    return (cache_dir() / "kernels" / build_id() / f"{d.sha256}.so").is_file()


def _library(d: KernelDescription) -> bytes:
    folder = cache_folder("kernels", build_id())
    path, record = folder / f"{d.sha256}.so", folder / f"{d.sha256}.sha256"
    found = read_recorded(path, record, "the cached kernel library")
    if found is not None:
        return found
    log.info("compiling kernel %s for this CPU", d.symbol)
    module, scheduled, alignment = _build(d)
    library = link_kernels([module], alignment=alignment)
    if scheduled:  # an unscheduled build is a fallback; it is tried again next time
        write_recorded(path, record, library)
    return library


def _build(d: KernelDescription) -> tuple[object, bool, int]:
    """The TVM module of ``d``, whether its loops are scheduled, and the alignment (bytes) its code
    assumes of its buffers."""
    import tvm

    # TVM (build, schedule, te import it): loaded only when a kernel is built
    from einopt.codegen.build import resolve_target
    from einopt.codegen.schedule import schedule_cpu
    from einopt.codegen.te import lower

    lowered = lower(d.program)
    target = resolve_target("llvm")
    symbol = d.symbol

    def built(func) -> tuple[object, int]:
        try:
            func, alignment = element_aligned(func)
        except Exception as e:  # noqa: BLE001 - TVM's parser raises several types; the aligned form works too
            log.debug(
                "%s: kept TVM's buffer alignment (its inputs are copied when misaligned): %s", symbol, e
            )
            alignment = TVM_ALIGNMENT  # the custom op copies the buffers less aligned than this
        func = func.with_attr("global_symbol", symbol)
        return tvm.tirx.build(tvm.IRModule({symbol: func}), target=target), alignment

    try:
        module, alignment = built(schedule_cpu(lowered).mod["main"])
        return module, True, alignment
    except Exception as e:  # noqa: BLE001 - a failed schedule must not fail the kernel
        log.debug("%s: scheduled build failed, building unscheduled loops: %s", symbol, e)
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
def build_id() -> str:
    """What a compiled kernel depends on besides its description (TVM's version, the target CPU,
    einopt's code generator, IR and shim), as a short digest: the name of the disk cache's folder."""
    try:
        import tvm
    except ImportError as e:
        raise NativeBuildError(
            f"einopt's generated kernels are compiled by TVM on the machine that runs the model, and TVM "
            f"cannot be imported here ({e}): install it (pip install apache-tvm), or use --kernels onnx"
        ) from None

    # TVM (build, schedule, te import it): loaded only when a kernel is built
    from einopt.codegen.build import resolve_target

    h = hashlib.sha256()
    for part in (tvm.__version__, str(resolve_target("llvm")), " ".join(CFLAGS)):
        h.update(part.encode() + b"\0")
    for source in sorted([*CODEGEN.glob("*.py"), *CORE.glob("*.py"), SHIM_SOURCE]):
        h.update(source.read_bytes())
    return h.hexdigest()[:16]
