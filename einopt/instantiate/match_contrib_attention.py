"""ONNX Runtime's com.microsoft ``MultiHeadAttention`` and ``Attention`` for the unfused attention core.

The core is the product of a softmax with V, over the key positions ``j``::

    O[b, h, i, e] = Sum_j softmax_j(scale * Sum_d Q[b, i, h, d] K[b, j, h, d] + mask[.., i?, j]) V[b, j, h, e]

with the heads ``h`` split from (and merged back into) the hidden dimension in any layout the
expression reads them in. ``MultiHeadAttention`` takes ``query [B, S, N*dh]``, ``key [B, L, N*dh]``,
``value [B, L, N*dv]`` and an ``attention_bias [B|1, N|1, S, L]`` added to the scaled scores, and
writes ``[B, S, N*dv]``.

The matcher reads the roles off the structure: ``O``'s summed iterator is ``j``, the factor of ``O``
that reaches no maximum is ``V`` (its own iterator ``e``), the query position ``i`` is ``O``'s other
iterator, and the remaining ones are the batch and the head (which is which is tried both ways).
From ``O`` it descends through inline element-wise scopes read at plain iterators (the softmax's
numerator, the scaled and masked scores) carrying the roles along, to the scores' contraction
(``Q`` and ``K``, ``d`` summed) and the mask reads. Layout steps bring each operand into the
operator's layout. Then the scope is evaluated by the reference interpreter on random inputs and
compared with the operator's formula on the same inputs (float64, relative ``RTOL``) for each
reading of the roles and each scale the constants suggest; the first that agrees is the match. The
readings are found once per scope, and evaluated (once) only where one fuses no program binding.

``Attention`` takes the same core where Q, K and V are inline projections of one input ``X`` by
constant weights: it reads ``input [B, S, hidden]``, the weights packed along their columns
``[hidden, Hq + Hk + Hv]`` and the biases ``[Hq + Hk + Hv]``, and fuses the projections too. Its
readings are MultiHeadAttention's whose Q, K and V reads lead into such projections
(``einopt.instantiate.match_contrib_projection``), checked against its formula in the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from einopt.core import ir
from einopt.core.interp import evaluate, sample_box
from einopt.core.rewrite import accesses, fresh_name, replace_reads
from einopt.instantiate.match_contrib_projection import Packing, Projection, pack, read_projection
from einopt.instantiate.match_layout import through_layout
from einopt.instantiate.match_max import reads_maxima
from einopt.instantiate.plan import (
    CONTRIB_DOMAIN,
    NO_MATCH_CONTEXT,
    Expand,
    LayoutStep,
    MatchContext,
    Operand,
    OperatorMatch,
    OpNode,
    Refusal,
    apply_steps,
    normalize,
    steps_cost,
)
from einopt.instantiate.views import View, arrange, arranged, as_product, finish, simple_view

__all__ = ["ATTENTION_MATCHERS", "RTOL", "match_attention", "match_multi_head_attention"]

RTOL = 1e-7
"""How closely the scope must agree with the operator's formula on random inputs (float64)."""

MHA = "MultiHeadAttention"

Roles = dict[ir.Iter, str]  # an iterator's role: "b", "h", "i", "j", "e", "d"


def _factors(e: ir.ValueExpr) -> tuple[float, list[ir.ValueExpr]]:
    """``e`` as ``constant * f1 * f2 * ..`` (products and divisions by constants flattened)."""
    if isinstance(e, ir.Binary) and e.op == "*":
        ca, fa = _factors(e.a)
        cb, fb = _factors(e.b)
        return ca * cb, fa + fb
    if isinstance(e, ir.Binary) and e.op == "/" and isinstance(e.b, ir.Const) and e.b.value != 0.0:
        c, f = _factors(e.a)
        return c / e.b.value, f
    if isinstance(e, ir.Const):
        return e.value, []
    return 1.0, [e]


