"""Rewrites written for every value of a model's symbolic dimensions, not only the searched one.

A model with symbolic dimensions is searched pinned to their representative values
(:mod:`einopt.frontend.symbolic`), so a rewrite's nodes carry integer constants of that shape: a
Reshape to ``[1, 128, 2, 64]`` for a batch of 1 and a sequence of 128. To learn which constants are
sizes of which dimension, the model is prepared and translated a second time at a *probe*: other
values of every symbolic dimension (the odd ones the output is verified at). A part's candidate is
derived there again (its derivation replayed step by step; a step that does not apply at the probe
means the rewrite depends on a dimension's value, such as a split that needs it even) and
instantiated. Where the two instantiations are the same nodes but for integer constants, each such
constant entry is solved as ``c * d1^e1 * d2^e2 ...`` over the dimensions (it must fit both shapes
exactly) and written as run-time arithmetic on the ``Shape`` of one of the part's inputs (a
Reshape's one remaining symbolic entry as ``-1``). Whatever does not fit (a different choice of
operators at the probe, a float constant of the searched size, a size that is no such product, an
eOperator function written for the shape) keeps the representative constants, and the check that
follows (:meth:`~einopt.stages.context.StageContext.shape_specific`) leaves it out with the reason.
The result is verified, like every rewrite, at the representative shape and at each checked one.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np
import onnx
from onnx import helper, numpy_helper

from einopt.core import ir
from einopt.core.parser import parse
from einopt.core.rewrite import rename_tensors
from einopt.frontend.onnx_graph import FreshNames
from einopt.frontend.translate import Part
from einopt.instantiate.backend import Backend
from einopt.instantiate.emit import Instantiated, instantiate, original_ops
from einopt.instantiate.program import as_program
from einopt.rules import get as get_rule
from einopt.rules.base import Context
from einopt.rules.derive import Apply, DerivationError, TraceStep, apply_rule
from einopt.search.normal import normalize
from einopt.search.results import Candidate
from einopt.search.schedule import DEFAULT_SCHEDULE
from einopt.stages.partsearch import canonical_names

__all__ = ["Probe", "generalized"]

log = logging.getLogger(__name__)

MAX_EXPONENT = 2
"""A size is solved as a product of dimensions each at most this power (``sequence * sequence`` for
attention scores flattened)."""


@dataclasses.dataclass(frozen=True)
class Translation:
    """The model prepared and translated at one assignment of its symbolic dimensions.

    Parameters
    ----------
    values : mapping
        Dimension name -> its value here (each differs from its representative one).
    model : onnx.ModelProto
        The model prepared at ``values``.
    parts : mapping
        Part name -> the part translated here, for the parts cut from the same nodes as at the
        representative values.
    """

    values: Mapping[str, int]
    model: onnx.ModelProto
    parts: Mapping[str, Part]

    def text(self) -> str:
        return ", ".join(f"{n}={v}" for n, v in self.values.items())


@dataclasses.dataclass(frozen=True)
class Probe:
    """The model translated at other values of its symbolic dimensions: sizes are solved from the
    first (``at[0]``, the odd check values) and must hold at the others (a larger value each: two
    small values can agree by accident, :func:`~einopt.frontend.symbolic.second_probe`)."""

    rep: Mapping[str, int]  # dimension name -> its representative value (what the parts were searched at)
    at: tuple[Translation, ...]

    @property
    def values(self) -> Mapping[str, int]:
        return self.at[0].values

    @classmethod
    def of(cls, rep: Mapping[str, int], translations, searched) -> Probe:
        """The probe of ``translations`` (``(values, model, parts)`` each, the parts translated from
        ``model`` at ``values``) for the ``searched`` parts (translated at ``rep``): of each, the parts
        cut from the same nodes, with a program of the same inputs."""
        mine = {p.name: p for p in searched if p.program is not None}
        at = []
        for values, model, parts in translations:
            same = {
                p.name: p
                for p in parts
                if p.program is not None
                and p.name in mine
                and p.nodes == mine[p.name].nodes
                and [t.name for t in p.program.inputs] == [t.name for t in mine[p.name].program.inputs]
            }
            at.append(Translation(dict(values), model, same))
        return cls(dict(rep), tuple(at))

    def text(self) -> str:
        return self.at[0].text()


def generalized(
    probe: Probe, part: Part, candidate: Candidate, inst: Instantiated, *, opset: int, taken, backend: Backend
) -> tuple[Instantiated, str]:
    """``inst`` (``candidate`` of ``part`` instantiated at the representative values) with its integer
    constants that are sizes of symbolic dimensions computed at run time, and "" ; or ``inst`` as it
    is and why it could not be (it is then checked, and left out, as written)."""
    if candidate.trace:  # the replay must give the candidate's own program at the representative values
        again = _replay(part.program, part.constants, candidate.trace)
        if isinstance(again, str) or str(again) != str(candidate.program):
            return inst, "its derivation is not replayed as the search took it"
    others: list[tuple[Translation, Instantiated]] = []
    for t in probe.at:
        there = t.parts.get(part.name)
        if there is None:  # an empty Slice there, say: what it computes depends on the values
            return inst, f"the part is cut or translated otherwise at {t.text()}"
        program = (
            _replay(there.program, there.constants, candidate.trace) if candidate.trace else there.program
        )
        if isinstance(program, str):
            return inst, f"{program} (at {t.text()})"
        try:
            other = instantiate(
                program,
                onnx_names=there.names,
                constants=there.constants,
                opset=opset,
                prefix=part.name + "/",
                taken_function_names=taken,
                preferred=original_ops(t.model, there) if not candidate.trace else None,
                backend=backend,
            )
        except Exception as e:  # noqa: BLE001 - the rewrite then stays as written, and is checked so
            return inst, f"not instantiated at {t.text()}: {e}"
        others.append((t, other))
    names = list(probe.rep)
    sizes = _Sizes(names, [(probe.rep[n], *(t.values[n] for t, _ in others)) for n in names])
    sources = _sources(part, [t.parts[part.name] for t, _ in others], sizes)
    return _rewritten(
        inst, [i for _, i in others], sizes, sources, part.name + "/", [t.text() for t, _ in others]
    )


# --------------------------------------------------------------------------
# The candidate at the probe: its derivation replayed
# --------------------------------------------------------------------------


def _replay(program: ir.Program, constants, trace: Sequence[TraceStep]) -> ir.Program | str:
    names = canonical_names(program)
    canon = {names[n]: v for n, v in constants.items() if n in names}
    ctx = Context(canon)
    current = normalize(as_program(parse(str(rename_tensors(program, names)))), ctx, DEFAULT_SCHEDULE)
    for step in trace:
        try:
            new, _ = apply_rule(current, Apply(step.rule, step.where, step.summary), ctx)
        except DerivationError:
            new = _by_form(current, step, ctx)
            if new is None:
                return f"{step.rule} at {step.where} does not apply"
        current = normalize(new, ctx, DEFAULT_SCHEDULE)
    return rename_tensors(current, {v: n for n, v in names.items()})


_NUMBER = re.compile(r"\d+")


def _by_form(program: ir.Program, step: TraceStep, ctx: Context) -> ir.Program | None:
    """The one match of ``step``'s rule at its place whose summary is the step's but for its numbers
    (sizes differ at the probe); None when there is not exactly one."""
    rule = get_rule(step.rule)
    form = _NUMBER.sub("#", step.summary)
    fits = [
        m
        for m in rule.match(program, ctx)
        if getattr(m, "where", None) == step.where and _NUMBER.sub("#", getattr(m, "summary", "")) == form
    ]
    return rule.apply(program, fits[0], ctx) if len(fits) == 1 else None


# --------------------------------------------------------------------------
# Sizes as products of dimensions
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Sizes:
    """Dimension names and each one's values: representative first, then at each probe."""

    names: list[str]
    values: list[tuple[int, ...]]

    def solve(self, *at: int) -> tuple[Fraction, tuple[int, ...]] | None:
        """``(c, exponents)`` with the size ``at[k]`` (representative first, then each probe's)
        ``c * prod(dim ** e)`` at every one of the values (exponents all 0 for a size equal at all;
        ``c`` a fraction for half a sequence, which the probes have only where the user declares
        even values); None when no product, or more than one of the fewest factors, fits."""
        n = len(self.values)
        if len(set(at)) == 1:
            return Fraction(at[0]), (0,) * n
        fits = []
        for e in itertools.product(range(MAX_EXPONENT + 1), repeat=n):
            powers = [
                math.prod(v[k] ** p for v, p in zip(self.values, e, strict=True)) for k in range(len(at))
            ]
            c = Fraction(at[0], powers[0])
            if any(e) and all(c * w == a for w, a in zip(powers, at, strict=True)):
                fits.append((sum(e), c, e))
        if not fits:
            return None
        fewest = min(f[0] for f in fits)
        best = [f for f in fits if f[0] == fewest]
        return (best[0][1], best[0][2]) if len(best) == 1 else None


