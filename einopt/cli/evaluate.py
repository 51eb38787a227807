"""``einopt evaluate``: the evaluation (:mod:`einopt.evaluation.run`) from the command line."""

from __future__ import annotations

import sys

import click

from einopt.cli.app import main


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def evaluate(argv: tuple[str, ...]) -> None:
    """Optimize and benchmark the evaluation models and the shared exporter models (run in the
    checkout; `einopt evaluate --help` lists the options)."""
    # The evaluation parses its own options (one parser for this command and scripts/evaluate.py).
    from einopt.evaluation.run import main as run

    sys.exit(run(list(argv), prog="einopt evaluate"))