def _takes_max(e: ir.ValueExpr) -> bool:
    """Whether ``e`` reads (through scopes) a maximum: the softmax side of the product."""
    return any(
        isinstance(a, ir.Access)
        and isinstance(a.source, ir.Scope)
        and any(s.is_max for s in ir.scopes_in(a.source))
        for a in ir.walk(e, stop=ir.Access)
    )


@dataclasses.dataclass
class _Found:
    """What the descent from ``O`` found: the scores' contraction read at roles, and mask reads."""

    scores: list[tuple[ir.Scope, Roles]] = dataclasses.field(default_factory=list)
    masks: list[tuple[ir.Access, Roles]] = dataclasses.field(default_factory=list)
    constants: set[float] = dataclasses.field(default_factory=set)


def _descend(e: ir.ValueExpr, roles: Roles, found: _Found, seen: set) -> None:
    """Carry ``roles`` into the inline element-wise scopes ``e`` reads at plain iterators, recording
    the summing scopes read so (the scores) and the other reads (the mask)."""
    for x in ir.walk(e, stop=ir.Access):
        if isinstance(x, ir.Const):
            found.constants.add(abs(x.value))
        if not isinstance(x, ir.Access):
            continue
        src = x.source
        if isinstance(src, ir.Scope) and src.summation and any(s.is_max for s in ir.scopes_in(src)):
            continue  # the softmax's maximum or sum of exponentials: they read what the numerator does
        plain = isinstance(src, ir.Scope) and all(isinstance(i, ir.Iter | ir.IConst) for i in x.indices)
        inner = (
            {t: roles[i] for t, i in zip(src.traversal, x.indices, strict=True) if i in roles}
            if plain
            else {}
        )
        if plain and not src.summation:
            key = (src, tuple(sorted((t.name, r) for t, r in inner.items())))
            if key not in seen:
                seen.add(key)
                _descend(src.body, inner, found, seen)
        elif plain and src.summation:
            found.scores.append((src, inner))
        else:
            found.masks.append((x, roles))


def _labels(view: View, roles: Roles) -> dict[str, ir.Iter] | None:
    """The view's dimensions by role (None when one has no role or two share one)."""
    out: dict[str, ir.Iter] = {}
    for it in view.labels:
        r = roles.get(it)
        if r is None and it.extent == 1:
            continue  # a unit dimension: dropped when arranged
        if r is None or r in out:
            return None
        out[r] = it
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class _Attention:
    """A reading of the core as MultiHeadAttention: its operands (Q, K, V, the attention bias) in the
    operator's layout, and the accesses of Q, K and V with their iterators' roles (``_Packed``
    follows them into the projections)."""

    operands: tuple[Operand, ...]
    inputs: tuple[int | None, ...]
    heads: int
    scale: float
    shape: tuple[int, int, int]
    post: tuple[LayoutStep, ...]
    reads: tuple[tuple[ir.Access, Roles], ...]


def _candidates(scope: ir.Scope) -> list[_Attention] | Refusal:
    """Every reading of ``scope`` as the attention core the structure allows (not yet checked)."""
    if scope.is_max or len(scope.summation) != 1:
        return Refusal("not a product summed over one iterator (the key positions)")
    (j,) = scope.summation
    const, factors = _factors(scope.body)
    soft = [f for f in factors if _takes_max(f)]
    vs = [f for f in factors if not _takes_max(f)]
    if not soft or len(vs) != 1 or not isinstance(vs[0], ir.Access):
        return Refusal("not a softmax times one tensor V")
    if const != 1.0:
        return Refusal("the product is scaled after the softmax")
    v_acc = vs[0]
    v_view = simple_view(v_acc)
    if isinstance(v_view, Refusal):
        return Refusal(f"V: {v_view.reason}")
    soft_its = set().union(*(f.iters() for f in soft))
    own = [t for t in v_view.labels if t not in soft_its and t is not j]
    queries = [t for t in scope.traversal if t not in v_view.labels and t.extent > 1]
    shared = [t for t in v_view.labels if t in soft_its and t is not j]
    if len(own) > 1 or len(queries) > 1 or len(shared) > 2 or j not in v_view.labels:
        return Refusal("V and the softmax do not read batch, head, query, key and value dimensions")
    out: list[_Attention] = []
    for head in [*shared, None]:
        batch = [t for t in shared if t is not head]
        roles: Roles = {j: "j", **{t: "e" for t in own}, **{t: "i" for t in queries}}
        roles |= {t: "b" for t in batch} | ({head: "h"} if head is not None else {})
        found = _Found()
        for f in soft:
            _descend(f, roles, found, set())
        qk = {s for s, _ in found.scores}
        if len(qk) != 1:
            continue
        for qk_scope, qk_roles in found.scores[:1]:
            built = _build(scope, qk_scope, qk_roles, v_acc, v_view, roles, found)
            if built is not None:
                out.extend(built)
    return out or Refusal("the softmax does not read one scores contraction of Q and K at the query and key")


