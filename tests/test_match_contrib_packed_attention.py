"""com.microsoft Attention for the attention core of projections of one input
(``match_contrib_attention.match_attention``, ``match_contrib_projection``).

The cores are MultiHeadAttention's (``test_match_contrib_attention``) whose Q, K and V are inline
projections of one input X: from the transformer generators (the projections' bindings unbound,
the layer's input kept an input or a binding), from the shared BERT export, and from the Python API
(MatMul's and Gemm's weight views, a projection without a bias, V's own hidden size). Each is
matched, emitted, checked, run in ONNX Runtime at both optimization extremes and compared with the
interpreter; near misses are refused with a reason, and MultiHeadAttention takes them.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from shared_models import needs_shared, path
from test_match_contrib import attrs_of, contrib, emit_and_run
from test_match_contrib_attention import _core, attention_core

from einopt.core import ir
from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.instantiate import match_contrib_attention
from einopt.instantiate.match import MATCHERS, PREFERRED, match
from einopt.instantiate.match_contrib import CONTRIB_DOMAIN
from einopt.instantiate.match_contrib_attention import (
    ATTENTION_MATCHERS,
    match_attention,
    match_multi_head_attention,
)
from einopt.instantiate.match_contrib_projection import read_projection
from einopt.instantiate.plan import MatchContext, OperatorMatch, Refusal
from einopt.instantiate.program import program_model
from einopt.runtime import modelio
from einopt.runtime.opcost import _single, node_costs

ATTENTION = "Attention"
NO_CORE_OPS = {"MatMul", "Gemm", "Softmax", "Exp", "ReduceMax", "Div", "MultiHeadAttention"}


def _bound_reads(scope: ir.Scope, bound: set[ir.Scope]) -> list[ir.Scope]:
    """The bound scopes ``scope`` reads, directly or through inline scopes."""
    out, stack, seen = [], [scope], set()
    while stack:
        s = stack.pop()
        for a in ir.walk(s.body, stop=ir.Access):
            if isinstance(a, ir.Access) and isinstance(a.source, ir.Scope) and a.source not in seen:
                seen.add(a.source)
                (out if a.source in bound else stack).append(a.source)
    return out


def packed_core(name: str, batch: int) -> tuple[ir.Program, dict[str, np.ndarray]]:
    """``attention_core`` with Q's, K's and V's projections unbound too: the bindings the core reads
    (the bias forms) and the contractions they read; the layer's input stays an input or a binding."""
    program, constants = attention_core(name, batch)
    (out,) = program.outputs
    bound = {s for _, s in program.bindings}
    reads = _bound_reads(program.scope(out), bound)
    products = {p for s in reads if not s.summation for p in _bound_reads(s, bound) if p.summation}
    bindings = tuple((n, s) for n, s in program.bindings if s not in {*reads, *products})
    return ir.Program(program.inputs, bindings, (out,)), constants


def _ctx(program: ir.Program, constants) -> MatchContext:
    return MatchContext(
        constant=frozenset(t for t in program.inputs if t.name in constants),
        bound=frozenset(s for _, s in program.bindings),
    )


def _initializers(model: onnx.ModelProto) -> set[str]:
    return {t.name for t in model.graph.initializer}


def _weights_folded(model: onnx.ModelProto) -> None:
    """The Attention node's weights and bias are initializers (packed at compile time)."""
    (node,) = [n for n in model.graph.node if n.op_type == ATTENTION]
    assert set(node.input[1:3]) <= _initializers(model), list(node.input)


@pytest.mark.parametrize(("name", "batch"), [("bert", 1), ("bert", 2), ("vit", 1), ("vit", 3)])
def test_generator_attention_with_projections(name, batch):
    program, constants = packed_core(name, batch)
    (out,) = program.outputs
    assert len(program.bindings) < len(attention_core(name, batch)[0].bindings)
    chosen, _ = match(program.scope(out), _ctx(program, constants))
    assert chosen is not None and chosen.op_type == f"{CONTRIB_DOMAIN}.{ATTENTION}"
    model, nodes = emit_and_run(program, tuple(constants), rtol=1e-4)
    assert contrib(nodes) == [ATTENTION]
    assert not NO_CORE_OPS & {op for _, op in nodes}, nodes
    _weights_folded(model)
    attrs = attrs_of(model, ATTENTION)
    assert attrs["num_heads"] == 2 and attrs["scale"] == pytest.approx(8**-0.5, rel=1e-6)
    assert "qkv_hidden_sizes" not in attrs


