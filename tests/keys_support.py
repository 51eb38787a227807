"""Rewriters, mutators and a brute-force reference for the canonical-key tests.

* ``equivalent(s, rng)`` applies random equivalent rewrites (renaming bound
  iterators, shuffling summations, commuting and reassociating operands);
* ``mutate(s, cls, rng)`` changes one random place with a mutator from
  ``MUTATORS`` (each makes the expression genuinely different, except that a
  traversal swap can be undone by a symmetry);
* ``ref_form(s)`` is a deliberately naive canonical form (its own linear
  forms, and *every* permutation of the summation iterators instead of colour
  refinement), the oracle the property tests compare ``key`` with.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from einopt.core.index import from_linear_form, linear_form
from einopt.core.ir import (
    COMMUTATIVE_OPS,
    Access,
    Binary,
    Const,
    IAdd,
    IConst,
    IFloorDiv,
    IMod,
    IMul,
    IndexExpr,
    ISub,
    Iter,
    Program,
    Scope,
    Tensor,
    Unary,
    ValueExpr,
    scopes_in,
)

# --------------------------------------------------------------------------
# Rebuilding expressions
# --------------------------------------------------------------------------


def map_index(e: IndexExpr, f: Callable[[IndexExpr], IndexExpr]) -> IndexExpr:
    """Rebuild ``e`` bottom-up, applying ``f`` to every node."""
    if isinstance(e, (IAdd, ISub, IMul)):
        e = type(e)(map_index(e.a, f), map_index(e.b, f))
    elif isinstance(e, (IFloorDiv, IMod)):
        e = type(e)(map_index(e.a, f), e.k)
    return f(e)


class Rewriter:
    """Rebuild a scope bottom-up; subclasses override the hooks (each returns a node)."""

    def index(self, e: IndexExpr) -> IndexExpr:
        return e

    def value(self, e: ValueExpr) -> ValueExpr:
        return e

    def tensor(self, t: Tensor) -> Tensor:
        return t

    def scope(self, s: Scope) -> Scope:
        return s

    def whole_index(self, e: IndexExpr) -> IndexExpr:
        """Called on each complete index of an access, after ``index`` on its parts."""
        return e

    def run_value(self, e: ValueExpr) -> ValueExpr:
        if isinstance(e, Access):
            src = self.run_scope(e.source) if isinstance(e.source, Scope) else self.tensor(e.source)
            e = Access(src, tuple(self.whole_index(map_index(ix, self.index)) for ix in e.indices))
        elif isinstance(e, Binary):
            e = Binary(e.op, self.run_value(e.a), self.run_value(e.b))
        elif isinstance(e, Unary):
            e = Unary(e.fn, self.run_value(e.x), e.param)
        return self.value(e)

    def run_scope(self, s: Scope) -> Scope:
        return self.scope(Scope(s.traversal, s.summation, self.run_value(s.body), s.pad, s.reduce))


def substitute(body: ValueExpr, mapping: dict[Iter, IndexExpr]) -> ValueExpr:
    """Replace this scope's iterators in ``body`` (nested scopes are closed: left alone)."""

    def go(e: ValueExpr) -> ValueExpr:
        if isinstance(e, Access):
            return Access(e.source, tuple(map_index(ix, lambda x: mapping.get(x, x)) for ix in e.indices))
        if isinstance(e, Binary):
            return Binary(e.op, go(e.a), go(e.b))
        if isinstance(e, Unary):
            return Unary(e.fn, go(e.x), e.param)
        return e

    return go(body)


# --------------------------------------------------------------------------
# Equivalent rewrites (the key must not change)
# --------------------------------------------------------------------------


class Rename(Rewriter):
    """Give every scope's bound iterators fresh random names."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def scope(self, s: Scope) -> Scope:
        its = s.traversal + s.summation
        names = self.rng.sample([f"v{i}" for i in range(40)], len(its))
        mapping = {it: Iter(n, it.lo, it.hi) for it, n in zip(its, names, strict=True)}
        return Scope(
            tuple(mapping[it] for it in s.traversal),
            tuple(mapping[it] for it in s.summation),
            substitute(s.body, mapping),
            s.pad,
            s.reduce,
        )


class ShuffleSummation(Rewriter):
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def scope(self, s: Scope) -> Scope:
        summation = list(s.summation)
        self.rng.shuffle(summation)
        return Scope(s.traversal, tuple(summation), s.body, s.pad, s.reduce)


class Commute(Rewriter):
    """Random operand swaps and reassociations of ``+ * max min``, in values and indices."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def value(self, e: ValueExpr) -> ValueExpr:
        if isinstance(e, Binary) and e.op in COMMUTATIVE_OPS:
            a, b = e.a, e.b
            if isinstance(a, Binary) and a.op == e.op and self.rng.random() < 0.5:
                return Binary(e.op, a.a, Binary(e.op, a.b, b))  # (x o y) o b -> x o (y o b)
            if self.rng.random() < 0.5:
                return Binary(e.op, b, a)
        return e

    def index(self, e: IndexExpr) -> IndexExpr:
        if isinstance(e, (IAdd, IMul)):
            a, b = e.a, e.b
            if isinstance(a, type(e)) and self.rng.random() < 0.5:
                return type(e)(a.a, type(e)(a.b, b))
            if self.rng.random() < 0.5:
                return type(e)(b, a)
        if isinstance(e, ISub) and self.rng.random() < 0.3:
            return from_linear_form(linear_form(e))  # same linear form, written differently
        return e


