"""MultiHeadAttention for the unfused attention core (``match_contrib_attention``).

The cores come from the transformer generators (``einopt.models``: BERT as TorchScript writes it,
ViT as dynamo does), imported, with the layout nodes, the scale, the mask and the softmax inlined
into the product with V as the search's ``fuse_expressions`` does (the Q, K and V projections stay
bound), and from the Python API. Each is matched, emitted, checked, run in ONNX Runtime at both
optimization extremes and compared with the interpreter; near misses are refused with a reason.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_match_contrib import attrs_of, contrib, emit_and_run

import einopt
from einopt.core import ir
from einopt.frontend.fold import prepare
from einopt.frontend.translate import translate_graph
from einopt.instantiate.match import match
from einopt.instantiate.match_contrib import CONTRIB_DOMAIN
from einopt.instantiate.match_contrib_attention import match_multi_head_attention
from einopt.instantiate.plan import MatchContext, OperatorMatch, Refusal
from einopt.instantiate.program import program_model
from einopt.models import build
from einopt.rules import Match, get
from einopt.runtime.opcost import node_costs

MHA = "MultiHeadAttention"


def attention_core(name: str, batch: int) -> tuple[ir.Program, dict[str, np.ndarray]]:
    """A generator's first attention core: the product with V after the Softmax, with everything
    between it and the projections (bindings that read a weight) inlined."""
    model = prepare(build(name, batch, size="small"), {}).model
    part = next(
        p
        for p in translate_graph(model)
        if p.translated and any(model.graph.node[i].op_type == "Softmax" for i in p.nodes)
    )
    program, weights = part.program, set(part.constants)
    names = [n for n, _ in program.bindings]
    soft = next(n for n, s in program.bindings if any(x.is_max for x in ir.scopes_in(s)))
    out = next(n for n in names[names.index(soft) + 1 :] if program.scope(n).summation)
    program = ir.Program(program.inputs, program.bindings[: names.index(out) + 1], (out,))

    def projection(s: ir.Scope) -> bool:
        reads = (a for a in ir.walk(s.body, stop=ir.Access) if isinstance(a, ir.Access))
        return any(isinstance(a.source, ir.Tensor) and a.source.name in weights for a in reads)

    kept = {n for n, s in program.bindings if projection(s)}
    rule = get("fuse_expressions")
    while found := [
        f
        for f in rule.match(program)
        if isinstance(f, Match) and str(f).split("inline ")[-1].split()[0] not in kept
    ]:
        program = rule.apply(program, found[0])
    bindings = tuple((n, s) for n, s in program.bindings if n in kept or n == out)
    used = {t.name for _, s in bindings for t in ir.input_tensors(s)}
    program = ir.Program(tuple(t for t in program.inputs if t.name in used), bindings, (out,))
    return program, {k: v for k, v in part.constants.items() if k in used}


def _ctx(program: ir.Program) -> MatchContext:
    return MatchContext(bound=frozenset(s for _, s in program.bindings))


@pytest.mark.parametrize(("name", "batch"), [("bert", 1), ("bert", 2), ("vit", 1), ("vit", 3)])
def test_generator_attention_cores(name, batch):
    program, constants = attention_core(name, batch)
    (out,) = program.outputs
    chosen, _ = match(program.scope(out), _ctx(program))
    assert chosen is not None and chosen.op_type == f"{CONTRIB_DOMAIN}.{MHA}"
    model, nodes = emit_and_run(program, tuple(constants), rtol=1e-4)
    assert contrib(nodes) == [MHA]
    assert not {"Softmax", "Exp", "ReduceMax", "Div"} & {op for _, op in nodes}
    attrs = attrs_of(model, MHA)
    assert attrs["num_heads"] == 2 and attrs["scale"] == pytest.approx(8**-0.5, rel=1e-6)


def _core(
    b: int = 2,
    heads: int = 2,
    s: int = 5,
    kv: int = 6,
    dh: int = 4,
    dv: int = 3,
    scale: float | None = None,
    mask: str = "",
    divide: bool = False,
    axis: str = "j",
    sources: tuple[ir.Tensor | ir.Scope, ...] = (),
) -> ir.Scope:
    """The core with the Python API: Q [b, s, heads*dh], K [b, kv, heads*dh], V [b, kv, heads*dv]
    (tensors, or the ``sources`` given), output [b, heads, s, dv]; ``mask`` "": none, "key": M[b, j],
    "full": M[b, h, i, j]; the scale multiplied (or ``divide``: the scores divided by sqrt(dh));
    ``axis`` the softmax's."""
    B, H, Iq, J, D, E = (ir.Iter(n, 0, x) for n, x in zip("bhijde", (b, heads, s, kv, dh, dv), strict=True))
    Q, K, V = sources or (
        ir.Tensor("Q", (b, s, heads * dh)),
        ir.Tensor("K", (b, kv, heads * dh)),
        ir.Tensor("V", (b, kv, heads * dv)),
    )
    qk = Q[B, Iq, H * dh + D] * K[B, J, H * dh + D]
    scores = ir.Scope((B, H, Iq, J), (D,), qk * (scale if scale is not None else 1.0 / math.sqrt(dh)))
    if divide:
        scores = ir.Scope((B, H, Iq, J), (D,), qk / math.sqrt(dh))
    x = scores[B, H, Iq, J]
    if mask == "key":
        x = x + ir.Tensor("M", (b, kv))[B, J]
    elif mask == "full":
        x = x + ir.Tensor("M", (b, heads, s, kv))[B, H, Iq, J]
    xs = ir.Scope((B, H, Iq, J), (), x)
    r = ir.Iter("r", 0, kv if axis == "j" else s)
    at = (B, H, Iq, r) if axis == "j" else (B, H, r, J)
    rest = (B, H, Iq) if axis == "j" else (B, H, J)
    m = ir.Scope(rest, (r,), xs[at], (), "max")
    mr = m[(B, H, Iq)] if axis == "j" else m[(B, H, J)]
    total = ir.Scope(rest, (r,), ir.Unary("exp", xs[at] - m[rest]))
    tr = total[(B, H, Iq)] if axis == "j" else total[(B, H, J)]
    p = ir.Scope((B, H, Iq, J), (), ir.Unary("exp", xs[B, H, Iq, J] - mr) / tr)
    J2 = ir.Iter("j2", 0, kv)
    return ir.Scope((B, H, Iq, E), (J2,), p[B, H, Iq, J2] * V[B, J2, H * dv + E])


