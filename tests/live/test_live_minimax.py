"""MiniMax (issue 47) against live transformers, on random checkpoints of other knob values than the committed
fixture: the default alternation of softmax and lightning layers, lightning first or last, blocks of 1, 2, 3 and
more than the text, α and β factors, GELU and ReLU, a sliding window, RoPE scaled, MHA, head_dim ≠ d / H, top-1
of 3 experts, tied and untied.

Each case builds a seeded, perturbed MiniMaxForCausalLM, saves it, loads it with qkv and compares a right- and a
left-padded batch (every layer's output, final hidden states and logits within 1e-4 at the real positions, the
softmax layers' attention weights within 1e-5), greedy writing with and without the lightning state token for token
(and a left-padded batch of prompts), and the implied attention's identity in float64; a model qkv saves is read
back by transformers with the same logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import INIT_RANGE, TOL_ATTENTION, TOL_HIDDEN, build, case_seed, decoder_positions, padded_batch, save
from live_scan import check_read_back, check_writing
from transformers import MiniMaxConfig, MiniMaxForCausalLM

import qkv
from qkv.core.lightning import lightning_core
from qkv.core.stack import transformer
from qkv.core.trace import Recorder

pytestmark = pytest.mark.live

def minimax(d=32, layers=4, heads=4, kv=2, experts=4, k=2, block=3, vocab=211, **kw):
    return MiniMaxConfig(vocab_size=vocab, hidden_size=d, intermediate_size=24, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, num_local_experts=experts,
                         num_experts_per_tok=k, block_size=block, max_position_embeddings=128,
                         initializer_range=INIT_RANGE, pad_token_id=0, bos_token_id=1, eos_token_id=2, **kw)


LIN, FULL = "linear_attention", "full_attention"
CASES = [
    pytest.param(minimax(kv=4, tie_word_embeddings=True), id="default-alternation-mha-tied-block3"),
    pytest.param(minimax(layers=3, block=16, head_dim=12, hidden_act="gelu", sliding_window=5,
                         layer_types=[LIN, LIN, FULL], full_attn_alpha_factor=1.5, linear_attn_beta_factor=0.6,
                         mlp_alpha_factor=0.7, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                "rope_theta": 5000.0}),
                 id="lightning-first-block16-head12-gelu-window5-linear-rope"),
    pytest.param(minimax(layers=2, experts=3, k=1, block=2, hidden_act="relu", layer_types=[FULL, LIN],
                         linear_attn_alpha_factor=0.5, mlp_beta_factor=2.0, full_attn_beta_factor=0.8),
                 id="block2-relu-top1-of-3"),
    pytest.param(minimax(layers=1, d=24, heads=3, kv=1, block=1, layer_types=[LIN]), id="one-lightning-layer-block1"),
    pytest.param(minimax(layers=2, kv=1, partial_rotary_factor=0.5, tie_word_embeddings=True),
                 id="mqa-partial-rotary-factor-unread"),    # transformers turns the whole head whatever it says
]


def check_batch(model, ours, vocab: int, side: str, seed: int) -> None:
    """A padded batch (positions counted over the real tokens, as generate gives them): every layer's output, the
    final hidden states, the logits and the softmax layers' weights at the real positions."""
    ids, mask = padded_batch(vocab, [11, 7, 9], seed, side=side)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    position_ids=torch.from_numpy(decoder_positions(mask)), output_hidden_states=True,
                    output_attentions=True, use_cache=False)
    rec = Recorder(keep=("residual_out", "attentions"))
    hidden, logits = transformer(ours.weights, ours.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert np.abs(logits - ref.logits.numpy())[real].max() < TOL_HIDDEN
    assert np.abs(hidden - ref.hidden_states[-1].numpy())[real].max() < TOL_HIDDEN
    cfg = ours.config
    for layer in range(cfg.n_layers - 1):
        got = rec.store[layer]["residual_out"]
        assert np.abs(got - ref.hidden_states[layer + 1].numpy())[real].max() < TOL_HIDDEN, (side, layer)
    for layer in range(cfg.n_layers):
        if cfg.lightning.linear(layer):
            continue
        A, want = rec.store[layer]["attentions"], ref.attentions[layer].numpy()
        for row in range(len(ids)):
            keep = real[row]
            assert np.abs(A[row][:, keep][:, :, keep] - want[row][:, keep][:, :, keep]).max() < TOL_ATTENTION


def cache_is_its_pass(config) -> bool:
    """Whether transformers' cached writing is its full pass's. Not with a sliding window when layer 0 is lightning:
    its mask builder takes the past's length from layer 0's cache (MiniMaxCache.get_seq_length), which a lightning
    layer leaves empty, so each step's window starts from position 0 (its writing without the cache is the model's
    own: qkv's, with and without its cache)."""
    return not (config.layer_types[0] == LIN and config.sliding_window is not None)


def test_transformers_cached_writing_is_not_its_pass_there(tmp_path):
    """The case `cache_is_its_pass` sets apart, seen: transformers' cache reports no past after a prefill."""
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    model = build(MiniMaxForCausalLM, CASES[1].values[0], 3)
    cache = MiniMaxCache()
    with torch.no_grad():
        model(input_ids=torch.arange(3, 12)[None], cache=cache, use_cache=True)
    assert cache.get_seq_length() == 0 and cache.layers[2].get_seq_length() == 9


@pytest.mark.parametrize("config", CASES)
def test_minimax(config, tmp_path, request):
    seed = case_seed(request)
    model = build(MiniMaxForCausalLM, config, seed)
    save(model, tmp_path / "hf")
    ours = qkv.load(tmp_path / "hf")
    for side in ("right", "left"):
        check_batch(model, ours, config.vocab_size, side, seed + 2)
    # one prompt and a left-padded batch of them: transformers' ids, from full passes where its cache is not its pass
    prompt = check_writing(model, ours, config.vocab_size, seed + 3, cached=cache_is_its_pass(config))
    # each lightning layer's implied attention times V is its blocked sum, float64
    ours64 = qkv.load(tmp_path / "hf", dtype=np.float64)
    trace = ours64.run(prompt[0].tolist(), keep=("v", "scores", "heads", "q", "k"))
    for layer in ours64.config.lightning.linear_layers:
        t = trace.layer(layer)
        assert np.abs(t.scores @ t.v - t.heads).max() < 1e-9
        o, _ = lightning_core(t.q[None], t.k[None], t.v[None], ours64.weights.blocks[layer].lightning.slopes, 1)
        assert np.abs(o[0] - t.heads).max() < 1e-9
    check_read_back(MiniMaxForCausalLM, model, ours, prompt, tmp_path / "ours")   # saved without the decay buffers