def equivalent(s: Scope, rng: random.Random) -> Scope:
    for cls in (Rename, ShuffleSummation, Commute):
        if rng.random() < 0.8:
            s = cls(rng).run_scope(s)
    return s


# --------------------------------------------------------------------------
# Mutations (the key must change): each picks one applicable place at random
# --------------------------------------------------------------------------


class Mutator(Rewriter):
    """Apply ``mutate`` at the ``target``-th applicable node (counted in rebuild order)."""

    def __init__(self, target: int, rng: random.Random) -> None:
        self.target = target
        self.seen = 0
        self.rng = rng
        self.done = False

    def hit(self) -> bool:
        self.seen += 1
        if self.seen - 1 == self.target:
            self.done = True
            return True
        return False


class ScopeMutator(Mutator):
    def applies(self, s: Scope) -> bool:
        return True

    def scope(self, s: Scope) -> Scope:
        return self.mutate(s) if self.applies(s) and self.hit() else s


class SwapTraversal(ScopeMutator):
    def applies(self, s: Scope) -> bool:
        return s.rank >= 2

    def mutate(self, s: Scope) -> Scope:
        i, j = self.rng.sample(range(s.rank), 2)
        trav = list(s.traversal)
        trav[i], trav[j] = trav[j], trav[i]
        pad = list(s.pad)
        if pad:
            pad[i], pad[j] = pad[j], pad[i]
        return Scope(tuple(trav), s.summation, s.body, tuple(pad), s.reduce)


class ChangeRange(ScopeMutator):
    def mutate(self, s: Scope) -> Scope:
        its = s.traversal + s.summation
        old = self.rng.choice(its)
        lo, hi = old.lo, old.hi
        if self.rng.random() < 0.5:
            lo += self.rng.choice([-1, 1]) if hi - lo > 1 else -1
        else:
            hi += self.rng.choice([-1, 1]) if hi - lo > 1 else 1
        new = Iter(old.name, lo, hi)
        swap = {old: new}
        return Scope(
            tuple(swap.get(it, it) for it in s.traversal),
            tuple(swap.get(it, it) for it in s.summation),
            substitute(s.body, swap),
            s.pad,
            s.reduce,
        )


class ChangePad(ScopeMutator):
    def mutate(self, s: Scope) -> Scope:
        pad = list(s.pad) or [(0, 0)] * s.rank
        d = self.rng.randrange(s.rank)
        pad[d] = (pad[d][0] + 1, pad[d][1])
        return Scope(s.traversal, s.summation, s.body, tuple(pad), s.reduce)


class ChangeReduction(ScopeMutator):
    """A sum scope becomes a max scope and back (only where there is something to reduce)."""

    def applies(self, s: Scope) -> bool:
        return bool(s.summation)

    def mutate(self, s: Scope) -> Scope:
        return s.replace(reduce="sum" if s.reduce == "max" else "max")


class IndexMutator(Mutator):
    def index(self, e: IndexExpr) -> IndexExpr:
        return self.mutate(e) if self.applies(e) and self.hit() else e


def change_coefficient(e: IndexExpr, rng: random.Random) -> IndexExpr:
    lf = linear_form(e)
    i = rng.randrange(len(lf.coeffs))
    it, c = lf.coeffs[i]
    coeffs = lf.coeffs[:i] + ((it, c + 1 if c != -1 else 2),) + lf.coeffs[i + 1 :]
    return from_linear_form(type(lf)(coeffs, lf.atoms, lf.const))


