"""Searches bounded by states give the same output whatever the machine's load.

Each command runs twice, as a subprocess, while other processes keep every
core busy: the state budget, not the clock, decides where each search stops,
so the outputs are byte for byte the same (the search's own timings aside).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import onnx
import pytest
from onnx_models import lstm_cell

# Spinning every core would slow the quick tier's other tests (two workers share two cores): the slow tier.
pytestmark = pytest.mark.slow


def _spin(stop) -> None:
    while not stop.is_set():
        pass


@pytest.fixture
def busy_cores():
    """Every core kept busy by a spinning process for the duration of the test."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    spinners = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 2)]
    for p in spinners:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in spinners:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def _einopt(*args, cwd) -> subprocess.CompletedProcess:
    # From cwd (outside the checkout): there the installed package is imported, not the source folder.
    return subprocess.run(
        [sys.executable, "-P", "-m", "einopt", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )


def _without_seconds(stats: dict) -> dict:
    out = {k: v for k, v in stats.items() if k != "seconds"}
    out["rules"] = {k: {n: x for n, x in r.items() if n != "seconds"} for k, r in stats["rules"].items()}
    return out


def test_search_with_max_states_is_the_same_under_load(tmp_path, busy_cores):
    # 656 states to depth 4: 300 cut it short, in a frontier split over the two workers.
    args = ("search", "--example", "conv3x3_offset_reduce", "--max-depth", 4, "--max-states", 300)
    runs = [json.loads(_einopt(*args, "--jobs", 2, "--top", 20, "--json", cwd=tmp_path).stdout) for _ in "ab"]
    assert runs[0]["stats"]["stopped"] == "states" and runs[0]["stats"]["generated"] == 300
    assert len(runs[0]["candidates"]) > 1
    assert runs[0]["candidates"] == runs[1]["candidates"]
    assert _without_seconds(runs[0]["stats"]) == _without_seconds(runs[1]["stats"])


def test_optimize_with_max_states_writes_the_same_model_under_load(tmp_path, busy_cores):
    src = tmp_path / "lstm.onnx"
    onnx.save(lstm_cell(hidden=4), src)
    outputs = []
    for run in "ab":
        out, report = tmp_path / f"{run}.onnx", tmp_path / f"{run}.json"
        _einopt(
            *("optimize", src, "-o", out, "--accept", "verified", "--no-cache", "--jobs", 2),
            *("--max-states", 400, "--model-states", 800, "--report", report),
            cwd=tmp_path,
        )
        outputs.append(out.read_bytes())
        searches = [p["search"] for p in json.loads(report.read_text())["subprograms"] if p["search"]]
        # the gates' search (3,200 states to complete) was cut by its states, and still rewrote them
        assert any(s["stats"].get("stopped") == "states" for s in searches), searches
    assert outputs[0] == outputs[1]
    assert outputs[0] != src.read_bytes()
