"""GGUF files of the models of 2025–26 (ernie4_5-moe, dots1, exaone4, deepseek2, gpt-oss, mamba, nomic-bert) against
live transformers (make test-live).

Random checkpoints of knob values the committed fixtures do not have (routed layers every other one from layer 0,
no shared expert; dots1 without groups or window and unnormalised; EXAONE 4's sliding pattern 4; DeepSeek-V2 with
q's latent, V3 with groups and without q's latent; gpt-oss with llama.cpp's clamp and truncated YaRN, or plain RoPE;
Mamba of another width; nomic-bert of other sizes, base and layers) are built with transformers, saved, written as
llama.cpp's convert_hf_to_gguf.py lays them out (tests/fixtures/gguf_convert.py), and qkv.load(file.gguf) is
compared with transformers on the directory: a right- and a left-padded batch (hidden states and logits 1e-4,
attention weights 1e-5), greedy ids with and without the KV cache. Mamba's file is read by transformers' own GGUF
loader too: the same logits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from live_helpers import (INIT_RANGE, build, case_seed, check_decoder_live, check_encoder_live, gguf_and_loaded,
                          hf_greedy, padded_batch, save)
from transformers import (AutoModelForCausalLM, DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config,
                          DeepseekV3ForCausalLM, Dots1Config, Dots1ForCausalLM, Ernie4_5_MoeConfig,
                          Ernie4_5_MoeForCausalLM, Exaone4Config, Exaone4ForCausalLM, GptOssConfig, GptOssForCausalLM,
                          MambaConfig, MambaForCausalLM, NomicBertConfig, NomicBertModel)

import qkv

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
import gguf_convert as C  # noqa: E402

pytestmark = pytest.mark.live

NEW = 8
V = 300                                     # gguf_convert writes a tokenizer of 260 ids: the vocabulary holds them
COMMON = dict(vocab_size=V, max_position_embeddings=128, initializer_range=INIT_RANGE, pad_token_id=0,
              bos_token_id=1, eos_token_id=2, attn_implementation="eager")
PLAIN = {"rope_type": "default", "rope_theta": 2e4}

CASES = [
    pytest.param(Ernie4_5_MoeForCausalLM, Ernie4_5_MoeConfig(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_hidden_layers=4,
        intermediate_size=40, moe_intermediate_size=16, moe_num_experts=6, moe_k=3, moe_num_shared_experts=0,
        moe_layer_start_index=0, moe_layer_end_index=-1, moe_layer_interval=2, use_bias=False,
        tie_word_embeddings=True, rope_parameters=PLAIN, **COMMON), id="ernie-moe-every-2nd-no-shared-tied"),
    pytest.param(Dots1ForCausalLM, Dots1Config(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=1, head_dim=16, num_hidden_layers=3,
        intermediate_size=40, moe_intermediate_size=16, n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=2,
        n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.5, first_k_dense_replace=2,
        sliding_window=None, attention_bias=False, rope_parameters=PLAIN, **COMMON), id="dots1-mqa-2-dense-unnormed"),
    pytest.param(Exaone4ForCausalLM, Exaone4Config(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4, intermediate_size=80,
        sliding_window=4, sliding_window_pattern=4, rope_parameters=PLAIN, **COMMON), id="exaone4-pattern4-window4"),
    pytest.param(DeepseekV2ForCausalLM, DeepseekV2Config(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=3, intermediate_size=64,
        kv_lora_rank=16, q_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12,
        moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2,
        routed_scaling_factor=2.0, first_k_dense_replace=1, topk_method="greedy", rope_parameters=PLAIN, **COMMON),
        id="deepseek-v2-qlora-2-shared"),
    pytest.param(DeepseekV3ForCausalLM, DeepseekV3Config(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=3, intermediate_size=64,
        kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=4, v_head_dim=24,
        moe_intermediate_size=12, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        n_shared_experts=1, norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=1,
        rope_parameters=PLAIN, **COMMON), id="deepseek-v3-no-qlora-4-groups"),
    pytest.param(GptOssForCausalLM, GptOssConfig(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_hidden_layers=3,
        intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, sliding_window=4, swiglu_limit=7.0,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": True, "rope_theta": 1e4}, **COMMON),
        id="gpt-oss-yarn-truncated-window4"),
    pytest.param(GptOssForCausalLM, GptOssConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=24, num_hidden_layers=2,
        intermediate_size=16, num_local_experts=8, num_experts_per_tok=3, sliding_window=2, swiglu_limit=7.0,
        tie_word_embeddings=True, rope_parameters=PLAIN, **COMMON), id="gpt-oss-mqa-dk24-E8-k3-plain-tied"),
]


def _choice_biases_(model: torch.nn.Module) -> None:
    """Routers' choice biases (DeepSeek-V3's, dots1's, Ernie's) away from their zero initialisation, so the choice
    differs from the weights (seeded)."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_buffers():
            if "e_score_correction_bias" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