# --------------------------------------------------------------------------
# The Python API
# --------------------------------------------------------------------------


def _projection(
    x: ir.Tensor, w: ir.Tensor, bias: ir.Tensor | None, transposed: bool = False, scale: float = 1.0
) -> ir.Scope:
    """``bias[n] + Sum_k scale * X[b, s, k] * W[k, n]`` (``transposed``: ``W[n, k]``, Gemm's transB)
    as the importers write it: the contraction inside a bias form."""
    (b, s, hidden), width = x.shape, w.shape[0] if transposed else w.shape[1]
    B, S, N, K = (ir.Iter(n, 0, e) for n, e in zip("bsnk", (b, s, width, hidden), strict=True))
    body = x[B, S, K] * (w[N, K] if transposed else w[K, N])
    product = ir.Scope((B, S, N), (K,), body * scale if scale != 1.0 else body)
    if bias is None:
        return product
    return ir.Scope((B, S, N), (), bias[N] + product[B, S, N])


def _packed(
    b: int = 2,
    heads: int = 2,
    s: int = 5,
    hidden: int = 6,
    dh: int = 4,
    dv: int = 4,
    biased: str = "qkv",
    transposed: str = "",
    inputs: str = "XXX",
    mask: str = "",
    shift: int = 0,
) -> tuple[ir.Scope, tuple[str, ...]]:
    """The core of ``_core`` over projections of the input ``X [b, s, hidden]`` (the letters of
    ``inputs``: each projection's input), the projections in ``biased`` with a bias, those in
    ``transposed`` reading their weight as Gemm's transB, each read through a layout scope at the
    position ``shift`` before; and the names of the constants."""
    sources = []
    for name, x_name, width in zip("qkv", inputs, (dh, dh, dv), strict=True):
        n = heads * width
        w = ir.Tensor(f"W{name}", (n, hidden) if name in transposed else (hidden, n))
        bias = ir.Tensor(f"b{name}", (n,)) if name in biased else None
        p = _projection(ir.Tensor(x_name, (b, s, hidden)), w, bias, name in transposed)
        B, S, N = p.traversal
        sources.append(ir.Scope((B, S, N), (), p[B, S - shift, N]) if shift else p)
    core = _core(b=b, heads=heads, s=s, kv=s, dh=dh, dv=dv, mask=mask, sources=tuple(sources))
    return core, tuple(t.name for t in ir.input_tensors(core) if t.name[0] in "Wb")


PACKED = [
    ("matmul_weights", _packed(), {"num_heads": 2, "scale": 0.5}),
    ("gemm_weights", _packed(transposed="qv"), {}),
    ("projections_without_bias", _packed(biased="q"), {}),
    ("no_bias_at_all", _packed(biased=""), {}),
    ("value_hidden_size", _packed(dv=3), {"qkv_hidden_sizes": [8, 8, 6]}),
    ("key_padding_mask", _packed(mask="key"), {}),
    ("one_head_batch_one", _packed(b=1, heads=1), {"num_heads": 1}),
    ("batch_one", _packed(b=1), {"num_heads": 2}),
]


@pytest.mark.parametrize(("core", "attrs"), [c[1:] for c in PACKED], ids=[c[0] for c in PACKED])
def test_packed_attention(core, attrs):
    scope, constants = core
    ctx = MatchContext(constant=frozenset(t for t in ir.input_tensors(scope) if t.name in constants))
    chosen, _ = match(scope, ctx)
    assert chosen is not None and chosen.op_type == f"{CONTRIB_DOMAIN}.{ATTENTION}"
    model, nodes = emit_and_run(scope, constants, rtol=1e-4, scale=0.7)
    assert contrib(nodes) == [ATTENTION]
    assert not NO_CORE_OPS & {op for _, op in nodes}, nodes
    _weights_folded(model)
    got = attrs_of(model, ATTENTION)
    for k, want in attrs.items():
        assert got[k] == pytest.approx(want), k
    assert ("qkv_hidden_sizes" in got) == ("qkv_hidden_sizes" in attrs)


