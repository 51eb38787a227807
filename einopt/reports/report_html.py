"""einopt's speedup report as one self-contained HTML file (inline SVG plots, no scripts, works offline).

:func:`render_html` fills ``templates/report.html.j2`` (Jinja2, autoescaped)
with the numbers formatted by :mod:`einopt.reports.report` and two plots drawn with
matplotlib's object API (no pyplot, so no global figure state): the speedup of
every subprogram timed on its own, and the time by operator type before and
after. The output is deterministic: the same report renders to the same bytes.
:func:`screenshot` renders a report in headless Chromium (for checks and docs).

>>> write_html(report, "report.html")                       # doctest: +SKIP
>>> screenshot("report.html", "report.png", width=1200)     # doctest: +SKIP
"""

from __future__ import annotations

import io
import math
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from einopt import __version__
from einopt.reports import report as fmt
from einopt.runtime.modelio import write_atomic

TOP_OPS = 12  # operator types plotted by name; the rest are summed into "other"
NAME_WIDTH = 30  # characters of a subprogram name on a plot axis
ROW_INCHES = 0.26
FIG_WIDTH = 10.0  # inches; the page scales plots down to its width, never up
_SPEEDUP_TICKS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 0.75, 1, 1.25, 1.5, 2, 3, 4, 8, 16, 32)
CHROMIUM = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
_RC = {
    "svg.hashsalt": "einopt-report",  # stable ids in the SVG, so renders are byte-identical
    "svg.fonttype": "path",  # glyphs as paths: the page looks the same without the fonts
    "font.size": 9,
    "font.family": "DejaVu Sans",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#9aa0a6",
    "axes.labelcolor": "#333333",
    "xtick.color": "#555555",
    "ytick.color": "#333333",
}


# --------------------------------------------------------------------------- plots


def _svg(fig: Figure, label: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]  # drop the XML declaration and doctype: the SVG is inline
    return svg.replace("<svg ", f'<svg role="img" aria-label="{label}" class="plot" ', 1)


def _rows_figure(rows: int, width: float = FIG_WIDTH) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, 0.9 + ROW_INCHES * max(rows, 2)))
    return fig, fig.add_subplot()


def speedup_plot(speedups: Sequence[tuple[str, float]]) -> str:
    """Horizontal bars of per-subprogram speedups (log scale around the 1.0 line), as inline SVG."""
    names = [fmt.shorten(n, NAME_WIDTH) for n, _ in speedups]
    values = [max(s, 1e-3) if math.isfinite(s) else 1e3 for _, s in speedups]
    colors = [fmt.COLORS[fmt.verdict(s)] for s in values]
    with matplotlib.rc_context(_RC):
        fig, ax = _rows_figure(len(values))
        y = list(range(len(values)))
        ax.barh(y, [v - 1 for v in values], left=1, color=colors, height=0.7)
        ax.axvline(1.0, color="#333333", linewidth=1)
        ax.set_xscale("log", base=2)
        lo, hi = min(values + [0.8]), max(values + [1.25])
        ax.set_xlim(lo / 1.35, hi * 1.35)
        ticks = [t for t in _SPEEDUP_TICKS if lo / 1.35 <= t <= hi * 1.35]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yticks(y, names)
        ax.invert_yaxis()
        ax.set_ylim(len(values) - 0.4, -0.6)
        for i, v in enumerate(values):
            ha, pad = ("left", 1.04) if v >= 1 else ("right", 1 / 1.04)
            ax.text(v * pad, i, fmt.speedup_text(v), va="center", ha=ha, fontsize=8, color="#333333")
        ax.set_xlabel("speedup of the subprogram on its own (original time / optimized time)")
        ax.grid(axis="x", color="#e6e6e6", linewidth=0.8)
        ax.set_axisbelow(True)
        return _svg(fig, "speedup per subprogram")


def op_time_rows(before: Mapping[str, float], after: Mapping[str, float]) -> list[tuple[str, float, float]]:
    """``(op type, ms before, ms after)`` sorted by total time; past :data:`TOP_OPS`, one "other" row."""
    ops = sorted(set(before) | set(after), key=lambda op: (-(before.get(op, 0) + after.get(op, 0)), op))
    rows = [(op, before.get(op, 0.0), after.get(op, 0.0)) for op in ops]
    if len(rows) > TOP_OPS + 1:
        rest = rows[TOP_OPS:]
        rows = rows[:TOP_OPS] + [(f"other ({len(rest)})", sum(r[1] for r in rest), sum(r[2] for r in rest))]
    return rows


