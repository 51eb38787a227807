"""Constant-aware rules: rewrites that hold because of the values of constant tensors.

These are not identities of the algebra; each one holds for the actual
weights, whose minimum, maximum and uniformity come from
:meth:`Context.facts <einopt.rules.base.Context.facts>`. Only tensors in
``ctx.constants`` are constant. Together they give the FSRCNN rewrite of a
PRelu after a convolution into the maximum of two convolutions::

    max(conv(x, W), 0) + a * min(conv(x, W), 0)
      -> max(conv(x, W), a * conv(x, W))        rewrite_prelu_max (every slope <= 1)
      -> max(conv(x, W), conv(x, a * W))        fold_channel_scale

or, with the scale split between a linear part and a ReLU, into two
convolutions that ONNX Runtime fuses (the ReLU into one, the sum into the
other)::

    max(conv(x, W), 0) + a * min(conv(x, W), 0)
      -> a * conv(x, W) + relu((1 - a) * conv(x, W))      rewrite_prelu_relu (every slope <= 1)
      -> conv(x, a * W) + relu(conv(x, (1 - a) * W))      fold_channel_scale, twice
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from einopt.core import ir
from einopt.core.index import bounds
from einopt.core.rewrite import fresh_name, index_text, map_accesses, product_factors, replace_subterm
from einopt.rules.base import Context, Hit, Rule, ScopeRule, hit

__all__ = ["RewritePreluMax", "RewritePreluRelu", "RewritePreluLeaky", "FoldChannelScale", "RULES"]


# --------------------------------------------------------------------------
# Walking bodies
# --------------------------------------------------------------------------


def _subterms(body: ir.ValueExpr) -> list[ir.ValueExpr]:
    """Distinct value subterms of a body, parents before children, left to right (scopes not entered)."""
    return list(ir.walk(body, stop=ir.Access))


def _pairs(e: ir.ValueExpr, op: str) -> list[tuple[ir.ValueExpr, ir.ValueExpr]]:
    """The operands of a binary ``op`` in both orders (nothing if ``e`` is not one)."""
    if isinstance(e, ir.Binary) and e.op == op:
        return [(e.a, e.b), (e.b, e.a)]
    return []


def _is_zero(e: ir.ValueExpr) -> bool:
    return isinstance(e, ir.Const) and e.value == 0.0


# --------------------------------------------------------------------------
# PRelu
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Prelu:
    """One occurrence of ``max(y, 0) + a * min(y, 0)`` (any operand order)."""

    node: ir.ValueExpr
    y: ir.ValueExpr
    slope: ir.ValueExpr


def _prelu_forms(body: ir.ValueExpr) -> list[_Prelu]:
    out = []
    for node in _subterms(body):
        found = next(
            (
                _Prelu(node, y, a)
                for pos, neg in _pairs(node, "+")
                for y, z in _pairs(pos, "max")
                if _is_zero(z)
                for a, m in _pairs(neg, "*")
                for y2, z2 in _pairs(m, "min")
                if y2 is y and _is_zero(z2)
            ),
            None,
        )
        if found is not None:
            out.append(found)
    return out


@dataclasses.dataclass(frozen=True)
class _Slopes:
    """The values a slope can take where it is read (reads outside a tensor give 0)."""

    what: str
    lo: float
    hi: float
    padded: bool  # some reads may fall outside the tensor and give 0
    number: bool = False  # the slope is a number, not a tensor

    @property
    def uniform(self) -> float | None:
        return self.lo if self.lo == self.hi else None

    def describe(self) -> str:
        if self.number:
            return self.what
        return f"{self.what} has values in [{self.lo:g}, {self.hi:g}]" + (
            " (reads outside it give 0)" if self.padded else ""
        )


def _slopes(a: ir.ValueExpr, ctx: Context) -> _Slopes | str:
    """What is known about a slope's values, or why it is not a constant."""
    if isinstance(a, ir.Const):
        return _Slopes(f"slope {a.value:g}", a.value, a.value, False, number=True)
    if not isinstance(a, ir.Access):
        return f"slope {a} is not a constant tensor or number"
    if not isinstance(a.source, ir.Tensor):
        return f"slope {a} is not a constant (it reads a scope)"
    t = a.source
    facts = ctx.facts(t)
    if facts is None:
        return f"slope {t.name} is not a constant"
    padded = any(
        not (0 <= lo and hi < n) for (lo, hi), n in zip((bounds(i) for i in a.indices), t.shape, strict=True)
    )
    lo, hi = facts.min, facts.max
    if padded:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    return _Slopes(f"slope tensor {t.name}", lo, hi, padded)


