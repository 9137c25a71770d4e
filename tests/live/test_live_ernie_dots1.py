"""Ernie 4.5 (dense and MoE) and dots1 (issue 47) against live transformers, on random checkpoints of other knob
values than the committed fixtures: Ernie with and without use_bias (every projection; the MoE's shared experts
and lm_head too), GQA/MHA/MQA, head_dim ≠ d/H, a linear RoPE scaling, tied or untied; Ernie MoE with routed layers
by other start / end / interval, no or several shared experts, top-1 or top-3 of 8, a moe_norm_min that holds the
denominator for some tokens; dots1 with one group or 2 of 4 or 1 of 2, norm_topk_prob or not, routed_scaling_factor
1 or 2, no or two dense layers, attention biases, sliding layers that cut, top-1, tied.

The choice biases (Ernie's moe_statics, dots1's e_score_correction_bias buffer, which the noise skips) are drawn
N(0, 0.2²) so that they move the choice. Each case: a right- and a left-padded batch (hidden states and logits
within 1e-4, attention weights within 1e-5), the router's choice in qkv's trace equal to transformers' (its
router_logits → scores, + the bias, groups) at every token, greedy generation with and without the KV cache token
for token, a model qkv saves read back by transformers with equal logits, and gradients equal to torch autograd.
Ernie's GGUF file (llama.cpp's `ernie4_5`, bias-free) against transformers on the directory.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from live_helpers import (INIT_RANGE, build, case_seed, check_decoder_gradients, check_decoder_live,
                          check_saved_by_qkv_on, gguf_and_loaded, padded_batch, save, saved_and_loaded)
from transformers import (Dots1Config, Dots1ForCausalLM, Ernie4_5Config, Ernie4_5ForCausalLM, Ernie4_5_MoeConfig,
                          Ernie4_5_MoeForCausalLM)

import qkv

pytestmark = pytest.mark.live

NEW = 8
COMMON = dict(max_position_embeddings=128, initializer_range=INIT_RANGE, pad_token_id=0,
              bos_token_id=1, eos_token_id=2, attn_implementation="eager")


def ernie(d=48, heads=4, kv=2, layers=2, ff=80, head_dim=None, bias=False, tied=True, rope=None, vocab=211, **kw):
    return Ernie4_5Config(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                          num_hidden_layers=layers, intermediate_size=ff, head_dim=head_dim or d // heads,
                          use_bias=bias, tie_word_embeddings=tied,
                          rope_parameters=rope or {"rope_type": "default", "rope_theta": 1e4}, **COMMON, **kw)


def ernie_moe(d=48, heads=4, kv=2, layers=3, ff=40, moe_ff=16, E=4, k=2, shared=1, start=1, end=-1, interval=1,
              floor=1e-12, bias=False, tied=False, **kw):
    return Ernie4_5_MoeConfig(vocab_size=211, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                              num_hidden_layers=layers, intermediate_size=ff, moe_intermediate_size=moe_ff,
                              moe_num_experts=E, moe_k=k,
                              moe_num_shared_experts=shared, moe_layer_start_index=start, moe_layer_end_index=end,
                              moe_layer_interval=interval, moe_norm_min=floor, use_bias=bias, head_dim=d // heads,
                              tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 2e4},
                              **COMMON, **kw)


def dots1(d=48, heads=4, kv=2, layers=3, ff=40, moe_ff=16, E=8, k=2, shared=1, groups=1, kept=1, norm=True, scale=1.0,
          first=1, window=None, start=None, bias=False, tied=False, **kw):
    return Dots1Config(vocab_size=211, hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv,
                       num_hidden_layers=layers, intermediate_size=ff, moe_intermediate_size=moe_ff,
                       n_routed_experts=E, num_experts_per_tok=k,
                       n_shared_experts=shared, n_group=groups, topk_group=kept, norm_topk_prob=norm,
                       routed_scaling_factor=scale, first_k_dense_replace=first, sliding_window=window,
                       max_window_layers=layers if start is None else start, attention_bias=bias, head_dim=d // heads,
                       tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                       **COMMON, **kw)


ERNIE_CASES = [
    pytest.param(ernie(), id="ernie-gqa-tied"),
    pytest.param(ernie(d=32, heads=4, kv=4, layers=3, bias=True, tied=False), id="ernie-mha-bias-untied-L3"),
    pytest.param(ernie(heads=4, kv=1, head_dim=16, rms_norm_eps=1e-6,
                       rope={"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0}),
                 id="ernie-mqa-dk16-linear-theta5e5"),
]

MOE_CASES = [
    pytest.param(Ernie4_5_MoeForCausalLM, ernie_moe(), id="ernie-moe-E4-k2-shared1"),
    pytest.param(Ernie4_5_MoeForCausalLM, ernie_moe(E=8, k=3, shared=2, start=0, end=2, interval=2, layers=4,
                                                    bias=True, tied=True), id="ernie-moe-E8-k3-interval2-bias-tied"),
    pytest.param(Ernie4_5_MoeForCausalLM, ernie_moe(E=8, k=2, shared=0, start=0, floor=0.45, kv=1),
                 id="ernie-moe-no-shared-floor0.45-mqa"),
    pytest.param(Ernie4_5_MoeForCausalLM, ernie_moe(E=4, k=1, layers=2, start=0), id="ernie-moe-k1"),
    pytest.param(Dots1ForCausalLM, dots1(), id="dots1-E8-k2-one-group"),
    pytest.param(Dots1ForCausalLM, dots1(groups=4, kept=2, k=3, scale=2.0, shared=2, window=5, start=1, bias=True),
                 id="dots1-groups2of4-k3-x2-window5-bias"),
    pytest.param(Dots1ForCausalLM, dots1(groups=2, kept=1, norm=False, first=0, layers=2, tied=True, kv=4),
                 id="dots1-groups1of2-unnormed-no-dense-tied"),
    pytest.param(Dots1ForCausalLM, dots1(E=4, k=1, first=2, layers=3, window=4, start=0),
                 id="dots1-k1-dense2-all-sliding"),
]


def draw_choice_biases_(model, seed: int) -> None:
    """Each MoE layer's choice bias N(0, 0.2²) (dots1's is a buffer the noise skips; Ernie's a frozen parameter)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is None:
                continue
            b = (gate.moe_statics.e_score_correction_bias if hasattr(gate, "moe_statics")
                 else gate.e_score_correction_bias)
            b.copy_(torch.randn(b.shape, generator=gen) * 0.2)


