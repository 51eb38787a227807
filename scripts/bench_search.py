"""The search's speed on real programs: every subprogram search of shared models, states per second.

Each model is prepared and translated as ``einopt optimize`` does, and its distinct subprograms are
searched at ``--states`` states each (no cache); one row per search: its input's operators, states
generated, seconds, states per second, whether it completed, and its best derived candidate's
operators (by the search's analytic cost)::

    python scripts/bench_search.py [--models bert_tiny,gpt2_tiny_dynamo,...] [--states 10000] [--json OUT]

``--against REV`` compares this checkout with commit ``REV`` instead, interleaved: each model's
searches run in a fresh process with one code, then the other, ``--pairs`` times, and the table gives
both rates and their ratio, and whether both found the same candidates (their keys and costs, in
order). A shared machine's speed drifts by 10% or more within an hour: speed work is judged so, never
against a number measured earlier::

    python scripts/bench_search.py --against c8f73a0 --models bert_tiny,lstm_linear_cell --states 1500

The paper's expressions have their own benchmark (``scripts/rediscover.py``). Run it alone on the
machine: it is a timing (the states and candidates do not depend on the machine; the seconds do).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
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


def _searches(name: str, states: int) -> tuple[dict, float]:
    """Every distinct subprogram search of shared model ``name`` at ``states`` states (no cache), as
    ``einopt optimize`` translates it, and the seconds they took."""
    model = prepare(modelio.load_model(SHARED / f"{name}.onnx"), {}, fold=True).model
    parts = translate_graph(model, fuse_activations=False)
    budget = Budget(states_per_search=states, states_per_model=100 * states)
    t = time.perf_counter()
    searches = search_parts(parts, Settings(budget=budget), MeasurementCache(None))
    return searches, time.perf_counter() - t


def rows(name: str, states: int) -> list[dict]:
    """One row per distinct subprogram search of shared model ``name``."""
    searches, _ = _searches(name, states)
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


def digest(name: str, states: int) -> dict:
    """Every search of ``name`` at ``states`` states: the states generated, the seconds, and a digest
    of every search's candidates (keys and costs, in order)."""
    searches, seconds = _searches(name, states)
    found = {p: [(c.key, round(c.cost, 12)) for c in s.candidates] for p, s in sorted(searches.items())}
    generated = sum(int(s.stats.get("generated", 0) or 0) for s in searches.values() if not s.same_as)
    text = json.dumps(found, sort_keys=True).encode()
    code = str(Path(sys.modules["einopt.search.engine"].__file__).resolve().parent.parent)
    return {
        "states": generated,
        "seconds": seconds,
        "candidates": hashlib.sha256(text).hexdigest()[:16],
        "code": code,
    }


def _worktree(rev: str) -> Path:
    """A checkout of ``rev`` in a temporary folder, importable as ``einopt`` (with ``rules/`` and
    ``search/`` linked in as ``einopt.rules`` and ``einopt.search``, as the package maps them)."""
    root = Path(__file__).resolve().parent.parent
    where = Path(tempfile.mkdtemp(prefix="einopt-ab-")) / "tree"
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "-q", str(where), rev], check=True)
    for sub in ("rules", "search"):
        (where / "einopt" / sub).symlink_to(where / sub)
    return where


def _one(name: str, states: int, tree: Path | None) -> dict:
    """:func:`digest` in a fresh process, with the code of ``tree`` (None: this checkout)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    done = subprocess.run(
        [sys.executable, __file__, "--digest", name, "--states", str(states)],
        env=env,
        cwd=tempfile.gettempdir(),  # not this checkout: its einopt/ would shadow the other code's
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    want = str((tree or Path(__file__).parent.parent).resolve())
    if found["code"] != want:
        raise SystemExit(f"the search ran the code in {found['code']}, not {want}")
    return found


def against(rev: str, models: list[str], states: int, pairs: int, console: Console) -> None:
    """This checkout against commit ``rev``, interleaved (see the module docstring)."""
    root = Path(__file__).resolve().parent.parent
    tree = _worktree(rev)
    table = Table("model", "pair", f"{rev} states/s", "this states/s", "ratio", "same candidates")
    try:
        for pair in range(1, pairs + 1):
            for name in models:
                old, new = _one(name, states, tree), _one(name, states, None)
                rates = [r["states"] / r["seconds"] for r in (old, new)]
                same = (
                    "yes"
                    if old["candidates"] == new["candidates"] and old["states"] == new["states"]
                    else "NO"
                )
                table.add_row(
                    name, str(pair), f"{rates[0]:.0f}", f"{rates[1]:.0f}", f"{rates[1] / rates[0]:.2f}x", same
                )
                console.print(f"{name} pair {pair}: {rates[0]:.0f} -> {rates[1]:.0f} states/s, same: {same}")
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(tree.parent, ignore_errors=True)
    console.print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated shared model names")
    ap.add_argument("--states", type=int, default=10_000, help="states per search (the default budget's)")
    ap.add_argument("--json", type=Path, help="write the rows here (JSON lines, as each model finishes)")
    ap.add_argument("--against", metavar="REV", help="compare with commit REV, interleaved")
    ap.add_argument("--pairs", type=int, default=2, help="with --against: runs of each code per model")
    ap.add_argument("--digest", metavar="MODEL", help=argparse.SUPPRESS)  # one process of --against
    args = ap.parse_args()
    if args.digest:
        print(json.dumps(digest(args.digest, args.states)))
        return
    console = Console(stderr=True, width=170)
    console.print(f"load average {load_average()}; {args.states} states per search")
    if args.against:
        against(args.against, args.models.split(","), args.states, args.pairs, console)
        console.print(f"load average after: {load_average()}")
        return
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