def _bound(below: bool) -> str:
    return "<= 1" if below else ">= 1"


class _PreluSides(ScopeRule):
    """A PRelu rewrite legal when every slope lies on one side of 1: ``below`` (every slope
    ``<= 1``) or not (every slope ``>= 1``); both when every slope is 1, a refusal saying
    :attr:`straddle` when they lie on both sides."""

    straddle = ""

    def side_hit(self, form: _Prelu, slopes: _Slopes, below: bool) -> Hit:
        raise NotImplementedError

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        for form in _prelu_forms(scope.body):
            slopes = _slopes(form.slope, ctx)
            if isinstance(slopes, str):
                yield slopes
                continue
            sides = [below for below, legal in ((True, slopes.hi <= 1.0), (False, slopes.lo >= 1.0)) if legal]
            for below in sides:
                yield self.side_hit(form, slopes, below)
            if not sides:
                low = f"down to {slopes.lo:g} < 1" + (" (reads outside it give 0)" if slopes.padded else "")
                yield f"{slopes.what} has values up to {slopes.hi:g} > 1 and {low}: {self.straddle}"


class RewritePreluMax(_PreluSides):
    """PRelu as one maximum (or minimum), for the actual slopes::

        max(y, 0) + a * min(y, 0)  ->  max(y, a * y)    when every slope a <= 1
        max(y, 0) + a * min(y, 0)  ->  min(y, a * y)    when every slope a >= 1

    Legality: with ``a <= 1``, ``y >= 0`` gives ``y >= a*y`` and ``y < 0``
    gives ``a*y >= y``, so the maximum picks exactly PRelu's branch; the
    usual slopes in ``[0, 1]`` are a special case, and negative slopes are
    fine. With ``a >= 1`` the inequalities flip and the minimum picks it.
    Operands of ``+``, ``*``, ``max`` and ``min`` may come in either order;
    the slope ``a`` is a number or reads a constant tensor, whose minimum and
    maximum come from the context (a read that may fall outside the tensor
    also counts its padding value 0). Both forms are offered when every slope
    is 1. The result's ``a * y`` is a per-channel scale that
    ``fold_channel_scale`` can move into the weights of the producer of ``y``.

    Max scopes: legal in any scope (one subterm is replaced by a value equal at
    every point; the scope's reduction is kept).
    """

    name = "rewrite_prelu_max"
    phase = "explore"
    family = "constant"
    math = "max(y, 0) + a*min(y, 0) -> max(y, a*y) (a <= 1) | min(y, a*y) (a >= 1)"

    straddle = "neither max(y, a*y) nor min(y, a*y) equals PRelu"

    def side_hit(self, form: _Prelu, slopes: _Slopes, below: bool) -> Hit:
        op = "max" if below else "min"
        return hit(
            f"{op}(y, a*y) for y = {_short(form.y)}: every slope {_bound(below)} ({slopes.describe()})",
            node=form.node,
            y=form.y,
            slope=form.slope,
            op=op,
        )

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        y: ir.ValueExpr = params["y"]
        new = ir.Binary(params["op"], y, ir.Binary("*", params["slope"], y))
        return scope.replace(body=replace_subterm(scope.body, params["node"], new))


