"""Counts of the ONNX backend node suite and the light models through `einopt optimize`.

    python scripts/onnx_suite.py            # both
    python scripts/onnx_suite.py --light    # light models only

Prints, per outcome, how many node cases were optimized (translated and
re-instantiated, verified equal), passed through, cannot run in ONNX
Runtime at all, or have an opset einopt refuses; and per light model the node counts from the report.
"""

from __future__ import annotations

import argparse
import collections
import os
import time

from einopt.pipeline import Options, optimize
from einopt.testing.onnx_suite import light_model, light_model_paths, node_cases, run_node_case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--light", action="store_true", help="only the light models")
    ap.add_argument("-v", action="store_true", help="list failing and passed-through cases")
    args = ap.parse_args()
    if not args.light:
        start = time.perf_counter()
        outcomes = collections.Counter()
        failures = []
        nodes = translated = 0
        for case in node_cases():
            try:
                r = run_node_case(case)
            except Exception as e:  # noqa: BLE001
                failures.append(f"{case.name}: {type(e).__name__}: {e}")
                continue
            outcomes[r.outcome] += 1
            nodes += r.nodes
            translated += r.translated
            if args.v and r.outcome != "optimized":
                print(f"  {r.outcome}: {r.name} {r.detail}")
        total = len(node_cases())
        print(f"ONNX backend node suite: {total} cases in {time.perf_counter() - start:.0f} s")
        for k, v in sorted(outcomes.items()):
            print(f"  {k:16s} {v}")
        print(f"  failed           {len(failures)}")
        print(f"  nodes translated {translated} of {nodes}")
        for f in failures:
            print("  FAIL", f)
    for path in light_model_paths():
        start = time.perf_counter()
        result = optimize(light_model(path), Options(seed=1, accept="verified"))
        c = result.counts()
        name = os.path.basename(path)[len("light_") : -len(".onnx")]
        print(
            f"{name:14s} nodes {c['nodes']:4d}  translated {c['translated']:4d}  "
            f"subprograms {c['subprograms']:3d} (rewritten {c['rewritten']}, unchanged {c['unchanged']}, "
            f"failed {c['failed']})  passed through {c['passed_through']:3d}  "
            f"verified {result.verified}  {time.perf_counter() - start:.1f} s"
        )


if __name__ == "__main__":
    main()
