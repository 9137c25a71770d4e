"""DeepSeek V2 and V3 (issue 47) against live transformers, on random checkpoints of other knob values than the
committed fixtures: q through a latent or not (q_lora_rank null), other latent, nope, rope and value widths, RoPE
by pairs in place (V2), de-interleaved (V3's rope_interleave) or by halves, YaRN with DeepSeek's own mscale /
mscale_all_dim (1 and 1: only the score scale moves; 0.707 and 0.707; mscale alone: only cos and sin), linear RoPE,
attention biases, tied embeddings; the MoE: V3's sigmoid scores with a choice bias (drawn, as the buffer starts at 0)
in 1 to 4 groups, renormalised or not, scaled; V2's softmax top-k (greedy) and group-limited greedy; dense only
(first_k_dense_replace ≥ the layers).

Each case builds a seeded, perturbed model, saves it, loads it with qkv and compares a right- and a left-padded batch
(hidden states and logits within 1e-4, attention weights within 1e-5), then greedy generation with and without the
KV cache token for token; and a model qkv saves is read back by transformers with the same logits.
"""

from __future__ import annotations

import pytest
import torch
from live_helpers import INIT_RANGE, case_seed, check_decoder_live, check_decoder_saved_by_qkv, saved_and_loaded
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

pytestmark = pytest.mark.live

NEW = 8


def common(d=48, heads=4, layers=3, ff=64, vocab=211, tied=False, **kw) -> dict:
    return dict(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=heads,
                num_hidden_layers=layers, intermediate_size=ff, max_position_embeddings=128, tie_word_embeddings=tied,
                initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                attn_implementation="eager", **kw)


def yarn(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None, theta: float = 1e4) -> dict:
    rope = {"rope_type": "yarn", "rope_theta": theta, "factor": factor, "original_max_position_embeddings": 32}
    return rope | {k: v for k, v in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)) if v is not None}


V3_CASES = [
    pytest.param(DeepseekV3Config(kv_lora_rank=12, q_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                                  v_head_dim=8, attention_bias=True, rope_parameters=yarn(8.0, 1.0, 1.0),
                                  moe_intermediate_size=12, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                                  topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, first_k_dense_replace=1,
                                  **common()),
                 id="v3-qlora-yarn-mscale1-bias-8experts-4groups"),
    pytest.param(DeepseekV3Config(kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=4,
                                  v_head_dim=24, rope_interleave=False, first_k_dense_replace=5,
                                  rope_parameters={"rope_type": "default", "rope_theta": 5e4},
                                  **common(layers=2, tied=True)),
                 id="v3-no-qlora-halves-dense-tied-v24"),
    pytest.param(DeepseekV3Config(kv_lora_rank=20, q_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=12,
                                  v_head_dim=6, rope_parameters=yarn(4.0, 0.707), moe_intermediate_size=16,
                                  n_routed_experts=4, num_experts_per_tok=3, n_group=1, topk_group=1,
                                  n_shared_experts=2, norm_topk_prob=False, routed_scaling_factor=1.0,
                                  first_k_dense_replace=0, **common(d=32, heads=2, layers=2)),
                 id="v3-mscale-only-one-group-not-renormalised"),
]

V2_CASES = [
    pytest.param(DeepseekV2Config(kv_lora_rank=16, q_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=8,
                                  v_head_dim=12, attention_bias=True, rope_parameters=yarn(4.0, 0.707, 0.707),
                                  moe_intermediate_size=16, n_routed_experts=6, num_experts_per_tok=2,
                                  n_shared_experts=2, topk_method="greedy", routed_scaling_factor=1.0,
                                  first_k_dense_replace=1, **common()),
                 id="v2-qlora-yarn-mscale0.707-bias-greedy"),
    pytest.param(DeepseekV2Config(kv_lora_rank=12, q_lora_rank=None, qk_nope_head_dim=12, qk_rope_head_dim=4,
                                  v_head_dim=8, rope_parameters={"rope_type": "default", "rope_theta": 2e4},
                                  moe_intermediate_size=12, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                                  topk_group=2, n_shared_experts=1, topk_method="group_limited_greedy",
                                  routed_scaling_factor=16.0, first_k_dense_replace=0, **common(layers=2)),
                 id="v2-group-limited-greedy-scaled16"),
    pytest.param(DeepseekV2Config(kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8,
                                  v_head_dim=16, first_k_dense_replace=2,
                                  rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
                                  **common(layers=2, tied=True)),
                 id="v2-dense-linear-tied"),
]


def choice_biases_(model: torch.nn.Module, std: float = 0.3) -> None:
    """V3's e_score_correction_bias (a buffer at 0, which the noise skips) drawn from N(0, STD²): it then changes
    which experts are chosen, as a trained model's does."""
    gen = torch.Generator().manual_seed(4711)
    with torch.no_grad():
        for layer in model.model.layers:
            bias = getattr(getattr(layer.mlp, "gate", None), "e_score_correction_bias", None)
            if bias is not None:
                bias.copy_(torch.randn(bias.shape, generator=gen) * std)


@pytest.mark.parametrize("config", V3_CASES)
def test_v3(config, tmp_path, request):
    model, ours = saved_and_loaded(DeepseekV3ForCausalLM, config, tmp_path, case_seed(request), choice_biases_)
    cfg = ours.config
    assert (cfg.kv_lora_rank, cfg.q_lora_rank or None, cfg.rotary_dim, cfg.d_value) == (
        config.kv_lora_rank, config.q_lora_rank, config.qk_rope_head_dim, config.v_head_dim)
    assert cfg.rope_deinterleave == config.rope_interleave and cfg.n_experts == (
        0 if config.first_k_dense_replace >= config.num_hidden_layers else config.n_routed_experts)
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


@pytest.mark.parametrize("config", V2_CASES)
def test_v2(config, tmp_path, request):
    model, ours = saved_and_loaded(DeepseekV2ForCausalLM, config, tmp_path, case_seed(request))
    assert ours.config.rope_interleaved and ours.config.q_lora_rank == (config.q_lora_rank or 0)
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)


@pytest.mark.parametrize("cls, config", [pytest.param(DeepseekV3ForCausalLM, V3_CASES[0].values[0], id="v3"),
                                         pytest.param(DeepseekV2ForCausalLM, V2_CASES[1].values[0], id="v2")])
def test_a_model_qkv_saves_reads_back_in_transformers(cls, config, tmp_path):
    check_decoder_saved_by_qkv(cls, config, tmp_path, choice_biases_)
