"""Canonical keys and fingerprints of expressions (method.md section 5, "Fingerprints").

``key(node)`` is 32 hex digits of ``blake2b(canonical_form(node), digest_size=16)``;
``fingerprint(node)`` is the first 64 bits of the same digest as an ``int``.
Both are stable across runs and machines (no Python ``hash()`` is involved).
The search prunes states by them, so two expressions get one key exactly when
they are equal up to renaming bound iterators, reordering summations and the
order and grouping of commutative operands (``+ * max min``, and ``+ *`` in
index expressions).

The canonical form
------------------
A scope ``L[x] Sum[y] body`` is a closed term, so its key depends on nothing
outside it and is cached on the scope. Its canonical form is::

    L[lo:hi,...] P[before:after,...] S[lo:hi,...] <body>

with the pad part only when the scope has padding. A max scope writes
``M[lo:hi,...]`` for its reduction iterators where a sum scope writes ``S``
(a max scope always has some), so a max scope and a sum scope never share a
key; a sum scope's form is the same as before max scopes existed. The order
of a max scope's iterators does not matter either, and they are ordered the
same way (below). Inside, iterators are
renamed: the traversal iterator at position ``i`` becomes ``t{i}``, summation
iterators become ``s0, s1, ...`` in a canonical order (below). The body is
written in prefix form:

* an access is ``<source>[<index>,...]``; an input tensor is written
  ``name:dtype(d0,d1,...)`` and a scope read by the body (a nested scope, or
  an earlier binding of a program) as ``{<its key>}``, so tensors produced by
  scopes take their key from the expression that produced them;
* a chain of the same commutative operator (``+ * max min``) is flattened
  and its operands are sorted by their canonical text: ``+(a,b,c)``;
* ``-`` and ``/`` keep their operand order: ``-(a,b)``; a unary function is
  ``fn(x)`` or ``fn[param](x)``; a constant is ``repr(float)`` (so ``0.0``
  and ``-0.0`` differ, as the IR says they do).

An index expression is written as its linear form (as ``einopt.core.index``
defines it): iterator terms and div/mod/product atoms, each with its
coefficient, sorted by their text, then the constant, e.g. ``s0+t0-1`` or
``2*t1+((s1+t0)//2)``. Atoms are ``((inner)//k)``, ``((inner)%k)`` and
``((f1)*(f2)...)`` with product factors flattened and sorted; atoms equal up to
commutativity are merged. So ``2*h``, ``h*2`` and ``h+h`` are one index, and
``h+r-1``, ``r+h-1`` and ``h-(1-r)`` another; nothing else is simplified
(``(h+4)%4`` is not ``h%4``).

Canonical order of summation iterators
--------------------------------------
Summation order is irrelevant, so the names ``s0, s1, ...`` must not depend on
how the summation was written. The canonical form is the lexicographically
smallest text over all orders that respect a renaming-invariant colouring of
the summation iterators, found by individualisation-refinement (as in graph
canonisation):

1. Initial colour: the iterator's range and the sorted multiset of its
   occurrences ``(source, dimension, role)``, where the role is its
   coefficient in that index (and, inside a div/mod/product atom, the atom's
   kind, divisor and coefficient). Iterators that occur nowhere in the body
   are interchangeable, so ties among them are broken arbitrarily.
2. If colours tie, refine: the new colour of ``x`` is its old colour plus the
   canonical text of the body with ``x`` written ``@`` and every other
   summation iterator written as its colour; repeat until stable.
3. If ties remain (true or apparent symmetries), individualise each member of
   the first tied class in turn, refine, and recurse; every leaf is a total
   order. The canonical form is the smallest text over the leaves. A member
   whose exchange with an already tried one is an automorphism of the body
   is skipped (its leaves give the same texts), so fully symmetric classes
   cost a quadratic, not factorial, number of renderings.

Every step depends only on renaming-invariant data, so the result is
invariant under renaming and reordering of summation iterators; the text
spells out every range, index, constant, operator and tensor, so expressions
that differ in any of them get different texts. The common case (no ties
after step 1) renders the body once. Worst cases (large classes with
symmetries that are not transpositions) stay exponential in the class size.

Caching and speed
-----------------
Keys are memoised per node with ``einopt.core.ir._cached``, so a scope shared by
many states is keyed once. Context-free facts about access and index nodes
(their texts, linear forms and roles) are memoised per node the same way,
so they live exactly as long as their nodes. The body is rendered once per scope unless summation
iterators tie. ``scripts/bench_keys.py`` measures 25-45k keys/s on freshly
built Conv3x3 expressions and their Fig. 5 derivation states (with a nested
scope), and about 14k/s when every index has div/mod atoms, on one core of
the project's Xeon.

Other nodes
-----------
* A program's form is its input tensors (sorted: they are named) and the keys
  of its output scopes in output order; binding names and order do not count.
* A tensor's form is ``T:name:dtype(d0,d1,...)``.
* Index and value expressions outside a scope have free iterators, which keep
  their names and are written ``name=lo:hi`` (``I:`` / ``V:`` prefix).
"""

