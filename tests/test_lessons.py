"""qkv.lessons (positions, kv-cache, gqa): every number the pages print, recomputed here another way.

The lessons check themselves against the engine; these tests recompute the same numbers
independently (closed forms, float64, a full forward pass instead of the cache, weights
pooled by explicit loops) and check the pages and figures carry them, in English and Korean.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from rich.console import Console

import qkv
from qkv.runtime.errors import QkvError
from qkv.lessons import TOPICS, gqa, kvcache, lesson_module, positions
from qkv.lessons.gqa import TEXTS as GQA_TEXTS
from qkv.lessons.kvcache import TEXTS as KV_TEXTS
from conftest import MODELS
from qkv.lessons.positions import TEXTS as POS_TEXTS
from qkv.models.model import Model


@pytest.fixture(scope="module")
def smol():
    return qkv.load("smollm2")


@pytest.fixture(scope="module")
def pos(smol, minilm):
    return positions.build(smol, None, learned_model=minilm)


@pytest.fixture(scope="module")
def kv(smol):
    return kvcache.build(smol, None, new_tokens=4, repeats=1)


@pytest.fixture(scope="module")
def gq(smol, minilm):
    return gqa.build(smol, None, pool_model=minilm)


def printed(module, lesson, lang: str) -> str:
    console = Console(record=True, width=250, highlight=False)
    for part in module.render(lesson, lang):
        console.print(part)
    return console.export_text()


def test_every_topic_has_the_interface():
    for name in ("positions", "kv-cache", "gqa"):
        m = lesson_module(name)
        assert m.DEFAULT_MODEL == "smollm2" and callable(m.build) and callable(m.render) and callable(m.figures)
    import qkv.cli.explain  # noqa: F401 — registers the topics that live after lessons/ (circuits: graphs/lesson.py)

    assert list(TOPICS) == ["attention", "positions", "kv-cache", "gqa", "linear", "sparse", "flash", "ffn", "vit", "patching",
                            "proteins", "circuits"]
    with pytest.raises(QkvError, match="unknown topic 'rope'"):
        lesson_module("rope")


@pytest.mark.parametrize("texts", [POS_TEXTS, KV_TEXTS, GQA_TEXTS])
def test_both_languages_have_the_same_sentences(texts):
    assert texts["en"].keys() == texts["ko"].keys()


# ── positions ────────────────────────────────────────────────────────────────────

def test_sinusoidal_table_and_its_dot_products(pos):
    s = pos.sin
    d = s.d
    p, i = np.arange(len(s.table))[:, None], np.arange(d // 2)
    want = np.empty((len(s.table), d))
    want[:, 0::2] = np.sin(p / 10000 ** (2 * i / d))
    want[:, 1::2] = np.cos(p / 10000 ** (2 * i / d))
    np.testing.assert_allclose(s.table, want, atol=1e-6)
    for k in (0, 1, 5, 64):                                                   # Σ_i sin·sin + cos·cos = Σ cos(kω)
        closed = np.cos(k * 10000.0 ** (-2 * i / d)).sum()
        np.testing.assert_allclose(s.dots[:, k], closed, atol=1e-3)
    assert s.closed[0] == pytest.approx(d / 2) and s.spread < 1e-3


def test_rope_q_dot_k_depends_on_the_distance_only(pos, smol):
    r = pos.rope
    half = r.d_k // 2
    omega = 100000.0 ** (-np.arange(half) * 2 / r.d_k)
    np.testing.assert_allclose(r.omega, omega, rtol=1e-6)
    as_complex = lambda x: x[:half] + 1j * x[half:]                           # pair (i, i + d/2) as one number
    q, k = as_complex(r.q), as_complex(r.k)
    # turned by p·ω: q at p + k against k at p is Re Σ q·conj(k)·e^{ikω}, whatever p
    closed = np.array([np.real(np.sum(q * np.conj(k) * np.exp(1j * dist * omega))) for dist in range(65)])
    np.testing.assert_allclose(r.dots64, np.broadcast_to(closed, r.dots64.shape), atol=1e-9)
    np.testing.assert_allclose(r.dots, np.broadcast_to(closed, r.dots.shape), atol=2e-3)
    # the q and k are the model's own: turned to their real positions they are the trace's
    lt = smol.run("The cat sat on the mat", layers=[r.layer]).layer(r.layer)
    for vec, pos_, model_vec in ((q, r.q_pos, lt.q[r.head, r.q_pos]), (k, r.k_pos, lt.k[r.kv_head, r.k_pos])):
        turned = vec * np.exp(1j * pos_ * omega)
        np.testing.assert_allclose(np.concatenate([turned.real, turned.imag]), model_vec, atol=2e-4)
    np.testing.assert_allclose(np.linalg.norm(r.turned, axis=1), np.linalg.norm(r.q), rtol=1e-5)
    assert (r.layer, r.head, r.q_token, r.k_token) == (3, 0, "␣mat", "␣on")


def test_learned_table_cosines(pos, minilm):
    P = minilm.weights.pos_embed.astype(np.float64)
    for k in (1, 8, 64):
        c = [P[p] @ P[p + k] / np.linalg.norm(P[p]) / np.linalg.norm(P[p + k]) for p in range(len(P) - k)]
        assert pos.learned.mean[k] == pytest.approx(np.mean(c), abs=1e-9)
        assert (pos.learned.low[k], pos.learned.high[k]) == pytest.approx((min(c), max(c)), abs=1e-9)
    assert pos.learned.high[8] - pos.learned.low[8] > 0.1                     # not a function of k alone


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_positions_page_prints_the_numbers(pos, lang):
    text = printed(positions, pos, lang)
    for number in (f"{pos.sin.closed[64]:.3f}", f"{pos.rope.dots64[0, 16]:.3f}", f"{pos.learned.mean[1]:.3f}",
                   f"{pos.rope.omega[1]:.3g}", "(512, 384)", "θ = 100000"):
        assert number in text, number
    assert ("위치 인코딩" in text and "회전" in text) if lang == "ko" else "depends on the distance k only" in text


def test_positions_on_a_model_without_rope(minilm):
    lesson = positions.build(minilm, None)
    assert lesson.rope is None and lesson.position == "learned" and lesson.learned.model == minilm.name
    assert "has no RoPE (it uses a learned table)" in printed(positions, lesson, "en")
    assert "RoPE가 없습니다" in printed(positions, lesson, "ko")


def test_a_wrong_rope_cannot_print(smol, minilm, monkeypatch):
    wrong = positions.rope_inv_freq
    monkeypatch.setattr(positions, "rope_inv_freq", lambda *a, **k: wrong(*a, **k) * 1.001)
    with pytest.raises(RuntimeError, match="ω_i"):
        positions.build(smol, None, learned_model=minilm)


# ── kv-cache ─────────────────────────────────────────────────────────────────────

def test_kv_cache_chooses_the_tokens_of_a_full_pass(kv, smol):
    ids, _ = smol.encode("The cat sat on the mat")
    chosen = [s.token_id for s in kv.steps]
    seq = np.concatenate([ids, chosen[:-1]])
    logits = smol.forward(seq[None], attentions=False).logits[0]               # (n, V) one pass, no cache
    n = len(ids)
    assert chosen == [int(np.argmax(logits[n - 1 + t])) for t in range(len(chosen))]
    assert [s.m for s in kv.steps] == [n, n + 1, n + 2, n + 3] and [s.fed for s in kv.steps] == [n, 1, 1, 1]
    assert all(s.same and s.diff < 1e-4 * 40 for s in kv.steps) and kv.diff_cache < 1e-4 * 40


def test_kv_cache_flops_from_the_weights(kv, smol):
    b, w = smol.weights.blocks[0], smol.weights
    weights = sum(W.size for W in (b.attn.W_Q, b.attn.W_K, b.attn.W_V, b.attn.W_O, b.ffn.W_gate, b.ffn.W_in,
                                    b.ffn.W_out))
    for s in kv.steps:
        for fed, got in ((s.fed, s.flops_cache), (s.m, s.flops_full)):
            attention = 2 * 2 * 9 * fed * s.m * 64                                 # Q·Kᵀ and A·V, 9 heads
            assert got == 30 * (2 * fed * weights + attention) + 2 * w.W_vocab.size
    assert kv.steps[-1].flops_full > 3 * kv.steps[-1].flops_cache


def test_kv_cache_bytes(kv):
    assert [(l.name, l.H_kv, l.bytes_per_token) for l in kv.layouts] == [
        ("MHA", 9, 2 * 30 * 9 * 64 * 4), ("GQA", 3, 2 * 30 * 3 * 64 * 4), ("MQA", 1, 2 * 30 * 64 * 4)]
    assert kv.layouts[1].bytes_context == 46080 * 8192 and kv.n == 9


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_kv_cache_page_prints_the_numbers(kv, lang):
    text = printed(kvcache, kv, lang)
    last = kv.steps[-1]
    for number in ("(3, 6, 64)", "(3, 9, 64)", "46,080", "138,240", f"{last.flops_full / 1e6:,.0f}M",
                   f"{1e3 * last.seconds_cache:.1f}", f"{1e3 * last.seconds_full:.1f}", kv.steps[1].token):
        assert number in text, number
    assert ("캐시" in text and "쿼리" in text) if lang == "ko" else "the cache changes the cost, not the result" in text


def test_kv_cache_needs_a_decoder(minilm):
    with pytest.raises(QkvError, match="keeps no KV cache"):
        kvcache.build(minilm, None)


def test_kv_cache_refuses_a_text_it_would_rerun_too_long(smol):
    with pytest.raises(QkvError, match=f"give at most {kvcache.MAX_TEXT_TOKENS}"):
        kvcache.build(smol, "word " * (kvcache.MAX_TEXT_TOKENS + 5))


# ── gqa ──────────────────────────────────────────────────────────────────────────

def test_gqa_sharing_of_smollm2(gq):
    s = gq.sharing
    assert (s.H, s.H_kv, s.group, s.kv_of) == (9, 3, 3, [0, 0, 0, 1, 1, 1, 2, 2, 2]) and s.diff_scores < 1e-4
    assert [l.bytes_per_token for l in s.layouts] == [138240, 46080, 15360]


def _pooled_by_loops(model, G):
    """MiniLM with its K/V heads averaged in groups, written out head by head (not gqa.pool_heads)."""
    H, d = model.config.n_heads, model.config.d_head
    r = H // G

    def pool(x):
        return np.concatenate([np.mean([x[..., h * d:(h + 1) * d] for h in range(g * r, (g + 1) * r)], axis=0)
                               for g in range(G)], axis=-1)

    blocks = [dataclasses.replace(b, attn=dataclasses.replace(b.attn, W_K=pool(b.attn.W_K), W_V=pool(b.attn.W_V),
                                                              b_K=pool(b.attn.b_K), b_V=pool(b.attn.b_V)))
              for b in model.weights.blocks]
    return Model(model.config.with_(n_kv_heads=G), dataclasses.replace(model.weights, blocks=blocks),
                 model.tokenizer, model.name)


def test_gqa_pooling_measured(gq, minilm):
    assert [r.G for r in gq.rows] == [12, 6, 4, 3, 2, 1] and gq.pool_H == 12
    assert gq.rows[0].rel_error == 0.0 and gq.rows[0].cosine == pytest.approx(1.0, abs=1e-12)
    base = minilm.run("The cat sat on the mat", keep=()).hidden.astype(np.float64)
    for row in (gq.rows[3], gq.rows[5]):                                       # G = 3, G = 1 (MQA)
        h = _pooled_by_loops(minilm, row.G).run("The cat sat on the mat", keep=()).hidden.astype(np.float64)
        assert row.rel_error == pytest.approx(np.linalg.norm(h - base) / np.linalg.norm(base), rel=1e-5)
        e0, e1 = base.mean(0), h.mean(0)
        assert row.cosine == pytest.approx(e0 @ e1 / np.linalg.norm(e0) / np.linalg.norm(e1), rel=1e-5)
        assert row.cache_bytes == 2 * 6 * row.G * 32 * 4
    assert gq.rows[-1].rel_error > gq.rows[1].rel_error > 0.1                  # untrained sharing moves the output


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_gqa_page_prints_the_numbers(gq, lang):
    text = printed(gqa, gq, lang)
    for number in ("0, 1, 2", "6, 7, 8", "92,160", *(f"{r.rel_error:.4f}" for r in gq.rows),
                   *(f"{r.cosine:.4f}" for r in gq.rows)):
        assert number in text, number
    assert ("쿼리 헤드" in text and "평균 풀링" in text) if lang == "ko" else "Ainslie et al. 2023" in text


def test_gqa_on_a_multi_head_model(minilm):
    lesson = gqa.build(minilm, None)
    assert lesson.sharing.kv_of == list(range(12)) and lesson.pool_model == minilm.name
    assert "plain multi-head attention (MHA)" in printed(gqa, lesson, "en")


def test_a_wrong_dense_form_cannot_print(smol, minilm, monkeypatch):
    monkeypatch.setattr(gqa, "repeat_heads", lambda W, H, G, d_k: np.tile(W, H // G))   # heads in the wrong order
    with pytest.raises(RuntimeError, match="dense form"):
        gqa.build(smol, None, pool_model=minilm)


# ── figures ──────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("name, lang", [("positions", "ko"), ("kv", "en"), ("gqa", "ko")])
def test_figures_are_written(request, tmp_path, name, lang):
    module, lesson = {"positions": (positions, "pos"), "kv": (kvcache, "kv"), "gqa": (gqa, "gq")}[name]
    paths = module.figures(request.getfixturevalue(lesson), tmp_path, lang)
    stems = {"positions": {"positions_sinusoidal", "positions_rope", "positions_learned"}, "kv": {"kvcache"},
             "gqa": {"gqa"}}[name]
    assert {p.stem for p in paths} == stems and {p.suffix for p in paths} == {".png", ".svg"}
    assert sorted(tmp_path.iterdir()) == sorted(paths)                        # nothing else left behind
    for p in paths:
        head = p.read_bytes()[:8]
        assert head == b"\x89PNG\r\n\x1a\n" if p.suffix == ".png" else b"<svg" in p.read_bytes()[:400]


def test_the_positions_lesson_turns_only_gpt_neoxs_rotary_part():
    """GPT-NeoX turns the first rotary_dim numbers of each head: the lesson's speeds are that many halves,
    and its RoPE (recomputed in float64) equals the engine's on the model's own q, k (checked as it builds)."""
    from qkv.lessons import positions

    model = qkv.load(MODELS / "gpt_neox")
    page = positions.build(model)
    assert len(page.rope.omega) == model.config.rotary_dim // 2 == 2


@pytest.mark.parametrize("name", ["qwen3", "phi", "olmo2"])
def test_the_positions_lesson_reads_q_and_k_after_their_norms(name):
    """Qwen3 and Phi normalise each head's q and k before RoPE: the lesson's q, k (recomputed in float64
    from the weights) turn into the engine's own only once normalised (checked as it builds)."""
    from qkv.lessons import positions

    assert positions.build(qkv.load(MODELS / name)).rope is not None
