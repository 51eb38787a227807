"""``einopt optimize`` and ``einopt inspect``: the ONNX commands.

Heavy imports (onnx, onnxruntime, the pipeline) happen inside the commands so
``einopt --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import click

from einopt.cli.app import CliError, console, handle_errors, is_quiet, main
from einopt.cli.options import check_runs, check_writable, show_report, with_bench_options, write_report
from einopt.core.syntax import format_expr


def _input_shapes(specs: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.frontend.fold import parse_input_shape

    return dict(parse_input_shape(s) for s in specs)


def _declared(specs: tuple[str, ...], flag: str = "--dim") -> tuple[dict[str, int], dict]:
    """``--dim``s: the values given, and the declared ranges (a name may have one of each)."""
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.errors import ModelError
    from einopt.frontend.symbolic import parse_dim

    values, ranges = {}, {}
    for spec in specs:
        try:
            name, value, declared = parse_dim(spec)
        except ModelError as e:
            raise click.BadParameter(str(e), param_hint=flag) from None
        if value is not None:
            values[name] = value
        else:
            ranges[name] = declared
    return values, ranges


def _values(specs: tuple[str, ...], flag: str) -> dict[str, int]:
    """``NAME=VALUE`` each (``--time-shapes``): a range is not a value."""
    values, ranges = _declared(specs, flag)
    if ranges:
        raise click.BadParameter(
            f"{', '.join(ranges)}: give one value (NAME=VALUE), not a range", param_hint=flag
        )
    return values


_shape_option = click.option(
    "--input-shape",
    "input_shapes",
    multiple=True,
    metavar="NAME=D0,D1,...",
    help="Pin a graph input's shape (symbolic dims); repeatable. The output is then written for that "
    "shape alone (a static model).",
)


@main.command()
@click.argument("source", metavar="IN", type=click.Path(dir_okay=False))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="Where to write the optimized model.",
)
@click.option(
    "--max-depth",
    default=7,
    show_default=True,
    type=click.IntRange(min=0),
    help="Explorative search depth per subprogram (0: no search, translate and re-instantiate only).",
)
@click.option(
    "--max-states",
    "states_per_search",
    default=10_000,
    show_default=True,
    type=click.IntRange(min=1),
    metavar="N",
    help="States one subprogram's search may generate (about a minute at 150 states/s).",
)
@click.option(
    "--model-states",
    "states_per_model",
    default=50_000,
    show_default=True,
    type=click.IntRange(min=1),
    metavar="N",
    help="States all the searches of the model may generate together; subprograms they do not "
    "reach keep their input. States, not seconds: the same searches on any machine, loaded or not.",
)
@click.option(
    "--time-budget",
    "deadline_s",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="A wall-clock safety net for the whole search stage: searches still running then stop "
    "with what they found (the output then depends on the machine).",
)
@click.option(
    "--jobs",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Processes searching subprograms side by side (timing stays serial; same output). With 1, "
    "a second process costs the search's candidates beside it (EINOPT_COST_PROCESS=never: not).",
)
@click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    help="Run the subprogram searches as Ray tasks on the cluster at ADDRESS (needs einopt[ray]).",
)
@click.option(
    "--top-k",
    default=3,
    show_default=True,
    type=click.IntRange(min=0),
    help="Derived candidates per subprogram instantiated, verified and timed.",
)
@_shape_option
@click.option(
    "--dim",
    "dims",
    multiple=True,
    metavar="NAME=VALUE|NAME=LO..HI[/STEP]",
    help="The value a symbolic dimension is searched and timed at, or the values it takes (LO to HI, "
    "multiples of STEP); repeatable, one of each per name. The output keeps it symbolic where its "
    "rewrites hold at other (declared) values: verified at 1 (LO) and an odd (another declared) value, "
    "and HI. Default value: batch 1, sequence 128, height and width 224 (by name); other names need --dim.",
)
@click.option(
    "--time-shapes",
    "time_shapes",
    multiple=True,
    metavar="NAME=VALUE[,NAME=VALUE...]",
    help="Other values of symbolic dimensions the output is timed at too (repeatable; a dimension not "
    "named keeps its --dim value): it is kept only where it is not slower at any of them.",
)
@click.option(
    "--specialize/--no-specialize",
    default=True,
    show_default=True,
    help="A rewrite that holds at the searched values of the symbolic dimensions only is kept there: "
    "the output tests its input shapes at run time and runs the input's own nodes at other values. "
    "--no-specialize leaves such rewrites out.",
)
@click.option(
    "--inputs",
    "npz",
    type=click.Path(dir_okay=False),
    help="Real inputs (.npz by input name): verified on besides the generated ones, and timed on instead.",
)
@click.option(
    "--no-verify",
    is_flag=True,
    help="Skip verification in ONNX Runtime (experts only; searches are then not taken from the cache).",
)
@click.option(
    "--kernels",
    type=click.Choice(["onnx", "tvm"]),
    default="onnx",
    show_default=True,
    help="How eOperators are written. onnx: model-local functions of standard operators (runs in any "
    "ONNX Runtime). tvm: generated kernels, described in the model (no machine code) and compiled by "
    "TVM on the machine that runs it; ONNX Runtime runs them through einopt.runtime.session (needs a C "
    "compiler and TVM).",
)
@click.option(
    "--accept",
    type=click.Choice(["measured", "verified"]),
    default="measured",
    show_default=True,
    help="measured: a rewrite is kept only when measured faster, on its own and in the whole model. "
    "verified: keep every verified rewrite without timing anything (experts; the output may be slower).",
)
@click.option(
    "--noise",
    default=0.05,
    show_default=True,
    type=click.FloatRange(min=0, max=1, max_open=True),
    help="A rewritten subprogram must be measured at least 1 + NOISE times faster than its original nodes "
    "(with --kernels tvm, candidates within 1 + NOISE of the fastest are ties, won by fewer nodes).",
)
@click.option(
    "--model-noise",
    default=0.02,
    show_default=True,
    type=click.FloatRange(min=0, max=1, max_open=True),
    help="The output is kept only when it is faster than the input by more than 1 + MODEL_NOISE, "
    "95%% confident, in a whole-model round and again in each of three fresh processes.",
)
@click.option(
    "--cache",
    "cache_path",
    type=click.Path(dir_okay=False),
    help="The measurement cache (SQLite; default: measurements.sqlite in the user's cache directory).",
)
@click.option("--no-cache", is_flag=True, help="Keep timings for this run only.")
@click.option("--force", is_flag=True, help="Allow -o to name the input model itself (overwrite it).")
@click.option(
    "--seed", default=0, show_default=True, help="Seed of the random verification and timing inputs."
)
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write a JSON report here.")
@click.option(
    "--external-data/--no-external-data",
    default=None,
    help="Store weights in OUT.data (default: only for large models).",
)
@click.option(
    "--bench",
    "do_bench",
    is_flag=True,
    help="Time the output against the original side by side in ONNX Runtime, and each rewritten subprogram.",
)
@with_bench_options
@handle_errors
def optimize(
    source,
    output,
    max_depth,
    states_per_search,
    states_per_model,
    deadline_s,
    jobs,
    ray_address,
    top_k,
    input_shapes,
    dims,
    time_shapes,
    specialize,
    npz,
    no_verify,
    kernels,
    accept,
    noise,
    model_noise,
    cache_path,
    no_cache,
    force,
    seed,
    report_path,
    external_data,
    do_bench,
    budget,
    min_runs,
    max_runs,
    threads,
    html_path,
) -> None:
    """Optimize an ONNX model: verified equal to the original, and measured not slower, in ONNX Runtime.

    A subprogram's new nodes replace its original nodes only when they differ,
    are verified equal and are measured faster; the whole output is then timed
    against the input and rewrites are rolled back while it is slower. When
    nothing is accepted the output is the input model. Timings are cached
    (--cache), so a second run measures nothing new.
    """
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.pipeline import Options
    from einopt.pipeline import optimize as run

    if cache_path and no_cache:
        raise click.UsageError("--cache and --no-cache contradict each other")
    check_runs(min_runs, max_runs)
    if not force and _same_file(source, output):
        raise CliError(f"-o {output} is the input model {source}; pass --force to overwrite it", "bad_input")
    shapes = _input_shapes(input_shapes)
    declared = _declared(dims)
    extra = (npz,) if npz is not None else ()
    try:
        options = Options(
            max_depth=max_depth,
            states_per_search=states_per_search,
            states_per_model=states_per_model,
            deadline_s=deadline_s,
            jobs=jobs,
            ray=ray_address,
            top_k=top_k,
            input_shapes=shapes,
            dims=declared[0],
            dim_ranges=declared[1],
            time_shapes=tuple(_values(tuple(t.split(",")), "--time-shapes") for t in time_shapes),
            specialize=specialize,
            inputs=extra,
            verify=not no_verify,
            seed=seed,
            accept=accept,
            noise=noise,
            model_noise=model_noise,
            cache=False if no_cache else (cache_path or True),
            kernels=kernels,
        )
    except ValueError as e:  # the same checks, and words, as the Python API
        raise click.UsageError(str(e).replace("max_depth", "--max-depth")) from None
    check_writable(output, report_path, html_path)
    if do_bench or accept == "measured":
        # loaded when the command runs, so that `einopt --help` stays fast
        from einopt.runtime.timing import configure_threads

        configure_threads(threads)  # every session of the run shares the pool with the timed ones
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.stages.partsearch import RayUnavailable

    try:
        with _search_display() as display, _interrupts() as interrupted:

            def progress(event) -> None:
                if interrupted:  # a Ctrl-C swallowed where Python ignores exceptions (a __del__)
                    raise KeyboardInterrupt
                if display is not None:
                    display(event)

            result = run(source, options, progress)
            if interrupted:
                raise KeyboardInterrupt
    except RayUnavailable as e:
        raise CliError(str(e), "unavailable") from None
    result.save(output, external_data=external_data)
    if do_bench:
        # ONNX: loaded when the command runs, so that `einopt --help` stays fast
        from einopt.reports.measure import benchmark_result

        report = benchmark_result(
            result,
            source,
            output=output,
            inputs=npz,
            seed=seed,
            budget_s=budget,
            min_runs=min_runs,
            max_runs=max_runs,
            threads=threads,
        )
    else:
        report = result.report() | {"model": str(source), "output": str(output)}
    write_report(report, report_path, html_path)
    if do_bench:
        show_report(report)
    elif not is_quiet():
        _print_summary(result, output)


@contextlib.contextmanager
def _interrupts():
    """A list that becomes non-empty on Ctrl-C (which still raises KeyboardInterrupt as usual).

    Python drops an exception raised inside a finalizer or a weakref callback,
    so a Ctrl-C landing there would be lost and the run would finish and write
    its output; the caller checks the list at safe points instead.
    """
    hit: list[bool] = []

    def handler(signum, frame) -> None:
        hit.append(True)
        code = frame.f_code if frame is not None else None
        if code is not None and (code.co_name == "__del__" or code.co_filename.endswith("weakref.py")):
            return  # raised here, Python would print it and drop it: the next safe point raises it
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread (an embedding application): leave signals alone
        yield hit
        return
    try:
        yield hit
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def _search_display():
    """A live display of the subprogram searches on a terminal (None, and silent, elsewhere or with -q)."""
    out = console()
    if is_quiet() or not out.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=out,
        transient=True,
    )
    with bar:
        tasks: dict[str, object] = {}

        def update(ev) -> None:
            if "all" not in tasks:
                tasks["all"] = bar.add_task("searching subprograms", total=ev.total, info="")
            rate = f"{ev.states / ev.seconds:.0f}/s" if ev.seconds > 0 else "-"
            best = f"best {ev.best_speedup:.2f}x predicted" if ev.best_speedup else ""
            info = f"{ev.part}: {ev.states} states ({rate}) {best}"
            if ev.event == "searching":
                bar.update(tasks["all"], info=info)
                return
            bar.update(tasks["all"], advance=0 if ev.event == "deeper" else 1, info=f"{ev.part}: {ev.event}")

        yield update


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: equal once resolved (symlinks, ``./``), or hard links of it."""
    if Path(a).resolve() == Path(b).resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


