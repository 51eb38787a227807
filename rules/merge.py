"""Expression merging (method.md section 3): two bound scopes with the same computation become one.

The two scopes ``S1``, ``S2`` are compared by one structural zip of their
bodies with the iterator correspondence by position (traversal with
traversal, summation with summation); index functions are compared by their
simplified linear forms. Three ways to merge follow from how they differ:

* **concat**: same input, different weights, ranges equal except along one
  traversal dimension; the weights are concatenated along it.
* **batch**: same shapes, different inputs; the differing operands are
  stacked along a new batch dimension.
* **join**: the same computation over adjacent ranges of one dimension (the
  inverse of ``split_expression``); sums of the two parts collapse.

The merged scope ``M`` becomes a new binding and ``S1``, ``S2`` are rebound to
reads of it; reads of ``S1``/``S2`` that provably stay inside their ranges are
redirected to ``M``, and rebound scopes nobody reads any more are dropped.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from types import MappingProxyType

from einopt.core import ir
from einopt.core.index import LinearForm, bounds, from_linear_form, linear_form, simplify, substitute
from einopt.core.rewrite import (
    fresh_name,
    iter_names,
    map_accesses,
    operands,
    replace_scopes,
    sort_bindings,
    source_ranges,
    taken_names,
)
from einopt.rules.base import NO_CONTEXT, Context, Failure, Match, Rule, scope_labels
from einopt.rules.split import rename_iter

__all__ = ["MergeExpressions", "RULES", "zip_bodies", "concat_scope"]

Pair = tuple[ir.Access, ir.Access]
# How a rebound scope reads M: per dimension of M, (position in the rebound traversal, offset),
# or (None, constant) for a fixed index (the batch dimension).
Embed = tuple[tuple[int | None, int], ...]


# --------------------------------------------------------------------------
# The structural zip
# --------------------------------------------------------------------------


def _skeleton(e: ir.ValueExpr) -> ir.ValueExpr:
    """The operator structure of a body, what must agree for two bodies to be zipped: the body with
    each read replaced by a hole of the read's rank (an interned node, compared by identity)."""

    def compute() -> ir.ValueExpr:
        return map_accesses(e, lambda x: _hole(x.source.rank))

    return ir._cached(e, "merge.skeleton", compute)


@functools.cache
def _hole(rank: int) -> ir.Access:
    return ir.Access(ir.Tensor("_", (1,) * rank), (ir.IConst(0),) * rank)


def scope_skeleton(s: ir.Scope) -> tuple:
    """What two scopes must share to be merged: ranks, the reduction, and the body's structure."""
    return (len(s.traversal), len(s.summation), s.reduce, _skeleton(s.body))


def zip_bodies(e1: ir.ValueExpr, e2: ir.ValueExpr) -> list[Pair]:
    """The accesses of two bodies with the same skeleton, paired by position (distinct pairs, in order)."""
    out: dict[Pair, None] = {}
    stack = [(e1, e2)]
    while stack:
        a, b = stack.pop()
        if isinstance(a, ir.Access):
            out.setdefault((a, b))
        else:
            stack += list(zip(ir.children(a), ir.children(b), strict=True))[::-1]
    return list(out)


def _same_index(i1: ir.IndexExpr, i2: ir.IndexExpr, corr: dict[ir.Iter, ir.Iter]) -> bool:
    """``i1`` (in S1's iterators) equals ``i2`` at every point of S2's ranges."""
    return simplify(substitute(i1, corr)) is simplify(i2)