@dataclasses.dataclass(frozen=True)
class _Sources:
    """Where a rewrite reads sizes: ``dims`` lists ``(ONNX name, axis, exponents)`` of each dimension
    of the part's run-time inputs that is a product of symbolic dimensions (coefficient 1);
    ``shapes`` gives each such input's whole shape, solved (a Reshape back to it reads its
    ``Shape``)."""

    dims: list[tuple[str, int, tuple[int, ...]]]
    shapes: dict[str, list[tuple[Fraction, tuple[int, ...]]]]


def _sources(part: Part, probed: Sequence[Part], sizes: _Sizes) -> _Sources:
    at = [{t.name: t.shape for t in p.program.inputs} for p in probed]
    dims, shapes = [], {}
    for t in part.program.inputs:
        if t.name in part.constants or t.name not in part.names or any(t.name not in s for s in at):
            continue
        name = part.names[t.name]
        fits = [sizes.solve(r, *(s[t.name][axis] for s in at)) for axis, r in enumerate(t.shape)]
        for axis, fit in enumerate(fits):
            if fit is not None and fit[0] == 1 and any(fit[1]):
                dims.append((name, axis, fit[1]))
        if all(f is not None for f in fits):
            shapes.setdefault(name, fits)
    return _Sources(dims, shapes)


