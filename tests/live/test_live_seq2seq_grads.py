"""qkv.train.gradients of encoder–decoders (Marian, BART) against live torch autograd: random checkpoints,
a padded source batch, labels with −100. Loss within 1e-5; each tensor's gradient within 1e-4 relative
error, except the self- and cross-attention key biases, whose true gradient is 0 (softmax ignores a
constant added to every score of a query): those within 1e-7 absolute."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel

import qkv
from qkv.train import gradients

CASES = [
    pytest.param(MarianMTModel, MarianConfig, dict(scale_embedding=True, activation_function="swish"), id="marian-swish"),
    pytest.param(MarianMTModel, MarianConfig, dict(scale_embedding=True, encoder_layers=1, decoder_layers=3), id="marian-1x3"),
    pytest.param(BartForConditionalGeneration, BartConfig, dict(), id="bart-gelu"),
    pytest.param(BartForConditionalGeneration, BartConfig, dict(activation_function="relu", decoder_layers=1),
                 id="bart-relu-2x1"),
]


def random_seq2seq(cls, config_cls, kw: dict, seed: int) -> torch.nn.Module:
    """A small random encoder–decoder of CASES's kind, its weights moved off their init."""
    torch.manual_seed(seed)
    base = dict(vocab_size=90, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
                pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, dropout=0.0, attention_dropout=0.0,
                activation_dropout=0.0)
    model = cls(config_cls(**{**base, **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:                              # Marian's sinusoids are fixed
                p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.mark.parametrize("cls, config_cls, kw", CASES)
def test_seq2seq_gradients_equal_autograd(cls, config_cls, kw, tmp_path):
    model = random_seq2seq(cls, config_cls, kw, seed=1)
    model.save_pretrained(tmp_path)
    rng = np.random.default_rng(0)
    src = rng.integers(2, 90, (3, 7))
    mask = np.ones_like(src)
    mask[1, 5:] = 0
    src[mask == 0] = 0
    labels = rng.integers(2, 90, (3, 6))
    labels[2, 3:] = -100
    out = model(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask), labels=torch.tensor(labels))
    out.loss.backward()
    ref = {k: p.grad.numpy() for k, p in model.named_parameters() if p.requires_grad}
    loss, grads = gradients(qkv.load(tmp_path), src, mask, labels=labels)
    assert abs(loss - out.loss.item()) < 1e-5
    assert set(grads) == set(ref)
    for key, g in ref.items():
        if key.endswith("k_proj.bias"):
            assert np.abs(grads[key] - g).max() < 1e-7, key
        else:
            assert np.linalg.norm(grads[key] - g) / np.linalg.norm(g) < 1e-4, key