class ChangeCoefficient(Mutator):
    """Change one iterator's coefficient in a whole index or in a div/mod operand.

    (Not in arbitrary sub-terms: a change under ``0 * ...`` would be a no-op.)
    """

    def whole_index(self, e: IndexExpr) -> IndexExpr:
        return change_coefficient(e, self.rng) if linear_form(e).coeffs and self.hit() else e

    def index(self, e: IndexExpr) -> IndexExpr:
        if isinstance(e, (IFloorDiv, IMod)) and linear_form(e.a).coeffs and self.hit():
            return type(e)(change_coefficient(e.a, self.rng), e.k)
        return e


class ChangeDivMod(IndexMutator):
    """``//`` <-> ``%``, or a different divisor, or a different operand."""

    def applies(self, e: IndexExpr) -> bool:
        return isinstance(e, (IFloorDiv, IMod))

    def mutate(self, e: IndexExpr) -> IndexExpr:
        kind = self.rng.randrange(3)
        if kind == 0:
            return (IMod if isinstance(e, IFloorDiv) else IFloorDiv)(e.a, e.k)
        if kind == 1:
            return type(e)(e.a, e.k + 1)
        return type(e)(IAdd(e.a, IConst(1)), e.k)


class ChangeIndexConstant(Mutator):
    def whole_index(self, e: IndexExpr) -> IndexExpr:
        return IAdd(e, IConst(self.rng.choice([-2, -1, 1, 2]))) if self.hit() else e


class ValueMutator(Mutator):
    def value(self, e: ValueExpr) -> ValueExpr:
        return self.mutate(e) if self.applies(e) and self.hit() else e


class ChangeConst(ValueMutator):
    def applies(self, e: ValueExpr) -> bool:
        return isinstance(e, Const)

    def mutate(self, e: ValueExpr) -> ValueExpr:
        return Const(e.value + 1.0 if abs(e.value) < 1e15 else 0.5)


class ChangeUnary(ValueMutator):
    def applies(self, e: ValueExpr) -> bool:
        return isinstance(e, Unary)

    def mutate(self, e: ValueExpr) -> ValueExpr:
        if e.param is not None:
            return Unary(e.fn, e.x, e.param + 0.25)
        return Unary("tanh" if e.fn != "tanh" else "relu", e.x)


class ChangeOp(ValueMutator):
    """``-`` <-> ``+``, ``*`` <-> ``/``, ``max`` <-> ``min``."""

    def applies(self, e: ValueExpr) -> bool:
        return isinstance(e, Binary)

    def mutate(self, e: ValueExpr) -> ValueExpr:
        swap = {"-": "+", "+": "-", "*": "/", "/": "*", "max": "min", "min": "max"}
        return Binary(swap[e.op], e.a, e.b)


class ChangeTensor(Mutator):
    """Rename, reshape or retype one input tensor (everywhere: a name means one tensor)."""

    def __init__(self, target: int, rng: random.Random) -> None:
        super().__init__(target, rng)
        self.replaced: dict[Tensor, Tensor] = {}

    def tensor(self, t: Tensor) -> Tensor:
        if t not in self.replaced:
            self.replaced[t] = self.change(t) if self.hit() else t
        return self.replaced[t]

    def change(self, t: Tensor) -> Tensor:
        kind = self.rng.randrange(3)
        if kind == 0:
            return Tensor(t.name + "x", t.shape, t.dtype)
        if kind == 1:
            d = self.rng.randrange(t.rank)
            return Tensor(t.name, t.shape[:d] + (t.shape[d] + 1,) + t.shape[d + 1 :], t.dtype)
        return Tensor(t.name, t.shape, "float64" if t.dtype != "float64" else "float32")


MUTATORS = [
    SwapTraversal,
    ChangeRange,
    ChangePad,
    ChangeReduction,
    ChangeCoefficient,
    ChangeDivMod,
    ChangeIndexConstant,
    ChangeConst,
    ChangeUnary,
    ChangeOp,
    ChangeTensor,
]


def mutate(s: Scope, cls: type[Mutator], rng: random.Random) -> Scope | None:
    """``s`` with one random place changed by ``cls``, or None if nothing applies."""
    count = cls(10**9, rng)
    count.run_scope(s)
    if not count.seen:
        return None
    m = cls(rng.randrange(count.seen), rng)
    out = m.run_scope(s)
    assert m.done
    return out


# --------------------------------------------------------------------------
# The brute-force reference
# --------------------------------------------------------------------------


