"""The KV cache across a change of RoPE table (core.cache: KVCache.fits, KVCache.reread).

LongRoPE (Phi-3) turns a pass by its short factors while the sequence fits original_max_position_embeddings and
by its long ones past it. A cache filled below that length holds keys turned by the short table; the step that
crosses it must read the whole sequence again with the long one (as transformers' Phi-3 drops its cache there),
so that writing with the cache equals writing without it. Fixture-free: tiny random Phi-3 models from qkv.init
(σ 0.5, so that greedy choices are far from ties); tests/live/test_live_rope_cache.py checks transformers.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import qkv
from qkv.core.cache import KVCache
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.writing.chat import Conversation
from qkv.writing.generate import Recording, decode
from conftest import MODELS, TOL_ATTENTION, TOL_HIDDEN, Spy, max_abs

ORIGINAL = 8                                     # original_max_position_embeddings: passes longer take the long table


def phi3(original: int = ORIGINAL, rotary: float = 0.5, kv: int = 2, window: int | None = None) -> qkv.Model:
    """A random Phi-3 with LongRoPE: d_model 32, 4 heads of 8 (KV heads), RoPE over ROTARY of each head."""
    pairs = int(8 * rotary) // 2
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": rotary,
            "short_factor": [1.0 + 0.2 * i for i in range(pairs)], "long_factor": [3.0 + 2.0 * i for i in range(pairs)]}
    hf = {"model_type": "phi3", "vocab_size": 97, "hidden_size": 32, "num_attention_heads": 4,
          "num_key_value_heads": kv, "num_hidden_layers": 2, "intermediate_size": 48, "max_position_embeddings": 64,
          "original_max_position_embeddings": original, "rope_parameters": rope, "sliding_window": window,
          "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}
    return qkv.init(hf, seed=7, initializer_range=0.5)


PROMPT = np.array([[5, 17, 42, 9, 33]])          # 5 tokens: the prompt's pass and 3 steps take the short table


def written(model, ids: np.ndarray, mask: np.ndarray, new: int, use_cache: bool) -> tuple[np.ndarray, np.ndarray]:
    """Greedy decoding: (the new ids (B, new), the logits each was chosen from (new, B, V))."""
    spy = Spy(model)
    steps = [s.ids for s in decode(spy, ids, mask, new, temperature=0, stop_at_eos=False, use_cache=use_cache)]
    return np.stack(steps, axis=1), np.stack(spy.seen)


@pytest.mark.parametrize("kw", [{}, {"rotary": 1.0, "kv": 1}, {"window": 6}], ids=["rot0.5-gqa", "rot1-mqa", "window6"])
def test_greedy_crossing_the_original_length_with_the_cache_equals_without(kw):
    """5 prompt tokens and 12 new ones: the sequence passes 8 at the 4th step. Token for token, and each
    step's logits within 1e-4 (before the fix the cached keys kept the short table's turn: other ids). The
    switch matters: with the short table kept past the original length the same model writes other tokens."""
    model = phi3(**kw)
    mask = np.ones_like(PROMPT)
    cached, z_cached = written(model, PROMPT, mask, 12, use_cache=True)
    full, z_full = written(model, PROMPT, mask, 12, use_cache=False)
    assert cached.tolist() == full.tolist()
    assert max_abs(z_cached, z_full) <= TOL_HIDDEN
    scaling = model.config.rope_scaling
    short = model.with_config(rope_scaling=scaling | {"long_factor": scaling["short_factor"]})
    assert written(short, PROMPT, mask, 12, use_cache=False)[0].tolist() != full.tolist()


def test_each_cached_step_equals_a_full_pass_and_the_cache_rereads_once():
    """Step by step through `transformer`: the step reaching position 8 reads all 9 tokens again (its hidden
    states cover them), once; every later step is one token again, after keys turned by the long table."""
    model = phi3()
    cfg, w = model.config, model.weights
    ids = np.array([[5, 17, 42, 9, 33, 60, 3, 71, 14, 88, 25, 49, 7]])          # (1, 13)
    cache = KVCache(cfg, 1, ids.shape[1])
    transformer(w, cfg, ids[:, :5], np.ones((1, 5), np.int64), rec=Recorder(keep=()), cache=cache)
    for t in range(5, ids.shape[1]):
        hidden, step = transformer(w, cfg, ids[:, t:t + 1], np.ones((1, t + 1), np.int64), rec=Recorder(keep=()),
                                   cache=cache, logits="last")
        full = model.forward(ids[:, :t + 1], attentions=False)
        assert max_abs(step, full.logits[:, -1:]) <= TOL_HIDDEN
        assert hidden.shape[1] == (t + 1 if t == ORIGINAL else 1)          # the crossing step: the whole sequence
        assert cache.length == t + 1 and cache.rereads == (t >= ORIGINAL)
    assert np.array_equal(cache.ids, ids)


def test_a_left_padded_batch_crosses_as_each_row_alone():
    """Positions count real tokens: the table switches when the longest row passes 8, and both rows (one
    left-padded) then continue as without the cache."""
    model = phi3()
    ids = np.array([[5, 17, 42, 9, 33, 60], [0, 0, 0, 11, 23, 8]])
    mask = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]])
    cached, z_cached = written(model, ids, mask, 10, use_cache=True)
    full, z_full = written(model, ids, mask, 10, use_cache=False)
    assert cached.tolist() == full.tolist()
    assert max_abs(z_cached, z_full) <= TOL_HIDDEN


def test_a_prompt_already_past_the_original_length_never_rereads():
    model = phi3()
    ids = np.arange(3, 14)[None]                                              # 11 tokens > 8
    cache = KVCache(model.config, 1, 16)
    transformer(model.weights, model.config, ids, np.ones((1, 11), np.int64), cache=cache, logits="last")
    for t in range(11, 16):
        transformer(model.weights, model.config, np.array([[t]]), np.ones((1, t + 1), np.int64), cache=cache,
                    logits="last")
    assert cache.rereads == 0 and cache.length == 16


def test_a_recorded_generation_across_the_switch_traces_as_one_pass():
    """The recording (qkv generate --trace, the chat's trace) drops the rows the short table turned when the
    pass reads everything again: its trace equals one pass over prompt and reply."""
    model = phi3()
    record = Recording()
    new = [int(s.ids[0]) for s in decode(model, PROMPT, np.ones_like(PROMPT), 9, record=record, temperature=0,
                                         stop_at_eos=False)]
    ids = np.concatenate([PROMPT[0], new])                                    # (14,)
    assert record.ids == ids[:-1].tolist()
    trace = record.trace(model, ids, PROMPT.shape[1])
    ref = model.run(ids, keep=("attentions",))
    assert max_abs(trace.attentions, ref.attentions) <= TOL_ATTENTION
    assert max_abs(trace.logits, ref.logits) <= TOL_HIDDEN and max_abs(trace.hidden, ref.hidden) <= TOL_HIDDEN


def test_a_pass_from_embeddings_cannot_reread_and_says_so():
    model = phi3()
    cfg, w = model.config, model.weights
    cache = KVCache(cfg, 1, 12)
    transformer(w, cfg, PROMPT, np.ones((1, 5), np.int64), cache=cache, logits="last")
    for t in range(5, ORIGINAL):
        transformer(w, cfg, np.array([[t]]), np.ones((1, t + 1), np.int64), cache=cache, logits="last")
    tokens = w.tok_embed[[[4]]]                                               # (1, 1, d_model)
    with pytest.raises(qkv.QkvError, match="run it without a cache"):
        transformer(w, cfg, np.array([[4]]), np.ones((1, ORIGINAL + 1), np.int64), cache=cache, tokens=tokens)


def test_chat_and_a_conversation_cross_the_switch_as_without_the_cache(tmp_path):
    """Chat (and the REPL's Conversation) write through the same loop: the committed Phi-3 (original length 12)
    with a one-line template, a reply that passes 12 tokens, with and without the cache."""
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(MODELS / "phi3" / name, tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    model = qkv.load(tmp_path)
    prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert len(prompt) < 12                                                   # the reply crosses 12
    a = model.chat("hi", max_new_tokens=16, stop_at_eos=False)
    assert a == model.chat("hi", max_new_tokens=16, stop_at_eos=False, use_cache=False)
    talk = Conversation(model, max_new_tokens=16, record=True, stop_at_eos=False)
    assert "".join(talk.reply("hi")) == a
    assert len(talk.last.prompt_ids) + len(talk.last.new_ids) > 12
    trace, ref = talk.last.trace(), model.run(np.concatenate([talk.last.prompt_ids, talk.last.new_ids]))
    assert max_abs(trace.logits, ref.logits) <= TOL_HIDDEN
