"""Models made by qkv.init and written by Model.save, read by live transformers (make test-live).

Each saved directory is loaded with AutoModelForCausalLM / AutoModel.from_pretrained (no missing,
unexpected or mismatched tensors), its named_parameters are exactly the family's `tensors` (names
and values; a tied head once), and its logits (BERT: hidden states) on a right-padded batch equal
qkv's within 1e-4 at the valid positions. transformers and torch are imported at module level:
without them these tests fail, never skip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

import qkv
from qkv import ModelConfig
from qkv.checkpoints import FAMILIES, weights_from_tensors
from qkv.inputs.tokenizer import Tokenizer
from live_helpers import INIT_RANGE, NOISE, TOL_HIDDEN, max_abs, padded_batch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"

GPT2 = dict(family="gpt2", vocab_size=96, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=32,
            activation="gelu_tanh", tied_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
LLAMA = dict(family="llama", vocab_size=96, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_positions=64,
             norm="rms", norm_eps=1e-6, position="rope", activation="silu", gated_ffn=True, qkv_bias=False,
             out_bias=False, ffn_bias=False, pad_token_id=0, bos_token_id=1, eos_token_id=2, pad_embedding_frozen=True)
BERT = dict(family="bert", vocab_size=96, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=32,
            causal=False, norm_place="post", norm_eps=1e-12, activation="gelu", type_vocab_size=2,
            embed_norm=True, final_norm=False, lm_head=False, pad_token_id=0, pad_embedding_frozen=True)

CONFIGS = {
    "gpt2-tied": ModelConfig(**GPT2),
    "gpt2-untied-erf": ModelConfig(**{**GPT2, "tied_embeddings": False, "activation": "gelu", "n_layers": 3}),
    "llama-mha-untied": ModelConfig(**LLAMA),
    "llama-gqa-tied": ModelConfig(**{**LLAMA, "n_heads": 8, "n_kv_heads": 2, "tied_embeddings": True}),
    "llama-mqa-head-dim": ModelConfig(**{**LLAMA, "n_kv_heads": 1, "d_head": 12}),
    "llama-bias-theta": ModelConfig(**{**LLAMA, "qkv_bias": True, "out_bias": True, "rope_theta": 5e5}),
    "llama-rope-linear": ModelConfig(**{**LLAMA, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "llama-rope-llama3": ModelConfig(**{**LLAMA, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}),
    "llama-attention-only": ModelConfig(**{**LLAMA, "d_ff": 0}),
    "mistral-window4": ModelConfig(**{**LLAMA, "family": "mistral", "n_kv_heads": 2, "sliding_window": 4,
                                      "norm_eps": 1e-5}),
    "qwen2-biases-tied": ModelConfig(**{**LLAMA, "family": "qwen2", "n_kv_heads": 2, "qkv_bias": True,
                                        "rope_theta": 1e6, "tied_embeddings": True}),
    "bert": ModelConfig(**BERT),
    "bert-attention-only": ModelConfig(**{**BERT, "d_ff": 0, "type_vocab_size": 3}),
}


def fresh(cfg: ModelConfig, seed: int) -> qkv.Model:
    """qkv.init with σ = 0.15 (attention far from uniform), then noise on every tensor (no bias 0,
    no norm weight 1), through the family's tensors / weights_from_tensors."""
    model = qkv.init(cfg, seed=seed, initializer_range=INIT_RANGE)
    t = FAMILIES[cfg.family].tensors(model.weights, cfg)
    rng = np.random.default_rng(seed + 1)
    for x in t.values():
        x += (rng.standard_normal(x.shape) * NOISE).astype(x.dtype)
    return qkv.Model(cfg, weights_from_tensors(t, cfg), name="fresh")


def from_pretrained(cfg: ModelConfig, directory) -> torch.nn.Module:
    """transformers' model of the saved directory (eager, eval), refusing any tensor it did not find."""
    if cfg.causal:
        model, info = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager",
                                                           output_loading_info=True)
    else:
        model, info = AutoModel.from_pretrained(directory, attn_implementation="eager", add_pooling_layer=False,
                                                output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert next(model.parameters()).dtype == torch.float32
    return model.eval()


@pytest.mark.parametrize("name", CONFIGS)
def test_transformers_reads_a_saved_model(name, tmp_path):
    cfg = CONFIGS[name]
    model = fresh(cfg, seed=11)
    model.save(tmp_path / "m")
    ref = from_pretrained(cfg, tmp_path / "m")

    # Its parameters are `tensors`, by name and value (a tied head once: named_parameters dedups it).
    params = {k: v.detach().numpy() for k, v in ref.named_parameters()}
    expected = FAMILIES[cfg.family].tensors(model.weights, cfg)
    assert params.keys() == expected.keys()
    for k in expected:
        np.testing.assert_array_equal(params[k], expected[k], err_msg=k)

    # Its outputs on a right-padded batch are qkv's.
    ids, mask = padded_batch(cfg.vocab_size, [11, 7], seed=3)
    out = model.forward(ids, mask, attentions=False)
    with torch.no_grad():
        got = ref(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    valid = mask.astype(bool)
    if cfg.causal:
        figure = max_abs(out.logits[valid], got.logits.numpy()[valid])
    else:
        figure = max_abs(out.hidden[valid], got.last_hidden_state.numpy()[valid])
    print(f"{name}: max abs {figure:.2e}")
    assert figure <= TOL_HIDDEN, figure


def test_an_attention_only_gpt2_loads_in_transformers_but_does_not_run(tmp_path):
    """GPT-2 with n_inner = 0: transformers builds it and loads every tensor, but its Conv1D cannot
    run an FFN of width 0 (x.view(-1, 0)); qkv runs it. (Llama and BERT with intermediate_size 0
    run in both: see the test above.) If transformers learns to, this test fails: compare outputs."""
    cfg = ModelConfig(**{**GPT2, "d_ff": 0})
    model = fresh(cfg, seed=5)
    model.save(tmp_path / "m")
    ref = from_pretrained(cfg, tmp_path / "m")
    params = {k: v.detach().numpy() for k, v in ref.named_parameters()}
    expected = FAMILIES["gpt2"].tensors(model.weights, cfg)
    assert params.keys() == expected.keys()
    assert params["transformer.h.0.mlp.c_fc.weight"].shape == (32, 0)
    for k in expected:
        np.testing.assert_array_equal(params[k], expected[k], err_msg=k)
    with pytest.raises(RuntimeError, match="0 elements"):
        ref(input_ids=torch.tensor([[3, 4, 5]]))
    assert model.forward([[3, 4, 5]]).logits.shape == (1, 3, 96)


def test_the_saved_tokenizer_reads_in_transformers(tmp_path):
    tok = Tokenizer(FIXTURES / "llama_gqa" / "tokenizer.json", chat_template="{{ messages[0]['content'] }}</s>",
                    special_tokens={"eos_token": "</s>", "bos_token": "<s>", "pad_token": "<pad>"})
    cfg = ModelConfig(**{**LLAMA, "vocab_size": 400})
    qkv.init(cfg, tokenizer=tok).save(tmp_path / "m")
    ref = AutoTokenizer.from_pretrained(tmp_path / "m")
    text = "The quick brown fox jumps over the lazy dog, 42 times."
    assert ref(text)["input_ids"] == tok.encode(text)[0].tolist()
    assert ref.eos_token == "</s>" and ref.pad_token_id == 0
    assert ref.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi</s>"
