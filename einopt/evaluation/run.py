"""Optimize and benchmark the evaluation models and the shared exporter models; write results/ and the tables.

Run in the checkout (``einopt evaluate`` or ``python scripts/evaluate.py``, the same options; paths
are relative to the working directory, which the script makes the checkout's)::

    python scripts/evaluate.py                         # every generator x batch 1, 16, then every shared model
    python scripts/evaluate.py --models dcgan lstm --batch 1 --no-readme
    python scripts/evaluate.py --models shared         # only the shared exporter models (``generated``: only the generators)
    python scripts/evaluate.py --models bert_tiny lstm # names from either section
    python scripts/evaluate.py --size small            # the generators at the reduced test sizes (quick check)
    python scripts/evaluate.py --resume                # continue a stopped run (same code and command)
    python scripts/evaluate.py --render                # rewrite the tables from results/summary.json, measuring nothing
    python scripts/evaluate.py --kernels tvm           # every row with generated kernels, beside the onnx run in results/
    python scripts/evaluate.py --models espcn_x3 --max-states 100 --model-states 300 --budget 1 --no-readme

Generated models: the MODELS table of ``einopt.models`` (the 8 of EinNet's
evaluation took about 30 min; MobileNetV2, SqueezeNet 1.1, ShuffleNetV2 and
the transformer generators add to it), at each batch of ``--batch`` (default
1 and 16).

Shared models: the real ``torch.onnx`` exports in ``--shared DIR`` (default
``../shared/models``: ``NAME.onnx``, ``NAME.npz`` holding the inputs ``x0..``
and PyTorch's outputs ``y0..``, and ``index.json`` naming the exporter and
input shapes). Their inputs are fixed, so each is one row, without a batch.
Their rows also check einopt's output against PyTorch's outputs in ONNX
Runtime (at the verification tolerance of ``einopt.runtime.verify``), list
what passes through einopt untranslated and why, and carry their targets
(``targets.json``). Without the folder the section is skipped with a message.
``--models`` takes names of either section, or ``generated`` / ``shared`` for
a whole section.

Each row runs as its own ``einopt optimize --bench`` process (the product's
command line, one global ONNX Runtime thread pool, interleaved medians,
equality checked first), so one model's memory and threads never disturb the
next. Per row, results/STEM.json is the full report and results/STEM.html the
HTML report (STEM: ``NAME_bsN`` for a generated model, ``NAME`` for a shared
one); results/summary.json and results/results.md collect the tables, which
replace the block between the ``results:start`` / ``results:end`` markers in
README.md and the ``shared-results:start`` / ``shared-results:end`` markers in
docs/results.md when a section ran whole (the HTML reports are not kept in git:
the JSON reports hold what they show).

A run that does not fit in one sitting (the whole table takes 2.5 hours or
more on a 2-core machine) is continued with ``--resume``: the finished rows of
the run in ``--out`` are kept and the rest measured, only when that run's
command and code are this one's (``summary.json`` records a fingerprint of the
installed einopt package, this evaluation included, and the runtimes' versions); each row
records when and in which sitting it was measured, and the tables say over how
many sittings. A row is never measured twice in one run.

A row whose output is byte-identical to its input (einopt kept nothing) counts
as 1.00x in the targets and the geometric mean: timing a file against itself
measures only the machine's noise, which the cell shows beside it ("1.00x
(output = input; read 0.93x)"). ``--render`` writes the tables of the run in
``--out`` again without measuring (after a change in how they are shown).

OpenVINO column: OpenVINO's speedup over ONNX Runtime on the same input model
(ORT median / OpenVINO median, interleaved in one process after the einopt
run, in a fresh process of its own; ORT set up as einopt times it, OpenVINO
with as many inference threads, one stream, the latency hint and float32
precision, so that it does not switch to bf16 where the CPU has it). Where
OpenVINO's outputs differ from ORT's beyond the tolerance the cell says so.
OpenVINO is a benchmark-only extra (``pip install -e .[bench]`` or ``pip
install openvino``), never a dependency of einopt: without it the column reads
"n/a (pip install openvino)". ``--no-openvino`` leaves the column out of the
measurement. Both runtimes keep their threads spinning for a while after a
run, so on a machine with few cores each disturbs the other's next run a
little; the rounds alternate which runs first.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import json
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from einopt.backends import BACKENDS
from einopt.evaluation.checks import SideJob, openvino_text, run_side, split_reference
from einopt.evaluation.tables import (
    KERNELS_END,
    KERNELS_START,
    README,
    SHARED_END,
    SHARED_START,
    TABLES,
    kernels_markdown,
    markdown,
    replace_block,
    row_key,
    shared_markdown,
    shared_target,
    speedup_text,
)
from einopt.instantiate.backend import PORTABLE
from einopt.models import MODELS

SECTIONS = ("generated", "shared")
"""Words ``--models`` takes for a whole section."""


# ----------------------------------------------------------------------------- running einopt


def einopt_command(model: Path, inputs: Path, stem: str, args: argparse.Namespace) -> list[str]:
    """The ``einopt optimize --bench`` command line of one row (reports into ``args.out``)."""
    return [
        *shlex.split(args.einopt),
        "-q",
        "optimize",
        str(model),
        "-o",
        str(args.build / f"{stem}.einopt.onnx"),
        "--inputs",
        str(inputs),
        "--bench",
        "--budget",
        str(args.budget),
        "--report",
        str(args.out / f"{stem}.json"),
        "--html",
        str(args.out / f"{stem}.html"),
        *(["--cache", str(args.cache)] if args.cache else ["--no-cache"]),
        *(["--max-depth", str(args.max_depth)] if args.max_depth is not None else []),
        *(["--max-states", str(args.max_states)] if args.max_states is not None else []),
        *(["--model-states", str(args.model_states)] if args.model_states is not None else []),
        *(["--jobs", str(args.jobs)] if args.jobs > 1 else []),
        *(["--kernels", args.kernels] if args.kernels != PORTABLE.name else []),
    ]


def run_einopt(cmd: list[str], stem: str, out: Path) -> tuple[dict | None, dict]:
    """Run one ``einopt optimize`` command: its report (None when it failed) and the row's start."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    row: dict = {"file": f"{stem}.json", "wall_s": round(wall, 1)}
    if proc.returncode != 0:
        killed = proc.returncode == -9  # the kernel's OOM killer, in practice
        fallback = "killed (SIGKILL: out of memory)" if killed else f"exit {proc.returncode}"
        row["error"] = (proc.stderr.strip().splitlines() or [fallback])[-1]
        print(f"  {stem}: FAILED: {row['error']}", file=sys.stderr)
        return None, row
    return json.loads((out / f"{stem}.json").read_text()), row