CORES = [
    ("plain", _core(), {"num_heads": 2, "scale": 0.5}),
    ("one_head_batch_one", _core(b=1, heads=1), {"num_heads": 1}),
    # FusedMatMul would save MatMul the transpose of V here: tried after the attention matchers
    ("batch_one", _core(b=1), {"num_heads": 2}),
    ("scale_given", _core(scale=0.125), {"scale": 0.125}),
    ("scores_divided", _core(divide=True), {"scale": 0.5}),
    ("key_padding_mask", _core(mask="key"), {}),
    ("full_attention_bias", _core(mask="full"), {}),
    ("cross_attention", _core(s=3, kv=7), {}),
]


@pytest.mark.parametrize(("core", "attrs"), [c[1:] for c in CORES], ids=[c[0] for c in CORES])
def test_attention_core(core, attrs):
    chosen, _ = match(core)
    assert chosen is not None and chosen.op_type == f"{CONTRIB_DOMAIN}.{MHA}"
    model, nodes = emit_and_run(core, rtol=1e-4, scale=2.0)
    assert contrib(nodes) == [MHA]
    got = attrs_of(model, MHA)
    assert {k: got[k] for k in attrs} == pytest.approx(attrs)


def test_attention_refusals():
    # a softmax over the query positions is no attention over the keys
    refused = match_multi_head_attention(_core(axis="i", s=6))
    assert isinstance(refused, Refusal) and "computes another function" in refused.reason, refused
    # scaled after the softmax
    core = _core()
    scaled = core.replace(body=ir.Binary("*", core.body, ir.Const(2.0)))
    assert "scaled after the softmax" in match_multi_head_attention(scaled).reason
    # a product without softmax
    plain = match_multi_head_attention(
        einopt.parse("L[i:3, e:2] Sum[j:4] P[i, j] * V[j, e] where P:[3,4], V:[4,2]")
    )
    assert "not a softmax times one tensor V" in plain.reason


def test_bound_scores_are_not_fused():
    """Scores the program binds are computed anyway: the attention is not fused over them."""
    core = _core()
    scores = next(s for s in ir.scopes_in(core) if s.summation and s.summation[0].name == "d")
    program = ir.Program(tuple(ir.input_tensors(core)), (("S", scores), ("Y", core)), ("Y",))
    refused = match_multi_head_attention(core, _ctx(program))
    assert isinstance(refused, Refusal) and "program binding" in refused.reason
    assert isinstance(match_multi_head_attention(core), OperatorMatch)


def test_attention_is_timed_with_its_flops():
    program, constants = attention_core("bert", 1)
    model, _ = program_model(program, constants, light=True)
    (node,) = [n for n in node_costs(model, constants) if n.cost.op == MHA]
    b, s, d, n, heads = 1, 8, 16, 8, 2
    assert node.cost.kind == "timed" and node.cost.flops == 2 * b * s * n * (d + d) + 5 * b * heads * s * n


