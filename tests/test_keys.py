"""Canonical keys: invariances, differences, exactness against a brute-force reference, stability.

The property tests assert ``key(a) == key(b)`` exactly when
``ref_form(a) == ref_form(b)`` (``tests.keys_support``: every permutation of
the summation iterators, its own linear forms), for ``b`` a random equivalent
rewrite or a random mutation of ``a``; table cases pin each invariance and
each difference by hand.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from einopt.api import L, Max, Sum, iters, leaky_relu, maximum, minimum, program, relu, tanh, tensor
from einopt.core import keys
from einopt.core.index import linear_form
from einopt.core.ir import (
    Binary,
    IAdd,
    IConst,
    IFloorDiv,
    IMod,
    IMul,
    IndexExpr,
    ISub,
    Iter,
    Program,
    Scope,
    scopes_in,
)
from einopt.core.keys import canonical_form, fingerprint, key

from keys_support import (
    MUTATORS,
    ChangeIndexConstant,
    ChangeTensor,
    Commute,
    Rename,
    ShuffleSummation,
    SwapTraversal,
    equivalent,
    mutate,
    ref_form,
    ref_program,
    relabel,
)
from strategies import programs, scopes

FAST = settings(max_examples=100, deadline=None, derandomize=True)


# --------------------------------------------------------------------------
# Property tests
# --------------------------------------------------------------------------


@FAST
@given(scopes(allow_max=True), st.randoms(use_true_random=False))
def test_key_invariant_under_equivalent_rewrites(s, rng):
    t = equivalent(s, rng)
    assert ref_form(t) == ref_form(s)
    assert key(t) == key(s), f"\n{canonical_form(s)}\n{canonical_form(t)}"


@FAST
@given(scopes(allow_max=True), st.randoms(use_true_random=False))
def test_each_rewrite_alone_keeps_the_key(s, rng):
    for cls in (Rename, ShuffleSummation, Commute):
        assert key(cls(rng).run_scope(s)) == key(s), cls.__name__


@settings(max_examples=60, deadline=None, derandomize=True)
@pytest.mark.parametrize("cls", MUTATORS, ids=lambda c: c.__name__)
@given(s=scopes(allow_max=True), rng=st.randoms(use_true_random=False))
def test_key_changes_under_mutation(cls, s, rng):
    t = mutate(s, cls, rng)
    if t is None:
        return
    t = equivalent(t, rng)  # the mutation must show through any rewriting too
    differs = ref_form(t) != ref_form(s)
    if cls is not SwapTraversal:
        # Only a traversal swap can be undone by a symmetry (e.g. of A[i] * A[j]).
        assert differs, f"mutation {cls.__name__} was a no-op:\n{s}\n{t}"
    assert (key(t) != key(s)) == differs, f"\n{canonical_form(s)}\n{canonical_form(t)}"


def symmetric_scopes() -> st.SearchStrategy[Scope]:
    """Many summation iterators of one range read symmetrically: ties that need refinement."""

    @st.composite
    def build(draw):
        its = iters("a:3 b:3 c:3 d:3 e:3")
        i = its[0]
        summ = its[1 : 1 + draw(st.integers(2, 4))]
        B, V = tensor("B", (3, 3)), tensor("V", (3,))
        pool = (i, *summ)
        factors = []
        for _ in range(draw(st.integers(2, 4))):
            if draw(st.booleans()):
                factors.append(B[draw(st.sampled_from(pool)), draw(st.sampled_from(pool))])
            else:
                factors.append(V[draw(st.sampled_from(pool))])
        body = factors[0]
        for f in factors[1:]:
            body = Binary(draw(st.sampled_from(["*", "+", "-"])), body, f)
        return L(i)(Sum(*summ)(body))

    return build()


@settings(max_examples=200, deadline=None, derandomize=True)
@given(symmetric_scopes(), symmetric_scopes(), st.randoms(use_true_random=False))
def test_key_is_exact_on_symmetric_summations(s, other, rng):
    t = equivalent(s, rng)
    assert key(t) == key(s)
    # Two independent draws: equal keys exactly when the brute force says equal.
    assert (key(other) == key(s)) == (ref_form(other) == ref_form(s))
    m = mutate(s, ChangeIndexConstant, rng)
    assert (key(m) == key(s)) == (ref_form(m) == ref_form(s))


def cycle(its, i):
    """``B[a,b] B[b,c] ... B[z,a] * V[i]``: rotations are automorphisms, most swaps are not."""
    B, V = tensor("B", (3, 3)), tensor("V", (3,))
    body = V[i]
    for x, y in zip(its, its[1:] + its[:1], strict=True):
        body = body * B[x, y]
    return body


def test_large_symmetric_summations():
    its = list(iters("a:3 b:3 c:3 d:3 e:3 g:3 p:3"))
    (i,) = iters("i:3")
    one_cycle = L(i)(Sum(*its)(cycle(its, i)))
    rng = random.Random(7)
    for _ in range(3):
        assert key(equivalent(one_cycle, rng)) == key(one_cycle)
    # A 3-cycle and a 4-cycle over the same seven iterators: not equivalent.
    two_cycles = L(i)(Sum(*its)(cycle(its[:3], i) * cycle(its[3:], i)))
    assert key(two_cycles) != key(one_cycle)
    shuffled = its[:]
    rng.shuffle(shuffled)
    assert key(L(i)(Sum(*its)(cycle(shuffled[:3], i) * cycle(shuffled[3:], i)))) == key(two_cycles)


@FAST
@given(programs(), st.randoms(use_true_random=False))
def test_program_key_ignores_binding_names_and_order(p, rng):
    assert key(relabel(p, rng)) == key(p)


@FAST
@given(programs(), st.randoms(use_true_random=False))
def test_program_key_changes_with_its_outputs(p, rng):
    last, s = p.bindings[-1]  # read by no other binding
    # Every mutator but ChangeTensor keeps the tensors, so the inputs stay valid.
    t = mutate(s, rng.choice([m for m in MUTATORS if m is not ChangeTensor]), rng)
    if t is None or any(t in scopes_in(x) for _, x in p.bindings):
        return
    q = Program(p.inputs, p.bindings[:-1] + ((last, t),), p.outputs)
    assert (key(q) != key(p)) == (ref_program(q) != ref_program(p))


ITERS3 = iters("x=-2:5 y:4 z=1:3")


def index_exprs() -> st.SearchStrategy[IndexExpr]:
    leaves = st.sampled_from(ITERS3) | st.integers(-3, 3).map(IConst)

    def extend(sub: st.SearchStrategy[IndexExpr]) -> st.SearchStrategy[IndexExpr]:
        return st.one_of(
            st.tuples(st.sampled_from([IAdd, ISub, IMul]), sub, sub).map(lambda t: t[0](t[1], t[2])),
            st.tuples(st.sampled_from([IFloorDiv, IMod]), sub, st.integers(1, 4)).map(
                lambda t: t[0](t[1], t[2])
            ),
        )

    return st.recursive(leaves, extend, max_leaves=8)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(index_exprs())
def test_index_terms_agree_with_linear_form(e):
    """keys.py collects linear forms itself (faster); it must agree with einopt.core.index."""
    from einopt.core.keys import _index_info

    lf = linear_form(e)
    (terms, atoms, const), _ = _index_info(e)
    assert int(const or 0) == lf.const
    as_int = {"+": 1, "-": -1}
    assert {it: as_int.get(p) or int(p[:-1]) for it, p in terms} == dict(lf.coeffs)
    if lf.is_affine:
        assert not atoms
    else:
        # Atoms may merge further (up to commutativity), never split.
        assert len(atoms) <= len(lf.atoms)


# --------------------------------------------------------------------------
# Table cases
# --------------------------------------------------------------------------

h, w, f, r, s_, c = iters("h:56 w:56 f:64 r:3 s:3 c:64")
A, K = tensor("A", (56, 56, 64)), tensor("K", (3, 3, 64, 64))
B = tensor("B", (8, 8))
i, j, k = iters("i:8 j:8 k:8")


def conv(h=h, w=w, f=f, r=r, s=s_, c=c, A=A, K=K, off=1):
    return L(h, w, f)(Sum(r, s, c)(A[h + r - off, w + s - off, c] * K[r, s, f, c]))


def fig5_e2(renamed: bool = False, off: int = 1):
    """Summation splitting: the inner scope is a 5-D tensor over (r, s, h, w, f)."""
    hh, ww, ff, rr, ss, cc = iters("p:56 q:56 u:64 x:3 y:3 z:64") if renamed else (h, w, f, r, s_, c)
    inner = L(rr, ss, hh, ww, ff)(Sum(cc)(A[hh + rr - off, ww + ss - off, cc] * K[rr, ss, ff, cc]))
    return L(h, w, f)(Sum(r, s_)(inner[r, s_, h, w, f]))


def one(idx):
    return L(h, r)(A[idx, 0, 0])


EQUAL = {
    "conv renamed": (conv(), conv(*iters("a:56 b:56 d:64 e:3 g:3 m:64"))),
    "summation reordered": (
        conv(),
        L(h, w, f)(Sum(c, s_, r)(A[h + r - 1, w + s_ - 1, c] * K[r, s_, f, c])),
    ),
    "operands swapped": (
        conv(),
        L(h, w, f)(Sum(r, s_, c)(K[r, s_, f, c] * A[r + h - 1, s_ - 1 + w, c])),
    ),
    "2*h vs h*2": (one(2 * h), one(h * 2)),
    "h+h vs 2*h": (one(h + h), one(2 * h)),
    "h+r-1 vs r+h-1": (one(h + r - 1), one(r + h - 1)),
    "h-(r-1) vs h-r+1": (one(h - (r - 1)), one(h - r + 1)),
    "(h+r)+1 vs h+(r+1)": (one((h + r) + 1), one(h + (r + 1))),
    "2*h*r vs r*(h*2)": (one(2 * h * r), one(r * (h * 2))),
    "(h+r)%4 vs (r+h)%4": (one((h + r) % 4), one((r + h) % 4)),
    "equal atoms merge": (one((h + r) // 2 - (r + h) // 2 + h), one(h)),
    "(a+b)+c vs a+(b+c)": (
        L(i)(Sum(j)((B[i, j] + B[j, i]) + B[i, i])),
        L(i)(Sum(j)(B[i, j] + (B[j, i] + B[i, i]))),
    ),
    "max commutes": (L(i, j)(maximum(B[i, j], B[j, i])), L(i, j)(maximum(B[j, i], B[i, j]))),
    "min chain": (
        L(i, j)(minimum(minimum(B[i, j], 1.0), B[j, i])),
        L(i, j)(minimum(B[j, i], minimum(1.0, B[i, j]))),
    ),
    "nested scope renamed": (fig5_e2(), fig5_e2(renamed=True)),
    "antisymmetric summation renamed": (
        L(k)(Sum(i, j)(B[i, j] - B[j, i] + B[k, i])),
        L(k)(Sum(j, i)(B[j, i] - B[i, j] + B[k, j])),
    ),
    "unused summation iterators": (
        L(k)(Sum(i, j, *iters("x:2"))(B[k, i])),
        L(k)(Sum(*iters("y:2"), j, i)(B[k, j])),
    ),
    "max iterators reordered and renamed": (
        L(k)(Max(i, j)(B[i, j] * B[j, k])),
        L(*iters("y:8"))(
            Max(*iters("x:8"), *iters("z:8"))(
                B[iters("z:8")[0], iters("x:8")[0]] * B[iters("x:8")[0], iters("y:8")[0]]
            )
        ),
    ),
}


@pytest.mark.parametrize("name", EQUAL)
def test_table_equal(name):
    a, b = EQUAL[name]
    assert a is not b
    assert key(a) == key(b), f"\n{canonical_form(a)}\n{canonical_form(b)}"


DIFFERENT = {
    "traversal order": (L(i, j)(B[i, j]), L(j, i)(B[i, j])),
    "traversal lo": (L(i)(B[i, i]), L(*iters("i=1:8"))(B[Iter("i", 1, 8), Iter("i", 1, 8)])),
    "traversal hi": (L(i)(B[i, i]), L(*iters("i:7"))(B[Iter("i", 0, 7), Iter("i", 0, 7)])),
    "summation lo": (
        L(h)(Sum(r)(A[h + r, 0, 0])),
        L(h)(Sum(Iter("t", -1, 3))(A[h + Iter("t", -1, 3), 0, 0])),
    ),
    "summation hi": (conv(), conv(r=Iter("r", 0, 4))),
    "coefficient": (one(2 * h), one(h)),
    "coefficient sign": (one(h - r), one(h + r)),
    "x%4 vs x//4": (one(h % 4), one(h // 4)),
    "x//4 vs x//2": (one(h // 4), one(h // 2)),
    "div operand": (one((h + 1) // 4), one(h // 4)),
    "mod operand coefficient": (one((h + 2 * r) % 4), one((h + r) % 4)),
    "h+r-1 vs h+r-2": (one(h + r - 1), one(h + r - 2)),
    "value constant": (L(i)(B[i, i] + 1.0), L(i)(B[i, i] + 2.0)),
    "0.0 vs -0.0": (L(i)(B[i, i] + 0.0), L(i)(B[i, i] + -0.0)),
    "tensor name": (L(i)(B[i, i]), L(i)(tensor("C", (8, 8))[i, i])),
    "tensor shape": (L(i)(B[i, i]), L(i)(tensor("B", (8, 9))[i, i])),
    "tensor dtype": (L(i)(B[i, i]), L(i)(tensor("B", (8, 8), "float16")[i, i])),
    "unary function": (L(i)(relu(B[i, i])), L(i)(tanh(B[i, i]))),
    "unary parameter": (L(i)(leaky_relu(B[i, i], 0.1)), L(i)(leaky_relu(B[i, i], 0.2))),
    "- vs +": (L(i)(B[i, i] - B[i, 0]), L(i)(B[i, i] + B[i, 0])),
    "a-b vs b-a": (L(i)(B[i, i] - B[i, 0]), L(i)(B[i, 0] - B[i, i])),
    "pad": (L(i)(B[i, i]), L(i, pad=[(1, 0)])(B[i, i])),
    "pad side": (L(i, pad=[(0, 1)])(B[i, i]), L(i, pad=[(1, 0)])(B[i, i])),
    "nested scope differs": (fig5_e2(), fig5_e2(off=2)),
    "summation vs traversal": (L(i)(Sum(j)(B[i, j])), L(i, j)(B[i, j])),
    "which summation iterator": (L(k)(Sum(i, j)(B[i, j] * B[i, k])), L(k)(Sum(i, j)(B[i, j] * B[j, k]))),
    "max vs sum": (L(i)(Max(j)(B[i, j])), L(i)(Sum(j)(B[i, j]))),
    "max vs sum of one point": (L(i)(Max(*iters("x:1"))(B[i, 0])), L(i)(Sum(*iters("x:1"))(B[i, 0]))),
    "max vs no reduction": (L(i)(Max(*iters("x:1"))(B[i, 0])), L(i)(B[i, 0])),
}


@pytest.mark.parametrize("name", DIFFERENT)
def test_table_different(name):
    a, b = DIFFERENT[name]
    assert key(a) != key(b), f"\n{canonical_form(a)}\n{canonical_form(b)}"


def test_programs_table():
    inner = fig5_e2().body.source
    outer = fig5_e2()
    p1 = program({"Y": outer}, {"X": inner})
    p2 = program({"out": outer}, {"tmp": inner})
    assert key(p1) == key(p2)
    assert key(p1) != key(outer)
    # Output order matters; two outputs are not one.
    q1 = program({"Y": outer, "X": inner})
    q2 = program({"X": inner, "Y": outer})
    assert key(q1) != key(q2) and key(q1) != key(p1)
    # Inputs matter (an extra unused input, or a different one).
    extra = Program(p1.inputs + (tensor("D", (2,)),), p1.bindings, p1.outputs)
    assert key(extra) != key(p1)


# --------------------------------------------------------------------------
# API details and stability
# --------------------------------------------------------------------------


def test_key_format_and_fingerprint():
    e = conv()
    k1 = key(e)
    assert len(k1) == 32 and int(k1, 16) >= 0
    assert k1 == hashlib.blake2b(canonical_form(e).encode(), digest_size=16).hexdigest()
    assert fingerprint(e) == int(k1[:16], 16) and 0 <= fingerprint(e) < 2**64
    assert key(e) is k1  # cached on the node


def _nested_products(n: int, names: str) -> list[Scope]:
    i, j, k = iters(" ".join(f"{x}:3" for x in names))
    X, W = tensor("X", (3, 3)), tensor("W", (3, 3))
    chain: list[Scope] = []
    for _ in range(n):
        chain.append(L(i, j)(Sum(k)((chain[-1] if chain else X)[i, k] * W[k, j])))
    return chain


def test_keys_of_deeply_nested_scopes(monkeypatch):
    """A translated model nests one scope per node, hundreds deep: keying does not recurse over the
    nesting, and keys what lies deep producers first with the same result."""
    assert len(key(_nested_products(3000, "ijk")[-1])) == 32
    deep = [key(s) for s in _nested_products(60, "ijk")[::-1]]  # new nodes (other names), top first
    monkeypatch.setattr(keys, "_NESTING_LIMIT", 10**6)  # plain recursion, 60 levels
    plain = [key(s) for s in _nested_products(60, "abc")[::-1]]
    assert plain == deep and len(set(deep)) == 60


@pytest.mark.parametrize(
    "node", [A, h + r - 1, A[h, w, c] * 2.0, Iter("q", -1, 3)], ids=["T", "I", "V", "Iter"]
)
def test_keys_of_other_nodes(node):
    assert len(key(node)) == 32
    assert canonical_form(node)[:2] in {"T:", "I:", "V:"}


def test_free_iterators_keep_their_names():
    assert key(h + 1) != key(w + 1)
    assert key(A[h, w, c]) != key(A[w, h, c])


def test_keys_are_stable_across_runs():
    """Pinned: a change here changes every stored key; make it on purpose only."""
    assert canonical_form(conv()) == (
        "L[0:56,0:56,0:64]S[0:3,0:3,0:64]"
        "*(A:float32(56,56,64)[s0+t0-1,s1+t1-1,s2],K:float32(3,3,64,64)[s0,s1,t2,s2])"
    )
    assert key(conv()) == "59adfd3472a15da7285ae7e18d47c4b0"
    assert key(fig5_e2()) == "b088a972ab61ad56eccea4687cab61f1"
    assert key(program({"Y": fig5_e2()}, {"X": fig5_e2().body.source})) == "0b62507855350e5ffe64f088eba41ff6"
    assert (
        canonical_form(one((h + 2 * r) % 4 - h // 3))
        == "L[0:56,0:3]A:float32(56,56,64)[((2*t1+t0)%4)-((t0)//3),0,0]"
    )
    assert key(one((h + 2 * r) % 4 - h // 3)) == "9daed67eb3e093fc92914fe795187ecb"


_SUBPROCESS = """
import random
from keys_support import equivalent
from test_keys import L, Sum, conv, cycle, fig5_e2, iters, key
its = list(iters("a:3 b:3 c:3 d:3 e:3"))
(i,) = iters("i:3")
sym = L(i)(Sum(*its)(cycle(its[:2], i) * cycle(its[2:], i)))
print(key(conv()), key(fig5_e2()), key(sym), key(equivalent(sym, random.Random(3))))
"""


def test_keys_do_not_depend_on_python_hash_seed():
    here = os.path.dirname(os.path.abspath(__file__))
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run(
            # the test modules are imported from their folder (cwd), the installed einopt from site-packages
            [sys.executable, "-c", _SUBPROCESS],
            env=env,
            capture_output=True,
            text=True,
            cwd=here,
        )
        assert run.returncode == 0, run.stderr
        outs.add(run.stdout)
    assert len(outs) == 1
    (line,) = outs
    assert line.split()[:2] == [key(conv()), key(fig5_e2())]


def test_not_a_node():
    with pytest.raises(TypeError):
        canonical_form("h + 1")
