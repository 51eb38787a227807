"""Merging adjacent subprograms whose chosen programs fuse into fewer generated kernels (``--kernels tvm``).

The partition cuts a model into subprograms that are searched on their own
(a search over the LSTM cell's 25 nodes at once finds less in more time than
one over its linear part and one over its element-wise tail). Each gets its
own fastest program, but the seam between two of them can hold element-wise
work that a generated kernel would do in registers: the merged LSTM gates'
bias Add and Split at the end of the linear part, read by the fused tail's
kernels in the next part.

:func:`merge_parts` composes the chosen programs of two parts where one
reads the other (:func:`compose`: the reader's input tensors become the
producer's bound scopes), applies the kernel fusion of
:mod:`einopt.backends.tvm.kernelfusion` to the composition, and keeps the pair
together where that leaves fewer bindings than the two fused alone. The other
programs a part's selection timed are composed with the other part's chosen
program too, and the two compositions that fuse into the fewest bindings
are tried beside it (which program fuses best with its neighbour is not
something a part's own timing shows). A merged group is then tried like a
subprogram of its own: instantiated, verified, and timed against its
original nodes, the fastest (fewest nodes among ties) head to head against
the two chosen programs side by side; it wins unless it is slower beyond
the noise band (a tie goes to the merged program: fewer kernels). A group is
never merged across a node outside it (the graph would have a cycle).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence

import onnx

from einopt.backends.tvm.kernelfusion import PHASE, fuse_for_kernels
from einopt.backends.tvm.kernelgroups import convex
from einopt.core import ir
from einopt.core.rewrite import (
    fresh_name,
    prune_bindings,
    reading,
    rename_tensors,
    sort_bindings,
    taken_names,
)
from einopt.frontend.translate import Part
from einopt.instantiate.backend import PORTABLE
from einopt.instantiate.emit import Instantiated
from einopt.rules.derive import TraceStep
from einopt.runtime.timing import Comparison
from einopt.search.results import Candidate
from einopt.stages.context import StageContext
from einopt.stages.export import toposort
from einopt.stages.partsearch import PartSearch
from einopt.stages.select import Selection, Trial, choose, try_trials
from einopt.stages.state import PartState
from einopt.stages.verify import PartPair

__all__ = ["compose", "merge_parts", "MERGE_RULE", "BUDGET_S"]

log = logging.getLogger(__name__)

MERGE_RULE = "merge_subprograms"
"""The trace step's rule name for two subprograms composed into one."""
BUDGET_S = 30.0
"""Seconds the stage may spend compiling, verifying and timing merged pairs (each takes a few)."""
MAX_OTHERS = 2
"""Compositions a merged pair tries beside the composition of its members' chosen programs, at
most: those of a member's runners-up (:func:`_runners_up`) that fuse into the fewest bindings."""


@dataclasses.dataclass(frozen=True)
class _Side:
    """A part (or a merged group) as merging sees it: its input and chosen programs, in its names."""

    part: Part
    chosen: Candidate  # the chosen candidate (the input itself when nothing was chosen)
    members: tuple[str, ...]  # the original parts' names
    # A part: its other timed programs (:func:`_runners_up`). A group: the other compositions it
    # tries beside ``chosen`` (a runner-up of one member with the other's chosen program).
    others: tuple[Candidate, ...] = ()


