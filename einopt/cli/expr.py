"""The expression commands: ``eval``, ``compile``, ``key``, ``fmt`` and ``examples``."""

from __future__ import annotations

import time

import click
import numpy as np

import einopt
from einopt.cli.app import CliError, handle_errors, is_quiet, main
from einopt.cli.options import write_atomic
from einopt.cli.source import example_names, example_text, load_node, make_inputs, with_inputs, with_source
from einopt.core.ir import Program, Scope, input_tensors


@main.command()
@with_source
@with_inputs
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
@handle_errors
def eval(source, expr, example, shapes, npz, seed, mode, output) -> None:  # noqa: A001 - the command's name
    """Evaluate an expression or program with the reference interpreter."""
    node = load_node(source, expr, example, shapes)
    inputs = make_inputs(node, npz, seed, integer=mode == "int")
    start = time.perf_counter()
    results = _results(einopt.evaluate(node, inputs, mode=mode))
    elapsed = time.perf_counter() - start
    if not is_quiet():
        for line in _describe(node):
            click.echo(line)
        for name, arr in results.items():
            click.echo(
                f"{name}: shape {list(arr.shape)}, sum {arr.sum():.6g}, mean |x| {np.abs(arr).mean():.6g}"
            )
        click.echo(f"evaluated in {elapsed * 1e3:.1f} ms ({mode})")
    if output:
        write_atomic(output, lambda f: np.savez(f, **results))


@main.command()
@with_source
@with_inputs
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
@handle_errors
def compile(source, expr, example, shapes, npz, seed, target, emit, check, repeat) -> None:  # noqa: A001
    """Compile an expression or program with TVM and check it against the interpreter."""
    node = load_node(source, expr, example, shapes)
    quiet = is_quiet()
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
    inputs = make_inputs(node, npz, seed, integer=False)
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
@with_source
@handle_errors
def key(source, expr, example, shapes) -> None:
    """Print the canonical key (fingerprint) of an expression or program."""
    # loaded when the command runs, so that `einopt --help` stays fast
    from einopt.core.keys import key as canonical_key

    click.echo(canonical_key(load_node(source, expr, example, shapes)))


@main.command(name="fmt")
@with_source
@handle_errors
def fmt(source, expr, example, shapes) -> None:
    """Parse an expression or program and print it in canonical text form."""
    click.echo(einopt.format_expr(load_node(source, expr, example, shapes)))


@main.command()
@handle_errors
def examples() -> None:
    """List the bundled example expressions."""
    for name in example_names():
        text = example_text(name)
        first = next((ln.lstrip("# ").strip() for ln in text.splitlines() if ln.startswith("#")), "")
        click.echo(f"{name:28s} {first}")


def _results(value: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if isinstance(value, dict):
        return value
    return {"result": value}


def _describe(node: Scope | Program) -> list[str]:
    # loaded when the command runs, so that `einopt --help` stays fast
    from einopt.core.keys import key

    kind = f"program with {len(node.bindings)} expressions" if isinstance(node, Program) else "expression"
    ins = ", ".join(f"{t.name}{list(t.shape)}" for t in input_tensors(node))
    return [f"{kind}; inputs {ins}", f"key {key(node)}"]
