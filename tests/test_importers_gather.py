"""Gather / GatherElements with constant affine indices: imported as reads, checked against ONNX Runtime.

One-node cases compare the interpreter (float64) on the translated program
with ONNX Runtime; refusals say why; a hypothesis test draws random affine
index tensors. A small banded attention (dense QK^T, then a constant-index
gather of the band, as Longformer-style models write it) must translate into
G2BMM / GBMM reads and round-trip through ``einopt.pipeline.optimize``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from test_importers import Case, Typed, build, cases, check, refusal, run_ort

from einopt.core import ir
from einopt.core.index import linear_form
from einopt.core.rewrite import accesses
from einopt.frontend.fold import prepare
from einopt.frontend.importers import translate_single_node
from einopt.frontend.importers_gather import affine_fit, simplify_divmod
from einopt.frontend.operand import Unsupported
from einopt.frontend.translate import translate_graph
from einopt.pipeline import Options, optimize
from einopt.rules.traversal import inline
from einopt.runtime.verify import compare

F32 = np.float32


def _i64(*v) -> np.ndarray:
    return np.array(v, dtype=np.int64)


# --------------------------------------------------------------------------
# One node, checked numerically
# --------------------------------------------------------------------------

_ROWS = np.arange(3)[:, None] * 2 + np.arange(2)[None, :]  # [[0, 1], [2, 3], [4, 5]]


@cases(
    Case("gather-axis0-1d", "Gather", [("x", (5, 3)), ("i", _i64(1, 2, 3))], {"axis": 0}),
    Case("gather-axis0-reversed", "Gather", [("x", (5, 3)), ("i", _i64(4, 2, 0))], {"axis": 0}),
    Case("gather-axis1-2d", "Gather", [("x", (2, 7, 3)), ("i", _ROWS.astype(np.int64))], {"axis": 1}),
    Case("gather-last-axis", "Gather", [("x", (2, 3, 6)), ("i", _i64(0, 2, 4))], {"axis": -1}),
    Case("gather-scalar-index", "Gather", [("x", (4, 5)), ("i", np.array(2, np.int64))], {"axis": 1}),
    Case("gather-negative", "Gather", [("x", (6, 2)), ("i", _i64(-1, -2, -3))], {"axis": 0}),
    Case("gather-mixed-sign", "Gather", [("x", (6, 2)), ("i", _i64(3, -2, 5))], {"axis": 0}),
    Case("gather-int32", "Gather", [("x", (4, 3)), ("i", np.array([[0], [1]], np.int32))], {"axis": 0}),
    Case("gather-repeat", "Gather", [("x", (3, 4)), ("i", np.full((2, 2), 1, np.int64))], {"axis": 1}),
    Case(
        "gather-band-flat",  # the Longformer form on a flattened [n, N] axis: i*N + i + j*d
        "Gather",
        [("x", (2, 4 * 8)), ("i", (np.arange(4)[:, None] * 9 + np.arange(3)[None, :] * 2).astype(np.int64))],
        {"axis": 1},
    ),
    Case("gelem-axis0", "GatherElements", [("x", (4, 3)), ("i", _i64(*[[1, 2, 3]] * 2))], {"axis": 0}),
    Case(
        "gelem-axis1-diag",
        "GatherElements",
        [("x", (3, 5)), ("i", (np.arange(3)[:, None] + np.arange(2)[None, :]).astype(np.int64))],
        {"axis": 1},
    ),
    Case(
        "gelem-band-bcast",  # constant index broadcast over batch and heads: i + 2*j
        "GatherElements",
        [
            ("x", (2, 2, 4, 9)),
            ("i", np.broadcast_to(np.arange(4)[:, None] + 2 * np.arange(3), (2, 2, 4, 3)).astype(np.int64)),
        ],
        {"axis": 3},
    ),
    Case(
        "gelem-negative",
        "GatherElements",
        [("x", (2, 4)), ("i", np.array([[-1, -2], [-1, -2]], np.int64))],
        {"axis": -1},
    ),
    Case(
        "gelem-axis2-3d",
        "GatherElements",
        [("x", (2, 3, 4)), ("i", np.broadcast_to(3 - np.arange(4), (2, 3, 4)).astype(np.int64))],
        {"axis": 2},
    ),
)
def test_gather(case: Case) -> None:
    program = check(case)
    (scope,) = (program.scope(o) for o in program.outputs)
    assert not scope.summation
    for acc in accesses(scope.body):
        assert all(linear_form(i).is_affine for i in acc.indices)


def test_gather_forms() -> None:
    """Gather on a flattened axis is read as a plain affine read of the reshaped tensor."""
    model, _ = build(Case("f", "Gather", [("x", (3, 10)), ("i", _i64(2, 5, 8))], {"axis": 1}))
    program, _ = translate_single_node(model)
    (acc,) = accesses(program.scope(program.outputs[0]).body)
    i0, i1 = program.scope(program.outputs[0]).traversal
    assert acc.indices[0] is i0
    assert linear_form(acc.indices[1]).coeffs == ((i1, 3),) and linear_form(acc.indices[1]).const == 2


@pytest.mark.parametrize(
    "case, reason",
    [
        refusal(
            Case("not-affine", "Gather", [("x", (4, 3)), ("i", _i64(0, 2, 1))]), "not an affine function"
        ),
        refusal(
            Case("not-affine-2d", "Gather", [("x", (9, 3)), ("i", np.array([[0, 1], [2, 4]], np.int64))]),
            "not an affine function",
        ),
        refusal(
            Case("not-constant", "Gather", [("x", (4, 3)), ("i", Typed((2,), TensorProto.INT64))]),
            "not a constant",
        ),
        refusal(Case("out-of-range", "Gather", [("x", (4, 3)), ("i", _i64(1, 4))]), r"outside \[-4, 4\)"),
        refusal(Case("too-negative", "Gather", [("x", (4, 3)), ("i", _i64(-5, 0))]), r"outside \[-4, 4\)"),
        refusal(
            Case(
                "gelem-not-affine",
                "GatherElements",
                [("x", (3, 3)), ("i", np.array([[0, 1], [1, 0]], np.int64))],
                {"axis": 1},
            ),
            "not an affine function",
        ),
        refusal(
            Case(
                "gelem-not-constant",
                "GatherElements",
                [("x", (3, 3)), ("i", Typed((3, 3), TensorProto.INT64))],
            ),
            "not a constant",
        ),
        refusal(
            Case(
                "gelem-out-of-range",
                "GatherElements",
                [("x", (2, 3)), ("i", _i64([0, 3], [1, 1]))],
                {"axis": 1},
            ),
            "outside",
        ),
        refusal(
            Case("gather-to-scalar", "Gather", [("x", (4,)), ("i", np.array(1, np.int64))]),
            "scalar",
        ),
    ],
)
def test_refused(case: Case, reason: str) -> None:
    model, _ = build(case)
    with pytest.raises(Unsupported, match=reason):
        translate_single_node(model)


def test_affine_fit() -> None:
    assert affine_fit(np.array(7)) == (7, ())
    assert affine_fit(np.array([[5, 3], [6, 4]])) == (5, (1, -2))
    assert affine_fit(np.array([[0, 1], [1, 3]])) is None


def test_simplify_divmod_proves_the_band_row() -> None:
    """``(i*N + i + j*d) // N = i`` and ``% N = i + j*d`` when ``i + j*d < N``; not when it may wrap."""
    n, w, d = 5, 2, 3
    big_n = n + 2 * w * d
    i, j = ir.Iter("i", 0, n), ir.Iter("j", 0, 2 * w + 1)
    flat = i * big_n + i + j * d
    assert simplify_divmod(flat // big_n) is i
    assert simplify_divmod(flat % big_n) is simplify_divmod(i + j * d)
    wraps = i * big_n + i + j * (d + 1)
    assert not linear_form(simplify_divmod(wraps // big_n)).is_affine


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_affine_indices(data) -> None:
    """Random shapes, axes and affine index tensors (some written with negative entries)."""
    rank = data.draw(st.integers(1, 3), label="rank")
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank), label="shape"))
    axis = data.draw(st.integers(-rank, rank - 1), label="axis")
    dim = shape[axis]
    elements = data.draw(st.booleans(), label="elements")
    if elements:
        idx_shape = tuple(data.draw(st.integers(1, n), label=f"m{k}") for k, n in enumerate(shape))
    else:
        idx_shape = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2), label="idx_shape"))
    coeffs = [data.draw(st.integers(-2, 2), label=f"c{k}") if m > 1 else 0 for k, m in enumerate(idx_shape)]
    span_lo = sum(min(0, c * (m - 1)) for c, m in zip(coeffs, idx_shape, strict=True))
    span_hi = sum(max(0, c * (m - 1)) for c, m in zip(coeffs, idx_shape, strict=True))
    if span_hi - span_lo >= dim:
        coeffs = [0] * len(idx_shape)
        span_lo = span_hi = 0
    c0 = data.draw(st.integers(-span_lo, dim - 1 - span_hi), label="c0")
    grid = np.indices(idx_shape, dtype=np.int64) if idx_shape else np.zeros((0,), np.int64)
    idx = np.asarray(
        c0 + sum((c * g for c, g in zip(coeffs, grid, strict=True)), np.zeros(idx_shape, np.int64))
    )
    if data.draw(st.booleans(), label="negative"):
        idx = np.asarray(idx - dim)
    op = "GatherElements" if elements else "Gather"
    case = Case(f"hyp-{op}-{shape}-{axis}-{idx.tolist()}", op, [("x", shape), ("i", idx)], {"axis": axis})
    out_rank = rank if elements else rank - 1 + idx.ndim
    if out_rank == 0:
        with pytest.raises(Unsupported, match="scalar"):
            translate_single_node(build(case)[0])
        return
    check(case)