def test_the_head_merge_after_the_core_is_the_operators_own_layout():
    # The exporters transpose and reshape the core's [B, N, S, dv] back to [B, S, N*dv]: read
    # through that merge, the core is the same operator with no layout step after it.
    program, constants = attention_core("bert", 1)
    (out,) = program.outputs
    core = program.scope(out)
    b, h, i, e = core.traversal
    n = ir.Iter("n", 0, h.extent * e.extent)
    merged = ir.Scope((b, i, n), (), core[b, n // e.extent, i, n % e.extent])
    others = tuple((name, s) for name, s in program.bindings if name != out)
    program = ir.Program(program.inputs, (*others, ("Y", merged)), ("Y",))
    chosen, _ = match(merged, _ctx(program))
    assert chosen is not None and chosen.op_type == f"{CONTRIB_DOMAIN}.{MHA}" and chosen.post == ()
    _, nodes = emit_and_run(program, tuple(constants), rtol=1e-4)
    assert contrib(nodes) == [MHA] and not {"Transpose", "Reshape"} & {op for _, op in nodes}
    # The core bound apart from its merge: the merge is a layout node of its own.
    bound = ir.Program(program.inputs, (*others, (out, core), ("Y", merged)), ("Y",))
    chosen, _ = match(merged, _ctx(bound))
    assert chosen is None or not chosen.op_type.endswith(MHA)


def test_the_interpreter_checks_two_batch_elements_and_every_query_row(monkeypatch):
    """The reading is checked on two batch elements of a larger batch, never on a few query rows:
    a causal mask hides keys from every row but the last, so a reading without it agrees there."""
    from einopt.instantiate import match_contrib_attention

    boxes = []
    real = match_contrib_attention.evaluate
    monkeypatch.setattr(
        match_contrib_attention, "evaluate", lambda *a, **k: boxes.append(k["box"]) or real(*a, **k)
    )
    assert isinstance(match_multi_head_attention(_core(b=3, s=9)), OperatorMatch)
    assert isinstance(match_multi_head_attention(_core(b=1, s=9)), OperatorMatch)
    assert boxes == [((1, 3), (0, 2), (0, 9), (0, 3)), ((0, 1), (0, 2), (0, 9), (0, 3))]


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_the_check_cuts_the_operands_out_and_keeps_the_cores_values(name):
    """The reading is checked on random operands: the projections (and what they read) are cut out
    of the core and read as inputs; the core on the operands' own values is the scope's value."""
    from einopt.core.interp import evaluate
    from einopt.instantiate.match_contrib_attention import _cut, _cut_sources, _readings

    program, constants = attention_core(name, 2)
    (out,) = program.outputs
    scope = program.scope(out)
    (att, _), *_ = _readings(scope)
    sources = _cut_sources(scope, att.operands)
    assert sources and all(isinstance(s, ir.Scope) for s in sources)
    core, cut = _cut(scope, sources)
    weights = {t.name for t in ir.input_tensors(scope) if t.name in constants}
    # The projections are cut: the core reads no projection weight.
    assert not weights & {t.name for t in ir.input_tensors(core)}
    rng = np.random.default_rng(0)
    inputs = {t.name: rng.standard_normal(t.shape) for t in ir.input_tensors(scope)}
    inputs |= {cut[s].name: np.asarray(evaluate(s, inputs)) for s in sources}
    want = np.asarray(evaluate(scope, inputs))
    np.testing.assert_allclose(np.asarray(evaluate(core, inputs)), want, rtol=1e-9, atol=1e-9)


def test_a_source_tied_to_the_core_is_not_cut():
    """A softmax whose numerator subtracts a row maximum computed as its own scope: that maximum
    reads what the core reads, so it keeps its values (a random one would break the shift)."""
    from einopt.instantiate.match_contrib_attention import _cut_sources
    from einopt.instantiate.plan import Operand

    b, m, n = ir.Iter("b", 0, 2), ir.Iter("m", 0, 3), ir.Iter("n", 0, 4)
    k = ir.Iter("k", 0, 4)
    x, y = ir.Tensor("x", (2, 3, 4)), ir.Tensor("y", (2, 3, 4))
    scores = ir.Scope((b, m, n), (), x[b, m, n] * 2.0)
    row_max = ir.Scope((b, m), (k,), scores[b, m, k], reduce="max")
    operand = (Operand(row_max, ()),)
    # The core reads the scores the maximum reads, or the tensor they read: tied.
    assert _cut_sources(ir.Scope((b, m, n), (), scores[b, m, n] - row_max[b, m]), operand) == ()
    assert _cut_sources(ir.Scope((b, m, n), (), x[b, m, n] * 2.0 - row_max[b, m]), operand) == ()
    # Read beside another tensor only, it is an operand like any other.
    assert _cut_sources(ir.Scope((b, m, n), (), y[b, m, n] - row_max[b, m]), operand) == (row_max,)
