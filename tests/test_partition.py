"""Grouping nodes into convex subprograms (einopt.frontend.partition)."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from einopt.frontend.partition import group_nodes


def _nodes(spec: str) -> list[onnx.NodeProto]:
    """'a,b->c; c->d' style: one node per ';', inputs -> outputs."""
    out = []
    for k, part in enumerate(spec.split(";")):
        ins, outs = part.split("->")
        out.append(
            helper.make_node(
                "Op",
                [i.strip() for i in ins.split(",") if i.strip()],
                [o.strip() for o in outs.split(",")],
                name=f"n{k}",
            )
        )
    return out


def _groups(spec: str, kinds: str, constants=frozenset()) -> list[tuple[tuple[int, ...], str]]:
    table = {"L": "linear", "A": "activation", "-": None}
    return [(g.nodes, g.kind) for g in group_nodes(_nodes(spec), [table[c] for c in kinds], constants)]


@pytest.mark.parametrize(
    ("spec", "kinds", "expected"),
    [
        # conv -> add -> relu -> conv: two linear groups around the activation
        ("x->a; a->b; b->c; c->d", "LLAL", [((0, 1), "linear"), ((2,), "activation"), ((3,), "linear")]),
        # two matmuls reading the same input join (inter-expression merging needs them together)
        ("x->a; x->b; a,b->c", "LLL", [((0, 1, 2), "linear")]),
        # a path that leaves the group through an activation and comes back: no merge
        ("x->a; a->b; a,b->c", "LAL", [((0,), "linear"), ((1,), "activation"), ((2,), "linear")]),
        # passed-through node between two linear nodes
        ("x->a; a->b; b->c", "L-L", [((0,), "linear"), ((2,), "linear")]),
        # residual: y = conv(relu(conv(x))) + x: the first conv shares x with the add, but the path
        # conv1 -> relu -> conv2 -> add leaves and re-enters, so conv1 stays alone
        ("x->a; a->b; b->c; c,x->d", "LALL", [((0,), "linear"), ((1,), "activation"), ((2, 3), "linear")]),
    ],
    ids=["chain", "shared-input", "no-cycle", "passthrough", "residual"],
)
def test_grouping(spec, kinds, expected):
    assert _groups(spec, kinds) == expected


def test_shared_constant_does_not_join():
    assert _groups("x,w->a; y,w->b", "LL", constants={"w"}) == [((0,), "linear"), ((1,), "linear")]
    assert _groups("x,w->a; y,w->b", "LL") == [((0, 1), "linear")]


def test_groups_are_convex_on_a_random_dag():
    """No group may have a path that leaves it and comes back (checked by brute force)."""
    import random

    rng = random.Random(7)
    for _ in range(30):
        n = 14
        specs = []
        for i in range(n):
            ins = sorted({f"v{j}" for j in rng.sample(range(i), min(i, rng.randint(1, 2)))} or {"x"})
            specs.append(f"{','.join(ins)}->v{i}")
        kinds = "".join(rng.choice("LLLA-") for _ in range(n))
        nodes = _nodes(";".join(specs))
        groups = group_nodes(
            nodes, [{"L": "linear", "A": "activation", "-": None}[c] for c in kinds], frozenset()
        )
        succ = {i: [j for j in range(n) if f"v{i}" in nodes[j].input] for i in range(n)}
        for g in groups:
            members = set(g.nodes)
            # every node reachable from the group through an outside node must be outside the group
            frontier = [j for i in members for j in succ[i] if j not in members]
            seen = set(frontier)
            while frontier:
                k = frontier.pop()
                assert k not in members, (kinds, specs, g)
                for j in succ[k]:
                    if j not in seen:
                        seen.add(j)
                        frontier.append(j)


def _translated_groups(nodes, inits) -> list[tuple[str, list[str]]]:
    import numpy as np
    from onnx import TensorProto, numpy_helper

    from einopt.frontend.fold import prepare
    from einopt.frontend.translate import translate_graph

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.full(s, 0.1, np.float32), n) for n, s in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = prepare(model).model
    by_index = list(model.graph.node)
    return [(p.kind, [by_index[i].op_type for i in p.nodes]) for p in translate_graph(model)]


def test_gelu_joins_the_mlp_and_a_layernorm_ends_its_group():
    # A BERT MLP as torch.onnx writes it: MatMul + bias, GELU as Div/Erf/Add/Mul/Mul, MatMul + bias,
    # the residual Add, then LayerNormalization; a LayerNormalization's reader starts a new group.
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "W1"], ["h1"]),
        n("Add", ["h1", "b1"], ["h"]),
        n("Div", ["h", "sqrt2"], ["d"]),
        n("Erf", ["d"], ["e"]),
        n("Add", ["e", "one"], ["e1"]),
        n("Mul", ["h", "e1"], ["g1"]),
        n("Mul", ["g1", "half"], ["g"]),
        n("MatMul", ["g", "W2"], ["o1"]),
        n("Add", ["o1", "b2"], ["o"]),
        n("Add", ["o", "x"], ["r"]),
        n("LayerNormalization", ["r", "gamma", "beta"], ["ln"], axis=-1),
        n("MatMul", ["ln", "W3"], ["y"]),
    ]
    inits = {
        "W1": (8, 16),
        "b1": (16,),
        "sqrt2": (),
        "one": (),
        "half": (),
        "W2": (16, 8),
        "b2": (8,),
        "gamma": (8,),
        "beta": (8,),
        "W3": (8, 8),
    }
    groups = _translated_groups(nodes, inits)
    assert groups == [
        (
            "linear",
            [
                "MatMul",
                "Add",
                "Div",
                "Erf",
                "Add",
                "Mul",
                "Mul",
                "MatMul",
                "Add",
                "Add",
                "LayerNormalization",
            ],
        ),
        ("linear", ["MatMul"]),
    ]


def test_a_subprogram_holds_at_most_max_group_nodes():
    from einopt.frontend.partition import MAX_GROUP_NODES

    n = MAX_GROUP_NODES + 12
    spec = ";".join(f"v{k}->v{k + 1}" for k in range(n))
    groups = _groups(spec, "L" * n)
    assert [len(nodes) for nodes, _ in groups] == [MAX_GROUP_NODES, 12]


def test_an_activation_that_gates_its_own_argument_does_not_cut():
    # SiLU (x * sigmoid(x)) and GELU's tanh form multiply the activation by their own argument:
    # QuickGelu and FastGelu take them whole, so they join the linear work around them.
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "W1"], ["h"]),
        n("Sigmoid", ["h"], ["s"]),
        n("Mul", ["h", "s"], ["silu"]),
        n("Mul", ["silu", "half"], ["h2"]),
        n("Pow", ["silu", "three"], ["h3"]),
        n("Mul", ["h3", "c"], ["h3c"]),
        n("Add", ["silu", "h3c"], ["p"]),
        n("Tanh", ["p"], ["t"]),
        n("Add", ["t", "one"], ["t1"]),
        n("Mul", ["h2", "t1"], ["g"]),
        n("MatMul", ["g", "W2"], ["y"]),
    ]
    inits = {"W1": (8, 8), "W2": (8, 8), "half": (), "three": (), "c": (), "one": ()}
    groups = _translated_groups(nodes, inits)
    assert groups == [("linear", [node.op_type for node in nodes])]


def test_activations_gating_other_values_still_cut():
    # An LSTM's sigmoid(i) * tanh(g) multiplies two activations of different values, and an SE
    # block's sigmoid scales a value it was not computed from: each activation is its own part.
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "Wi"], ["i"]),
        n("MatMul", ["x", "Wg"], ["g"]),
        n("Sigmoid", ["i"], ["si"]),
        n("Tanh", ["g"], ["tg"]),
        n("Mul", ["si", "tg"], ["c"]),
        n("ReduceMean", ["c"], ["m"], axes=[2], keepdims=1),
        n("Sigmoid", ["m"], ["sm"]),
        n("Mul", ["c", "sm"], ["y"]),
    ]
    groups = _translated_groups(nodes, {"Wi": (8, 8), "Wg": (8, 8)})
    activations = [ops for kind, ops in groups if kind == "activation"]
    assert activations == [["Sigmoid"], ["Tanh"], ["Sigmoid"]], groups
