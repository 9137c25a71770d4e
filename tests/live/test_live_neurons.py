"""The FFN's hidden activations ("neurons") against transformers (make test-live), on random GPT-2 and Llama
checkpoints made here (not the committed fixtures), on a right-padded batch:

    GPT2MLP     h = act(c_fc(x)), the output of its `act` module (a forward hook)
    LlamaMLP    h = act_fn(gate_proj(x)) * up_proj(x), the input of down_proj (a forward pre-hook)

qkv's "neurons" of every layer (read by a hook in model.forward) equal them at the real positions within
1e-5 max-abs (float32), and ffn_out = h·W_out + b_out of qkv's own trace is what transformers' MLP returns.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import qkv

from live_helpers import build, max_abs, padded_batch, save
from test_live_reference import decoder_config, gpt2_config

pytestmark = pytest.mark.live

TOL = 1e-5
LENGTHS = [11, 7]


def reference_hidden(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray) -> tuple[list, list]:
    """(each layer's h (B, n, d_ff), each layer's MLP output (B, n, d_model)) from transformers."""
    hidden, outputs, handles = [], [], []
    for block in (model.transformer.h if hasattr(model, "transformer") else model.model.layers):
        mlp = block.mlp
        if hasattr(mlp, "down_proj"):                                    # LlamaMLP: what down_proj reads
            handles.append(mlp.down_proj.register_forward_pre_hook(lambda m, args: hidden.append(args[0].numpy())))
        else:                                                            # GPT2MLP: what act gives
            handles.append(mlp.act.register_forward_hook(lambda m, args, out: hidden.append(out.numpy())))
        handles.append(mlp.register_forward_hook(lambda m, args, out: outputs.append(out.numpy())))
    try:
        with torch.no_grad():
            model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    finally:
        for h in handles:
            h.remove()
    return hidden, outputs


def check(model: torch.nn.Module, directory) -> None:
    save(model, directory)
    ours = qkv.load(directory)
    ids, mask = padded_batch(model.config.vocab_size, LENGTHS, seed=4)
    theirs, mlp_out = reference_hidden(model, ids, mask)
    seen = {}

    def read(h, layer):
        seen[layer] = h.copy()                                           # (B, n, d_ff)

    ours.forward(ids, mask, hooks={"neurons": read})
    real = mask.astype(bool)
    assert len(theirs) == len(seen) == ours.config.n_layers
    for layer, want in enumerate(theirs):
        error = max_abs(seen[layer][real], want[real])
        print(f"layer {layer}: neurons {error:.2e}")
        assert error <= TOL, layer
    for row, k in enumerate(LENGTHS):                                    # one text: its own trace's ffn_out
        t = ours.run(ids[row, :k], keep=("neurons", "ffn_out"))
        for layer in range(ours.config.n_layers):
            assert max_abs(t.layer(layer).ffn_out, mlp_out[layer][row, :k]) <= 1e-4, (row, layer)


@pytest.mark.parametrize("act, inner", [("gelu_new", None), ("gelu", 100)])
def test_gpt2_neurons_equal_transformers(act, inner, tmp_path):
    cfg = gpt2_config(48, 4, 2, act, inner, True)
    check(build(GPT2LMHeadModel, cfg, seed=511), tmp_path)


@pytest.mark.parametrize("kw", [dict(heads=8, kv=2, tie_word_embeddings=False), dict(heads=4, kv=4, ff=80, layers=3)])
def test_llama_neurons_equal_transformers(kw, tmp_path):
    cfg = decoder_config(LlamaConfig, **kw)
    check(build(LlamaForCausalLM, cfg, seed=512 + cfg.num_hidden_layers), tmp_path)
