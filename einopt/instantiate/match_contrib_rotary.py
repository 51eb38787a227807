"""ONNX Runtime's com.microsoft ``RotaryEmbedding``: rotary position embeddings in the half-split form.

For each head vector ``x`` of ``H = 2h`` elements at sequence position ``p`` the operator writes
(``interleaved = 0``, the GPT-NeoX and LLaMA form; the interleaved GPT-J form is not matched)::

    out[d] = x[d] * cos[p, d]     - x[d + h] * sin[p, d]         d <  h
    out[d] = x[d] * cos[p, d - h] + x[d - h] * sin[p, d - h]     d >= h

Exporters write it as ``x * C + rotate_half(x) * S`` with ``rotate_half(x) = concat(-x[h:], x[:h])``
and constant tables ``C``, ``S`` over the positions and the head whose halves repeat
(``cat(freqs, freqs)``). In the IR the concatenation reads ``x`` at ``d + h`` and ``d - h`` (reads
outside ``x`` are 0), so the body is linear in three reads of one input ``X``::

    out[.., s, d] = X[.., d] * A[s, d] + X[.., d + h] * B[s, d] + X[.., d - h] * B'[s, d]

The matcher finds ``X`` and the turned dimension ``d`` from the reads' indices, then computes the
coefficient tables by evaluating the body with one read of ``X`` set to ones and the others to
zeros (the constants' values come from the context: whether the operator computes the body depends
on them), on one position of every dimension but ``s`` and ``d``, and checks them: the body is
linear in the reads (random values agree with the tables), the tables do not depend on the other
dimensions, ``A``'s halves repeat and ``B'[s, d] = -B[s, d - h]``. The caches are ``A[:, :h]`` and
``B'[:, h:]`` (compile-time initializers); positions ``0 .. S-1`` are the offset 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np

from einopt.core import ir
from einopt.core.index import linear_form
from einopt.core.interp import evaluate
from einopt.core.rewrite import accesses
from einopt.instantiate.match_contrib_act import flat_elementwise
from einopt.instantiate.plan import (
    CONTRIB_DOMAIN,
    NO_MATCH_CONTEXT,
    Literal,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
)
from einopt.instantiate.views import arranged, finish, simple_view

__all__ = ["ROTARY_MATCHERS", "match_rotary_embedding", "turns_half"]

RTOL = 1e-6
"""How closely the tables must repeat and the body agree with them (float64, relative to their scale)."""


@dataclasses.dataclass(frozen=True, eq=False)
class _Rotation:
    """The structure of a rotation: ``X`` read at its own positions, the turned dimension, and the
    reads of ``X`` by the offset of their ``d`` index (``0``, ``+h``, ``-h``)."""

    x: ir.Access
    turn: ir.Iter
    reads: dict[int, tuple[ir.Access, ...]]


def _offset(a: ir.Access, b: ir.Access) -> tuple[int, int] | None:
    """``(position, c)`` when ``b`` reads ``a``'s source at ``a``'s indices but one, shifted by ``c``."""
    if a.source is not b.source:
        return None
    found = None
    for k, (ea, eb) in enumerate(zip(a.indices, b.indices, strict=True)):
        if ea is eb:
            continue
        la, lb = linear_form(ea), linear_form(eb)
        if found is not None or dict(la.coeffs) != dict(lb.coeffs) or dict(la.atoms) != dict(lb.atoms):
            return None
        found = (k, lb.const - la.const)
    return found


def _rotation(body: ir.ValueExpr, traversal: tuple[ir.Iter, ...], ctx: MatchContext) -> _Rotation | Refusal:
    reads = list(dict.fromkeys(accesses(body)))
    xs = [a for a in reads if not ctx.is_constant(a.source)]
    if len({a.source for a in xs}) != 1:
        return Refusal(f"reads {len({a.source for a in xs})} inputs: RotaryEmbedding rotates one")
    for base in xs:
        view = simple_view(base)
        if isinstance(view, Refusal) or set(view.labels) != set(traversal):
            continue
        shifts = [_offset(base, b) for b in xs if b is not base]
        if any(s is None for s in shifts) or len({k for k, _ in shifts}) != 1:
            continue
        k = shifts[0][0]
        half = {abs(c) for _, c in shifts}
        if len(half) != 1 or 0 in half:
            continue
        (h,) = half
        turn = next(
            (it for it, c in linear_form(base.indices[k]).coeffs if c == 1 and it.extent == 2 * h), None
        )
        if turn is None or turn not in traversal:
            continue
        by_offset: dict[int, tuple[ir.Access, ...]] = {0: (base,)}
        for b, (_, c) in zip([b for b in xs if b is not base], shifts, strict=True):
            by_offset[c] = by_offset.get(c, ()) + (b,)
        return _Rotation(base, turn, by_offset)
    return Refusal("does not read one input at its own positions and half a dimension either side")


def turns_half(scope: ir.Scope, reach: int = 0) -> bool:
    """Whether element-wise ``scope``, or an element-wise scope it reads at most ``reach`` deep, reads
    a source at an index shifted by half its iterator's extent (``X[.., d + h]``, ``d`` of extent
    ``2h``): the cheap test before the matcher."""
    if scope.summation or reach < 0:
        return False
    for a in accesses(scope.body):
        for e in a.indices:
            lf = linear_form(e)
            if lf.const and any(c == 1 and 2 * abs(lf.const) == it.extent for it, c in lf.coeffs):
                return True
    return any(
        isinstance(a.source, ir.Scope) and turns_half(a.source, reach - 1) for a in accesses(scope.body)
    )


@dataclasses.dataclass(frozen=True, eq=False)
class _Tables:
    """The checked caches ``[S, h]`` and the sequence iterator they vary with (None: they do not)."""

    cos: np.ndarray
    sin: np.ndarray
    position: ir.Iter | None


def _digest(arrays: list[np.ndarray]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(str((a.dtype, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _probed(scope: ir.Scope, rot: _Rotation) -> tuple[ir.Scope, dict[int, ir.Tensor]]:
    """``scope`` with each read of ``X`` replaced by a read of a probe tensor of ``X``'s shape at the
    same indices (one probe per offset; reads outside it stay 0)."""
    shape = tuple(rot.x.source.shape)
    probes = {c: ir.Tensor(f"rotary_probe_{k}", shape, "float32") for k, c in enumerate(sorted(rot.reads))}
    mapping = {a: ir.Access(probes[c], a.indices) for c, group in rot.reads.items() for a in group}
    return ir.Scope(scope.traversal, (), _replace(scope.body, mapping)), probes


def _replace(e: ir.ValueExpr, mapping: dict[ir.Access, ir.Access]) -> ir.ValueExpr:
    if isinstance(e, ir.Access):
        return mapping.get(e, e)
    return ir.rebuild(e, lambda x: _replace(x, mapping))


def _tables(
    probed: ir.Scope, probes: dict[int, ir.Tensor], rot: _Rotation, values: dict[str, np.ndarray]
) -> _Tables | Refusal:
    """The coefficient tables of the probed body, checked to be RotaryEmbedding's (module docstring)."""
    # The sequence dimension: the one the tables vary with besides the turned one.
    read = {it for a in accesses(probed.body) if a.source not in probes.values() for it in a.iters()}
    varying = [it for it in probed.traversal if it in read and it is not rot.turn and it.extent > 1]
    if len(varying) > 1:
        return Refusal(
            f"its tables vary with {len(varying)} dimensions besides the head's: RotaryEmbedding's with one"
        )
    position = varying[0] if varying else None
    # One position of every other dimension: the tables do not read them.
    box = tuple(
        (it.lo, it.hi) if it in (rot.turn, position) else (it.lo, it.lo + 1) for it in probed.traversal
    )

    def at(arrays: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(evaluate(probed, values | arrays, box=box), dtype=np.float64)

    zeros = {p.name: np.zeros(p.shape) for p in probes.values()}
    constant = at(zeros)
    coef = {c: at(zeros | {p.name: np.ones(p.shape)}) - constant for c, p in probes.items()}
    rng = np.random.default_rng(0)
    sample = {p.name: rng.standard_normal(p.shape) for p in probes.values()}
    want = constant.copy()
    for c, p in probes.items():
        (a, *_) = rot.reads[c]
        reads = ir.Scope(probed.traversal, (), ir.Access(p, a.indices))  # the probe as the body reads it
        want += coef[c] * np.asarray(evaluate(reads, sample, box=box), dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(want))))
    if np.any(np.abs(constant) > RTOL * scale) or not np.allclose(
        at(sample), want, rtol=RTOL, atol=RTOL * scale
    ):
        return Refusal("is not linear in its reads of the input (or adds a term of its own)")
    return _check(coef, probed.traversal, rot.turn, position)


