"""The evaluation's tables: targets (``targets.json``), the Markdown of the generated models', the shared
models' and the generated kernels' rows, and the blocks they replace in README.md and docs/results.md."""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

from einopt.evaluation.checks import openvino_text

START, END = "<!-- results:start -->", "<!-- results:end -->"
SHARED_START, SHARED_END = "<!-- shared-results:start -->", "<!-- shared-results:end -->"
KERNELS_START, KERNELS_END = "<!-- kernels-results:start -->", "<!-- kernels-results:end -->"
README = Path("README.md")
"""Where the generated models' table goes (the evaluation runs in the checkout)."""
TABLES = Path("docs") / "results.md"
"""Where the shared models' and the generated kernels' tables go."""


def _confirmation_text(c: dict | None) -> str:
    if c is None:
        return "-"
    low, high = c["speedup_95"]
    return f"{c['speedup']:.2f}x ({low:.2f}-{high:.2f}){'' if c['kept'] else ', not kept'}"


def _load_targets() -> dict:
    return json.loads(resources.files(__package__).joinpath("targets.json").read_text())


_TARGETS = _load_targets()


def _per_batch(section: Mapping) -> dict[tuple[str, int], float]:
    return {(name, int(batch)): goal for name, goals in section.items() for batch, goal in goals.items()}


TARGETS = _per_batch(_TARGETS["generated"])
"""The generated rows' speedup targets, by (model, batch) (``targets.json``); every other row: >= 0.99."""
SHARED_TARGETS: dict[str, float] = dict(_TARGETS["shared"])
"""The shared models' targets; every other one: >= 0.99 (never slower), and every row verified."""
NEVER_SLOWER: float = _TARGETS["never_slower"]
GEOMEAN_TARGET: float = _TARGETS["geomean"]
MINUTES_TARGET: float = _TARGETS["minutes"]

KERNEL_TARGETS = {
    **_per_batch(_TARGETS["kernels"]["generated"]),
    **{(name, None): goal for name, goal in _TARGETS["kernels"]["shared"].items()},
}
"""The ``--kernels tvm`` run's targets (every other row: >= 0.99x and not below its ``--kernels
onnx`` row beyond the noise; InfoGAN and DCGAN: at least the onnx row's speedup)."""
KERNEL_GEOMEAN_TARGET: float = _TARGETS["kernels"]["geomean"]
KERNEL_NOISE = 0.05
"""How far below the ``--kernels onnx`` row a ``--kernels tvm`` row may read and still be a tie."""


def row_key(row: Mapping) -> tuple[str, int | None]:
    """A row's place in a run: (model, batch) for a generated model, (model, None) for a shared one."""
    return row["model"], row.get("batch")


def target(r: dict) -> float:
    return TARGETS.get((r["model"], r["batch"]), NEVER_SLOWER)


def shared_target(name: str) -> float:
    return SHARED_TARGETS.get(name, NEVER_SLOWER)


def met(speedup: float | None, goal: float, verified: bool = True) -> str:
    """``met`` when verified and at least ``goal`` times faster, else ``**missed**``."""
    return "met" if verified and speedup is not None and speedup >= goal else "**missed**"


def speedup(r: Mapping) -> float | None:
    """What a row's user gets: 1.0 when einopt's output is its input byte for byte (the timing of a
    file against itself measures only the machine's noise), else the measured speedup."""
    return 1.0 if r.get("identical") and r.get("speedup") is not None else r.get("speedup")


def speedup_text(r: dict) -> str:
    if r.get("speedup") is None:
        return "not timed (outputs differ)"
    if r.get("identical"):
        return f"1.00x (output = input; read {r['speedup']:.2f}x)"
    return f"{r['speedup']:.2f}x" + (" (unreliable)" if r.get("unreliable") else "")


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def passthrough_text(p: Mapping | None) -> str:
    """``0``, or ``18: LayerNormalization: no importer x9; ...`` (nodes for each reason)."""
    if not p or not p.get("nodes"):
        return "0"
    reasons = "; ".join(f"{r} x{n}" if n > 1 else r for r, n in p["reasons"].items())
    return _cell(f"{p['nodes']}: {reasons}" if reasons else str(p["nodes"]))


