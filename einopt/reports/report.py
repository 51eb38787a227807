"""einopt's speedup reports: checking the report dict and printing it in the terminal.

The report is the plain, JSON-serialisable dict that ``einopt optimize
--report`` and ``einopt bench --report`` write (format 3):
``{"einopt_report": 3, "model", "output", "verified", "blocked", "notes",
"counts", "seconds", "acceptance", "subprograms": [...], "bench": None | {...}}``.
``acceptance`` says how rewrites were accepted (``mode`` measured or
verified, ``timed``, the whole-model ``rounds`` with what each rolled back
(each a ``stage``: compared, retaken or the final ``confirmation``, which is
also given on its own),
the measurement ``cache``, ``unreliable`` timings); each subprogram has one
of :data:`STATUSES`.
:func:`validate_report` checks it, :func:`print_report` renders it with rich
and :mod:`einopt.reports.report_html` renders it as a self-contained HTML page. The
small formatting helpers here are shared by both renderers, so a number reads
the same in the terminal and in the browser.

>>> print_report(json.load(open("r.json")), Console())   # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from einopt.errors import ModelError

REPORT_VERSION = 3
TIE = (0.95, 1.05)  # speedups in this band are measurement noise on a shared CPU
TIE_TEXT = "tie: within noise"
NOT_MEASURED = "not measured (use --bench)"
BIG_MODEL_ROWS = 25  # above this, the terminal lists only the subprograms whose nodes were rewritten
LOAD_KEYS = ("load", "loadavg", "load_average")  # optional machine keys: 1, 5, 15 minute load average
STATUSES = (
    "accepted",
    "rewritten",
    "unchanged",
    "not faster",
    "rolled back",
    "left out",
    "failed",
    "passed through",
)
"""accepted: measured faster, in the output; rewritten: in the output, not timed (--accept verified);
unchanged: re-instantiated as the same nodes; not faster: verified equal, measured no faster (the
original nodes stay); rolled back: faster on its own, but the whole model was slower with it;
left out: the rewrite holds at the representative values of the model's symbolic dimensions only
(it depends on a dimension's value: the original nodes stay); failed: instantiation or verification
failed; passed through: not translated."""
CHANGED = ("accepted", "rewritten", "not faster", "rolled back")  # new nodes that differ were made
KINDS = ("linear", "activation", "passthrough")

# Colours of the verdicts, shared by the terminal (rich styles) and the HTML plots.
COLORS = {
    "faster": "#1a9850",
    "slower": "#d73027",
    "tie": "#8c8c8c",
    "original": "#9aa7b8",
    "optimized": "#2b6cb0",
}
RICH_STYLES = {"faster": "bold green", "slower": "bold red", "tie": "yellow"}
STATUS_STYLES = {
    "accepted": "green",
    "rewritten": "green",
    "unchanged": "dim",
    "not faster": "yellow",
    "rolled back": "red",
    "left out": "yellow",
    "failed": "red",
    "passed through": "dim",
}


# --------------------------------------------------------------------------- formatting


def sig3(x: float) -> str:
    """``x`` with 3 significant digits and no exponent (``123``, ``12.3``, ``1.23``, ``0.0123``)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{digits}f}" if abs(x) >= 100 else f"{x:.{digits}f}".rstrip("0").rstrip(".") or "0"


def ms_text(ms: float | None) -> str:
    """A duration in milliseconds: ``"12.3 ms"``, ``"1.25 s"``; ``"-"`` when unknown."""
    if ms is None:
        return "-"
    return f"{sig3(ms / 1000)} s" if ms >= 1000 else f"{sig3(ms)} ms"


def spread_text(stats: Mapping[str, Any] | None) -> str:
    """The p10-p90 spread of a timing: ``"p10-p90 12.1-12.9 ms"``; ``""`` when unknown."""
    if not stats or stats.get("p10_ms") is None or stats.get("p90_ms") is None:
        return ""
    return f"p10-p90 {sig3(stats['p10_ms'])}-{ms_text(stats['p90_ms'])}"


def verdict(speedup: float | None) -> str:
    """``"faster"``, ``"slower"``, ``"tie"`` (within :data:`TIE`) or ``""`` when unknown."""
    if speedup is None:
        return ""
    if TIE[0] <= speedup <= TIE[1]:
        return "tie"
    return "faster" if speedup > 1 else "slower"


