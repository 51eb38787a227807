"""Two models timed side by side in fresh processes, the reading a user of the output will get.

A whole-model timing moves from one process to the next by more than the
whole-model band, even with interleaved runs and paired ratios: on a 2-vCPU
VM the same pair (a residual block whose Add-Relu became a generated kernel)
read 1.05x in the optimizing process, 95% confident within 1.051-1.054x, and
1.05x, 1.02x, 0.98x, 0.97x in four fresh ``einopt bench`` processes after it.
Where a process's buffers land, which pages are huge and what the process
did before (a search, TVM compilation) are fixed for its lifetime, so more
runs in one process cannot average them out; more processes can. New
sessions in the same process move too (that pair, on inputs copied to
different alignments, read 1.00-1.08x from one pair of sessions to the
next, each 95% interval about 1% wide), but a new process also draws a new
address-space layout and starts clean.
:func:`time_fresh` times the pair in each of several new Python processes
(one after another, never side by side) and returns the least of their
readings: a gain is kept only when every process saw it.

``python -m einopt.runtime.fresh DIR`` is the child: it times ``DIR/before.onnx``
against ``DIR/after.onnx`` on ``DIR/feeds.npz`` with the settings in
``DIR/settings.json`` and writes ``DIR/timing-K.json``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from einopt.runtime import modelio
from einopt.runtime.bench import time_models
from einopt.runtime.timing import Comparison, configure_threads

log = logging.getLogger(__name__)

PROCESSES = 3
"""Fresh processes a whole-model confirmation is timed in (each must confirm the gain). With readings
that spread by about 3% from one process to the next, a tie passes a 2% band in all three about
once in 60 confirmations and a model 3% slower practically never; a 5% gain passes about three
times in five (the spread measured in this module's docstring)."""


class FreshProcessError(RuntimeError):
    """A child process could not time the models (its error output is the message)."""


def time_fresh(
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    processes: int = PROCESSES,
    min_runs: int = 10,
    max_runs: int = 200,
    budget_s: float = 20.0,
) -> list[Comparison]:
    """``after`` against ``before`` on ``feeds``, timed in each of ``processes`` new Python processes.

    Each child configures the same thread pool as this process (see
    :func:`einopt.runtime.timing.configure_threads`) and times the models with
    :func:`einopt.runtime.bench.time_models` (``min_runs``, ``max_runs``,
    ``budget_s`` as there). The models and feeds go to a temporary directory,
    removed afterwards.

    Returns
    -------
    list of Comparison
        One reading per process, in order.

    Raises
    ------
    FreshProcessError
        A child failed (a crash, memory): its last lines of error output say why.
    """
    with tempfile.TemporaryDirectory(prefix="einopt-fresh-") as tmp:
        d = Path(tmp)
        modelio.save_model(before, d / "before.onnx")
        modelio.save_model(after, d / "after.onnx")
        np.savez(d / "feeds.npz", *(np.asarray(v) for v in feeds.values()))  # names need not be file names
        settings = {
            "inputs": list(feeds),
            "threads": configure_threads(),
            "min_runs": min_runs,
            "max_runs": max_runs,
            "budget_s": budget_s,
        }
        (d / "settings.json").write_text(json.dumps(settings))
        readings = []
        for k in range(processes):
            done = subprocess.run(
                [sys.executable, "-m", "einopt.runtime.fresh", str(d), str(k)],
                capture_output=True,
                text=True,
                check=False,
            )
            out = d / f"timing-{k}.json"
            if done.returncode != 0 or not out.exists():
                tail = "\n".join(done.stderr.strip().splitlines()[-5:]) or f"exit status {done.returncode}"
                raise FreshProcessError(f"timing the models in a fresh process failed: {tail}")
            readings.append(Comparison.from_stored(json.loads(out.read_text())))
            log.debug("fresh process %d: %.3fx", k + 1, readings[-1].speedup)
        return readings


def least(readings: list[Comparison]) -> Comparison:
    """The reading with the lowest 95% bound on its speedup: what every process saw at least."""
    return min(readings, key=lambda c: c.gain_interval[0])


def _child(directory: str, index: str) -> None:
    d = Path(directory)
    settings = json.loads((d / "settings.json").read_text())
    configure_threads(settings["threads"])
    with np.load(d / "feeds.npz") as data:
        feeds = {name: data[f"arr_{k}"] for k, name in enumerate(settings["inputs"])}
    c = time_models(
        modelio.load_model(d / "before.onnx"),
        modelio.load_model(d / "after.onnx"),
        feeds,
        min_runs=settings["min_runs"],
        max_runs=settings["max_runs"],
        budget_s=settings["budget_s"],
    )
    (d / f"timing-{index}.json").write_text(json.dumps(c.stored()))


if __name__ == "__main__":
    _child(*sys.argv[1:3])