def _build(scope, qk, qk_roles, v_acc, v_view, roles, found: _Found) -> list[_Attention] | None:
    prod = as_product(qk.body)
    if isinstance(prod, Refusal) or len(prod[1]) != 2:
        return None
    qk_scale, (fa, fb) = prod
    (d,) = qk.summation if len(qk.summation) == 1 else (None,)
    if d is None:
        return None
    inner = dict(qk_roles) | {d: "d"}
    views = [simple_view(a) for a in (fa, fb)]
    if any(isinstance(v, Refusal) for v in views):
        return None
    labelled = [_labels(v, inner) for v in views]
    if any(lab is None for lab in labelled):
        return None
    pairs = [(fa, views[0], labelled[0]), (fb, views[1], labelled[1])]
    q = next((p for p in pairs if "i" in p[2]), None)
    k = next((p for p in pairs if "j" in p[2] and p is not q), None)
    v_lab = _labels(v_view, roles)
    if q is None or k is None or v_lab is None or "d" not in q[2] or "d" not in k[2]:
        return None
    ext = {r: it.extent for lab in (q[2], k[2], v_lab) for r, it in lab.items()}
    for lab, need in ((q[2], "bhid"), (k[2], "bhjd"), (v_lab, "bhje")):
        if set(lab) - set(need) or any(r in "bh" and r not in lab and ext.get(r, 1) > 1 for r in need):
            return None  # an operand broadcast along the batch or the heads
    B, N = ext.get("b", 1), ext.get("h", 1)
    S, L = ext["i"] if "i" in ext else 1, ext["j"]

    def groups(lab, rows):
        return [tuple(lab[r] for r in "b" if r in lab), tuple(lab[r] for r in rows if r in lab),
                tuple(lab[r] for r in ("h", "d" if "d" in lab else "e") if r in lab)]  # fmt: skip

    operands = [
        Operand(q[0].source, arranged(q[1], groups(q[2], "i"))),
        Operand(k[0].source, arranged(k[1], groups(k[2], "j"))),
        Operand(v_acc.source, arranged(v_view, groups(v_lab, "j"))),
    ]
    inputs: list[int | None] = [0, 1, 2]
    masks = {a.source: (a, r) for a, r in found.masks}
    if len(masks) > 1:
        return None
    if masks:
        (m_acc, m_roles) = next(iter(masks.values()))
        m_view = simple_view(m_acc)
        m_lab = _labels(m_view, m_roles) if isinstance(m_view, View) else None
        if m_lab is None or set(m_lab) - set("bhij"):
            return None
        m_groups = [tuple(m_lab[r] for r in r_ if r in m_lab) for r_ in "bhij"]
        target = (B if "b" in m_lab else 1, N if "h" in m_lab else 1, S, L)
        steps = normalize(
            m_view.steps + arrange(m_view.labels, m_view.shape, m_groups) + (Expand(target),),
            tuple(m_acc.source.shape),
        )
        inputs += [None, None, len(operands)]
        operands.append(Operand(m_acc.source, steps))
    out_lab = {r: t for t, r in roles.items() if t in scope.traversal}
    out_groups = [tuple(out_lab[r] for r in "b" if r in out_lab), tuple(out_lab[r] for r in "i" if r in out_lab),
                  tuple(out_lab[r] for r in "he" if r in out_lab)]  # fmt: skip
    post = finish(out_groups, scope.traversal)
    dv = ext.get("e", 1)
    scales = sorted(
        {qk_scale * c for c in {1.0, *found.constants} if c != 0.0}, key=lambda s: abs(s - qk_scale)
    )
    scales += [qk_scale / c for c in found.constants if c not in (0.0, 1.0)]
    reads = ((q[0], inner), (k[0], inner), (v_acc, roles))
    return [
        _Attention(tuple(operands), tuple(inputs), N, float(s), (B, S, N * dv), post, reads)
        for s in dict.fromkeys(scales)
    ]