def op_time_plot(before: Mapping[str, float], after: Mapping[str, float]) -> str:
    """Grouped horizontal bars of kernel time by operator type, original vs optimized, as inline SVG."""
    rows = op_time_rows(before, after)
    with matplotlib.rc_context(_RC):
        fig, ax = _rows_figure(int(len(rows) * 1.3))
        y = [1.0 * i for i in range(len(rows))]
        h = 0.38
        ax.barh(
            [v - h / 2 for v in y], [r[1] for r in rows], h, color=fmt.COLORS["original"], label="original"
        )
        ax.barh(
            [v + h / 2 for v in y], [r[2] for r in rows], h, color=fmt.COLORS["optimized"], label="optimized"
        )
        top = max([max(r[1], r[2]) for r in rows] + [1e-9])
        for i, (_, b, a) in enumerate(rows):
            for value, dy in ((b, -h / 2), (a, h / 2)):
                if value > 0:
                    ax.text(value + top * 0.01, y[i] + dy, fmt.ms_text(value), va="center", fontsize=7.5)
        ax.set_yticks(y, [fmt.shorten(r[0], NAME_WIDTH) for r in rows])
        ax.set_ylim(len(rows) - 0.4, -0.6)
        ax.set_xlim(0, top * 1.18)
        ax.set_xlabel("median kernel time per run (ms, ONNX Runtime profiling)")
        ax.grid(axis="x", color="#e6e6e6", linewidth=0.8)
        ax.set_axisbelow(True)
        ax.legend(loc="lower right", frameon=False)
        return _svg(fig, "time by operator type")


# --------------------------------------------------------------------------- page


_CARD_PAIRS = (
    ("kernels", "kernels", fmt.int_text),
    ("GFLOP", "flops", lambda n: "-" if n is None else fmt.sig3(n / 1e9)),
    ("memory, MB", "bytes", lambda n: "-" if n is None else fmt.sig3(n / 1e6)),
)


def _card(label: str, value: str, detail: str = "", tone: str = "") -> dict[str, str]:
    return {"label": label, "value": value, "detail": detail, "tone": tone}


def _cards(report: Mapping[str, Any]) -> list[dict[str, str]]:
    bench = report.get("bench")
    orig, opt = (bench or {}).get("original") or {}, (bench or {}).get("optimized") or {}
    cards = []
    if bench is None:
        cards.append(_card("speedup", "not measured", "use --bench"))
    elif bench.get("speedup") is None or orig.get("median_ms") is None:
        cards.append(_card("speedup", "not timed", "the models differ", "slower"))
    else:
        s = bench["speedup"]
        cards.append(
            _card(
                "speedup",
                fmt.speedup_text(s),
                fmt.TIE_TEXT if fmt.verdict(s) == "tie" else "",
                fmt.verdict(s),
            )
        )
        for side, stats in (("original", orig), ("optimized", opt)):
            cards.append(
                _card(f"latency {side}", fmt.ms_text(stats.get("median_ms")), fmt.spread_text(stats))
            )
    for label, key, show in _CARD_PAIRS:
        if orig or opt:
            before, after = orig.get(key), opt.get(key)
            change = (
                f"{(after - before) / before:+.0%}"
                if before and after is not None and after != before
                else ""
            )
            cards.append(
                _card(label, f"{show(before)} → {show(after)}", change and f"{change} of the original")
            )
    counts = report.get("counts") or {}
    if counts:
        extra = fmt.setbacks(counts)
        cards.append(
            _card(
                "subprograms accepted",
                f"{counts.get('accepted', 0)} of {counts.get('rewritten', 0)} rewritten",
                f"{counts.get('subprograms', 0)} in all" + "".join(f", {e}" for e in extra),
            )
        )
    if bench and bench.get("unreliable"):
        cards.append(_card("timing", "unreliable", bench["unreliable"], "slower"))
    ok = bench["equal"] if bench else bool(report.get("verified"))
    if bench is None:
        detail = "verified in ONNX Runtime" if ok else "not verified"
    else:
        detail = f"max error {fmt.error_text(bench.get('max_error'))}"
    cards.append(_card("outputs equal", "yes" if ok else "no", detail, "" if ok else "slower"))
    return cards


