"""Pure, generic transformations of expressions.

The derivation rules (``einopt.rules``) and the eOperator rewrites
(``einopt.instantiate.eop_rewrite``) are built from these: walking the
accesses of a body, mapping index functions, substituting iterators,
replacing scopes throughout a program, and naming new iterators and
bindings. Every function returns new (interned) nodes and never changes its
arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence

from einopt.core import ir
from einopt.core.index import simplify, substitute

__all__ = [
    "accesses",
    "transform",
    "map_accesses",
    "map_indices",
    "substitute_iters",
    "replace_scopes",
    "replace_reads",
    "rename_tensors",
    "binding_program",
    "put_binding",
    "reading",
    "sort_bindings",
    "bound_reads",
    "prune_bindings",
    "taken_names",
    "fresh_name",
    "iter_names",
    "rename_apart",
    "operands",
    "fold_chain",
    "product_factors",
    "replace_subterm",
    "source_ranges",
    "source_label",
    "index_text",
]


def accesses(e: ir.ValueExpr) -> list[ir.Access]:
    """Distinct accesses of a body, first first (nested scopes are closed: not entered). Found once
    per body (the search asks again for every body of every state it looks at)."""
    found = ir._cached(
        e, "accesses", lambda: tuple(x for x in ir.walk(e, stop=ir.Access) if isinstance(x, ir.Access))
    )
    return list(found)


def transform(e: ir.ValueExpr, visit: Callable[[ir.ValueExpr], ir.ValueExpr | None]) -> ir.ValueExpr:
    """``e`` rebuilt top-down: where ``visit(x)`` returns a node, it replaces ``x`` (and is not
    entered); where it returns ``None``, the operands of ``x`` are transformed (an access is a
    leaf: its indices are not values). Shared subterms are visited once."""
    memo: dict[ir.ValueExpr, ir.ValueExpr] = {}

    def go(x: ir.ValueExpr) -> ir.ValueExpr:
        out = memo.get(x)
        if out is None:
            out = visit(x)
            if out is None:
                out = x if isinstance(x, ir.Access) else ir.rebuild(x, go)
            memo[x] = out
        return out

    return go(e)


def map_accesses(e: ir.ValueExpr, fn: Callable[[ir.Access], ir.ValueExpr]) -> ir.ValueExpr:
    """``e`` with every access ``a`` replaced by ``fn(a)`` (each distinct access mapped once)."""
    return transform(e, lambda x: fn(x) if isinstance(x, ir.Access) else None)


def map_indices(e: ir.ValueExpr, f: Callable[[ir.IndexExpr], ir.IndexExpr]) -> ir.ValueExpr:
    """``e`` with every index of every access mapped by ``f``."""
    return map_accesses(e, lambda a: ir.Access(a.source, tuple(f(i) for i in a.indices)))


def substitute_iters(e: ir.ValueExpr, mapping: Mapping[ir.Iter, ir.IndexExpr]) -> ir.ValueExpr:
    """``e`` with iterators replaced by index expressions; every changed index is simplified."""

    def one(i: ir.IndexExpr) -> ir.IndexExpr:
        return simplify(substitute(i, mapping)) if i.iters() & mapping.keys() else i

    return map_indices(e, one)


def replace_scopes(program: ir.Program, mapping: Mapping[ir.Scope, ir.Scope]) -> ir.Program:
    """``program`` with every occurrence of each key scope replaced by its value.

    Occurrences are found by identity (nodes are interned), in bindings and
    nested inside other scopes alike; scopes that read a replaced scope are
    rebuilt. The inputs stay as declared; bindings are reordered (stably)
    where a replacement reads a later binding.
    """
    scope = _replacer(mapping)
    # A replacement may read bindings that come later (a merged scope reads both parts' inputs):
    # reorder stably so that producers still precede readers.
    bindings = sort_bindings((n, scope(s)) for n, s in program.bindings)
    return program.replace(bindings=bindings)


def replace_reads(scope: ir.Scope, mapping: Mapping[ir.Scope, ir.Scope | ir.Tensor]) -> ir.Scope | ir.Tensor:
    """``scope`` with every read of each key scope, however deeply nested, a read of its value (a
    scope, or an input tensor of its shape); see :func:`replace_scopes`."""
    return _replacer(mapping)(scope)


def _replacer(mapping: Mapping[ir.Scope, ir.Scope | ir.Tensor]):
    """Scope -> the scope with ``mapping`` applied to its reads (memoised: shared scopes are
    rebuilt once)."""
    memo: dict[ir.Scope, ir.Scope | ir.Tensor] = dict(mapping)

    def scope(s: ir.Scope) -> ir.Scope | ir.Tensor:
        out = memo.get(s)
        if out is None:
            # A scope that reaches no replaced scope stays as it is (without walking its body).
            touched = not mapping.keys().isdisjoint(ir.scopes_in(s))
            out = memo[s] = s.replace(body=map_accesses(s.body, access)) if touched else s
        return out

    def access(a: ir.Access) -> ir.Access:
        return a if isinstance(a.source, ir.Tensor) else a.replace(source=scope(a.source))

    return scope


def rename_tensors(program: ir.Program, names: Mapping[str, str]) -> ir.Program:
    """``program`` with its input tensors and bindings renamed by ``names`` (names not in it stay).

    Only names change: the scopes are rebuilt around the renamed tensors, and
    the program means what it meant (bindings are read by identity, not name).
    """
    tensors = {t: t.replace(name=names.get(t.name, t.name)) for t in program.inputs}
    memo: dict[ir.Scope, ir.Scope] = {}

    def scope(s: ir.Scope) -> ir.Scope:
        out = memo.get(s)
        if out is None:
            out = memo[s] = s.replace(body=map_accesses(s.body, access))
        return out

    def access(a: ir.Access) -> ir.Access:
        return a.replace(source=tensors[a.source] if isinstance(a.source, ir.Tensor) else scope(a.source))

    return ir.Program(
        tuple(tensors.values()),
        tuple((names.get(n, n), scope(s)) for n, s in program.bindings),
        tuple(names.get(o, o) for o in program.outputs),
    )


def binding_program(program: ir.Program, name: str) -> ir.Program:
    """Binding ``name`` of ``program`` on its own: the program computing it from the program's
    inputs it reads and, as input tensors named after their bindings, the bound scopes it reads.

    Its inputs come in the order of ``program``'s inputs, then of its bindings; its one binding and
    output is ``name``. :func:`put_binding` puts a program of this form (or one derived from it)
    back in place of the binding.
    """
    root = program.scope(name)
    bound = {s: n for n, s in program.bindings if s is not root}
    stand_in: dict[ir.Scope, ir.Tensor] = {}
    memo: dict[ir.Scope, ir.Scope] = {}

    def scope(s: ir.Scope) -> ir.Scope:
        out = memo.get(s)
        if out is None:
            touched = not bound.keys().isdisjoint(ir.scopes_in(s))
            out = memo[s] = s.replace(body=map_accesses(s.body, access)) if touched else s
        return out

    def access(a: ir.Access) -> ir.Access:
        src = a.source
        if isinstance(src, ir.Tensor):
            return a
        if src not in bound:
            return a.replace(source=scope(src))
        t = stand_in.get(src)
        if t is None:
            t = stand_in[src] = ir.Tensor(bound[src], src.shape)  # scopes compute float32
        return ir.Access(
            t, tuple(simplify(i - o) if o else i for i, o in zip(a.indices, src.origin, strict=True))
        )

    new = scope(root)
    read = set(ir.tensors_in(new))
    order = {n: k for k, (n, _) in enumerate(program.bindings)}
    inputs = [t for t in program.inputs if t in read]
    inputs += sorted(stand_in.values(), key=lambda t: order[t.name])
    return ir.Program(tuple(inputs), ((name, new),), (name,))


def put_binding(program: ir.Program, name: str, sub: ir.Program) -> ir.Program:
    """``program`` with binding ``name`` computed by ``sub``: a program of the form
    :func:`binding_program` gives (inputs named after ``program``'s inputs or bindings, one output
    named ``name``), or one derived from it. ``sub``'s other bindings join ``program`` under names
    of their own.

    Raises
    ------
    ir.IRError
        When an input of ``sub`` is neither an input of ``program`` nor a binding of it of that shape,
        or ``sub``'s output is not ``name``.
    """
    if sub.outputs != (name,):
        raise ir.IRError(f"put_binding: the program's output must be {name}, not {', '.join(sub.outputs)}")
    old = program.scope(name)
    tensors = {t.name: t for t in program.inputs}
    scopes = {n: s for n, s in program.bindings if s is not old}
    for t in sub.inputs:
        host = tensors.get(t.name) or scopes.get(t.name)
        if host is None or tuple(host.shape) != tuple(t.shape):
            raise ir.IRError(f"put_binding: input {t.name}{list(t.shape)} is not in the program")
    scope = reading({t: tensors[t.name] if t.name in tensors else scopes[t.name] for t in sub.inputs})
    taken = taken_names(program)
    new = scope(sub.scope(name))
    extra = []
    for n, s in sub.bindings:
        if n != name:
            fresh = fresh_name(n, taken)
            taken.add(fresh)
            extra.append((fresh, scope(s)))
    out = replace_scopes(program, {old: new})
    at = next(k for k, (n, _) in enumerate(out.bindings) if n == name)
    bindings = out.bindings[:at] + tuple(extra) + out.bindings[at:]
    return prune_bindings(out.replace(bindings=sort_bindings(bindings)))


def reading(mapping: Mapping[ir.Tensor, ir.Tensor | ir.Scope]) -> Callable[[ir.Scope], ir.Scope]:
    """Scope -> the scope with every read of each key tensor, however deeply nested, a read of its
    value: a tensor at the same indices, or a scope at the indices plus its origin (a scope's
    positions are its traversal values). Memoised; a scope that reads no key tensor is kept."""
    memo: dict[ir.Scope, ir.Scope] = {}

    def scope(s: ir.Scope) -> ir.Scope:
        out = memo.get(s)
        if out is None:
            touched = not mapping.keys().isdisjoint(ir.tensors_in(s))
            out = memo[s] = s.replace(body=map_accesses(s.body, access)) if touched else s
        return out

    def access(a: ir.Access) -> ir.Access:
        src = a.source
        if isinstance(src, ir.Scope):
            return a.replace(source=scope(src))
        host = mapping.get(src)
        if host is None:
            return a
        if isinstance(host, ir.Tensor):
            return a.replace(source=host)
        return ir.Access(
            host, tuple(simplify(i + o) if o else i for i, o in zip(a.indices, host.origin, strict=True))
        )

    return scope


def prune_bindings(program: ir.Program) -> ir.Program:
    """``program`` without the bindings that are neither outputs nor read by another binding."""
    keep = list(program.bindings)
    while True:
        read = {x for _, s in keep for x in ir.scopes_in(s) if x is not s}
        live = [(n, s) for n, s in keep if n in program.outputs or s in read]
        if len(live) == len(keep):
            break
        keep = live
    return program if len(keep) == len(program.bindings) else program.replace(bindings=tuple(keep))


def sort_bindings(bindings: Iterable[tuple[str, ir.Scope]]) -> tuple[tuple[str, ir.Scope], ...]:
    """Bindings reordered (stably) so that every binding comes after the bound scopes it reads."""
    pending = list(bindings)
    bound = {s for _, s in pending}
    reads = {s: bound_reads(s, bound) for _, s in pending}
    done: set[ir.Scope] = set()
    for _, s in pending:  # most often in order already: one pass tells
        if not reads[s] <= done:
            break
        done.add(s)
    else:
        return tuple(pending)
    done.clear()
    out: list[tuple[str, ir.Scope]] = []
    while pending:
        for k, (name, s) in enumerate(pending):
            if reads[s] <= done:
                out.append((name, s))
                done.add(s)
                del pending[k]
                break
        else:
            raise ir.IRError("bindings read each other in a cycle")
    return tuple(out)


def bound_reads(scope: ir.Scope, bound: Container[ir.Scope]) -> set[ir.Scope]:
    """The scopes in ``bound`` (a program's bound scopes) that ``scope`` reads, in its body or in the
    scopes not in ``bound`` nested in it; not through other bound ones (each of those is a reading of
    its own). ``scope`` itself is never one."""
    found: set[ir.Scope] = set()
    seen: set[ir.Scope] = set()
    stack = [scope]
    while stack:
        for a in accesses(stack.pop().body):
            x = a.source
            if isinstance(x, ir.Tensor) or x in seen:
                continue
            seen.add(x)
            if x in bound:
                found.add(x)
            else:
                stack.append(x)
    found.discard(scope)
    return found


def taken_names(program: ir.Program) -> set[str]:
    """Names a new binding or tensor of ``program`` must not take: its inputs' and bindings'."""
    return {t.name for t in program.inputs} | {n for n, _ in program.bindings}


def fresh_name(base: str, taken: Iterable[str]) -> str:
    """``base`` or ``base1``, ``base2``, ...: the first that is not taken and not a reserved word."""
    used = set(taken) | ir.RESERVED_NAMES
    if base not in used:
        return base
    k = 1
    while f"{base}{k}" in used:
        k += 1
    return f"{base}{k}"


def rename_apart(
    its: Iterable[ir.Iter], taken: set[str]
) -> tuple[tuple[ir.Iter, ...], dict[ir.Iter, ir.Iter]]:
    """Iterators renamed away from ``taken`` (same ranges; names already free are kept).

    Returns the new iterators and the old -> new mapping; ``taken`` gains the new names.
    """
    new_its, mapping = [], {}
    for it in its:
        new = it if it.name not in taken else ir.Iter(fresh_name(it.name, taken), it.lo, it.hi)
        taken.add(new.name)
        mapping[it] = new
        new_its.append(new)
    return tuple(new_its), mapping


def iter_names(scope: ir.Scope) -> set[str]:
    """Names of the iterators a scope binds."""
    return {it.name for it in scope.traversal + scope.summation}


def operands(e: ir.ValueExpr, op: str) -> list[ir.ValueExpr]:
    """The operands of a chain of one associative operator: ``a + b + c`` with ``op="+"`` gives
    ``[a, b, c]`` (a lone expression of another kind is one operand)."""
    out: list[ir.ValueExpr] = []
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, ir.Binary) and x.op == op:
            stack += (x.b, x.a)
        else:
            out.append(x)
    return out


def fold_chain(terms: Sequence[ir.ValueExpr], op: str) -> ir.ValueExpr:
    """The left-nested chain ``((a op b) op c) ..`` of ``terms`` (at least one): the inverse of
    :func:`operands`."""
    out = terms[0]
    for t in terms[1:]:
        out = ir.Binary(op, out, t)
    return out


def product_factors(e: ir.ValueExpr) -> list[ir.ValueExpr]:
    """The factors of a product ``a * b * ...`` (a lone non-product is one factor)."""
    return operands(e, "*")


def replace_subterm(e: ir.ValueExpr, old: ir.ValueExpr, new: ir.ValueExpr) -> ir.ValueExpr:
    """``e`` with every occurrence of the subterm ``old`` (by identity) replaced by ``new``."""
    return transform(e, lambda x: new if x is old else None)


def source_ranges(src: ir.Tensor | ir.Scope) -> list[tuple[int, int]]:
    """The half-open range of every dimension of a tensor (``[0, n)``) or scope (its traversal)."""
    if isinstance(src, ir.Tensor):
        return [(0, n) for n in src.shape]
    return [(it.lo, it.hi) for it in src.traversal]


def index_text(e: ir.IndexExpr) -> str:
    """An index as written in an access, for messages (a lone iterator prints as its name, not its range)."""
    return e.name if isinstance(e, ir.Iter) else str(e)


def source_label(acc: ir.Access) -> str:
    """How messages name what an access reads: the tensor's name, or ``scope``."""
    return acc.source.name if isinstance(acc.source, ir.Tensor) else "scope"
