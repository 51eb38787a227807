"""Band products (G2BMM, GBMM) as blocked batched MatMuls: every form checked in ONNX Runtime
against the reference interpreter (``run_onnx``), and the forms that are not band products refused."""

from __future__ import annotations

import pytest
from test_instantiate import as_program, run_onnx

from einopt.instantiate.match_band import band_form, block_rows, match_band
from einopt.instantiate.plan import OperatorMatch, Refusal

G2BMM = "L[b:{b}, i:{m}, w:{w}] Sum[k:{k}] A[b, i, k] * B[b, i + {d}*w + {c}, k] where A: [{b}, {m}, {k}], B: [{b}, {r}, {k}]"
GBMM = "L[b:{b}, i:{m}, n:{k}] Sum[w:{w}] A[b, i, w] * B[b, i + {d}*w + {c}, n] where A: [{b}, {m}, {w}], B: [{b}, {r}, {k}]"


@pytest.mark.parametrize("text", [G2BMM, GBMM], ids=["g2bmm", "gbmm"])
@pytest.mark.parametrize(
    "m, w, d, c, r",
    [
        (16, 5, 1, -2, 16),  # the band runs off both ends of B: zeros
        (16, 5, 1, 0, 20),  # B holds every row the band reads
        (13, 3, 4, -4, 21),  # dilation 4, rows not a multiple of it
        (40, 7, 2, -6, 40),  # several blocks per residue
        (7, 9, 1, -4, 7),  # a window wider than the rows: one block
    ],
)
def test_band_products_run_as_blocked_matmuls(text, m, w, d, c, r):
    program = as_program(text.format(b=3, m=m, w=w, k=4, d=d, c=c, r=r))
    ((_, scope),) = program.bindings
    found = match_band(scope)
    assert isinstance(found, OperatorMatch), found
    _, ops = run_onnx(program)
    assert "MatMul" in ops and "Gather" in ops and "Einsum" not in ops, ops


def test_a_scaled_band_with_batch_axes_in_any_order_and_unit_axes():
    text = (
        "L[u:1, h:2, i:10, g:3, w:5] Sum[k:4] 0.5 * Q[g, 0, h, i, k] * K[k, h, i + w - 2, g] "
        "where Q: [3, 1, 2, 10, 4], K: [4, 2, 10, 3]"
    )
    program = as_program(text)
    _, ops = run_onnx(program)
    assert "MatMul" in ops and "Einsum" not in ops, ops


def test_a_band_read_through_a_nested_scope_with_an_origin():
    """Longformer's keys: zero-padded by a scope whose range starts at 96, read transposed."""
    text = (
        "T = L[h:2, k:4, j=6:26] P[h, j - 6, k]\n"
        "S = L[h:2, i:20, w:7] Sum[k:4] Q[h, i, k] * T[h, k, i + 2*w]\n"
        "return S\n"
        "where P: [2, 20, 4], Q: [2, 20, 4]"
    )
    _, ops = run_onnx(as_program(text))
    assert "Gather" in ops and "MatMul" in ops, ops


@pytest.mark.parametrize(
    "text, why",
    [
        ("L[i:8, j:8] Sum[k:4] A[i, k] * B[j, k] where A: [8, 4], B: [8, 4]", "diagonal"),
        ("L[i:8, w:3] Sum[k:4] A[i, k] * B[2*i + w, k] where A: [8, 4], B: [20, 4]", "diagonal"),
        ("L[i:8, w:3] Sum[k:4] A[i, k] * B[i - w, k] where A: [8, 4], B: [20, 4]", "diagonal"),
        ("L[i:8, w:3] Sum[k:4] A[i, k] * B[i + w, k] * C[k] where A: [8, 4], B: [20, 4], C: [4]", "3 reads"),
        ("L[i:8, w:3] Sum[k:4, l:2] A[i, k] * B[i + w, k] where A: [8, 4], B: [20, 4]", "one iterator"),
    ],
    ids=["dense", "strided_rows", "reversed_window", "three_reads", "two_sums"],
)
def test_what_is_not_a_band_product_is_refused(text, why):
    ((_, scope),) = as_program(text).bindings
    found = band_form(scope)
    assert isinstance(found, Refusal) and why in found.reason, found


@pytest.mark.parametrize(
    "window, rows, block", [(49, 512, 32), (3, 100, 2), (5, 2, 2), (1, 10, 1), (200, 16, 16)]
)
def test_blocks_are_a_power_of_two_at_least_half_the_window(window, rows, block):
    assert block_rows(window, rows) == block
