"""Gemma 3 GGUF files (llama.cpp's arch `gemma3`) against live transformers (make test-live).

Random Gemma3ForCausalLM checkpoints of knob values the committed fixture lacks — seven layers (five sliding of six,
then one more), GQA, d_k ≠ d_model / heads, linear ×8 RoPE on the full layers and another base on the sliding ones, a
final soft-cap, tied; MQA over six layers with d_k 24, plain RoPE, untied — each with query_pre_attn_scalar = d_k (the
scale llama.cpp's gemma3 runs), are built with transformers, saved, written as llama.cpp's convert_hf_to_gguf.py lays
them out (tests/fixtures/gguf_convert.py) and qkv.load(file.gguf) is compared with transformers on the directory: a
right- and a left-padded batch (hidden states and logits 1e-4, attention weights 1e-5), greedy ids with and without
the KV cache.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from live_helpers import INIT_RANGE, build, case_seed, check_decoder_live, save
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

import qkv

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
import gguf_convert as C  # noqa: E402

pytestmark = pytest.mark.live

NEW = 8
V = 300                                     # gguf_convert writes a tokenizer of 260 ids: the vocabulary holds them
COMMON = dict(vocab_size=V, max_position_embeddings=128, initializer_range=INIT_RANGE, pad_token_id=0,
              bos_token_id=1, eos_token_id=2, attn_implementation="eager", intermediate_size=80)

CASES = [
    pytest.param(Gemma3TextConfig(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=7,
        sliding_window=4, query_pre_attn_scalar=16, final_logit_softcapping=6.0, tie_word_embeddings=True,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}}, **COMMON),
        id="L7-gqa-dk16-linear8-swa-base2e4-softcap-tied"),
    pytest.param(Gemma3TextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=24, num_hidden_layers=6,
        sliding_window=3, query_pre_attn_scalar=24, tie_word_embeddings=False,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e5},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, **COMMON),
        id="L6-mqa-dk24-plain-untied"),
]


@pytest.mark.parametrize("config", CASES)
def test_gguf_equals_transformers(config, tmp_path, request):
    """The file of transformers' seeded model gives transformers' numbers on the directory, and its greedy ids."""
    model = build(Gemma3ForCausalLM, config, seed=case_seed(request))
    save(model, tmp_path / "hf")
    ours = qkv.load(C.convert(tmp_path / "hf", tmp_path / "model.gguf"))
    assert ours.config.family == "gemma3_text"
    check_decoder_live(model, ours, V, request.node.callspec.id, NEW)
