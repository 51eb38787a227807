"""``einopt search``: the search (:mod:`einopt.search`) on one expression from the command line.

The ranked candidates are printed as a table (``--trace`` adds how each was
derived) or as one JSON object (``--json``); ``--onnx`` writes the best one as
a model, once ONNX Runtime has computed the same as the reference interpreter.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

import einopt
from einopt.cli.app import CliError, console, handle_errors, is_quiet, main
from einopt.cli.options import check_writable
from einopt.cli.source import load_node, make_inputs, with_source

if TYPE_CHECKING:
    from einopt.core.ir import Program
    from einopt.search import Budget, Candidate, SearchResult, Stats

# The search's parameters by the flags that set them, for its error messages.
_FLAGS = {
    "max_depth": "--max-depth",
    "converge_depth": "--converge-depth",
    "states_per_search": "--max-states",
    "deadline_s": "--time-budget",
    "jobs": "--jobs",
}


@main.command(name="search")
@with_source
@click.option(
    "--max-depth",
    type=int,
    help="Explorative derivation steps [default: einopt.search.DEFAULT_MAX_DEPTH, 7].",
)
@click.option(
    "--converge-depth",
    type=int,
    help="Converging steps per explored state, 0 for none [default: einopt.search.DEFAULT_CONVERGE_DEPTH, 6].",
)
@click.option(
    "--max-states",
    type=int,
    metavar="N",
    help="Stop at exactly N generated states with the candidates found so far "
    "(the same ones on any machine, with any --jobs) [default: no limit].",
)
@click.option(
    "--time-budget",
    type=float,
    metavar="SECONDS",
    help="A wall-clock safety net: stop after this many seconds with the candidates found so far "
    "(what they are then depends on the machine) [default: none].",
)
@click.option("--jobs", type=int, default=1, show_default=True, help="Worker processes.")
@click.option("--top", type=int, default=5, show_default=True, help="Candidates to show.")
@click.option(
    "--trace",
    is_flag=True,
    help="Show each candidate's derivation steps and the program after each (--json: a `program` per step).",
)
@click.option(
    "--onnx",
    "onnx_path",
    type=click.Path(dir_okay=False),
    metavar="OUT.onnx",
    help="Write the best candidate as an ONNX model (checked in ONNX Runtime first).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout and nothing else.")
@click.option(
    "--explain-schedule", is_flag=True, help="Print the search schedule (rules per phase) and exit."
)
@handle_errors
def search_command(
    source,
    expr,
    example,
    shapes,
    max_depth,
    converge_depth,
    max_states,
    time_budget,
    jobs,
    top,
    trace,
    onnx_path,
    as_json,
    explain_schedule,
) -> None:
    """Search for faster programs equal to an expression and rank them by estimated cost.

    The input itself is always among the candidates (depth 0).
    """
    if explain_schedule:
        # ONNX: loaded when the command runs, so that `einopt --help` stays fast
        from einopt.search import explain

        click.echo(explain())
        return
    if top < 1:
        raise CliError(f"--top must be at least 1, got {top}", "usage")
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.instantiate.program import as_program

    program = as_program(load_node(source, expr, example, shapes))
    check_writable(onnx_path)
    budget = _budget(max_depth, max_states, time_budget)
    limits = {"converge_depth": converge_depth} if converge_depth is not None else {}
    show = not (as_json or is_quiet())
    result = _run(program, dict(limits, budget=budget, jobs=jobs, max_candidates=top + 1), show)
    shown = result.candidates[:top]
    if onnx_path:
        _write_best(program, result, onnx_path)
    if as_json:
        click.echo(json.dumps(_as_json(shown, result.stats, trace)))
    elif show:
        _print(shown, result, trace, onnx_path)


def _run(program: Program, kwargs: dict[str, Any], live: bool) -> SearchResult:
    """The search, with a progress line while it runs when stdout is a terminal (and ``live``)."""
    out = console()
    if not (live and out.is_terminal):
        return _search(program, kwargs, None)
    start = time.perf_counter()
    budget = kwargs["budget"]
    of = f"/{budget.states_per_search}" if budget.states_per_search is not None else ""
    with out.status("searching ...") as status:

        def progress(stats: Stats, depth: int, best: Candidate | None) -> None:
            rate = stats.generated / max(time.perf_counter() - start, 1e-9)
            status.update(
                f"searching: depth {depth}/{budget.max_depth}, {stats.generated}{of} states ({rate:.0f}/s), "
                f"best {_seconds(best.cost) if best else '-'}"
            )

        return _search(program, kwargs, progress)


def _budget(max_depth: int | None, max_states: int | None, time_budget: float | None) -> Budget:
    """The search's :class:`einopt.search.Budget` from the flags (bad ones as usage errors)."""
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.search import DEFAULT_MAX_DEPTH, Budget, SearchError

    depth = DEFAULT_MAX_DEPTH if max_depth is None else max_depth
    try:
        return Budget(max_depth=depth, states_per_search=max_states, deadline_s=time_budget)
    except SearchError as e:
        raise _usage(e) from None


