"""``einopt bench``: two ONNX models side by side in ONNX Runtime (options shared with
``einopt optimize --bench`` are in :mod:`einopt.cli.options`).
"""

from __future__ import annotations

import click

from einopt.cli.app import CliError, handle_errors, main
from einopt.cli.options import check_runs, check_writable, show_report, with_bench_options, write_report


@main.command()
@click.argument("original", metavar="ORIGINAL", type=click.Path(dir_okay=False))
@click.argument("optimized", metavar="OPTIMIZED", type=click.Path(dir_okay=False))
@click.option(
    "--inputs",
    "npz",
    type=click.Path(dir_okay=False),
    help="Inputs to run on (.npz by input name; default: seeded random).",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write a JSON report here.")
@click.option("--force", is_flag=True, help="Time the models even when their outputs differ.")
@with_bench_options
@handle_errors
def bench(original, optimized, npz, seed, report_path, force, budget, min_runs, max_runs, threads, html_path):
    """Time two models side by side in ONNX Runtime (outputs checked equal first).

    Both run in one process on one global thread pool, interleaved, after a
    warm-up; the report gives medians with the p10-p90 spread, the ratio,
    kernels executed, FLOPs and bytes, and the machine. Ratios between 0.95
    and 1.05 are within this machine's noise.
    """
    check_runs(min_runs, max_runs)
    check_writable(report_path, html_path)
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.runtime import bench as benchmark

    section = benchmark.bench_models(
        original,
        optimized,
        npz,
        threads=threads,
        seed=seed,
        budget_s=budget,
        min_runs=min_runs,
        max_runs=max_runs,
        force=force,
    )
    report = bench_only_report(original, optimized, section)
    write_report(report, report_path, html_path)
    show_report(report)
    if not section["equal"]:
        raise CliError(
            f"{optimized} differs from {original}: {section['message']}"
            + ("" if force else " (not timed; --force times them anyway)"),
            "mismatch",
        )


def bench_only_report(original: str, optimized: str, section: dict) -> dict:
    """A report with no optimization behind it: just the side-by-side benchmark."""
    # loaded when the command runs, so that `einopt --help` stays fast
    from einopt.reports.report import REPORT_VERSION

    return {
        "einopt_report": REPORT_VERSION,
        "model": str(original),
        "output": str(optimized),
        "verified": bool(section["equal"]),
        "blocked": "",
        "notes": [],
        "counts": {},
        "seconds": {},
        "acceptance": {},
        "subprograms": [],
        "bench": section,
    }
