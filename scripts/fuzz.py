"""Graph fuzzer: random ONNX models through ``einopt.optimize`` without verification, compared in ONNX Runtime.

    python scripts/fuzz.py --graphs 5000 [--seed 0] [--max-depth 0] [--special/--no-special] [--kernels onnx|tvm] [--symbolic] [--out fuzz-failures]

Graph ``k`` of seed ``s`` is a random chain/DAG of 2-8 operators (opset 17,
every op the importers translate; see ``einopt/testing/graphs.py``), built
from ``numpy.random.default_rng([s, k])``. Each one is optimized with
``Options(verify=False, accept="verified")`` (so neither the safety net nor
measured acceptance can hide a wrong rewrite, and every rewrite is kept).
``--max-depth 0`` (the default) translates and re-instantiates without
searching; ``--max-depth N`` searches every subprogram to depth ``N``
without the measurement cache, within a modest budget of generated states
(``einopt.testing.graphs.SEARCH_STATES`` per subprogram,
``SEARCH_STATES_PER_GRAPH`` per graph; ``SEARCH_DEADLINE_S`` seconds only as
a safety net). The output model is compared with the original in ONNX Runtime
(``einopt.runtime.verify.compare``, default tolerance; NaN and infinity positions
must match), both run without ONNX Runtime's graph optimizations (its
optimizer has bugs of its own: it miscomputes ``Transpose -> MatMul`` with a
1-D operand, seed 2 graph 3193), on three data sets: ordinary values in ``[-2, 2)``, exact small
integers, and special values (``0``, ``-0``, ``+-inf``, NaN, ``+-1e30``,
``3e38``, small integers mixed into ordinary data; ``--no-special`` skips
them). ``--kernels tvm`` writes eOperators and element-wise chains as
generated kernels (einopt's kernel library registered in every session).
``--symbolic`` declares every graph input's first dimension a symbolic
``batch``: einopt searches it at 1 and writes rewrites that hold at any batch
(their sizes computed at run time) or leaves them out; the output is compared
at each batch of 1, 2, 3 and 5 that the input model runs at.

What "equal" means on special values: the same IEEE result as ONNX Runtime
gives the original, position by position. Huge finite values are kept out of
graphs with a sum of products (MatMul, Gemm, Einsum, Conv, ConvTranspose):
whether ``a*b + c*d`` overflows when ``a*b`` alone would depends on the
kernel (fused multiply-add, summation order), so two correct evaluations of
the same contraction disagree there; ONNX Runtime's own kernels do. Every
other exclusion is named in ``einopt/testing/graphs.py`` with its reason.

An output that passes is also loaded with ONNX Runtime's graph
optimizations on (``ORT_ENABLE_ALL``), as a user would run it: when that
fails to load or run, or computes something else than the same output
unoptimized, on the same data, and the original passes that check, the
graph counts as "ORT optimizer refuses the output", a failure of its own
(ONNX Runtime's Pad fusion, for one, took a run-time Pad of a Conv weight
for padding of the input). When the original fails that check too, the
output merely inherits ONNX Runtime's bug; the summary counts such inputs
but not as failures.

The summary counts graphs, wrong outputs, exceptions, ORT optimizer
refusals and invalid graphs (models that do not run even before einopt: a
generator bug), per op type.
Each failing model is written to ``--out`` as ``<seed>-<k>.onnx`` (with
``<seed>-<k>.optimized.onnx`` when einopt produced one) for reproduction:
``einopt optimize --no-verify --accept verified --max-depth N [--kernels tvm] <file>``,
``N`` the run's ``--max-depth``. Exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("EINOPT_THREAD_POOL", "per-session")
import numpy as np  # noqa: E402 - after the thread pool setting
import onnx  # noqa: E402

from einopt.testing.graphs import DATA_KINDS, RngDraw, build_graph, check_case, symbolic_case  # noqa: E402

STATUS_TEXT = {
    "ok": "ok",
    "wrong": "wrong",
    "exception": "exception",
    "ort": "ORT optimizer refuses the output",
    "invalid": "invalid",
}
"""How each :class:`einopt.testing.graphs.Outcome` status is reported (every one but ``ok`` is a failure)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=1000, help="how many graphs (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of graph 0 .. graphs-1 (default 0)")
    parser.add_argument(
        "--max-depth",
        type=int,
        default=0,
        help="search every subprogram to this depth, bounded, without the cache (default 0: no search)",
    )
    parser.add_argument(
        "--special",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also compare on special values (0, inf, NaN, huge; default on)",
    )
    parser.add_argument(
        "--kernels",
        choices=("onnx", "tvm"),
        default="onnx",
        help="how einopt writes eOperators (default onnx; tvm: generated kernels)",
    )
    parser.add_argument(
        "--symbolic",
        action="store_true",
        help="declare every graph input's first dimension a symbolic batch (searched at 1, compared at "
        "each batch of 1, 2, 3, 5 the input runs at)",
    )
    parser.add_argument("--out", type=Path, default=Path("fuzz-failures"), help="folder for failing models")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    args = parser.parse_args(argv)
    if args.max_depth < 0:
        parser.error(f"--max-depth must be >= 0, not {args.max_depth}")
    logging.disable(
        logging.WARNING
    )  # rollbacks and pass-throughs are expected; the summary says what matters
    kinds = DATA_KINDS if args.special else tuple(k for k in DATA_KINDS if k != "special")

    per_op: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: collections.Counter[str] = collections.Counter()
    start = time.perf_counter()
    for k in range(args.graphs):
        rng = np.random.default_rng([args.seed, k])
        case = build_graph(RngDraw(rng), rng)
        if args.symbolic:
            case = symbolic_case(case)
        outcome = check_case(
            case, k, kinds, max_depth=args.max_depth, ort_optimizer=True, kernels=args.kernels
        )
        totals[outcome.status] += 1
        if outcome.ort_input:
            totals["ort_input"] += 1
            if not args.quiet:
                print(f"graph {args.seed}-{k}: not counted: {outcome.ort_input[:300]}")
        for op in set(case.ops):
            per_op[op]["graphs"] += 1
            per_op[op][outcome.status] += 1
        if outcome.status == "ok":
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"{args.seed}-{k}"
        onnx.save(case.model, args.out / f"{stem}.onnx")
        if outcome.optimized is not None:
            onnx.save(outcome.optimized, args.out / f"{stem}.optimized.onnx")
        if not args.quiet:
            where = f" on {outcome.kind} data" if outcome.kind else ""
            what = STATUS_TEXT[outcome.status]
            print(f"graph {stem}: {what}{where}: {' -> '.join(case.ops)}: {outcome.detail[:300]}")
    seconds = time.perf_counter() - start

    failed = sum(totals[s] for s in STATUS_TEXT if s != "ok")
    search = f"search depth {args.max_depth}" if args.max_depth else "no search"
    search += ", generated kernels" if args.kernels == "tvm" else ""
    print(
        f"{args.graphs} graphs (seed {args.seed}, {search}, data: {', '.join(kinds)}) in {seconds:.1f} s: "
        f"{totals['wrong']} wrong outputs, {totals['exception']} exceptions, "
        f"{totals['ort']} outputs the ORT optimizer refuses, {totals['invalid']} invalid graphs"
    )
    if totals["ort_input"]:
        print(f"{totals['ort_input']} inputs ONNX Runtime's optimizer mishandles itself (not counted)")
    print(f"{'op':<20}{'graphs':>8}{'wrong':>8}{'exceptions':>12}{'ORT refuses':>13}")
    for op in sorted(per_op):
        c = per_op[op]
        print(f"{op:<20}{c['graphs']:>8}{c['wrong']:>8}{c['exception']:>12}{c['ort']:>13}")
    if failed:
        print(f"failing models written to {args.out}/")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
