"""The report renderers (rich terminal tables, self-contained HTML) on hand-built report dicts.

The reports here are built by hand (not by running a benchmark), so every
shape of report is covered quickly: timed, untimed, bench-only, unequal
models, rolled-back parts, a ResNet-sized model with 60 subprograms.
"""

from __future__ import annotations

import copy
import html.parser
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from einopt.errors import ModelError
from einopt.reports.report import (
    COLORS,
    NOT_MEASURED,
    TIE_TEXT,
    ms_text,
    ops_text,
    print_report,
    shorten,
    sig3,
    speedup_text,
    validate_report,
)
from einopt.reports.report_html import op_time_rows, render_html, screenshot, write_html

TRACE = "Conv(x, w) + b\n  = sum_{c,r,s} x[n,c,h+r,w+s] w[k,c,r,s] + b[k]   (conv_to_sum)\n  -> fuse_bias"


def _timing(median, kernels, by_op):
    return {
        "median_ms": median,
        "p10_ms": median * 0.97,
        "p90_ms": median * 1.06,
        "min_ms": median * 0.95,
        "nodes": kernels + 2,
        "kernels": kernels,
        "flops": 1_820_000_000,
        "bytes": 44_700_000,
        "time_by_op": by_op,
    }


def _part(i, status="accepted", speedup=1.3, name=None):
    rewritten = status == "accepted"
    return {
        "name": name or f"/layer{i}/conv{i}/Conv",
        "kind": "passthrough" if status == "passed through" else "linear",
        "ops": ["Conv", "Add"] if status != "passed through" else ["Relu"],
        "status": status,
        "reason": {"rolled back": "slower than the original", "passed through": "activation"}.get(status, ""),
        "new_ops": ["Conv"] if status != "passed through" else [],
        "expression": "y = L[k:8] Sum[c:4] x[c] * w[c, k]\nreturn y" if rewritten else "",
        "max_error": 2.4e-7 if rewritten else None,
        "trace": TRACE if rewritten else "",
        "bench": {"original_ms": 1.0 * speedup, "optimized_ms": 1.0, "speedup": speedup}
        if rewritten
        else None,
    }


def _bench(speedup=1.25, equal=True):
    ops = {f"Op{i}": 0.1 * (i + 1) for i in range(15)} | {"Conv": 9.0, "Add": 1.2}
    after = dict(ops) | {"Conv": 7.2}
    del after["Add"]
    return {
        "machine": {
            "onnxruntime": "1.31.1",
            "cpu": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
            "threads": 2,
            "cores": 2,
            "python": "3.11.7",
            "einopt": "0.1.0",
            "platform": "Linux-6.1-x86_64",
        },
        "equal": equal,
        "max_error": 3.0e-7 if equal else 0.5,
        "message": "" if equal else "output 'y' differs: max abs error 0.5 > 1e-4",
        "runs": 50,
        "warmup": 5,
        "original": _timing(12.5 * speedup, 40, ops) if equal else None,
        "optimized": _timing(12.5, 37, after) if equal else None,
        "speedup": speedup if equal else None,
    }


def sample_report(parts=3, bench=True, speedups=(1.42, 0.71, 1.01)):
    """A full report: timed, with rewritten, rolled-back and passed-through subprograms and traces."""
    subs = [_part(i, speedup=speedups[i % len(speedups)]) for i in range(parts)]
    subs += [_part(parts, status="rolled back"), _part(parts + 1, status="passed through")]
    return {
        "einopt_report": 3,
        "model": "models/resnet18.onnx",
        "output": "out/resnet18.opt.onnx",
        "verified": True,
        "blocked": "",
        "notes": ["2 parts with symbolic shapes passed through (pin them with --input-shape)"],
        "counts": {
            "nodes": 69,
            "translated": 50,
            "passed_through": 17,
            "subprograms": parts + 1,
            "rewritten": parts + 1,
            "accepted": parts,
            "unchanged": 0,
            "not_faster": 0,
            "rolled_back": 1,
            "failed": 0,
        },
        "seconds": {"prepare": 0.1, "translate": 0.4, "search": 2.5, "instantiate": 0.2},
        "acceptance": {
            "mode": "measured",
            "timed": True,
            "noise_band": 0.05,
            "rounds": [],
            "cache": {"path": "/tmp/cache.sqlite", "hits": 1, "measured": 3},
            "unreliable": [],
        },
        "subprograms": subs,
        "bench": _bench() if bench else None,
        "command": ["einopt", "optimize", "models/resnet18.onnx", "--bench"],
    }