def _merge_constants(e1: ir.IndexExpr, e2: ir.IndexExpr, t: ir.IndexExpr) -> ir.IndexExpr | None:
    """An index equal to ``e1`` at ``t = 0`` and to ``e2`` at ``t = 1``, when the two differ only in
    constants (outside or inside ``//`` and ``%``): each differing constant ``c1`` becomes ``c1 + (c2 - c1)*t``."""
    lf1, lf2 = linear_form(e1), linear_form(e2)
    if dict(lf1.coeffs) != dict(lf2.coeffs) or len(lf1.atoms) != len(lf2.atoms):
        return None
    atoms = []
    for (a1, d1), (a2, d2) in zip(lf1.atoms, lf2.atoms, strict=True):
        if d1 != d2 or type(a1) is not type(a2):
            return None
        if a1 is a2:
            atoms.append((a1, d1))
        elif isinstance(a1, (ir.IFloorDiv, ir.IMod)) and a1.k == a2.k:
            inner = _merge_constants(a1.a, a2.a, t)
            if inner is None:
                return None
            atoms.append((type(a1)(inner, a1.k), d1))
        else:
            return None
    out = from_linear_form(LinearForm(lf1.coeffs, tuple(atoms), lf1.const))
    step = lf2.const - lf1.const
    if step:
        out = ir.IAdd(out, t if step == 1 else ir.IMul(ir.IConst(step), t))
    return out


def _show(a: ir.Access, names: dict[ir.Scope, str]) -> str:
    src = a.source.name if isinstance(a.source, ir.Tensor) else names.get(a.source, "{...}")
    text = ", ".join(i.name if isinstance(i, ir.Iter) else str(i) for i in a.indices)
    return f"{src}[{text}]"


# --------------------------------------------------------------------------
# Plans: the merged scope and the two rebound scopes
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Plan:
    merged: ir.Scope
    rebound: tuple[ir.Scope, ir.Scope]
    embeds: tuple[Embed, Embed]
    collapse: bool
    summary: str


def _identity(rank: int) -> Embed:
    return tuple((j, 0) for j in range(rank))


def _read(s: ir.Scope, merged: ir.Scope, embed: Embed) -> ir.Scope:
    idx = tuple(ir.IConst(off) if j is None else _shift(s.traversal[j], off) for j, off in embed)
    return ir.Scope(s.traversal, (), ir.Access(merged, idx), s.pad)


def _shift(i: ir.IndexExpr, off: int) -> ir.IndexExpr:
    return i if off == 0 else simplify(ir.IAdd(i, ir.IConst(off)))


def _axes(rank: int, avoid: str = "") -> list[str]:
    return [fresh_name(f"i{j}", {avoid}) for j in range(rank)]


class _Pairing:
    """Two scopes zipped: the iterator correspondence and the paired accesses."""

    def __init__(self, s1: ir.Scope, s2: ir.Scope, names: dict[ir.Scope, str]) -> None:
        self.s1, self.s2, self.names = s1, s2, names
        its1, its2 = s1.traversal + s1.summation, s2.traversal + s2.summation
        self.corr = dict(zip(its1, its2, strict=True))
        self.pairs = zip_bodies(s1.body, s2.body)
        self.diff = [
            d
            for d, (a, b) in enumerate(zip(s1.traversal, s2.traversal, strict=True))
            if (a.lo, a.hi) != (b.lo, b.hi)
        ]

    def conflict(self) -> str | None:
        seen: dict[ir.Access, ir.Access] = {}
        for a1, a2 in self.pairs:
            if seen.setdefault(a1, a2) is not a2:
                return f"{self.show(a1)} pairs with both {self.show(seen[a1])} and {self.show(a2)}"
        return None

    def show(self, a: ir.Access) -> str:
        return _show(a, self.names)

    def differ(self, a1: ir.Access, a2: ir.Access) -> str:
        return f"bodies differ in {self.show(a1)} vs {self.show(a2)}"

    def same_indices(self, a1: ir.Access, a2: ir.Access, skip: int = -1) -> bool:
        return all(
            _same_index(i1, i2, self.corr)
            for j, (i1, i2) in enumerate(zip(a1.indices, a2.indices, strict=True))
            if j != skip
        )