def ref_lin(e: IndexExpr, names: dict[Iter, str]) -> tuple[dict[str, int], int]:
    """A linear form ``({term text: coefficient}, constant)``, atoms merged by text."""
    if isinstance(e, IConst):
        return {}, e.value
    if isinstance(e, Iter):
        return {names[e]: 1}, 0
    if isinstance(e, (IAdd, ISub)):
        (ta, ca), (tb, cb) = ref_lin(e.a, names), ref_lin(e.b, names)
        sign = 1 if isinstance(e, IAdd) else -1
        terms = dict(ta)
        for t, c in tb.items():
            terms[t] = terms.get(t, 0) + sign * c
        return {t: c for t, c in terms.items() if c}, ca + sign * cb
    if isinstance(e, IMul):
        (ta, ca), (tb, cb) = ref_lin(e.a, names), ref_lin(e.b, names)
        if not ta:
            return {t: ca * c for t, c in tb.items() if ca * c}, ca * cb
        if not tb:
            return {t: cb * c for t, c in ta.items() if cb * c}, ca * cb
        factors: list[str] = []
        scale = ref_factors(e, names, factors)
        return {"prod(" + ",".join(sorted(factors)) + ")": scale}, 0
    inner = ref_text(ref_lin(e.a, names))
    op = "div" if isinstance(e, IFloorDiv) else "mod"
    return {f"{op}{e.k}({inner})": 1}, 0


def ref_factors(e: IndexExpr, names: dict[Iter, str], out: list[str]) -> int:
    """Flatten a product into ``out``; return its constant factor."""
    if isinstance(e, IMul):
        (ta, ca), (tb, cb) = ref_lin(e.a, names), ref_lin(e.b, names)
        if not ta and not tb:
            return ca * cb
        return ref_factors(e.a, names, out) * ref_factors(e.b, names, out)
    terms, c = ref_lin(e, names)
    if not terms:
        return c
    out.append(ref_text((terms, c)))
    return 1


def ref_text(lin: tuple[dict[str, int], int]) -> str:
    terms, c = lin
    return " ".join(f"{v}*{t}" for t, v in sorted(terms.items()) if v) + f" {c}"


def ref_value(e: ValueExpr, names: dict[Iter, str]) -> str:
    if isinstance(e, Access):
        if isinstance(e.source, Tensor):
            src = repr((e.source.name, e.source.shape, e.source.dtype))
        else:
            src = "<" + ref_form(e.source) + ">"
        return src + "[" + "; ".join(ref_text(ref_lin(ix, names)) for ix in e.indices) + "]"
    if isinstance(e, Binary):
        if e.op in COMMUTATIVE_OPS:
            ops: list[str] = []

            def flat(x: ValueExpr) -> None:
                if isinstance(x, Binary) and x.op == e.op:
                    flat(x.a)
                    flat(x.b)
                else:
                    ops.append(ref_value(x, names))

            flat(e)
            return e.op + "{" + " ".join(sorted(ops)) + "}"
        return e.op + "(" + ref_value(e.a, names) + " " + ref_value(e.b, names) + ")"
    if isinstance(e, Unary):
        return f"{e.fn}<{e.param!r}>(" + ref_value(e.x, names) + ")"
    assert isinstance(e, Const)
    return repr(e.value)


def ref_form(s: Scope) -> str:
    """Min over every order of the summation iterators: exact, exponential, obviously right."""
    trav = {it: f"T{i}" for i, it in enumerate(s.traversal)}
    best = None
    for perm in itertools.permutations(s.summation):
        names = {**trav, **{it: f"S{j}" for j, it in enumerate(perm)}}
        text = repr(
            (
                [(it.lo, it.hi) for it in s.traversal],
                s.pad,
                s.reduce,
                [(it.lo, it.hi) for it in perm],
                ref_value(s.body, names),
            )
        )
        best = text if best is None or text < best else best
    return best


def ref_program(p: Program) -> str:
    inputs = sorted(repr((t.name, t.shape, t.dtype)) for t in p.inputs)
    return repr((inputs, [ref_form(p.scope(o)) for o in p.outputs]))


def relabel(p: Program, rng: random.Random) -> Program:
    """Same DAG: fresh binding names and a random topological order of the bindings."""
    fresh = {n: f"N{i}" for i, n in enumerate(rng.sample([n for n, _ in p.bindings], len(p.bindings)))}
    bound = {s for _, s in p.bindings}
    pending = list(p.bindings)
    order: list[tuple[str, Scope]] = []
    while pending:
        placed = {s for _, s in order}
        ready = [
            (n, s)
            for n, s in pending
            if all(sub in placed for sub in scopes_in(s) if sub in bound and sub is not s)
        ]
        n, s = rng.choice(ready)
        pending.remove((n, s))
        order.append((fresh[n], s))
    return Program(p.inputs, tuple(order), tuple(fresh[o] for o in p.outputs))
