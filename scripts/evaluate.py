"""Optimize and benchmark every evaluation model at batch 1 and 16; write results/ and the README table.

    python scripts/evaluate.py                         # every model of einopt.models.MODELS x batch 1, 16
    python scripts/evaluate.py --models dcgan lstm --batch 1 --no-readme
    python scripts/evaluate.py --size small            # the reduced test sizes (quick check)

The model list is the MODELS table (11 models: the 8 of EinNet's evaluation
took about 30 min; MobileNetV2, SqueezeNet 1.1 and ShuffleNetV2 add a few). Each
(model, batch) pair runs as its own ``einopt optimize --bench`` process
(the product's command line, one global ONNX Runtime thread pool, interleaved
medians, equality checked first), so one model's memory and threads never
disturb the next. Per pair, results/NAME_bsN.json is the full report and
results/NAME_bsN.html the HTML report; results/summary.json and
results/results.md collect the table, which replaces the block between the
``results:start`` / ``results:end`` markers in README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- results:start -->", "<!-- results:end -->"


def run_pair(name: str, batch: int, args: argparse.Namespace, build: Path, out: Path) -> dict:
    """Build one model, run ``einopt optimize --bench`` on it, and return its summary row."""
    from einopt.models import write

    stem = f"{name}_bs{batch}" + ("_small" if args.size == "small" else "")
    model = write(name, batch, build, size=args.size, seed=0)
    cmd = [
        *shlex.split(args.einopt),
        "-q",
        "optimize",
        str(model),
        "-o",
        str(build / f"{stem}.einopt.onnx"),
        "--inputs",
        str(model.with_suffix(".npz")),
        "--bench",
        "--budget",
        str(args.budget),
        "--report",
        str(out / f"{stem}.json"),
        "--html",
        str(out / f"{stem}.html"),
        *(["--cache", str(args.cache)] if args.cache else ["--no-cache"]),
        *(["--max-depth", str(args.max_depth)] if args.max_depth is not None else []),
        *(["--jobs", str(args.jobs)] if args.jobs > 1 else []),
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    row = {"model": name, "batch": batch, "file": f"{stem}.json", "wall_s": round(wall, 1)}
    if proc.returncode != 0:
        killed = proc.returncode == -9  # the kernel's OOM killer, in practice
        fallback = "killed (SIGKILL: out of memory)" if killed else f"exit {proc.returncode}"
        row["error"] = (proc.stderr.strip().splitlines() or [fallback])[-1]
        print(f"  {stem}: FAILED: {row['error']}", file=sys.stderr)
        return row
    report = json.loads((out / f"{stem}.json").read_text())
    b = report["bench"]
    row |= {
        "ort_ms": b["original"]["median_ms"],
        "einopt_ms": b["optimized"]["median_ms"],
        "spread_ms": [
            [b["original"]["p10_ms"], b["original"]["p90_ms"]],
            [b["optimized"]["p10_ms"], b["optimized"]["p90_ms"]],
        ],
        "speedup": b["speedup"],
        "kernels": [b["original"]["kernels"], b["optimized"]["kernels"]],
        "optimize_s": round(sum(report["seconds"].values()), 1),
        "search_s": report["seconds"].get("search"),
        "verified": report["verified"] and b["equal"],
        "subprograms": report["counts"].get("subprograms", 0),
        "accepted": report["counts"].get("accepted", 0),
        "rewritten": report["counts"].get("rewritten", 0),
        "rolled_back": report["counts"].get("rolled_back", 0),
        "translated": report["counts"].get("translated", 0),
        "nodes": report["counts"].get("nodes", 0),
        "unreliable": b.get("unreliable", ""),
        "load_average": (b.get("machine") or {}).get("load_average"),
        "cache": (report.get("acceptance") or {}).get("cache"),
        # the fresh whole-model comparison acceptance made last (None: nothing reached it)
        "confirmation": _confirmation(report),
        # subprograms whose nodes in the output came out of the search (a derivation, not depth 0)
        "found": sum(1 for p in report["subprograms"] if p["status"] == "accepted" and p.get("trace")),
        "search": report.get("search"),
        "derivations": {
            p["name"]: p["trace"]
            for p in report["subprograms"]
            if p["status"] == "accepted" and p.get("trace")
        },
    }
    print(
        f"  {stem}: {row['ort_ms']:.3g} -> {row['einopt_ms']:.3g} ms, {row['speedup']:.2f}x, "
        f"kernels {row['kernels'][0]} -> {row['kernels'][1]} ({wall:.0f} s)"
    )
    return row


def _confirmation(report: dict) -> dict | None:
    c = (report.get("acceptance") or {}).get("confirmation")
    if not c:
        return None
    return {"speedup": c["speedup"], "speedup_95": c["speedup_95"], "kept": bool(not c["rolled_back"])}


def _confirmation_text(c: dict | None) -> str:
    if c is None:
        return "-"
    low, high = c["speedup_95"]
    return f"{c['speedup']:.2f}x ({low:.2f}-{high:.2f}){'' if c['kept'] else ', not kept'}"


TARGETS = {
    ("dcgan", 16): 1.15,
    ("infogan", 16): 1.1,
    ("fsrcnn", 1): 1.4,
    ("fsrcnn", 16): 1.4,
    ("lstm", 1): 1.25,
    ("gcn", 1): 1.05,
    ("gcn", 16): 1.05,
    ("longformer", 1): 1.4,
}
"""Issue 14's speedup targets (ORT median / einopt median); every other row: >= 0.99 (never slower)."""
NEVER_SLOWER = 0.99
GEOMEAN_TARGET = 1.2
MINUTES_TARGET = 5.0