def _join(pz: _Pairing, name: str, n1: str, n2: str) -> _Plan | str:
    """Adjacent ranges along one dimension, bodies equal (constants may differ on single values)."""
    d = pz.diff[0]
    s1, s2, given = pz.s1, pz.s2, pz.s1
    x1, x2 = s1.traversal[d], s2.traversal[d]
    if x2.hi == x1.lo:  # S2 comes first along d
        s1, s2, x1, x2, n1, n2 = s2, s1, x2, x1, n2, n1
        pz = _Pairing(s1, s2, pz.names)
    elif x1.hi != x2.lo:
        return f"ranges of {x1.name} are not adjacent: [{x1.lo}, {x1.hi}) and [{x2.lo}, {x2.hi})"
    xm = ir.Iter(x1.name, x1.lo, x2.hi)
    inverse = {b: a for a, b in pz.corr.items()}
    single = x1.extent == 1 and x2.extent == 1
    step = ir.ISub(xm, ir.IConst(x1.lo)) if x1.lo else xm
    remap: dict[ir.Access, ir.Access] = {}
    for a1, a2 in pz.pairs:
        if a1.source is not a2.source:
            return f"reads {pz.show(a1)} vs {pz.show(a2)}: sources differ"
        if pz.same_indices(a1, a2):
            continue
        if not single:
            return pz.differ(a1, a2)
        indices = []
        for i1, i2 in zip(a1.indices, a2.indices, strict=True):
            if _same_index(i1, i2, pz.corr):
                indices.append(i1)
                continue
            t1 = simplify(substitute(i1, {x1: ir.IConst(x1.lo)}))
            t2 = simplify(substitute(i2, {**inverse, x2: ir.IConst(x2.lo)}))
            merged = _merge_constants(t1, t2, x1)
            if merged is None:
                return pz.differ(a1, a2) + " (not only in constants)"
            indices.append(substitute(merged, {x1: step}))
        remap[a1] = ir.Access(a1.source, tuple(indices))
    body = map_accesses(s1.body, lambda a: remap.get(a, a)) if remap else s1.body
    merged = ir.Scope(
        tuple(xm if it is x1 else it for it in s1.traversal),
        s1.summation,
        rename_iter(body, x1, xm),
        (),
        s1.reduce,
    )
    embed = _identity(len(s1.traversal))
    rebound = (_read(s1, merged, embed), _read(s2, merged, embed))
    if s1 is not given:
        rebound = rebound[::-1]
    return _Plan(merged, rebound, (embed, embed), True, f"join {n1}, {n2} along {x1.name} into {name}")


def concat_scope(t1: ir.Tensor | ir.Scope, t2: ir.Tensor | ir.Scope, e: int, n1: int, n2: int) -> ir.Scope:
    """``L[.., i_e:[0, n1+n2), ..] T1[.., i_e, ..] + T2[.., i_e - n1, ..]`` (each clipped to the part it supplies).

    Concatenates two tensors or scopes along dimension ``e``: the result is
    ``T1`` on ``[0, n1)`` and ``T2`` shifted by ``n1`` on ``[n1, n1+n2)``; the
    other dimensions cover both sources' ranges. Used by ``merge_expressions``
    (weights) and ``merge_summations`` (summation operands).
    """
    r1, r2 = source_ranges(t1), source_ranges(t2)
    names = _axes(len(r1))
    its = []
    for j, ((lo1, hi1), (lo2, hi2)) in enumerate(zip(r1, r2, strict=True)):
        its.append(
            ir.Iter(names[j], 0, n1 + n2) if j == e else ir.Iter(names[j], min(lo1, lo2), max(hi1, hi2))
        )
    terms = []
    for t, rng, (lo, hi), off in ((t1, r1, (0, n1), 0), (t2, r2, (0, n2), n1)):
        clipped = _clip(t, rng, e, lo, hi)
        if clipped is not None:
            idx = tuple(_shift(it, -off) if j == e else it for j, it in enumerate(its))
            terms.append(ir.Access(clipped, idx))
    body: ir.ValueExpr = ir.Const(0.0) if not terms else terms[0]
    for term in terms[1:]:
        body = ir.Binary("+", body, term)
    return ir.Scope(tuple(its), (), body)


def _clip(
    t: ir.Tensor | ir.Scope, rng: list[tuple[int, int]], e: int, lo: int, hi: int
) -> ir.Tensor | ir.Scope | None:
    """``t`` with its range along ``e`` cut to ``[lo, hi)`` (``None`` if nothing is left)."""
    a, b = rng[e]
    if lo <= a and b <= hi:
        return t
    a, b = max(a, lo), min(b, hi)
    if a >= b:
        return None
    its = tuple(ir.Iter(n, *(rng[j] if j != e else (a, b))) for j, n in enumerate(_axes(len(rng))))
    return ir.Scope(its, (), ir.Access(t, its))


