"""``einopt models``: list the evaluation models or write them as ONNX files with sample inputs."""

from __future__ import annotations

import math

import click

from einopt.cli.app import CliError, console, handle_errors, main


@main.command()
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option("-b", "--batch", "batches", type=int, multiple=True, help="Batch size (repeatable; default 1).")
@click.option("--size", type=click.Choice(["full", "small"]), default="full", show_default=True)
@click.option(
    "-o",
    "--out-dir",
    type=click.Path(file_okay=False),
    default=".",
    show_default=True,
    help="Where to write.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random weights.")
@handle_errors
def models(names: tuple[str, ...], batches: tuple[int, ...], size: str, out_dir: str, seed: int) -> None:
    """List the evaluation models; with NAMEs (or `all`), write NAME_bsN.onnx + NAME_bsN.npz inputs."""
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.models import MODELS, write

    if not names:
        _list_models(size)
        return
    chosen = list(MODELS) if "all" in names else list(dict.fromkeys(names))
    unknown = [n for n in chosen if n not in MODELS]
    if unknown:
        raise CliError(
            f"unknown model {', '.join(map(repr, unknown))}; choose from: {', '.join(MODELS)}, all",
            "bad_input",
        )
    bad = [b for b in batches if b < 1]
    if bad:
        raise CliError(f"batch sizes must be positive, got {bad[0]}", "bad_input")
    for name in chosen:
        for batch in dict.fromkeys(batches or (1,)):
            try:
                path = write(name, batch, out_dir, size=size, seed=seed)
            except OSError as e:
                raise CliError(f"cannot write {name} into {out_dir}: {e}", "bad_input") from None
            click.echo(f"{path}  (inputs: {path.with_suffix('.npz').name})")


def _list_models(size: str) -> None:
    from onnx import TensorProto
    from rich.markup import escape
    from rich.table import Table

    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.core.cost import model_cost
    from einopt.models import MODELS, build

    table = Table(title=f"einopt evaluation models ({size} size, batch 1)")
    columns = (
        ("name", "left"),
        ("description", "left"),
        ("input", "left"),
        ("params", "right"),
        ("GFLOPs", "right"),
    )
    for column, justify in columns:
        table.add_column(column, justify=justify, overflow="fold")
    for name, spec in MODELS.items():
        model = build(name, 1, size=size)
        params = sum(math.prod(t.dims) for t in model.graph.initializer if t.data_type == TensorProto.FLOAT)
        shapes = ", ".join(
            f"{v.name} {[d.dim_value for d in v.type.tensor_type.shape.dim]}" for v in model.graph.input
        )
        table.add_row(
            name,
            escape(spec.description),
            escape(shapes),
            f"{params / 1e6:.3g} M",
            f"{model_cost(model).flops / 1e9:.3g}",
        )
    console(min_width=140).print(table)