def _check(
    coef: dict[int, np.ndarray], traversal: tuple[ir.Iter, ...], turn: ir.Iter, position: ir.Iter | None
) -> _Tables | Refusal:
    """RotaryEmbedding's caches from the coefficient tables of the reads at offsets 0, +h and -h."""
    h = turn.extent // 2
    order = ([traversal.index(position)] if position is not None else []) + [traversal.index(turn)]

    def plane(c: int) -> np.ndarray:
        """The table of offset ``c`` as ``[S, H]`` (zeros where the body has no such read)."""
        a = coef.get(c, np.zeros_like(coef[0]))
        a = np.transpose(a, order + [k for k in range(a.ndim) if k not in order])
        return a.reshape((-1, turn.extent))

    own, up, down = plane(0), plane(h), plane(-h)
    scale = max(1.0, *(float(np.max(np.abs(t))) for t in (own, up, down)))

    def same(x: np.ndarray, y: np.ndarray) -> bool:
        return bool(np.allclose(x, y, rtol=RTOL, atol=RTOL * scale))

    if not same(own[:, h:], own[:, :h]):
        return Refusal(
            "the table of the input's own read does not repeat its halves: not RotaryEmbedding's cos"
        )
    if not same(down[:, h:], -up[:, :h]):
        return Refusal("the rotated halves are not turned by one table (-sin, then sin): not RotaryEmbedding")
    return _Tables(own[:, :h].astype(np.float32), down[:, h:].astype(np.float32), position)


