"""GLM, GLM-4 and Llama's mlp_bias (issue 47) against live transformers, on random checkpoints of other knob values
than the committed fixtures: GLM and GLM-4 with partial_rotary_factor 0.25, 0.5 (the default, left out), 1.0,
head_dim ≠ d/H, GQA/MQA/MHA, with and without q/k/v biases, RoPE bases and linear / YaRN scalings, tied or untied;
mlp_bias in each family that reads Llama's table (Llama, SmolLM3, Granite, Helium), with and without attention
biases.

Each case builds a seeded, perturbed model, saves it, loads it with qkv and compares a right- and a left-padded batch
(hidden states and logits within 1e-4, attention weights within 1e-5), then greedy generation with and without the
KV cache token for token; and a model qkv saves is read back by transformers with the same logits. GLM's and GLM-4's
GGUF files (llama.cpp's `chatglm` and `glm4`) against transformers on the directory.
"""

from __future__ import annotations

import pytest
from live_helpers import (INIT_RANGE, case_seed, check_decoder_live, check_decoder_saved_by_qkv, gguf_and_loaded,
                          saved_and_loaded)
from transformers import (Glm4Config, Glm4ForCausalLM, GlmConfig, GlmForCausalLM, GraniteConfig, GraniteForCausalLM,
                          HeliumConfig, HeliumForCausalLM, LlamaConfig, LlamaForCausalLM, SmolLM3Config,
                          SmolLM3ForCausalLM)

pytestmark = pytest.mark.live

NEW = 8


def glm(cls=GlmConfig, d=48, heads=4, kv=2, head_dim=12, layers=2, ff=80, rope=None, tied=False, vocab=211,
        positions=128, **kw):
    return cls(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
               num_hidden_layers=layers, intermediate_size=ff, max_position_embeddings=positions,
               rope_parameters=rope or {"rope_type": "default", "rope_theta": 1e4}, tie_word_embeddings=tied,
               initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1, eos_token_id=2,
               attn_implementation="eager", **kw)


