"""generate: the KV cache equals recomputing, greedy equals transformers, and bad requests say why."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.core.cache import KVCache
from qkv.writing.generate import decode
from qkv.core.stack import transformer
from qkv.writing.sampling import Sampling
from qkv.core.trace import Recorder
from conftest import DECODER_FIXTURES, MODELS, TOL_ATTENTION, TOL_HIDDEN, max_abs, reference


def load(name):
    return qkv.load(MODELS / name)


# phi3: the step that passes original_max_position_embeddings (12) reads the whole sequence again with LongRoPE's
# long table (tests/test_cache.py), so its logits cover every position: the last one is compared
@pytest.mark.parametrize("name", DECODER_FIXTURES)
def test_each_cached_step_equals_a_full_recompute(name):
    model = load(name)
    ids = reference(name)["single_input_ids"]                       # (1, 17)
    n0, cfg, w = 6, model.config, model.weights
    cache = KVCache(cfg, 1, ids.shape[1])
    transformer(w, cfg, ids[:, :n0], np.ones((1, n0), np.int64), rec=Recorder(keep=()), cache=cache)
    for t in range(n0, ids.shape[1]):
        _, step = transformer(w, cfg, ids[:, t:t + 1], np.ones((1, t + 1), np.int64), rec=Recorder(keep=()),
                              cache=cache)
        full = model.forward(ids[:, : t + 1], attentions=False).logits[:, -1:]
        assert max_abs(step[:, -1:], full) <= TOL_HIDDEN


@pytest.mark.parametrize("name", DECODER_FIXTURES)
def test_greedy_equals_transformers_generate(name):
    """transformers' generate(do_sample=False, max_new_tokens=8, eos_token_id=None), token for token."""
    ref = reference(name)
    out = load(name).generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False)
    assert out.tolist() == ref["greedy_ids"].tolist()


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa"])
def test_cache_and_no_cache_give_the_same_tokens(name):
    model = load(name)
    ids = reference(name)["single_input_ids"][:, :5]
    for kw in ({"temperature": 0}, {"temperature": 0.8, "top_k": 50, "seed": 3}):
        a = model.generate(ids, 12, stop_at_eos=False, **kw)
        b = model.generate(ids, 12, stop_at_eos=False, use_cache=False, **kw)
        assert a.tolist() == b.tolist()


def test_left_padded_batch_generates_each_row_as_alone():
    model = load("llama_gqa")
    ids = reference("llama_gqa")["single_input_ids"][0]
    long, short = ids[:9], ids[3:7]
    batch = np.stack([long, np.concatenate([[0] * 5, short])])
    mask = np.array([[1] * 9, [0] * 5 + [1] * 4])
    out = model.generate(batch, 6, attention_mask=mask, temperature=0, stop_at_eos=False)
    assert out[0, 9:].tolist() == model.generate(long[None], 6, temperature=0, stop_at_eos=False)[0, 9:].tolist()
    assert out[1, 9:].tolist() == model.generate(short[None], 6, temperature=0, stop_at_eos=False)[0, 4:].tolist()


def test_cache_keeps_only_kv_heads_and_keys_after_rope():
    model = load("llama_mqa")
    cfg = model.config
    assert cfg.n_kv_heads == 1 and cfg.n_heads == 4
    cache = KVCache(cfg, 1, 16)
    ids = np.arange(3, 11)[None]
    rec = Recorder(keep=("k",))
    transformer(model.weights, cfg, ids, np.ones((1, 8), np.int64), rec=rec, cache=cache)
    assert cache.k.shape == (cfg.n_layers, 1, 1, 16, cfg.d_head) and cache.length == 8
    np.testing.assert_array_equal(cache.k[0, :, :, :8], rec.store[0]["k"])     # the rotated keys
    assert KVCache.bytes_per_token(cfg) == 2 * cfg.n_layers * 1 * cfg.d_head * 4
    full = KVCache.bytes_per_token(cfg.with_(n_kv_heads=cfg.n_heads))
    assert full == 4 * KVCache.bytes_per_token(cfg)                              # MQA saves H/Hkv


