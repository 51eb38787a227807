"""Rediscovery by the search alone: one row per case of ``einopt.examples.rediscover``.

    python scripts/rediscover.py                      # paper sizes, default depths, 120 s per case
    python scripts/rediscover.py --size small --budget 30
    python scripts/rediscover.py --converge-depth 0   # converging derivation off

Each row: whether a candidate has the transformation's operators (found), its
derivation depth, states generated / expanded / pruned, pruned %, seconds,
states per second, and EinNet's published figures beside it. Every found
candidate is checked against the input with the reference interpreter (small
size only: the paper sizes are too large for the interpreter). Run it alone
on the machine (2 cores): it is a timing.
"""

from __future__ import annotations

import json
import os

import click
from rich.console import Console
from rich.table import Table

from einopt.examples.rediscover import CASES
from einopt.rules import check_equivalent
from einopt.search import DEFAULT_CONVERGE_DEPTH, DEFAULT_MAX_DEPTH, search


@click.command()
@click.option("--size", type=click.Choice(["full", "small"]), default="full", show_default=True)
@click.option("--budget", type=float, default=120.0, show_default=True, help="Seconds per case.")
@click.option("--max-depth", type=int, default=DEFAULT_MAX_DEPTH, show_default=True)
@click.option("--converge-depth", type=int, default=DEFAULT_CONVERGE_DEPTH, show_default=True)
@click.option("--case", "only", multiple=True, type=click.Choice(sorted(CASES)), help="Only these cases.")
@click.option("--json", "as_json", type=click.Path(dir_okay=False), help="Also write the rows as JSON.")
def main(size, budget, max_depth, converge_depth, only, as_json) -> None:
    console = Console()
    table = Table(
        title=f"Rediscovery ({size} size, depth {max_depth}/{converge_depth}, {budget:g} s per case)"
    )
    for col in (
        "case",
        "found",
        "depth",
        "generated",
        "expanded",
        "pruned",
        "pruned %",
        "s",
        "states/s",
        "EinNet",
    ):
        table.add_column(col)
    rows = []
    for name, case in CASES.items():
        if only and name not in only:
            continue
        program = case.program(size)
        ctx = case.context(program)
        r = search(
            program,
            ctx=ctx,
            max_depth=max_depth,
            converge_depth=converge_depth,
            time_budget=budget,
            max_candidates=10_000,
        )
        s = r.stats
        hits = [c for c in r.candidates if case.found(c.operators, c.program)]
        best = min(hits, key=lambda c: c.depth, default=None)
        if best is not None and size == "small":
            check_equivalent(program, best.program, ctx)
        paper = case.paper
        einnet = (
            f"{paper.states:,} states / {paper.seconds:g} s, steps {paper.steps}" if paper.states else "-"
        )
        row = {
            "case": name,
            "found": best is not None,
            "depth": best.depth if best else None,
            "operators": list(best.operators) if best else None,
            "trace": [f"{t.rule}: {t.summary}" for t in best.trace] if best else None,
            "generated": s.generated,
            "expanded": s.expanded,
            "pruned": s.pruned,
            "pruned_fraction": round(s.pruned_fraction, 3),
            "seconds": round(s.seconds, 2),
            "complete": s.complete,
            "states_per_second": round(s.generated / s.seconds) if s.seconds else None,
            "load_average": os.getloadavg()[0],
        }
        rows.append(row)
        table.add_row(
            name,
            "yes" if best else "no",
            str(row["depth"] if best else "-"),
            f"{s.generated:,}",
            f"{s.expanded:,}",
            f"{s.pruned:,}",
            f"{s.pruned_fraction:.0%}",
            f"{s.seconds:.1f}" + ("" if s.complete else " (budget)"),
            f"{row['states_per_second']:,}" if row["states_per_second"] else "-",
            einnet,
        )
        console.print(f"{name}: {'found' if best else 'not found'} in {s.seconds:.1f} s")
    console.print(table)
    if as_json:
        with open(as_json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