GLM_CASES = [
    pytest.param(GlmForCausalLM, glm(), id="glm-default-factor-dk12-bias-gqa"),
    pytest.param(GlmForCausalLM, glm(d=32, heads=4, kv=4, head_dim=8, attention_bias=False, tied=True, layers=3,
                                     rope={"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 1.0}),
                 id="glm-full-rope-mha-nobias-tied-L3"),
    pytest.param(GlmForCausalLM, glm(heads=6, kv=1, head_dim=16,
                                     rope={"rope_type": "linear", "factor": 3.0, "rope_theta": 2e4,
                                           "partial_rotary_factor": 0.25}),
                 id="glm-quarter-mqa-dk16-linear"),
    pytest.param(Glm4ForCausalLM, glm(Glm4Config), id="glm4-default-factor-dk12-bias-gqa"),
    pytest.param(Glm4ForCausalLM, glm(Glm4Config, d=64, heads=4, kv=1, head_dim=24, attention_bias=False, tied=True,
                                      rms_norm_eps=1e-6,
                                      rope={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4,
                                            "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5}),
                 id="glm4-yarn-mqa-dk24-nobias-tied"),
    pytest.param(Glm4ForCausalLM, glm(Glm4Config, d=32, heads=2, kv=2, head_dim=16, layers=3,
                                      rope={"rope_type": "default", "rope_theta": 3e3, "partial_rotary_factor": 0.75}),
                 id="glm4-three-quarters-mha-L3"),
    pytest.param(GlmForCausalLM, glm(positions=12, rope={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4,
                                                         "partial_rotary_factor": 0.5}),
                 id="glm-dynamic-ntk-past-12-positions"),
]


@pytest.mark.parametrize("cls, config", GLM_CASES)
def test_glm(cls, config, tmp_path, request):
    model, ours = saved_and_loaded(cls, config, tmp_path, case_seed(request))
    factor = config.rope_parameters.get("partial_rotary_factor", 0.5)
    turned = ours.config.rotary_dim or ours.config.d_head
    assert ours.config.rope_interleaved and turned == int(factor * config.head_dim)
    assert ours.config.qkv_bias == config.attention_bias and not ours.config.out_bias
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


def llama_like(cls, d=48, heads=4, kv=2, layers=2, ff=72, tied=False, vocab=211, **kw):
    return cls(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
               num_hidden_layers=layers, intermediate_size=ff, max_position_embeddings=128, mlp_bias=True,
               rope_parameters={"rope_type": "default", "rope_theta": 1e4}, tie_word_embeddings=tied,
               initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1, eos_token_id=2,
               attn_implementation="eager", **kw)


MLP_BIAS_CASES = [
    pytest.param(LlamaForCausalLM, llama_like(LlamaConfig), id="llama-mlp_bias-gqa-untied"),
    pytest.param(LlamaForCausalLM, llama_like(LlamaConfig, d=32, kv=1, attention_bias=True, tied=True, layers=3,
                                              head_dim=16), id="llama-mlp_bias-attention_bias-mqa-dk16-tied"),
    pytest.param(SmolLM3ForCausalLM, llama_like(SmolLM3Config, no_rope_layers=[1, 0]), id="smollm3-mlp_bias"),
    pytest.param(GraniteForCausalLM, llama_like(GraniteConfig, embedding_multiplier=2.0, residual_multiplier=0.5,
                                                attention_multiplier=0.3, logits_scaling=1.5), id="granite-mlp_bias"),
    pytest.param(HeliumForCausalLM, llama_like(HeliumConfig, head_dim=12, attention_bias=True),
                 id="helium-mlp_bias-qkv-bias"),
]


@pytest.mark.parametrize("cls, config", MLP_BIAS_CASES)
def test_mlp_bias(cls, config, tmp_path, request):
    model, ours = saved_and_loaded(cls, config, tmp_path, case_seed(request))
    assert ours.config.ffn_bias and all(b.ffn.b_gate is not None for b in ours.weights.blocks)
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


@pytest.mark.parametrize("cls, config", [pytest.param(*GLM_CASES[2].values, id="glm"),
                                         pytest.param(*GLM_CASES[4].values, id="glm4"),
                                         pytest.param(*MLP_BIAS_CASES[1].values, id="llama-mlp_bias"),
                                         pytest.param(*MLP_BIAS_CASES[3].values, id="granite-mlp_bias")])
def test_a_model_qkv_saves_reads_back_in_transformers(cls, config, tmp_path):
    check_decoder_saved_by_qkv(cls, config, tmp_path)


GGUF_VOCAB = 300                           # gguf_convert writes a tokenizer of 260 ids: the vocabulary holds them


@pytest.mark.parametrize("config", [
    pytest.param(glm(Glm4Config, vocab=GGUF_VOCAB), id="glm4-default-factor-dk12-bias-gqa"),
    pytest.param(glm(Glm4Config, d=32, heads=2, kv=1, head_dim=24, layers=3, tied=True, attention_bias=False,
                     vocab=GGUF_VOCAB, rope={"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.25}),
                 id="glm4-quarter-mqa-dk24-nobias-tied-L3"),
])
def test_glm4_gguf_equals_transformers(config, tmp_path, request):
    """llama.cpp's `glm4` file (tests/fixtures/gguf_convert.py: tensors as stored, gate_up_proj as ffn_up) gives
    transformers' numbers on the directory, and its greedy ids with and without the KV cache."""
    model, ours = gguf_and_loaded(Glm4ForCausalLM, config, tmp_path, case_seed(request))
    assert ours.config.family == "glm4" and ours.config.d_head == config.head_dim
    assert ours.config.qkv_bias == config.attention_bias and ours.config.tied_embeddings == config.tie_word_embeddings
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


@pytest.mark.parametrize("config", [
    pytest.param(glm(vocab=GGUF_VOCAB, rms_norm_eps=1e-5), id="glm-default-factor-dk12-bias-gqa"),
    pytest.param(glm(heads=6, kv=1, head_dim=8, layers=3, tied=True, attention_bias=False, vocab=GGUF_VOCAB,
                     rms_norm_eps=1e-5,
                     rope={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}),
                 id="glm-quarter-mqa-dk8-nobias-tied-L3"),
])
def test_glm_gguf_equals_transformers(config, tmp_path, request):
    """llama.cpp's `chatglm` file of a GLM directory (ChatGLMModel: tensors as stored, base 10000, eps 1e-5, d_model /
    heads per head, which these directories have) gives transformers' numbers on the directory, and its greedy ids
    with and without the KV cache."""
    model, ours = gguf_and_loaded(GlmForCausalLM, config, tmp_path, case_seed(request))
    assert ours.config.family == "glm" and ours.config.d_head == config.head_dim
    assert ours.config.qkv_bias == config.attention_bias and ours.config.tied_embeddings == config.tie_word_embeddings
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)