from __future__ import annotations

import functools
import hashlib

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
    Node,
    Program,
    Scope,
    Tensor,
    Unary,
    ValueExpr,
    _cached,
    scopes_in,
)

__all__ = ["key", "fingerprint", "canonical_form"]

# Operators whose chains are flattened and sorted (commutative and associative: einopt.core.ops).
_COMMUTATIVE = COMMUTATIVE_OPS


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def key(node: Node) -> str:
    """The canonical key of ``node``: 32 hex digits, stable across runs.

    Parameters
    ----------
    node : Scope, Program, Tensor, ValueExpr or IndexExpr
        The expression to key.

    Returns
    -------
    str
        ``blake2b(canonical_form(node), digest_size=16).hexdigest()``; equal
        for expressions that differ only by iterator renaming, summation order
        or the order of commutative operands.
    """
    memo = node._memo
    if memo is not None and "keys.key" in memo:
        return memo["keys.key"]
    global _nesting
    if _nesting >= _NESTING_LIMIT and isinstance(node, Scope):
        _key_producers_first(node)
    _nesting += 1
    try:
        return _cached(node, "keys.key", lambda: _digest(_form(node)))
    finally:
        _nesting -= 1


# A read's key holds its source's key, so keying a scope keys the scopes it reads first, one Python
# call chain per level of nesting; a translated model nests one scope per node, hundreds deep. Below
# this many scopes being keyed at once, the rest is keyed producers first (each then finds its
# sources' keys memoised): the same keys, in bounded stack depth, and no cost where nesting is shallow.
# One counter for the process: threads keying at once only move the switch, never change a key.
_NESTING_LIMIT = 16
_nesting = 0


def _key_producers_first(scope: Scope) -> None:
    for s in scopes_in(scope)[:-1]:  # producers before consumers, ``scope`` itself last
        _cached(s, "keys.key", lambda s=s: _digest(_form(s)))


def fingerprint(node: Node) -> int:
    """A 64-bit fingerprint of ``node``: the first 8 bytes of its key, as an int."""
    return int(key(node)[:16], 16)


def canonical_form(node: Node) -> str:
    """The canonical text that ``key`` hashes (see the module docstring).

    Not cached (it is a debugging aid); nested scopes appear by their cached keys.
    """
    return _form(node)


# An initialised hasher to copy: faster than parsing ``digest_size`` per call.
_BLAKE2B_16 = hashlib.blake2b(digest_size=16)


def _digest(text: str) -> str:
    h = _BLAKE2B_16.copy()
    h.update(text.encode())
    return h.hexdigest()


def _form(node: Node) -> str:
    if isinstance(node, Scope):
        return _scope_form(node)
    if isinstance(node, Program):
        return _program_form(node)
    if isinstance(node, Tensor):
        return "T:" + _tensor_text(node)
    if isinstance(node, IndexExpr):
        return "I:" + _index(node, _FreeNames())
    if isinstance(node, ValueExpr):
        return "V:" + _value(node, _FreeNames())
    raise TypeError(f"no canonical form for {type(node).__name__}")