def merge_parts(
    ctx: StageContext, states: Mapping[str, PartState], *, budget_s: float | None = None
) -> dict[str, PartState]:
    """``states`` with adjacent parts merged where their chosen programs fuse further (module docstring),
    the merged programs instantiated with the context's backend (the TVM backend's ``after_selection``).

    A merged group's state replaces its members' (at the first member's place); its selection holds
    the ways it was tried, the members' chosen programs side by side and each fused composition (of
    the chosen programs, and of a member's runners-up with the other's chosen one), and chose the
    fastest (timed; untimed: the composition of the chosen programs). Groups whose compositions
    lose keep their members' states unchanged. The side-by-side rival runs each member as
    acceptance would keep it: its chosen program where that was measured at least ``1 + noise``
    times faster than its original nodes (or untimed), else its original nodes. Pairs are tried in
    part order until ``budget_s`` (default :data:`BUDGET_S`) has passed; the others stay apart.
    """
    sides = {n: _side(s) for n, s in states.items() if s.selection is not None and s.part.translated}
    groups = _groups(ctx.model, [sides[n] for n in states if n in sides])
    out = dict(states)
    deadline = time.monotonic() + (BUDGET_S if budget_s is None else budget_s)
    for k, group in enumerate(groups):
        if time.monotonic() > deadline:
            log.info("merging: the budget ran out; %d pair(s) not tried", len(groups) - k)
            break
        merged = _try_group(ctx, group, states)
        if merged is None:
            continue
        first = group.members[0]
        rebuilt = {}
        for name, s in out.items():
            if name == first:
                rebuilt[merged.name] = merged
            elif name not in group.members:
                rebuilt[name] = s
        out = rebuilt
    return out


def _side(state: PartState) -> _Side:
    chosen = state.selection.chosen
    candidate = chosen.candidate if chosen is not None else Candidate(state.part.program, (), (), 0.0)
    return _Side(state.part, candidate, (state.name,), _runners_up(state.selection))


def _runners_up(selection: Selection) -> tuple[Candidate, ...]:
    """The derived programs other than the chosen one that selection timed (verified, and not
    rejected as too slow to time), fastest first, each program once; none when selection timed
    nothing (untimed, the choice is the predicted one and merging keeps it).

    How a program runs on its own says little about how it fuses with the next part: the LSTM
    gates' MatMuls merged four at a time end in a Split, slow on its own (1.10x against 1.24x for a
    partial merge, in one run of ``lstm_linear_cell``), which the tail's generated kernel then
    absorbs (composed: 1.35x against 1.22x). And at microseconds a part's own timings rank close
    programs by chance (the four-gate merge of the LSTM generator read 1.29x, 1.26x and 1.76x in
    three runs, three gates 1.24x, 1.22x and 1.60x). :func:`_pair` composes them all and keeps
    the compositions that fuse into the fewest bindings.
    """
    chosen = selection.chosen
    if chosen is None or chosen.measured is None:
        return ()
    timed = [t for t in selection.tried if t.measured is not None]
    seen = {chosen.candidate.program}
    out: list[Candidate] = []
    for t in sorted(timed, key=lambda t: -t.measured.speedup):
        program = t.candidate.program
        if t.unchanged or not t.candidate.trace or program in seen:
            continue
        seen.add(program)
        out.append(t.candidate)
    return tuple(out)


# ---- which parts merge ------------------------------------------------------


def _groups(model: onnx.ModelProto, sides: list[_Side]) -> list[_Side]:
    """Merged pairs, in part order: a part joins the part it reads from when the fused composition
    has fewer bindings than the two fused alone. A part is in one pair at most: a chain of merges
    could grow a group to the whole model, and one loss head to head would then keep none of them."""
    producer_of = _producers(model)
    free = list(sides)
    pairs: list[_Side] = []
    for c in sides:
        for p in free:
            if c not in free or p is c or not _reads_from(model, c.part, p.part, producer_of):
                continue
            group = _pair(model, p, c)
            if group is not None:
                free = [s for s in free if s is not p and s is not c]
                pairs.append(group)
                break
    return pairs


def _producers(model: onnx.ModelProto) -> dict[str, int]:
    return {o: i for i, n in enumerate(model.graph.node) for o in n.output if o}


def _reads_from(model: onnx.ModelProto, c: Part, p: Part, producer_of: Mapping[str, int]) -> bool:
    """Whether a node of ``c`` reads a value that a node of ``p`` produces."""
    nodes, mine = model.graph.node, set(p.nodes)
    return any(producer_of.get(v) in mine for i in c.nodes for v in nodes[i].input)


