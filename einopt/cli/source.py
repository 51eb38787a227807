"""Where the expression commands (``eval``, ``compile``, ``key``, ``fmt``, ``derive``) get
their expression and its inputs: a file, ``-e TEXT`` or a bundled example, and an
``.npz`` file or seeded random arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import click
import numpy as np

import einopt
from einopt.cli.app import CliError
from einopt.core.ir import Program, Scope, input_tensors
from einopt.core.syntax import ParseError

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


def with_source(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the options naming an expression: ``[FILE]``, ``-e/--expr``, ``--example``, ``--shape``."""
    for opt in reversed(_source_options):
        fn = opt(fn)
    return fn


def with_inputs(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the options giving an expression's inputs: ``--inputs FILE.npz`` and ``--seed``."""
    for opt in reversed(_input_options):
        fn = opt(fn)
    return fn


def example_names() -> list[str]:
    """The bundled example expressions, by name (the ``.ein`` files of :mod:`einopt.examples`)."""
    files = resources.files("einopt.examples")
    return sorted(p.name[: -len(".ein")] for p in files.iterdir() if p.name.endswith(".ein"))


def example_text(name: str) -> str:
    """The text of the bundled example ``name``."""
    return resources.files("einopt.examples").joinpath(f"{name}.ein").read_text()


def load_node(
    source: str | None, expr: str | None, example: str | None, shapes: tuple[str, ...]
) -> Scope | Program:
    """Parse the expression or program that the :func:`with_source` options name.

    Raises
    ------
    CliError
        ``bad_input`` when not exactly one source is given, the file is
        unreadable, or the text does not parse.
    """
    text, origin = _load_text(source, expr, example)

    try:
        return einopt.parse(text, shapes=_parse_shapes(shapes) or None)
    except ParseError as e:
        message = str(e).replace("or pass shapes=", "or pass --shape NAME=D0,D1,...")
        raise CliError(f"{origin}: {message}", "bad_input") from None


def _load_text(source: str | None, expr: str | None, example: str | None) -> tuple[str, str]:
    given = [x for x in (source, expr, example) if x is not None]
    if len(given) != 1:
        raise CliError("give exactly one of FILE, -e/--expr TEXT or --example NAME", "bad_input")
    if expr is not None:
        return expr, "<expr>"
    if example is not None:
        names = example_names()
        if example not in names:
            raise CliError(f"unknown example {example!r}; bundled examples: {', '.join(names)}", "bad_input")
        return example_text(example), f"example {example}"
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


def make_inputs(node: Scope | Program, npz: str | None, seed: int, integer: bool) -> dict[str, np.ndarray]:
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
