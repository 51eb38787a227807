"""Options and output shared by several commands: the benchmark options of
``optimize --bench`` and ``bench``, output-path checks, and the JSON/HTML reports.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from einopt.cli.app import CliError, console, is_quiet

bench_options = [
    click.option(
        "--budget",
        default=30.0,
        show_default=True,
        type=click.FloatRange(min=0.1),
        help="Seconds of timed runs for the whole-model comparison (the minimum run count wins if longer).",
    ),
    click.option(
        "--min-runs",
        default=10,
        show_default=True,
        type=click.IntRange(min=1),
        help="Runs per model, at least.",
    ),
    click.option(
        "--max-runs",
        default=200,
        show_default=True,
        type=click.IntRange(min=1),
        help="Runs per model, at most.",
    ),
    click.option(
        "--threads",
        type=click.IntRange(min=1),
        help="ONNX Runtime intra-op threads (one global pool; default: every core).",
    ),
    click.option(
        "--html", "html_path", type=click.Path(dir_okay=False), help="Write an HTML report with plots here."
    ),
]


def with_bench_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add :data:`bench_options` to a command."""
    for option in reversed(bench_options):
        fn = option(fn)
    return fn


def check_writable(*paths: str | None) -> None:
    """Fail before a long run, not after it, when an output's directory does not exist."""
    for path in paths:
        if path and not Path(path).resolve().parent.is_dir():
            raise CliError(f"cannot write {path}: directory {Path(path).parent} does not exist", "bad_input")


def check_runs(min_runs: int, max_runs: int) -> None:
    """Refuse ``--max-runs`` below ``--min-runs`` as a usage error."""
    if max_runs < min_runs:
        raise click.UsageError(f"--max-runs {max_runs} is below --min-runs {min_runs}")


def write_atomic(path: str, write: Callable[[Any], None]) -> None:
    """:func:`einopt.runtime.modelio.write_atomic`, with a failure as a ``bad_input`` error naming the file."""
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.runtime.modelio import write_atomic as write_file

    try:
        write_file(path, write)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror or e}", "bad_input") from None


def write_report(report: dict, json_path: str | None, html_path: str | None) -> None:
    """Write the JSON and HTML reports (atomically) that were asked for, with the command line."""
    report["command"] = shlex.join(["einopt", *sys.argv[1:]])
    if json_path:
        write_atomic(json_path, lambda f: f.write((json.dumps(report, indent=2) + "\n").encode()))
    if html_path:
        # jinja2, matplotlib: loaded when the command runs, so that `einopt --help` stays fast
        from einopt.reports.report_html import write_html

        write_html(report, html_path)


def show_report(report: dict) -> None:
    """Print a report's tables, unless ``-q``."""
    if is_quiet():
        return
    # loaded when the command runs, so that `einopt --help` stays fast
    from einopt.reports.report import print_report

    print_report(report, console())
