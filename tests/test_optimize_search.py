"""``optimize`` with the search: rewrites found by derivation, verified, never slower, cached, repeatable.

Ratios are never asserted here (timed tests on a shared machine are coin
flips): the benchmarks in ``scripts/`` assert them. What is asserted is that
the search's rewrite is chosen and verified (``accept="verified"``), that the
output computes what the input does in ONNX Runtime, and what the cache and
the controls do.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx_models import assert_same_outputs, deconv_block, lstm_cell, prelu_block, random_feeds

from einopt.models import build
from einopt.pipeline import Options, optimize


def _gates_merged(ops) -> bool:
    """x and h concatenated, then one product per gate (or fewer): the merge over the summation."""
    return "Concat" in ops and sum(o in ("MatMul", "Gemm") for o in ops) <= 4


# The PRelu blocks' searches complete within 200 states; the LSTM cell's finds its merged MatMuls in 1,000.
SMALL = {"states_per_search": 1_000, "states_per_model": 2_000}


def _assert_same(a, b):
    assert_same_outputs(a, b, random_feeds(a, seed=1), rtol=1e-4, atol=1e-4)


def _rewritten(result, op):
    (part,) = [p for p in result.parts if op in p.ops]
    return part


@pytest.mark.parametrize(
    "build, op, new",
    [
        # the 4 phase Conv 2x2 of ONNX's ConvTranspose k4 s2 p1, found at depth 3, interleaved back by
        # Concats along the unit residue axes or by Concat + DepthToSpace
        pytest.param(  # 7,800 states at depth 3: the slow tier
            deconv_block,
            "ConvTranspose",
            lambda ops: "ConvTranspose" not in ops and ops.count("Conv") == 4,
            marks=pytest.mark.slow,
        ),
        (prelu_block, "PRelu", lambda ops: "PRelu" not in ops and "Max" in ops),
        (lambda: lstm_cell(hidden=4), "MatMul", _gates_merged),
        # nn.Linear as torch.onnx writes it (Gemm, transB=1, a bias per product): the same merge
        (lambda: lstm_cell(hidden=4, form="gemm"), "Gemm", _gates_merged),
        (lambda: lstm_cell(hidden=4, form="linear"), "MatMul", _gates_merged),
    ],
    ids=["convtranspose", "prelu", "lstm", "lstm-gemm", "lstm-linear"],
)
def test_the_search_rewrites_a_subprogram_and_the_output_is_verified(build, op, new, tmp_path):
    model = build()
    # The phases come from converging the depth-3 states (7,800 states, 20 s for the deconv block): that
    # search runs to depth 3 complete.
    limits = (
        {"max_depth": 3, "states_per_search": 10_000, "states_per_model": 10_000}
        if op == "ConvTranspose"
        else SMALL
    )
    result = optimize(model, Options(accept="verified", cache=tmp_path / "c.sqlite", **limits))
    part = _rewritten(result, op)
    assert part.status == "rewritten" and part.trace, part.reason
    chosen = [c for c in part.search["candidates"] if not c["rejected"]]
    assert len(chosen) == 1 and chosen[0]["depth"] > 0 and chosen[0]["verified"]
    # the transformation itself is among the candidates tried, and verified (measured mode would time it)
    assert any(c["verified"] and new(c["operators"]) for c in part.search["candidates"]), part.search
    _assert_same(model, result.model)


@pytest.fixture
def every_candidate_timed(monkeypatch):
    """Every derived candidate goes to selection, whatever noisy node timings predict for it on a
    loaded machine (a prediction over 2x the input's leaves none to time, and nothing to test)."""
    from einopt.stages import select

    monkeypatch.setattr(select, "PREDICTED_SLACK", float("inf"))


def test_measured_mode_keeps_a_rewrite_only_when_measured_faster(tmp_path, every_candidate_timed):
    """Whatever the timings say, the output is the input or verified equal; a rewrite the search found
    is timed against the original nodes and its measured speedup reported."""
    model = prelu_block()
    result = optimize(model, Options(cache=tmp_path / "c.sqlite", **SMALL))
    part = _rewritten(result, "PRelu")
    timed = [c for c in part.search["candidates"] if c["measured_speedup"] is not None]
    assert timed and all(c["depth"] > 0 for c in timed)
    assert part.status in ("accepted", "not faster", "rolled back")
    if part.status == "accepted":
        assert part.bench["speedup"] >= 1.05
    else:
        assert result.model.SerializeToString() == model.SerializeToString()
    _assert_same(model, result.model)


def test_candidates_past_the_selection_budget_are_not_timed_or_chosen(
    tmp_path, monkeypatch, every_candidate_timed
):
    from einopt.stages import select

    monkeypatch.setattr(select, "BUDGET_S", 0.0)
    model = prelu_block()
    result = optimize(model, Options(cache=tmp_path / "c.sqlite", **SMALL))
    part = _rewritten(result, "PRelu")
    derived = [c for c in part.search["candidates"] if c["depth"] > 0]
    assert derived and all(c["measured_speedup"] is None for c in derived)
    assert all("s ran out" in c["rejected"] for c in derived)
    assert result.model.SerializeToString() == model.SerializeToString()


@pytest.mark.slow
def test_a_second_run_searches_nothing_and_times_only_the_confirmation(
    tmp_path, monkeypatch, every_candidate_timed
):
    from einopt.stages import predict, searchruns, select

    # What a first run cut short by a stage's budget (a loaded machine) a second run measures: that is
    # right, and not what this test is about.
    monkeypatch.setattr(predict, "BUDGET_S", 600.0)
    monkeypatch.setattr(select, "BUDGET_S", 600.0)
    cache = tmp_path / "c.sqlite"
    first = optimize(prelu_block(), Options(cache=cache, **SMALL))
    calls = []
    real = searchruns._search_one
    monkeypatch.setattr(searchruns, "_search_one", lambda *a, **k: calls.append(a) or real(*a, **k))
    second = optimize(prelu_block(), Options(cache=cache, **SMALL))
    assert calls == []
    assert first.acceptance["cache"] is not None, first.acceptance  # the first run measured something
    # Only the whole model's fresh confirmation (and its retakes) is timed again: every other timing
    # comes from the cache.
    made = [r for r in second.acceptance["rounds"] if not r["cached"]]
    assert all(r["stage"] in ("confirm", "retake") for r in made), second.acceptance["rounds"]
    # each made once (the confirmation's fresh processes are one measurement, a round each), or twice
    # when its first timing was disturbed (Timer times it again); none when the second run kept no rewrite
    timings = sum(r["stage"] == "retake" for r in made) + any(r["stage"] == "confirm" for r in made)
    assert timings <= second.acceptance["cache"]["measured"] <= 2 * timings, second.acceptance
    # A fresh confirmation may decide otherwise on a loaded machine (keep, or roll back another
    # rewrite): where both runs kept the same rewrites, the outputs are the same bytes.
    survived = [
        (tuple(c["kept"]), tuple(c["rolled_back"])) if (c := r.get("confirmation")) else None
        for r in (first.acceptance, second.acceptance)
    ]
    if survived[0] == survived[1]:
        assert second.model.SerializeToString() == first.model.SerializeToString()
    assert all(p.search["cached"] for p in second.parts if p.search)


def test_identical_subprograms_share_one_search(tmp_path):
    """Two Conv + PRelu blocks with the same shapes and other weights: one search, both rewritten."""
    model = _two_prelu_blocks()
    result = optimize(model, Options(accept="verified", cache=tmp_path / "c.sqlite", **SMALL))
    parts = [p for p in result.parts if "PRelu" in p.ops]
    assert len(parts) == 2 and all(p.status == "rewritten" for p in parts)
    assert parts[1].search["same_as"] == parts[0].name and not parts[0].search["same_as"]
    _assert_same(model, result.model)


def _two_prelu_blocks():
    from onnx import helper
    from onnx_models import make

    rng = np.random.default_rng(0)
    inits, nodes, x = {}, [], "x"
    for k in range(2):
        inits[f"W{k}"] = (0.3 * rng.standard_normal((4, 4, 1, 1))).astype(np.float32)
        inits[f"A{k}"] = rng.uniform(0, 1, (4, 1, 1)).astype(np.float32)
        nodes += [
            helper.make_node("Conv", [x, f"W{k}"], [f"c{k}"], name=f"conv{k}"),
            helper.make_node("PRelu", [f"c{k}", f"A{k}"], [f"y{k}"], name=f"prelu{k}"),
        ]
        x = f"y{k}"
    return make(nodes, [("x", [1, 4, 8, 8])], [("y1", [1, 4, 8, 8])], inits, name="two_prelu")


def test_jobs_two_gives_the_model_jobs_one_gives(tmp_path):
    model = _two_prelu_blocks()
    options = {"accept": "verified", "cache": False, **SMALL}
    one = optimize(model, Options(jobs=1, **options))
    two = optimize(model, Options(jobs=2, **options))
    assert one.model.SerializeToString() == two.model.SerializeToString()


def test_depth_zero_searches_nothing(tmp_path):
    result = optimize(prelu_block(), Options(max_depth=0, accept="verified", cache=False))
    part = _rewritten(result, "PRelu")
    assert part.status == "unchanged" and not part.trace
    assert part.search["stats"] == {"complete": False, "searched": False}


def test_progress_reports_every_distinct_search(tmp_path):
    events = []
    optimize(_two_prelu_blocks(), Options(accept="verified", cache=False, **SMALL), progress=events.append)
    done = [e for e in events if e.event in ("done", "cached")]
    # The two blocks share one search, and one of each of their two expressions on its own.
    assert [e.part for e in done] == ["sp0_conv0", "sp0_conv0/c0", "sp0_conv0/y0"], done
    assert all(e.total == 3 for e in done) and done[0].states > 0
    assert any(e.event == "searching" for e in events)


def test_ctrl_c_during_the_search_leaves_no_output_and_a_usable_cache(tmp_path):
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    import onnx

    src, out, cache = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "c.sqlite"
    onnx.save(lstm_cell(hidden=8), src)
    cmd = [
        sys.executable,
        "-m",
        "einopt",
        "optimize",
        src,
        "-o",
        out,
        "--cache",
        cache,
        "--max-states",
        "1000000",
    ]
    # from tmp_path: in a source checkout, the working directory's einopt/ is not the installed package
    proc = subprocess.Popen(
        [str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    deadline = time.monotonic() + 60
    while not cache.exists() and time.monotonic() < deadline:  # the cache opens before the search starts
        time.sleep(0.1)
    time.sleep(2.0)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob("out.onnx*"))
    with sqlite3.connect(cache) as db:  # still a database, and the next runs use it
        db.execute("SELECT count(*) FROM comparisons").fetchone()
    options = Options(cache=cache, accept="verified", **SMALL)  # nothing timed: the searches are what is kept
    first = optimize(prelu_block(), options)
    assert any(p.search and not p.search["cached"] for p in first.parts)
    again = optimize(prelu_block(), options)
    assert all(p.search["cached"] for p in again.parts if p.search)


@pytest.mark.slow
def test_searches_on_a_local_ray_give_the_local_model(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.chdir(tmp_path)  # Ray's workers start where the driver is: not in a source checkout
    model = _two_prelu_blocks()
    options = {"accept": "verified", "cache": False, **SMALL}
    local = optimize(model, Options(**options))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = optimize(model, Options(ray="auto", **options))
    finally:
        ray.shutdown()
    assert remote.model.SerializeToString() == local.model.SerializeToString()
    assert any(p.trace for p in remote.parts)


def test_ray_without_a_cluster_is_a_clear_error(tmp_path):
    from click.testing import CliRunner

    from einopt.cli import main

    pytest.importorskip("ray")
    import onnx

    onnx.save(prelu_block(), tmp_path / "in.onnx")
    args = [
        "optimize",
        str(tmp_path / "in.onnx"),
        "-o",
        str(tmp_path / "o.onnx"),
        "--ray",
        "ray://127.0.0.1:1",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 5, result.output
    assert "Ray cluster" in result.output and not (tmp_path / "o.onnx").exists()


def test_every_parts_best_candidate_is_timed_before_any_runner_up():
    """One part's runners-up must not use up the selection's budget before another part's best."""
    from types import SimpleNamespace

    from einopt.stages.select import _timing_order

    def cand(cost):
        return SimpleNamespace(candidate=SimpleNamespace(cost=cost))

    # part a: input 10 s, candidates saving 8 and 7 s; part b: input 3 s, candidates saving 1 and 2 s
    pending = {"a": [cand(10.0), cand(2.0), cand(3.0)], "b": [cand(3.0), cand(2.0), cand(1.0)]}
    alive = {(name, i): pending[name][i] for name in pending for i in (1, 2)}
    assert _timing_order(alive, pending) == [("a", 1), ("b", 2), ("a", 2), ("b", 1)]


def test_candidates_predicted_to_save_nothing_are_timed_last():
    """A part whose best candidate is predicted slower than its input waits for every candidate
    predicted faster (GCN at batch 16 spent its budget on re-instantiated Conv + Add parts)."""
    from types import SimpleNamespace

    from einopt.stages.select import _rounds, _timing_order

    def cand(cost):
        return SimpleNamespace(candidate=SimpleNamespace(cost=cost))

    # part a: predicted slower only; part b: two candidates predicted faster; c: the input again
    pending = {"a": [cand(1.0), cand(1.1)], "b": [cand(5.0), cand(4.0), cand(4.5)], "c": [cand(2.0)]}
    alive = {("a", 1): pending["a"][1], ("b", 1): pending["b"][1], ("b", 2): pending["b"][2]}
    alive[("c", 0)] = pending["c"][0]
    order = _timing_order(alive, pending)
    assert order == [("b", 1), ("b", 2), ("c", 0), ("a", 1)]  # c's input saves 0 s, a's candidate -0.1 s
    assert _rounds(order) == [[("b", 1)], [("b", 2), ("c", 0), ("a", 1)]]


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) for n in ("bert", "gpt2", "vit")],
)
def test_an_attention_block_comes_out_as_one_fused_operator(name, tmp_path):
    # The search reaches the attention core as one com.microsoft operator in one fuse_cone step
    # (the scores, the scale, the softmax and the product with V nested into one binding). GPT-2's
    # causal mask is a Where on a constant condition, and its output projection a Gemm with bias
    # reading the head merge (a bound layout the normal form keeps bound: schedule._read_through).
    # ViT's and GPT-2's subprograms hold a whole layer (GPT-2's: an MLP and the next attention): the
    # attention cone competes with the GELU's (BiasGelu, FastGelu). So ViT with one layer and GPT-2
    # with two (its second part is an MLP and an attention); bounded by states only, not by the
    # default 600 s deadline (which cut ViT's search short on a slow VM). ViT's cone is reached
    # after 1,100-1,500 states, GPT-2's within 1,500 (2026-11-30).
    layers = {"bert": {}, "gpt2": {"layers": 2}, "vit": {"layers": 1}}[name]
    model = build(name, 1, size="small", **layers)
    limits = {"states_per_search": 2_000, "states_per_model": 4_000, "deadline_s": None}
    limits = limits if name != "bert" else SMALL
    result = optimize(model, Options(accept="verified", cache=tmp_path / "c.sqlite", **limits))
    parts = [p for p in result.parts if "Softmax" in p.ops]
    assert parts  # a layer's attention each
    for part in parts:
        assert part.status == "rewritten", part.reason
        ops = part.new_ops
        assert sum(o.endswith("Attention") for o in ops) == 1 and "Softmax" not in ops, ops
        assert "fuse_cone" in part.trace, part.trace
    _assert_same(model, result.model)


def _tanh_gelu_mlp():
    """An MLP as the dynamo exporter writes GPT-2's: MatMul, the bias Add, then GELU's tanh form
    as eight nodes (0.5 h, h^3, * 0.044715, + h, * sqrt(2/pi), Tanh, + 1, *), then a MatMul."""
    from onnx import helper
    from onnx_models import make

    rng = np.random.default_rng(0)
    inits = {
        "w1": (0.2 * rng.standard_normal((16, 32))).astype(np.float32),
        "b1": (0.1 * rng.standard_normal(32)).astype(np.float32),
        "w2": (0.2 * rng.standard_normal((32, 16))).astype(np.float32),
        "half": np.array(0.5, np.float32),
        "three": np.array(3.0, np.float32),
        "c": np.array(0.044715, np.float32),
        "k": np.array(np.sqrt(2 / np.pi), np.float32),
        "one": np.array(1.0, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m"]),
        helper.make_node("Add", ["m", "b1"], ["h"]),
        helper.make_node("Mul", ["h", "half"], ["h2"]),
        helper.make_node("Pow", ["h", "three"], ["h3"]),
        helper.make_node("Mul", ["h3", "c"], ["h3c"]),
        helper.make_node("Add", ["h", "h3c"], ["p"]),
        helper.make_node("Mul", ["p", "k"], ["pk"]),
        helper.make_node("Tanh", ["pk"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["t1"]),
        helper.make_node("Mul", ["h2", "t1"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["y"]),
    ]
    return make(nodes, [("x", [1, 8, 16])], [("y", [1, 8, 16])], inits, name="tanh_gelu_mlp")


def test_a_gelu_in_its_tanh_form_is_one_part_and_comes_out_as_fast_gelu(tmp_path):
    """The Tanh gates its own argument (partition.absorb_gates), so it does not cut the MLP: the
    search sees the whole function, which com.microsoft FastGelu computes with its bias."""
    model = _tanh_gelu_mlp()
    result = optimize(model, Options(accept="verified", cache=tmp_path / "c.sqlite", **SMALL))
    (part,) = [p for p in result.parts if "Tanh" in p.ops]
    assert part.ops.count("MatMul") == 2, part.ops
    assert part.status == "rewritten", part.reason
    assert "com.microsoft.FastGelu" in part.new_ops and "Tanh" not in part.new_ops, part.new_ops
    _assert_same(model, result.model)


def _gelu_mlp():
    """An MLP as torch.onnx's dynamo exporter writes it: MatMul, the bias Add, then GELU as five
    nodes (x / sqrt 2, Erf, + 1, * x, * 0.5), then the second MatMul."""
    from onnx import helper
    from onnx_models import make

    rng = np.random.default_rng(0)
    inits = {
        "w1": (0.2 * rng.standard_normal((16, 32))).astype(np.float32),
        "b1": (0.1 * rng.standard_normal(32)).astype(np.float32),
        "w2": (0.2 * rng.standard_normal((32, 16))).astype(np.float32),
        "sqrt2": np.array(np.sqrt(2.0), np.float32),
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m"]),
        helper.make_node("Add", ["m", "b1"], ["h"]),
        helper.make_node("Div", ["h", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
        helper.make_node("Mul", ["h", "a"], ["g0"]),
        helper.make_node("Mul", ["g0", "half"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["y"]),
    ]
    return make(nodes, [("x", [1, 8, 16])], [("y", [1, 8, 16])], inits, name="gelu_mlp")


def test_a_gelu_written_as_five_nodes_comes_out_as_one_bias_gelu(tmp_path):
    """The five GELU nodes and the bias Add are nested into the last product by one ``fuse_cone``
    step (the state differs from its parent only in what is bound), which com.microsoft BiasGelu
    then computes whole; verified in ONNX Runtime."""
    model = _gelu_mlp()
    result = optimize(model, Options(accept="verified", cache=tmp_path / "c.sqlite", **SMALL))
    (part,) = [p for p in result.parts if "Erf" in p.ops]
    assert part.status == "rewritten", part.reason
    assert "com.microsoft.BiasGelu" in part.new_ops and "Erf" not in part.new_ops, part.new_ops
    assert "fuse_cone" in part.trace, part.trace
    _assert_same(model, result.model)


def test_a_gpt2_attention_read_through_its_head_merge_by_a_biased_projection_is_one_operator():
    """GPT-2's output projection is a Gemm with bias, so its product is nested in the bias epilogue
    and reads the bound head merge from a nested scope. The normal form keeps that merge bound (it
    re-indexes a scope that sums: schedule._read_through), so the projection reads it plainly and
    one fuse_cone step into the merge gives Attention with its output in place: no Transpose."""
    from einopt.frontend.fold import prepare
    from einopt.frontend.translate import translate_graph
    from einopt.rules import Context
    from einopt.search import Budget, search

    model = prepare(build("gpt2", 1, size="small")).model
    part = next(p for p in translate_graph(model) if p.program is not None and "Softmax" in _ops(model, p))
    found = search(part.program, ctx=Context(constants=part.constants), budget=Budget(states_per_search=600))
    fused = [c for c in found.candidates if "com.microsoft.Attention" in c.operators]
    assert fused, [c.operators for c in found.candidates[:5]]
    best = min(fused, key=lambda c: c.cost)
    assert [s.rule for s in best.trace] == ["fuse_cone"], best.trace
    assert "Transpose" not in best.operators and "Softmax" not in best.operators, best.operators


def _ops(model, part):
    return [model.graph.node[i].op_type for i in part.nodes]
