"""The pipeline page on layers without softmax (viz/pipeline_mixer.py): a selective scan (Mamba, Mamba-2, Jamba's and
Granite 4's scan layers, Falcon-H1's mixer beside attention) or a linear attention (Qwen3-Next's gated delta rule,
MiniMax's lightning attention), each shown as its own steps ending in the token-to-token matrix it implies.

The numbers are the pass's own (trace.MIXER, recorded where the engine computed them): the implied matrix (computed
by the engine's implied-attention functions) times the values is the layer's output (computed by the scan or the
recurrence itself), exactly in float64 (Ali et al. 2024's identity); the page carries them to within its encoding;
the viewer's attention of such a layer is the same matrix as shares; Falcon-H1's mixer gets its own kind of
attention in the viewer, beside the softmax heads."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.core.capabilities import SUPPORTS, layer_kinds
from qkv.core.lightning import shares
from qkv.core.trace import MIX_CHANNELS, MIXER
from qkv.runtime.errors import QkvError
from qkv.viz.payload import trace_payload
from qkv.viz.pipeline import PIPELINE_KEEP, pipeline_html, pipeline_payload, pipeline_trace
from qkv.viz.pipeline_mixer import MIXING, layer_arrays
from qkv.viz.pipeline_payload import decode_scores
from qkv.viz.wire import decode

TEXT = "the cat sat on the mat"
SCANS = ["mamba", "mamba2", "qwen3_next", "minimax", "falcon_h1", "jamba", "granitemoehybrid"]


@pytest.fixture(scope="module")
def models64() -> dict:
    return {name: qkv.load(MODELS / name, dtype=np.float64) for name in SCANS}


@pytest.mark.parametrize("name", SCANS)
def test_the_implied_matrix_times_the_values_is_the_layers_output(models64, name):
    """float64: matrix·v = out to 1e-9 (relative to the output's scale) in every layer with a mixer, every matrix;
    the matrix is 0 above the diagonal (causal); out is the scan's or the recurrence's own (a wrong matrix fails)."""
    model = models64[name]
    trace = pipeline_trace(model, TEXT)
    mixed = [i for i, kind in enumerate(layer_kinds(model.config)) if kind in MIXING]
    assert mixed and all(trace.layers[i].mix_matrix is not None for i in mixed)
    for i in mixed:
        a = layer_arrays(trace.layers[i])
        M, n, m = a["matrix"].shape
        assert n == m == len(trace.tokens) and a["v"].shape[:2] == (M, n) and a["out"].shape == a["v"].shape
        assert np.all(a["matrix"][:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0)
        scale = np.abs(a["out"]).max()
        assert scale > 0
        np.testing.assert_allclose(a["matrix"] @ a["v"], a["out"], rtol=0, atol=1e-9 * scale)
        shuffled = a["matrix"][:, :, ::-1] @ a["v"]                    # the keys in the wrong order: not the output
        assert np.abs(shuffled - a["out"]).max() > 1e-3 * scale


def test_each_kind_keeps_its_own_steps(models64):
    """M and the steps' shapes as trace.MIXER says: a Mamba layer's first MIX_CHANNELS channels of each group, a
    Mamba-2 mixer's heads, the delta rule's value heads (q̂, k̂ of unit length, scaled), lightning's heads (its q, k,
    v, and o the heads it records), Falcon-H1's mixer beside attention (q and the mixer both kept)."""
    def layer(name, i):
        return pipeline_trace(models64[name], TEXT).layers[i]
    cfg = models64["mamba"].config
    t = layer("mamba", 0)
    assert t.mix_matrix.shape[0] == cfg.n_heads * min(MIX_CHANNELS, cfg.mamba.d_inner // cfg.n_heads)
    assert t.mix_decay.shape[-1] == cfg.mamba.d_state and t.mix_v.shape[-1] == 1 and t.q is None
    t = layer("mamba2", 1)
    m2 = models64["mamba2"].config.mamba
    assert t.mix_matrix.shape[0] == m2.n_heads and t.mix_v.shape[-1] == m2.head_dim
    A = -np.exp(models64["mamba2"].weights.blocks[1].mixer.A_log)                # (H,) one per head
    np.testing.assert_allclose(t.mix_decay, t.mix_gate * A[:, None])                      # Δ·A_h
    d = models64["qwen3_next"].config.delta
    t = layer("qwen3_next", 0)
    assert t.mix_matrix.shape[0] == d.n_v_heads and np.all((t.mix_gate > 0) & (t.mix_gate < 1))     # β = σ(·)
    np.testing.assert_allclose(np.linalg.norm(t.mix_q, axis=-1), d.d_k ** -0.5, rtol=1e-4)        # q̂·d_k^−½
    t = layer("minimax", 0)
    assert t.mix_gate is None and np.array_equal(t.mix_q, t.q) and np.array_equal(t.mix_out, t.heads)
    assert np.array_equal(t.mix_matrix, t.scores)                                # lightning's A: its "scores"
    t = layer("falcon_h1", 0)
    assert t.q is not None and t.mix_matrix.shape[0] == models64["falcon_h1"].config.mamba.n_heads
    assert layer("qwen3_next", 1).mix_matrix is None                             # a softmax layer has none


def test_the_views_attention_is_the_same_matrix_as_shares(models64):
    """What every attention view reads of a Mamba-2 layer (its "attentions", one a head) is the page's implied
    matrix as shares, |α| with rows divided by their sums; lightning's likewise."""
    for name, i in (("mamba2", 0), ("minimax", 2)):
        t = pipeline_trace(models64[name], TEXT).layers[i]
        np.testing.assert_allclose(t.attentions, shares(t.mix_matrix), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["mamba", "qwen3_next", "falcon_h1"])
def test_the_page_carries_the_engines_numbers(name):
    """The payload's matrix within the step/2 of its byte encoding, and the whole float32 arrays equal to the trace's,
    for the layer it opens at; every layer of another kind has its own steps, a softmax layer none."""
    model = qkv.load(MODELS / name)
    trace = pipeline_trace(model, TEXT)
    p = pipeline_payload(model, trace, layer=0)
    kinds = layer_kinds(model.config)
    assert p["arch"]["layer_kinds"] == list(kinds)
    assert sorted(p["mixers"], key=int) == [str(i) for i, k in enumerate(kinds) if k in MIXING]
    for key, entry in p["mixers"].items():
        t = trace.layers[int(key)]
        assert entry["kind"] == kinds[int(key)] and entry["M"] == t.mix_matrix.shape[0] == len(entry["labels"])
        got = decode_scores(entry["matrix"])[0]                                  # (M, n, n), −inf above the diagonal
        n = got.shape[-1]
        lower = np.tril(np.ones((n, n), bool))
        step = np.asarray(entry["matrix"]["step"][0])[:, None, None]
        assert np.all(np.isneginf(got[:, ~lower]))
        assert np.all(np.abs(got - t.mix_matrix)[:, lower] <= (step / 2 + 1e-6 * np.abs(t.mix_matrix).max())[:, 0])
    whole = p["mixers"]["0"]["whole"]
    t = trace.layers[0]
    for field, name_ in (("matrix", "mix_matrix"), ("v", "mix_v"), ("out", "mix_out")):
        np.testing.assert_array_equal(decode(whole[field]), t.__dict__[name_].astype(np.float32))


def test_a_trace_without_the_steps_says_how_to_make_one():
    model = qkv.load(MODELS / "mamba2")
    with pytest.raises(QkvError, match="pipeline_trace") as e:
        pipeline_payload(model, model.run(TEXT))                                  # Model.run keeps no MIXER
    assert "\n" not in str(e.value)
    with pytest.raises(QkvError, match="mix_matrix of layer 0 was not kept.*keep="):
        model.run(TEXT).layer(0).mix_matrix
    assert pipeline_payload(model, model.run(TEXT, keep=PIPELINE_KEEP))["mixers"]
    assert set(MIXER) <= set(PIPELINE_KEEP)


def test_every_kind_draws_its_steps_on_the_page():
    assert all("pipeline" in needs for needs in SUPPORTS.values())
    html = pipeline_html(qkv.load(MODELS / "minimax"), pipeline_trace(qkv.load(MODELS / "minimax"), TEXT))
    assert "QKV_PIPELINE_MIXER" in html and '"mixers"' in html


def test_falcon_h1s_mixer_is_a_second_kind_of_attention_in_the_viewer():
    """The viewer of a trace that kept Falcon-H1's mixer: "attention" (the softmax heads, shown first) and "mixer"
    (one head per Mamba head, |α| as shares); a model without a mixer beside attention: one kind."""
    model = qkv.load(MODELS / "falcon_h1")
    trace = pipeline_trace(model, TEXT)
    p = trace_payload(trace)
    assert p["kind"] == "attention" and [k["kind"] for k in p["kinds"]] == ["attention", "mixer"]
    attention, mixer = p["kinds"]
    assert attention["heads"] == model.config.n_heads and mixer["heads"] == model.config.mamba.n_heads
    L, H, n, _ = mixer["attention"]["shape"]
    got = decode(mixer["attention"]).reshape(L, H, n, n)                     # (the wire divides by 255)
    want = np.stack([shares(trace.layers[i].mix_matrix.astype(np.float64)) for i in range(L)])
    assert np.abs(got - want).max() <= 0.5 / 255 + 1e-6
    assert "kinds" not in trace_payload(model.run(TEXT))                         # not kept: attention only
    assert "kinds" not in trace_payload(pipeline_trace(qkv.load(MODELS / "jamba"), TEXT))


@pytest.mark.parametrize("name", ["mamba", "falcon_h1"])
def test_show_writes_the_pipeline_page(name, tmp_path, monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "show", TEXT, "--model", str(MODELS / name), "--out",
                              str(tmp_path / "v"))
    assert code == 0 and (tmp_path / "v" / "pipeline.html").is_file(), err
    assert '"mixers"' in (tmp_path / "v" / "pipeline.html").read_text()