class _FreeNames(dict):
    """Names of free iterators: their own name and range."""

    def __missing__(self, it: Iter) -> str:
        text = self[it] = f"{it.name}={it.lo}:{it.hi}"
        return text


def _program_form(p: Program) -> str:
    inputs = ",".join(sorted(_tensor_text(t) for t in p.inputs))
    outputs = ",".join(key(p.scope(name)) for name in p.outputs)
    return f"P:in[{inputs}]out[{outputs}]"


def _tensor_text(t: Tensor) -> str:
    return _cached(t, "keys._tensor_text", lambda: _compute_tensor_text(t))


def _compute_tensor_text(t: Tensor) -> str:
    return f"{t.name}:{t.dtype}({','.join(map(str, t.shape))})"


# --------------------------------------------------------------------------
# Index expressions
#
# A canonical index ("cindex") is ``(terms, atoms, const)``: ``terms`` are
# ``(Iter, prefix)`` pairs, ``atoms`` are ``(atom, prefix)`` pairs with
# ``atom`` = ``(op, k, parts)`` for ``op`` in ``// % *`` and ``parts`` a tuple
# of cindexes (one for div/mod, the non-constant factors of a product), and
# ``const`` is the signed constant ("" for 0). A prefix is the signed
# coefficient as written before the term ("+", "-", "+2*", "-3*"). Atoms equal
# up to commutativity are merged. Terms are sorted by their text under the
# naming at hand, which is as canonical as sorting by name.
# --------------------------------------------------------------------------


def _prefix(c: int) -> str:
    return "+" if c == 1 else "-" if c == -1 else f"{c:+d}*"


_PREFIXES = {c: _prefix(c) for c in range(-16, 17) if c}
_CONSTANTS = {c: f"{c:+d}" if c else "" for c in range(-16, 17)}


def _index_info(e: IndexExpr) -> tuple[tuple, tuple[tuple[Iter, str], ...]]:
    return _cached(e, "keys._index_info", lambda: _compute_index_info(e))


def _compute_index_info(e: IndexExpr) -> tuple[tuple, tuple[tuple[Iter, str], ...]]:
    """``(cindex, roles)`` of an index node, memoised (nodes are interned and immutable).

    A role is how an iterator occurs (its coefficient, and the atoms it sits
    in); roles colour summation iterators.
    """
    coeffs: dict[Iter, int] = {}
    found: list[tuple[tuple, int]] = []
    const = _collect(e, 1, coeffs, found)
    term_list = []
    for it, c in coeffs.items():
        if c:
            term_list.append((it, _PREFIXES.get(c) or _prefix(c)))
    terms = tuple(term_list)
    const_text = _CONSTANTS.get(const)
    if const_text is None:
        const_text = f"{const:+d}"
    if not found:
        return (terms, (), const_text), terms
    if len(found) > 1:  # merge atoms equal up to commutativity
        merged: dict[str, list] = {}
        names = _FreeNames()
        for atom, d in found:
            slot = merged.setdefault(_atom_text(atom, names), [atom, 0])
            slot[1] += d
        found = [(atom, d) for atom, d in merged.values()]
    ci = (terms, tuple([(atom, _prefix(d)) for atom, d in found if d]), const_text)
    occurs: dict[Iter, list[str]] = {}
    _collect_roles(ci, "", occurs)
    return ci, tuple([(it, ";".join(sorted(rs))) for it, rs in occurs.items()])


