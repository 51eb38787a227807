"""The search's speed on real programs: every subprogram search of shared models, states per second.

Each model is prepared and translated as ``einopt optimize`` does, and its distinct subprograms are
searched at ``--states`` states each (no cache); one row per search: its input's operators, states
generated, seconds, states per second, whether it completed, and its best derived candidate's
operators (by the search's analytic cost)::

    python scripts/bench_search.py [--models bert_tiny,gpt2_tiny_dynamo,...] [--states 10000] [--json OUT]

The paper's expressions have their own benchmark (``scripts/rediscover.py``). Run it alone on the
machine: it is a timing (the states and candidates do not depend on the machine; the seconds do).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.runtime import modelio
from einopt.runtime.cache import MeasurementCache
from einopt.runtime.timing import load_average
from einopt.search.budget import Budget
from einopt.stages.partsearch import Settings, search_parts

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "models"
MODELS = ("bert_tiny", "gpt2_tiny_dynamo", "vit_tiny_dynamo", "lstm_linear_cell", "lstm_linear_cell_dynamo")


def rows(name: str, states: int) -> list[dict]:
    """One row per distinct subprogram search of shared model ``name``."""
    model = prepare(modelio.load_model(SHARED / f"{name}.onnx"), {}, fold=True).model
    parts = {p.name: p for p in translate_graph(model, fuse_activations=False)}
    budget = Budget(states_per_search=states, states_per_model=100 * states)
    searches = search_parts(list(parts.values()), Settings(budget=budget), MeasurementCache(None))
    out = []
    for part, s in searches.items():
        if s.same_as or not s.candidates:
            continue
        best = next((c for c in s.candidates if c.trace), None)  # the best derived one
        generated = int(s.stats.get("generated", 0) or 0)
        out.append(
            {
                "model": name,
                "part": part,
                "input": " ".join(s.input.operators) if s.input else "",
                "states": generated,
                "seconds": round(s.seconds, 3),
                "states_per_s": round(generated / s.seconds, 1) if s.seconds else None,
                "complete": bool(s.stats.get("complete")),
                "best": " ".join(best.operators) if best else "",
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated shared model names")
    ap.add_argument("--states", type=int, default=10_000, help="states per search (the default budget's)")
    ap.add_argument("--json", type=Path, help="write the rows here (JSON lines, as each model finishes)")
    args = ap.parse_args()
    console = Console(stderr=True, width=170)
    console.print(f"load average {load_average()}; {args.states} states per search")
    table = Table("model", "search", "input", "states", "s", "states/s", "complete", "best derived candidate")
    total_states = total_s = 0.0
    for name in args.models.split(","):
        t = time.perf_counter()
        found = rows(name, args.states)
        wall = time.perf_counter() - t
        for r in found:
            table.add_row(
                r["model"],
                r["part"][:40],
                r["input"][:30],
                str(r["states"]),
                f"{r['seconds']:.1f}",
                f"{r['states_per_s']:.0f}" if r["states_per_s"] else "-",
                "yes" if r["complete"] else "cut short",
                r["best"][:40] or "-",
            )
            total_states += r["states"]
            total_s += r["seconds"]
        console.print(f"{name}: {wall:.1f} s in all")
        if args.json:
            with args.json.open("a") as f:
                for r in found:
                    f.write(json.dumps(r) + "\n")
    console.print(table)
    rate = total_states / total_s if total_s else 0.0
    console.print(f"all searches: {total_states:.0f} states in {total_s:.1f} s, {rate:.0f} states/s")
    console.print(f"load average after: {load_average()}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