def speedup_text(x: float | None) -> str:
    """A speedup as ``"1.23x"`` (2 decimals); ``"-"`` when unknown."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf x" if x > 0 else "-"
    return f"{x:.2f}x"


def gflop_text(flops: int | None) -> str:
    """FLOPs in GFLOP with 3 significant digits."""
    return "-" if flops is None else f"{sig3(flops / 1e9)} GFLOP"


def mb_text(nbytes: int | None) -> str:
    """Bytes in MB (10^6) with 3 significant digits."""
    return "-" if nbytes is None else f"{sig3(nbytes / 1e6)} MB"


def int_text(n: int | None) -> str:
    """An integer with thousands separators."""
    return "-" if n is None else f"{n:,}"


def error_text(x: float | None) -> str:
    """A max abs error: ``"3.1e-07"``, ``"0"``; ``"-"`` when not measured."""
    if x is None:
        return "-"
    return "0" if x == 0 else f"{x:.1e}"


def ops_text(ops: Sequence[str], limit: int = 6) -> str:
    """Op types joined by spaces, runs collapsed (``Conv Add×3``) and cut after ``limit``."""
    runs: list[list] = []
    for op in ops:
        if runs and runs[-1][0] == op:
            runs[-1][1] += 1
        else:
            runs.append([op, 1])
    words = [op if n == 1 else f"{op}×{n}" for op, n in runs]
    if len(words) > limit:
        words = words[:limit] + [f"… (+{len(words) - limit})"]
    return " ".join(words) or "-"


def shorten(name: str, width: int = 32) -> str:
    """``name`` cut in the middle to ``width`` characters (the ends of ONNX names say the most)."""
    if len(name) <= width:
        return name
    head = (width - 1) // 3
    return name[:head] + "…" + name[len(name) - (width - 1 - head) :]


def machine_text(machine: Mapping[str, Any] | None) -> str:
    """One line about where the timings were taken: CPU, threads, ORT version, load average."""
    if not machine:
        return ""
    parts = [str(machine.get("cpu") or "unknown CPU")]
    if machine.get("threads") is not None:
        cores = f" of {machine['cores']} cores" if machine.get("cores") else ""
        parts.append(f"{machine['threads']} threads{cores}")
    if machine.get("onnxruntime"):
        parts.append(f"onnxruntime {machine['onnxruntime']}")
    load = next((machine[k] for k in LOAD_KEYS if machine.get(k) is not None), None)
    if load is not None:
        values = load if isinstance(load, list | tuple) else [load]
        parts.append("load " + " ".join(f"{float(v):.2f}" for v in values))
    return ", ".join(parts)


def model_title(report: Mapping[str, Any]) -> str:
    """The report's title: the model, and the optimized model when there is one."""
    model = report.get("model") or "model"
    return f"{model} -> {report['output']}" if report.get("output") else model


def equality_text(bench: Mapping[str, Any] | None, verified: bool) -> str:
    """What is known about the two models being equal."""
    if bench is None:
        return "verified equal in ONNX Runtime" if verified else "not verified"
    err = bench.get("max_error")
    if bench.get("equal"):
        return f"outputs equal (max error {error_text(err)})"
    return f"the models differ: {bench.get('message') or 'outputs are not equal'}"


def part_speedups(report: Mapping[str, Any]) -> list[tuple[str, float]]:
    """``(name, speedup)`` of the subprograms that were timed on their own, in report order."""
    return [
        (p["name"], p["bench"]["speedup"])
        for p in report.get("subprograms", [])
        if p.get("bench") and p["bench"].get("speedup") is not None
    ]


def no_part_speedups_reason(report: Mapping[str, Any]) -> str:
    """Why a report has no per-subprogram speedups (for the place where the plot would be)."""
    parts = report.get("subprograms", [])
    if not parts:
        return "This report compares two models; it has no subprograms."
    if not any(p["status"] in CHANGED for p in parts):
        return "No subprogram was rewritten into other nodes, so there is nothing to time on its own."
    return "Per-subprogram times are measured by `einopt optimize --bench`."


# --------------------------------------------------------------------------- validation