def test_projection_scale_and_scalar_bias():
    """A projection's constant factor goes into its packed weight, a constant added into its bias,
    and a scaled read of the projection (Q scaled before the scores) into both."""
    x, w = ir.Tensor("X", (2, 5, 6)), ir.Tensor("Wq", (6, 8))
    B, S, N, K = (ir.Iter(n, 0, e) for n, e in zip("bsnk", (2, 5, 8, 6), strict=True))
    product = ir.Scope((B, S, N), (K,), x[B, S, K] * w[K, N] * 0.25)
    q = ir.Scope((B, S, N), (), product[B, S, N] + 1.5)
    q = ir.Scope((B, S, N), (), q[B, S, N] * 0.5)
    k = _projection(x, ir.Tensor("Wk", (6, 8)), ir.Tensor("bk", (8,)), scale=2.0)
    v = _projection(x, ir.Tensor("Wv", (6, 8)), None)
    core = _core(b=2, heads=2, s=5, kv=5, dh=4, dv=4, sources=(q, k, v))
    constants = ("Wq", "Wk", "bk", "Wv")
    ctx = MatchContext(constant=frozenset(t for t in ir.input_tensors(core) if t.name in constants))
    assert match_attention(core, ctx).op_type == f"{CONTRIB_DOMAIN}.{ATTENTION}"
    _, nodes = emit_and_run(core, constants, rtol=1e-4)
    assert contrib(nodes) == [ATTENTION]


# --------------------------------------------------------------------------
# Near misses
# --------------------------------------------------------------------------


def _constant_ctx(scope: ir.Scope, names: tuple[str, ...], bound=frozenset()) -> MatchContext:
    return MatchContext(
        constant=frozenset(t for t in ir.input_tensors(scope) if t.name in names), bound=bound
    )


def test_two_inputs_are_refused_and_left_to_multi_head_attention():
    core, constants = _packed(inputs="XYX")
    ctx = _constant_ctx(core, constants)
    refused = match_attention(core, ctx)
    assert isinstance(refused, Refusal) and "one same input X" in refused.reason, refused
    chosen, _ = match(core, ctx)
    assert chosen.op_type == f"{CONTRIB_DOMAIN}.MultiHeadAttention"


def test_a_weight_not_constant_is_refused():
    core, constants = _packed()
    refused = match_attention(core, _constant_ctx(core, tuple(c for c in constants if c != "Wk")))
    assert isinstance(refused, Refusal) and refused.reason == "K: the weight Wk is not a constant", refused
    # the analysis depends on the constants: with Wk constant, the same scope is Attention
    assert isinstance(match_attention(core, _constant_ctx(core, constants)), OperatorMatch)
    refused = match_attention(core, _constant_ctx(core, tuple(c for c in constants if c != "bv")))
    assert isinstance(refused, Refusal) and refused.reason == "V: the bias is not a constant", refused


def test_bound_projections_are_refused():
    core, constants = _packed()
    q_bias_form = next(
        s
        for s in ir.scopes_in(core)
        if not s.summation and s.shape == (2, 5, 8) and "Wq" in {t.name for t in ir.input_tensors(s)}
    )
    refused = match_attention(core, _constant_ctx(core, constants, frozenset({q_bias_form})))
    assert isinstance(refused, Refusal) and "projection of Q is a program binding" in refused.reason
    # a contraction bound inside an inline bias form: fusing it would compute it twice
    product = next(s for s in ir.scopes_in(q_bias_form) if s.summation)
    refused = match_attention(core, _constant_ctx(core, constants, frozenset({product})))
    assert isinstance(refused, Refusal) and "program binding" in refused.reason, refused
    assert match_multi_head_attention(core, _constant_ctx(core, constants, frozenset({product}))).op_type


def test_tensors_and_other_products_are_no_projections():
    refused = match_attention(_core())
    assert isinstance(refused, Refusal) and refused.reason == "Q: reads the tensor Q, not a projection"
    # K as an elementwise product of two inputs: not an input times a weight
    x, y = ir.Tensor("X", (2, 5, 8)), ir.Tensor("Y", (2, 5, 8))
    B, S, N = (ir.Iter(n, 0, e) for n, e in zip("bsn", (2, 5, 8), strict=True))
    k = ir.Scope((B, S, N), (), x[B, S, N] * y[B, S, N])
    q, _, v = (_projection(ir.Tensor("X6", (2, 5, 6)), ir.Tensor(f"W{n}", (6, 8)), None) for n in "qkv")
    core = _core(sources=(q, k, v), s=5, kv=5, dv=4)
    refused = match_attention(core, _constant_ctx(core, ("Wq", "Wv")))
    assert isinstance(refused, Refusal) and refused.reason.startswith("K: not a projection plus a bias")