# --------------------------------------------------------------------------
# Banded attention: dense scores + constant-index gathers
# --------------------------------------------------------------------------

BS, N_SEQ, D_MODEL, HEADS, W, DIL = 1, 12, 16, 2, 2, 2
N_PAD = N_SEQ + 2 * W * DIL


def banded_attention(elements: bool = False, seed: int = 0) -> onnx.ModelProto:
    """x -> Q, K, V heads; scores = Q Pad(K)^T; band gathered with constant indices; softmax; P Vg."""
    rng = np.random.default_rng(seed)
    dh, width = D_MODEL // HEADS, 2 * W + 1
    i, j = np.arange(N_SEQ)[:, None], np.arange(width)[None, :]
    arrays = {
        "heads": _i64(BS, N_SEQ, HEADS, dh),
        "pads": _i64(0, 0, W * DIL, 0, 0, 0, W * DIL, 0),
        "flat": _i64(BS, HEADS, N_SEQ * N_PAD),
        "idx_s": (i * N_PAD + i + j * DIL).astype(np.int64),
        "idx_e": np.broadcast_to(i + j * DIL, (BS, HEADS, N_SEQ, width)).astype(np.int64),
        "idx_v": (i + j * DIL).astype(np.int64),
        "ax3": _i64(3),
        "out_shape": _i64(BS, N_SEQ, D_MODEL),
    }
    for p in "qkv":
        arrays[f"W{p}"] = (rng.standard_normal((D_MODEL, D_MODEL)) / np.sqrt(D_MODEL)).astype(F32)
    nodes = []

    def node(op: str, ins: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    heads = {}
    for p in "qkv":
        r = node("Reshape", [node("MatMul", ["x", f"W{p}"], f"{p}_lin"), "heads"], f"{p}_r")
        heads[p] = node("Transpose", [r], f"{p}_t", perm=[0, 2, 1, 3])
    kt = node("Transpose", [node("Pad", [heads["k"], "pads"], "kp")], "kt", perm=[0, 1, 3, 2])
    s = node("MatMul", [heads["q"], kt], "scores")
    if elements:
        band = node("GatherElements", [s, "idx_e"], "band", axis=3)
    else:
        band = node("Gather", [node("Reshape", [s, "flat"], "scores_flat"), "idx_s"], "band", axis=2)
    probs = node("Softmax", [band], "probs", axis=-1)
    vg = node("Gather", [node("Pad", [heads["v"], "pads"], "vp"), "idx_v"], "vg", axis=2)
    o = node("MatMul", [node("Unsqueeze", [probs, "ax3"], "pu"), vg], "o5")
    o = node("Transpose", [node("Squeeze", [o, "ax3"], "o4")], "o_t", perm=[0, 2, 1, 3])
    node("Reshape", [o, "out_shape"], "y")
    used = {n for nd in nodes for n in nd.input}
    graph = helper.make_graph(
        nodes,
        "banded_attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BS, N_SEQ, D_MODEL])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [BS, N_SEQ, D_MODEL])],
        initializer=[numpy_helper.from_array(a, k) for k, a in arrays.items() if k in used],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _see_through(scope: ir.Scope, also: ir.Scope) -> ir.Scope:
    """``scope`` with every legal inlining of copy scopes (and of ``also``) done, as merge_traversal would."""
    changed = True
    while changed:
        changed = False
        for acc in accesses(scope.body):
            src = acc.source
            if isinstance(src, ir.Scope) and (not src.summation or src is also):
                got = inline(scope, acc, "inner")
                if isinstance(got, ir.Scope):
                    scope, changed = got, True
                    break
    return scope


@pytest.mark.parametrize(
    "elements",
    [pytest.param(False, marks=pytest.mark.slow), pytest.param(True, marks=pytest.mark.slow)],
    ids=["gather", "gather-elements"],
)
def test_banded_attention_structure(elements: bool) -> None:
    """The band reads the dense scores at ``[.., i, i + d*j]``; inlined (as merge_traversal does)
    it is the G2BMM ``Sum k: Q[b, i, dh*h + k] * K[b, i + d*j - w*d, dh*h + k]``, and the value
    side the GBMM ``Sum j: P[b, h, i, j] * V[b, i + d*j - w*d, dh*h + e]``."""
    model = prepare(banded_attention(elements)).model
    # Softmax does not cut (partition.ABSORBED): the band, its softmax and the value product are one part.
    (part,) = [p for p in translate_graph(model) if p.program is not None]
    band_prog = y_prog = part.program
    assert band_prog.outputs == ("y",)
    band, scores = band_prog.scope("band"), band_prog.scope("scores")
    b, h, i, j = band.traversal
    (read,) = accesses(band.body)
    assert read.source is scores  # Reshape + Gather seen through: no flat [n*N] axis left
    assert read.indices[2] is i and linear_form(read.indices[3]).coeffs == ((i, 1), (j, DIL))
    g2bmm = _see_through(band, scores)
    (k,) = g2bmm.summation
    reads = accesses(g2bmm.body)
    assert len(reads) == 2
    q, kk = sorted(reads, key=lambda a: a.indices[1] is not i)
    assert q.indices[1] is i
    for proj in (q, kk):  # the projections x W, read per head: P[b, seq, dh*h + k]
        assert isinstance(proj.source, ir.Scope) and proj.source.shape == (BS, N_SEQ, D_MODEL)
        assert linear_form(proj.indices[2]).coeffs == ((h, D_MODEL // HEADS), (k, 1))
    # K read at i + d*j - w*d: the Pad is the out-of-range-reads-are-0 semantics
    assert linear_form(kk.indices[1]).coeffs == ((i, 1), (j, DIL))
    assert linear_form(kk.indices[1]).const == -W * DIL

    o5 = next(s for n, s in y_prog.bindings if n == "o5")
    gbmm = _see_through(o5, o5)
    (kk,) = gbmm.summation
    # The softmax is inline now (partition.ABSORBED): the value side's own read is the V projection.
    _, hh, ii, _, ee = gbmm.traversal
    reads = accesses(gbmm.body)
    v_read = next(a for a in reads if a.source.shape == (BS, N_SEQ, D_MODEL))
    assert v_read.source.shape == (BS, N_SEQ, D_MODEL)  # the V projection, read per head
    assert linear_form(v_read.indices[1]).coeffs == ((ii, 1), (kk, DIL))
    assert linear_form(v_read.indices[1]).const == -W * DIL
    assert linear_form(v_read.indices[2]).coeffs == ((hh, D_MODEL // HEADS), (ee, 1))


@pytest.mark.parametrize(
    "elements",
    [pytest.param(False, marks=pytest.mark.slow), pytest.param(True, marks=pytest.mark.slow)],
    ids=["gather", "gather-elements"],
)
def test_banded_attention_round_trip(elements: bool) -> None:
    model = banded_attention(elements)
    result = optimize(model, Options(accept="verified", states_per_search=1_000, states_per_model=3_000))
    assert result.verified
    statuses = {p.name: p.status for p in result.parts}
    assert [s for s in statuses.values() if s == "rewritten"], statuses
    assert not any(p.status == "failed" for p in result.parts)
    onnx.checker.check_model(result.model, full_check=True)
    # The band reads are eOperators gathering in place: Reshape + (Pad) + Gather, no Transpose of S.
    gathers = [[n.op_type for n in f.node] for f in result.model.functions]
    gathers = [ops for ops in gathers if "Gather" in ops]
    assert len(gathers) == 2 and not any("Transpose" in ops for ops in gathers), gathers
    feeds = {"x": np.random.default_rng(3).standard_normal((BS, N_SEQ, D_MODEL)).astype(F32)}
    (want,) = run_ort(model, feeds)
    (got,) = run_ort(result.model, feeds)
    assert compare({"y": want}, {"y": got}).ok