def _reference(att: _Attention, arrays: list[np.ndarray]) -> np.ndarray:
    """MultiHeadAttention's formula on its operands ``[Q, K, V, attention_bias?]``."""
    q, k, v = arrays[:3]
    B, S, _ = q.shape
    N = att.heads
    split = [x.reshape(B, x.shape[1], N, -1).transpose(0, 2, 1, 3) for x in (q, k, v)]
    s = split[0] @ split[1].transpose(0, 1, 3, 2) * att.scale
    if len(arrays) > 3:
        s = s + arrays[3]
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return (p @ split[2]).transpose(0, 2, 1, 3).reshape(B, S, -1)


def _source_value(src, inputs: dict[str, np.ndarray], cut: dict[ir.Scope, ir.Tensor]) -> np.ndarray:
    if src in cut:
        return inputs[cut[src].name]
    if isinstance(src, ir.Tensor):
        return inputs[src.name]
    return np.asarray(evaluate(src, inputs), dtype=np.float64)


Reading = tuple[_Attention, tuple[ir.Scope, ...]]  # a candidate and the scopes it fuses


def _readings(scope: ir.Scope) -> list[Reading] | Refusal:
    """:func:`_candidates` with the scopes each fuses, the one with least layout work around the
    operator first (batch and heads are both independent dimensions: either reading computes it)."""
    cands = _candidates(scope)
    if isinstance(cands, Refusal):
        return cands
    cands.sort(key=_layout_work)
    return [(att, _consumed(scope, att.operands)) for att in cands]


def _layout_work(att: _Attention | _Packed) -> float:
    return sum(steps_cost(o.steps, False) for o in att.operands) + steps_cost(att.post, False)


def _verify(
    scope: ir.Scope, cands: list, formula: Callable[[Any, list[np.ndarray]], np.ndarray], name: str
) -> tuple | Refusal:
    """The first reading (with the scopes it fuses) whose ``formula(reading, operand arrays)`` agrees
    with the interpreter on random inputs (the values are not kept: the search's states hold many
    scopes).

    The operator is a function of its operands, so the check is made on random operands: each
    operand that is a scope nested in ``scope`` is cut out of it (read as an input tensor of its
    shape), and only the fused core is evaluated, on two batch elements. Evaluating the operands
    (ViT's patch embedding, layer norm and projections at batch 16) took 1.2 s a check, most of a
    batch-16 search's time."""
    checked: dict[tuple[ir.Scope, ...], _Side] = {}
    for att, consumed in cands:
        sources = _cut_sources(scope, att.operands)
        if sources not in checked:
            checked[sources] = _interpreter_side(scope, sources)
        side = checked[sources]
        cut, inputs, y, rows = side.cut, side.inputs, side.y, side.rows
        # An operand the core does not read as it is (a packed weight) may read tensors it does not.
        rng = np.random.default_rng(1)
        for o in att.operands:
            if o.source not in cut:
                for t in [o.source] if isinstance(o.source, ir.Tensor) else ir.input_tensors(o.source):
                    if t.name not in inputs:
                        inputs[t.name] = rng.standard_normal(t.shape)
        arrays = [apply_steps(o.steps, _source_value(o.source, inputs, cut)) for o in att.operands]
        got = apply_steps(att.post, formula(att, arrays))
        got = got[rows] if got.shape == scope.shape else got
        if got.shape == y.shape and np.allclose(got, y, rtol=RTOL, atol=RTOL * float(np.max(np.abs(y)))):
            return att, consumed
    return Refusal(f"computes another function than {name} for every reading of its roles")