class RewritePreluRelu(_PreluSides):
    """PRelu as a scaled input plus a ReLU, for the actual slopes::

        max(y, 0) + a * min(y, 0)  ->  a * y + relu((1 - a) * y)    when every slope a <= 1
        max(y, 0) + a * min(y, 0)  ->  a * y - relu((a - 1) * y)    when every slope a >= 1

    Legality: ``max(y, 0) + a * min(y, 0) = a * y + (1 - a) * max(y, 0)``
    for any ``a`` (``y >= 0``: ``a*y + (1-a)*y``; ``y < 0``: ``a*y``), and a
    factor ``c >= 0`` moves into a ReLU, ``c * max(y, 0) = relu(c * y)``:
    ``c = 1 - a`` when every ``a <= 1``, ``c = a - 1`` (with the sign outside)
    when every ``a >= 1``. Slopes are read as in ``rewrite_prelu_max``. Both
    scales of ``y`` are per-channel constants that ``fold_channel_scale``
    moves into the weights of ``y``'s producer, which leaves two
    convolutions, one with a fused ReLU and one that the sum fuses into.

    Max scopes: legal in any scope (a subterm equal at every point; the
    scope's reduction is kept).
    """

    name = "rewrite_prelu_relu"
    phase = "explore"
    family = "constant"
    math = "max(y, 0) + a*min(y, 0) -> a*y + relu((1-a)*y) (a <= 1) | a*y - relu((a-1)*y) (a >= 1)"

    straddle = "the ReLU's scale 1 - a changes sign"

    def side_hit(self, form: _Prelu, slopes: _Slopes, below: bool) -> Hit:
        sign, scale = ("+", "(1-a)") if below else ("-", "(a-1)")
        return hit(
            f"a*y {sign} relu({scale}*y) for y = {_short(form.y)}: every slope {_bound(below)} "
            f"({slopes.describe()})",
            node=form.node,
            y=form.y,
            slope=form.slope,
            sign=sign,
        )

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        y: ir.ValueExpr = params["y"]
        a: ir.ValueExpr = params["slope"]
        one = ir.Const(1.0)
        if params["sign"] == "+":
            relu_scale = ir.Const(1.0 - a.value) if isinstance(a, ir.Const) else ir.Binary("-", one, a)
        else:
            relu_scale = ir.Const(a.value - 1.0) if isinstance(a, ir.Const) else ir.Binary("-", a, one)
        relu = ir.Unary("relu", ir.Binary("*", relu_scale, y))
        new = ir.Binary(params["sign"], ir.Binary("*", a, y), relu)
        return scope.replace(body=replace_subterm(scope.body, params["node"], new))


class RewritePreluLeaky(ScopeRule):
    """PRelu with one slope everywhere is a leaky ReLU::

        max(y, 0) + a * min(y, 0)  ->  leaky_relu(y, alpha)    when every slope a == alpha

    Exact: for ``y > 0`` both give ``y``, otherwise both give ``alpha * y``.
    The slope is a number, or reads a constant tensor whose elements are all
    equal (a read that may fall outside the tensor counts its padding value
    0 too, so it only qualifies when ``alpha`` is 0).

    Max scopes: legal in any scope (a subterm equal at every point; the
    scope's reduction is kept).
    """

    name = "rewrite_prelu_leaky"
    phase = "explore"
    family = "constant"
    math = "max(y, 0) + a*min(y, 0) -> leaky_relu(y, alpha) (every a == alpha)"

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        for form in _prelu_forms(scope.body):
            slopes = _slopes(form.slope, ctx)
            if isinstance(slopes, str):
                yield slopes
            elif slopes.uniform is None:
                yield f"slopes are not all equal: {slopes.describe()}"
            else:
                alpha = slopes.uniform
                yield hit(f"leaky_relu({_short(form.y)}, {alpha:g})", node=form.node, y=form.y, alpha=alpha)

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        new = ir.Unary("leaky_relu", params["y"], float(params["alpha"]))
        return scope.replace(body=replace_subterm(scope.body, params["node"], new))


# --------------------------------------------------------------------------
# Folding a per-channel scale into the weights
# --------------------------------------------------------------------------


def _replace_factor(e: ir.ValueExpr, old: ir.ValueExpr, new: ir.ValueExpr) -> ir.ValueExpr:
    """A product with ONE occurrence of the factor ``old`` replaced (``W * W`` scales once)."""
    done = False

    def go(x: ir.ValueExpr) -> ir.ValueExpr:
        nonlocal done
        if done:
            return x
        if x is old:
            done = True
            return new
        if isinstance(x, ir.Binary) and x.op == "*":
            a = go(x.a)
            return ir.Binary("*", a, go(x.b))
        return x

    return go(e)


