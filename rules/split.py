"""Expression splitting (method.md section 3): a bound scope's traversal space becomes parts.

A part is the same computation over a sub-space of the traversal; the scope is
rebound to the recombination that adds the parts read with identical indices.
Reading a part outside its range gives 0, so the sum of disjoint parts that
cover the space is their concatenation, exactly.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from types import MappingProxyType

from einopt.core import ir
from einopt.core.index import LinearForm, bounds, from_linear_form, linear_form, substitute
from einopt.core.rewrite import (
    accesses,
    fresh_name,
    iter_names,
    map_accesses,
    map_indices,
    replace_scopes,
    sort_bindings,
    source_ranges,
    substitute_iters,
    taken_names,
)
from einopt.rules.base import NO_CONTEXT, Context, Failure, Match, Rule
from einopt.rules.fusion import bind_scope, bound_name, nested_sums

__all__ = ["SplitExpression", "RULES", "bound_scopes", "add_bindings"]


# --------------------------------------------------------------------------
# Helpers shared with rules/merge.py
# --------------------------------------------------------------------------


def bound_scopes(program: ir.Program) -> list[tuple[int, str, ir.Scope]]:
    """Each distinct bound scope once: (binding position, first name, scope)."""
    seen: set[ir.Scope] = set()
    out = []
    for k, (name, s) in enumerate(program.bindings):
        if s not in seen:
            seen.add(s)
            out.append((k, name, s))
    return out


def add_bindings(
    program: ir.Program, before: str, new: list[tuple[str, ir.Scope]]
) -> tuple[tuple[str, ir.Scope], ...]:
    """``program``'s bindings with ``new`` inserted before binding ``before``, producers first."""
    bindings = list(program.bindings)
    at = next(k for k, (n, _) in enumerate(bindings) if n == before)
    return sort_bindings(bindings[:at] + new + bindings[at:])


def rename_iter(body: ir.ValueExpr, old: ir.Iter, new: ir.IndexExpr) -> ir.ValueExpr:
    """``body`` with ``old`` replaced by ``new`` and no simplification (the index functions stay as written)."""
    return map_indices(body, lambda i: substitute(i, {old: new}) if old in i.iters() else i)


# --------------------------------------------------------------------------
# Candidates, inferred from the index functions
# --------------------------------------------------------------------------


