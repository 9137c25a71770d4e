"""EXAONE 4, Seed-OSS, Hunyuan dense and Apertus (issue 47) against live transformers, on random checkpoints of
other knob values than the committed fixtures: EXAONE 4 with its default pattern (three sliding layers, then a
full one without RoPE), no window at all (every layer full and turned), another pattern, head_dim ≠ d/H, MQA,
tied; Seed-OSS with FFN biases (mlp_bias), without q/k/v biases, o_proj's bias alone, a default head_dim, a
linear RoPE scaling; Hunyuan without an NTK alpha and with another one, head_dim 16, without biases, MQA; Apertus
with other xIELU β and ε per layer, with attention biases, with its default llama3 RoPE, with another activation.

Each case builds a seeded, perturbed model, saves it, loads it with qkv and compares a right- and a left-padded batch
(hidden states and logits within 1e-4, attention weights within 1e-5), then greedy generation with and without the
KV cache token for token; and a model qkv saves is read back by transformers with the same logits.
Seed-OSS's and Hunyuan's GGUF files (llama.cpp's `seed_oss`, `hunyuan-dense`) against transformers on the directory.
"""

from __future__ import annotations

import copy

import pytest
import torch
from live_helpers import (INIT_RANGE, case_seed, check_decoder_live, check_decoder_saved_by_qkv, gguf_and_loaded,
                          saved_and_loaded)
from transformers import (ApertusConfig, ApertusForCausalLM, Exaone4Config, Exaone4ForCausalLM, HunYuanDenseV1Config,
                          HunYuanDenseV1ForCausalLM, SeedOssConfig, SeedOssForCausalLM)

pytestmark = pytest.mark.live

NEW = 8
COMMON = dict(max_position_embeddings=128, initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, attn_implementation="eager")


def exaone4(d=48, heads=4, kv=2, layers=4, ff=80, vocab=211, **kw):
    return Exaone4Config(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                         num_hidden_layers=layers, intermediate_size=ff, **COMMON, **kw)


def seed_oss(d=48, heads=4, kv=2, layers=2, ff=80, vocab=211, **kw):
    return SeedOssConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                         num_hidden_layers=layers, intermediate_size=ff, **COMMON, **kw)


def hunyuan(d=48, heads=4, kv=2, layers=2, ff=80, vocab=211, head_dim=12, **kw):
    return HunYuanDenseV1Config(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                                num_hidden_layers=layers, intermediate_size=ff, head_dim=head_dim, **COMMON, **kw)


def apertus(d=48, heads=4, kv=2, layers=3, ff=96, vocab=211, **kw):
    return ApertusConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                         num_hidden_layers=layers, intermediate_size=ff, **COMMON, **kw)


EXAONE4_CASES = [
    pytest.param(exaone4(sliding_window=4), id="exaone4-default-pattern4-window4-L4"),
    pytest.param(exaone4(d=32, layers=2, sliding_window=None, layer_types=["full_attention"] * 2,
                         tie_word_embeddings=True), id="exaone4-no-window-all-rope-tied"),
    pytest.param(exaone4(layers=3, kv=1, head_dim=16, sliding_window=6, sliding_window_pattern=3,
                         rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 3e4}),
                 id="exaone4-pattern3-mqa-dk16-linear"),
]
SEED_OSS_CASES = [
    pytest.param(seed_oss(head_dim=16, mlp_bias=True, attention_out_bias=True), id="seed_oss-mlp_bias-out_bias"),
    pytest.param(seed_oss(d=32, kv=1, head_dim=None, attention_bias=False, attention_out_bias=True,
                          tie_word_embeddings=True, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                     "rope_theta": 2e4}),
                 id="seed_oss-out_bias-only-mqa-tied-linear"),
]
HUNYUAN_CASES = [
    pytest.param(hunyuan(attention_bias=False), id="hunyuan-no-alpha-no-bias"),
    pytest.param(hunyuan(d=64, heads=4, kv=1, head_dim=16, attention_bias=True,
                         rope_parameters={"rope_type": "dynamic", "alpha": 50.0, "factor": 1.0, "rope_theta": 5e3}),
                 id="hunyuan-alpha50-dk16-mqa-bias"),
]
APERTUS_CASES = [
    pytest.param(apertus(rope_parameters={"rope_type": "default", "rope_theta": 1e4}), id="apertus-xielu-default-rope"),
    pytest.param(apertus(layers=2, kv=1, attention_bias=True, tie_word_embeddings=True),
                 id="apertus-xielu-llama3-default-bias-tied"),
    pytest.param(apertus(layers=2, hidden_act="silu", rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
                 id="apertus-silu-ungated"),
]


def _fresh(config):
    """CONFIG copied with a torch dtype: save_pretrained leaves the string "float32" on the config it saved, which
    Apertus's XIELUActivation cannot be built with (the cases' configs are shared between tests)."""
    config = copy.deepcopy(config)
    config.dtype = torch.float32
    return config


def _check(cls, config, tmp_path, request, setup=None):
    model, ours = saved_and_loaded(cls, _fresh(config), tmp_path, case_seed(request), setup)
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)
    return ours


