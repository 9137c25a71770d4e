"""Whisper against live transformers: random checkpoints of other knob values than the committed fixtures (more mel
bins and frames, head and FFN sizes, gelu_new or relu in the FFNs, an untied proj_out, one decoder layer), the
features WhisperFeatureExtractor makes from a sound, and the cross-attention of every text token over the frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperModel

import qkv

from live_helpers import TOL_ATTENTION, TOL_HIDDEN

CASES = [
    dict(vocab_size=90, num_mel_bins=12, d_model=32, encoder_layers=3, decoder_layers=2, encoder_attention_heads=4,
         decoder_attention_heads=4, encoder_ffn_dim=40, decoder_ffn_dim=40, max_source_positions=20,
         max_target_positions=16),
    dict(vocab_size=70, num_mel_bins=8, d_model=24, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
         decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_source_positions=11,
         max_target_positions=10, activation_function="gelu_new", tie_word_embeddings=False),
    dict(vocab_size=50, num_mel_bins=4, d_model=16, encoder_layers=2, decoder_layers=3, encoder_attention_heads=1,
         decoder_attention_heads=1, encoder_ffn_dim=8, decoder_ffn_dim=8, max_source_positions=7,
         max_target_positions=8, activation_function="relu", scale_embedding=True),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("cls", [WhisperForConditionalGeneration, WhisperModel])
def test_random_whisper_equals_transformers(tmp_path, case, cls):
    torch.manual_seed(case)
    config = WhisperConfig(**CASES[case], pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3)
    ref = cls(config)
    gen = torch.Generator().manual_seed(case + 7)
    with torch.no_grad():
        for _, p in sorted(ref.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    ref.save_pretrained(tmp_path)
    ref = cls.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ours = qkv.load(tmp_path)
    x = torch.randn((2, config.num_mel_bins, 2 * config.max_source_positions), generator=gen)
    dec = torch.randint(4, config.vocab_size, (2, 6), generator=gen)
    dec[:, 0] = 3
    with torch.no_grad():
        out = ref(input_features=x, decoder_input_ids=dec, output_attentions=True)
    mine = ours.forward(x.numpy(), decoder_input_ids=dec.numpy())
    for key in ("encoder_attentions", "cross_attentions"):
        expected = np.stack([a.numpy() for a in getattr(out, key)])
        assert np.abs(getattr(mine, key) - expected).max() <= TOL_ATTENTION, key
    assert np.abs(mine.attentions - np.stack([a.numpy() for a in out.decoder_attentions])).max() <= TOL_ATTENTION
    if cls is WhisperForConditionalGeneration:
        assert np.abs(mine.logits - out.logits.numpy()).max() <= TOL_HIDDEN
    else:
        assert np.abs(mine.hidden - out.last_hidden_state.numpy()).max() <= TOL_HIDDEN


def test_features_of_a_sound(tmp_path):
    """WhisperFeatureExtractor's log-mel features of a chirp, cut to the model's frames, read the same by both."""
    torch.manual_seed(0)
    config = WhisperConfig(vocab_size=40, num_mel_bins=80, d_model=16, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=8, decoder_ffn_dim=8,
                           max_source_positions=25, max_target_positions=8, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, decoder_start_token_id=3)
    WhisperForConditionalGeneration(config).save_pretrained(tmp_path)
    ref = WhisperForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()
    t = np.arange(16000) / 16000
    sound = (0.3 * np.sin(2 * np.pi * (200 + 600 * t) * t)).astype(np.float32)
    features = WhisperFeatureExtractor(feature_size=80)(sound, sampling_rate=16000, return_tensors="np")
    x = features["input_features"][:, :, :50]                          # 0.5 s: 50 frames = 2 × 25 positions
    with torch.no_grad():
        expected = ref(input_features=torch.from_numpy(x), decoder_input_ids=torch.tensor([[3, 5, 6]]),
                       output_attentions=True).cross_attentions
    trace = qkv.load(tmp_path).run(x[0], [3, 5, 6])
    assert trace.cross.source_tokens[-1] == "0.48s"
    assert np.abs(trace.cross.attentions - np.stack([a[0].numpy() for a in expected])).max() <= TOL_ATTENTION