def _verified_text(r: dict) -> str:
    """``yes / yes``: equal to the input in ORT / equal to PyTorch's outputs, with why not."""
    ort = "yes" if r.get("ort_equal") else "NO"
    pt = (r.get("pytorch") or {}).get("output") or {}
    if pt.get("ok"):
        return f"{ort} / yes"
    also = (
        " (the input model too)" if not ((r.get("pytorch") or {}).get("input") or {}).get("ok", True) else ""
    )
    return f"{ort} / NO{also}: {_cell(pt.get('message') or 'not checked')}"


OPENVINO_NOTE = (
    "OpenVINO: its speedup over ORT on the input model (ORT median / OpenVINO median, interleaved in one "
    "process, as many threads, float32; 'n/a (pip install openvino)' where it is not installed)."
)


def _provenance(machine: dict, command: str, rows: Sequence[dict] = ()) -> str:
    cpu = machine.get("cpu", "?")
    days = sorted({r["measured"][:10] for r in rows if "measured" in r}) or [
        datetime.date.today().isoformat()
    ]
    sittings = len({r["sitting"] for r in rows if "sitting" in r})
    when = days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"
    resumed = (
        f" (one run of the same code, resumed: {sittings} sittings, each row measured whole in one)"
        if sittings > 1
        else ""
    )
    return (
        f"Measured {when}{resumed} on {cpu}, {machine.get('threads', '?')} threads, "
        f"ONNX Runtime {machine.get('onnxruntime', '?')}, with `{command}`. "
    )


def markdown(rows: list[dict], machine: dict, command: str) -> str:
    """The generated models' results table (with its provenance) as Markdown."""
    lines = [
        "| model | batch | ORT ms | einopt ms | speedup | target | confirmation (95%) | OpenVINO vs ORT "
        "| kernels before -> after | rewrites found | subprograms accepted / rewritten / total | rolled back "
        "| einopt time (s) | verified |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['model']} | {r['batch']} | | | | | | | | | | | | failed: {_cell(r['error'])} |"
            )
            continue
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['ort_ms']:.3g} | {r['einopt_ms']:.3g} | "
            f"{speedup_text(r)} | >= {target(r):.2f}x {met(speedup(r), target(r))} | "
            f"{_confirmation_text(r.get('confirmation'))} | {_cell(openvino_text(r.get('openvino')))} | "
            f"{r['kernels'][0]} -> {r['kernels'][1]} | "
            f"{r['found']} / {r['subprograms']} | "
            f"{r['accepted']} / {r['rewritten']} / {r['subprograms']} | {r['rolled_back']} | "
            f"{r['optimize_s']:.1f} | {'yes' if r['verified'] else 'NO'} |"
        )
    g = geomean([speedup(r) for r in rows if "error" not in r and r["speedup"]])
    slowest = max((r["optimize_s"] for r in rows if "error" not in r), default=0.0) / 60
    if g is not None:
        lines.append("")
        lines.append(
            f"Geometric mean of the speedups: {g:.2f}x (target >= {GEOMEAN_TARGET}x). "
            f"Longest einopt run: {slowest:.1f} min (target <= {MINUTES_TARGET:g} min)."
        )
    head = _provenance(machine, command, rows) + (
        "Speedup = ORT median / einopt median (interleaved runs in one process); "
        "0.95-1.05 is within this machine's noise; an output byte-identical to its input counts as 1.00x "
        "(the reading beside it is the noise). Confirmation: the fresh whole-model comparison "
        "`einopt optimize` made last before keeping its output (speedup and the 95% interval of the "
        "per-round ratios; '-' when no rewrite reached it). "
        + OPENVINO_NOTE
        + " Rewrites found: subprograms "
        "whose nodes in the output came out of a derivation the search found / total translated. Subprograms: "
        "accepted (in the output, measured faster) / rewritten (other nodes than the original, verified) / total "
        "translated; rolled back: accepted on its own but removed by the whole-model check. einopt time = "
        "the whole `einopt optimize` run (prepare, translate, search, select: instantiate, verify and time "
        "the candidates, measured acceptance), without the `--bench` timing."
    )
    return head + "\n\n" + "\n".join(lines) + "\n"