def no_bench_report():
    report = sample_report(bench=False)
    for p in report["subprograms"]:
        p["bench"] = None
    return report


def bench_only_report(equal=True):
    return {
        "einopt_report": 3,
        "model": "a.onnx",
        "output": "b.onnx",
        "verified": equal,
        "blocked": "",
        "notes": [],
        "counts": {},
        "seconds": {},
        "acceptance": {},
        "subprograms": [],
        "bench": _bench(speedup=1.02, equal=equal),
    }


def big_report():
    """ResNet-sized: 60 subprograms, 38 of them rewritten and timed."""
    subs = [_part(i, speedup=0.6 + 0.03 * i) for i in range(38)]
    subs += [_part(i, status="passed through") for i in range(38, 58)]
    subs += [_part(58, status="rolled back"), _part(59, name="/a/very/long/name/" * 6 + "Conv", speedup=2.5)]
    return sample_report() | {"subprograms": subs}


SAMPLES = {
    "full": sample_report,
    "no bench": lambda: no_bench_report(),
    "bench only": bench_only_report,
    "unequal": lambda: bench_only_report(equal=False),
    "big": big_report,
}


def terminal(report) -> str:
    console = Console(record=True, width=120, file=io.StringIO())
    print_report(report, console)
    return console.export_text()


class _Parser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> _Parser:
    p = _Parser()
    p.feed(page)
    p.close()
    return p


# --------------------------------------------------------------------------- formatting


@pytest.mark.parametrize(
    "ms, text",
    [(12.345, "12.3 ms"), (0.01234, "0.0123 ms"), (123.4, "123 ms"), (1.5, "1.5 ms"), (2345.0, "2.35 s")],
)
def test_ms_text_three_significant_digits(ms, text):
    assert ms_text(ms) == text


def test_small_formatters():
    assert speedup_text(1.234) == "1.23x" and speedup_text(None) == "-"
    assert sig3(0.000123456) == "0.000123" and sig3(99.96) == "100"
    assert ops_text(["Conv", "Add", "Add", "Relu"]) == "Conv Add×2 Relu"
    assert len(shorten("x" * 100, 30)) == 30 and shorten("short") == "short"
    assert op_time_rows({f"o{i}": i for i in range(20)}, {})[-1][0] == "other (8)"


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_samples_validate(name):
    validate_report(SAMPLES[name]())


def _broken(path, value):
    report = sample_report()
    node = report
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return report


@pytest.mark.parametrize(
    "path, value, named",
    [
        (("verified",), KeyError, "'verified'"),
        (("einopt_report",), 1, "'einopt_report'"),
        (("notes",), "a note", "'notes'"),
        (("subprograms", 1, "status"), "done", "'subprograms[1].status'"),
        (("subprograms", 0, "bench", "speedup"), "fast", "'subprograms[0].bench.speedup'"),
        (("bench", "original", "kernels"), 3.5, "'bench.original.kernels'"),
        (("bench", "equal"), KeyError, "'bench.equal'"),
        (("counts", "nodes"), True, "'counts.nodes'"),
    ],
)
def test_validate_names_the_bad_key(path, value, named):
    with pytest.raises(ModelError, match=re.escape(named)):
        validate_report(_broken(path, value))


# --------------------------------------------------------------------------- terminal


def test_terminal_full_report():
    text = terminal(sample_report())
    assert "1.25x" in text and "40" in text and "37" in text  # speedup and kernels before/after
    assert "15.6 ms" in text and "12.5 ms" in text and "p10-p90" in text
    assert "1.82 GFLOP" in text and "44.7 MB" in text
    assert "rolled back" in text and "1.42x" in text and "0.71x" in text
    assert "Intel(R) Xeon(R)" in text and "onnxruntime 1.31.1" in text
    assert "symbolic shapes" in text


def test_terminal_marks_ties():
    text = terminal(bench_only_report())
    assert "1.02x" in text and TIE_TEXT in text
    assert TIE_TEXT not in terminal(sample_report())


def test_terminal_without_bench():
    text = terminal(no_bench_report())
    assert NOT_MEASURED in text and "rewritten" in text


def test_terminal_unequal_models():
    text = terminal(bench_only_report(equal=False))
    assert "the models differ" in text and "max abs error 0.5" in text and "not timed" in text
    assert re.search(r"\d\.\d\dx", text) is None  # no speedup of models that compute different things