@dataclasses.dataclass
class _Side:
    """The interpreter's side of :func:`_verify` for one set of cut sources: the inputs (random
    values by tensor name), the core's value ``y`` on the sampled box and that box as ``rows``."""

    cut: dict[ir.Scope, ir.Tensor]
    inputs: dict[str, np.ndarray]
    y: np.ndarray
    rows: tuple[slice, ...]


def _interpreter_side(scope: ir.Scope, sources: tuple[ir.Scope, ...]) -> _Side:
    """``scope`` with ``sources`` cut out, evaluated on random inputs: on two batch elements only.
    Query rows are not interchangeable: a causal mask hides keys from every row but the last, so a
    reading without it agrees on the last rows."""
    core, cut = _cut(scope, sources)
    rng = np.random.default_rng(0)
    inputs = {t.name: rng.standard_normal(t.shape) for t in ir.input_tensors(core)}
    box = sample_box(core, dims=(0,) if len(core.traversal) >= 3 else ())
    y = np.asarray(evaluate(core, inputs, box=box), dtype=np.float64)
    rows = tuple(slice(lo - it.lo, hi - it.lo) for (lo, hi), it in zip(box, core.traversal, strict=True))
    return _Side(cut, inputs, y, rows)


def _cut_sources(scope: ir.Scope, operands: tuple[Operand, ...]) -> tuple[ir.Scope, ...]:
    """The operands' sources that :func:`_verify` reads as input tensors: scopes nested in ``scope``
    (indexed from 0), which no other operand's source reads (a packed weight is made of the
    original weights: it is evaluated, and must see the values the core sees)."""
    nested = set(ir.scopes_in(scope))
    sources = list(dict.fromkeys(o.source for o in operands if isinstance(o.source, ir.Scope)))
    cut = [s for s in sources if s in nested and s is not scope and not any(s.origin)]
    for other in [s for s in sources if s not in cut]:
        read = set(ir.scopes_in(other))
        cut = [s for s in cut if s not in read]
    # A source whose values are tied to the rest of the core (a softmax's row maximum, which reads
    # the scores) is evaluated: the reading may hold for its values only (a shift of each row).
    while cut:
        scopes, tensors = _read_outside(scope, set(cut))
        tied = {
            s
            for s in cut
            if not scopes.isdisjoint(ir.scopes_in(s)) or not tensors.isdisjoint(ir.input_tensors(s))
        }
        if not tied:
            break
        cut = [s for s in cut if s not in tied]
    return tuple(cut)


def _read_outside(scope: ir.Scope, cut: set[ir.Scope]) -> tuple[set[ir.Scope], set[ir.Tensor]]:
    """The scopes and tensors ``scope`` reads without reading through a scope of ``cut``."""
    scopes: set[ir.Scope] = set()
    tensors: set[ir.Tensor] = set()
    todo = [scope]
    while todo:
        s = todo.pop()
        for a in accesses(s.body):
            if isinstance(a.source, ir.Tensor):
                tensors.add(a.source)
            elif a.source not in cut and a.source not in scopes:
                scopes.add(a.source)
                todo.append(a.source)
    return scopes, tensors


def _cut(scope: ir.Scope, sources: tuple[ir.Scope, ...]) -> tuple[ir.Scope, dict[ir.Scope, ir.Tensor]]:
    """``scope`` with every read of a scope in ``sources`` a read of an input tensor of its shape
    (fresh names), and those tensors by scope."""
    taken = {t.name for t in ir.tensors_in(scope)}
    cut: dict[ir.Scope, ir.Tensor] = {}
    for i, s in enumerate(sources):
        cut[s] = ir.Tensor(fresh_name(f"operand{i}", taken), s.shape)
        taken.add(cut[s].name)
    return replace_reads(scope, cut), cut