_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "number": ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    "number?": ("a number or null", lambda v: v is None or _TYPES["number"][1](v)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "strs": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "list": ("a list", lambda v: isinstance(v, list)),
    "dict": ("an object", lambda v: isinstance(v, dict)),
    "dict?": ("an object or null", lambda v: v is None or isinstance(v, dict)),
}
_TOP = {
    "einopt_report": "int",
    "model": "str",
    "output": "str",
    "verified": "bool",
    "blocked": "str",
    "notes": "strs",
    "counts": "dict",
    "seconds": "dict",
    "acceptance": "dict",
    "subprograms": "list",
    "bench": "dict?",
}
_PART = {
    "name": "str",
    "kind": "str",
    "ops": "strs",
    "status": "str",
    "reason": "str",
    "new_ops": "strs",
    "expression": "str",
    "max_error": "number?",
    "trace": "str",
    "bench": "dict?",
}
_PART_BENCH = {"original_ms": "number", "optimized_ms": "number", "speedup": "number"}
_BENCH = {
    "machine": "dict",
    "equal": "bool",
    "max_error": "number?",
    "message": "str",
    "runs": "int",
    "warmup": "int",
    "original": "dict?",
    "optimized": "dict?",
    "speedup": "number?",
}
_TIMING = {
    "median_ms": "number?",
    "p10_ms": "number?",
    "p90_ms": "number?",
    "min_ms": "number?",
    "nodes": "int",
    "kernels": "int",
    "flops": "int",
    "bytes": "int",
    "time_by_op": "dict",
}


def _check(obj: Any, schema: Mapping[str, str], where: str) -> None:
    if not isinstance(obj, dict):
        raise ModelError(f"report: {where or 'the report'} must be an object, got {type(obj).__name__}")
    for key, kind in schema.items():
        path = f"{where}.{key}" if where else key
        if key not in obj:
            raise ModelError(f"report: missing key {path!r}")
        what, ok = _TYPES[kind]
        if not ok(obj[key]):
            raise ModelError(f"report: key {path!r} must be {what}, got {type(obj[key]).__name__}")


def _check_values(obj: Mapping[str, Any], kind: str, where: str) -> None:
    what, ok = _TYPES[kind]
    for key, value in obj.items():
        if not ok(value):
            raise ModelError(f"report: key '{where}.{key}' must be {what}, got {type(value).__name__}")


def _check_choice(value: str, choices: Sequence[str], path: str) -> None:
    if value not in choices:
        raise ModelError(f"report: key {path!r} is {value!r}, expected one of {', '.join(choices)}")


def validate_report(report: dict) -> None:
    """Check that ``report`` follows the report format (keys and types), e.g. a JSON file to re-render.

    Parameters
    ----------
    report : dict
        A report as written by ``einopt optimize --report`` or ``einopt bench --report``.

    Raises
    ------
    einopt.errors.ModelError
        Naming the first key that is missing or has the wrong type (``bench.original.kernels``).
    """
    _check(report, _TOP, "")
    if report["einopt_report"] != REPORT_VERSION:
        raise ModelError(
            f"report: key 'einopt_report' is {report['einopt_report']}, this einopt reads format {REPORT_VERSION}"
        )
    if "command" in report and not isinstance(report["command"], str | list):
        raise ModelError("report: key 'command' must be a string or a list of strings")
    _check_values(report["counts"], "int", "counts")
    _check_values(report["seconds"], "number", "seconds")
    for i, part in enumerate(report["subprograms"]):
        where = f"subprograms[{i}]"
        _check(part, _PART, where)
        _check_choice(part["status"], STATUSES, f"{where}.status")
        _check_choice(part["kind"], KINDS, f"{where}.kind")
        if part["bench"] is not None:
            _check(part["bench"], _PART_BENCH, f"{where}.bench")
    bench = report["bench"]
    if bench is None:
        return
    _check(bench, _BENCH, "bench")
    for side in ("original", "optimized"):
        if bench[side] is not None:
            _check(bench[side], _TIMING, f"bench.{side}")
            _check_values(bench[side]["time_by_op"], "number", f"bench.{side}.time_by_op")


# --------------------------------------------------------------------------- terminal


