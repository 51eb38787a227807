"""com.microsoft RotaryEmbedding: the matcher's refusals, and the search finding it on an exporter's graph."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx_models import assert_same_outputs, make, random_feeds

import einopt
from einopt.instantiate.match_contrib_rotary import match_rotary_embedding, turns_half
from einopt.instantiate.plan import MatchContext, OperatorMatch, Refusal
from einopt.pipeline import Options, optimize

ROPE = "X[b, n, s, d] * C[s, d] + (neg(X[b, n, s, d + 4]) + X[b, n, s, d - 4]) * S[s, d]"


def _tables(positions: int, head: int) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / 10000.0 ** (np.arange(0, head, 2) / head)
    emb = np.concatenate([np.outer(np.arange(positions), inv)] * 2, axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def _match(body: str, values: dict[str, np.ndarray] | None = None):
    prog = einopt.parse(
        f"Y = L[b:2, n:3, s:5, d:8] {body}\nreturn Y\nwhere X: [2, 3, 5, 8], C: [5, 8], S: [5, 8]"
    )
    scope = prog.scope("Y")
    tensors = frozenset(t for t in prog.inputs if t.name in ("C", "S"))
    cos, sin = _tables(5, 8)
    values = {"C": cos, "S": sin} if values is None else values
    return match_rotary_embedding(scope, MatchContext(constant=tensors, values=values)), scope


def test_the_half_split_rotation_with_llama_tables_matches():
    found, scope = _match(ROPE)
    assert isinstance(found, OperatorMatch), found
    assert turns_half(scope)
    cos, sin = _tables(5, 8)
    op = found.ops[0]
    assert op.op_type == "RotaryEmbedding" and dict(op.attrs) == {"interleaved": 0}
    np.testing.assert_allclose(found.operands[2].source.value, cos[:, :4], rtol=1e-6)
    np.testing.assert_allclose(found.operands[3].source.value, sin[:, :4], rtol=1e-6)


def test_the_other_sense_of_rotation_is_a_negated_sin_cache():
    found, _ = _match("X[b, n, s, d] * C[s, d] + (X[b, n, s, d + 4] + neg(X[b, n, s, d - 4])) * S[s, d]")
    assert isinstance(found, OperatorMatch), found
    np.testing.assert_allclose(found.operands[3].source.value, -_tables(5, 8)[1][:, :4], rtol=1e-6)


@pytest.mark.parametrize(
    ("body", "values", "reason"),
    [
        # tables whose halves differ: the operator keeps one cos and one sin per pair
        (ROPE, {"C": np.arange(40.0).reshape(5, 8), "S": np.ones((5, 8))}, "repeat its halves"),
        # the halves swapped but neither negated: a reflection, not a rotation
        (
            "X[b, n, s, d] * C[s, d] + (X[b, n, s, d + 4] + X[b, n, s, d - 4]) * S[s, d]",
            None,
            "turned by one table",
        ),
        # a square of the input: not linear in its reads
        ("X[b, n, s, d] * X[b, n, s, d] * C[s, d] + X[b, n, s, d + 4] * S[s, d]", None, "not linear"),
        # nothing half a dimension away (a shift by one)
        ("X[b, n, s, d] * C[s, d] + X[b, n, s, d + 1] * S[s, d]", None, "half a dimension"),
        # the tables' values unknown (a search context without them)
        (ROPE, {}, "not known"),
    ],
    ids=["tables", "reflection", "nonlinear", "no_half_turn", "no_values"],
)
def test_refusals(body, values, reason):
    found, _ = _match(body, values)
    assert isinstance(found, Refusal) and reason in found.reason, found


def _llama_rope():
    """LLaMA's ``apply_rotary_pos_emb`` on q [1, 2, 6, 8] as torch.onnx writes it: Slice, Slice, Neg,
    Concat (rotate_half), Mul by cos, Mul by sin, Add; cos and sin folded to constants."""
    cos, sin = _tables(6, 8)
    inits = {
        "cos": cos.reshape(1, 1, 6, 8),
        "sin": sin.reshape(1, 1, 6, 8),
        "zero": np.array([0], np.int64),
        "four": np.array([4], np.int64),
        "eight": np.array([8], np.int64),
        "axis": np.array([3], np.int64),
    }
    nodes = [
        helper.make_node("Slice", ["q", "zero", "four", "axis"], ["x1"]),
        helper.make_node("Slice", ["q", "four", "eight", "axis"], ["x2"]),
        helper.make_node("Neg", ["x2"], ["nx2"]),
        helper.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
        helper.make_node("Mul", ["q", "cos"], ["qc"]),
        helper.make_node("Mul", ["rot", "sin"], ["rs"]),
        helper.make_node("Add", ["qc", "rs"], ["y"]),
    ]
    return make(nodes, [("q", [1, 2, 6, 8])], [("y", [1, 2, 6, 8])], inits, name="llama_rope")


def test_the_search_finds_rotary_embedding_on_an_exporters_graph(tmp_path):
    model = _llama_rope()
    result = optimize(
        model,
        Options(
            accept="verified", cache=tmp_path / "c.sqlite", states_per_search=1_000, states_per_model=2_000
        ),
    )
    (part,) = [p for p in result.parts if "Concat" in p.ops]
    assert part.status == "rewritten", part.reason
    assert list(part.new_ops) == ["com.microsoft.RotaryEmbedding"], part.new_ops
    assert_same_outputs(model, result.model, random_feeds(model, seed=1))


def test_the_tables_answer_is_kept_across_copies_of_the_constants_mapping(monkeypatch):
    """Every instantiation copies the constants mapping, never its arrays: the match table's answer
    is kept per the arrays (by identity), and asked again on other arrays it is computed again."""
    from einopt.instantiate import match as table

    # S of 6 positions: a scope no other test matched
    prog = einopt.parse(
        f"Y = L[b:2, n:3, s:5, d:8] {ROPE}\nreturn Y\nwhere X: [2, 3, 5, 8], C: [5, 8], S: [6, 8]"
    )
    scope = prog.scope("Y")
    tensors = frozenset(t for t in prog.inputs if t.name in ("C", "S"))
    cos, sin = _tables(6, 8)
    values = {"C": cos[:5], "S": sin}

    def ctx(v):
        return MatchContext(constant=tensors, values=dict(v))

    found, _ = table.match(scope, ctx(values))
    assert found is not None and found.op_type.endswith("RotaryEmbedding")
    calls = []
    real = table._match
    monkeypatch.setattr(table, "_match", lambda *a: calls.append(a) or real(*a))
    assert table.match(scope, ctx(values))[0] is found and not calls
    table.match(scope, ctx({k: v.copy() for k, v in values.items()}))
    assert len(calls) == 1