def _consumed(scope: ir.Scope, operands: tuple[Operand, ...]) -> tuple[ir.Scope, ...]:
    """The scopes the operator fuses: those of ``scope`` its operands do not read."""
    kept: set[ir.Scope] = set()
    for o in operands:
        if isinstance(o.source, ir.Scope):
            kept.update(ir.scopes_in(o.source))
    return tuple(s for s in ir.scopes_in(scope) if s is not scope and s not in kept)


_BOUND = "a scope of the attention (the scores, the softmax) is a program binding"


@reads_maxima
def match_multi_head_attention(
    scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT
) -> OperatorMatch | Refusal:
    """The attention core (see the module docstring) as com.microsoft ``MultiHeadAttention``,
    consuming the scores, the softmax's maximum and sum and the element-wise scopes between."""
    # The search asks for every scope of every state: the readings are found once per (interned)
    # scope, and evaluated only when one of them fuses no program binding (else none is taken).
    cands = ir._cached(scope, "contrib_attention_readings", lambda: _readings(scope))
    if isinstance(cands, Refusal):
        return cands
    if all(any(s in ctx.bound for s in consumed) for _, consumed in cands):
        return Refusal(_BOUND)
    found = ir._cached(scope, "contrib_attention", lambda: _verify(scope, cands, _reference, MHA))
    if isinstance(found, Refusal):
        return found
    att, consumed = found
    if any(s in ctx.bound for s in consumed):
        return Refusal(_BOUND)
    attrs = (("num_heads", att.heads), ("scale", att.scale))
    op = OpNode("MultiHeadAttention", att.inputs, attrs, CONTRIB_DOMAIN, att.shape)
    return OperatorMatch(f"{CONTRIB_DOMAIN}.MultiHeadAttention", att.operands, (op,), att.post, consumed)


# --------------------------------------------------------------------------
# Attention: the core of projections of one input
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class _Packed:
    """A reading of the core as Attention: MultiHeadAttention's reading ``core`` whose Q, K and V
    are projections of one input, packed; ``operands`` are the input, the packed weights and bias,
    and the attention bias."""

    core: _Attention
    packing: Packing
    operands: tuple[Operand, ...]
    inputs: tuple[int | None, ...]

    @property
    def post(self) -> tuple[LayoutStep, ...]:
        return self.core.post


_PROJECTIONS = (("Q", "i", "d"), ("K", "j", "d"), ("V", "j", "e"))  # each read's position and column roles


def _packed_readings(scope: ir.Scope, readings: list[Reading], ctx: MatchContext) -> list | Refusal:
    """The readings of ``scope`` as Attention (with the scopes each fuses), the one with least layout
    work first: those of MultiHeadAttention whose Q, K and V are projections of one input (``ctx``
    tells the constants)."""
    out, reasons = [], []
    found: dict[tuple, Projection | Refusal] = {}  # the readings share their accesses (scales, heads)
    for att, _ in readings:
        projections = []
        for (name, position, column), (acc, roles) in zip(_PROJECTIONS, att.reads, strict=True):
            key = (acc, position, column, frozenset(roles.items()))
            if key not in found:
                found[key] = read_projection(acc, roles, position, column, ctx)
            if isinstance(found[key], Refusal):
                reasons.append(f"{name}: {found[key].reason}")
                break
            projections.append(found[key])
        else:
            packing = pack(tuple(projections), att.heads)
            if isinstance(packing, Refusal):
                reasons.append(packing.reason)
                continue
            operands = (packing.x, Operand(packing.weights), Operand(packing.bias), *att.operands[3:])
            inputs = (0, 1, 2, *((None, None, 3) if len(operands) > 3 else ()))
            out.append((_Packed(att, packing, operands, inputs), _consumed(scope, operands)))
    if not out:
        return Refusal(reasons[0])
    out.sort(key=lambda r: _layout_work(r[0]))
    return out