DENSE_OPS = frozenset(
    {"Conv", "ConvTranspose", "FusedConv", "NhwcFusedConv", "Gemm", "FusedGemm", "MatMul", "FusedMatMul"}
)
"""The operators whose work is FLOPs (convolutions and products; ``Conv`` includes ONNX Runtime's
NCHWc Conv), as named in a bench report's ``time_by_op``."""


def dense_bound(side: Mapping) -> float | None:
    """The speedup of a model whose every node but its dense ones (``DENSE_OPS``) took no time: the
    profiled time of a bench report's ``side`` (its ``original``) over the part its dense nodes take
    (None without dense nodes or a profile).

    An upper bound for any rewrite that keeps the dense nodes' work and their speed, as one where
    ONNX Runtime's GEMMs run at the machine's FLOP rate already: the transformers (whose attention
    computes every score) and the rows whose convolutions are left as they are. Not a bound on
    rewrites that remove FLOPs (phase convolutions, band products), and on models of tens of
    microseconds the profiler's own cost per node inflates the other nodes' share."""
    time_by_op = side.get("time_by_op") or {}
    dense = sum(t for op, t in time_by_op.items() if op in DENSE_OPS)
    total = sum(time_by_op.values())
    return total / dense if dense > 0 else None


def report_fields(report: dict) -> dict:
    """A row's columns from an ``einopt optimize --bench`` report."""
    b = report["bench"]
    return {
        "dense_bound": dense_bound(b["original"]),
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
        "threads": (b.get("machine") or {}).get("threads"),
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


def run_pair(name: str, batch: int, args: argparse.Namespace) -> dict:
    """Build one generated model, run ``einopt optimize --bench`` on it, and return its summary row."""
    from einopt.models import write

    stem = _stem(name, batch, args)
    model = write(name, batch, args.build, size=args.size, seed=0)
    feeds = model.with_suffix(".npz")
    report, row = run_einopt(einopt_command(model, feeds, stem, args), stem, args.out)
    row = {"model": name, "batch": batch} | row
    if report is None:
        return row
    row |= report_fields(report)
    row["identical"] = same_file(model, args.build / f"{stem}.einopt.onnx")
    if not args.no_openvino:  # nothing else to check beside a generated model
        side = run_side(SideJob(model, feeds, row["threads"], args.budget, True))
        row["openvino"] = _side_openvino(side)
    print(
        f"  {stem}: {row['ort_ms']:.3g} -> {row['einopt_ms']:.3g} ms, {speedup_text(row)}, "
        f"kernels {row['kernels'][0]} -> {row['kernels'][1]}, OpenVINO {openvino_text(row.get('openvino'))} "
        f"({row['wall_s']:.0f} s)"
    )
    return row


def run_shared(name: str, entry: Mapping, args: argparse.Namespace) -> dict:
    """Run ``einopt optimize --bench`` on one shared model; compare its output with PyTorch's; its row."""
    source, reference = args.shared / f"{name}.onnx", args.shared / f"{name}.npz"
    feeds_path = args.build / f"{name}.inputs.npz"
    first = {"model": name, "exporter": entry.get("exporter", "?")}
    try:
        with np.load(reference, allow_pickle=False) as npz:
            feeds, _ = split_reference(dict(npz), reference)
    except (OSError, ValueError) as e:
        print(f"  {name}: FAILED: {e}", file=sys.stderr)
        return first | {"error": f"cannot read {reference.name}: {e}"}
    np.savez(feeds_path, **feeds)  # einopt takes model inputs only, not PyTorch's outputs beside them
    report, row = run_einopt(einopt_command(source, feeds_path, name, args), name, args.out)
    row = first | row
    if report is None:
        return row
    row |= report_fields(report)
    row["passed_through"] = passthrough(report)
    output = args.build / f"{name}.einopt.onnx"
    row["identical"] = same_file(source, output)
    job = SideJob(source, feeds_path, row["threads"], args.budget, not args.no_openvino, reference, output)
    side = run_side(job)
    row["openvino"] = _side_openvino(side)
    row["pytorch"] = side.get("pytorch") or {"output": {"ok": False, "message": side.get("error", "")}}
    row["ort_equal"] = row["verified"]
    row["verified"] = row["verified"] and row["pytorch"]["output"]["ok"]
    print(
        f"  {name}: {row['ort_ms']:.3g} -> {row['einopt_ms']:.3g} ms, {speedup_text(row)} "
        f"(target {shared_target(name):.2f}x), passed through {row['passed_through']['nodes']}, "
        f"PyTorch {'equal' if row['pytorch']['output']['ok'] else 'DIFFERS'}, "
        f"OpenVINO {openvino_text(row['openvino'])} ({row['wall_s']:.0f} s)"
    )
    return row


def same_file(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes (einopt wrote its input back: nothing was kept)."""
    return (
        a.is_file()
        and b.is_file()
        and a.stat().st_size == b.stat().st_size
        and a.read_bytes() == b.read_bytes()
    )


def _stem(name: str, batch: int, args: argparse.Namespace) -> str:
    """A generated row's file stem (reports, einopt's output)."""
    return f"{name}_bs{batch}" + ("_small" if args.size == "small" else "")


def row_files(row: Mapping, args: argparse.Namespace) -> tuple[Path, Path]:
    """A row's input model and einopt's output, where a run of ``args`` writes them."""
    if "batch" in row:
        name, batch = row["model"], row["batch"]
        # einopt.models.write names the model NAME_bsN at either size
        return args.build / f"{name}_bs{batch}.onnx", args.build / f"{_stem(name, batch, args)}.einopt.onnx"
    return args.shared / f"{row['model']}.onnx", args.build / f"{row['model']}.einopt.onnx"


def _side_openvino(side: Mapping) -> dict | None:
    """The OpenVINO result of a side process, or why there is none when the process failed."""
    if "error" in side:
        return {"speedup": None, "note": f"failed: {side['error']}"}
    return side.get("openvino")


def passthrough(report: Mapping) -> dict:
    """Nodes einopt left untranslated (``counts.passed_through``) and how many for each reason."""
    reasons: Counter[str] = Counter()
    for p in report.get("subprograms") or []:
        if p.get("kind") == "passthrough":
            reasons[p.get("reason") or "no reason given"] += len(p.get("ops") or ()) or 1
    nodes = (report.get("counts") or {}).get("passed_through", sum(reasons.values()))
    return {"nodes": nodes, "reasons": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))}


# ----------------------------------------------------------------------------- shared models


def read_index(folder: Path) -> dict[str, dict] | None:
    """The shared models' ``index.json`` (name -> exporter, inputs); None when ``folder`` does not exist.

    Raises
    ------
    SystemExit
        The folder exists but its index is missing or unreadable, or a model's files are missing.
    """
    if not folder.is_dir():
        return None
    path = folder / "index.json"
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: cannot read the shared models' index ({e})") from None
    if not isinstance(index, dict) or not all(isinstance(v, dict) for v in index.values()):
        raise SystemExit(f"{path}: expected an object of model name -> {{exporter, inputs}}")
    missing = [
        f"{n}{ext}" for n in index for ext in (".onnx", ".npz") if not (folder / f"{n}{ext}").is_file()
    ]
    if missing:
        raise SystemExit(f"{folder}: files named in index.json are missing: {', '.join(missing)}")
    return index


def select(
    names: Sequence[str] | None, generated: Sequence[str], shared: Sequence[str] | None, folder: Path
) -> tuple[list[str], list[str]]:
    """The generated and the shared models ``--models`` asks for (all of both without it).

    ``shared`` is None when the shared folder is absent: then asking for a shared
    model is an error, and the default selection skips the section.

    Raises
    ------
    ValueError
        A name that is neither a model of either section nor a section's name.
    """
    if names is None:
        return list(generated), list(shared or [])
    known_shared = list(shared or [])
    unknown = [n for n in names if n not in generated and n not in known_shared and n not in SECTIONS]
    if shared is None and (unknown or "shared" in names):
        raise ValueError(
            f"the shared models folder {folder} is absent (--shared DIR): cannot run "
            f"{', '.join(unknown or ['shared'])}"
        )
    if unknown:
        raise ValueError(
            f"unknown model {', '.join(unknown)}; choose from the generated models ({', '.join(generated)}), "
            f"the shared models ({', '.join(known_shared)}), or {' / '.join(SECTIONS)} for a whole section"
        )
    pick_g = [n for n in generated if "generated" in names or n in names]
    pick_s = [n for n in known_shared if "shared" in names or n in names]
    return pick_g, pick_s


# ----------------------------------------------------------------------------- targets and tables


def _confirmation(report: dict) -> dict | None:
    c = (report.get("acceptance") or {}).get("confirmation")
    if not c:
        return None
    return {"speedup": c["speedup"], "speedup_95": c["speedup_95"], "kept": bool(not c["rolled_back"])}


def run_machine(rows: Sequence[dict], out: Path) -> dict:
    """The machine the run's first finished row was measured on (from its report in ``out``)."""
    return next(
        (json.loads((out / r["file"]).read_text())["bench"]["machine"] for r in rows if "error" not in r), {}
    )


def write_summary(
    rows: list[dict],
    shared_rows: list[dict],
    command: str,
    out: Path,
    code: str = "",
    date: str | None = None,
) -> tuple[str, str]:
    """results/summary.json and results/results.md from the rows so far (``date``: today's unless
    given); the two tables."""
    machine = run_machine([*rows, *shared_rows], out)
    summary = {
        "date": date or datetime.date.today().isoformat(),
        "command": command,
        "code": code,
        "machine": machine,
        "rows": rows,
        "shared_rows": shared_rows,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = markdown(rows, machine, command) if rows else ""
    shared = shared_markdown(shared_rows, machine, command) if shared_rows else ""
    parts = [table, "## Shared exporter models\n\n" + shared if shared else ""]
    (out / "results.md").write_text("\n".join(p for p in parts if p))
    return table, shared


# ----------------------------------------------------------------------------- resuming a run


def code_fingerprint() -> str:
    """What the rows depend on besides the machine: the installed einopt package's source (the
    package ``python -P -m einopt`` runs, this evaluation included) and the runtimes' versions."""
    import importlib.metadata
    import importlib.util

    h = hashlib.sha256()
    (package,) = importlib.util.find_spec("einopt").submodule_search_locations
    files = sorted(Path(package).rglob("*.py"), key=lambda f: f.relative_to(package).as_posix())
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    for dist in ("onnx", "onnxruntime", "numpy", "openvino"):
        try:
            h.update(f"{dist}={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{dist}=absent".encode())
    return h.hexdigest()[:16]


def resumable(out: Path, command: str, code: str) -> dict[tuple[str, int | None], dict]:
    """The finished rows of the run in ``out`` to keep, by :func:`row_key`.

    Raises ValueError when that run's command or code differ from this one's (its rows would mix
    two versions of the code, or two different runs, in one table).
    """
    path = out / "summary.json"
    if not path.exists():
        return {}
    try:
        prev = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from e
    if prev.get("command") != command:
        raise ValueError(
            f"{path} is from another command ({prev.get('command')!r}); run it again, or start afresh "
            "without --resume"
        )
    if prev.get("code") != code:
        raise ValueError(
            f"{path} was measured with other code (einopt, this script or a runtime changed since "
            "its rows were measured): start afresh without --resume"
        )
    rows = [*prev.get("rows", []), *prev.get("shared_rows", [])]
    return {row_key(r): r for r in rows if "error" not in r}


# ----------------------------------------------------------------------------- command line


def _command(args: argparse.Namespace, generated: list[str], shared: list[str], everything: bool) -> str:
    """The command line as the tables quote it (only what changes the results)."""
    command = "python scripts/evaluate.py" + (" --size small" if args.size == "small" else "")
    command += f" --jobs {args.jobs}" if args.jobs > 1 else ""
    command += f" --max-depth {args.max_depth}" if args.max_depth is not None else ""
    command += f" --max-states {args.max_states}" if args.max_states is not None else ""
    command += f" --model-states {args.model_states}" if args.model_states is not None else ""
    command += f" --budget {args.budget:g}" if args.budget != 20.0 else ""
    command += f" --batch {' --batch '.join(map(str, args.batch))}" if args.batch else ""
    command += f" --models {' '.join([*generated, *shared])}" if not everything else ""
    command += f" --kernels {args.kernels}" if args.kernels != PORTABLE.name else ""
    return command


def compare_kernels(rows: list[dict], command: str, args: argparse.Namespace, whole: bool) -> None:
    """``kernels.md`` in ``args.out``: the run's rows beside the onnx run's, and its block in
    docs/results.md when the run covers every row at full size."""
    try:
        onnx_run = json.loads((args.onnx_results / "summary.json").read_text())
    except (OSError, ValueError):
        onnx_run = {"rows": [], "shared_rows": []}
        print(f"no --kernels onnx run in {args.onnx_results}: the table has no onnx column", file=sys.stderr)
    machine = run_machine(rows, args.out)
    forms = args.out / "forms.json"  # scripts/compare_forms.py's readings, when it has run
    paired = json.loads(forms.read_text())["rows"] if forms.exists() else []
    table = kernels_markdown(onnx_run["rows"] + onnx_run["shared_rows"], rows, machine, command, paired)
    (args.out / "kernels.md").write_text(table)
    print(table)
    if whole and not args.no_readme and args.size == "full":
        replace_block(TABLES, table, KERNELS_START, KERNELS_END)
        print(f"{TABLES} updated (--kernels tvm beside --kernels onnx)")


def render(args: argparse.Namespace, index: Mapping | None) -> int:
    """``--render``: the tables of the run in ``args.out`` written again, measuring nothing; a row
    measured before rows recorded ``identical`` gets it from the files the run left in ``args.build``."""
    path = args.out / "summary.json"
    try:
        prev = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"cannot read {path}: {e}", file=sys.stderr)
        return 1
    rows, shared_rows = prev.get("rows", []), prev.get("shared_rows", [])
    for r in [*rows, *shared_rows]:
        if "error" not in r and "identical" not in r:
            r["identical"] = same_file(*row_files(r, args))
        if "error" not in r and "dense_bound" not in r:  # a row measured before the column
            bench = json.loads((args.out / r["file"]).read_text())["bench"]
            r["dense_bound"] = dense_bound(bench.get("original") or {})
    table, shared = write_summary(
        rows, shared_rows, prev["command"], args.out, prev.get("code", ""), prev.get("date")
    )
    print("\n".join(t for t in (table, shared) if t))
    every_generated = {row_key(r) for r in rows} >= {(m, b) for m in MODELS for b in (1, 16)}
    every_shared = {r["model"] for r in shared_rows} >= set(index or ())
    publish(args, prev["command"], (rows, shared_rows), (table, shared), (every_generated, every_shared))
    return 0


def publish(
    args: argparse.Namespace,
    command: str,
    sections: tuple[list[dict], list[dict]],
    tables: tuple[str, str],
    whole: tuple[bool, bool],
) -> None:
    """The run's tables written where they are read (nothing with ``--no-readme``): with a backend
    other than the portable one, ``kernels.md`` and, for a whole run, docs/results.md's kernels
    block (:func:`compare_kernels`); else README.md's block when the run covers every generated
    model at batch 1 and 16 at full size, and docs/results.md's shared block when it covers every
    shared model. ``sections``: the generated and the shared rows; ``tables``: theirs; ``whole``:
    whether each section covers every model."""
    rows, shared_rows = sections
    every_generated, every_shared = whole
    if args.kernels != PORTABLE.name:
        compare_kernels(rows + shared_rows, command, args, whole=every_generated and every_shared)
        return
    if args.no_readme:
        return
    if every_generated and args.size == "full":
        replace_block(README, tables[0])
        print("README.md updated (generated models)")
    if every_shared and tables[1]:
        replace_block(TABLES, tables[1], SHARED_START, SHARED_END)
        print(f"{TABLES} updated (shared models)")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the evaluation as ``argv`` asks (the command line's, by default), in the checkout (paths are
    relative to the working directory); the exit code: 1 when a row failed."""
    ap = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models",
        nargs="+",
        metavar="NAME",
        help="generated or shared models, or 'generated' / 'shared' for a section (default: all of both)",
    )
    ap.add_argument(
        "--batch", type=int, action="append", help="generated models' batch sizes (default 1 and 16)"
    )
    ap.add_argument("--size", choices=["full", "small"], default="full", help="generated models' size")
    ap.add_argument(
        "--shared",
        type=Path,
        metavar="DIR",
        default=Path("..") / "shared" / "models",
        help="the shared exporter models (default ../shared/models; the section is skipped without it)",
    )
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timed runs per model (default 20)")
    ap.add_argument("--out", type=Path, help="where the reports go (default results/)")
    ap.add_argument("--build", type=Path, help="where the models are written (default build/models/)")
    ap.add_argument(
        "--no-readme", action="store_true", help="do not update the tables of README.md and docs/results.md"
    )
    ap.add_argument("--no-openvino", action="store_true", help="do not time OpenVINO against ORT")
    ap.add_argument(
        "--cache",
        type=Path,
        help="measurement cache to use and fill (default: none, every timing is made afresh)",
    )
    ap.add_argument("--einopt", default=f"{sys.executable} -P -m einopt", help="how to run einopt")
    ap.add_argument("--max-depth", type=int, help="search depth (default: einopt's, 7)")
    ap.add_argument("--max-states", type=int, metavar="N", help="states per search (default: einopt's)")
    ap.add_argument("--model-states", type=int, metavar="N", help="states per model (default: einopt's)")
    ap.add_argument("--jobs", type=int, default=1, help="search processes per model (default 1)")
    ap.add_argument(
        "--kernels",
        choices=list(BACKENDS),
        default="onnx",
        help="how einopt writes eOperators (default onnx); a tvm run goes to results/kernels-tvm/ unless "
        "--out is given, and its table sets each row beside the onnx run's in --onnx-results",
    )
    ap.add_argument(
        "--onnx-results",
        type=Path,
        default=Path("results"),
        help="the --kernels onnx run a tvm run is compared with (default results/)",
    )
    ap.add_argument(
        "--render",
        action="store_true",
        help="measure nothing: rewrite the tables (results.md, README.md) from the run in --out",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="continue the stopped run in --out: keep its finished rows (same command and code), run the rest",
    )
    args = ap.parse_args(argv)
    form = f"kernels-{args.kernels}" if args.kernels != PORTABLE.name else ""
    args.out = args.out or Path("results") / form
    args.build = args.build or Path("build") / "models" / form
    batches = args.batch or [1, 16]
    args.shared = args.shared.resolve()
    index = read_index(args.shared)
    if args.render:
        return render(args, index)
    try:
        generated, shared = select(
            args.models, list(MODELS), list(index) if index is not None else None, args.shared
        )
    except ValueError as e:
        ap.error(str(e))
    if index is None:
        print(f"shared models: {args.shared} does not exist, the shared section is skipped", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    args.build.mkdir(parents=True, exist_ok=True)
    everything = set(generated) == set(MODELS) and set(shared) == set(index or ())
    command = _command(args, generated, shared, everything)
    code = code_fingerprint()
    try:
        kept = resumable(args.out, command, code) if args.resume else {}
    except ValueError as e:
        ap.error(str(e))
    sitting = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    rows: list[dict] = []
    shared_rows: list[dict] = []
    jobs = [
        ((name, batch), f"{name} batch {batch}", rows, functools.partial(run_pair, name, batch, args))
        for name in generated
        for batch in batches
    ]
    jobs += [
        ((name, None), f"{name} (shared, {index[name].get('exporter', '?')})", shared_rows,
         functools.partial(run_shared, name, index[name], args))
        for name in shared
    ]  # fmt: skip
    for key, label, section, run in jobs:
        if key in kept:
            print(f"{label}: kept from {kept[key]['measured']}")
            section.append(kept[key])
            continue
        print(label, flush=True)
        row = run()
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        section.append(row | {"measured": now, "sitting": sitting})
        # after every row: a stopped run keeps its table (and --resume continues it)
        write_summary(rows, shared_rows, command, args.out, code)
    table, shared_table = write_summary(rows, shared_rows, command, args.out, code)
    print("\n".join(t for t in (table, shared_table) if t))
    every_generated = set(generated) == set(MODELS) and set(batches) == {1, 16}
    every_shared = set(shared) == set(index or ())
    publish(args, command, (rows, shared_rows), (table, shared_table), (every_generated, every_shared))
    return 1 if any("error" in r for r in [*rows, *shared_rows]) else 0