def _styled_speedup(x: float | None, tie_note: bool = True) -> Text:
    v = verdict(x)
    text = Text(speedup_text(x), style=RICH_STYLES.get(v, ""))
    if v == "tie" and tie_note:
        text.append(f" ({TIE_TEXT})", style="dim")
    return text


def _side(bench: Mapping[str, Any] | None, side: str) -> Mapping[str, Any]:
    return (bench or {}).get(side) or {}


def _summary_table(report: Mapping[str, Any]) -> Table:
    bench = report.get("bench")
    table = Table(title=model_title(report), title_style="bold", header_style="bold")
    table.add_column("")
    table.add_column("original", justify="right")
    table.add_column("optimized", justify="right")
    orig, opt = _side(bench, "original"), _side(bench, "optimized")
    if bench is None:
        table.add_row("latency", NOT_MEASURED, "")
    elif bench.get("speedup") is None or orig.get("median_ms") is None:
        table.add_row("latency", "not timed (the models differ)", "")
    else:
        table.add_row("latency (median)", ms_text(orig.get("median_ms")), ms_text(opt.get("median_ms")))
        table.add_row("", Text(spread_text(orig), style="dim"), Text(spread_text(opt), style="dim"))
        interval = bench.get("speedup_95")
        table.add_row("speedup", "", _styled_speedup(bench["speedup"]))
        if interval:  # the rounds' ratios: a median of them, not the ratio of the two medians above
            table.add_row("", "", Text(f"95% {interval[0]:.2f}-{interval[1]:.2f}x, paired runs", style="dim"))
        table.add_section()
    if orig or opt:
        rows = (("kernels", "kernels", int_text), ("graph nodes", "nodes", int_text))
        rows += (("compute", "flops", gflop_text), ("memory", "bytes", mb_text))
        for label, key, fmt in rows:
            table.add_row(label, fmt(orig.get(key)), fmt(opt.get(key)))
        generated = opt.get("generated_kernels") or []
        if generated:
            table.add_row("generated kernels", "", generated_text(generated))
    counts = report.get("counts") or {}
    if counts:
        table.add_row("subprograms", "", counts_text(counts))
    return table


def generated_text(profiled: list[Mapping[str, Any]]) -> str:
    """``3, 0.12 ms; slowest 0.08 ms at 9.1 GB/s``: einopt's generated kernels in the profiled run."""
    total = sum(k["ms"] for k in profiled)
    slow = profiled[0]
    rate = f" at {slow['gb_s']:.1f} GB/s" if slow.get("gb_s") else ""
    rate += f", {slow['gflop_s']:.1f} GFLOP/s" if slow.get("gflop_s") else ""
    return f"{len(profiled)}, {ms_text(total)}; slowest {ms_text(slow['ms'])}{rate}"


def counts_text(counts: Mapping[str, int]) -> str:
    """``accepted 2 / rewritten 5 / total 30 (1 rolled back)``: what reached the output, of what."""
    text = (
        f"accepted {counts.get('accepted', 0)} / rewritten {counts.get('rewritten', 0)}"
        f" / total {counts.get('subprograms', 0)}"
    )
    extra = setbacks(counts)
    return text + (f" ({', '.join(extra)})" if extra else "")


def setbacks(counts: Mapping[str, int]) -> list[str]:
    """``["1 rolled back", "2 failed"]``: the subprogram counts a reader should not miss."""
    keys = ("rolled_back", "left_out", "failed")
    return [f"{counts[k]} {k.replace('_', ' ')}" for k in keys if counts.get(k)]


