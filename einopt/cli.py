"""The ``einopt`` command line.

Errors are one line on stderr and a non-zero exit code (``-v`` adds the
traceback); the exit codes are listed in ``EXIT_CODES``.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import click
import numpy as np

import einopt
from einopt.errors import ModelError, UnsupportedModelError, VerificationError
from einopt.ir import IRError, Program, Scope, input_tensors

# Distinct exit codes, so scripts can tell failures apart.
EXIT_CODES = {
    "ok": 0,
    "internal": 1,  # a bug in einopt
    "usage": 2,  # bad command line (click's own code)
    "bad_input": 3,  # unreadable file, malformed expression, wrong inputs
    "mismatch": 4,  # results differ: compiled vs interpreter, or optimized vs original model
    "unavailable": 5,  # the target device or toolchain is missing
    "unsupported": 6,  # a valid model einopt cannot process (e.g. too old an opset)
}

_ERROR_CODES = {ModelError: "bad_input", UnsupportedModelError: "unsupported", VerificationError: "mismatch"}

log = logging.getLogger("einopt")


class CliError(Exception):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def _handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn exceptions into one clear line on stderr and a distinct exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        verbose = click.get_current_context().find_root().params.get("verbose", 0)
        try:
            return fn(*args, **kwargs)
        except CliError as e:
            _fail(str(e), e.code, verbose)
        except IRError as e:
            _fail(str(e), "bad_input", verbose)
        except (ModelError, UnsupportedModelError, VerificationError) as e:
            _fail(str(e), _ERROR_CODES[type(e)], verbose)
        except click.ClickException:
            raise
        except Exception as e:  # noqa: BLE001 - the last line of defence for the user
            if type(e).__name__ == "DeviceUnavailableError":
                _fail(str(e), "unavailable", verbose)
            _fail(
                f"internal error: {type(e).__name__}: {e} (please report it; -v shows the traceback)",
                "internal",
                verbose,
            )

    return wrapper


def _fail(message: str, code: str, verbose: int) -> None:
    if verbose:
        import traceback

        traceback.print_exc()
    first, *rest = message.splitlines() or [""]
    click.echo(f"einopt: error: {first}", err=True)
    for line in rest:
        click.echo(f"  {line}", err=True)
    sys.exit(EXIT_CODES[code])


# --------------------------------------------------------------------------
# Loading expressions and inputs
# --------------------------------------------------------------------------


def _example_names() -> list[str]:
    files = resources.files("einopt.examples")
    return sorted(p.name[: -len(".ein")] for p in files.iterdir() if p.name.endswith(".ein"))


def _load_text(source: str | None, expr: str | None, example: str | None) -> tuple[str, str]:
    given = [x for x in (source, expr, example) if x is not None]
    if len(given) != 1:
        raise CliError("give exactly one of FILE, -e/--expr TEXT or --example NAME", "bad_input")
    if expr is not None:
        return expr, "<expr>"
    if example is not None:
        names = _example_names()
        if example not in names:
            raise CliError(f"unknown example {example!r}; bundled examples: {', '.join(names)}", "bad_input")
        return resources.files("einopt.examples").joinpath(f"{example}.ein").read_text(), f"example {example}"
    path = Path(source)
    try:
        return path.read_text(), str(path)
    except OSError as e:
        raise CliError(f"cannot read {source}: {e.strerror or e}", "bad_input") from None
    except UnicodeDecodeError:
        raise CliError(f"{source} is not a text file", "bad_input") from None


def _parse_shapes(specs: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        try:
            if not sep or not name.isidentifier():
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise CliError(
                f"bad --shape {spec!r}: expected NAME=D0,D1,... e.g. A=56,56,64", "bad_input"
            ) from None
    return shapes


def _load_node(
    source: str | None, expr: str | None, example: str | None, shapes: tuple[str, ...]
) -> Scope | Program:
    text, origin = _load_text(source, expr, example)
    from einopt.syntax import ParseError

    try:
        return einopt.parse(text, shapes=_parse_shapes(shapes) or None)
    except ParseError as e:
        message = str(e).replace("or pass shapes=", "or pass --shape NAME=D0,D1,...")
        raise CliError(f"{origin}: {message}", "bad_input") from None


def _make_inputs(node: Scope | Program, npz: str | None, seed: int, integer: bool) -> dict[str, np.ndarray]:
    """Inputs from an .npz file, else seeded random ones (small integers with ``integer``)."""
    tensors = input_tensors(node)
    if npz is not None:
        try:
            with np.load(npz) as data:
                arrays = {k: data[k] for k in data.files}
        except (OSError, ValueError) as e:
            raise CliError(f"cannot read inputs from {npz}: {e}", "bad_input") from None
        missing = [t.name for t in tensors if t.name not in arrays]
        if missing:
            raise CliError(f"{npz} has no array for input(s) {', '.join(missing)}", "bad_input")
        for t in tensors:
            if tuple(arrays[t.name].shape) != t.shape:
                raise CliError(
                    f"input {t.name} in {npz} has shape {list(arrays[t.name].shape)}, expected {list(t.shape)}",
                    "bad_input",
                )
        return {t.name: arrays[t.name] for t in tensors}
    rng = np.random.default_rng(seed)
    if integer:
        return {t.name: rng.integers(-3, 4, size=t.shape).astype(np.float64) for t in tensors}
    return {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in tensors}


def _results(value: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if isinstance(value, dict):
        return value
    return {"result": value}


def _describe(node: Scope | Program) -> list[str]:
    from einopt.keys import key

    kind = f"program with {len(node.bindings)} expressions" if isinstance(node, Program) else "expression"
    ins = ", ".join(f"{t.name}{list(t.shape)}" for t in input_tensors(node))
    return [f"{kind}; inputs {ins}", f"key {key(node)}"]


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------

_source_options = [
    click.argument("source", required=False, metavar="[FILE]"),
    click.option("-e", "--expr", help="The expression text itself instead of a FILE."),
    click.option("--example", help="A bundled example expression (see `einopt examples`)."),
    click.option(
        "--shape",
        "shapes",
        multiple=True,
        metavar="NAME=D0,D1,...",
        help="Shape of an input not declared in the text (repeatable).",
    ),
]
_input_options = [
    click.option(
        "--inputs",
        "npz",
        type=click.Path(dir_okay=False),
        help="Input arrays (.npz, by tensor name); default: seeded random.",
    ),
    click.option("--seed", default=0, show_default=True, help="Seed for random inputs."),
]


def _with_source(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(_source_options):
        fn = opt(fn)
    return fn


def _with_inputs(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(_input_options):
        fn = opt(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(einopt.__version__, prog_name="einopt")
@click.option("-v", "--verbose", count=True, help="More detail (tracebacks on errors, debug logs).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors.")
def main(verbose: int, quiet: bool) -> None:
    """einopt: a derivation-based superoptimizer for tensor programs.

    Expressions use the text syntax described in the README, e.g.

      L[h:56, w:56, f:64] Sum[r:3, s:3, c:64] A[h+r-1, w+s-1, c] * K[r, s, f, c]
      where A: [56, 56, 64], K: [3, 3, 64, 64]
    """
    level = logging.WARNING
    if verbose:
        level = logging.DEBUG if verbose > 1 else logging.INFO
    if quiet:
        level = logging.ERROR
    logging.basicConfig(level=level, format="einopt: %(levelname)s: %(message)s")


@main.command()
@_with_source
@_with_inputs
@click.option(
    "--mode",
    type=click.Choice(["float64", "float32", "int"]),
    default="float64",
    show_default=True,
    help="Interpreter arithmetic; `int` is exact integer mode (random inputs are small integers).",
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write the result(s) to this .npz file."
)
@_handle_errors
def eval(source, expr, example, shapes, npz, seed, mode, output) -> None:  # noqa: A001 - the command's name
    """Evaluate an expression or program with the reference interpreter."""
    node = _load_node(source, expr, example, shapes)
    inputs = _make_inputs(node, npz, seed, integer=mode == "int")
    start = time.perf_counter()
    results = _results(einopt.evaluate(node, inputs, mode=mode))
    elapsed = time.perf_counter() - start
    quiet = click.get_current_context().find_root().params["quiet"]
    if not quiet:
        for line in _describe(node):
            click.echo(line)
        for name, arr in results.items():
            click.echo(
                f"{name}: shape {list(arr.shape)}, sum {arr.sum():.6g}, mean |x| {np.abs(arr).mean():.6g}"
            )
        click.echo(f"evaluated in {elapsed * 1e3:.1f} ms ({mode})")
    if output:
        _save_npz(output, results)


def _save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    write_atomic(path, lambda f: np.savez(f, **arrays))


def write_atomic(path: str, write: Callable[[Any], None]) -> None:
    """:func:`einopt.modelio.write_atomic`, with a failure as a ``bad_input`` error naming the file."""
    from einopt.modelio import write_atomic as write_file

    try:
        write_file(path, write)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror or e}", "bad_input") from None


@main.command()
@_with_source
@_with_inputs
@click.option(
    "--target",
    type=click.Choice(["llvm", "cuda"]),
    default="llvm",
    show_default=True,
    help="Code generation target.",
)
@click.option(
    "--emit",
    type=click.Choice(["none", "tir", "cuda"]),
    default="none",
    show_default=True,
    help="Print the generated code.",
)
@click.option(
    "--check/--no-check",
    default=True,
    show_default=True,
    help="Run on the inputs and compare with the interpreter.",
)
@click.option(
    "--repeat", default=20, show_default=True, help="Timed runs of the compiled kernel (median reported)."
)
@_handle_errors
def compile(source, expr, example, shapes, npz, seed, target, emit, check, repeat) -> None:  # noqa: A001
    """Compile an expression or program with TVM and check it against the interpreter."""
    node = _load_node(source, expr, example, shapes)
    quiet = click.get_current_context().find_root().params["quiet"]
    if emit == "cuda":
        click.echo(einopt.cuda_source(node))
        if target == "llvm" and not check:
            return
    start = time.perf_counter()
    kernel = einopt.compile(node, target=target)
    build = time.perf_counter() - start
    if emit == "tir":
        click.echo(kernel.source)
    if not quiet:
        for line in _describe(node):
            click.echo(line)
        click.echo(f"compiled for {target} in {build * 1e3:.0f} ms")
    if not check:
        return
    inputs = _make_inputs(node, npz, seed, integer=False)
    got = _results(kernel(**inputs))
    want = _results(einopt.evaluate(node, inputs))
    times = []
    for _ in range(max(repeat, 1)):
        t0 = time.perf_counter()
        kernel(**inputs)
        times.append(time.perf_counter() - t0)
    for name in want:
        err = float(np.max(np.abs(got[name] - want[name]))) if want[name].size else 0.0
        scale = float(np.max(np.abs(want[name]))) if want[name].size else 0.0
        ok = np.allclose(got[name], want[name], rtol=1e-4, atol=1e-4 * max(scale, 1.0))
        if not quiet:
            click.echo(f"{name}: max |compiled - interpreter| = {err:.3g} ({'ok' if ok else 'MISMATCH'})")
        if not ok:
            raise CliError(
                f"compiled {name} differs from the interpreter (max abs error {err:.3g})", "mismatch"
            )
    if not quiet:
        click.echo(f"median run time {np.median(times) * 1e3:.3f} ms over {len(times)} runs")


@main.command()
@_with_source
@_handle_errors
def key(source, expr, example, shapes) -> None:
    """Print the canonical key (fingerprint) of an expression or program."""
    from einopt.keys import key as canonical_key

    click.echo(canonical_key(_load_node(source, expr, example, shapes)))


@main.command(name="fmt")
@_with_source
@_handle_errors
def fmt(source, expr, example, shapes) -> None:
    """Parse an expression or program and print it in canonical text form."""
    click.echo(einopt.format_expr(_load_node(source, expr, example, shapes)))


@main.command()
def examples() -> None:
    """List the bundled example expressions."""
    for name in _example_names():
        text = resources.files("einopt.examples").joinpath(f"{name}.ein").read_text()
        first = next((ln.lstrip("# ").strip() for ln in text.splitlines() if ln.startswith("#")), "")
        click.echo(f"{name:28s} {first}")


# The ONNX commands (optimize, inspect) and the rule commands (rules, derive) live in their own
# modules; importing them registers them.
from einopt import cli_bench, cli_model, cli_rules, cli_zoo  # noqa: E402, F401

if __name__ == "__main__":  # `python -m einopt.cli`: run the registered command group, not this copy's
    from einopt.cli import main as registered

    registered()