def shared_markdown(rows: list[dict], machine: dict, command: str) -> str:
    """The shared exporter models' results table (with its provenance) as Markdown."""
    lines = [
        "| model | exporter | ORT ms | einopt ms | speedup | target | OpenVINO vs ORT | kernels before -> after "
        "| rewrites found | passed through (nodes: reasons) | einopt time (s) | verified (ORT / PyTorch) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        goal = shared_target(r["model"])
        if "error" in r:
            lines.append(
                f"| {r['model']} | {r['exporter']} | | | | >= {goal:.2f}x **missed** | | | | | | "
                f"failed: {_cell(r['error'])} |"
            )
            continue
        lines.append(
            f"| {r['model']} | {r['exporter']} | {r['ort_ms']:.3g} | {r['einopt_ms']:.3g} | {speedup_text(r)} | "
            f">= {goal:.2f}x {met(speedup(r), goal, r['verified'])} | {_cell(openvino_text(r.get('openvino')))} | "
            f"{r['kernels'][0]} -> {r['kernels'][1]} | {r['found']} / {r['subprograms']} | "
            f"{passthrough_text(r.get('passed_through'))} | {r['optimize_s']:.1f} | {_verified_text(r)} |"
        )
    done = [r for r in rows if "error" not in r]
    hits = sum(
        1
        for r in rows
        if "error" not in r and met(speedup(r), shared_target(r["model"]), r["verified"]) == "met"
    )
    g = geomean([speedup(r) for r in done if r["speedup"]])
    if rows:
        lines.append("")
        lines.append(
            f"Targets met: {hits} of {len(rows)}."
            + (f" Geometric mean of the speedups: {g:.2f}x." if g is not None else "")
        )
    head = _provenance(machine, command, rows) + (
        "Real `torch.onnx` exports (TorchScript and dynamo) from `../shared/models`, at their fixed inputs. "
        "Speedup = ORT median / einopt median (interleaved runs in one process; an output byte-identical "
        "to its input counts as 1.00x, the reading beside it is the noise); target: the model's "
        "(einopt/evaluation/targets.json), met only when verified. "
        + OPENVINO_NOTE
        + " Rewrites found: subprograms whose nodes in the output came "
        "out of a derivation the search found / total translated. Passed through: nodes einopt did not "
        "translate (left as they are), by reason. Verified: the output equal to the input in ORT / equal to "
        "PyTorch's outputs (the npz's y0..) in ORT, at einopt's verification tolerance. einopt time = the "
        "whole `einopt optimize` run, without the `--bench` timing."
    )
    return head + "\n\n" + "\n".join(lines) + "\n"


def kernels_markdown(
    onnx_rows: Sequence[dict],
    tvm_rows: Sequence[dict],
    machine: dict,
    command: str,
    paired: Sequence[dict] = (),
) -> str:
    """Both forms of eOperators side by side: each row of a ``--kernels tvm`` run beside the same
    model's row of the ``--kernels onnx`` run, with their targets. ``paired``: the readings of
    ``scripts/compare_forms.py`` (the two outputs timed against each other), which then decide
    whether a tvm row is slower than its onnx row."""
    by_key = {row_key(r): r for r in onnx_rows}
    side_by_side = {row_key(r): r for r in paired}
    lines = [
        "| model | batch | `--kernels onnx` | `--kernels tvm` | "
        + ("tvm against onnx, side by side | " if paired else "")
        + "target (tvm) | dense-op bound | kernels: input -> onnx / tvm | verified (tvm) |",
        "|---|---|---|---|---|---|---|---|" + ("---|" if paired else ""),
    ]
    speedups = []
    for r in tvm_rows:
        key = row_key(r)
        o = by_key.get(key)
        batch = "" if key[1] is None else key[1]
        onnx_text = speedup_text(o) if o and "error" not in o else "-"
        pair = side_by_side.get(key)
        pair_cell = f"{_pair_text(pair)} | " if paired else ""
        if "error" in r:
            lines.append(
                f"| {key[0]} | {batch} | {onnx_text} | failed: {_cell(r['error'])} | {pair_cell}| | | |"
            )
            continue
        s, base = speedup(r), speedup(o) if o and "error" not in o else None
        goal = KERNEL_TARGETS.get(key, NEVER_SLOWER)
        if pair is not None and "error" not in pair:
            not_slower = pair["speedup"] >= 1 - KERNEL_NOISE
        else:
            not_slower = base is None or s >= base * (1 - KERNEL_NOISE)
        ok = met(s, goal, r["verified"]) == "met" and not_slower
        speedups.append(s)
        kernels = (
            f"{r['kernels'][0]} -> {o['kernels'][1] if o and 'error' not in o else '?'} / {r['kernels'][1]}"
        )
        lines.append(
            f"| {key[0]} | {batch} | {onnx_text} | {speedup_text(r)} | {pair_cell}>= {goal:.2f}x"
            f"{' and >= onnx' if base else ''} {'met' if ok else '**missed**'} | {_bound_text(r)} | {kernels} "
            f"| {'yes' if r['verified'] else 'NO'} |"
        )
    g = geomean([s for s in speedups if s])
    tail = (
        f"\nGeometric mean with `--kernels tvm`: {g:.2f}x (target >= {KERNEL_GEOMEAN_TARGET}x).\n"
        if g
        else ""
    )
    head = _provenance(machine, command, tvm_rows) + (
        "Each `--kernels tvm` row beside the same model's row of the `--kernels onnx` run "
        f"(a tie within {KERNEL_NOISE:.0%} of it counts as not slower). "
    )
    head += (
        "Dense-op bound: the input's profiled time over that of its convolutions and products (Conv, "
        "ConvTranspose, Gemm, MatMul and their fused forms), i.e. the speedup if every other node took "
        "no time; it bounds rewrites that keep those nodes' work at their speed (a transformer's "
        "GEMMs, which ONNX Runtime runs at about the machine's FLOP rate), not rewrites that remove "
        "FLOPs (phase convolutions, band products), and it is inflated on models of tens of "
        "microseconds, where the profiler's own cost per node counts. "
    )
    if paired:
        head += (
            "The side-by-side column times the two runs' outputs against each other, interleaved in one "
            "process (`python scripts/compare_forms.py`, "
            f"{_pair_dates(paired)}): it, not the two columns before it, "
            "decides whether a tvm row is slower than its onnx row. "
        )
    return head + "\n\n" + "\n".join(lines) + "\n" + tail


def _bound_text(r: Mapping) -> str:
    bound = r.get("dense_bound")
    return "-" if bound is None else f"{bound:.2f}x"


def _pair_text(pair: Mapping | None) -> str:
    """A side-by-side reading of the tvm output against the onnx output, for the kernels table."""
    if pair is None:
        return "-"
    if "error" in pair:
        return f"failed: {_cell(pair['error'])}"
    if pair.get("identical"):
        return "1.00x (same file)"
    low, high = pair["speedup_95"]
    return f"{pair['speedup']:.2f}x (95% {low:.2f}-{high:.2f}x)" + (
        " unreliable" if pair.get("unreliable") else ""
    )


def _pair_dates(paired: Sequence[dict]) -> str:
    days = sorted({r["measured"][:16].replace("T", " ") for r in paired if "measured" in r})
    return f"{days[0]} to {days[-1]} UTC" if days else "date not recorded"


def replace_block(page: Path, table: str, start: str = START, end: str = END) -> None:
    """Replace the block between the ``start`` and ``end`` markers of ``page`` (a Markdown page: the
    README's results block by default) with ``table``."""
    text = page.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{page} has no {start} ... {end} block to replace")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    page.write_text(f"{before}{start}\n{table}{end}{after}")
