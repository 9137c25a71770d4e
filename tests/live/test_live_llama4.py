"""Llama 4's text model (issue 47) against live transformers, on random checkpoints of other knob values than the
committed fixture: Llama4TextConfig's own layer pattern (a NoPE layer every 4th, the RoPE layers chunked, MoE every
other layer) or explicit lists (no_rope_layers, moe_layers, layer_types chunking a NoPE layer too), chunks of 3 to
5 or none (attention_chunk_size null), temperature tuning that bites (floor_scale 3) or not, use_qk_norm on and off,
1 to 4 experts with top-1 or top-2, q/k/v/o biases, MHA / GQA / MQA, head_dim ≠ d/H, llama3 or no RoPE scaling,
silu or gelu, tied or untied; and a text-and-image checkpoint (Llama4ForConditionalGeneration) run as its text model.

Each case builds a seeded, perturbed model, saves it, loads it with qkv and compares a right-padded batch (hidden
states and logits within 1e-4, attention weights within 1e-5), a left-padded one where the temperature is 1 at
every position (transformers counts the temperature's position over the padding, qkv over the real tokens: equal
then), greedy generation with and without the KV cache token for token (past several chunks), the router's choice
against transformers' router logits, a model qkv saves read back by transformers with equal logits, and every
gradient (the fused experts', the router's, the shared expert's) against torch autograd.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import (INIT_RANGE, build, case_seed, check_decoder_gradients, check_saved_by_qkv_on, compare,
                          decoder_positions, hf_greedy, max_abs, padded_batch, run_reference, save)
from test_live_grads import autograd
from transformers import Llama4Config, Llama4ForCausalLM, Llama4ForConditionalGeneration, Llama4TextConfig

import qkv

pytestmark = pytest.mark.live

NEW = 10
LLAMA3 = {"rope_type": "llama3", "rope_theta": 1e4, "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0,
          "original_max_position_embeddings": 16}


def llama4(d=48, heads=4, kv=2, layers=4, f=16, f_mlp=40, E=4, k=2, vocab=211, rope=None, **kw):
    return Llama4TextConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                            head_dim=kw.pop("head_dim", d // heads), num_hidden_layers=layers, intermediate_size=f,
                            intermediate_size_mlp=f_mlp, num_local_experts=E, num_experts_per_tok=k,
                            max_position_embeddings=128, initializer_range=INIT_RANGE,
                            rope_parameters=rope or {"rope_type": "default", "rope_theta": 1e4},
                            pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager", **kw)


CASES = [
    pytest.param(llama4(interleave_moe_layer_step=2, attention_chunk_size=4, floor_scale=3, attn_scale=0.5,
                        rope=LLAMA3), id="default-pattern-chunk4-floor3-llama3-step2"),
    pytest.param(llama4(kv=4, layers=3, E=2, k=1, attention_bias=True, use_qk_norm=False, attention_chunk_size=3,
                        floor_scale=64, no_rope_layers=[1, 0, 1]), id="mha-bias-no-qk-norm-chunk3-E2-k1"),
    pytest.param(llama4(layers=3, attention_chunk_size=None, attn_temperature_tuning=False, tie_word_embeddings=True,
                        hidden_act="gelu", no_rope_layers=[0, 1, 0], moe_layers=[0], floor_scale=64),
                 id="no-chunks-no-tuning-tied-gelu-moe0"),
    pytest.param(llama4(d=64, kv=1, head_dim=16, layers=3, E=3, k=2, attention_chunk_size=5, floor_scale=64,
                        no_rope_layers=[1, 0, 1], layer_types=["chunked_attention"] * 3, moe_layers=[1, 2],
                        rms_norm_eps=1e-6),
                 id="mqa-dk16-every-layer-chunked5-E3"),
]


def hf_router(model, ids: np.ndarray) -> list[np.ndarray]:
    """transformers' router logits per MoE layer (n, E) on one sequence, whose top-k it takes."""
    with torch.no_grad():
        out = model(torch.from_numpy(ids), output_router_logits=True)
    return [r.float().numpy() for r in out.router_logits]


def check_padded_and_greedy(model, ours, config, label: str) -> None:
    """A right-padded batch (and a left-padded one where every temperature is 1) against transformers, then greedy
    writing with and without the cache, token for token."""
    sides = [("right", [11, 7, 9])] + ([("left", [11, 6, 9])] if config.floor_scale > 16 else [])
    for side, lengths in sides:
        ids, mask = padded_batch(config.vocab_size, lengths, seed=11, low=3, side=side)
        compare(ours.forward(ids, mask), run_reference(model, ids, mask, position_ids=decoder_positions(mask)), mask,
                label=f"{label}-{side}")
    prompt = padded_batch(config.vocab_size, [9], seed=12, low=3)[0]
    expected = hf_greedy(model, prompt, NEW)
    np.testing.assert_array_equal(ours.generate(prompt, NEW, temperature=0, stop_at_eos=False), expected)
    np.testing.assert_array_equal(ours.generate(prompt, NEW, temperature=0, use_cache=False, stop_at_eos=False),
                                  expected)


@pytest.mark.parametrize("config", CASES)
def test_llama4_text(config, tmp_path, request):
    label = request.node.callspec.id
    model = build(Llama4ForCausalLM, config, seed=case_seed(request))
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    cfg = ours.config
    L = config.num_hidden_layers
    assert [i for i in range(L) if cfg.chunk(i) is not None] == [i for i, t in enumerate(config.layer_types)
                                                                 if t == "chunked_attention"]
    assert [cfg.moe_layer(i) for i in range(L)] == [i in config.moe_layers for i in range(L)]
    assert cfg.no_rope_layers == tuple(i for i in range(L) if not config.no_rope_layers[i])
    check_padded_and_greedy(model, ours, config, label)
    prompt = padded_batch(config.vocab_size, [9], seed=12, low=3)[0]
    trace = ours.run(prompt[0], keep=("router", "experts", "expert_weights"))
    for layer, logits in zip(config.moe_layers, hf_router(model, prompt)):
        top = np.argsort(-logits, -1, kind="stable")[:, :config.num_experts_per_tok]
        assert np.array_equal(np.sort(trace.layer(layer).experts, -1), np.sort(top, -1)), layer
        w = 1 / (1 + np.exp(-np.take_along_axis(logits, top, -1)))                     # σ of the top logits
        assert max_abs(np.sort(trace.layer(layer).expert_weights, -1), np.sort(w, -1)) < 1e-5
    check_saved_by_qkv_on(Llama4ForCausalLM, model, ours, prompt, tmp_path / "qkv")   # a model qkv saves, read back
    check_decoder_gradients(model, ours, autograd)


def test_a_text_and_image_checkpoint_runs_as_its_text_model(tmp_path):
    """Llama4ForConditionalGeneration (model_type llama4) on text alone: qkv's logits equal transformers' (1e-4)."""
    text = llama4(layers=2, interleave_moe_layer_step=2, attention_chunk_size=4, floor_scale=3).to_dict()
    vision = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32,
              "vision_output_dim": 32, "image_size": 28, "patch_size": 14, "projector_input_dim": 32,
              "projector_output_dim": 32}
    config = Llama4Config(text_config=text, vision_config=vision, image_token_index=200, boi_token_index=201,
                          eoi_token_index=202)
    model = build(Llama4ForConditionalGeneration, config, seed=4711)
    save(model, tmp_path / "hf")
    ids = padded_batch(211, [13], seed=12, low=3)[0]
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert max_abs(qkv.load(tmp_path / "hf").forward(ids).logits, ref) < 1e-4