# --------------------------------------------------------------------------
# The instantiation with its sizes computed
# --------------------------------------------------------------------------


def _rewritten(
    inst: Instantiated, others: list[Instantiated], sizes: _Sizes, sources, prefix: str, where: list[str]
) -> tuple[Instantiated, str]:
    slots: set[tuple[int, int]] = set()
    for k, other in enumerate(others):
        differing = _differing(inst, other)
        if isinstance(differing, str):
            return inst, f"{differing} at {where[k]}"
        slots |= differing  # a slot equal at one probe may differ at the next
    if not slots:
        return inst, ""
    values = {key: _slot_values(inst, others, key) for key in sorted(slots)}
    writer = _Writer(inst, sources, prefix)
    nodes = [_copy(n) for n in inst.nodes]
    for (i, j), vectors in values.items():
        entries = [sizes.solve(*(int(v) for v in column)) for column in zip(*vectors, strict=True)]
        if any(e is None for e in entries):
            bad = next(
                column for column, e in zip(zip(*vectors, strict=True), entries, strict=True) if e is None
            )
            seen = "; ".join(f"at {w}: {int(v)}" for w, v in zip(where, bad[1:], strict=True))
            return (
                inst,
                f"a size {int(bad[0])} ({seen}) in {nodes[i].op_type} is no product of the symbolic dimensions",
            )
        reshape = nodes[i].op_type == "Reshape" and j == 1 and not _allowzero(nodes[i])
        value = writer.vector(entries, infer_one=reshape)
        if value is None:
            return inst, f"no input of the part gives the sizes of {nodes[i].op_type} {nodes[i].name}"
        nodes[i].input[j] = value
    read = {x for n in (*writer.nodes, *nodes) for x in n.input}
    inits = [
        t
        for t in (*inst.initializers, *writer.inits)
        if t.name in read or t.data_type != onnx.TensorProto.INT64
    ]
    return dataclasses.replace(inst, nodes=(*writer.nodes, *nodes), initializers=tuple(inits)), ""


def _slot_values(inst: Instantiated, others: list[Instantiated], key: tuple[int, int]) -> list[np.ndarray]:
    """The integer vector node ``key[0]`` reads at input ``key[1]`` in ``inst`` and in each of
    ``others`` (the same nodes but for such constants)."""
    i, j = key
    out = []
    for x in (inst, *others):
        name = x.nodes[i].input[j]
        out.append(next(numpy_helper.to_array(t) for t in x.initializers if t.name == name))
    return out


def _differing(a: Instantiated, b: Instantiated) -> set[tuple[int, int]] | str:
    """The input slots ``(node, input)`` where ``a`` reads an integer constant and ``b`` (the same nodes
    otherwise) another of the same length; why not, when the nodes differ otherwise."""
    if len(a.nodes) != len(b.nodes) or [n.op_type for n in a.nodes] != [n.op_type for n in b.nodes]:
        return "written with other operators"
    if [f.SerializeToString() for f in a.functions] != [f.SerializeToString() for f in b.functions]:
        return "an eOperator written for the searched shape"
    va = {t.name: numpy_helper.to_array(t) for t in a.initializers}
    vb = {t.name: numpy_helper.to_array(t) for t in b.initializers}
    same: dict[str, str] = {}  # b's value names -> a's
    out = set()
    for i, (na, nb) in enumerate(zip(a.nodes, b.nodes, strict=True)):
        if (na.domain, len(na.input), len(na.output)) != (nb.domain, len(nb.input), len(nb.output)):
            return "written with other operators"
        if [x.SerializeToString() for x in na.attribute] != [x.SerializeToString() for x in nb.attribute]:
            return f"{na.op_type} {na.name} has other attributes"
        for j, (x, y) in enumerate(zip(na.input, nb.input, strict=True)):
            if (x in va) != (y in vb):
                return f"{na.op_type} {na.name} reads other values"
            if x not in va:
                if same.get(y, y) != x:
                    return f"{na.op_type} {na.name} reads other values"
                continue
            u, v = va[x], vb[y]
            if u.dtype == v.dtype and u.shape == v.shape and np.array_equal(u, v):
                continue
            if u.dtype != np.int64 or u.ndim != 1 or u.shape != v.shape:
                return f"{na.op_type} {na.name} reads a constant of the searched shape"
            out.add((i, j))
        same.update(zip(nb.output, na.output, strict=True))
    return out


