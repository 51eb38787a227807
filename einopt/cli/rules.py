"""``einopt rules`` and ``einopt derive``: the derivation rules from the command line.

``einopt rules`` lists the registry; ``einopt derive`` shows which rules apply
to an expression (and why the others do not), or applies named rules in
sequence and prints the numerically checked trace.
"""

from __future__ import annotations

import inspect

import click
import numpy as np

from einopt.cli.app import CliError, console, handle_errors, main
from einopt.cli.source import load_node, with_source
from einopt.core.ir import Program, Scope, input_tensors


@main.command()
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option(
    "--family",
    type=click.Choice(["intra", "constant", "inter"]),
    help="Only the rules of one family.",
)
@handle_errors
def rules(names: tuple[str, ...], family: str | None) -> None:
    """List the derivation rules (name, family, one-line math); with NAMEs, show their documentation."""
    # the rule registry: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.rules import REGISTRY, get

    if names:
        for k, name in enumerate(names):
            try:
                rule = get(name)
            except KeyError as e:
                raise CliError(e.args[0], "bad_input") from None
            if k:
                click.echo()
            click.echo(f"{rule.name} ({rule.family})\n    {rule.math}\n")
            click.echo(inspect.cleandoc(type(rule).__doc__ or ""))
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="einopt derivation rules", show_lines=False)
    for column in ("rule", "family", "math"):
        table.add_column(column, overflow="fold")
    for rule in REGISTRY.values():
        if family is None or rule.family == family:
            table.add_row(rule.name, rule.family, escape(rule.math))
    console(min_width=100).print(table)


def _parse_step(spec: str):
    """``RULE[@WHERE][:CHOOSE]`` -> the requested step (an :class:`~einopt.rules.Apply`)."""
    # the rule registry: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.rules import Apply

    head, _, choose = spec.partition(":")
    rule, _, at = head.partition("@")
    if not rule.strip():
        raise CliError(f"bad --step {spec!r}: expected RULE[@WHERE][:TEXT]", "bad_input")
    return Apply(rule.strip(), at.strip() or None, choose.strip() or None)


def _as_program(node: Scope | Program) -> Program:
    if isinstance(node, Program):
        return node
    return Program(tuple(input_tensors(node)), (("Y", node),), ("Y",))


def _constants(path: str | None, program: Program):
    # the rule registry: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.rules import Context

    if path is None:
        return Context()
    try:
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read constants from {path}: {e}", "bad_input") from None
    shapes = {t.name: t.shape for t in program.inputs}
    for name, arr in arrays.items():
        if name not in shapes:
            raise CliError(f"{path}: {name} is not an input of the expression", "bad_input")
        if tuple(arr.shape) != shapes[name]:
            raise CliError(
                f"{path}: constant {name} has shape {list(arr.shape)}, expected {list(shapes[name])}",
                "bad_input",
            )
    return Context(arrays)


@main.command()
@with_source
@click.option(
    "-s",
    "--step",
    "steps",
    multiple=True,
    metavar="RULE[@WHERE][:TEXT]",
    help="Apply RULE at the scope labelled WHERE, taking the match whose summary contains TEXT (repeatable, in order).",
)
@click.option(
    "--constants",
    type=click.Path(dir_okay=False),
    help="Values of constant input tensors (.npz by name), for constant-aware rules.",
)
@click.option(
    "--paper",
    metavar="NAME",
    help="Start from one of the paper's derivations (its program, steps and constants); "
    "see `einopt derive --paper list`. Extra --step options continue it.",
)
@click.option("--no-check", is_flag=True, help="Do not check each step with the reference interpreter.")
@click.option("--near-misses/--no-near-misses", default=True, help="Also list why rules do not apply.")
@handle_errors
def derive(source, expr, example, shapes, steps, constants, paper, no_check, near_misses) -> None:
    """Apply derivation rules to an expression and print the trace.

    Without --step, lists every match of every rule (and the near misses with
    their reasons) on the expression: the steps you can take next.
    """
    # the rule registry: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.rules import REGISTRY, DerivationError, Failure, NotEquivalentError, derive

    planned = [_parse_step(s) for s in steps]
    if paper is not None:
        # the rule registry: loaded when the command runs, so that `einopt --help` stays fast
        from einopt.rules.paper import DERIVATIONS

        if paper == "list":
            for d in DERIVATIONS.values():
                click.echo(f"{d.name:22s} {d.title}")
            return
        if paper not in DERIVATIONS:
            raise CliError(f"unknown derivation {paper!r}; known: {', '.join(DERIVATIONS)}", "bad_input")
        if any(x is not None for x in (source, expr, example)):
            raise CliError(
                "give either --paper or an expression (FILE, -e, --example), not both", "bad_input"
            )
        d = DERIVATIONS[paper]
        program, ctx, planned = d.program(), d.context(), [*d.steps, *planned]
        if constants is not None:
            raise CliError(
                "--paper brings its own constants; --constants cannot be combined with it", "bad_input"
            )
    else:
        program = _as_program(load_node(source, expr, example, shapes))
        ctx = _constants(constants, program)
    try:
        trace = derive(program, planned, ctx, verify=not no_check)
    except NotEquivalentError as e:
        raise CliError(f"a rule produced a different program (please report it): {e}", "mismatch") from None
    except (DerivationError, KeyError) as e:
        raise CliError(e.args[0], "bad_input") from None
    if planned:
        click.echo(trace.format())
        return
    click.echo(str(program))
    for rule in REGISTRY.values():
        for m in rule.match(program, ctx):
            if isinstance(m, Failure) and not near_misses:
                continue
            click.echo(f"  {m}")
