"""Greedy writing across LongRoPE's switch against transformers (make test-live).

A random Phi-3 whose original_max_position_embeddings is 8: a 5-token prompt and 12 new tokens pass it at the 4th
step, where transformers' Phi-3 drops its KV cache and reads the whole sequence again with the long factors
(Phi3ForCausalLM.prepare_inputs_for_generation), and qkv's cache reads it again too (KVCache.reread). qkv's ids,
with and without the cache, equal transformers' generate with and without it, token for token; the logits each
token was chosen from within 1e-4. StableLM with LongRoPE: transformers' StableLM keeps its cache across the
switch (no such override), so its cached writing is not its own full pass; qkv equals the full pass
(use_cache=False), with the cache and without.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import Spy
from live_helpers import INIT_RANGE, TOL_HIDDEN, build, max_abs, save
from transformers import Phi3Config, Phi3ForCausalLM, StableLmConfig, StableLmForCausalLM

import qkv
from qkv.writing.generate import decode

pytestmark = pytest.mark.live

ORIGINAL, NEW = 8, 12
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=INIT_RANGE, attn_implementation="eager")


def longrope(pairs: int, factor: float) -> dict:
    """LongRoPE with distinct short and long tables; passes longer than ORIGINAL positions take the long one."""
    return {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": factor,
            "short_factor": [1.0 + 0.2 * i for i in range(pairs)], "long_factor": [3.0 + 2.0 * i for i in range(pairs)],
            "original_max_position_embeddings": ORIGINAL}


def phi3(factor: float = 0.5, kv: int = 2, window: int | None = None) -> Phi3Config:
    return Phi3Config(vocab_size=211, hidden_size=64, num_attention_heads=4, num_key_value_heads=kv,
                      num_hidden_layers=2, intermediate_size=96, max_position_embeddings=64,
                      original_max_position_embeddings=ORIGINAL, rope_parameters=longrope(int(16 * factor) // 2, factor),
                      sliding_window=window, tie_word_embeddings=False, **SPECIAL)


def stablelm() -> StableLmConfig:
    return StableLmConfig(vocab_size=211, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                          num_hidden_layers=2, intermediate_size=96, max_position_embeddings=64,
                          rope_parameters=longrope(4, 0.5), **SPECIAL)


PROMPTS = {"one": (np.array([[5, 17, 42, 9, 33]]), np.ones((1, 5), np.int64)),
           "left-padded": (np.array([[5, 17, 42, 9, 33, 60], [0, 0, 0, 11, 23, 8]]),
                           np.array([[1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]]))}


def theirs(model, ids: np.ndarray, mask: np.ndarray, use_cache: bool) -> tuple[np.ndarray, np.ndarray]:
    """transformers' greedy generate: (the new ids (B, NEW), the logits each was chosen from (NEW, B, V))."""
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW,
                             do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=use_cache,
                             output_logits=True, return_dict_in_generate=True)
    return out.sequences[:, ids.shape[1]:].numpy(), torch.stack(out.logits).numpy()


def ours(model, ids: np.ndarray, mask: np.ndarray, use_cache: bool) -> tuple[np.ndarray, np.ndarray]:
    spy = Spy(model)
    steps = [s.ids for s in decode(spy, ids, mask, NEW, temperature=0, stop_at_eos=False, use_cache=use_cache)]
    return np.stack(steps, axis=1), np.stack(spy.seen)


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("config", [phi3(), phi3(factor=1.0, kv=1), phi3(window=6)],
                         ids=["rot0.5-gqa", "rot1-mqa", "window6"])
def test_phi3_crossing_equals_transformers_with_and_without_the_cache(config, prompt, tmp_path):
    model = build(Phi3ForCausalLM, config, seed=21)
    save(model, tmp_path)
    mine = qkv.load(tmp_path)
    ids, mask = PROMPTS[prompt]
    want, z_want = theirs(model, ids, mask, use_cache=True)
    want_full, z_full = theirs(model, ids, mask, use_cache=False)
    np.testing.assert_array_equal(want, want_full)                  # transformers' Phi-3 itself: the same ids
    for use_cache in (True, False):
        got, z = ours(mine, ids, mask, use_cache)
        np.testing.assert_array_equal(got, want)
        assert max_abs(z, z_want) <= TOL_HIDDEN and max_abs(z, z_full) <= TOL_HIDDEN


def test_stablelm_crossing_equals_transformers_full_pass_with_and_without_the_cache(tmp_path):
    model = build(StableLmForCausalLM, stablelm(), seed=22)
    save(model, tmp_path)
    mine = qkv.load(tmp_path)
    ids, mask = PROMPTS["one"]
    want, z_want = theirs(model, ids, mask, use_cache=False)
    for use_cache in (True, False):
        got, z = ours(mine, ids, mask, use_cache)
        np.testing.assert_array_equal(got, want)
        assert max_abs(z, z_want) <= TOL_HIDDEN