def _allowzero(node: onnx.NodeProto) -> bool:
    return any(a.name == "allowzero" and a.i for a in node.attribute)


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


class _Writer:
    """Nodes computing integer vectors from the ``Shape`` of the part's inputs (each written once)."""

    def __init__(self, inst: Instantiated, sources, prefix: str) -> None:
        taken = {x for n in inst.nodes for x in (*n.input, *n.output, n.name)}
        taken |= {t.name for t in inst.initializers}
        self.names = FreshNames(taken)
        self.sources = sources
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.memo: dict[tuple, str] = {}

    def vector(self, entries: list[tuple[Fraction, tuple[int, ...]]], infer_one: bool) -> str | None:
        """The 1-D int64 value of ``entries`` (each ``(c, exponents)``): an input's ``Shape`` when they
        are its shape; with ``infer_one`` (a Reshape's target) the most composite symbolic entry
        ``-1``."""
        whole = next((src for src, shape in self.sources.shapes.items() if shape == entries), None)
        if whole is not None:
            return self.node("Shape", [whole], "shape_of")
        symbolic = [k for k, (_, e) in enumerate(entries) if any(e)]
        if infer_one and symbolic:
            k = max(symbolic, key=lambda k: (sum(entries[k][1]), k))
            entries = [
                (Fraction(-1), (0,) * len(entries[k][1])) if i == k else x for i, x in enumerate(entries)
            ]
        pieces: list[str] = []
        run: list[int] = []
        for c, e in entries:
            if not any(e):
                run.append(int(c))
                continue
            if run:
                pieces.append(self.constant(run))
                run = []
            piece = self.size(c, e)
            if piece is None:
                return None
            pieces.append(piece)
        if run:
            pieces.append(self.constant(run))
        if len(pieces) == 1:
            return pieces[0]
        return self.node("Concat", pieces, "sizes", axis=0)

    def size(self, c: Fraction, e: tuple[int, ...]) -> str | None:
        """A ``[1]`` value: ``c`` times the product of the dimensions to the powers ``e`` (a fraction
        as a multiplication and an exact division)."""
        factors = self._cover(e)
        if factors is None:
            return None
        value = self.node("Mul", factors[:2], "size") if len(factors) > 1 else factors[0]
        for f in factors[2:]:
            value = self.node("Mul", [value, f], "size")
        if c.numerator != 1:
            value = self.node("Mul", [value, self.constant([c.numerator])], "size")
        if c.denominator != 1:
            value = self.node("Div", [value, self.constant([c.denominator])], "size")
        return value

    def _cover(self, e: tuple[int, ...]) -> list[str] | None:
        """Dimension values (``[1]`` each) whose product is the dimensions to the powers ``e``."""
        left, out = list(e), []
        for src, axis, have in sorted(self.sources.dims, key=lambda s: -sum(s[2])):
            while any(left) and all(h <= k for h, k in zip(have, left, strict=True)):
                out.append(self.dimension(src, axis))
                left = [k - h for h, k in zip(have, left, strict=True)]
        return out if not any(left) else None

    def dimension(self, src: str, axis: int) -> str:
        shape = self.node("Shape", [src], "shape_of")
        return self.node("Gather", [shape, self.constant([axis])], "dim", axis=0)

    def constant(self, values: list[int]) -> str:
        key = ("const", tuple(values))
        if key not in self.memo:
            name = self.names.fresh(self.prefix + "sizes_const")
            self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
            self.memo[key] = name
        return self.memo[key]

    def node(self, op_type: str, inputs: list[str], base: str, **attrs) -> str:
        key = (op_type, tuple(inputs), tuple(sorted(attrs.items())))
        if key not in self.memo:
            out = self.names.fresh(self.prefix + base)
            name = self.names.fresh(self.prefix + base + "_node")
            self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
            self.memo[key] = out
        return self.memo[key]
