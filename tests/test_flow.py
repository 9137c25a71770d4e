"""Attention flow (Abnar & Zuidema 2020; qkv.analysis.rollout.attention_flow).

Identities that can fail (float64, tolerance 1e-12 unless said):
  - max_flow on a textbook network gives its known value (CLRS fig. 26.1: 23);
  - one layer: the flow from position i to token j is the edge Â[i, j] itself;
  - equal to the minimum cut found by enumerating every cut of small graphs (max-flow = min-cut);
  - 0 ≤ flow ≤ 1 (the capacity out of a position), and flow ≥ rollout: rollout's R[i, j] is one
    feasible flow from i to j, so the maximum is at least that; a decoder's flow to a later token is 0;
  - long inputs are refused with one clear error.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import qkv
from qkv.analysis import attention_flow, attention_rollout
from qkv.analysis.rollout import flow_of, max_flow, rollout_of
from qkv.runtime.errors import QkvError
from test_rollout import random_trace

TOL = 1e-12


def hat(A: np.ndarray) -> np.ndarray:
    """Â = ½·mean_h A + ½·I, rows renormalised: (L, n, n)."""
    n = A.shape[-1]
    Ahat = 0.5 * A.mean(axis=1) + 0.5 * np.eye(n)
    return Ahat / Ahat.sum(-1, keepdims=True)


def min_cut(Ahat: np.ndarray, i: int, j: int) -> float:
    """The smallest cut between (L, i) and (0, j), over every set of the other nodes on the source side."""
    L, n, _ = Ahat.shape
    others = [(l, k) for l in range(L + 1) for k in range(n) if (l, k) not in ((L, i), (0, j))]
    best = np.inf
    for side in itertools.product((False, True), repeat=len(others)):
        source = {(L, i)} | {node for node, s in zip(others, side) if s}
        cut = sum(Ahat[l - 1, a, b] for (l, a) in source if l > 0 for b in range(n) if (l - 1, b) not in source)
        best = min(best, cut)
    return best


def test_a_textbook_network():
    cap = {0: {1: 16, 2: 13}, 1: {3: 12}, 2: {1: 4, 4: 14}, 3: {2: 9, 5: 20}, 4: {3: 7, 5: 4}}
    assert max_flow(cap, 0, 5) == 23


@pytest.mark.parametrize("causal", [False, True])
def test_one_layer_is_the_attention_itself(causal):
    A = random_trace(L=1, H=3, n=5, causal=causal).attentions
    assert np.abs(flow_of(A) - hat(A)[0]).max() <= TOL


@pytest.mark.parametrize("L, causal, seed", [(2, False, 0), (2, True, 1), (3, False, 2), (3, True, 3)])
def test_equals_the_minimum_cut_by_enumeration(L, causal, seed):
    A = random_trace(L=L, H=2, n=3, causal=causal, seed=seed).attentions
    F, Ahat = flow_of(A), hat(A)
    for i in range(3):
        for j in range(3):
            assert F[i, j] == pytest.approx(min_cut(Ahat, i, j), abs=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_bounds_and_rollout(causal):
    trace = random_trace(L=4, H=2, n=6, causal=causal, seed=5)
    F = attention_flow(trace)
    R = attention_rollout(trace)[-1]
    assert F.shape == (6, 6) and F.min() >= 0 and F.max() <= 1 + TOL
    assert (F >= R - TOL).all()                                              # rollout is one feasible flow
    if causal:
        assert not np.triu(F, 1).any()                                       # no path to a later token
        assert F[0].tolist() == [1.0, 0, 0, 0, 0, 0]                          # the first token sees only itself
    assert np.array_equal(attention_flow(trace, positions=[-1, 2]), F[[5, 2]])


def test_real_models(minilm):
    t = minilm.run("The cat sat on the mat", keep=("attentions",))
    F = attention_flow(t)
    assert F.shape == (len(t.ids),) * 2 and F.max() <= 1 + TOL
    assert (F >= rollout_of(t.attentions)[-1] - TOL).all()
    smol = qkv.load("smollm2")
    t = smol.run("When Mary and John went to the store", keep=("attentions",))
    last = attention_flow(t, positions=[-1])                                  # (1, n): n max-flows over 30 layers
    assert last.shape == (1, len(t.ids)) and last.max() <= 1 + TOL
    assert last[0, 0] == pytest.approx(1.0, abs=1e-6)           # measured: the first token (the attention sink)


def test_long_inputs_and_bad_traces_are_refused():
    with pytest.raises(QkvError, match="too slow in Python; give a shorter text") as e:
        flow_of(np.full((30, 1, 40, 40), 1 / 40))
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(QkvError, match="without layers= or heads="):
        attention_flow(_with_heads(random_trace()))
    with pytest.raises(QkvError, match="position 9 does not exist"):
        flow_of(random_trace().attentions, positions=[9])


def _with_heads(trace):
    trace.head_ids = [0]
    return trace