def _pair(model: onnx.ModelProto, p: _Side, c: _Side) -> _Side | None:
    """``p`` and ``c`` as one group when merging their chosen programs fuses more (and keeps the
    graph acyclic); its ``others`` compose each side's runners-up (:func:`_runners_up`) with the
    other's chosen program: the :data:`MAX_OTHERS` that fuse into the fewest bindings."""
    nodes = tuple(sorted(p.part.nodes + c.part.nodes))
    if not _convex(model, set(nodes)):
        return None
    pairs = [(p.chosen, c.chosen), *((o, c.chosen) for o in p.others), *((p.chosen, o) for o in c.others)]
    try:
        programs, part = _merged_part(
            model, p.part, c.part, [(a.program, b.program) for a, b in pairs], nodes
        )
    except Exception as e:  # noqa: BLE001 - a pair that cannot be composed stays two parts; the log says why
        log.debug("%s + %s: not composed: %s", p.part.name, c.part.name, e)
        return None
    if programs[0] is None:
        return None
    alone = len(fuse_for_kernels(p.chosen.program)[0].bindings) + len(
        fuse_for_kernels(c.chosen.program)[0].bindings
    )
    candidates: list[Candidate] = []
    for (a, b), program in zip(pairs, programs, strict=True):
        if program is None:
            continue
        fused, steps = fuse_for_kernels(program)
        if not candidates and len(fused.bindings) >= alone:
            return None
        if any(fused == k.program for k in candidates):
            continue
        merge = TraceStep(
            MERGE_RULE, part.name, f"compose {p.part.name} and {c.part.name} into one program", program, PHASE
        )
        candidates.append(
            Candidate(fused, a.trace + b.trace + (merge,) + steps, (), (a.cost or 0.0) + (b.cost or 0.0))
        )
    others = sorted(candidates[1:], key=lambda k: len(k.program.bindings))  # stable: fastest first
    return _Side(part, candidates[0], p.members + c.members, tuple(others[:MAX_OTHERS]))


def _convex(model: onnx.ModelProto, group: set[int]) -> bool:
    """Whether no node outside ``group`` lies on a path between two of its nodes."""
    nodes = list(model.graph.node)
    by_value: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for v in n.input:
            by_value.setdefault(v, []).append(i)
    readers = {i: [j for o in n.output for j in by_value.get(o, ())] for i, n in enumerate(nodes)}
    return convex(group, readers)


# ---- composing two programs -------------------------------------------------


def compose(
    first: ir.Program,
    first_names: Mapping[str, str],
    second: ir.Program,
    second_names: Mapping[str, str],
    outputs: Sequence[str],
    rename: Mapping[str, str],
) -> ir.Program:
    """``second`` reading ``first``'s bound scopes where its inputs are ``first``'s outputs.

    ``first_names`` and ``second_names`` map each program's input tensors and outputs to ONNX value
    names. ``rename`` renames ``second``'s tensors and bindings apart from ``first``'s (a tensor of
    ``second`` that is an input of ``first`` under the same ONNX name is renamed to ``first``'s
    name); ``outputs`` are the composition's outputs (in the composed names).
    """
    second = rename_tensors(second, rename)
    produced = {first_names[o]: first.scope(o) for o in first.outputs}
    original = {new: old for old, new in rename.items()}
    read: dict[ir.Tensor, ir.Scope] = {}
    for t in second.inputs:
        scope = produced.get(second_names.get(original.get(t.name, t.name), ""))
        if scope is not None:
            if tuple(scope.shape) != tuple(t.shape):
                raise ir.IRError(f"{t.name}{list(t.shape)} is read as {list(scope.shape)}")
            read[t] = scope
    scope_of = reading(read)
    inputs = list(first.inputs)
    have = {t.name for t in inputs}
    for t in second.inputs:
        if t not in read and t.name not in have:
            inputs.append(t)
            have.add(t.name)
    bindings = sort_bindings([*first.bindings, *((n, scope_of(s)) for n, s in second.bindings)])
    used = set().union(*(ir.tensors_in(s) for _, s in bindings))
    program = ir.Program(tuple(t for t in inputs if t in used), bindings, tuple(outputs))
    return prune_bindings(program)