SUMMARY_ROWS = 12  # above this many subprograms, the summary leaves the unchanged ones out of its table


def _print_summary(result, output: str) -> None:
    from rich.table import Table

    # loaded when the command runs, so that `einopt --help` stays fast
    from einopt.reports.report import (
        acceptance_text,
        counts_text,
        passthrough_text,
        search_summary_text,
        search_text,
        traces_text,
    )

    out = console()
    c = result.counts()
    report = result.report()
    table = Table(title=f"einopt optimize -> {output}", show_lines=False)
    searched = any(p.search for p in result.parts)
    for col in ("subprogram", "ops", "status", "now", *(("search",) if searched else ())):
        table.add_column(col)
    quiet_rows = 0
    for p in result.parts:
        if p.kind == "passthrough":
            continue
        if p.status == "unchanged" and c["subprograms"] > SUMMARY_ROWS:
            quiet_rows += 1
            continue
        speed = f" ({p.bench['speedup']:.2f}x)" if p.bench else ""
        now = " ".join(p.new_ops) if p.status in ("accepted", "rewritten") else p.reason
        row = [p.name, " ".join(p.ops), p.status + speed, now]
        table.add_row(*row, *((search_text(p.search),) if searched else ()))
    if quiet_rows:
        table.caption = f"... and {quiet_rows} subprograms re-instantiated as the same nodes (unchanged)"
    if c["subprograms"]:
        out.print(table)
    if result.blocked:
        verified = "untouched"
    elif not result.verified:
        verified = "NOT verified (--no-verify)"
    else:
        verified = "verified equal in ONNX Runtime"
    changed = "the output differs from the input" if result.changed() else "the output is the input"
    click.echo(
        f"{c['nodes']} nodes, {c['translated']} translated; subprograms {counts_text(c)}; "
        f"{c['passed_through']} nodes passed through; {changed}, {verified}"
    )
    for line in (
        search_summary_text(report),
        acceptance_text(report),
        passthrough_text(report["subprograms"]),
    ):
        if line:
            click.echo(line)
    for line in traces_text(report["subprograms"]):
        click.echo(f"derivation {line}")
    for note in result.notes:
        click.echo(f"note: {note}")