def _parts(parts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for p in parts:
        s = (p.get("bench") or {}).get("speedup")
        rows.append(
            {
                "name": p["name"],
                "kind": p["kind"],
                "ops": fmt.ops_text(p["ops"], limit=8),
                "new_ops": fmt.ops_text(p["new_ops"], limit=8) if p["status"] in fmt.CHANGED else "",
                "status": p["status"],
                "status_class": p["status"].replace(" ", "-"),
                "reason": p.get("reason", ""),
                "speedup": fmt.speedup_text(s) if s is not None else "",
                "times": (
                    f"{fmt.ms_text(p['bench']['original_ms'])} → {fmt.ms_text(p['bench']['optimized_ms'])}"
                    if p.get("bench")
                    else ""
                ),
                "verdict": fmt.verdict(s),
                "max_error": fmt.error_text(p.get("max_error")),
                "expression": p.get("expression", ""),
                "trace": p.get("trace", ""),
                "search": fmt.search_text(p.get("search")) if p.get("search") else "",
                "candidates": [_candidate(c) for c in (p.get("search") or {}).get("candidates", [])],
            }
        )
    return rows


def _candidate(c: Mapping[str, Any]) -> dict[str, str]:
    """One candidate a subprogram's selection tried, as table cells."""
    pred, meas = c.get("predicted_speedup"), c.get("measured_speedup")
    return {
        "depth": str(c["depth"]),
        "operators": fmt.ops_text(c["operators"], limit=8),
        "predicted": f"{pred:.2f}x" if pred else "",
        "measured": f"{meas:.2f}x" if meas is not None else "",
        "verdict": c.get("rejected") or "chosen",
    }


def _command(report: Mapping[str, Any]) -> str:
    command = report.get("command")
    if isinstance(command, list):
        return shlex.join(str(c) for c in command)
    return command or ""


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("einopt", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _symbolic(section: Mapping | None) -> dict | None:
    """The symbolic dimensions' table rows (dimension, searched at, declared values) and the shapes
    the output was verified and timed at, as text."""
    if not section:
        return None

    def shape(values: Mapping) -> str:
        return ", ".join(f"{k}={v}" for k, v in values.items())

    return {
        "rows": [
            (d["name"], str(d["searched_at"]), d.get("declared") or "any") for d in section["dimensions"]
        ],
        "verified": [shape(v) for v in section.get("verified_at") or []],
        "timed": [shape(v) for v in section.get("timed_at") or []],
        "left_out": list(section.get("left_out") or []),
        "searched_only": list(section.get("searched_shape_only") or []),
    }


def render_html(report: dict) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG, no scripts).

    Parameters
    ----------
    report : dict
        A report in the format of :func:`einopt.reports.report.validate_report`.

    Returns
    -------
    str
        The page; the same report always gives the same string.
    """
    bench = report.get("bench")
    speedups = fmt.part_speedups(report)
    before = ((bench or {}).get("original") or {}).get("time_by_op") or {}
    after = ((bench or {}).get("optimized") or {}).get("time_by_op") or {}
    machine = (bench or {}).get("machine") or {}
    shown, rest, rest_line = fmt.split_parts(report.get("subprograms") or [])
    context = {
        "title": report.get("model") or "model",
        "output": report.get("output") or "",
        "cards": _cards(report),
        "speedup_svg": speedup_plot(speedups) if speedups else "",
        "speedup_reason": "" if speedups else fmt.no_part_speedups_reason(report),
        "ops_svg": op_time_plot(before, after) if (before or after) else "",
        "ops_reason": ""
        if (before or after)
        else "Operator times come from ONNX Runtime profiling in `einopt optimize --bench` and `einopt bench`.",
        "parts": _parts(shown),
        "rest": _parts(rest),
        "timed_parts": bool(speedups),
        "rest_line": rest_line,
        "traces": [
            p
            for p in _parts(shown)
            if (p["status"] in fmt.CHANGED and p["trace"]) or any(c["depth"] != "0" for c in p["candidates"])
        ],
        "searched_parts": any(p.get("search") for p in report.get("subprograms") or []),
        "blocked": report.get("blocked") or "",
        "symbolic": _symbolic(report.get("symbolic")),
        "notes": [
            t
            for t in (
                fmt.search_summary_text(report),
                fmt.acceptance_text(report),
                fmt.passthrough_text(report.get("subprograms") or []),
            )
            if t
        ]
        + list(report.get("notes") or []),
        "bench": bench,
        "message": (bench or {}).get("message", ""),
        "machine_line": fmt.machine_text(machine),
        "machine": sorted((k, str(v)) for k, v in machine.items()),
        "seconds": [(f"time in {k}", fmt.sig3(v) + " s") for k, v in (report.get("seconds") or {}).items()],
        "tie": f"{fmt.TIE[0]}–{fmt.TIE[1]}",
        "colors": fmt.COLORS,
        "version": machine.get("einopt") or __version__,
        "command": _command(report),
    }
    return _environment().get_template("report.html.j2").render(**context)


def write_html(report: dict, path: str | os.PathLike) -> None:
    """Write :func:`render_html` to ``path`` atomically (a temp file in the same directory, then rename).

    Parameters
    ----------
    report : dict
        The report.
    path : str or path-like
        The HTML file; on failure no partial file is left behind.
    """
    data = render_html(report).encode("utf-8")
    write_atomic(path, lambda f: f.write(data))


# --------------------------------------------------------------------------- screenshot


def find_chromium() -> str | None:
    """The Chromium (or Chrome) executable, or None."""
    for name in CHROMIUM:
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(
    html_path: str | os.PathLike,
    png_path: str | os.PathLike,
    width: int = 1200,
    height: int | None = None,
    timeout: float = 60.0,
) -> None:
    """Render an HTML file in headless Chromium and save a PNG screenshot.

    Parameters
    ----------
    html_path, png_path : str or path-like
        The page and the screenshot to write.
    width : int
        Window width in CSS pixels.
    height : int or None
        Window height; None = the whole page (a generous estimate, blank bottom trimmed).
    timeout : float
        Seconds before Chromium is given up on.

    Raises
    ------
    RuntimeError
        Chromium is missing, fails, times out or writes no PNG.
    """
    exe = find_chromium()
    if exe is None:
        raise RuntimeError("chromium not found (looked for " + ", ".join(CHROMIUM) + "); install chromium")
    html, png = Path(html_path).resolve(), Path(png_path).resolve()
    if not html.is_file():
        raise RuntimeError(f"{html_path}: no such file")
    auto_height = height is None
    height = height or _page_height(html.read_text(encoding="utf-8"), width)
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="einopt-chromium-") as profile:
        cmd = [
            exe,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            f"--window-size={width},{height}",
            html.as_uri(),
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"chromium did not finish within {timeout:g} s") from None
    if done.returncode != 0 or not png.is_file():
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"chromium failed (exit {done.returncode}) and wrote no screenshot:\n{tail}")
    if auto_height:
        _trim_bottom(png)


def _trim_bottom(png: Path, margin: int = 32) -> None:
    """Cut the blank window area below the page (the height was estimated generously)."""
    from matplotlib.image import imread, imsave

    image = imread(str(png))
    rows = (image[..., :3] < 0.98).any(axis=(1, 2)).nonzero()[0]
    if len(rows) and rows[-1] + margin < image.shape[0]:
        imsave(str(png), image[: rows[-1] + margin])


def _page_height(html: str, width: int) -> int:
    """A window height that fits the page: headless screenshots capture the window, not the page."""
    inches = 0.0
    for tag in html.split("<svg ")[1:]:
        head = tag[: tag.index(">")]
        for attr in head.split():
            if attr.startswith('height="'):
                inches += float(attr.split('"')[1].rstrip("pt")) / 72
    rows = html.count("<tr") + html.count("<dt>") + html.count("<li>")
    scale = min(1.0, (width - 80) / (FIG_WIDTH * 96))  # plots shrink to the page width
    return int(
        800
        + inches * 96 * scale
        + rows * 40
        + html.count("<details") * 60
        + html.count("\n", html.find("<pre>")) * 18
    )