@pytest.mark.parametrize("config", EXAONE4_CASES)
def test_exaone4(config, tmp_path, request):
    ours = _check(Exaone4ForCausalLM, config, tmp_path, request)
    types = config.layer_types
    assert [ours.config.window(i) is not None for i in range(config.num_hidden_layers)] == [
        t == "sliding_attention" for t in types]
    nope = [] if config.sliding_window is None else [i for i, t in enumerate(types) if t == "full_attention"]
    assert list(ours.config.no_rope_layers) == nope


@pytest.mark.parametrize("config", SEED_OSS_CASES)
def test_seed_oss(config, tmp_path, request):
    ours = _check(SeedOssForCausalLM, config, tmp_path, request)
    assert (ours.config.qkv_bias, ours.config.out_bias, ours.config.ffn_bias) == (
        config.attention_bias, config.attention_out_bias, config.mlp_bias)


@pytest.mark.parametrize("config", HUNYUAN_CASES)
def test_hunyuan(config, tmp_path, request):
    ours = _check(HunYuanDenseV1ForCausalLM, config, tmp_path, request)
    assert ours.config.qk_norm_after_rope and ours.config.d_head == config.head_dim


def _other_xielu_constants(model) -> None:
    """Each layer's β and ε away from XIELUActivation's 0.5 and −1e-6 (buffers: `build` leaves them)."""
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            layer.mlp.act_fn.beta.fill_(0.3 + 0.1 * i)
            layer.mlp.act_fn.eps.fill_(-0.05 * (i + 1))


@pytest.mark.parametrize("config", APERTUS_CASES)
def test_apertus(config, tmp_path, request):
    xielu = config.hidden_act == "xielu"
    ours = _check(ApertusForCausalLM, config, tmp_path, request, _other_xielu_constants if xielu else None)
    assert ours.config.activation == ("xielu" if xielu else "silu") and not ours.config.gated_ffn
    if xielu:
        assert float(ours.weights.blocks[1].ffn.xielu.beta) == pytest.approx(0.4)


@pytest.mark.parametrize("cls, config", [
    pytest.param(Exaone4ForCausalLM, EXAONE4_CASES[2].values[0], id="exaone4"),
    pytest.param(SeedOssForCausalLM, SEED_OSS_CASES[0].values[0], id="seed_oss"),
    pytest.param(HunYuanDenseV1ForCausalLM, HUNYUAN_CASES[1].values[0], id="hunyuan"),
    pytest.param(ApertusForCausalLM, APERTUS_CASES[1].values[0], id="apertus")])
def test_a_model_qkv_saves_reads_back_in_transformers(cls, config, tmp_path):
    setup = _other_xielu_constants if cls is ApertusForCausalLM else None
    check_decoder_saved_by_qkv(cls, _fresh(config), tmp_path, setup,
                               dtype=torch.float32)                      # (Apertus's xIELU needs a torch dtype)


GGUF_VOCAB = 300                           # gguf_convert writes a tokenizer of 260 ids: the vocabulary holds them


@pytest.mark.parametrize("config", [pytest.param(seed_oss(vocab=GGUF_VOCAB, head_dim=16), id="seed_oss-gqa-dk16"),
                                    pytest.param(seed_oss(d=32, kv=1, layers=3, vocab=GGUF_VOCAB,
                                                          tie_word_embeddings=True,
                                                          rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
                                                 id="seed_oss-mqa-tied-theta5e5-L3")])
def test_seed_oss_gguf_equals_transformers(config, tmp_path, request):
    """llama.cpp's `seed_oss` file (tests/fixtures/gguf_convert.py: tensors as stored) gives transformers' numbers
    on the directory, and its greedy ids with and without the KV cache."""
    model, ours = gguf_and_loaded(SeedOssForCausalLM, config, tmp_path, case_seed(request))
    assert ours.config.family == "seed_oss" and ours.config.qkv_bias and not ours.config.out_bias
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


@pytest.mark.parametrize("config", [
    pytest.param(hunyuan(vocab=GGUF_VOCAB, rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                                                            "rope_theta": 1e4}), id="hunyuan-alpha1000-gqa"),
    pytest.param(hunyuan(d=32, kv=1, head_dim=8, layers=3, vocab=GGUF_VOCAB, tie_word_embeddings=True),
                 id="hunyuan-no-alpha-mqa-tied-L3")])
def test_hunyuan_gguf_equals_transformers(config, tmp_path, request):
    """llama.cpp's `hunyuan-dense` file (tests/fixtures/gguf_convert.py: tensors as stored, the NTK alpha folded
    into rope.freq_base) gives transformers' numbers on the directory, and its greedy ids with and without the cache."""
    model, ours = gguf_and_loaded(HunYuanDenseV1ForCausalLM, config, tmp_path, case_seed(request))
    assert ours.config.family == "hunyuan_v1_dense" and ours.config.qk_norm_after_rope
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)
