"""Each ``--kernels tvm`` output timed side by side with the ``--kernels onnx`` output of the same row.

No ``--kernels tvm`` row may be slower than its ``--kernels onnx`` row beyond noise. Two
evaluation runs set beside each other compare two speedups measured hours apart, each against
the input model in whatever state the machine was then (a shared VM's slow spells move a ratio by
a third). This script measures the question itself: for every row both runs finished, einopt's two
outputs run interleaved in one process (``einopt bench ONNX_OUTPUT TVM_OUTPUT``, outputs checked
equal first, the product's timing), so the machine's state cancels in each paired round::

    python scripts/compare_forms.py --tvm results/kernels-tvm --onnx results/kernels-onnx
    python scripts/compare_forms.py --tvm DIR --onnx DIR --models lstm bert_tiny --budget 20

The outputs and inputs are read from each row's report (``output``, and ``--inputs`` in its
``command``), so both runs' files must still be where they wrote them. Rows whose two outputs are
the same bytes read 1.00x untimed. The result, ``forms.json`` in the ``--tvm`` folder, is merged with
what is already there (rows measured again replace theirs); ``scripts/evaluate.py --render
--kernels tvm`` puts it in the kernels table as a column and judges "not slower" by it. Run it alone
on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from einopt.evaluation.tables import row_key

FORMS = "forms.json"
"""The side-by-side readings, in the ``--kernels tvm`` results folder."""


def finished_rows(results: Path) -> dict[tuple[str, int | None], dict]:
    """The rows of the run in ``results`` that finished, by (model, batch)."""
    summary = json.loads((results / "summary.json").read_text())
    return {
        row_key(r): r for r in [*summary.get("rows", []), *summary.get("shared_rows", [])] if "error" not in r
    }


def row_files(results: Path, row: Mapping) -> tuple[Path, Path]:
    """A row's output model and the inputs it was optimized and timed on, from its report."""
    report = json.loads((results / row["file"]).read_text())
    words = shlex.split(report["command"])
    inputs = words[words.index("--inputs") + 1]
    return Path(report["output"]), Path(inputs)


def bench(onnx_output: Path, tvm_output: Path, inputs: Path, budget: float) -> dict:
    """``einopt bench`` of the two outputs in a fresh process: speedup of the tvm form over the onnx one."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "bench.json"
        cmd = [
            sys.executable, "-P", "-m", "einopt", "-q", "bench", str(onnx_output), str(tvm_output),
            "--inputs", str(inputs), "--report", str(report),
            "--min-runs", "300", "--max-runs", "2000", "--budget", str(budget),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not report.exists():
            lines = (done.stderr or done.stdout).strip().splitlines()
            return {"error": f"exit {done.returncode}: {lines[-1] if lines else 'no message'}"}
        section = json.loads(report.read_text())["bench"]
    return {
        "speedup": section["speedup"],
        "speedup_95": section["speedup_95"],
        "onnx_ms": section["original"]["median_ms"],
        "tvm_ms": section["optimized"]["median_ms"],
        "unreliable": section["unreliable"],
        "load_average": section["machine"]["load_average"],
        "machine": section["machine"]["cpu"],
    }


def compare(onnx_results: Path, tvm_results: Path, models: list[str] | None, budget: float) -> list[dict]:
    """One reading per row both runs finished (of ``models`` when given), in the tvm run's order."""
    onnx_rows, tvm_rows = finished_rows(onnx_results), finished_rows(tvm_results)
    readings = []
    for key, row in tvm_rows.items():
        if key not in onnx_rows or (models and key[0] not in models):
            continue
        (tvm_output, inputs), (onnx_output, _) = (
            row_files(tvm_results, row),
            row_files(onnx_results, onnx_rows[key]),
        )
        reading: dict = {"model": key[0], "batch": key[1]}
        missing = [str(p) for p in (onnx_output, tvm_output, inputs) if not p.is_file()]
        if missing:
            reading["error"] = f"missing: {', '.join(missing)}"
        elif onnx_output.read_bytes() == tvm_output.read_bytes():
            reading |= {"speedup": 1.0, "identical": True}
        else:
            reading |= bench(onnx_output, tvm_output, inputs, budget)
        reading["measured"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        print(describe(reading), flush=True)
        readings.append(reading)
    return readings


def describe(reading: Mapping) -> str:
    """One line: the row and the tvm form's speedup over the onnx form."""
    label = reading["model"] + ("" if reading.get("batch") is None else f" bs{reading['batch']}")
    if "error" in reading:
        return f"{label}: {reading['error']}"
    if reading.get("identical"):
        return f"{label}: the two outputs are the same file"
    low, high = reading["speedup_95"]
    note = f", unreliable: {reading['unreliable']}" if reading["unreliable"] else ""
    return (
        f"{label}: onnx {reading['onnx_ms']:.3g} ms, tvm {reading['tvm_ms']:.3g} ms, "
        f"tvm {reading['speedup']:.2f}x (95% {low:.2f}-{high:.2f}x){note}"
    )


def merge(path: Path, readings: list[dict]) -> dict:
    """``path``'s readings with ``readings`` replacing those of the same rows."""
    old = json.loads(path.read_text())["rows"] if path.exists() else []
    fresh = {row_key(r) for r in readings}
    return {"rows": [r for r in old if row_key(r) not in fresh] + readings}


def main(argv: list[str] | None = None) -> int:
    """``scripts/compare_forms.py``: the exit code (1 when a row failed)."""
    ap = argparse.ArgumentParser(
        prog="scripts/compare_forms.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--tvm", type=Path, required=True, help="results folder of the --kernels tvm run")
    ap.add_argument("--onnx", type=Path, required=True, help="results folder of the --kernels onnx run")
    ap.add_argument("--models", nargs="+", metavar="NAME", help="only these models (default: every row)")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timed runs per row (default 20)")
    args = ap.parse_args(argv)
    try:
        readings = compare(args.onnx, args.tvm, args.models, args.budget)
    except (OSError, ValueError, KeyError) as e:
        ap.error(f"cannot read the runs' results: {e}")
    if not readings:
        ap.error("the two runs have no finished row in common" + (" among --models" if args.models else ""))
    path = args.tvm / FORMS
    path.write_text(json.dumps(merge(path, readings), indent=1) + "\n")
    print(f"{len(readings)} rows -> {path}")
    return 1 if any("error" in r for r in readings) else 0