def _range_points(scope: ir.Scope, x: ir.Iter) -> list[int]:
    """The middle of ``x``'s range and the points where an affine access on ``x`` enters or leaves
    its source's range for some value of the other iterators (the padding boundaries)."""
    points = {x.lo + x.extent // 2}
    for a in accesses(scope.body):
        for idx, (src_lo, src_hi) in zip(a.indices, source_ranges(a.source), strict=True):
            lf = linear_form(idx)
            c = lf.coeff(x)
            if c == 0 or not lf.is_affine:
                continue
            rest = from_linear_form(LinearForm(tuple(t for t in lf.coeffs if t[0] is not x), (), lf.const))
            rmin, rmax = bounds(rest)
            # Every read is inside [src_lo, src_hi) iff c*x + rmin >= src_lo and c*x + rmax < src_hi.
            if c > 0:
                first, last = -((rmin - src_lo) // c), (src_hi - 1 - rmax) // c
            else:
                first, last = -((src_hi - 1 - rmax) // -c), (rmin - src_lo) // -c
            points |= {first, last + 1}
    return sorted(p for p in points if x.lo < p < x.hi)


def _residues(scope: ir.Scope, x: ir.Iter) -> list[int]:
    """Moduli k for which ``x = k*x' + q`` exposes structure: ``x`` inside ``// k`` or ``% k`` with a
    coefficient k does not divide, or ``x`` next to an iterator whose coefficient is k times finer."""
    found: set[int] = set()
    for a in accesses(scope.body):
        for idx in a.indices:
            if x not in idx.iters():
                continue
            for n in ir.walk(idx):
                if isinstance(n, (ir.IFloorDiv, ir.IMod)) and n.k > 1:
                    lf = linear_form(n.a)
                    if lf.coeff(x) % n.k:
                        found.add(n.k)
            lf = linear_form(idx)
            cx = abs(lf.coeff(x))
            if cx and lf.is_affine:
                for it, c in lf.coeffs:
                    if it is not x and abs(c) > 1:
                        found.add(abs(c) // math.gcd(abs(c), cx))
    return sorted(k for k in found if k > 1)


# --------------------------------------------------------------------------
# The parts
# --------------------------------------------------------------------------


def range_parts(scope: ir.Scope, axis: int, at: int) -> list[tuple[ir.Scope, tuple[ir.IndexExpr, ...]]]:
    """``scope`` restricted to ``x < at`` and ``x >= at``, each read at the traversal iterators."""
    x = scope.traversal[axis]
    out = []
    for lo, hi in ((x.lo, at), (at, x.hi)):
        nx = ir.Iter(x.name, lo, hi)
        traversal = scope.traversal[:axis] + (nx,) + scope.traversal[axis + 1 :]
        part = ir.Scope(traversal, scope.summation, rename_iter(scope.body, x, nx), (), scope.reduce)
        out.append((part, scope.traversal))
    return out


UNITS = ("before", "after", "none")
"""Where a residue part keeps its unit residue axis: before the quotient ``(.., q, x', ..)``, after it
``(.., x', q, ..)`` (the layout of ``x`` itself: ``x = k*x' + q``), or nowhere."""


def residue_parts(
    scope: ir.Scope, axes: int | tuple[int, ...], k: int, units: str = "before"
) -> list[tuple[ir.Scope, tuple[ir.IndexExpr, ...]]]:
    """One part per residue ``p`` of ``x = k*x' + q`` (per combination of residues when several axes
    are split at once): traversal ``(.., q:[p, p+1), x', ..)``, read at ``(.., x % k, x // k, ..)``,
    body ``f(k*x' + p)``: the residue is a constant in each part, so a phase's index functions
    fold to plain offsets (``(2*x' + 1 + 1 - r) // 2`` is ``x' + 1`` for ``r`` in ``[0, 2)``), which is
    what lets an operator take it. ``units`` (one of :data:`UNITS`) places the unit residue axis
    after the quotient instead (read at ``(.., x // k, x % k, ..)``), or drops it (traversal
    ``(.., x', ..)``, read at ``(.., x // k, ..)``: only right where another read tells the phases
    apart, as the stacked concatenation does). Parts come in the order of
    ``itertools.product(range(k), repeat=len(axes))``."""
    if units not in UNITS:
        raise ValueError(f"units must be one of {UNITS}, not {units!r}")
    axes = (axes,) if isinstance(axes, int) else axes
    taken = set(iter_names(scope))
    split: dict[int, tuple[ir.Iter, ir.Iter]] = {}  # axis -> (q over [0, k), x')
    for axis in axes:
        x = scope.traversal[axis]
        q_name = fresh_name(f"{x.name}r", taken)
        x_name = fresh_name(f"{x.name}q", taken | {q_name})
        taken |= {q_name, x_name}
        split[axis] = (ir.Iter(q_name, 0, k), ir.Iter(x_name, x.lo // k, (x.hi - 1) // k + 1))
    body = substitute_iters(
        scope.body,
        {scope.traversal[a]: ir.IAdd(ir.IMul(ir.IConst(k), xq), q_all) for a, (q_all, xq) in split.items()},
    )
    read: list[ir.IndexExpr] = []
    for axis, x in enumerate(scope.traversal):
        read += _arrange(units, ir.IMod(x, k), ir.IFloorDiv(x, k)) if axis in split else [x]
    out = []
    for residues in itertools.product(range(k), repeat=len(axes)):
        fixed = {a: ir.Iter(split[a][0].name, p, p + 1) for a, p in zip(axes, residues, strict=True)}
        traversal: list[ir.Iter] = []
        for axis, x in enumerate(scope.traversal):
            traversal += _arrange(units, fixed[axis], split[axis][1]) if axis in split else [x]
        part_body = substitute_iters(
            body, {split[a][0]: ir.IConst(p) for a, p in zip(axes, residues, strict=True)}
        )
        out.append((ir.Scope(tuple(traversal), scope.summation, part_body, (), scope.reduce), tuple(read)))
    return out


def _arrange(units: str, residue, quotient) -> list:
    return {"before": [residue, quotient], "after": [quotient, residue], "none": [quotient]}[units]


class SplitExpression(Rule):
    """Split the traversal space of a bound scope into parts that become new bindings::

        Y = L_x f(x)  ->  Y_a = L_{x in [lo, m)} f(x);  Y_b = L_{x in [m, hi)} f(x);  Y = L_x Y_a[x] + Y_b[x]
        Y = L_x f(x)  ->  Y_p = L_{q in [p, p+1), x'} f(k*x' + q);  Y = L_x sum_p Y_p[x % k, x // k]

    Reads outside a part's range are 0, so adding disjoint parts that cover the
    range (read with identical indices) is their concatenation: always exact.
    By range, the split points are the middle of ``x``'s range and the points
    where an access on ``x`` crosses its source's range (the padding
    boundaries). By residue, ``k`` comes from the index functions (``x`` inside
    ``// k`` or ``% k``, or beside an iterator with coefficient k); ``x'``
    covers ``x // k`` for every ``x`` in range in every part (points outside
    are computed and never read). Splitting a strided ConvTranspose's output
    by residue gives its phase convolutions. The ``residues`` variant splits
    every axis with residue ``k`` at once (``k**n`` parts: the phases of an
    ``n``-dimensional one in one step). Bound scopes are split, and summing
    scopes nested in a binding's body (a ConvTranspose written inside its bias
    epilogue), which are bound first (``bind_scope``, then the split, in one
    step); readers keep reading ``Y``.

    Max scopes: split the same way; each part takes the maximum over the same
    iterators at its own traversal points, and the parts are still added (as
    values: at every point one part is read in range, the others give 0).
    """

    name = "split_expression"
    phase = "explore"
    undoes = ("merge_expressions",)
    variants = ("range", "residue", "residues", "stacked", "interleaved")
    variant_param = "mode"
    family = "inter"
    math = (
        "Y = L_x f -> Y_a = L_{x<m} f, Y_b = L_{x>=m} f; Y = L_x Y_a[x] + Y_b[x] (or by residue x = k*x' + q)"
    )

    def match(self, program: ir.Program, ctx: Context = NO_CONTEXT) -> Iterator[Match | Failure]:
        taken = taken_names(program)
        for _, name, scope in bound_scopes(program):
            yield from self._scope_matches(scope, name, taken, {})
        for binding, scope in nested_sums(program):
            name = bound_name(program, binding)
            nested = {"nested_in": binding, "scope": scope}
            epilogue = epilogue_read(program.scope(binding), scope)
            yield from self._scope_matches(scope, name, taken | {name}, nested, epilogue)

    def _scope_matches(
        self, scope: ir.Scope, name: str, taken: set[str], nested: dict, epilogue: bool = False
    ) -> Iterator[Match | Failure]:
        """The splits of one scope, bound as ``name`` (``nested`` says where a nested one is read:
        it is bound as ``name`` first; with ``epilogue``, the stacked split takes the binding's
        epilogue into its parts instead)."""
        where = nested.get("nested_in", name)
        what = f"{name} (nested in {where})" if nested else name
        if all(it.extent == 1 for it in scope.traversal):
            yield Failure(self.name, where, f"every traversal iterator of {what} has a single value")
            return
        for axis, x in enumerate(scope.traversal):
            if x.extent == 1:
                continue
            for at in _range_points(scope, x):
                names = _part_names(name, 2, taken)
                yield Match(
                    self.name,
                    where,
                    f"split {x.name} of {what} at {at} into {', '.join(names)}",
                    MappingProxyType(
                        {"binding": name, "axis": axis, "mode": "range", "at": at, "names": names, **nested}
                    ),
                )
            for k in _residues(scope, x):
                if x.extent < k:
                    yield Failure(
                        self.name, where, f"{x.name} has {x.extent} values, fewer than the residue {k}"
                    )
                    continue
                names = _part_names(name, k, taken)
                yield Match(
                    self.name,
                    where,
                    f"split {x.name} of {what} by residue {k} into {', '.join(names)}",
                    MappingProxyType(
                        {
                            "binding": name,
                            "axes": (axis,),
                            "mode": "residue",
                            "k": k,
                            "names": names,
                            **nested,
                        }
                    ),
                )
        yield from self._all_residues(scope, name, taken, nested, epilogue)

    def _all_residues(
        self, scope: ir.Scope, name: str, taken: set[str], nested: dict, epilogue: bool
    ) -> Iterator[Match]:
        """Every axis with residue ``k`` split at once (the ``k**n`` phases of a strided
        ConvTranspose in ``n`` dimensions), where two or more axes have it."""
        by_k: dict[int, list[int]] = {}
        for axis, x in enumerate(scope.traversal):
            for k in _residues(scope, x) if x.extent > 1 else ():
                if x.extent >= k:
                    by_k.setdefault(k, []).append(axis)
        for k, axes in sorted(by_k.items()):
            if len(axes) < 2:
                continue
            names = _part_names(name, k ** len(axes), taken)
            its = ", ".join(scope.traversal[a].name for a in axes)
            where = nested.get("nested_in", name)
            what = f"{name} (nested in {where})" if nested else name
            yield Match(
                self.name,
                where,
                f"split {its} of {what} by residue {k} into {', '.join(names)}",
                MappingProxyType(
                    {
                        "binding": name,
                        "axes": tuple(axes),
                        "mode": "residues",
                        "k": k,
                        "names": names,
                        **nested,
                    }
                ),
            )
            joined = (*names, fresh_name(f"{name}c", taken | set(names)))
            with_epilogue = f", each with {where}'s epilogue" if epilogue else ""
            yield Match(
                self.name,
                where,
                f"split {its} of {what} by residue {k} into {', '.join(names)}, interleaved as "
                f"{joined[-1]}{with_epilogue}",
                MappingProxyType(
                    {
                        "binding": name,
                        "axes": tuple(axes),
                        "mode": "interleaved",
                        "k": k,
                        "names": joined,
                        "epilogue": epilogue,
                        **nested,
                    }
                ),
            )
            stack = axes[0] - 1
            if _stackable(scope, axes, stack):
                yield Match(
                    self.name,
                    where,
                    f"split {its} of {what} by residue {k} into {', '.join(names)}, stacked along "
                    f"{scope.traversal[stack].name} as {joined[-1]}{with_epilogue}",
                    MappingProxyType(
                        {
                            "binding": name,
                            "axes": tuple(axes),
                            "mode": "stacked",
                            "k": k,
                            "stack": stack,
                            "names": joined,
                            "epilogue": epilogue,
                            **nested,
                        }
                    ),
                )

    def apply(self, program: ir.Program, match: Match, ctx: Context = NO_CONTEXT) -> ir.Program:
        p = match.params
        if p["mode"] in ("stacked", "interleaved"):
            return _apply_joined(program, p)
        if "nested_in" in p:
            program = bind_scope(program, p["nested_in"], p["scope"], p["binding"])
        scope = program.scope(p["binding"])
        if p["mode"] == "range":
            parts = range_parts(scope, p["axis"], p["at"])
        else:
            parts = residue_parts(scope, p["axes"], p["k"])
        body: ir.ValueExpr | None = None
        for part, read in parts:
            term = ir.Access(part, read)
            body = term if body is None else ir.Binary("+", body, term)
        rebound = ir.Scope(scope.traversal, (), body, scope.pad)
        program = replace_scopes(program, {scope: rebound})
        new = [(n, part) for n, (part, _) in zip(p["names"], parts, strict=True)]
        return program.replace(bindings=add_bindings(program, p["binding"], new))


def _stackable(scope: ir.Scope, axes: list[int], stack: int) -> bool:
    """Whether the split axes are consecutive and follow an axis ``stack`` from 0 with several values
    (the channel axis of DepthToSpace's layout)."""
    consecutive = list(axes) == list(range(axes[0], axes[0] + len(axes)))
    if not consecutive or stack < 0:
        return False
    x = scope.traversal[stack]
    return x.lo == 0 and x.extent > 1


def stacked_residue_parts(
    scope: ir.Scope, axes: tuple[int, ...], k: int, stack: int, parts: list[ir.Scope]
) -> tuple[ir.Scope, tuple[ir.IndexExpr, ...]]:
    """The residue parts of ``scope`` (without their residue axes) concatenated along axis ``stack``
    (phase ``p`` at ``[p*F, (p+1)*F)``), and where the scope reads that concatenation: ``C[..,
    (sum_a (x_a % k) * k**(n-1-a)) * F + f, .., x_a // k, ..]`` (DepthToSpace, DCR, in two
    dimensions)."""
    x_stack = scope.traversal[stack]
    size = x_stack.extent
    g = ir.Iter(x_stack.name, 0, size * len(parts))
    traversal = tuple(g if axis == stack else x for axis, x in enumerate(parts[0].traversal))
    body: ir.ValueExpr | None = None
    for p, part in enumerate(parts):
        read = tuple(ir.ISub(g, ir.IConst(p * size)) if x is g and p else x for x in traversal)
        term = ir.Access(part, read)
        body = term if body is None else ir.Binary("+", body, term)
    concat = ir.Scope(traversal, (), body)
    phase: ir.IndexExpr = ir.IMod(scope.traversal[axes[0]], k)
    for a in axes[1:]:
        phase = ir.IAdd(ir.IMul(phase, ir.IConst(k)), ir.IMod(scope.traversal[a], k))
    outer: list[ir.IndexExpr] = []
    for axis, x in enumerate(scope.traversal):
        if axis == stack:
            outer.append(ir.IAdd(ir.IMul(phase, ir.IConst(size)), x))
        else:
            outer.append(ir.IFloorDiv(x, k) if axis in axes else x)
    return concat, tuple(outer)


def epilogue_read(outer: ir.Scope, nested: ir.Scope) -> bool:
    """Whether ``outer`` is an elementwise epilogue of ``nested``: it sums nothing, has no padding,
    and reads ``nested`` once, at its own traversal, over the same ranges (a contraction written
    inside its bias epilogue). Such an epilogue can follow the contraction into its parts."""
    if outer.summation or outer.pad or outer.traversal != nested.traversal:
        return False
    reads = [a for a in accesses(outer.body) if a.source is nested]
    return len(reads) == 1 and reads[0].indices == outer.traversal


def _epilogue_parts(
    outer: ir.Scope, nested: ir.Scope, axes: tuple[int, ...], k: int, units: str
) -> list[tuple[ir.Scope, tuple[ir.IndexExpr, ...]]]:
    """The residue parts of ``outer`` (their residue axes placed by ``units``), each reading the
    matching residue part of ``nested`` (without residue axes) at its quotients: the epilogue
    (``+ B[f]``) applied per phase. Each comes with where ``outer`` reads it, as
    :func:`residue_parts` gives (``outer`` and ``nested`` have one traversal)."""
    out = []
    residues = itertools.product(range(k), repeat=len(axes))
    flat = residue_parts(nested, axes, k, "none")
    laid_out = flat if units == "none" else residue_parts(nested, axes, k, units)
    for phase, (part, _), (shape, read) in zip(residues, flat, laid_out, strict=True):
        split = {
            outer.traversal[a]: ir.IAdd(ir.IMul(ir.IConst(k), part.traversal[a]), ir.IConst(r))
            for a, r in zip(axes, phase, strict=True)
        }
        body = substitute_iters(outer.body, split)
        body = map_accesses(
            body, lambda a, part=part: ir.Access(part, part.traversal) if a.source is nested else a
        )
        out.append((ir.Scope(shape.traversal, (), body), read))
    return out


def interleaved_residue_parts(parts: list[ir.Scope], axes: tuple[int, ...], k: int) -> ir.Scope:
    """Residue parts laid out as ``(.., x', q:[p, p+1), ..)`` added over the full residue ranges
    ``[0, k)``: each fills its own residue slots, so the sum is their concatenation along every
    residue axis, and the scope they were split from reads it at ``(.., x // k, x % k, ..)``, a
    reshape."""
    residue_at = {a + n + 1 for n, a in enumerate(sorted(axes))}
    traversal = tuple(
        ir.Iter(x.name, 0, k) if d in residue_at else x for d, x in enumerate(parts[0].traversal)
    )
    body: ir.ValueExpr | None = None
    for part in parts:
        term = ir.Access(part, traversal)
        body = term if body is None else ir.Binary("+", body, term)
    return ir.Scope(traversal, (), body)


def _apply_joined(program: ir.Program, p) -> ir.Program:
    """The stacked or interleaved split: the parts, their concatenation, and the binding rebound to
    read it (with ``epilogue``, the binding's epilogue goes into the parts of the nested
    contraction)."""
    units = "none" if p["mode"] == "stacked" else "after"
    if p.get("epilogue"):
        scope = program.scope(p["nested_in"])
        pieces = _epilogue_parts(scope, p["scope"], p["axes"], p["k"], units)
        binding = p["nested_in"]
    else:
        if "nested_in" in p:
            program = bind_scope(program, p["nested_in"], p["scope"], p["binding"])
        scope = program.scope(p["binding"])
        pieces = residue_parts(scope, p["axes"], p["k"], units)
        binding = p["binding"]
    parts = [part for part, _ in pieces]
    if p["mode"] == "stacked":
        concat, read = stacked_residue_parts(scope, p["axes"], p["k"], p["stack"], parts)
    else:  # interleaved: the parts' own read, (.., x // k, x % k, ..), of their concatenation
        concat, read = interleaved_residue_parts(parts, p["axes"], p["k"]), pieces[0][1]
    rebound = ir.Scope(scope.traversal, (), ir.Access(concat, read), scope.pad)
    program = replace_scopes(program, {scope: rebound})
    new = [*zip(p["names"], parts, strict=False), (p["names"][-1], concat)]
    return program.replace(bindings=add_bindings(program, binding, new))


def _part_names(name: str, count: int, taken: set[str]) -> tuple[str, ...]:
    out: list[str] = []
    for k in range(count):
        out.append(fresh_name(f"{name}{k}", taken | set(out)))
    return tuple(out)


RULES: tuple[Rule, ...] = (SplitExpression(),)
