"""Fit the rational forms of erf and tanh that generated kernels compile (``einopt.core.ops``).

Each function is ``f(x) = x P(x^2) / Q(x^2)`` on ``[-bound, bound]`` (odd, so fitted on
``[0, bound]``), with ``Q(0) = 1``. The fit linearises ``x P(t) - f(x) Q(t)`` and solves it by
weighted least squares on 6000 points clustered towards both ends, reweighting each round by
``1 / |Q|`` (Sanathanan-Koerner, so that the linearised residual approaches the true one) and,
after a few rounds, by Lawson's minimax weights (each point's weight times the square root of its
error). It prints the coefficients ``einopt.core.ops`` holds and their errors in float64 and when
evaluated in float32 (as the kernels do, by Horner's rule)::

    python scripts/fit_activations.py

Output 2026-11-29 (numpy 2, float64 fit): erf within 1.5e-9, tanh within 1.8e-8; in float32 both
within 4e-7 absolute and relative.
"""

from __future__ import annotations

import math

import numpy as np

# name, function, bound (the function is +-1 in float32 beyond), degrees of P and Q in t = x^2
FITS = (("erf", math.erf, 4.0, 6, 5), ("tanh", math.tanh, 9.0, 4, 4))
POINTS = 6000
ROUNDS = 60
MINIMAX_FROM = 6


def fit(fn, bound: float, dp: int, dq: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Coefficients of P and Q (lowest first, ``Q[0] = 1``) and the float64 fit's largest error."""
    xs = bound * (1 - np.cos(np.linspace(0, np.pi, POINTS))) / 2
    xs = xs[xs > 0]
    f = np.array([fn(v) for v in xs])
    t = xs * xs
    weight = np.ones_like(xs)
    q = np.ones_like(xs)
    for round_ in range(ROUNDS):
        a = np.concatenate(
            [
                np.stack([xs * t**k for k in range(dp + 1)], 1),
                np.stack([-f * t**k for k in range(1, dq + 1)], 1),
            ],
            1,
        )
        w = weight / np.abs(q)
        sol, *_ = np.linalg.lstsq(a * w[:, None], f * w, rcond=None)
        p, qc = sol[: dp + 1], np.concatenate([[1.0], sol[dp + 1 :]])
        q = np.polyval(qc[::-1], t)
        err = xs * np.polyval(p[::-1], t) / q - f
        if round_ >= MINIMAX_FROM:
            weight = weight * np.sqrt(np.abs(err))
            weight /= weight.max()
    return p, qc, float(np.abs(err).max())


def float32_form(p: np.ndarray, q: np.ndarray, bound: float, x: np.ndarray) -> np.ndarray:
    """``z P(z^2) / Q(z^2)`` in float32 on ``z = clip(x, -bound, bound)``, by Horner's rule."""
    f32 = np.float32
    z = np.clip(x.astype(f32), f32(-bound), f32(bound))
    t = z * z
    num, den = f32(p[-1]), f32(q[-1])
    for c in p[-2::-1]:
        num = num * t + f32(c)
    for c in q[-2::-1]:
        den = den * t + f32(c)
    return z * num / den


def main() -> None:
    x = np.concatenate([np.linspace(-12, 12, 200001), np.geomspace(1e-30, 12, 20000)]).astype(np.float32)
    for name, fn, bound, dp, dq in FITS:
        p, q, err64 = fit(fn, bound, dp, dq)
        exact = np.array([fn(v) for v in x.astype(np.float64)])
        err = np.abs(float32_form(p, q, bound, x).astype(np.float64) - exact)
        rel = (err / np.maximum(np.abs(exact), 1e-300)).max()
        roots = np.roots(q[::-1])
        assert not any(abs(r.imag) < 1e-12 and r.real >= 0 for r in roots), f"{name}: Q has a root at t >= 0"
        print(
            f"{name}: float64 fit within {err64:.2g}; float32 form within {err.max():.2g} absolute, {rel:.2g} relative"
        )
        print(f"  P = {tuple(p.tolist())}")
        print(f"  Q = {tuple(q.tolist())}")


if __name__ == "__main__":
    main()
