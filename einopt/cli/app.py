"""The ``einopt`` command group, its exit codes and its error handling.

Errors are one line on stderr and a non-zero exit code (``-v`` adds the
traceback); the exit codes are listed in ``EXIT_CODES``. The commands live in
the sibling modules, which register themselves on :data:`main`.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

import einopt
from einopt.core.ir import IRError
from einopt.errors import ModelError, UnsupportedModelError, VerificationError

if TYPE_CHECKING:
    import rich.console

# Distinct exit codes, so scripts can tell failures apart.
EXIT_CODES = {
    "ok": 0,
    "internal": 1,  # a bug in einopt
    "usage": 2,  # bad command line (click's own code)
    "bad_input": 3,  # unreadable file, malformed expression, wrong inputs
    "mismatch": 4,  # results differ: compiled vs interpreter, or optimized vs original model
    "unavailable": 5,  # the target device or toolchain is missing
    "unsupported": 6,  # a valid model einopt cannot process (e.g. too old an opset)
    "interrupted": 130,  # Ctrl-C (128 + SIGINT, as shells report it)
}

_ERROR_CODES = {
    IRError: "bad_input",
    ModelError: "bad_input",
    UnsupportedModelError: "unsupported",
    VerificationError: "mismatch",
}


class CliError(Exception):
    """A failure to report as one line and the exit code named by ``code`` (a key of ``EXIT_CODES``)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a command so that exceptions become one clear line on stderr and a distinct exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        verbose = click.get_current_context().find_root().params.get("verbose", 0)
        try:
            result = fn(*args, **kwargs)
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter shutdown
            return result
        except BrokenPipeError:
            _exit_on_closed_pipe()
        except KeyboardInterrupt:
            # Output files are written to a temporary name and renamed last, so none is left half done.
            _fail("interrupted", "interrupted", verbose)
        except CliError as e:
            _fail(str(e), e.code, verbose)
        except tuple(_ERROR_CODES) as e:
            _fail(str(e), _ERROR_CODES[next(c for c in type(e).__mro__ if c in _ERROR_CODES)], verbose)
        except click.ClickException:
            raise
        except Exception as e:  # noqa: BLE001 - the last line of defence for the user
            if type(e).__name__ in ("DeviceUnavailableError", "NativeBuildError", "CacheTrustError"):
                _fail(str(e), "unavailable", verbose)
            _fail(
                f"internal error: {type(e).__name__}: {e} (please report it; -v shows the traceback)",
                "internal",
                verbose,
            )

    return wrapper


def console(min_width: int = 0) -> rich.console.Console:
    """A rich console on stdout, at least ``min_width`` wide, that exits like the commands on a closed pipe."""
    from rich.console import Console

    out = Console()
    if out.width < min_width:
        out = Console(width=min_width)
    out.on_broken_pipe = _exit_on_closed_pipe  # rich's own exits with code 1
    return out


def _exit_on_closed_pipe() -> None:
    """The reader of stdout went away (``einopt inspect m.onnx | head``): a normal, quiet exit.

    Output still buffered cannot be written; stdout is pointed at /dev/null so
    that the interpreter's final flush does not fail again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(EXIT_CODES["ok"])


def _fail(message: str, code: str, verbose: int) -> None:
    if verbose:
        import traceback

        traceback.print_exc()
    first, *rest = message.splitlines() or [""]
    click.echo(f"einopt: error: {first}", err=True)
    for line in rest:
        click.echo(f"  {line}", err=True)
    sys.exit(EXIT_CODES[code])


def is_quiet() -> bool:
    """Whether ``-q`` was given: print nothing but errors."""
    return bool(click.get_current_context().find_root().params["quiet"])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(einopt.__version__, prog_name="einopt")
@click.option("-v", "--verbose", count=True, help="More detail (tracebacks on errors, debug logs).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors.")
def main(verbose: int, quiet: bool) -> None:
    """einopt: a derivation-based superoptimizer for tensor programs.

    Expressions use the text syntax of docs/expressions.md, e.g.

      L[h:56, w:56, f:64] Sum[r:3, s:3, c:64] A[h+r-1, w+s-1, c] * K[r, s, f, c]
      where A: [56, 56, 64], K: [3, 3, 64, 64]
    """
    level = logging.WARNING
    if verbose:
        level = logging.DEBUG if verbose > 1 else logging.INFO
    if quiet:
        level = logging.ERROR
    logging.basicConfig(level=level, format="einopt: %(levelname)s: %(message)s")
    if not quiet and not verbose:  # building a model's kernels on first use takes seconds: say so
        logging.getLogger("einopt.backends.tvm.kernels").setLevel(logging.INFO)