def acceptance_text(report: Mapping[str, Any]) -> str:
    """How the rewrites were accepted: measured (with the cache's work) or only verified."""
    acc = report.get("acceptance") or {}
    if not acc:
        return ""
    if acc.get("mode") == "verified":
        return "acceptance: verified only, not timed (--accept verified): the output may be slower"
    if not acc.get("timed"):
        return "acceptance: measured; nothing needed timing"
    cache = acc.get("cache") or {}
    where = f"cache {cache['path']}" if cache.get("path") else "no cache"
    rounds = acc.get("rounds") or []
    whole = ""
    confirm = acc.get("confirmation")
    if confirm:  # the fresh comparison of the output against the input is the figure that counts
        low, high = confirm.get("speedup_95") or (None, None)
        interval = f" (95% {low:.3f}-{high:.3f}x)" if low is not None else ""
        verdict = "confirmed" if not confirm.get("rolled_back") else "not confirmed: output is the input"
        whole = (
            f"; whole model {speedup_text(confirm.get('speedup'))}{interval} with "
            f"{len(confirm.get('kept', []))} rewrites, {verdict}"
        )
    elif rounds:
        last = rounds[-1]
        whole = f"; whole model {speedup_text(last.get('speedup'))} with {len(last.get('kept', []))} rewrites"
    for r in rounds:  # the confirmed model at the other --time-shapes
        if r.get("stage") == "shape":
            whole += f"; {r.get('reason')}" + (": the output is the input" if r.get("rolled_back") else "")
    if rounds:
        rolled = len({n for r in rounds for n in r.get("rolled_back", [])})
        retakes = sum(1 for r in rounds if r.get("stage") == "retake")
        whole += f", {rolled} rolled back" if rolled else ""
        whole += f", {retakes} timings retaken (the input's time drifted)" if retakes else ""
    return (
        f"acceptance: measured, faster than {1 + acc.get('noise_band', 0):.2f}x on its own{whole} "
        f"({cache.get('measured', 0)} timings made, {cache.get('hits', 0)} from the {where})"
    )


def passthrough_text(parts: Sequence[Mapping[str, Any]], limit: int = 4) -> str:
    """Why nodes passed through, most common reasons first (``Gelu: no importer x2; ...``)."""
    reasons = Counter(p.get("reason") or "no reason given" for p in parts if p["status"] == "passed through")
    if not reasons:
        return ""
    top = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    text = "; ".join(f"{r} (x{n})" if n > 1 else r for r, n in top[:limit])
    more = f"; and {len(top) - limit} other reasons" if len(top) > limit else ""
    return f"passed through: {sum(reasons.values())} nodes or subprograms: {text}{more}"


def _equality_line(report: Mapping[str, Any]) -> Text:
    bench = report.get("bench")
    ok = bench["equal"] if bench else bool(report.get("verified"))
    style = "green" if ok else ("bold red" if bench else "yellow")
    return Text(("equal: " if ok else "") + equality_text(bench, bool(report.get("verified"))), style=style)