@main.command()
@click.argument("source", metavar="IN", type=click.Path(dir_okay=False))
@_shape_option
@click.option(
    "--all", "show_all", is_flag=True, help="Also list the nodes that pass through, with the reason."
)
@handle_errors
def inspect(source, input_shapes, show_all) -> None:
    """Print the subprograms of an ONNX model and their expressions."""
    # ONNX: loaded when the command runs, so that `einopt --help` stays fast
    from einopt.frontend.fold import prepare
    from einopt.frontend.translate import translate_graph
    from einopt.opsets import check_opset
    from einopt.runtime import modelio

    model = modelio.load_model(source)
    check_opset(model, source)
    prepared = prepare(model, _input_shapes(input_shapes))
    graph = prepared.model.graph
    parts = translate_graph(prepared.model)
    for note in prepared.notes:
        click.echo(f"# note: {note}")
    for p in parts:
        ops = " ".join(graph.node[i].op_type for i in p.nodes)
        if p.program is None:
            if show_all:
                click.echo(f"# {p.name}: passes through ({ops}): {p.reason}")
            continue
        ins = ", ".join(f"{k}={v}" for k, v in p.names.items() if k in {t.name for t in p.program.inputs})
        outs = ", ".join(f"{k}={p.names[k]}" for k in p.program.outputs)
        click.echo(f"# {p.name} ({p.kind}): {ops}")
        click.echo(f"# inputs {ins}; outputs {outs}")
        click.echo(format_expr(p.program))
        click.echo()