def _collect(e: IndexExpr, scale: int, coeffs: dict[Iter, int], atoms: list[tuple[tuple, int]]) -> int:
    """Add ``scale * e`` into ``coeffs`` and ``atoms``; return its constant part.

    The same sum as ``einopt.core.index.linear_form`` (which builds a LinearForm
    per subterm: too slow here), except that atoms are merged up to
    commutativity rather than by node identity.
    """
    t = type(e)
    if t is Iter:
        coeffs[e] = coeffs.get(e, 0) + scale
        return 0
    if t is IConst:
        return scale * e.value
    if t is IAdd:
        return _collect(e.a, scale, coeffs, atoms) + _collect(e.b, scale, coeffs, atoms)
    if t is ISub:
        return _collect(e.a, scale, coeffs, atoms) + _collect(e.b, -scale, coeffs, atoms)
    if t is IMul:
        a, b = e.a, e.b
        if type(a) is IConst:
            return _collect(b, scale * a.value, coeffs, atoms)
        if type(b) is IConst:
            return _collect(a, scale * b.value, coeffs, atoms)
        ca = _constant(a)
        if ca is not None:
            return _collect(b, scale * ca, coeffs, atoms)
        cb = _constant(b)
        if cb is not None:
            return _collect(a, scale * cb, coeffs, atoms)
        factors: list[tuple] = []
        scale = _factors(e, factors, scale)
        atoms.append((("*", 0, tuple(factors)), scale))
        return 0
    if t is IFloorDiv or t is IMod:
        atoms.append((("//" if t is IFloorDiv else "%", e.k, (_index_info(e.a)[0],)), scale))
        return 0
    raise TypeError(f"not an index expression: {e!r}")


def _constant(e: IndexExpr) -> int | None:
    """The value of ``e`` if it does not depend on iterators, else None."""
    terms, atoms, const = _index_info(e)[0]
    if terms or atoms:
        return None
    return int(const) if const else 0


def _factors(e: IndexExpr, out: list[tuple], scale: int) -> int:
    """Flatten a product into ``out`` (sorted when written); return ``scale`` times its constants."""
    if type(e) is IMul:
        return _factors(e.b, out, _factors(e.a, out, scale))
    c = _constant(e)
    if c is not None:
        return scale * c
    out.append(_index_info(e)[0])
    return scale


def _collect_roles(ci: tuple, outer: str, out: dict[Iter, list[str]]) -> None:
    """Each iterator's roles: its coefficient, and the atoms (kind, divisor, coefficient) it sits in."""
    terms, atoms, _ = ci
    for it, p in terms:
        out.setdefault(it, []).append(outer + p)
    for (op, k, parts), p in atoms:
        for part in parts:
            _collect_roles(part, f"{outer}{p}{op}{k}(", out)


def _index(e: IndexExpr, names: dict[Iter, str]) -> str:
    """Canonical text of an index under an iterator naming."""
    if type(e) is Iter:
        return names[e]
    return _cindex_text(_index_info(e)[0], names)


def _cindex_text(ci: tuple, names: dict[Iter, str]) -> str:
    """Terms sorted by their text, then the constant, without a leading ``+``."""
    terms, atoms, const = ci
    n = len(terms)
    if atoms:
        parts = [p + names[it] for it, p in terms]
        parts.extend([p + _atom_text(atom, names) for atom, p in atoms])
        parts.sort()
        text = "".join(parts) + const
    elif n == 1:
        it, p = terms[0]
        text = p + names[it] + const
    elif n == 2:  # the common h + r - 1, unrolled
        (i1, p1), (i2, p2) = terms
        a, b = p1 + names[i1], p2 + names[i2]
        text = (a + b if a <= b else b + a) + const
    elif n:
        parts = [p + names[it] for it, p in terms]
        parts.sort()
        text = "".join(parts) + const
    else:
        text = const or "0"
    return text[1:] if text[0] == "+" else text


def _atom_text(atom: tuple, names: dict[Iter, str]) -> str:
    op, k, parts = atom
    if op == "*":
        return "(" + "*".join(sorted(["(" + _cindex_text(p, names) + ")" for p in parts])) + ")"
    return f"(({_cindex_text(parts[0], names)}){op}{k})"


# --------------------------------------------------------------------------
# Value expressions
# --------------------------------------------------------------------------


def _access_info(acc: Access) -> tuple[str, tuple, bool]:
    return _cached(acc, "keys._access_info", lambda: _compute_access_info(acc))


def _compute_access_info(acc: Access) -> tuple[str, tuple, bool]:
    """Memoised: the source's text, each index as the Iter itself or its ``_index_info``,
    and whether every index is a plain iterator."""
    src = acc.source
    text = _tensor_text(src) if type(src) is Tensor else "{" + key(src) + "}"
    indices = acc.indices
    for ix in indices:
        if type(ix) is not Iter:
            return text, tuple([ix if type(ix) is Iter else _index_info(ix) for ix in indices]), False
    return text, indices, True