def hf_choice(model, ids: np.ndarray) -> list[np.ndarray]:
    """transformers' own choice of experts per MoE layer (n, k), sorted, from its router modules' outputs."""
    chosen = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda mod, args, out: chosen.append(out[2].numpy().copy()))
             for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    with torch.no_grad():
        model(torch.from_numpy(ids))
    for h in hooks:
        h.remove()
    return [np.sort(c, -1) for c in chosen]


def autograd(model, ids: np.ndarray, mask: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """torch's loss and every gradient (a parameter the loss never reaches, Ernie's choice bias, has none)."""
    model.zero_grad()
    labels = torch.tensor(ids).masked_fill(torch.tensor(mask) == 0, -100)
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), labels=labels, use_cache=False)
    out.loss.backward()
    return out.loss.item(), {k: p.grad.numpy().copy() for k, p in model.named_parameters() if p.grad is not None}


def by_file_name(ref: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers 5's fused experts (experts.gate_up_proj (E, 2·f, d), experts.down_proj (E, d, f)) as the file's
    per-expert tensors, the names qkv's gradients use."""
    out = {}
    for key, g in ref.items():
        base = key.rsplit(".", 1)[0] + "."
        if key.endswith("experts.gate_up_proj"):
            f = g.shape[1] // 2
            out |= {f"{base}{e}.gate_proj.weight": x[:f] for e, x in enumerate(g)}
            out |= {f"{base}{e}.up_proj.weight": x[f:] for e, x in enumerate(g)}
        elif key.endswith("experts.down_proj"):
            out |= {f"{base}{e}.down_proj.weight": x for e, x in enumerate(g)}
        else:
            out[key] = g
    return out


@pytest.mark.parametrize("config", ERNIE_CASES)
def test_ernie(config, tmp_path, request):
    model, ours = saved_and_loaded(Ernie4_5ForCausalLM, config, tmp_path, case_seed(request))
    assert ours.config.rope_interleaved and ours.config.ffn_bias == config.use_bias
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)
    check_gradients(model, ours)


