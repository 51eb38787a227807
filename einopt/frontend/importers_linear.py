"""Importers of contractions: MatMul, Gemm, Einsum.

Each is ``L out.. Sum k..: A[..] * B[..]`` (see the forms in
:mod:`einopt.frontend`).
"""

from __future__ import annotations

import re

from einopt.core import ir
from einopt.frontend.operand import (
    Importer,
    NodeView,
    Unsupported,
    access,
    broadcast_dims,
    checked_output,
    float_data,
    make_iters,
    numbered,
    operand_shape,
    read,
)

__all__ = ["LINEAR_IMPORTERS"]


def import_matmul(view: NodeView) -> tuple[ir.Scope, ...]:
    """``L b.., m, n Sum k: A[b.., m, k] * B[b.., k, n]`` with numpy's 1-D and batch rules."""
    a = float_data(view.input(0), "input A")
    b = float_data(view.input(1), "input B")
    sa, sb = operand_shape(a), operand_shape(b)
    if not sa or not sb:
        raise Unsupported("MatMul with a scalar operand")
    a_vec, b_vec = len(sa) == 1, len(sb) == 1
    m_size, k_size = (1, sa[0]) if a_vec else sa[-2:]
    k_b, n_size = (sb[0], 1) if b_vec else sb[-2:]
    if k_size != k_b:
        raise Unsupported(f"MatMul inner dimensions differ: {list(sa)} x {list(sb)}")
    batch = broadcast_dims(sa[:-2], sb[:-2])
    out = batch + (() if a_vec else (m_size,)) + (() if b_vec else (n_size,))
    out = checked_output(view, 0, out)
    bi = numbered("b", batch)
    (m,), (n,), (k,) = make_iters(["m"], [m_size]), make_iters(["n"], [n_size]), make_iters(["k"], [k_size])
    lhs = read(a, (k,)) if a_vec else read(a, (*bi, m, k))
    rhs = read(b, (k,)) if b_vec else read(b, (*bi, k, n))
    traversal = bi + (() if a_vec else (m,)) + (() if b_vec else (n,))
    return (ir.Scope(traversal, (k,), ir.Binary("*", lhs, rhs)),)


def import_gemm(view: NodeView) -> tuple[ir.Scope, ...]:
    """``S = L m, n Sum k: A[m, k] * B[k, n]``, then ``L m, n: S[m, n] + beta * C[..]``.

    ``transA``/``transB`` swap the index order; ``alpha != 1`` multiplies the
    product inside the sum; ``beta == 0`` drops ``C``.
    """
    a = float_data(view.input(0), "input A")
    b = float_data(view.input(1), "input B")
    sa, sb = operand_shape(a), operand_shape(b)
    if len(sa) != 2 or len(sb) != 2:
        raise Unsupported(f"Gemm needs 2-D A and B, got {list(sa)} and {list(sb)}")
    trans_a, trans_b = bool(view.attr("transA", 0)), bool(view.attr("transB", 0))
    alpha, beta = float(view.attr("alpha", 1.0)), float(view.attr("beta", 1.0))
    m_size, k_size = sa[::-1] if trans_a else sa
    k_b, n_size = sb[::-1] if trans_b else sb
    if k_size != k_b:
        raise Unsupported(f"Gemm inner dimensions differ: {list(sa)} x {list(sb)}")
    out = checked_output(view, 0, (m_size, n_size))
    m, n, k = make_iters(["m", "n", "k"], [m_size, n_size, k_size])
    product = ir.Binary(
        "*",
        access(a, (k, m) if trans_a else (m, k)),
        access(b, (n, k) if trans_b else (k, n)),
    )
    if alpha != 1.0:
        product = ir.Binary("*", ir.Const(alpha), product)
    s = ir.Scope((m, n), (k,), product)
    c = view.input(2)
    if c is None or beta == 0.0:
        return (s,)
    c = float_data(c, "input C")
    if broadcast_dims(operand_shape(c), out) != out:
        raise Unsupported(f"Gemm C of shape {list(operand_shape(c))} does not broadcast to {list(out)}")
    bias = read(c, (m, n))
    if beta != 1.0:
        bias = ir.Binary("*", ir.Const(beta), bias)
    return (ir.Scope((m, n), (), ir.Binary("+", ir.Access(s, (m, n)), bias)),)


_TERM = re.compile(r"^[A-Za-z]*$")


def _iter_name(letter: str) -> str:
    """Einsum letters as iterator names; reserved words (``L``) get doubled."""
    return letter if letter not in ir.RESERVED_NAMES else letter * 2


def import_einsum(view: NodeView) -> tuple[ir.Scope, ...]:
    """A contraction ``L out.. Sum rest..: X0[..] * X1[..] * ..``.

    Refused: ellipsis, a letter repeated within one term (diagonals), and
    letters bound to different sizes.
    """
    equation = str(view.attr("equation", "")).replace(" ", "")
    if "..." in equation:
        raise Unsupported("Einsum with an ellipsis")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    operands = [float_data(view.input(i), f"Einsum input {i}") for i in range(len(view.inputs))]
    if len(terms) != len(operands):
        raise Unsupported(f"Einsum equation {equation!r} has {len(terms)} terms for {len(operands)} inputs")
    sizes: dict[str, int] = {}
    for term, operand in zip(terms, operands, strict=True):
        shape = operand_shape(operand)
        if not _TERM.match(term) or len(term) != len(shape):
            raise Unsupported(f"Einsum term {term!r} does not fit input of shape {list(shape)}")
        if len(set(term)) != len(term):
            raise Unsupported(f"Einsum term {term!r} repeats a letter (a diagonal)")
        for letter, n in zip(term, shape, strict=True):
            if sizes.setdefault(letter, n) != n:
                raise Unsupported(f"Einsum letter {letter!r} bound to sizes {sizes[letter]} and {n}")
    if arrow:
        output = rhs
        if not _TERM.match(output) or len(set(output)) != len(output) or set(output) - set(sizes):
            raise Unsupported(f"Einsum output {output!r} is not a set of input letters")
    else:  # implicit output: the letters used once, alphabetically
        counts = {c: lhs.count(c) for c in sizes}
        output = "".join(sorted(c for c, n in counts.items() if n == 1))
    shape = checked_output(view, 0, [sizes[c] for c in output])
    its = {c: ir.Iter(_iter_name(c), 0, sizes[c]) for c in sizes}
    body: ir.ValueExpr | None = None
    for term, operand in zip(terms, operands, strict=True):
        factor = access(operand, tuple(its[c] for c in term))
        body = factor if body is None else ir.Binary("*", body, factor)
    traversal = tuple(its[c] for c in output)
    summation = tuple(its[c] for c in sizes if c not in output)
    assert len(traversal) == len(shape)
    return (ir.Scope(traversal, summation, body),)


LINEAR_IMPORTERS: dict[str, Importer] = {
    "MatMul": import_matmul,
    "Gemm": import_gemm,
    "Einsum": import_einsum,
}