def test_step_attention_equals_the_final_trace():
    """What each generated token attended to while generating = the trace's rows."""
    model = load("gpt2")
    prompt = model.encode("the cat sat")[0]
    steps = list(decode(model, prompt[None], np.ones((1, len(prompt)), np.int64), 6, temperature=0,
                        stop_at_eos=False, keep_attentions=True))
    new = [int(s.ids[0]) for s in steps]
    trace = model.generate("the cat sat", 6, temperature=0, stop_at_eos=False, trace=True)
    assert trace.prompt_length == len(prompt) and trace.ids.tolist() == prompt.tolist() + new
    a = trace.attentions                                                  # (L, H, N, N)
    for t, s in enumerate(steps):
        row = len(prompt) - 1 + t                                          # the token fed at step t
        assert max_abs(s.attentions[:, 0], a[:, :, row, : row + 1]) <= TOL_ATTENTION


def test_seed_repeats_text_and_stream_equals_generate():
    model = load("gpt2")
    a = model.generate("the cat", 15, temperature=1.0, seed=11)
    assert a == model.generate("the cat", 15, temperature=1.0, seed=11)
    assert a != model.generate("the cat", 15, temperature=1.0, seed=12)
    assert "".join(model.stream("the cat", 15, temperature=1.0, seed=11)) == a
    greedy = model.generate("the cat", 15)                                # the default: greedy, as transformers
    assert greedy == model.generate("the cat", 15, temperature=0) == model.generate("the cat", 15, seed=12)


def test_stop_strings_and_tokens():
    model = load("gpt2")
    text = model.generate("the cat", 20, temperature=0, stop_at_eos=False)
    stop = text[3:5]
    cut = model.generate("the cat", 20, temperature=0, stop=stop, stop_at_eos=False)
    assert cut == text[: text.find(stop)]
    ids = model.generate(np.array([[5, 6, 7]]), 20, temperature=0, stop_at_eos=False)
    first = int(ids[0, 3])
    stopped = model.generate(np.array([[5, 6, 7]]), 20, temperature=0, stop=first, stop_at_eos=False)
    assert stopped.tolist() == [[5, 6, 7, first]]                          # the stop token ends, included


def test_trace_can_be_saved_and_loaded(tmp_path):
    model = load("gpt2")
    trace = model.generate("the cat", 5, seed=1, trace=True)
    back = qkv.Trace.load(trace.save(tmp_path / "t", model.name))
    assert back.tokens == trace.tokens and back.prompt_length == trace.prompt_length
    np.testing.assert_array_equal(back.attentions, trace.attentions)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["trace.json", "trace.npz"]


@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 500}, "context of 128"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"stop": 3.5}, "stop must be"),
])
def test_bad_requests(kwargs, message):
    model = load("gpt2")
    args = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(qkv.QkvError, match=message):
        model.generate("the cat", **args)


def test_encoders_refuse_and_name_a_decoder(minilm):
    with pytest.raises(qkv.QkvError, match="encoder.*use a decoder: --model smollm2 \\(shipped with qkv\\)"):
        minilm.generate("The cat", 5)


def test_a_sampling_value_equals_its_settings_by_name():
    model = load("gpt2")
    chosen = Sampling(temperature=0.8, top_k=20, seed=5, stop_at_eos=False)
    by_name = model.generate("the cat", 8, temperature=0.8, top_k=20, seed=5, stop_at_eos=False)
    assert model.generate("the cat", 8, chosen) == by_name
    assert model.generate("the cat", 8, Sampling(temperature=0.8, top_k=20), seed=5, stop_at_eos=False) == by_name
    assert "".join(model.stream("the cat", 8, chosen)) == by_name