def _concat(pz: _Pairing, d: int, name: str, n1: str, n2: str) -> _Plan | str:
    """Ranges equal except along ``d``; every access on ``x_d`` reads it plainly in one dimension."""
    s1, s2 = pz.s1, pz.s2
    x1, x2 = s1.traversal[d], s2.traversal[d]
    if x1.lo != 0 or x2.lo != 0:
        return f"ranges of {x1.name} start at {x1.lo} and {x2.lo}: concat needs ranges from 0"
    n_1, n_2 = x1.hi, x2.hi
    xm = ir.Iter(x1.name, 0, n_1 + n_2)
    remap: dict[ir.Access, ir.Access] = {}
    changed, shared = bool(pz.diff), False
    for a1, a2 in pz.pairs:
        on1 = [j for j, i in enumerate(a1.indices) if x1 in i.iters()]
        on2 = [j for j, i in enumerate(a2.indices) if x2 in i.iters()]
        if not on1 and not on2:
            if a1.source is not a2.source or not pz.same_indices(a1, a2):
                return pz.differ(a1, a2) + f" (reads without {x1.name} must be the same)"
            shared = True
            continue
        if len(on1) != 1 or on1 != on2:
            return f"{x1.name} is not the index of exactly one dimension of {pz.show(a1)} and {pz.show(a2)}"
        e = on1[0]
        if simplify(a1.indices[e]) is not x1 or simplify(a2.indices[e]) is not x2:
            return f"{x1.name} is not a plain index of {pz.show(a1)} and {pz.show(a2)}"
        if not pz.same_indices(a1, a2, skip=e):
            return pz.differ(a1, a2)
        changed |= a1.source is not a2.source
        wc = concat_scope(a1.source, a2.source, e, n_1, n_2)
        remap[a1] = ir.Access(wc, a1.indices[:e] + (x1,) + a1.indices[e + 1 :])
    if not changed or not (pz.diff or shared):
        return ""
    body = rename_iter(map_accesses(s1.body, lambda a: remap.get(a, a)), x1, xm)
    merged = ir.Scope(tuple(xm if it is x1 else it for it in s1.traversal), s1.summation, body, (), s1.reduce)
    rank = len(s1.traversal)
    embeds = (_identity(rank), tuple((j, n_1 if j == d else 0) for j in range(rank)))
    rebound = (_read(s1, merged, embeds[0]), _read(s2, merged, embeds[1]))
    return _Plan(merged, rebound, embeds, False, f"concat {n1}, {n2} along {x1.name} into {name}")


def _stack_scope(t1: ir.Tensor | ir.Scope, t2: ir.Tensor | ir.Scope) -> ir.Scope:
    """``T12[b, i0, ..] = T1[i0 + n0*b, ..] + T2[i0 + n0*(b-1), ..]``: T1 at b = 0, T2 at b = 1."""
    rng = source_ranges(t1)
    b = ir.Iter("b", 0, 2)
    its = tuple(ir.Iter(n, lo, hi) for n, (lo, hi) in zip(_axes(len(rng), "b"), rng, strict=True))
    n0 = its[0].extent
    first = simplify(ir.IAdd(its[0], ir.IMul(ir.IConst(n0), b)))
    second = simplify(ir.ISub(first, ir.IConst(n0)))
    body = ir.Binary("+", ir.Access(t1, (first, *its[1:])), ir.Access(t2, (second, *its[1:])))
    return ir.Scope((b, *its), (), body)