def test_terminal_big_model_summarises_passed_through():
    text = terminal(big_report())
    assert "20 more subprograms unchanged or passed through" in text
    assert "/layer58/" in text and "/layer30/" in text and "/layer40/" not in text


# --------------------------------------------------------------------------- HTML


def test_html_full_report_has_two_plots_and_traces():
    page = render_html(sample_report())
    p = parse(page)
    assert p.tags.count("svg") == 2 and "script" not in p.tags
    text = " ".join(p.text)
    assert "models/resnet18.onnx" in text and "1.25x" in text and "conv_to_sum" in text
    assert p.tags.count("details") == 3  # one per rewritten part with a trace
    assert "einopt optimize models/resnet18.onnx --bench" in text and "rolled back" in text
    assert COLORS["faster"] in page and COLORS["slower"] in page


@pytest.mark.parametrize("name, plots", [("no bench", 0), ("bench only", 1), ("unequal", 0), ("big", 2)])
def test_html_other_reports(name, plots):
    report = SAMPLES[name]()
    p = parse(render_html(report))
    assert p.tags.count("svg") == plots
    text = " ".join(p.text)
    expected = {
        "no bench": "per-subprogram times are measured by `einopt optimize --bench`",
        "bench only": "it has no subprograms",
        "unequal": "The models differ.",
        "big": "20 more subprograms unchanged or passed through (Relu×20)",
    }[name]
    assert expected.lower() in text.lower()


def test_html_no_rewrite_says_why():
    report = sample_report()
    report["subprograms"] = [_part(0, status="unchanged"), _part(1, status="passed through")]
    assert "No subprogram was rewritten" in render_html(report)


def test_html_escapes_hostile_names():
    report = sample_report()
    report["subprograms"][0]["name"] = "<script>alert(1)</script>"
    report["notes"] = ["<img src=x onerror=alert(1)>"]
    report["model"] = "<b>m</b>.onnx"
    page = render_html(report)
    assert "<script>" not in page and "<img" not in page and "<b>" not in page
    assert "&lt;script&gt;" in page and "script" not in parse(page).tags


def test_html_is_deterministic():
    assert render_html(big_report()) == render_html(big_report())


def test_big_model_plot_is_sized_by_rows():
    small = re.search(r'<svg[^>]*height="([\d.]+)pt"', render_html(sample_report())).group(1)
    big = re.search(r'<svg[^>]*height="([\d.]+)pt"', render_html(big_report())).group(1)
    assert float(big) > 4 * float(small)


def test_write_html_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "r.html"
    write_html(sample_report(), path)
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    broken = copy.deepcopy(sample_report())
    broken["bench"]["original"]["time_by_op"] = {"Conv": "slow"}  # fails while rendering
    with pytest.raises(TypeError):
        write_html(broken, path)
    assert sorted(os.listdir(tmp_path)) == ["r.html"]


@pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="needs /usr/bin/chromium")
def test_chromium_screenshot_is_not_blank(tmp_path):
    import numpy as np
    from matplotlib.image import imread

    html_path, png_path = tmp_path / "r.html", tmp_path / "r.png"
    write_html(sample_report(), html_path)
    screenshot(html_path, png_path, width=1000)
    image = imread(str(png_path))[..., :3]
    assert image.shape[1] == 1000 and image.shape[0] > 800
    pixels = np.round(image.reshape(-1, 3) * 255).astype(int)
    colours = np.unique(pixels // 8, axis=0)
    assert len(colours) > 20
    for name in ("faster", "slower", "optimized"):
        rgb = np.array([int(COLORS[name][i : i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(pixels - rgb).max(axis=1) <= 6).sum() > 50, name


def test_screenshot_errors_are_clear(tmp_path, monkeypatch):
    import einopt.reports.report_html as report_html

    page = tmp_path / "r.html"
    page.write_text("<p>x</p>")
    monkeypatch.setattr(report_html, "CHROMIUM", ("/nonexistent/chromium",))
    with pytest.raises(RuntimeError, match="chromium not found"):
        screenshot(page, tmp_path / "x.png")


def test_screenshot_script_fails_cleanly(tmp_path):
    script = Path(__file__).resolve().parents[1] / "scripts" / "screenshot.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "missing.html"), str(tmp_path / "x.png")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "screenshot:" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.png").exists()


def test_machine_line_shows_load_average():
    report = bench_only_report()
    report["bench"]["machine"]["load"] = [1.5, 0.75, 0.25]
    assert "load 1.50 0.75 0.25" in terminal(report)
