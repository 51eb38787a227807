"""The ``einopt`` command line: :data:`main` is the command group (the ``einopt`` script).

:mod:`einopt.cli.app` defines the group, its exit codes and error handling;
each command module registers its commands on the group when imported:
:mod:`~einopt.cli.expr` (eval, compile, key, fmt, examples),
:mod:`~einopt.cli.model` (optimize, inspect), :mod:`~einopt.cli.bench`,
:mod:`~einopt.cli.rules` (rules, derive), :mod:`~einopt.cli.search` and
:mod:`~einopt.cli.zoo` (models) and :mod:`~einopt.cli.evaluate`.
Heavy imports (onnxruntime, TVM, the pipeline) happen inside the commands, so
``einopt --help`` stays fast.
"""

from einopt.cli import bench, evaluate, expr, model, rules, search, zoo  # noqa: F401 - importing registers the commands
from einopt.cli.app import EXIT_CODES, CliError, main

__all__ = ["EXIT_CODES", "CliError", "main"]