def _batch(pz: _Pairing, name: str, n1: str, n2: str) -> _Plan | str:
    """Identical ranges; accesses differ only in their sources, which have the same ranges."""
    s1, s2 = pz.s1, pz.s2
    b = ir.Iter(fresh_name("b", iter_names(s1)), 0, 2)
    remap: dict[ir.Access, ir.Access] = {}
    for a1, a2 in pz.pairs:
        if not pz.same_indices(a1, a2):
            return pz.differ(a1, a2)
        if a1.source is a2.source:
            continue
        if not a1.indices:
            return f"{pz.show(a1)} and {pz.show(a2)} have rank 0: nothing to stack along"
        if source_ranges(a1.source) != source_ranges(a2.source):
            return f"{pz.show(a1)} and {pz.show(a2)} read sources of different shapes"
        remap[a1] = ir.Access(_stack_scope(a1.source, a2.source), (b, *a1.indices))
    if not remap:
        return ""
    merged = ir.Scope(
        (b, *s1.traversal), s1.summation, map_accesses(s1.body, lambda a: remap.get(a, a)), (), s1.reduce
    )
    rank = len(s1.traversal)
    embeds = tuple(((None, k), *((j, 0) for j in range(rank))) for k in (0, 1))
    rebound = (_read(s1, merged, embeds[0]), _read(s2, merged, embeds[1]))
    return _Plan(merged, rebound, embeds, False, f"batch {n1}, {n2} into {name}")


def _plans(pz: _Pairing, name: str, n1: str, n2: str) -> Iterator[tuple[str, int, _Plan | str]]:
    """Every way to merge the pair, as (way, dimension, plan or reason); empty reasons are not near misses."""
    if len(pz.diff) > 1:
        shown = ", ".join(pz.s1.traversal[d].name for d in pz.diff)
        yield "join", -1, f"ranges differ in {len(pz.diff)} traversal dimensions ({shown})"
        return
    if pz.diff:
        yield "concat", pz.diff[0], _concat(pz, pz.diff[0], name, n1, n2)
        yield "join", -1, _join(pz, name, n1, n2)
    else:
        for d in range(len(pz.s1.traversal)):
            found = _concat(pz, d, name, n1, n2)
            yield "concat", d, found if isinstance(found, _Plan) else ""
        yield "batch", -1, _batch(pz, name, n1, n2)


def _lookup(program: ir.Program, label: str) -> ir.Scope:
    """The scope a label of :func:`~einopt.rules.base.scope_labels` names (a binding or a nested scope)."""
    for scope, found in scope_labels(program).items():
        if found == label:
            return scope
    raise KeyError(f"no scope labelled {label}")


def _plan(program: ir.Program, params: dict) -> _Plan:
    names = program.names()
    s1, s2 = _lookup(program, params["first"]), _lookup(program, params["second"])
    for way, d, found in _plans(_Pairing(s1, s2, names), params["name"], params["first"], params["second"]):
        if way == params["way"] and d == params["dim"] and isinstance(found, _Plan):
            return found
    raise ValueError(
        f"merge_expressions: {params['way']} of {params['first']}, {params['second']} does not apply"
    )


# --------------------------------------------------------------------------
# Installing a plan in the program
# --------------------------------------------------------------------------


def _rewire(program: ir.Program, on_access, on_plus, on_scope) -> ir.Program:
    """Rebuild every scope of ``program`` bottom-up, letting the hooks rewrite accesses, sums and scopes."""
    scopes: dict[ir.Scope, ir.Scope] = {}
    values: dict[ir.ValueExpr, ir.ValueExpr] = {}

    def scope(s: ir.Scope) -> ir.Scope:
        out = scopes.get(s)
        if out is None:
            out = scopes[s] = on_scope(s.replace(body=value(s.body)))
        return out

    def access(x: ir.Access) -> ir.ValueExpr:
        return on_access(x if isinstance(x.source, ir.Tensor) else x.replace(source=scope(x.source)))

    def value(x: ir.ValueExpr) -> ir.ValueExpr:
        out = values.get(x)
        if out is None:
            if isinstance(x, ir.Access):
                out = access(x)
            else:
                out = ir.rebuild(x, value)
                if isinstance(out, ir.Binary) and out.op == "+":
                    out = on_plus(out)
            values[x] = out
        return out

    return program.replace(bindings=tuple((n, scope(s)) for n, s in program.bindings))


