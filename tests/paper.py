"""The paper's worked examples, built with the Python API and written in the text syntax.

Shared by the interpreter, codegen and syntax tests: Fig. 4 (A x B x C with a
scope) and the Fig. 5 chain E1..E7 deriving a 3x3 convolution (padding 1, HWC
layout, K[r, s, f, c]) into a matmul-shaped scope plus an OffsetReduce.
"""

import numpy as np

from einopt import L, Sum, iters, program, tensor


def fig4(n_i=5, n_j=3, n_k=6, n_m=4):
    """``A x B x C`` with ``A x B`` materialised in a scope."""
    i, j, k, i2, k2, m = iters(f"i:{n_i} j:{n_j} k:{n_k} i2:{n_i} k2:{n_k} m:{n_m}")
    A, B, C = tensor("A", (n_i, n_m)), tensor("B", (n_m, n_k)), tensor("C", (n_k, n_j))
    ab = L(i2, k2)(Sum(m)(A[i2, m] * B[m, k2]))
    return L(i, j)(Sum(k)(ab[i, k] * C[k, j]))


def fig4_text(n_i=5, n_j=3, n_k=6, n_m=4):
    return (
        f"L[i:{n_i}, j:{n_j}] Sum[k:{n_k}] {{L[i2:{n_i}, k2:{n_k}] Sum[m:{n_m}] A[i2, m] * B[m, k2]}}[i, k] * C[k, j]"
        f" where A: [{n_i}, {n_m}], B: [{n_m}, {n_k}], C: [{n_k}, {n_j}]"
    )


def conv_reference(a, k):
    """3x3 convolution with padding 1, HWC input and K[r, s, f, c] weights."""
    H, W, _ = a.shape
    ap = np.pad(a, ((1, 1), (1, 1), (0, 0)))
    return sum(
        np.einsum("hwc,fc->hwf", ap[r : r + H, s : s + W], k[r, s]) for r in range(3) for s in range(3)
    )


def fig5_chain(H, W, C, F):
    """E1..E7 of the paper's Fig. 5: deriving a 3x3 convolution into a matmul plus an offset reduction."""
    h, w, f = iters(f"h:{H} w:{W} f:{F}")
    r, s, c = iters(f"r:3 s:3 c:{C}")
    A, K = tensor("A", (H, W, C)), tensor("K", (3, 3, F, C))

    def inner(t1, t2):
        return L(r, s, f, t1, t2)(Sum(c)(A[t1, t2, c] * K[r, s, f, c]))

    def offset_reduce(t):
        return L(h, w, f)(Sum(r, s)(t[r, s, f, h + r - 1, w + s - 1]))

    e1 = L(h, w, f)(Sum(r, s, c)(A[h + r - 1, w + s - 1, c] * K[r, s, f, c]))
    split = L(r, s, h, w, f)(Sum(c)(A[h + r - 1, w + s - 1, c] * K[r, s, f, c]))
    e2 = L(h, w, f)(Sum(r, s)(split[r, s, h, w, f]))
    t_box = inner(*iters(f"t1=-1:{H + 1} t2=-1:{W + 1}"))
    middle = L(r, s, h, w, f)(t_box[r, s, f, h + r - 1, w + s - 1])
    e3 = L(h, w, f)(Sum(r, s)(middle[r, s, h, w, f]))
    e4 = offset_reduce(t_box)
    e5 = offset_reduce(inner(*iters(f"t1=-2:{H + 2} t2=-2:{W + 2}")))
    t_tight = inner(*iters(f"t1:{H} t2:{W}"))
    e6 = offset_reduce(t_tight)
    e7 = program(outputs={"Y": offset_reduce(t_tight)}, intermediates={"T": t_tight})
    return [e1, e2, e3, e4, e5, e6, e7]


def fig5_texts(H, W, C, F):
    """The same chain E1..E7 in the text syntax."""
    where = f"where A: [{H}, {W}, {C}], K: [3, 3, {F}, {C}]"
    inner = "{{L[r:3, s:3, f:{F}, {t}] Sum[c:{C}] A[t1, t2, c] * K[r, s, f, c]}}"
    box = inner.format(F=F, C=C, t=f"t1=-1:{H + 1}, t2=-1:{W + 1}")
    wide = inner.format(F=F, C=C, t=f"t1=-2:{H + 2}, t2=-2:{W + 2}")
    tight = inner.format(F=F, C=C, t=f"t1:{H}, t2:{W}")
    out = f"L[h:{H}, w:{W}, f:{F}]"
    return [
        f"{out} Sum[r:3, s:3, c:{C}] A[h+r-1, w+s-1, c] * K[r, s, f, c] {where}",
        f"{out} Sum[r:3, s:3] {{L[r:3, s:3, h:{H}, w:{W}, f:{F}] Sum[c:{C}] A[h+r-1, w+s-1, c] * K[r, s, f, c]}}"
        f"[r, s, h, w, f] {where}",
        f"{out} Sum[r:3, s:3] {{L[r:3, s:3, h:{H}, w:{W}, f:{F}] {box}[r, s, f, h+r-1, w+s-1]}}[r, s, h, w, f] {where}",
        f"{out} Sum[r:3, s:3] {box}[r, s, f, h+r-1, w+s-1] {where}",
        f"{out} Sum[r:3, s:3] {wide}[r, s, f, h+r-1, w+s-1] {where}",
        f"{out} Sum[r:3, s:3] {tight}[r, s, f, h+r-1, w+s-1] {where}",
        f"T = L[r:3, s:3, f:{F}, t1:{H}, t2:{W}] Sum[c:{C}] A[t1, t2, c] * K[r, s, f, c]\n"
        f"Y = {out} Sum[r:3, s:3] T[r, s, f, h+r-1, w+s-1]\n"
        f"return Y\n{where}",
    ]