def _packed_reference(p: _Packed, arrays: list[np.ndarray]) -> np.ndarray:
    """Attention's formula on its operands ``[input, weights, bias, attention_bias?]``."""
    x, w, b = arrays[:3]
    hq, hk, _ = p.packing.sizes
    q, k, v = np.split(x @ w + b, [hq, hq + hk], axis=-1)
    return _reference(p.core, [q, k, v, *arrays[3:]])


def _constants(scope: ir.Scope, tensors: frozenset[ir.Tensor]) -> MatchContext:
    """The context in which ``tensors`` and the scopes of ``scope`` that read only them are constant."""
    scopes = (s for s in ir.scopes_in(scope) if all(t in tensors for t in ir.input_tensors(s)))
    return MatchContext(constant=tensors | frozenset(scopes))


_PACKED_BOUND = "a scope Attention would fuse (a projection, the scores, the softmax) is a program binding"


@reads_maxima
def match_attention(scope: ir.Scope, ctx: MatchContext = NO_MATCH_CONTEXT) -> OperatorMatch | Refusal:
    """The attention core whose Q, K and V are projections ``bias[n] + Sum_k X[.., k] * W[k, n]`` of
    one input ``X`` by constant weights, as com.microsoft ``Attention``, consuming the projections
    too (see :mod:`einopt.instantiate.match_contrib_projection`): the weights and biases are packed
    at compile time."""
    cands = ir._cached(scope, "contrib_attention_readings", lambda: _readings(scope))
    if isinstance(cands, Refusal):
        return cands
    # Q, K and V are the same accesses in every reading; bound, MultiHeadAttention reads them.
    bound = [
        name
        for (name, _, _), (acc, _) in zip(_PROJECTIONS, cands[0][0].reads, strict=True)
        if acc.source in ctx.bound
    ]
    if bound:
        return Refusal(
            f"the projection of {', '.join(bound)} is a program binding (MultiHeadAttention reads it)"
        )
    # The projections' analysis depends on which tensors are constant: found once per scope and set.
    tensors = frozenset(t for t in ir.input_tensors(scope) if ctx.is_constant(t))
    memo = ir._cached(scope, "contrib_packed_attention", dict)
    if tensors not in memo:
        memo[tensors] = _packed_readings(scope, cands, _constants(scope, tensors))
    packed = memo[tensors]
    if isinstance(packed, Refusal):
        return packed
    if all(any(s in ctx.bound for s in consumed) for _, consumed in packed):
        return Refusal(_PACKED_BOUND)
    if ("verified", tensors) not in memo:
        memo["verified", tensors] = _verify(scope, packed, _packed_reference, "Attention")
    found = memo["verified", tensors]
    if isinstance(found, Refusal):
        return found
    p, consumed = found
    if any(s in ctx.bound for s in consumed):
        return Refusal(_PACKED_BOUND)
    att, (hq, _, hv) = p.core, p.packing.sizes
    attrs = (("num_heads", att.heads), ("scale", att.scale))
    if hv != hq:
        attrs += (("qkv_hidden_sizes", p.packing.sizes),)
    op = OpNode("Attention", p.inputs, attrs, CONTRIB_DOMAIN, att.shape)
    return OperatorMatch(f"{CONTRIB_DOMAIN}.Attention", p.operands, (op,), p.post, consumed)


ATTENTION_MATCHERS = {
    name: reads_maxima(through_layout(fn))
    for name, fn in (("Attention", match_attention), ("MultiHeadAttention", match_multi_head_attention))
}
"""The attention matchers, in the order the table tries them (where both accept, Attention fuses
the projections too); each also takes the core read through the head merge after it (the
exporters' Transpose and Reshape back to ``[B, S, hidden]``, the operator's own output layout)."""