def _collapse(program: ir.Program, plan: _Plan) -> ir.Program:
    """Every ``S1'[g] + S2'[g]`` becomes ``M[g]``; a scope that is then ``L_x M[x]`` over M's range is M."""
    parts, merged = set(plan.rebound), plan.merged

    def is_part(x: ir.ValueExpr) -> bool:
        return isinstance(x, ir.Access) and x.source in parts

    def on_plus(e: ir.Binary) -> ir.ValueExpr:
        if not (is_part(e.a) or is_part(e.b)):
            return e
        terms = operands(e, "+")
        pairs = [
            (i, j)
            for i, t in enumerate(terms)
            for j, u in enumerate(terms)
            if i < j and is_part(t) and is_part(u) and t.source is not u.source and t.indices == u.indices
        ]
        if not pairs:
            return e
        used: set[int] = set()
        for i, j in pairs:
            if i not in used and j not in used:
                used |= {i, j}
                terms[i] = ir.Access(merged, terms[i].indices)
                terms[j] = None
        terms = [t for t in terms if t is not None]
        out = terms[0]
        for t in terms[1:]:
            out = ir.Binary("+", out, t)
        return out

    def on_scope(s: ir.Scope) -> ir.Scope:
        body = s.body
        if (
            not s.summation
            and isinstance(body, ir.Access)
            and body.source is merged
            and body.indices == s.traversal
            and s.traversal == merged.traversal
            and s.pad == merged.pad
        ):
            return merged
        return s

    return _rewire(program, lambda a: a, on_plus, on_scope)


def _redirect(program: ir.Program, plan: _Plan) -> ir.Program:
    """``S'[idx] -> M[embed(idx)]`` where the read provably stays inside S''s range (so M agrees with S')."""
    embeds = dict(zip(plan.rebound, plan.embeds, strict=True))
    merged = plan.merged

    def on_access(a: ir.Access) -> ir.ValueExpr:
        embed = embeds.get(a.source)
        if embed is None:
            return a
        idx = []
        for m_it, (j, off) in zip(merged.traversal, embed, strict=True):
            if j is None:
                idx.append(ir.IConst(off))
                continue
            it, i = a.source.traversal[j], a.indices[j]
            if (m_it.lo, m_it.hi) != (it.lo + off, it.hi + off):
                lo, hi = bounds(i)
                if lo < it.lo or hi >= it.hi:
                    return a
            idx.append(_shift(i, off))
        return ir.Access(merged, tuple(idx))

    return _rewire(program, on_access, lambda e: e, lambda s: s)


def _install(program: ir.Program, params: dict, plan: _Plan) -> ir.Program:
    s1, s2 = _lookup(program, params["first"]), _lookup(program, params["second"])
    program = replace_scopes(program, {s1: plan.rebound[0], s2: plan.rebound[1]})
    # M goes before the first of the two bindings (sort_bindings moves it after what it reads).
    at = min(
        (k for k, (n, _) in enumerate(program.bindings) if n in (params["first"], params["second"])),
        default=0,
    )
    bindings = list(program.bindings)
    bindings.insert(at, (params["name"], plan.merged))
    program = program.replace(bindings=sort_bindings(bindings))
    if plan.collapse:
        program = _collapse(program, plan)
    program = _redirect(program, plan)
    # Drop what nobody needs: rebound scopes no longer read, and M's own binding when M is bound as an output.
    read = {x for _, s in program.bindings for x in ir.scopes_in(s) if x is not s}
    keep = []
    for n, s in program.bindings:
        if n in program.outputs:
            keep.append((n, s))
        elif s in plan.rebound and s not in read:
            continue
        elif n == params["name"] and sum(s2 is s for _, s2 in program.bindings) > 1:
            continue
        else:
            keep.append((n, s))
    return program.replace(bindings=sort_bindings(keep))


