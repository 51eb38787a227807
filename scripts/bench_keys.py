"""Benchmark ``einopt.core.keys.key`` on freshly built, distinct conv-sized expressions.

Builds a few thousand distinct expressions up front (plain Conv and three
Fig. 5 derivation states with a nested scope, over varied shapes, offsets and
ranges), then times ``key()`` over each once, so no call is a cache hit on
the expression (index nodes shared between expressions do hit, as they do in
a search). A nested expression counts as one key although two scopes are
keyed. On a shared machine, compare the ``sum(range(100))`` line between runs.

    python scripts/bench_keys.py [--count N] [--repeat R] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import platform
import pstats
import statistics
import time

from einopt.api import L, Sum, iters, tensor
from einopt.core.ir import Iter, Scope
from einopt.core.keys import key


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def conv(n: int, variant: int, H: int, W: int, F: int, C: int, R: int, pad: int) -> Scope:
    """One of four Conv derivation states (Fig. 5: E1, E2, E3, E6-like), made distinct by ``n``."""
    h, w, f = Iter("h", 0, H), Iter("w", 0, W), Iter("f", 0, F)
    r, s, c = Iter("r", 0, R), Iter("s", 0, R), Iter("c", 0, C)
    A = tensor(f"A{n % 7}", (H, W, C))
    K = tensor("K", (R, R, F, C))
    if variant == 0:  # E1: the convolution
        return L(h, w, f)(Sum(r, s, c)(A[h + r - pad, w + s - pad, c] * K[r, s, f, c]))
    if variant == 1:  # E2: summation splitting, inner scope over (r, s, h, w, f)
        inner = L(r, s, h, w, f)(Sum(c)(A[h + r - pad, w + s - pad, c] * K[r, s, f, c]))
        return L(h, w, f)(Sum(r, s)(inner[r, s, h, w, f]))
    t1, t2 = Iter("t1", -pad, H + R - 1 - pad), Iter("t2", -pad, W + R - 1 - pad)
    inner = L(r, s, f, t1, t2)(Sum(c)(A[t1, t2, c] * K[r, s, f, c]))
    if variant == 2:  # E3: variable substitution (h + r, w + s) -> (t1, t2)
        return L(h, w, f)(Sum(r, s)(inner[r, s, f, h + r - pad, w + s - pad]))
    # E6-like: the inner scope as a matmul over merged iterators, read at offsets
    m, k = iters(f"m:{(H + R - 1) * (W + R - 1)} k:{R * R * F}")
    mm = L(m, k)(
        Sum(c)(A[m // (W + R - 1) - pad, m % (W + R - 1) - pad, c] * K[k // (R * F), k // F % R, k % F, c])
    )
    return L(h, w, f)(Sum(r, s)(mm[(h + r) * (W + R - 1) + w + s, r * (R * F) + s * F + f]))


VARIANTS = ("E1 conv", "E2 split", "E3 substituted", "E6 matmul+div/mod")


def build(count: int, start: int) -> list[list[Scope]]:
    """``count`` distinct expressions per variant, numbered from ``start`` (rounds use disjoint numbers)."""
    out: list[list[Scope]] = [[] for _ in VARIANTS]
    seen: set[int] = set()
    n = start
    while min(len(group) for group in out) < count:
        H = 7 + n % 53
        W = 7 + (n // 53) % 50
        F = (16, 32, 64, 128)[n % 4]
        C = (8, 16, 64, 256, 512)[n % 5]
        R = (1, 3, 5)[n % 3]
        pad = (n // 3) % 3
        for variant, group in enumerate(out):
            e = conv(n, variant, H, W, F, C, R, pad)
            if id(e) not in seen and len(group) < count:
                seen.add(id(e))
                group.append(e)
        n += 1
    return out


def python_speed() -> float:
    """Microseconds for ``sum(range(100))``, to compare runs on busy or different machines."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20000):
            sum(range(100))
        best = min(best, (time.perf_counter() - t0) / 20000 * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1000, help="distinct expressions per variant and round")
    ap.add_argument("--repeat", type=int, default=5, help="rounds, each on fresh expressions")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one more round")
    args = ap.parse_args()

    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical cores, load average {os.getloadavg()[0]:.2f}")
    print(f"Python {platform.python_version()}: sum(range(100)) takes {python_speed():.2f} us")
    per_variant: list[list[float]] = [[] for _ in VARIANTS]
    overall: list[float] = []
    for round_ in range(args.repeat):
        # Fresh numbers each round: einopt.core.keys memoises per access and index
        # node, so rebuilding the same expressions would hit its caches.
        groups = build(args.count, 10 * round_ * args.count)
        gc.collect()
        gc.disable()
        total = 0.0
        for variant, exprs in enumerate(groups):
            t0 = time.perf_counter()
            for e in exprs:
                key(e)
            dt = time.perf_counter() - t0
            per_variant[variant].append(len(exprs) / dt)
            total += dt
        gc.enable()
        overall.append(sum(len(g) for g in groups) / total)
        del groups
        gc.collect()
    print(f"{args.count} fresh expressions per variant and round, {args.repeat} rounds (median, best):")
    for name, rates in zip(VARIANTS, per_variant, strict=True):
        print(f"  {name:<20} {statistics.median(rates):>9,.0f} {max(rates):>9,.0f} keys/s")
    print(f"  {'all':<20} {statistics.median(overall):>9,.0f} {max(overall):>9,.0f} keys/s")

    if args.profile:
        groups = build(args.count, 10 * args.repeat * args.count)
        prof = cProfile.Profile()
        prof.enable()
        for exprs in groups:
            for e in exprs:
                key(e)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
