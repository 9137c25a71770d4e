"""Hooks and ablation on encoder–decoders against the same edit made in transformers.

A head of the encoder, of the decoder's self-attention or of its cross-attention is knocked out in
torch by zeroing its slice of Concat(heads) before W_O (a forward pre-hook on out_proj / o), and in
qkv by `ablate=[(stack, layer, head)]` and by a hook returning 0 for that head's Z: logits equal
within the usual 1e-4 (the edit moves them by far more, so the comparison can fail).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import TOL_HIDDEN, max_abs, padded_batch
from test_live_seq2seq import CASES, build
from transformers import T5ForConditionalGeneration

import qkv


def out_projection(model, stack: str, layer: int):
    """The W_O module of one attention of a transformers encoder–decoder."""
    if isinstance(model, T5ForConditionalGeneration):
        if stack == "encoder":
            return model.encoder.block[layer].layer[0].SelfAttention.o
        block = model.decoder.block[layer]
        return block.layer[0].SelfAttention.o if stack == "decoder" else block.layer[1].EncDecAttention.o
    side = model.model.encoder if stack == "encoder" else model.model.decoder
    attn = side.layers[layer].self_attn if stack != "cross" else side.layers[layer].encoder_attn
    return attn.out_proj


def torch_logits(model, ids, mask, dec, dec_mask, stack: str, layer: int, head: int, d_k: int) -> np.ndarray:
    def zero_head(_module, args):
        z = args[0].clone()                                    # (B, n, H·d_k) the concatenated heads
        z[..., head * d_k:(head + 1) * d_k] = 0
        return (z,)

    handle = out_projection(model, stack, layer).register_forward_pre_hook(zero_head)
    try:
        with torch.no_grad():
            return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                         decoder_input_ids=torch.from_numpy(dec),
                         decoder_attention_mask=torch.from_numpy(dec_mask)).logits.numpy()
    finally:
        handle.remove()


@pytest.mark.parametrize(("cls", "config", "untie"), CASES)
def test_a_knocked_out_head_equals_transformers(cls, config, untie, tmp_path):
    seed = sum(map(ord, f"{cls.__name__}{config.d_model}")) + 5
    model = build(cls, config, seed, untie)
    model.save_pretrained(tmp_path)
    ours = qkv.load(tmp_path)
    V, pad = config.vocab_size, config.pad_token_id
    ids, mask = padded_batch(V - 1, [8, 5], seed + 2, low=3, pad_id=pad)
    dec, dec_mask = padded_batch(V - 1, [6, 4], seed + 3, low=3, pad_id=pad)
    dec[:, 0] = config.decoder_start_token_id
    rows = dec_mask.astype(bool)
    plain = ours.forward(ids, mask, dec, dec_mask, attentions=False).logits
    c = ours.config
    for stack in ("encoder", "decoder", "cross"):
        layer, head = (c.n_layers if stack == "encoder" else c.n_decoder_layers) - 1, c.n_heads - 1
        ref = torch_logits(model, ids, mask, dec, dec_mask, stack, layer, head, c.d_head)
        ablated = ours.forward(ids, mask, dec, dec_mask, attentions=False, ablate=[(stack, layer, head)]).logits
        prefix = "" if stack == "decoder" else f"{stack}."
        hooked = ours.forward(ids, mask, dec, dec_mask, attentions=False,
                              hooks={f"{prefix}{layer}.heads.{head}": lambda z, layer: 0}).logits
        assert max_abs(plain[rows], ref[rows]) > 10 * TOL_HIDDEN, f"{stack}: the edit must move the logits"
        assert max_abs(ablated[rows], ref[rows]) < TOL_HIDDEN, stack
        assert max_abs(hooked[rows], ref[rows]) < TOL_HIDDEN, stack
        np.testing.assert_array_equal(hooked, ablated)
