"""Which bindings one generated kernel with several outputs computes (``--kernels tvm``).

Kernel fusion (:mod:`einopt.backends.tvm.kernelfusion`) inlines an element-wise
producer into its one element-wise reader. What it leaves apart is a producer
that is an output, or read by several: the LSTM cell's ``c' = f * c + i * g``
is an output and ``h' = o * tanh(c')`` reads it. Two kernels would write
``c'`` and read it back, each called by ONNX Runtime on its own; one kernel
with two outputs computes both in one call (:func:`einopt.backends.tvm.ortkernel.ort_kernel_group`).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping

from einopt.core import ir
from einopt.core.rewrite import accesses
from einopt.rules.fusion import program_reads

__all__ = ["kernel_groups", "convex"]


def kernel_groups(
    program: ir.Program, constants: Collection[str] = (), reductions: Collection[str] = ()
) -> list[tuple[str, ...]]:
    """Bindings that one generated kernel with several outputs computes: element-wise bindings of one
    shape where one reads another (what fusion leaves apart because the one read is an output, or read
    by several: the LSTM cell's ``c'`` and ``h' = o * tanh(c')``), and a reduction with the
    element-wise work after it (an OffsetReduce with its bias and activation).

    A binding qualifies when it has no reduction and no padding, does arithmetic (not only a view of
    its input) and reads a tensor that is not in ``constants`` (a scope of constants only is computed
    when the model is written). A binding in ``reductions`` (reductions that no predefined operator
    computes: generated kernels in any case) joins the group of the one binding that reads it, when
    that one qualifies and has its shape; it stays inside the kernel. Groups are the connected sets
    of such bindings, in binding order, of two or more, with no other binding on a path between two
    of their members.
    """
    names = program.names()
    shape_of = {n: s.shape for n, s in program.bindings}
    eligible = {
        n
        for n, s in program.bindings
        if _kernel_work(s)
        and names.get(s) == n
        and not {t.name for t in ir.input_tensors(s)} <= set(constants)
    }
    parent = {n: n for n in eligible | set(reductions)}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    reads = program_reads(program)
    readers: dict[str, set[str]] = {}
    for consumer, rs in reads.items():
        for r in rs:
            readers.setdefault(r, set()).add(consumer)
    for consumer in eligible:
        for producer in reads.get(consumer, ()):
            if shape_of.get(producer) != shape_of[consumer]:
                continue
            if producer in eligible or (
                producer in reductions and producer not in program.outputs and readers[producer] == {consumer}
            ):
                parent[root(producer)] = root(consumer)
    groups: dict[str, list[str]] = {}
    for n, _ in program.bindings:
        if n in parent:
            groups.setdefault(root(n), []).append(n)
    return [tuple(g) for g in groups.values() if len(g) >= 2 and convex(g, readers)]


def _kernel_work(scope: ir.Scope) -> bool:
    """Element-wise arithmetic (a scope nested in it that reads a member of its group is refused
    when the kernel is built: :func:`einopt.backends.tvm.ortkernel.stand_in_group`)."""
    if scope.summation or scope.pad or not accesses(scope.body):
        return False
    return any(isinstance(e, (ir.Binary, ir.Unary)) for e in ir.walk(scope.body, stop=ir.Access))


def convex(members: Collection[Hashable], readers: Mapping[Hashable, Iterable[Hashable]]) -> bool:
    """Whether no item outside ``members`` reads a member (perhaps through other outside items) and is
    read by one, in the graph where ``readers[x]`` are the items that read ``x``: a group of them can
    then be replaced as one unit without a cycle."""
    inside = set(members)
    seen: set[Hashable] = set()
    todo = [r for m in inside for r in readers.get(m, ()) if r not in inside]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for r in readers.get(n, ()):
            if r in inside:
                return False
            todo.append(r)
    return True
