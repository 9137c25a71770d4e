"""OLMo 3, Arcee and Helium (issue 47) against live transformers, on random checkpoints of other knob values than
the committed fixtures: OLMo 3 with the default layer pattern (three sliding layers then a full one), every layer
full, windows that cut or not, RoPE bases and scalings by layer type, an older config.json's rope_theta, attention
biases, GQA/MHA, tied or untied; Arcee with and without FFN and attention biases, ReLU² or another activation,
a RoPE scaling, head_dim ≠ d/H; Helium
(interleaved RoPE) with and without q/k/v biases, GQA/MQA/MHA, RoPE bases and a scaling, tied or untied.

Each case builds a seeded, perturbed model, saves it, loads it with qkv and compares a right- and a left-padded batch
(hidden states and logits within 1e-4, attention weights within 1e-5), then greedy generation with and without the
KV cache token for token; and a model qkv saves is read back by transformers with the same logits.
Arcee's GGUF file (llama.cpp's `arcee`) against transformers on the directory.
"""

from __future__ import annotations

import pytest
from live_helpers import (INIT_RANGE, case_seed, check_decoder_live, check_decoder_saved_by_qkv, gguf_and_loaded,
                          saved_and_loaded)
from transformers import ArceeConfig, ArceeForCausalLM, HeliumConfig, HeliumForCausalLM, Olmo3Config, Olmo3ForCausalLM

pytestmark = pytest.mark.live

NEW = 8


def olmo3(d=48, heads=4, kv=2, layers=4, ff=80, window=4, types=None, rope=None, tied=False, vocab=211, **kw):
    return Olmo3Config(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                       num_hidden_layers=layers, intermediate_size=ff, max_position_embeddings=128,
                       sliding_window=window, layer_types=types, rope_parameters=rope, tie_word_embeddings=tied,
                       initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                       attn_implementation="eager", **kw)


def by_kind(full: dict, sliding: dict) -> dict:
    return {"full_attention": full, "sliding_attention": sliding}


OLMO3_CASES = [
    pytest.param(olmo3(), id="olmo3-default-pattern-window4-L4"),
    pytest.param(olmo3(d=32, heads=4, kv=4, layers=2, types=["full_attention"] * 2, tied=True),
                 id="olmo3-all-full-tied"),
    pytest.param(olmo3(layers=3, window=6, attention_bias=True, types=["full_attention", "sliding_attention",
                                                                        "sliding_attention"],
                       rope=by_kind({"rope_type": "linear", "factor": 3.0, "rope_theta": 2e4},
                                    {"rope_type": "default", "rope_theta": 3e3})),
                 id="olmo3-bias-linear-full-window6"),
    pytest.param(olmo3(d=64, heads=8, kv=1, layers=2, window=32, rope_theta=7e3, rms_norm_eps=1e-5),
                 id="olmo3-mqa-window-unused-old-rope_theta"),
]


def arcee(d=48, heads=4, kv=2, layers=2, ff=96, act="relu2", rope=None, tied=False, vocab=211, **kw):
    return ArceeConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                       num_hidden_layers=layers, intermediate_size=ff, hidden_act=act, max_position_embeddings=128,
                       rope_parameters=rope or {"rope_type": "default", "rope_theta": 1e4}, tie_word_embeddings=tied,
                       initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                       attn_implementation="eager", **kw)


ARCEE_CASES = [
    pytest.param(arcee(), id="arcee-relu2-gqa-untied"),
    pytest.param(arcee(d=32, heads=4, kv=4, layers=3, mlp_bias=True, attention_bias=True, tied=True),
                 id="arcee-biases-mha-tied-L3"),
    pytest.param(arcee(heads=4, kv=1, head_dim=16, act="silu", rms_norm_eps=1e-6,
                       rope={"rope_type": "linear", "rope_theta": 5e4, "factor": 4.0}),
                 id="arcee-mqa-head_dim16-silu-linear"),
]


@pytest.mark.parametrize("config", ARCEE_CASES)
def test_arcee(config, tmp_path, request):
    model, ours = saved_and_loaded(ArceeForCausalLM, config, tmp_path, case_seed(request))
    assert not ours.config.gated_ffn and ours.config.ffn_bias == config.mlp_bias
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


def helium(d=48, heads=4, kv=2, layers=2, ff=96, rope=None, tied=False, vocab=211, **kw):
    return HeliumConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                        head_dim=d // heads, num_hidden_layers=layers, intermediate_size=ff,
                        max_position_embeddings=128,
                        rope_parameters=rope or {"rope_type": "default", "rope_theta": 1e4}, tie_word_embeddings=tied,
                        initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        attn_implementation="eager", **kw)


HELIUM_CASES = [
    pytest.param(helium(), id="helium-gqa-untied"),
    pytest.param(helium(d=64, heads=4, kv=4, layers=3, attention_bias=True, tied=True, rms_norm_eps=1e-6),
                 id="helium-mha-dk16-bias-tied-L3"),
    pytest.param(helium(d=48, heads=6, kv=1, rope={"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0}),
                 id="helium-mqa-dk8-linear-theta5e5"),
]


@pytest.mark.parametrize("config", HELIUM_CASES)
def test_helium(config, tmp_path, request):
    model, ours = saved_and_loaded(HeliumForCausalLM, config, tmp_path, case_seed(request))
    assert ours.config.rope_interleaved and ours.config.qkv_bias == config.attention_bias and not ours.config.out_bias
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


@pytest.mark.parametrize("config", OLMO3_CASES)
def test_olmo3(config, tmp_path, request):
    model, ours = saved_and_loaded(Olmo3ForCausalLM, config, tmp_path, case_seed(request))
    assert [ours.config.window(i) for i in range(config.num_hidden_layers)] == [
        config.sliding_window if t == "sliding_attention" else None for t in config.layer_types]
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


@pytest.mark.parametrize("cls, config", [pytest.param(Olmo3ForCausalLM, OLMO3_CASES[2].values[0], id="olmo3"),
                                         pytest.param(ArceeForCausalLM, ARCEE_CASES[1].values[0], id="arcee"),
                                         pytest.param(HeliumForCausalLM, HELIUM_CASES[1].values[0], id="helium")])
def test_a_model_qkv_saves_reads_back_in_transformers(cls, config, tmp_path):
    check_decoder_saved_by_qkv(cls, config, tmp_path)


GGUF_VOCAB = 300                           # gguf_convert writes a tokenizer of 260 ids: the vocabulary holds them


@pytest.mark.parametrize("config", [pytest.param(arcee(vocab=GGUF_VOCAB), id="arcee-gqa-untied"),
                                    pytest.param(arcee(d=32, heads=2, kv=1, layers=3, tied=True, vocab=GGUF_VOCAB,
                                                       rope={"rope_type": "default", "rope_theta": 5e5}),
                                                 id="arcee-mqa-tied-theta5e5-L3")])
def test_arcee_gguf_equals_transformers(config, tmp_path, request):
    """llama.cpp's `arcee` file (tests/fixtures/gguf_convert.py: Q/K permuted as LlamaModel does) gives transformers'
    numbers on the directory, and its greedy ids with and without the KV cache."""
    model, ours = gguf_and_loaded(ArceeForCausalLM, config, tmp_path, case_seed(request))
    assert ours.config.family == "arcee" and ours.config.activation == "relu2"
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)