def target(r: dict) -> float:
    return TARGETS.get((r["model"], r["batch"]), NEVER_SLOWER)


def geomean(xs: list[float]) -> float | None:
    import math

    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def markdown(rows: list[dict], machine: dict, command: str) -> str:
    """The results table (with its provenance) as Markdown."""
    lines = [
        "| model | batch | ORT ms | einopt ms | speedup | target | confirmation (95%) | kernels before -> after "
        "| rewrites found | subprograms accepted / rewritten / total | rolled back | einopt time (s) | verified |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | | | | | | | | | | | failed: {r['error']} |")
            continue
        flag = " (unreliable)" if r.get("unreliable") else ""
        met = "met" if r["speedup"] >= target(r) else "**missed**"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['ort_ms']:.3g} | {r['einopt_ms']:.3g} | "
            f"{r['speedup']:.2f}x{flag} | >= {target(r):.2f}x {met} | {_confirmation_text(r.get('confirmation'))} | "
            f"{r['kernels'][0]} -> {r['kernels'][1]} | "
            f"{r['found']} / {r['subprograms']} | "
            f"{r['accepted']} / {r['rewritten']} / {r['subprograms']} | {r['rolled_back']} | "
            f"{r['optimize_s']:.1f} | {'yes' if r['verified'] else 'NO'} |"
        )
    g = geomean([r["speedup"] for r in rows if "error" not in r])
    slowest = max((r["optimize_s"] for r in rows if "error" not in r), default=0.0) / 60
    if g is not None:
        lines.append("")
        lines.append(
            f"Geometric mean of the speedups: {g:.2f}x (target >= {GEOMEAN_TARGET}x). "
            f"Longest einopt run: {slowest:.1f} min (target <= {MINUTES_TARGET:g} min)."
        )
    cpu = machine.get("cpu", "?")
    head = (
        f"Measured {datetime.date.today().isoformat()} on {cpu}, {machine.get('threads', '?')} threads, "
        f"ONNX Runtime {machine.get('onnxruntime', '?')}, with `{command}`. "
        "Speedup = ORT median / einopt median (interleaved runs in one process); "
        "0.95-1.05 is within this machine's noise. Confirmation: the fresh whole-model comparison "
        "`einopt optimize` made last before keeping its output (speedup and the 95% interval of the "
        "per-round ratios; '-' when no rewrite reached it). Rewrites found: subprograms whose nodes in the output "
        "came out of a derivation the search found / total translated. Subprograms: accepted (in the "
        "output, measured faster) / rewritten (other nodes than the original, verified) / total "
        "translated; rolled back: accepted on its own but removed by the whole-model check. einopt time = "
        "the whole `einopt optimize` run (prepare, translate, search, select: instantiate, verify and time "
        "the candidates, measured acceptance), without the `--bench` timing."
    )
    return head + "\n\n" + "\n".join(lines) + "\n"


def update_readme(readme: Path, table: str) -> None:
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{readme} has no {START} ... {END} block to replace")
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    readme.write_text(f"{before}{START}\n{table}{END}{after}")


def write_summary(rows: list[dict], command: str, out: Path) -> str:
    """results/summary.json and results/results.md from the rows so far; the table."""
    machine = {}
    for r in rows:
        if "error" not in r:
            machine = json.loads((out / r["file"]).read_text())["bench"]["machine"]
            break
    summary = {
        "date": datetime.date.today().isoformat(),
        "command": command,
        "machine": machine,
        "rows": rows,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = markdown(rows, machine, command)
    (out / "results.md").write_text(table)
    return table


def main() -> None:
    from einopt.models import MODELS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), metavar="NAME")
    ap.add_argument("--batch", type=int, action="append", help="batch sizes (default 1 and 16)")
    ap.add_argument("--size", choices=["full", "small"], default="full")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timed runs per model (default 20)")
    ap.add_argument(
        "--out", type=Path, default=ROOT / "results", help="where the reports go (default results/)"
    )
    ap.add_argument(
        "--build", type=Path, default=ROOT / "build" / "models", help="where the models are written"
    )
    ap.add_argument("--no-readme", action="store_true", help="do not update README.md")
    ap.add_argument(
        "--cache",
        type=Path,
        help="measurement cache to use and fill (default: none, every timing is made afresh)",
    )
    ap.add_argument("--einopt", default=f"{sys.executable} -m einopt", help="how to run einopt")
    ap.add_argument("--max-depth", type=int, help="search depth (default: einopt's, 7)")
    ap.add_argument("--jobs", type=int, default=1, help="search processes per model (default 1)")
    args = ap.parse_args()
    batches = args.batch or [1, 16]
    args.out.mkdir(parents=True, exist_ok=True)
    args.build.mkdir(parents=True, exist_ok=True)
    command = "python scripts/evaluate.py" + (" --size small" if args.size == "small" else "")
    command += f" --jobs {args.jobs}" if args.jobs > 1 else ""
    command += f" --max-depth {args.max_depth}" if args.max_depth is not None else ""
    command += f" --models {' '.join(args.models)}" if args.models != list(MODELS) else ""
    rows = []
    for name in args.models:
        for batch in batches:
            print(f"{name} batch {batch}", flush=True)
            rows.append(run_pair(name, batch, args, args.build, args.out))
            table = write_summary(rows, command, args.out)  # after every pair: a stopped run keeps its table
    print(table)
    if (
        not args.no_readme
        and args.size == "full"
        and set(batches) == {1, 16}
        and len(rows) == 2 * len(MODELS)
    ):
        update_readme(ROOT / "README.md", table)
        print("README.md updated")
    sys.exit(1 if any("error" in r for r in rows) else 0)


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