def _constant_leaves(e: ir.ValueExpr, ctx: Context) -> list[ir.Access] | None:
    """The tensor reads of an expression built only from numbers and reads of constant tensors
    (``None`` when it reads a scope or a tensor that is not constant)."""
    reads: list[ir.Access] = []
    for x in _subterms(e):
        if isinstance(x, ir.Access):
            if not (isinstance(x.source, ir.Tensor) and ctx.is_constant(x.source)):
                return None
            reads.append(x)
    return reads


def _scaled_reads(e: ir.ValueExpr, ctx: Context) -> Iterator[tuple[ir.Access, ir.ValueExpr | None]]:
    """``e`` as a scope read, alone or plus a constant (``S[tau] + B[f]``, a biased convolution)."""
    if isinstance(e, ir.Access) and isinstance(e.source, ir.Scope):
        yield e, None
    for read, rest in _pairs(e, "+"):
        if (
            isinstance(read, ir.Access)
            and isinstance(read.source, ir.Scope)
            and _constant_leaves(rest, ctx) is not None
        ):
            yield read, rest


def _scale_dims(
    scale: ir.ValueExpr, reads: list[ir.Access], read: ir.Access, weight: ir.Access
) -> tuple[tuple[tuple[ir.Access, tuple[int | None, ...]], ...], str | None]:
    """For each tensor read of ``scale`` and each of its indices: the dimension of ``weight`` it
    becomes (``None``: a constant).

    ``scale`` multiplies ``read`` (an access to a scope S); an index of the
    scale equal to the ``j``-th index of the read means "S's ``j``-th
    traversal iterator", which must be a plain index of ``weight`` in S's body.
    Returns a reason instead when that fails.
    """
    s: ir.Scope = read.source
    found = []
    for acc in dict.fromkeys(reads):
        out: list[int | None] = []
        for g in acc.indices:
            if isinstance(g, ir.IConst):
                out.append(None)
                continue
            js = [j for j, tau in enumerate(read.indices) if tau is g]
            if not js:
                return (
                    (),
                    f"scale index {index_text(g)} of {scale} is not an index of the scaled read {_short(read)}",
                )
            dims = [d for j in js for d, p in enumerate(weight.indices) if p is s.traversal[j]]
            if not dims:
                shown = " or ".join(s.traversal[j].name for j in js)
                return (), f"iterator {shown} of the scaled scope is not a plain index of {weight}"
            out.append(dims[0])
        found.append((acc, tuple(out)))
    return tuple(found), None


def _short(e: ir.ValueExpr) -> str:
    """An expression for a one-line summary: a scope read shows as ``{...}[indices]``."""
    if isinstance(e, ir.Access) and isinstance(e.source, ir.Scope):
        return "{...}[" + ", ".join(index_text(i) for i in e.indices) + "]"
    text = str(e)
    return text if len(text) <= 60 else text[:57] + "..."


