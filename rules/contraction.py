"""Contraction rules: two contractions whose results are added become one.

``x @ W + h @ U`` is ``concat(x, h) @ concat(W; U)``: the two summations are
laid end to end along the contracted dimension (an LSTM's gate
pre-activations become one matmul per gate, which expression merging can
then fuse across gates).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from einopt.core import ir
from einopt.core.index import simplify
from einopt.core.rewrite import (
    fold_chain,
    index_text,
    map_accesses,
    map_indices,
    operands,
    product_factors,
    rename_apart,
    replace_subterm,
    source_ranges,
    substitute_iters,
)
from einopt.rules.base import Context, Hit, Rule, hit
from einopt.rules.boundary import ProgramFacts, ProgramScopeRule
from einopt.rules.merge import concat_scope

__all__ = ["MergeSummations", "RULES"]


# --------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------


def _plus_chains(body: ir.ValueExpr) -> list[ir.ValueExpr]:
    """The maximal ``+`` chains of a body (roots of ``a + b + ...``), outermost first, each once."""
    found: dict[ir.ValueExpr, None] = {}
    stack: list[tuple[ir.ValueExpr, bool]] = [(body, False)]
    while stack:
        x, in_chain = stack.pop()
        if isinstance(x, ir.Binary):
            plus = x.op == "+"
            if plus and not in_chain:
                found.setdefault(x)
            stack += ((x.b, plus), (x.a, plus))
        elif isinstance(x, ir.Unary):
            stack.append((x.x, False))
    return list(found)


def _normal(e: ir.ValueExpr) -> ir.ValueExpr:
    return map_indices(e, simplify)


# --------------------------------------------------------------------------
# Pairing two contractions
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Names:
    first: str
    second: str
    labels: Mapping[ir.Scope, str]

    def show(self, e: ir.ValueExpr) -> str:
        if not isinstance(e, ir.Access):
            return str(e)
        src = e.source.name if isinstance(e.source, ir.Tensor) else self.labels.get(e.source, "{...}")
        return f"{src}[{', '.join(index_text(i) for i in e.indices)}]"


def _candidates(p: ir.Scope, q: ir.Scope, names: _Names) -> list[int] | str:
    """Positions of the summation iterator that may be concatenated, or why none can."""
    n1, n2 = names.first, names.second
    if [(a.lo, a.hi) for a in p.traversal] != [(b.lo, b.hi) for b in q.traversal]:
        return f"{n1} and {n2} have different traversal ranges"
    if len(p.summation) != len(q.summation):
        return f"{n1} and {n2} have {len(p.summation)} and {len(q.summation)} summation iterators"
    diff = [
        j
        for j, (a, b) in enumerate(zip(p.summation, q.summation, strict=True))
        if (a.lo, a.hi) != (b.lo, b.hi)
    ]
    if len(diff) > 1:
        return f"{n1} and {n2} sum over different ranges in {len(diff)} iterators"
    return diff or list(range(len(p.summation)))


def _merged(p: ir.Scope, q: ir.Scope, pos: int, names: _Names) -> ir.Scope | str:
    """The contraction summing ``p``'s and ``q``'s terms along summation iterator ``pos``, or why not."""
    n1, n2 = names.first, names.second
    k, kq = p.summation[pos], q.summation[pos]
    if k.lo != 0 or kq.lo != 0:
        return (
            f"Sum {k.name} of {n1} and {n2} starts at {k.lo} and {kq.lo}: concatenation needs ranges from 0"
        )
    fp, fq = product_factors(p.body), product_factors(q.body)
    if len(fp) != len(fq):
        return f"{n1} and {n2} are products of {len(fp)} and {len(fq)} factors"
    corr = dict(zip(q.traversal + q.summation, p.traversal + p.summation, strict=True))
    remap: dict[ir.Access, ir.Access] = {}
    for a, b in zip(fp, fq, strict=True):
        on_a, on_b = k in a.iters(), kq in b.iters()
        if not on_a and not on_b:
            if _normal(a) is not _normal(substitute_iters(b, corr)):
                return (
                    f"factors {names.show(a)} and {names.show(b)} differ "
                    f"(factors that do not read {k.name} must be the same)"
                )
            continue
        if on_a != on_b:
            reads, other = (a, b) if on_a else (b, a)
            return f"factor {names.show(reads)} reads {k.name} but {names.show(other)} does not"
        for f, owner in ((a, p), (b, q)):
            if not isinstance(f, ir.Access):
                if len(fp) == 1:
                    return f"{n1 if owner is p else n2} is not a product"
                return f"factor {names.show(f)} reads {k.name} but is not a tensor read"
        reason = _pair(a, b, k, kq, corr, names)
        if isinstance(reason, str):
            return reason
        e = reason
        ab = concat_scope(a.source, b.source, e, k.hi, kq.hi)
        new = ir.Access(ab, a.indices[:e] + (k,) + a.indices[e + 1 :])
        if remap.setdefault(a, new) is not new:
            return f"factor {names.show(a)} pairs with two different factors of {n2}"
    if not remap:
        return f"no factor of {n1} reads {k.name}"
    km = ir.Iter(k.name, 0, k.hi + kq.hi)
    body = substitute_iters(map_accesses(p.body, lambda x: remap.get(x, x)), {k: km})
    sums = tuple(km if it is k else it for it in p.summation)
    return ir.Scope(p.traversal, sums, body, p.pad if p.pad == q.pad else ())


def _pair(a: ir.Access, b: ir.Access, k: ir.Iter, kq: ir.Iter, corr: dict, names: _Names) -> int | str:
    """The dimension along which ``a`` and ``b`` read ``k`` (the concatenation dimension), or why not."""
    dims = []
    for f, it in ((a, k), (b, kq)):
        on = [j for j, i in enumerate(f.indices) if it in i.iters()]
        if len(on) != 1:
            return f"factor {names.show(f)} reads {k.name} in {len(on)} dimensions"
        if simplify(f.indices[on[0]]) is not it:
            return f"factor {names.show(f)} reads {k.name} not as a plain index"
        dims.append(on[0])
    if dims[0] != dims[1]:
        return f"factors {names.show(a)} and {names.show(b)} read {k.name} in different dimensions"
    e = dims[0]
    mapped = substitute_iters(b, corr)
    for j, (i1, i2) in enumerate(zip(a.indices, mapped.indices, strict=True)):
        if j != e and simplify(i1) is not simplify(i2):
            return f"factors {names.show(a)} and {names.show(b)} differ in index {j}"
    ra, rb = source_ranges(a.source), source_ranges(b.source)
    for j, (x, y) in enumerate(zip(ra, rb, strict=True)):
        if j != e and x != y:
            return f"{names.show(a)} and {names.show(b)} read sources with different ranges in dimension {j}"
    return e


# --------------------------------------------------------------------------
# The rule
# --------------------------------------------------------------------------


def _pairs(scope: ir.Scope) -> Iterator[tuple[ir.ValueExpr, ir.Access, ir.Access]]:
    """Every (chain, P[tau], Q[tau]) with two contraction reads in one ``+`` chain of the body."""
    seen: set[tuple[ir.ValueExpr, ir.Access, ir.Access]] = set()
    for chain in _plus_chains(scope.body):
        terms = [
            t
            for t in dict.fromkeys(operands(chain, "+"))
            if isinstance(t, ir.Access)
            and isinstance(t.source, ir.Scope)
            and t.source.summation
            and not t.source.is_max
        ]
        for u, t1 in enumerate(terms):
            for t2 in terms[u + 1 :]:
                if t1.source is not t2.source and (chain, t1, t2) not in seen:
                    seen.add((chain, t1, t2))
                    yield chain, t1, t2


class MergeSummations(ProgramScopeRule):
    """Add two contractions by concatenating their summation ranges::

        {L_x Sum_{k<K1} f(A[.., k, ..], C)}[tau] + {L_x Sum_{k<K2} f(B[.., k, ..], C)}[tau]
            ->  {L_x Sum_{k<K1+K2} f(AB[.., k, ..], C)}[tau]
        AB = L[.., i:K1+K2, ..] A'[.., i, ..] + B'[.., i - K1, ..]

    ``A'`` is ``A`` restricted to ``[0, K1)`` along its ``k`` dimension (a
    slice scope when ``A`` is longer) and ``B'`` likewise to ``[0, K2)``, so
    ``AB`` is ``A`` followed by ``B``. Conditions: the two reads ``P[tau]``
    and ``Q[tau]`` are terms of one ``+`` chain with identical indices; ``P``
    and ``Q`` have equal traversal ranges and, with iterators corresponding
    by position, equal summation ranges except ``k`` (any summation iterator
    when all are equal), whose ranges start at 0; their bodies are products
    with factors paired by position, each pair either identical (after
    renaming ``Q``'s iterators to ``P``'s) and free of ``k``, or two tensor
    reads that read ``k`` as a plain index in the same single dimension, with
    equal other indices and sources of equal ranges in the other dimensions.
    Exact by distributivity: for ``k < K1`` the merged term is ``P``'s, for
    ``k >= K1`` it is ``Q``'s at ``k - K1``. When the body is exactly
    ``P[x] + Q[x]`` over ``P``'s ranges, the scope becomes the contraction
    itself. ``x @ W + h @ U = concat(x, h) @ concat(W; U)`` (LSTM gates).

    Max scopes: ``P`` and ``Q`` must be sums (a maximum does not add up by
    concatenation: reads of max scopes are not offered); the scope that adds
    their reads may take a maximum (``P[t] + Q[t]`` keeps its value at every
    point).
    """

    name = "merge_summations"
    phase = "explore"
    family = "intra"
    math = "P[t] + Q[t] -> {L_x Sum_{k<K1+K2} f(A ++ B)}[t]  (P = Sum_{k<K1} f(A), Q = Sum_{k<K2} f(B))"

    def match_in(self, scope: ir.Scope, facts: ProgramFacts, ctx: Context) -> Iterator[Hit | str]:
        for chain, t1, t2 in _pairs(scope):
            p, q = t1.source, t2.source
            names = _Names(facts.labels.get(p, "P"), facts.labels.get(q, "Q"), facts.labels)
            if t1.indices != t2.indices:
                yield f"{names.first} and {names.second} are read at different indices"
                continue
            found = _candidates(p, q, names)
            if isinstance(found, str):
                yield found
                continue
            reasons: dict[str, None] = {}
            hits = 0
            for pos in found:
                merged = _merged(p, q, pos, names)
                if isinstance(merged, str):
                    reasons.setdefault(merged)
                    continue
                hits += 1
                k, kq = p.summation[pos], q.summation[pos]
                yield hit(
                    f"merge Sum {k.name} of {names.first} and {names.second} ({k.extent} + {kq.extent}) "
                    "into one contraction",
                    chain=chain,
                    first=t1,
                    second=t2,
                    position=pos,
                )
            if not hits:
                yield from reasons

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        chain: ir.ValueExpr = params["chain"]
        t1: ir.Access = params["first"]
        t2: ir.Access = params["second"]
        p, q = t1.source, t2.source
        merged = _merged(p, q, params["position"], _Names("P", "Q", {}))
        if isinstance(merged, str):
            raise ValueError(f"merge_summations does not apply: {merged}")
        terms = operands(chain, "+")
        if (
            chain is scope.body
            and not scope.summation  # else the scope reduces the sum again (a factor, or a maximum)
            and len(terms) == 2
            and t1.indices == scope.traversal
            and [(a.lo, a.hi) for a in p.traversal] == [(x.lo, x.hi) for x in scope.traversal]
        ):
            return _as_scope(merged, scope)
        # The first P[tau] becomes R[tau]; the first Q[tau] after it goes (matching lists P first).
        u = terms.index(t1)
        v = next(j for j in range(u + 1, len(terms)) if terms[j] is t2)
        out = [ir.Access(merged, t1.indices) if j == u else t for j, t in enumerate(terms) if j != v]
        return scope.replace(body=replace_subterm(scope.body, chain, fold_chain(out, "+")))


def _as_scope(merged: ir.Scope, scope: ir.Scope) -> ir.Scope:
    """``merged`` written over ``scope``'s traversal iterators (same ranges) with ``scope``'s pad."""
    mapping: dict[ir.Iter, ir.IndexExpr] = dict(zip(merged.traversal, scope.traversal, strict=True))
    sums, renamed = rename_apart(merged.summation, {it.name for it in scope.traversal})
    mapping.update(renamed)
    body = substitute_iters(merged.body, mapping)
    return ir.Scope(scope.traversal, sums, body, scope.pad)


RULES: tuple[Rule, ...] = (MergeSummations(),)