@pytest.mark.parametrize("cls, config", CASES)
def test_gguf_equals_transformers(cls, config, tmp_path, request):
    """The file of transformers' seeded model gives transformers' numbers on the directory, and its greedy ids."""
    seed = case_seed(request)
    model = build(cls, config, seed=seed)
    _choice_biases_(model)
    save(model, tmp_path / "hf")
    ours = qkv.load(C.convert(tmp_path / "hf", tmp_path / "model.gguf"))
    assert ours.config.family == config.model_type
    check_decoder_live(model, ours, V, request.node.callspec.id, NEW)


@pytest.mark.parametrize("d, expand, state, rank, conv", [(48, 2, 4, 5, 3), (32, 3, 16, 2, 4)])
def test_mamba_gguf_equals_transformers_and_its_gguf_loader(d, expand, state, rank, conv, tmp_path):
    """A Mamba of other sizes: qkv's reading of its file equals transformers on the directory (right- and left-padded
    batches' logits at the real positions, greedy ids with and without the cache), and transformers' own GGUF loader
    (`from_pretrained(dir, gguf_file=…)`) reads the same file to the same logits (1e-4): the file is laid out as
    transformers expects llama.cpp's."""
    config = MambaConfig(vocab_size=V, hidden_size=d, num_hidden_layers=2, expand=expand, state_size=state,
                         time_step_rank=rank, conv_kernel=conv, initializer_range=INIT_RANGE, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2)
    model, ours = gguf_and_loaded(MambaForCausalLM, config, tmp_path, seed=5)
    for side in ("right", "left"):                                   # logits at the real positions
        ids, mask = padded_batch(V, [11, 7, 9], seed=6, side=side)
        with torch.no_grad():
            ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), use_cache=False)
        real = mask.astype(bool)
        assert np.abs(ours.forward(ids, mask).logits - ref.logits.numpy())[real].max() <= 1e-4, side
    prompt = padded_batch(V, [9], seed=7)[0]
    want = hf_greedy(model, prompt, NEW)
    assert np.array_equal(ours.generate(prompt, NEW, temperature=0, stop_at_eos=False), want)
    assert np.array_equal(ours.generate(prompt, NEW, temperature=0, stop_at_eos=False, use_cache=False), want)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf").eval()
    ids = np.arange(3, 20)[None]
    with torch.no_grad():
        logits = theirs(torch.tensor(ids)).logits.numpy()
    assert np.abs(logits - ours.forward(ids).logits).max() <= 1e-4


@pytest.mark.parametrize("d, heads, head_dim, layers, ff, theta", [(48, 4, 12, 3, 40, 1e4), (32, 2, 16, 2, 64, 1e3)])
def test_nomic_bert_gguf_equals_transformers(d, heads, head_dim, layers, ff, theta, tmp_path):
    """A NomicBertModel of other sizes (with the fixture's WordPiece tokenizer): qkv's reading of its llama.cpp file
    gives transformers' hidden states and attention weights on right- and left-padded batches with token types."""
    import shutil

    config = NomicBertConfig(vocab_size=290, hidden_size=d, num_attention_heads=heads, head_dim=head_dim,
                             num_hidden_layers=layers, intermediate_size=ff, hidden_act="silu", type_vocab_size=2,
                             max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": theta},
                             initializer_range=INIT_RANGE, pad_token_id=0, attn_implementation="eager")
    model = build(NomicBertModel, config, seed=9)
    save(model, tmp_path / "hf")
    shutil.copy(Path(__file__).parents[1] / "fixtures" / "models" / "nomic_bert" / "tokenizer.json", tmp_path / "hf")
    ours = qkv.load(C.convert(tmp_path / "hf", tmp_path / "model.gguf"))
    assert ours.config.family == "nomic_bert" and not ours.config.lm_head
    check_encoder_live(model, ours, config, [("right", [11, 7, 9]), ("left", [11, 6, 9])], f"nomic-{d}", pad_id=0)
