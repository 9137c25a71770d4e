"""GGUF files of every new architecture against live transformers (make test-live).

Random checkpoints of other knob values (Granite's multipliers; Phi-3's without LongRoPE and its sliding
window, which llama.cpp does not run; Cohere's without attention biases, which llama.cpp's command-r lacks;
Gemma 2's with query_pre_attn_scalar = head_dim, as llama.cpp scales; StarCoder2's and Mixtral's without a
sliding window, which llama.cpp's file cannot hold; the mixtures with every layer routed, the top-k
renormalisation llama.cpp's graph fixes per arch and OLMoE's eps 1e-5, the only one its converter writes)
are built with transformers, saved, and written as a GGUF file the way llama.cpp's convert_hf_to_gguf.py
lays it out (tests/fixtures/gguf_convert.py). qkv.load(file.gguf) is compared with transformers on the
Hugging Face model: a right- and a left-padded batch (hidden states and logits within 1e-4, attention
weights within 1e-5), greedy generation with and without the KV cache token for token, and the model qkv
saves from the GGUF file (`model.save(dir)`) read back by transformers with equal logits. Where
transformers reads the arch from GGUF itself (qwen3, gpt2: `from_pretrained(dir, gguf_file=…)`), quantised
files are compared with its loader too: identical weights, name by name, and equal outputs.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from live_helpers import INIT_RANGE, build, compare, decoder_positions, max_abs, padded_batch, run_reference, save
from safetensors.numpy import load_file
from transformers import (AutoModelForCausalLM, BloomConfig, BloomForCausalLM, CohereConfig, CohereForCausalLM,
                          FalconConfig, FalconForCausalLM, Gemma2Config, Gemma2ForCausalLM, GemmaConfig,
                          GemmaForCausalLM, GPT2Config, GPT2LMHeadModel, GraniteConfig, GraniteForCausalLM,
                          GPTNeoXConfig, GPTNeoXForCausalLM, MixtralConfig, MixtralForCausalLM, MptConfig,
                          MptForCausalLM, Olmo2Config, Olmo2ForCausalLM, OlmoeConfig, OlmoeForCausalLM, Phi3Config,
                          Phi3ForCausalLM, PhiConfig, PhiForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM, StableLmConfig,
                          StableLmForCausalLM, Starcoder2Config, Starcoder2ForCausalLM)

import qkv
from qkv.checkpoints import gguf_cache

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
import gguf_convert as C  # noqa: E402

pytestmark = pytest.mark.live

NEW = 8
V = 300
IDS = dict(vocab_size=V, initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1, eos_token_id=2,
           attn_implementation="eager")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


def qwen3(d=64, heads=4, kv=2, head_dim=None, ff=96, theta=1e6, bias=False, tied=False, layers=2):
    return Qwen3ForCausalLM, Qwen3Config(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                                         head_dim=head_dim or d // heads, intermediate_size=ff, rope_theta=theta,
                                         attention_bias=bias, tie_word_embeddings=tied, num_hidden_layers=layers,
                                         rms_norm_eps=1e-6, max_position_embeddings=128, **IDS)


def gemma(d=64, heads=4, kv=1, head_dim=32, ff=96, layers=2, eps=1e-6):
    return GemmaForCausalLM, GemmaConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                                         head_dim=head_dim, intermediate_size=ff, num_hidden_layers=layers,
                                         hidden_act="gelu_pytorch_tanh", rms_norm_eps=eps, max_position_embeddings=128,
                                         **IDS)


def olmo2(d=64, heads=4, kv=2, ff=96, theta=5e4, tied=False, layers=2):
    return Olmo2ForCausalLM, Olmo2Config(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                                         intermediate_size=ff, rope_theta=theta, tie_word_embeddings=tied,
                                         num_hidden_layers=layers, rms_norm_eps=1e-6, max_position_embeddings=128,
                                         **IDS)


def phi2(d=64, heads=4, factor=0.4, tied=False, layers=2):
    return PhiForCausalLM, PhiConfig(hidden_size=d, num_attention_heads=heads, intermediate_size=4 * d,
                                     hidden_act="gelu_new", tie_word_embeddings=tied, num_hidden_layers=layers,
                                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": factor},
                                     max_position_embeddings=128, **IDS)


def neox(d=64, heads=4, factor=0.25, parallel=True, bias=True, tied=False, layers=2, ff=128):
    return GPTNeoXForCausalLM, GPTNeoXConfig(
        hidden_size=d, num_attention_heads=heads, intermediate_size=ff, hidden_act="gelu", num_hidden_layers=layers,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": factor},
        use_parallel_residual=parallel, attention_bias=bias, tie_word_embeddings=tied, max_position_embeddings=128,
        **IDS)


def gpt2(d=64, heads=4, layers=2, eps=1e-5, positions=128):
    return GPT2LMHeadModel, GPT2Config(n_embd=d, n_head=heads, n_layer=layers, n_positions=positions,
                                       layer_norm_epsilon=eps, **IDS)


def starcoder2(d=64, heads=4, kv=1, ff=96, bias=True, tied=True, theta=1e5, layers=2):
    return Starcoder2ForCausalLM, Starcoder2Config(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                                                   intermediate_size=ff, use_bias=bias, tie_word_embeddings=tied,
                                                   rope_theta=theta, num_hidden_layers=layers, norm_epsilon=1e-5,
                                                   hidden_act="gelu_pytorch_tanh", sliding_window=None,
                                                   max_position_embeddings=128, **IDS)


def stablelm(d=64, heads=4, kv=2, ff=96, factor=0.25, parallel=False, qk=False, bias=False, tied=False, layers=2):
    return StableLmForCausalLM, StableLmConfig(
        hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=ff,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": factor},
        use_parallel_residual=parallel, qk_layernorm=qk, use_qkv_bias=bias, tie_word_embeddings=tied,
        num_hidden_layers=layers, max_position_embeddings=128, **IDS)


def granite(d=64, heads=4, kv=2, ff=96, emb=12.0, res=0.22, attn=0.015625, logits=8.0, tied=True, layers=2):
    return GraniteForCausalLM, GraniteConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                                             intermediate_size=ff, embedding_multiplier=emb, residual_multiplier=res,
                                             attention_multiplier=attn, logits_scaling=logits,
                                             tie_word_embeddings=tied, num_hidden_layers=layers, rms_norm_eps=1e-6,
                                             rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                                             max_position_embeddings=128, **IDS)


def phi3(d=64, heads=4, kv=2, ff=96, factor=1.0, theta=1e4, tied=False, layers=2):
    return Phi3ForCausalLM, Phi3Config(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                                       intermediate_size=ff, tie_word_embeddings=tied, num_hidden_layers=layers,
                                       rope_parameters={"rope_type": "default", "rope_theta": theta,
                                                        "partial_rotary_factor": factor},
                                       sliding_window=None, max_position_embeddings=128, **IDS)


def cohere(d=64, heads=4, kv=2, ff=96, qk=True, scale=0.25, theta=1e4, layers=2):
    return CohereForCausalLM, CohereConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                                           intermediate_size=ff, use_qk_norm=qk, logit_scale=scale,
                                           attention_bias=False, tie_word_embeddings=True, num_hidden_layers=layers,
                                           rope_parameters={"rope_type": "default", "rope_theta": theta},
                                           layer_norm_eps=1e-5, max_position_embeddings=128, **IDS)


def gemma2(d=64, heads=4, kv=2, head_dim=16, ff=96, window=4, caps=(50.0, 30.0), layers=3, tied=True):
    return Gemma2ForCausalLM, Gemma2Config(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                                           head_dim=head_dim, query_pre_attn_scalar=head_dim, intermediate_size=ff,
                                           sliding_window=window, attn_logit_softcapping=caps[0],
                                           final_logit_softcapping=caps[1], num_hidden_layers=layers,
                                           hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                                           tie_word_embeddings=tied, max_position_embeddings=128, **IDS)

def bloom(d=48, heads=4, layers=2, tied=True, eps=1e-5):
    return BloomForCausalLM, BloomConfig(hidden_size=d, n_head=heads, n_layer=layers, layer_norm_epsilon=eps,
                                         tie_word_embeddings=tied, **IDS)


def falcon(d=48, heads=4, kv=2, new=True, norms=2, tied=False, layers=2):
    return FalconForCausalLM, FalconConfig(hidden_size=d, num_attention_heads=heads, num_kv_heads=kv,
                                           new_decoder_architecture=new, multi_query=kv == 1, parallel_attn=True,
                                           num_ln_in_parallel_attn=norms, bias=False, alibi=False, activation="gelu",
                                           ffn_hidden_size=4 * d, tie_word_embeddings=tied, num_hidden_layers=layers,
                                           rope_theta=10000.0, max_position_embeddings=128, **IDS)


def mpt(d=48, heads=4, layers=2, tied=True):
    return MptForCausalLM, MptConfig(d_model=d, n_heads=heads, n_layers=layers, max_seq_len=128, no_bias=True,
                                     attn_config={"alibi": True, "alibi_bias_max": 8, "softmax_scale": None},
                                     layer_norm_epsilon=1e-5, tie_word_embeddings=tied, **IDS)


def mixtral(d=48, heads=4, kv=2, ff=24, experts=4, k=2, tied=False, theta=1e6, layers=2):
    return MixtralForCausalLM, MixtralConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                                             intermediate_size=ff, num_local_experts=experts, num_experts_per_tok=k,
                                             tie_word_embeddings=tied, rope_theta=theta, num_hidden_layers=layers,
                                             sliding_window=None, rms_norm_eps=1e-6, max_position_embeddings=128,
                                             **IDS)


def qwen3moe(d=48, heads=4, kv=2, head_dim=16, ff=16, experts=4, k=2, tied=False, layers=2):
    return Qwen3MoeForCausalLM, Qwen3MoeConfig(
        hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, intermediate_size=40,
        moe_intermediate_size=ff, num_experts=experts, num_experts_per_tok=k, norm_topk_prob=True,
        mlp_only_layers=[], decoder_sparse_step=1, attention_bias=False, tie_word_embeddings=tied,
        num_hidden_layers=layers, rms_norm_eps=1e-6, max_position_embeddings=128, **IDS)


def qwen2moe(d=48, heads=4, kv=2, ff=16, shared=32, experts=4, k=2, tied=False, layers=2):
    return Qwen2MoeForCausalLM, Qwen2MoeConfig(
        hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=40,
        moe_intermediate_size=ff, shared_expert_intermediate_size=shared, num_experts=experts,
        num_experts_per_tok=k, norm_topk_prob=False, mlp_only_layers=[], decoder_sparse_step=1,
        tie_word_embeddings=tied, num_hidden_layers=layers, rms_norm_eps=1e-6, max_position_embeddings=128, **IDS)


def olmoe(d=48, heads=4, kv=2, ff=16, experts=4, k=2, tied=False, layers=2):
    return OlmoeForCausalLM, OlmoeConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                                         intermediate_size=ff, num_experts=experts, num_experts_per_tok=k,
                                         norm_topk_prob=False, tie_word_embeddings=tied, num_hidden_layers=layers,
                                         rms_norm_eps=1e-5, max_position_embeddings=128, **IDS)


CASES = {
    "qwen3-gqa-head_dim24-bias": qwen3(head_dim=24, bias=True),
    "qwen3-mqa-tied-L3": qwen3(d=48, heads=4, kv=1, tied=True, layers=3, theta=1e4),
    "gemma-mqa-head_dim32": gemma(),
    "gemma-mha-head_dim16-L3": gemma(d=48, heads=3, kv=3, head_dim=16, layers=3, eps=1e-5),
    "olmo2-gqa": olmo2(),
    "olmo2-mha-tied-L1": olmo2(d=48, heads=6, kv=6, tied=True, layers=1, theta=1e4),
    "phi2-rot0.4": phi2(),
    "phi2-rot1.0-tied-h8": phi2(d=64, heads=8, factor=1.0, tied=True, layers=3),
    "pythia-parallel-rot0.25-bias": neox(),
    "neox-sequential-rot0.5-nobias-tied": neox(d=48, heads=3, factor=0.5, parallel=False, bias=False, tied=True,
                                               ff=80),
    "starcoder2-mqa-bias-tied": starcoder2(),
    "starcoder2-gqa-nobias-untied-L3": starcoder2(d=48, heads=6, kv=2, bias=False, tied=False, theta=1e4, layers=3),
    "stablelm-sequential-rot0.25-untied": stablelm(),
    "stablelm-parallel-qk_layernorm-bias-tied-rot0.5-L3": stablelm(d=48, heads=4, kv=4, factor=0.5, parallel=True,
                                                                   qk=True, bias=True, tied=True, layers=3),
    "granite-gqa-tied": granite(),
    "granite-mha-untied-L3": granite(d=48, heads=4, kv=4, emb=1.0, res=1.0, attn=0.3, logits=1.0, tied=False,
                                     layers=3),
    "phi3-gqa-untied": phi3(),
    "phi3-mha-rot0.5-tied-L3": phi3(d=48, heads=4, kv=4, factor=0.5, theta=5e4, tied=True, layers=3),
    "cohere-gqa-qk_norm": cohere(),
    "cohere-mha-L3": cohere(d=48, heads=4, kv=4, qk=False, scale=0.5, theta=5e4, layers=3),
    "gemma2-gqa-window4-caps": gemma2(),
    "gemma2-mqa-head_dim8-window3-tight-caps-L4": gemma2(d=48, heads=4, kv=1, head_dim=8, window=3, caps=(2.0, 1.5),
                                                           layers=4),
    "gpt2": gpt2(),
    "gpt2-h8-L3": gpt2(d=64, heads=8, layers=3, eps=1e-6),
    "bloom-h4-tied": bloom(),
    "bloom-h8-untied-L3": bloom(d=64, heads=8, layers=3, tied=False, eps=1e-6),
    "falcon-new-gqa-two_norms": falcon(),
    "falcon-7b-style-mqa-tied-L3": falcon(d=64, heads=4, kv=1, new=False, norms=None, tied=True, layers=3),
    "mpt-h4-tied": mpt(),
    "mpt-h6-untied-L3": mpt(d=48, heads=6, layers=3, tied=False),
    "mixtral-gqa-e4k2": mixtral(),
    "mixtral-mqa-e3k1-tied-L3": mixtral(d=32, heads=4, kv=1, experts=3, k=1, tied=True, theta=1e4, layers=3),
    "qwen3moe-gqa-e4k2": qwen3moe(),
    "qwen3moe-mha-head_dim24-e3k3-tied": qwen3moe(d=32, heads=2, kv=2, head_dim=24, experts=3, k=3, tied=True),
    "qwen2moe-gqa-e4k2-shared32": qwen2moe(),
    "qwen2moe-e3k1-shared8-tied-L3": qwen2moe(d=32, heads=2, kv=1, shared=8, experts=3, k=1, tied=True, layers=3),
    "olmoe-gqa-e4k2": olmoe(),
    "olmoe-mha-e3k1-tied-L3": olmoe(d=32, heads=4, kv=4, experts=3, k=1, tied=True, layers=3),
}


def hf_greedy(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model.generate(torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids)),
                              max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0).numpy()


@pytest.mark.parametrize("case", sorted(CASES))
def test_gguf_equals_transformers_on_the_directory(case, tmp_path):
    cls, config = CASES[case]
    model = build(cls, config, seed=zlib.crc32(case.encode()) % 10_000)
    save(model, tmp_path / "hf")
    path = C.convert(tmp_path / "hf", tmp_path / "model.gguf", fused=case.startswith("phi2-rot1.0"))
    ours = qkv.load(path)
    for side, lengths in (("right", [11, 7, 9]), ("left", [11, 6, 9])):
        ids, mask = padded_batch(V, lengths, seed=11, low=3, side=side)
        ref = run_reference(model, ids, mask, position_ids=decoder_positions(mask))
        compare(ours.forward(ids, mask), ref, mask, label=f"{case}-{side}")
    prompt = padded_batch(V, [9], seed=12, low=3)[0]
    theirs = hf_greedy(model, prompt)
    np.testing.assert_array_equal(ours.generate(prompt, NEW, temperature=0), theirs)
    np.testing.assert_array_equal(ours.generate(prompt, NEW, temperature=0, use_cache=False), theirs)
    ours.save(tmp_path / "qkv")                                       # a model qkv saves, read by transformers
    back = cls.from_pretrained(tmp_path / "qkv").eval()
    with torch.no_grad():
        a, b = model(torch.from_numpy(prompt)).logits.numpy(), back(torch.from_numpy(prompt)).logits.numpy()
    assert max_abs(a, b) <= 1e-4


# transformers' own GGUF loader reads qwen3 (only with head_dim 128, Qwen3Config's default, and no attention
# biases: it maps neither) and gpt2 (only with n_positions 1024, GPT2Config's default: it reads context_length as
# n_ctx).
# (Q4_K, Q6_K: random blocks of the right size, as make_gguf_fixtures.encode writes them: gguf cannot
# quantise K types in NumPy; both loaders read the same bytes.)
LOADER_CASES = [(c, q) for c in ("qwen3-gqa", "gpt2") for q in ("F32", "F16", "Q8_0", "Q4_0", "Q5_1", "Q4_K", "Q6_K")]


@pytest.mark.parametrize("case,qtype", LOADER_CASES, ids=[f"{c}-{q}" for c, q in LOADER_CASES])
def test_quantised_gguf_equals_transformers_gguf_loader(case, qtype, tmp_path):
    # K quants need rows of 256; transformers' defaults (above) where it reads no key
    cls, config = qwen3(d=256, heads=2, kv=1, ff=512) if case.startswith("qwen3") else gpt2(d=256, positions=1024)
    model = build(cls, config, seed=7)
    save(model, tmp_path / "hf")
    path = C.convert(tmp_path / "hf", tmp_path / f"{case}.gguf", qtype)
    ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model.").removeprefix("transformer."): v.numpy() for k, v in ref.state_dict().items()}
    for name, w in mine.items():
        assert np.array_equal(w, theirs[name]), (name, max_abs(w, theirs[name]))
    ours = qkv.load(path)
    ids, mask = padded_batch(V, [11, 7, 9], seed=11, low=3, side="left")
    compare(ours.forward(ids, mask), run_reference(ref, ids, mask, position_ids=decoder_positions(mask)), mask,
            label=f"{case}-{qtype}")