def _value(e: ValueExpr, names: dict[Iter, str]) -> str:
    """Canonical text of a value under an iterator naming."""
    t = type(e)
    if t is Access:
        src, entries, plain = _access_info(e)
        if plain:
            return src + "[" + ",".join(map(names.__getitem__, entries)) + "]"
        return (
            src
            + "["
            + ",".join([names[x] if type(x) is Iter else _cindex_text(x[0], names) for x in entries])
            + "]"
        )
    if t is Binary:
        op = e.op
        a, b = e.a, e.b
        if op in _COMMUTATIVE:
            if (type(a) is Binary and a.op == op) or (type(b) is Binary and b.op == op):
                operands: list[ValueExpr] = []
                _flatten(e, op, operands)
                texts = [_value(x, names) for x in operands]
                texts.sort()
                return op + "(" + ",".join(texts) + ")"
            ta, tb = _value(a, names), _value(b, names)
            return op + "(" + (ta + "," + tb if ta <= tb else tb + "," + ta) + ")"
        return op + "(" + _value(a, names) + "," + _value(b, names) + ")"
    if t is Const:
        return repr(e.value)
    if t is Unary:
        if e.param is None:
            return e.fn + "(" + _value(e.x, names) + ")"
        return f"{e.fn}[{e.param!r}](" + _value(e.x, names) + ")"
    raise TypeError(f"not a value expression: {e!r}")


def _flatten(e: ValueExpr, op: str, out: list[ValueExpr]) -> None:
    """Operands of a chain of ``op`` (associative and commutative), left to right."""
    if type(e) is Binary and e.op == op:
        _flatten(e.a, op, out)
        _flatten(e.b, op, out)
    else:
        out.append(e)


# --------------------------------------------------------------------------
# Scopes
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 12)
def _ranges(its: tuple[Iter, ...]) -> str:
    return ",".join(map(_range, its))


def _range(it: Iter) -> str:
    return _cached(it, "keys._range", lambda: _compute_range(it))


def _compute_range(it: Iter) -> str:
    return f"{it.lo}:{it.hi}"


def _scope_form(s: Scope) -> str:
    """``L[...] P[...] S[...] body``, the smallest text over the candidate summation orders."""
    traversal, summation = s.traversal, s.summation
    head = "L[" + _ranges(traversal) + "]"
    if s.pad:
        head += "P[" + ",".join([f"{a}:{b}" for a, b in s.pad]) + "]"
    table = _name_table(len(traversal), len(summation))  # as long as the iterators: zip is exact
    if not summation:
        return head + _value(s.body, dict(zip(traversal, table, strict=False)))
    best = None
    marker = _REDUCTION_MARKERS[s.reduce]
    for order in _summation_orders(s) if len(summation) > 1 else (summation,):
        names = dict(zip(traversal + order, table, strict=False))
        text = head + marker + _ranges(order) + "]" + _value(s.body, names)
        if best is None or text < best:
            best = text
    return best


# How the reduction iterators of each kind of scope open in the canonical form.
_REDUCTION_MARKERS: dict[str, str] = {"sum": "S[", "max": "M["}


@functools.cache
def _name_table(traversal: int, summation: int) -> tuple[str, ...]:
    """Canonical names: ``t0 t1 ...`` by traversal position, then ``s0 s1 ...``."""
    return tuple(f"t{i}" for i in range(traversal)) + tuple(f"s{j}" for j in range(summation))