def split_parts(parts: Sequence[Mapping[str, Any]]) -> tuple[list, list, str]:
    """Big models (> :data:`BIG_MODEL_ROWS` subprograms): the rows to list, the rest, a line about the rest.

    The subprograms rewritten into other nodes (and those that failed) are
    listed; the unchanged and passed-through ones are summarised by their op
    types (``… and 48 more … (Relu×30, Add×18)``).
    """
    if len(parts) <= BIG_MODEL_ROWS:
        return list(parts), [], ""
    listed = (*CHANGED, "left out", "failed")
    shown = [p for p in parts if p["status"] in listed]
    rest = [p for p in parts if p["status"] not in listed]
    if not rest:
        return shown, [], ""
    ops = Counter(op for p in rest for op in p["ops"])
    common = ", ".join(f"{op}×{n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))[:6])
    return shown, rest, f"… and {len(rest)} more subprograms unchanged or passed through ({common})"


def _parts_table(report: Mapping[str, Any]) -> Table | None:
    parts = report.get("subprograms") or []
    if not parts:
        return None
    shown, _, rest = split_parts(parts)
    timed = any(p.get("bench") for p in parts)
    searched = any(p.get("search") for p in parts)
    table = Table(title="subprograms", title_style="bold", header_style="bold", caption=rest or None)
    table.add_column("subprogram", overflow="fold", max_width=36)
    table.add_column("ops -> new ops", overflow="fold")
    table.add_column("status")
    if searched:
        table.add_column("search", overflow="fold")
    if timed:
        table.add_column("speedup", justify="right")
    table.add_column("max error", justify="right")
    for p in shown:
        change = ops_text(p["ops"], limit=4)
        if p["status"] in CHANGED:
            change += " -> " + ops_text(p["new_ops"], limit=4)
        status = Text(p["status"], style=STATUS_STYLES.get(p["status"], ""))
        if p["status"] in ("not faster", "rolled back", "left out", "failed") and p.get("reason"):
            status.append(f" ({p['reason']})", style="dim")
        row: list[Any] = [shorten(p["name"], 36), change, status]
        if searched:
            row.append(search_text(p.get("search")))
        if timed:
            row.append(_styled_speedup((p.get("bench") or {}).get("speedup"), tie_note=False))
        row.append(error_text(p.get("max_error")))
        table.add_row(*row)
    return table


def search_text(search: Mapping[str, Any] | None) -> str:
    """A subprogram's search in a few words: states, seconds (or cached / shared), predicted speedup."""
    if not search or not search["stats"].get("searched", True):
        return "-"
    if search.get("same_as"):
        where = f"as {search['same_as']}"
    elif search.get("cached"):
        where = f"{search['stats'].get('generated', 0)} states, cached"
    else:
        cut = "" if search["stats"].get("complete", True) else ", cut short"
        where = f"{search['stats'].get('generated', 0)} states, {search['seconds']:.1f} s{cut}"
    pred = search.get("predicted_speedup")
    return where + (f"; {pred:.2f}x predicted" if pred else "")


def search_summary_text(report: Mapping[str, Any]) -> str:
    s = report.get("search")
    if not s or not (s.get("searched") or s.get("cached")):
        return ""
    rho = s.get("rank_correlation")
    rank = (
        f"; predicted vs measured speedups of {s['timed_candidates']} timed candidates: rank correlation {rho:.2f}"
        if rho is not None
        else ""
    )
    cut = f" ({s['incomplete']} cut short by their budget)" if s.get("incomplete") else ""
    alone = f" and {s['expressions']} of their expressions on their own" if s.get("expressions") else ""
    return (
        f"search: {s['searched']} distinct subprograms{alone}, {s['cached']} from the cache, "
        f"{s['states']} states in {s['seconds']:.1f} s{cut}{rank}"
    )


def traces_text(parts: Sequence[Mapping[str, Any]], limit: int = 8) -> list[str]:
    """The derivations of the subprograms whose new nodes are in the output."""
    out = [
        f"{p['name']}: {p['trace']}"
        for p in parts
        if p["status"] in ("accepted", "rewritten") and p.get("trace")
    ]
    return out[:limit] + ([f"... and {len(out) - limit} more derivations"] if len(out) > limit else [])


def _footer(report: Mapping[str, Any]) -> list[Text]:
    lines = []
    summary = search_summary_text(report)
    if summary:
        lines.append(Text(summary, style="dim"))
    for line in traces_text(report.get("subprograms") or []):
        lines.append(Text(f"derivation {line}", style="dim"))
    if report.get("blocked"):
        lines.append(Text(f"untouched: {report['blocked']}", style="yellow"))
    for text in (acceptance_text(report), passthrough_text(report.get("subprograms") or [])):
        if text:
            lines.append(Text(text, style="dim"))
    for note in report.get("notes") or []:
        lines.append(Text(f"note: {note}", style="dim"))
    bench = report.get("bench")
    if bench:
        machine = machine_text(bench.get("machine"))
        warm = bench.get("warmup_rounds", bench.get("warmup"))
        runs = f"{bench.get('runs')} runs after {warm} warm-up rounds, interleaved"
        lines.append(Text(f"machine: {machine}; {runs}", style="dim"))
        if bench.get("unreliable"):
            lines.append(
                Text(
                    f"UNRELIABLE timing: {bench['unreliable']}: run again on a quiet machine",
                    style="bold yellow",
                )
            )
        if any(verdict(x) == "tie" for x in [bench.get("speedup")] + [s for _, s in part_speedups(report)]):
            lines.append(Text(f"speedups within {TIE[0]}-{TIE[1]} are ties: within noise", style="dim"))
    return lines


def print_report(report: dict, console: Console) -> None:
    """Print a report: the summary table, the subprogram table and the notes.

    Parameters
    ----------
    report : dict
        A report in the format of :func:`validate_report` (``bench`` may be None,
        ``subprograms`` may be empty, ``bench.equal`` may be False).
    console : rich.console.Console
        Where to print.
    """
    items: list[Any] = [_summary_table(report), _equality_line(report)]
    parts = _parts_table(report)
    if parts is not None:
        items.append(parts)
    items.extend(_footer(report))
    console.print(Group(*items))