class FoldChannelScale(ScopeRule):
    """Fold a scale that depends only on the output index into the constant weights::

        C[g] * S[tau]  ->  S'[tau],   S = L_t Sum_s P[pi] * R,   S' = L_t Sum_s P'[pi] * R,
        P' = L_i C[g'] * P[i]

        C[g] * (S[tau] + K)  ->  S'[tau] + C[g] * K

    ``P`` is a constant tensor and ``S`` a scope whose body is a product with
    the factor ``P[pi]``. The scale ``C[g]`` is a constant tensor read, or an
    expression of numbers and such reads (``1 - a[f]``); a constant ``K``
    added to the read (a bias) stays outside, scaled. Every index of every
    read in the scale is a constant or syntactically equal to some
    ``tau_j``, and then ``S``'s ``j``-th traversal iterator ``t_j`` is a
    plain index ``pi_d = t_j`` of ``P``; ``g'`` reads ``i_d`` there.
    Identity: ``a[f] * Sum W[f, ...] x = Sum (a[f] W[f, ...]) x`` because the
    scale does not depend on the summation, and ``a * (s + k) = a*s + a*k``;
    reads of ``S`` outside its range are 0 on both sides, and so are reads
    of ``P'`` outside ``P``. ``P'`` reads only constants, so compile-time
    evaluation produces the scaled weights. The scale may stand on either
    side of ``*``. After ``rewrite_prelu_max`` this turns ``max(conv(x, W),
    a * conv(x, W))`` into ``max(conv(x, W), conv(x, a * W))`` (FSRCNN);
    after ``rewrite_prelu_relu``, ``a * conv(x, W) + relu((1 - a) * conv(x, W))``
    into two convolutions.

    Max scopes: the scope that reads ``S`` may take a maximum (its body keeps
    its value at every point). A scaled ``S`` that takes a maximum is refused:
    ``a * Max_s f`` is not ``Max_s a * f`` for a negative ``a``.
    """

    name = "fold_channel_scale"
    phase = "explore"
    family = "constant"
    math = "C[g] * ({L_t Sum_s P[pi] * R}[tau] + K) -> {L_t Sum_s (C[g'] * P)[pi] * R}[tau] + C[g] * K"

    def match_scope(self, scope: ir.Scope, ctx: Context) -> Iterator[Hit | str]:
        for node in _subterms(scope.body):
            for scale, scaled in _pairs(node, "*"):
                reads = _constant_leaves(scale, ctx)
                if not reads:
                    continue
                for read, rest in _scaled_reads(scaled, ctx):
                    yield from self._weights(node, scale, reads, read, rest, ctx)

    def _weights(
        self,
        node: ir.ValueExpr,
        scale: ir.ValueExpr,
        reads: list[ir.Access],
        read: ir.Access,
        rest: ir.ValueExpr | None,
        ctx: Context,
    ) -> Iterator[Hit | str]:
        if read.source.is_max:
            yield f"the scope scaled by {scale} takes a maximum: a scale does not move into it"
            return
        body = read.source.body
        if not (isinstance(body, ir.Access) or (isinstance(body, ir.Binary) and body.op == "*")):
            what = body.op if isinstance(body, ir.Binary) else type(body).__name__
            yield f"the scope scaled by {scale} is not a product (its body is a {what})"
            return
        reasons: list[str] = []
        variable: list[str] = []
        found = False
        for factor in dict.fromkeys(product_factors(body)):
            if not (isinstance(factor, ir.Access) and isinstance(factor.source, ir.Tensor)):
                continue
            if not ctx.is_constant(factor.source):
                variable.append(factor.source.name)
                continue
            dims, reason = _scale_dims(scale, reads, read, factor)
            if reason is not None:
                reasons.append(reason)
                continue
            found = True
            yield hit(
                f"fold {scale} into {factor}"
                + (f" (and scale {_short(rest)} with it)" if rest is not None else ""),
                node=node,
                scale=scale,
                read=read,
                rest=rest,
                weight=factor,
                dims=dims,
            )
        if found:
            return
        if not reasons and variable:
            names = ", ".join(dict.fromkeys(variable))
            many = len(set(variable)) > 1
            reasons = [
                f"operand{'s' if many else ''} {names} of the scope scaled by {scale} "
                f"{'are' if many else 'is'} not constant"
            ]
        yield from reasons or [f"the scope scaled by {scale} reads no tensor in its product"]

    def rewrite(self, scope: ir.Scope, params: Mapping[str, Any], ctx: Context) -> ir.Scope:
        scale: ir.ValueExpr = params["scale"]
        read: ir.Access = params["read"]
        rest: ir.ValueExpr | None = params["rest"]
        weight: ir.Access = params["weight"]
        dims = dict(params["dims"])
        p = weight.source
        taken: set[str] = {p.name} | {a.source.name for a in dims}
        its = []
        for n in p.shape:
            name = fresh_name("i", taken)
            taken.add(name)
            its.append(ir.Iter(name, 0, n))

        def at_weight(acc: ir.Access) -> ir.Access:
            g = tuple(i if d is None else its[d] for i, d in zip(acc.indices, dims[acc], strict=True))
            return acc.source[g]

        scaled = ir.Scope(tuple(its), (), ir.Binary("*", map_accesses(scale, at_weight), p[tuple(its)]))
        s = read.source
        new_s = s.replace(body=_replace_factor(s.body, weight, scaled[weight.indices]))
        new: ir.ValueExpr = new_s[read.indices]
        if rest is not None:
            new = ir.Binary("+", new, ir.Binary("*", scale, rest))
        return scope.replace(body=replace_subterm(scope.body, params["node"], new))


RULES: tuple[Rule, ...] = (RewritePreluMax(), RewritePreluRelu(), RewritePreluLeaky(), FoldChannelScale())