class MergeExpressions(Rule):
    """Merge two independent scopes with the same computation into one new binding ``M``::

        concat: S1 = L_{x:N1} f(W1[x]), S2 = L_{x:N2} f(W2[x])  ->  M = L_{x:N1+N2} f(Wc[x]),
                Wc = L_i W1[i] + W2[i - N1];  S1 = L_x M[x];  S2 = L_x M[x + N1]
        batch:  S1 = L_x f(A1[..]), S2 = L_x f(A2[..])  ->  M = L_{b:2, x} f(A12[b, ..]),
                A12 = L_{b, i} A1[i + n*b] + A2[i + n*(b-1)];  S1 = L_x M[0, x];  S2 = L_x M[1, x]
        join:   S1 = L_{x in [a, m)} f, S2 = L_{x in [m, c)} f  ->  M = L_{x in [a, c)} f;
                S1 = L_x M[x];  S2 = L_x M[x];  S1[g] + S2[g] -> M[g] everywhere

    Conditions: neither scope reads the other; the bodies have the same
    operator structure and, with iterators corresponding by position, the
    same summation ranges. concat: traversal ranges equal except along one
    dimension ``x`` whose ranges start at 0; every access that uses ``x``
    reads it plainly in exactly one dimension (it is concatenated along that
    dimension) and every other access is identical (the shared input).
    batch: identical ranges; accesses identical except for sources of equal
    shapes (stacked with the out-of-range-is-zero trick). join: ranges
    adjacent along one dimension and bodies identical, except constants in
    index functions when both ranges along it are single values (each
    differing constant becomes affine in ``x``). Every rule is exact because
    reading outside a range gives 0. Reads of ``S1``/``S2`` that stay inside
    their ranges are redirected to ``M``; rebound scopes left unread are dropped.
    The two scopes may be bindings or nested scopes (the matmul-shaped scopes a
    convolution's derivation splits off, Fig. 15); they are named by their
    labels (``Y1``, ``Y1.2``).

    Max scopes: two scopes merge only when they reduce alike (a sum with a sum,
    a maximum with a maximum: part of the skeleton compared), and ``M`` takes
    the same reduction. Every way changes only traversal points and operands,
    so ``M`` at each point is the maximum ``S1`` or ``S2`` took there.
    """

    name = "merge_expressions"
    phase = "explore"
    undoes = ("split_expression",)
    variants = ("concat", "batch", "join")
    family = "inter"
    math = "S1 = L f(W1), S2 = L f(W2) -> M = L f(W1 ++ W2); S1 = M[..], S2 = M[..] (concat, batch, join)"

    def match(self, program: ir.Program, ctx: Context = NO_CONTEXT) -> Iterator[Match | Failure]:
        # Bound and nested scopes alike: the matmul-shaped scopes that conv derivations split off are nested.
        bound = [(k, label, scope) for k, (scope, label) in enumerate(scope_labels(program).items())]
        names = program.names()
        name = fresh_name("M", taken_names(program))
        keys = [scope_skeleton(s) for _, _, s in bound]
        for u, (_, n1, s1) in enumerate(bound):
            for v in range(u + 1, len(bound)):
                _, n2, s2 = bound[v]
                if keys[u] != keys[v]:
                    continue
                where = f"{n1}, {n2}"
                reason = _independence(s1, s2, n1, n2)
                pz = _Pairing(s1, s2, names)
                reason = reason or _summation_mismatch(s1, s2) or pz.conflict()
                if reason:
                    yield Failure(self.name, where, reason)
                    continue
                found = list(_plans(pz, name, n1, n2))
                plans = [(way, d, p) for way, d, p in found if isinstance(p, _Plan)]
                for way, d, p in plans:
                    params = {"first": n1, "second": n2, "way": way, "dim": d, "name": name}
                    yield Match(self.name, where, p.summary, MappingProxyType(params))
                if not plans:
                    for reason in dict.fromkeys(r for _, _, r in found if r):
                        yield Failure(self.name, where, reason)

    def apply(self, program: ir.Program, match: Match, ctx: Context = NO_CONTEXT) -> ir.Program:
        params = dict(match.params)
        return _install(program, params, _plan(program, params))


def _independence(s1: ir.Scope, s2: ir.Scope, n1: str, n2: str) -> str | None:
    if s1 in ir.scopes_in(s2):
        return f"{n2} reads {n1}"
    if s2 in ir.scopes_in(s1):
        return f"{n1} reads {n2}"
    return None


def _summation_mismatch(s1: ir.Scope, s2: ir.Scope) -> str | None:
    for a, b in zip(s1.summation, s2.summation, strict=True):
        if (a.lo, a.hi) != (b.lo, b.hi):
            return f"summation ranges differ: {a.name} in [{a.lo}, {a.hi}) vs {b.name} in [{b.lo}, {b.hi})"
    return None


RULES: tuple[Rule, ...] = (MergeExpressions(),)