def test_reads_outside_a_layout_scope_are_refused():
    """Q, K and V read at the previous position (zero at the first): the zero row is no projection of
    X (its bias would be there), though X is read the same way by all three."""
    core, constants = _packed(shift=1)
    refused = match_attention(core, _constant_ctx(core, constants))
    assert isinstance(refused, Refusal) and "outside its range" in refused.reason, refused


def test_a_read_without_positions_is_no_projection():
    """A read of Q whose query positions have no role (one position, dropped) is refused, not a
    KeyError (MultiHeadAttention reads such a Q; Attention's input needs the positions)."""
    core, constants = _packed()
    (att, _), *_ = match_contrib_attention._readings(core)
    acc, roles = att.reads[0]
    without = {it: r for it, r in roles.items() if r != "i"}
    refused = read_projection(acc, without, "i", "d", _constant_ctx(core, constants))
    assert isinstance(refused, Refusal) and "no i positions" in refused.reason, refused


def test_bound_projections_are_refused_before_evaluating(monkeypatch):
    """Projections the program binds are refused from MultiHeadAttention's readings: no evaluation."""
    core, constants = _packed(s=7)  # a scope of its own (no other test matched it)
    sources = [a.source for a in ir.walk(core, stop=ir.Access) if isinstance(a, ir.Access)]
    bound = frozenset(s for s in sources if isinstance(s, ir.Scope) and not s.summation)

    def unused(*args, **kwargs):
        raise AssertionError("evaluated")

    monkeypatch.setattr(match_contrib_attention, "evaluate", unused)
    refused = match_attention(core, _constant_ctx(core, constants, bound))
    assert isinstance(refused, Refusal) and "program binding" in refused.reason


def test_attention_is_tried_before_multi_head_attention():
    names = list(MATCHERS)
    assert names.index(ATTENTION) < names.index("MultiHeadAttention") < names.index("FusedMatMul")
    assert PREFERRED[ATTENTION] is ATTENTION_MATCHERS[ATTENTION]  # match_attention, through the head merge


# --------------------------------------------------------------------------
# Costing, and the shared BERT export
# --------------------------------------------------------------------------


def test_attention_is_timed_with_its_flops():
    program, constants = packed_core("bert", 1)
    model, _ = program_model(program, constants, light=True)
    (node,) = [n for n in node_costs(model, constants) if n.cost.op == ATTENTION]
    b, s, d, h, heads = 1, 8, 16, 48, 2
    flops = 2 * b * s * d * h + b * s * h + 2 * b * s * s * (16 + 16) + 5 * b * heads * s * s
    assert node.cost.kind == "timed" and node.cost.flops == flops
    single, feeds = _single(node, np.random.default_rng(0))
    assert modelio.run(single, feeds, ["out0"])["out0"].shape == (1, 8, 16)


@needs_shared
def test_shared_bert_attention():
    """bert_tiny's first attention subprogram with the projections, layout scopes, scores and softmax
    unbound (its input is the embeddings' LayerNorm, a program input) is one Attention."""
    model = prepare(onnx.load(path("bert_tiny")), {}).model
    part = next(
        p
        for p in translate_graph(model)
        if p.translated and any(model.graph.node[i].op_type == "Softmax" for i in p.nodes)
    )
    program, constants = part.program, part.constants
    names = [n for n, _ in program.bindings]
    soft = next(n for n, s in program.bindings if any(x.is_max for x in ir.scopes_in(s)))
    out = next(n for n in names[names.index(soft) + 1 :] if program.scope(n).summation)
    inner = set(ir.scopes_in(program.scope(out))) - {program.scope(out)}
    program = program.replace(bindings=tuple((n, s) for n, s in program.bindings if s not in inner))
    chosen, _ = match(program.scope(out), _ctx(program, constants))
    assert chosen is not None and chosen.op_type == f"{CONTRIB_DOMAIN}.{ATTENTION}"
    emitted, nodes = emit_and_run(program, tuple(constants), rtol=1e-4)
    assert contrib(nodes).count(ATTENTION) == 1
    assert not {"Softmax", "Exp", "ReduceMax"} & {op for _, op in nodes}
    attrs = attrs_of(emitted, ATTENTION)
    assert attrs["num_heads"] == 2 and attrs["scale"] == pytest.approx(1 / math.sqrt(64), rel=1e-6)
    _weights_folded(emitted)