def _summation_orders(s: Scope) -> list[tuple[Iter, ...]]:
    """Candidate canonical orders of the summation iterators (see the module docstring)."""
    summation = s.summation
    # Occurrences (source text, dimension, role) of each summation iterator.
    occurrences: dict[Iter, list[tuple[str, int, str]]] = {}
    for it in summation:
        occurrences[it] = []
    get = occurrences.get
    stack = [s.body]
    while stack:
        e = stack.pop()
        t = type(e)
        if t is Access:
            text, entries, _ = _access_info(e)
            d = 0
            for x in entries:
                if type(x) is Iter:
                    slot = get(x)
                    if slot is not None:
                        slot.append((text, d, "+"))
                else:
                    for it, role in x[1]:
                        slot = get(it)
                        if slot is not None:
                            slot.append((text, d, role))
                d += 1
        elif t is Binary:
            stack.append(e.a)
            stack.append(e.b)
        elif t is Unary:
            stack.append(e.x)
    signatures = []
    pos = 0
    for it in summation:
        occ = occurrences[it]
        occ.sort()
        # Unused iterators are interchangeable: break their ties by position.
        signatures.append(((it.lo, it.hi, tuple(occ), 0 if occ else pos), it))
        pos += 1
    signatures.sort(key=_first)
    previous = None
    for signature, _ in signatures:
        if signature == previous:
            colours = _rank({it: sig for sig, it in signatures})
            names = dict(zip(s.traversal, _name_table(len(s.traversal), 0), strict=True))
            leaves: list[tuple[Iter, ...]] = []
            _individualise(s.body, names, colours, leaves)
            return leaves
        previous = signature
    return [tuple([it for _, it in signatures])]


def _first(pair: tuple) -> object:
    return pair[0]


def _rank(signature: dict[Iter, object]) -> dict[Iter, int]:
    """Colours: the rank of each signature among the distinct signatures."""
    index = {v: i for i, v in enumerate(sorted(set(signature.values())))}
    return {it: index[v] for it, v in signature.items()}


def _refine(body: ValueExpr, names: dict[Iter, str], colours: dict[Iter, int]) -> dict[Iter, int]:
    """Split colour classes by how each member appears in the body, until stable."""
    while True:
        count = len(set(colours.values()))
        if count == len(colours):
            return colours
        sizes: dict[int, int] = {}
        for c in colours.values():
            sizes[c] = sizes.get(c, 0) + 1
        coloured = dict(names)
        for it, c in colours.items():
            coloured[it] = f"c{c}"
        signature: dict[Iter, tuple] = {}
        for it, c in colours.items():
            if sizes[c] == 1:
                signature[it] = (c, "")
                continue
            marked = dict(coloured)
            marked[it] = "@"
            signature[it] = (c, _value(body, marked))
        new = _rank(signature)
        if len(set(new.values())) == count:
            return new
        colours = new


def _individualise(
    body: ValueExpr,
    names: dict[Iter, str],
    colours: dict[Iter, int],
    leaves: list[tuple[Iter, ...]],
) -> None:
    """Append to ``leaves`` every total order reachable by refining and individualising."""
    colours = _refine(body, names, colours)
    by_colour: dict[int, list[Iter]] = {}
    for it, c in colours.items():
        by_colour.setdefault(c, []).append(it)
    tied = [by_colour[c] for c in sorted(by_colour) if len(by_colour[c]) > 1]
    if not tied:
        leaves.append(tuple(sorted(colours, key=colours.__getitem__)))
        return
    cell = tied[0]
    tried: list[Iter] = []
    for chosen in cell:
        # Swapping ``chosen`` with a member already tried maps that branch's
        # leaves onto this one's, giving the same texts: skip it.
        if any(_swaps(body, names, colours, other, chosen) for other in tried):
            continue
        tried.append(chosen)
        # ``chosen`` goes first within its class; every other class keeps its place.
        split = {it: (2 * c + (it in cell and it is not chosen),) for it, c in colours.items()}
        _individualise(body, names, _rank(split), leaves)


def _swaps(body: ValueExpr, names: dict[Iter, str], colours: dict[Iter, int], x: Iter, y: Iter) -> bool:
    """Whether exchanging summation iterators ``x`` and ``y`` leaves the body unchanged.

    Under an injective naming the text determines the body, so equal texts
    mean the exchange is an automorphism.
    """
    distinct = dict(names)
    for i, (it, c) in enumerate(colours.items()):
        distinct[it] = f"c{c}_{i}"
    swapped = dict(distinct)
    swapped[x], swapped[y] = distinct[y], distinct[x]
    return _value(body, distinct) == _value(body, swapped)