def _merged_part(
    model: onnx.ModelProto,
    p: Part,
    c: Part,
    programs: Sequence[tuple[ir.Program, ir.Program]],
    nodes: tuple[int, ...],
) -> tuple[list[ir.Program | None], Part]:
    """The composition of each pair of ``programs`` (a program of ``p``, one of ``c``; None where one
    does not compose), and the merged part (its program the composition of the two parts' input
    programs). Every composition is in the part's names: ``c``'s tensors are renamed apart from
    every program of ``p`` at once."""
    onnx_of_first = {p.names[t.name]: t.name for t in p.program.inputs}
    taken = set().union(*map(taken_names, (p.program, *(a for a, _ in programs))))
    rename: dict[str, str] = {}
    c_names = sorted(set().union(*map(taken_names, (c.program, *(b for _, b in programs)))))
    for n in c_names:
        same = onnx_of_first.get(c.names.get(n, ""))
        if same is not None:
            rename[n] = same
            continue
        rename[n] = fresh_name(n, taken)
        taken.add(rename[n])
    outside = _read_outside(model, set(nodes))
    produced_by_p = {p.names[o]: o for o in p.program.outputs}
    outputs = [rename[o] for o in c.program.outputs]
    outputs += [o for v, o in produced_by_p.items() if v in outside and o not in outputs]
    names = {**p.names, **{rename[k]: v for k, v in c.names.items()}}
    constants = {**p.constants, **{rename[k]: v for k, v in c.constants.items()}}
    base = compose(p.program, p.names, c.program, c.names, outputs, rename)
    composed: list[ir.Program | None] = []
    for a, b in programs:
        try:
            composed.append(compose(a, p.names, b, c.names, outputs, rename))
        except Exception as e:  # noqa: BLE001 - one pair of programs that does not compose leaves the others
            log.debug("%s + %s: a pair of programs not composed: %s", p.name, c.name, e)
            composed.append(None)
    kept = {t.name for t in base.inputs} | set(base.outputs)
    kept |= {t.name for prog in composed if prog is not None for t in prog.inputs}
    part = Part(
        f"{p.name}+{c.name}",
        "merged",
        nodes,
        base,
        {k: v for k, v in names.items() if k in kept},
        {k: v for k, v in constants.items() if k in kept},
    )
    return composed, part


def _read_outside(model: onnx.ModelProto, group: set[int]) -> set[str]:
    """The values read by nodes outside ``group``, and the graph's outputs."""
    out = {o.name for o in model.graph.output}
    for i, n in enumerate(model.graph.node):
        if i not in group:
            out.update(n.input)
    return out


# ---- trying a group ---------------------------------------------------------