def check_gradients(model, ours) -> None:
    # (top-1 renormalised: the weight is 1 whatever p, so the router's gradient is 0; torch's is rounding)
    check_decoder_gradients(model, ours, autograd, by_file_name)


@pytest.mark.parametrize(("cls", "config"), MOE_CASES)
def test_moe(cls, config, tmp_path, request):
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    model = build(cls, config, seed=seed)
    draw_choice_biases_(model, seed + 7)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)
    prompt = padded_batch(config.vocab_size, [9], seed=12, low=3)[0]
    trace = ours.run(prompt[0])
    routed = [i for i in range(ours.config.n_layers) if ours.config.moe_layer(i)]
    theirs = hf_choice(model, prompt)
    assert len(theirs) == len(routed) > 0
    for layer, chosen in zip(routed, theirs):
        assert np.array_equal(np.sort(trace.layer(layer).experts, -1), chosen), layer
    if ours.config.norm_top_k_min > 1e-6:                           # the floor holds the denominator somewhere
        t = trace.layer(routed[0])
        total = np.take_along_axis(t.router, t.experts, -1).sum(-1)
        assert (total < ours.config.norm_top_k_min).any() and (total > ours.config.norm_top_k_min).any()
    check_saved_by_qkv_on(cls, model, ours, prompt, tmp_path / "qkv")   # a model qkv saves, read back by transformers
    check_gradients(model, ours)


@pytest.mark.parametrize("config", [ERNIE_CASES[1].values[0]])
def test_an_ernie_qkv_saves_reads_back_in_transformers(config, tmp_path):
    model = build(Ernie4_5ForCausalLM, config, seed=5)
    save(model, tmp_path / "hf")
    qkv.load(tmp_path / "hf").save(tmp_path / "qkv")
    back = Ernie4_5ForCausalLM.from_pretrained(tmp_path / "qkv").eval()
    back.set_attn_implementation("eager")
    ids = np.arange(3, 14)[None]
    with torch.no_grad():
        logits = back(torch.tensor(ids)).logits.numpy()
    assert np.abs(logits - qkv.load(tmp_path / "qkv").forward(ids).logits).max() <= 1e-4


GGUF_VOCAB = 300                           # gguf_convert writes a tokenizer of 260 ids: the vocabulary holds them


@pytest.mark.parametrize("config", [pytest.param(ernie(vocab=GGUF_VOCAB), id="ernie-gguf-gqa-tied"),
                                    pytest.param(ernie(d=32, heads=2, kv=1, layers=3, tied=False, vocab=GGUF_VOCAB,
                                                       rope={"rope_type": "default", "rope_theta": 5e5}),
                                                 id="ernie-gguf-mqa-untied-theta5e5-L3")])
def test_ernie_gguf_equals_transformers(config, tmp_path, request):
    """llama.cpp's `ernie4_5` file (tests/fixtures/gguf_convert.py: tensors as stored) gives transformers' numbers on
    the directory, and its greedy ids with and without the KV cache."""
    model, ours = gguf_and_loaded(Ernie4_5ForCausalLM, config, tmp_path, case_seed(request))
    assert ours.config.family == "ernie4_5" and ours.config.rope_interleaved
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)
