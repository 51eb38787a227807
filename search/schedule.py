"""The search schedule: which rules run in which phase, which of their matches, with what limits.

The schedule is data apart from the rules (``einopt search --explain-schedule``
prints it). Each phase lists :class:`Use` entries: a rule of the registry,
the typed variants of its matches the phase takes (``substitute_variables``'
``fuse``/``merge``/``split``/``split_sum``/``reverse_sum``, ...), and an
optional *restriction*, a named property of a match (:data:`RESTRICTIONS`)
that keeps the explorative branching factor low. Restrictions look only at the
match and the program it applies to, never at shapes or models.

* ``explore``: rules that change the mathematics, applied breadth first up to
  ``max_depth`` steps.
* ``converge``: rules that only move iterators and data toward an operator's
  layout; a step is taken only when it lowers the expression distance
  (:mod:`einopt.search.distance`), up to ``converge_depth`` steps.
* ``cleanup``: the normal form every state is brought to
  (:mod:`einopt.search.normal`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from einopt.core import ir
from einopt.core.index import linear_form
from einopt.core.rewrite import accesses, operands, substitute_iters
from einopt.instantiate.plan import known_values
from einopt.rules import REGISTRY, Context, Match
from einopt.rules.base import Hit
from einopt.rules.boundary import ProgramFacts
from einopt.rules.fusion import fuse
from einopt.search.distance import fused_match, matcher_context, may_fuse

__all__ = ["Use", "Schedule", "DEFAULT_SCHEDULE", "RESTRICTIONS", "explain"]


def coupled_summations(scope: ir.Scope) -> frozenset[ir.Iter]:
    """Summation iterators read in one index together with a traversal iterator (``r`` of ``h + r - 1``):
    the window iterators an offset sum can take outside a contraction."""
    trav = set(scope.traversal)
    found: set[ir.Iter] = set()
    for acc in accesses(scope.body):
        for e in acc.indices:
            its = e.iters()
            if its & trav:
                found |= its - trav
    return frozenset(found & set(scope.summation))


def _windows_outside(program: ir.Program, m: Match, ctx: Context) -> bool:
    # Sum_{outer} {L Sum_{inner} f}: only window iterators go outside, and every plain contraction
    # iterator stays inside, so the inner scope is a contraction an operator can take and the outer
    # one an offset sum.
    scope = m.target
    inner = set(m["inner"])
    outer = set(scope.summation) - inner
    coupled = coupled_summations(scope)
    return bool(outer) and outer <= coupled and not (set(scope.summation) - coupled) - inner


def _window_iterator(program: ir.Program, m: Match, ctx: Context) -> bool:
    # Relaxing only pays when the enlarged range splits into blocks (Fig. 6: a 5-tap window to 6 = 2 x 3);
    # the contraction axes and the traversal only gain zeros.
    return m.target is not None and m["iterator"] in coupled_summations(m.target)


def _reads_window(program: ir.Program, m: Match, ctx: Context) -> bool:
    # Split a summation into blocks only where it is a window read beside traversal iterators.
    scope = m.target
    split = [it for it, _ in m["inverse"]] if "inverse" in m.params else []
    return scope is not None and bool(split) and set(split) <= coupled_summations(scope)


def _flipped_window(program: ir.Program, m: Match, ctx: Context) -> bool:
    # Read a tap forward only where it is a plain flipped window (X[q - q1 + 1]), not inside a
    # // or % of a zero-inserted read, where reversing it only renames the same computation.
    scope = m.target
    if scope is None or "forward" not in m.params:
        return False
    flipped = {it for it, _ in m["forward"]}
    trav = set(scope.traversal)
    for acc in accesses(scope.body):
        for e in acc.indices:
            lf = linear_form(e)
            if lf.atoms:
                continue
            coeffs = dict(lf.coeffs)
            if any(coeffs.get(it, 0) < 0 for it in flipped) and trav & set(coeffs):
                return True
    return False


def _shares_input(program: ir.Program, m: Match, ctx: Context) -> bool:
    # Merge expressions that read a common activation (one matmul on concatenated weights, the
    # LSTM's gates on concat(x, h), GCN's two skinny convolutions); a batch of unrelated products
    # is left to the "batch" variant's own use.
    labels = {label: scope for scope, label in ProgramFacts.of(program).labels.items()}
    s1, s2 = labels.get(m["first"]), labels.get(m["second"])
    if s1 is None or s2 is None:
        return False
    return _partners(s1, s2, ProgramFacts.of(program).bound)


def _partners(s1: ir.Scope, s2: ir.Scope, bound: frozenset[ir.Scope] | set[ir.Scope] = frozenset()) -> bool:
    """Whether two scopes read a common source and are not pieces of one expression. A scope's
    reads include those of the scopes nested in it that are not ``bound`` (a contraction inside
    its bias epilogue reads what the contraction reads)."""
    return bool(_reads(s1, bound) & _reads(s2, bound)) and not _pieces_of_one(s1, s2)


def _reads(scope: ir.Scope, bound: frozenset[ir.Scope] | set[ir.Scope]) -> set:
    found: set = set()
    stack = [scope]
    while stack:
        for a in accesses(stack.pop().body):
            if a.source not in found:
                found.add(a.source)
                if isinstance(a.source, ir.Scope) and a.source not in bound:
                    stack.append(a.source)
    return found


def _pieces_of_one(s1: ir.Scope, s2: ir.Scope) -> bool:
    """Whether two scopes compute one expression over different ranges of its traversal (what a
    ``split_expression`` left): merging them back only undoes that split."""
    if s1 is s2 or len(s1.traversal) != len(s2.traversal) or s1.summation != s2.summation:
        return False
    if any(a.name != b.name for a, b in zip(s1.traversal, s2.traversal, strict=True)):
        return False
    same = {b: a for a, b in zip(s1.traversal, s2.traversal, strict=True) if a != b}
    return substitute_iters(s2.body, same) == s1.body


def _no_summation_producer(program: ir.Program, m: Match, ctx: Context) -> bool:
    # Vertical fusion of data movement (a zero-insertion or layout scope into its reader), or of a
    # contraction into a consumer that only gathers from it (then only the gathered points are
    # computed: Longformer's band of a dense product); fusing a contraction into arithmetic gives
    # an eOperator no operator can take.
    producer, consumer = program.scope(m["producer"]), program.scope(m["consumer"])
    gathers = (
        not consumer.summation
        and isinstance(consumer.body, ir.Access)
        and consumer.body.source is producer
        and math.prod(consumer.shape) < math.prod(producer.shape)
    )
    return not producer.summation or gathers


def _computes(program: ir.Program, scope: ir.Scope) -> bool:
    """Whether ``scope`` sums, or reads a nested scope of its own that sums. A scope that only
    assembles other bindings (the interleave a residue split leaves) is data movement: converging
    lays it out."""
    if scope.summation:
        return True
    bound = ProgramFacts.of(program).bound
    return any(
        isinstance(a.source, ir.Scope) and a.source.summation and a.source not in bound
        for a in accesses(scope.body)
    )


def _split_compute(program: ir.Program, m: Match, ctx: Context) -> bool:
    return m.target is not None and _computes(program, m.target)


def _strided_reads(program: ir.Program, m: Match, ctx: Context) -> bool:
    # A residue split pays when a scope that computes reads its iterators through // or % (zero
    # insertion); a nested one (a ConvTranspose inside its bias epilogue) is bound by the split.
    scope = m["scope"] if "nested_in" in m.params else program.scope(m["binding"])
    if not _computes(program, scope):
        return False
    return all(_read_strided(scope, scope.traversal[axis]) for axis in m["axes"])


def _read_strided(scope: ir.Scope, x: ir.Iter) -> bool:
    for acc in accesses(scope.body):
        for e in acc.indices:
            if x in e.iters() and any(
                not isinstance(atom, ir.Iter) and x in atom.iters() for atom, _ in linear_form(e).atoms
            ):
                return True
    return False


def _is_copy(scope: ir.Scope) -> bool:
    """A scope that reads one source at its own traversal iterators in order (extent-1 ones may be left out)."""
    body = scope.body
    if scope.summation or not isinstance(body, ir.Access):
        return False
    read = [it for it in scope.traversal if it.extent > 1 or it in body.indices]
    return tuple(read) == body.indices


def _read_through(program: ir.Program, m: Match, ctx: Context) -> bool:
    # The normal form inlines scopes that only re-index another scope (what substitution leaves
    # behind) and plain copies; a layout scope over an input (a materialised im2col buffer, a split
    # dimension) is kept: it is the converging phase's work.
    #
    # A bound re-indexing of a scope that sums (the head merge after an attention's product, bound
    # as the exporter wrote it) stays bound where a nested scope reads it, as where a binding reads
    # it (fuse_expressions' job): a Gemm's product nested in its bias epilogue would otherwise read
    # the product through the merge (a run-time transpose no operator takes) where a Gemm without
    # bias reads the bound merge plainly, and the attention fuse_cone nests into the merge would
    # end up inside the projection's product.
    inner = m["access"].source
    body = inner.body
    if inner.summation or not isinstance(body, ir.Access):
        return False
    if (
        isinstance(body.source, ir.Scope)
        and body.source.summation
        and inner in ProgramFacts.of(program).bound
    ):
        return False
    return isinstance(body.source, ir.Scope) or _is_copy(inner)


def _unit_copy(program: ir.Program, m: Match, ctx: Context) -> bool:
    # A producer that only copies an input with unit dimensions added (a stride-s zero-insertion
    # scope once every reader reads it at its real positions, as the phases of a ConvTranspose do)
    # is inlined: its readers then read the input itself.
    producer = program.scope(m["producer"])
    body = producer.body
    if producer.summation or not isinstance(body, ir.Access) or not isinstance(body.source, ir.Tensor):
        return False
    return _is_copy(producer) and all(it.extent == 1 for it in producer.traversal if it not in body.indices)


def _traversal_range(program: ir.Program, m: Match, ctx: Context) -> bool:
    # Slack traversal ranges (left by substitution) are tightened; a summation range is left as it is,
    # or the normal form would undo every relaxation, unless one term is all that is nonzero: the sum
    # is that term (a tap residue a phase of a strided transposed convolution never reads).
    if m.target is None:
        return False
    return m["iterator"] in m.target.traversal or m["hi"] - m["lo"] == 1


def _constant_source(program: ir.Program, m: Match, ctx: Context) -> bool:
    # Lay out a weight the way a merge needs it: free, it is folded at compile time. Only where a
    # merge can follow: the scope has a partner (another scope reading a common source).
    src = m["access"].source
    if not (isinstance(src, ir.Tensor) and ctx.is_constant(src)) or m.target is None:
        return False
    facts = ProgramFacts.of(program)
    return any(s is not m.target and _partners(m.target, s, facts.bound) for s in facts.labels)


def _sums_a_contraction(scope: ir.Scope) -> bool:
    """A sum-free scope whose body is a ``+`` chain with one read of a summing scope among its
    terms: a contraction with its bias epilogue (``{L Sum x * W}[m, n] + b[n]``). A sum of two
    contractions is not one: merge_summations takes it as it is."""
    terms = operands(scope.body, "+")
    sums = [
        t for t in terms if isinstance(t, ir.Access) and isinstance(t.source, ir.Scope) and t.source.summation
    ]
    return not scope.summation and len(sums) == 1 and len(terms) > 1


def _epilogues(program: ir.Program, consumer: str) -> list[str]:
    """The bindings a sum-free ``consumer`` adds as terms of its ``+`` chain that are contractions
    with their epilogues, read by nothing else and not program outputs (inlining them computes
    nothing twice)."""
    c = program.scope(consumer)
    if c.summation:
        return []
    names = program.names()
    found: list[str] = []
    for t in operands(c.body, "+"):
        if not (isinstance(t, ir.Access) and t.source in names and _sums_a_contraction(t.source)):
            continue
        name = names[t.source]
        readers = [n for n, s in program.bindings if n != name and t.source in ir.scopes_in(s)]
        if name not in program.outputs and readers == [consumer] and name not in found:
            found.append(name)
    return found


def _sum_of_contractions(program: ir.Program, m: Match, ctx: Context) -> bool:
    # Two contractions added, each with its bias (nn.Linear exported as Gemm with a bias, or
    # MatMul + Add: x W^T + b + h U^T + c, the LSTM gates as PyTorch writes them): their epilogues
    # are inlined into the sum when the two contractions then merge into one (merge_summations
    # applies to the fused sum), so the normal form shows the sum of products the hand-written
    # form has. Nothing else is fused here: a contraction stays apart from its epilogue otherwise.
    epilogues = _epilogues(program, m["consumer"])
    if m["producer"] not in epilogues:
        return False
    fused = program
    for name in epilogues:
        step = fuse(fused, m["consumer"], name, ctx.is_finite)
        if isinstance(step, str):
            return False
        fused = step
    merge = REGISTRY["merge_summations"]
    scope = fused.scope(m["consumer"])
    return any(isinstance(h, Hit) for h in merge.match_in(scope, ProgramFacts.of(fused), ctx))


def _fused_operator(program: ir.Program, m: Match, ctx: Context) -> bool:
    # The chain of bindings a fused target computes at once (the attention core) is one step away
    # for fuse_cone, and many for fuse_expressions (one per binding, in every order): the cone is
    # nested when a fused target then takes the consumer whole.
    consumer = program.scope(m["consumer"])
    if not may_fuse(consumer):
        return False
    # Keyed by the constant tensors' values too, by identity (RotaryEmbedding's answer depends on
    # them; the cached pair holds the arrays, so an id names no other array while the entry lives).
    # (the consumer reaches every tensor of its cone)
    arrays = known_values(ir.tensors_in(consumer), ctx.constants)
    cone = ("fused_cone", tuple(map(id, arrays)), *(program.scope(n) for n in m["cone"]))

    def takes() -> bool:
        nested = REGISTRY[m.rule].apply(program, m, ctx)
        return (
            fused_match(consumer, matcher_context(nested, frozenset(ctx.constants), ctx.constants))
            is not None
        )

    # The same consumer and cone recur in many states: decided once (scopes are interned; the memo,
    # on the consumer, is keyed by the cone's scopes themselves, which keeps them alive: a key of
    # their ids would name other scopes once these are collected).
    return ir._cached(consumer, cone, lambda: (takes(), arrays))[0]


RESTRICTIONS: dict[str, tuple[Callable[[ir.Program, Match, Context], bool], str]] = {
    "fused_operator": (
        _fused_operator,
        "only when an operator that computes a chain of scopes (attention) then takes the consumer whole",
    ),
    "constant_source": (
        _constant_source,
        "only reads of constant tensors (weights; folded at compile time) by a scope a merge can take",
    ),
    "windows_outside": (
        _windows_outside,
        "only window iterators (read beside a traversal iterator) go outside; every contraction iterator stays in",
    ),
    "window_iterator": (_window_iterator, "only a window iterator (read beside a traversal iterator)"),
    "window_blocks": (_reads_window, "only a window iterator, into blocks"),
    "read_through": (_read_through, "only scopes that re-index another scope, and plain copies"),
    "unit_copy": (_unit_copy, "only producers that copy an input with unit dimensions added"),
    "sum_of_contractions": (
        _sum_of_contractions,
        "only contractions with their bias epilogues added together, when the contractions then merge",
    ),
    "traversal_range": (_traversal_range, "only traversal ranges, and sums with a single nonzero term"),
    "shares_input": (
        _shares_input,
        "only expressions that read a common source, and not pieces of one expression (what a split left)",
    ),
    "flipped_window": (
        _flipped_window,
        "only a tap read flipped beside a traversal iterator in a plain index (no // or %)",
    ),
    "data_movement": (
        _no_summation_producer,
        "only producers without a summation (layout, zero insertion), or a gather of fewer points",
    ),
    "strided": (
        _strided_reads,
        "only iterators read through // or % (strided, zero-inserted reads) of a scope that computes",
    ),
    "computes": (_split_compute, "only scopes that sum, or read a nested scope of their own that sums"),
}
"""Named restrictions: ``name -> (predicate(program, match), what it keeps, in words)``."""


@dataclasses.dataclass(frozen=True)
class Use:
    """One rule in one phase: the variants it takes (all when empty) and a restriction by name."""

    rule: str
    variants: tuple[str, ...] = ()
    restrict: str = ""

    def __post_init__(self) -> None:
        rule = REGISTRY.get(self.rule)
        if rule is None:
            raise ValueError(f"schedule: no rule named {self.rule!r}")
        bad = [v for v in self.variants if v not in rule.variants]
        if bad:
            raise ValueError(
                f"schedule: {self.rule} has no variant {', '.join(bad)} (it has {rule.variants})"
            )
        if self.restrict and self.restrict not in RESTRICTIONS:
            raise ValueError(f"schedule: unknown restriction {self.restrict!r}")

    def admits(self, program: ir.Program, m: Match, ctx: Context) -> bool:
        """Whether this use takes match ``m`` (its variant, and its restriction)."""
        return self.takes_variant(m) and self.allows(program, m, ctx)

    def takes_variant(self, m: Match) -> bool:
        """Whether ``m`` is one of this use's variants (every match when it names none)."""
        return not self.variants or REGISTRY[self.rule].variant(m) in self.variants

    def allows(self, program: ir.Program, m: Match, ctx: Context) -> bool:
        """Whether this use's restriction lets ``m`` through (always, without one)."""
        return not self.restrict or RESTRICTIONS[self.restrict][0](program, m, ctx)

    def label(self) -> str:
        out = self.rule
        if self.variants:
            out += f" ({', '.join(self.variants)})"
        return out


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Rules per phase (see the module docstring)."""

    explore: tuple[Use, ...]
    converge: tuple[Use, ...]
    cleanup: tuple[Use, ...]
    # What still applies to a converged state: merging the operators converging made, and laying
    # out weights so that two of them can merge.
    after_converge: tuple[Use, ...] = ()

    def phases(self) -> dict[str, tuple[Use, ...]]:
        return {
            "explore": self.explore,
            "converge": self.converge,
            "after converge": self.after_converge,
            "cleanup": self.cleanup,
        }


DEFAULT_SCHEDULE = Schedule(
    explore=(
        Use("split_summation", restrict="windows_outside"),
        Use("relax_boundary", restrict="window_iterator"),
        Use("substitute_variables", ("split_sum", "split_sum_flipped"), restrict="window_blocks"),
        Use("substitute_variables", ("split",), restrict="computes"),
        # A flipped tap (X[q - q1 + 1]) read forward: the same window as a Conv rather than a
        # stride-1 ConvTranspose, which is a different kernel (faster or slower by shape, measured).
        Use("substitute_variables", ("reverse_sum",), restrict="flipped_window"),
        # "stacked": the phases concatenated along the channel axis and read back as DepthToSpace (DCR);
        # "interleaved": each phase in its own slot of a [.., x', k, ..] layout (Concats along the unit
        # residue axes, then a Reshape). Neither adds the phases up with an interleaving eOperator.
        Use("split_expression", ("residue", "residues", "stacked", "interleaved"), restrict="strided"),
        Use("merge_summations"),
        Use("merge_expressions", ("concat", "join"), restrict="shares_input"),
        Use("fuse_expressions", restrict="data_movement"),
        Use("fuse_cone", restrict="fused_operator"),
        Use("rewrite_prelu_max"),
        # PRelu as a * y + relu((1 - a) * y): with both scales folded into the weights, two
        # convolutions that ONNX Runtime fuses with the ReLU and the sum (measured against the max form).
        Use("rewrite_prelu_relu"),
        Use("rewrite_prelu_leaky"),
        Use("fold_channel_scale"),
    ),
    converge=(
        Use("substitute_variables", ("fuse", "merge", "split", "reverse_sum")),
        Use("materialize_access"),
        Use("split_dimension"),
        Use("merge_dimensions"),
        Use("swap_dimensions"),
        Use("replicate_access"),
    ),
    after_converge=(
        Use("materialize_access", restrict="constant_source"),
        Use("merge_expressions", ("concat", "join"), restrict="shares_input"),
    ),
    cleanup=(
        Use("merge_traversal", restrict="read_through"),
        Use("fuse_expressions", restrict="unit_copy"),
        Use("fuse_expressions", restrict="sum_of_contractions"),
        Use("tighten_boundary", ("range",), restrict="traversal_range"),
        Use("tighten_boundary", ("diagonal",)),
    ),
)
"""The schedule :func:`einopt.search.search` uses unless given another."""


def explain(schedule: Schedule = DEFAULT_SCHEDULE) -> str:
    """The schedule in words: per phase, each rule, its variants, restriction and what it may undo or grow."""
    lines: list[str] = []
    notes = {
        "explore": "breadth first, every admitted match, up to max_depth steps; states deduplicated by key",
        "converge": "per state, only steps that lower the expression distance, up to converge_depth steps",
        "after converge": "from converged states (every compute scope an operator), counted as explorative steps",
        "cleanup": "normal form after every step: inline read-through scopes, tighten slack ranges",
    }
    for phase, uses in schedule.phases().items():
        lines.append(f"{phase}: {notes[phase]}")
        for use in uses:
            rule = REGISTRY[use.rule]
            extra = []
            if use.restrict:
                extra.append(f"restricted: {RESTRICTIONS[use.restrict][1]}")
            if rule.undoes:
                extra.append(f"may undo {', '.join(rule.undoes)}")
            if rule.grows:
                extra.append("can grow the state")
            lines.append(f"  {use.label()}" + (f"  [{'; '.join(extra)}]" if extra else ""))
    return "\n".join(lines)