def _try_group(ctx: StageContext, group: _Side, states: Mapping[str, PartState]) -> PartState | None:
    """The merged state of ``group`` when one of its fused programs is verified and (timed) not
    slower than its members' programs side by side beyond ``noise``; None otherwise.

    Each fused program (the composition of the members' chosen programs and its ``others``) is
    timed against the original nodes (what acceptance reads, like any chosen candidate); the one
    chosen as selection chooses (:func:`einopt.stages.select.choose`: fewest nodes among ties) is
    then timed head to head against the members' programs side by side: two ratios against the
    original measured at different moments are not comparable on a machine whose speed drifts.
    """
    model, backend, noise = ctx.model, ctx.backend, ctx.noise
    timed = ctx.timed
    trials = try_trials(
        ctx, group.part, [Trial(group.part.name, c, backend=backend) for c in (group.chosen, *group.others)]
    )
    fused, tried = choose(trials, timed=timed, fewer_nodes=backend.fewer_nodes, noise=noise)
    if fused is None:
        why = "; ".join(t.rejected for t in tried)
        log.info("%s: no merged program chosen: %s", group.part.name, why)
        return None
    members = [states[n] for n in group.members]
    separate = _side_by_side(model, members, noise)
    rivals: tuple[Trial, ...] = ()
    if timed and separate is not None:
        head = _head_to_head(ctx, group.part, separate, fused.instantiated)
        trace = sum((m.selection.chosen.candidate.trace for m in members if _keepable(m, noise)), ())
        rival = Trial(
            group.part.name,
            Candidate(group.part.program, trace, (), 0.0),
            instantiated=separate,
            rejected=f"the merged program ran {head.speedup:.2f}x as fast as these side by side",
            backend=backend if separate.has_generated_kernels else PORTABLE,
        )
        if head.speedup * (1 + noise) < 1:  # a tie goes to the merged program: fewer kernels
            log.info(
                "%s: merged program %.2fx against its parts' programs: not merged",
                group.part.name,
                head.speedup,
            )
            return None
        rivals = (rival,)
    searches = [m.search or PartSearch.not_searched() for m in members]
    search = PartSearch(
        (),
        {"merged": list(group.members), **_summed([s.stats for s in searches])},
        sum(s.seconds for s in searches),
        all(s.cached for s in searches),
    )
    ops = tuple(model.graph.node[i].op_type for i in group.part.nodes)
    ctx.taken.update(f.name for f in fused.instantiated.functions)
    return PartState(group.part, ops, search, Selection(fused, (*tried, *rivals), search))


def _head_to_head(ctx: StageContext, part: Part, separate: Instantiated, fused: Instantiated) -> Comparison:
    """``fused`` timed against ``separate`` (two instantiations of ``part``), side by side."""
    pairs = {
        p.name: p
        for p in ctx.part_pairs(
            [dataclasses.replace(part, name=n) for n in ("separate", "fused")],
            {"separate": separate, "fused": fused},
        )
    }
    a, b = pairs["separate"], pairs["fused"]
    return ctx.timer.part(PartPair(part.name, a.rewritten, a.rewritten_feeds, b.rewritten, b.rewritten_feeds))


def _summed(stats: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """The members' search statistics as one: counts added, ``complete`` when every search was,
    ``searched`` when any was, lists (``pieces``) joined."""
    out: dict[str, object] = {
        "complete": all(s.get("complete", True) for s in stats),
        "searched": any(s.get("searched", True) for s in stats),
    }
    for s in stats:
        for k, v in s.items():
            if k in out and isinstance(v, bool):
                continue
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
            elif isinstance(v, (list, tuple)):
                out[k] = [*out.get(k, []), *v]
    return out


def _side_by_side(model: onnx.ModelProto, members: Sequence[PartState], noise: float) -> Instantiated | None:
    """The members as acceptance would keep them, together: the chosen instantiation where it is kept
    (measured at least ``1 + noise`` times faster, or untimed), the original nodes elsewhere (None
    when that is every member)."""
    kept = {m.name: m.emitted for m in members if _keepable(m, noise)}
    if not kept:
        return None
    nodes: list[onnx.NodeProto] = []
    inits, functions, choices, value_info = [], [], [], []
    for m in members:
        inst = kept.get(m.name)
        if inst is None:
            nodes.extend(model.graph.node[i] for i in m.part.nodes)
            continue
        nodes.extend(inst.nodes)
        inits.extend(inst.initializers)
        functions.extend(inst.functions)
        choices.extend(inst.choices)
        value_info.extend(inst.value_info)
    available = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    available |= {t.name for t in inits}
    nodes = toposort(nodes, available)
    return Instantiated(tuple(nodes), tuple(inits), tuple(functions), tuple(choices), (), tuple(value_info))


def _keepable(state: PartState, noise: float) -> bool:
    """Whether acceptance may keep the state's chosen program on its own (see :func:`merge_parts`)."""
    chosen = state.selection.chosen if state.selection is not None else None
    if chosen is None or chosen.instantiated is None:
        return False
    return chosen.measured is None or chosen.measured.speedup >= 1 + noise