def _search(program: Program, kwargs: dict[str, Any], progress) -> SearchResult:
    """:func:`einopt.search.search`, its refusals of bad limits as usage errors naming the flags."""
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.search import SearchError, search

    try:
        return search(program, progress=progress, **kwargs)
    except SearchError as e:
        raise _usage(e) from None


def _usage(e: Exception) -> CliError:
    message = str(e)
    for name, flag in _FLAGS.items():
        message = message.replace(name, flag)
    return CliError(message, "usage")


def _write_best(program: Program, result: SearchResult, path: str) -> None:
    """Write the best candidate's model to ``path`` once ONNX Runtime computes what the interpreter does."""
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.runtime.modelio import run, save_model
    from einopt.runtime.verify import compare

    if not result.candidates:
        raise CliError("no candidate could be instantiated as ONNX operators; nothing written", "unsupported")
    best = result.best
    model = einopt.to_onnx(best)
    inputs = make_inputs(program, None, 0, integer=False)
    got = run(model, {t.name: inputs[t.name] for t in best.program.inputs})
    want = einopt.evaluate(program, inputs)
    same = compare({k: v.astype("float32") for k, v in want.items()}, got)
    if not same.ok:
        raise CliError(
            f"the best candidate's model differs from the interpreter ({same.message}); nothing written",
            "mismatch",
        )
    save_model(model, path)


def _as_json(candidates: tuple[Candidate, ...], stats: Stats, with_programs: bool) -> dict:
    def step(s) -> dict:
        out = {"rule": s.rule, "where": s.where, "summary": s.summary, "phase": s.phase}
        if with_programs:
            out["program"] = str(s.program)
        return out

    return {
        "candidates": [
            {
                "rank": rank,
                "program": c.text(),
                "operators": list(c.operators),
                "cost": c.cost,
                "depth": c.depth,
                "flops": c.flops,
                "key": c.key,
                "trace": [step(s) for s in c.trace],
            }
            for rank, c in enumerate(candidates)
        ],
        "stats": stats.as_dict(),
    }


def _print(
    candidates: tuple[Candidate, ...], result: SearchResult, trace: bool, onnx_path: str | None
) -> None:
    from rich.markup import escape
    from rich.table import Table

    out = console(min_width=120)
    baseline = next((c.cost for c in result.candidates if not c.trace), None)
    costed = result.stats.candidates_costed
    shown = f"{len(candidates)} candidate{'s' if len(candidates) != 1 else ''}"
    table = Table(title=f"einopt search: the best {shown} ({costed} programs costed)")
    for column, justify in (("#", "right"), ("cost", "right"), ("vs input", "right"), ("depth", "right")):
        table.add_column(column, justify=justify)
    table.add_column("operators", overflow="fold")
    table.add_column("program", overflow="fold")
    for rank, c in enumerate(candidates):
        ratio = f"{baseline / c.cost:.2f}x" if baseline and c.cost > 0 else "-"
        table.add_row(
            str(rank),
            _seconds(c.cost),
            ratio,
            str(c.depth),
            escape(" ".join(c.operators)),
            escape(c.text().splitlines()[0]),
        )
    out.print(table)
    if trace:
        for rank, c in enumerate(candidates):
            click.echo(f"\n#{rank}: {_seconds(c.cost)}, depth {c.depth}, {' '.join(c.operators)}")
            if not c.trace:
                click.echo("  the input")
            for k, s in enumerate(c.trace, 1):
                click.echo(f"  {k}. {s.rule} at {s.where}: {s.summary} ({s.phase})")
                click.echo("".join(f"       {line}\n" for line in str(s.program).splitlines()), nl=False)
    st = result.stats
    click.echo(
        f"{st.generated} states generated, {st.pruned} pruned ({st.pruned_fingerprint} seen before, "
        f"{st.pruned_cost} by cost), {st.expanded} expanded in {st.seconds:.2f} s"
    )
    if st.stopped in _STOPPED:
        click.echo(f"{_STOPPED[st.stopped]}: these are the candidates found so far")
    if onnx_path:
        click.echo(f"wrote the best candidate to {onnx_path} (checked in ONNX Runtime)")


# What cut a search short, by Stats.stopped.
_STOPPED = {
    "states": "the search stopped at its --max-states",
    "deadline": "the --time-budget ran out (the candidates depend on the machine)",
}


def _seconds(s: float) -> str:
    """A duration with a unit that keeps it readable (``52.9 µs``)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"