def _analysis(scope: ir.Scope, ctx: MatchContext) -> tuple[_Rotation, _Tables] | Refusal:
    """The rotation and its checked tables, memoised on the (interned) scope per tables' values."""
    rot = _rotation(scope.body, scope.traversal, ctx)
    if isinstance(rot, Refusal):
        return rot
    if any(rot.x.source.origin):
        return Refusal("its input does not start at position 0")
    probed, probes = _probed(scope, rot)
    tables = [t for t in ir.input_tensors(probed) if t not in probes.values()]
    if any(not ctx.is_constant(t) or t.name not in ctx.values for t in tables):
        return Refusal("reads a table whose values are not known here")
    values = {t.name: np.asarray(ctx.values[t.name]) for t in tables}
    memo = ir._cached(scope, "contrib_rotary", dict)
    key = _digest(list(values.values()))
    if key not in memo:
        memo[key] = _tables(probed, probes, rot, {k: v.astype(np.float64) for k, v in values.items()})
    found = memo[key]
    return found if isinstance(found, Refusal) else (rot, found)


def match_rotary_embedding(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """``X[.., d] * C[s, d] + rotate_half(X)[.., d] * S[s, d]`` (any arrangement; see the module
    docstring) as com.microsoft ``RotaryEmbedding`` on ``X`` as ``[B, N, S, H]``."""
    if scope.summation:
        return Refusal("sums over iterators: not an element-wise rotation")
    scope = flat_elementwise(scope, ctx)
    if not turns_half(scope):
        return Refusal("reads nothing half a dimension away: not a rotation of halves")
    found = _analysis(scope, ctx)
    if isinstance(found, Refusal):
        return found
    rot, tables = found
    others = [it for it in scope.traversal if it not in (rot.turn, tables.position)]
    groups = [
        tuple(others[:-1]),
        tuple(others[-1:]),
        (tables.position,) if tables.position else (),
        (rot.turn,),
    ]
    view = simple_view(rot.x)
    steps = arranged(view, groups)
    shape = tuple(math.prod(it.extent for it in g) for g in groups)
    operands = (
        Operand(rot.x.source, steps),
        Operand(Literal(np.zeros(1, dtype=np.int64))),  # positions 0 .. S-1: an offset of 0
        Operand(Literal(tables.cos)),
        Operand(Literal(tables.sin)),
    )
    op = OpNode("RotaryEmbedding", (0, 1, 2, 3), (("interleaved", 0),), CONTRIB_DOMAIN, shape)
    return OperatorMatch(
        f"{CONTRIB_DOMAIN}.RotaryEmbedding", operands, (op,), finish(groups, scope.traversal)
    )


ROTARY_MATCHERS = {"RotaryEmbedding": match_rotary_embedding}
"""Matcher per name, tried where ``einopt.instantiate.match_contrib.CONTRIB_MATCHERS`` places them."""
