"""Word timestamps against live transformers: random Whisper checkpoints of other knob values than the committed
fixtures (three and four decoder layers, four heads, 40 encoder positions, median_filter_width 5 and 1, the alignment
heads left out of generation_config.json — qkv then reads the upper half, given to transformers explicitly, as it
needs them — or named), with and without timestamps, with and without an attention_mask cutting the sound short:
each token's time within one 20 ms frame of generate(return_token_timestamps=True)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

import qkv
from qkv.writing.timestamps import align, token_timestamps

V, EOT, SOT, NO_TS = 80, 30, 31, 32                 # 33..79: timestamps
KNOBS = [
    dict(decoder_layers=3, heads=4, width=5, alignment=None),
    dict(decoder_layers=4, heads=2, width=1, alignment=[[3, 1], [2, 0], [1, 1]]),
    dict(decoder_layers=2, heads=4, width=7, alignment=[[0, 3]]),
]


@pytest.mark.parametrize("k", range(len(KNOBS)))
def test_random_whisper_token_timestamps_as_transformers(tmp_path, k):
    knobs = KNOBS[k]
    torch.manual_seed(k)
    L, H = knobs["decoder_layers"], knobs["heads"]
    config = WhisperConfig(vocab_size=V, num_mel_bins=6, d_model=16, encoder_layers=1, decoder_layers=L,
                           encoder_attention_heads=H, decoder_attention_heads=H, encoder_ffn_dim=20,
                           decoder_ffn_dim=20, max_source_positions=40, max_target_positions=40, pad_token_id=EOT,
                           bos_token_id=EOT, eos_token_id=EOT, decoder_start_token_id=SOT, init_std=0.3,
                           median_filter_width=knobs["width"], suppress_tokens=None, begin_suppress_tokens=None)
    ref = WhisperForConditionalGeneration(config)
    gen = torch.Generator().manual_seed(k + 11)
    with torch.no_grad():
        for _, p in sorted(ref.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    heads = knobs["alignment"] or [[l, h] for l in range(L // 2, L) for h in range(H)]
    settings = dict(decoder_start_token_id=SOT, eos_token_id=EOT, pad_token_id=EOT, bos_token_id=EOT, max_length=24,
                    no_timestamps_token_id=NO_TS, is_multilingual=False, begin_suppress_tokens=[EOT])
    ref.generation_config = GenerationConfig(**settings, **({"alignment_heads": knobs["alignment"]}
                                                             if knobs["alignment"] else {}))
    ref.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["median_filter_width"] == knobs["width"]
    ref = WhisperForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ref.generation_config.alignment_heads = heads                   # transformers needs them named
    ours = qkv.load(tmp_path)
    compared = 0
    for stamps in (False, True):
        for cut in (None, 57):
            x = torch.randn((1, 6, 80), generator=gen)
            mask = None
            if cut is not None:
                mask = torch.zeros((1, 80), dtype=torch.long)
                mask[:, :cut] = 1
            with torch.no_grad():
                found = ref.generate(x, num_beams=1, do_sample=False, return_timestamps=stamps,
                                     return_token_timestamps=True, attention_mask=mask)
            result = ours.transcribe(x[0].numpy(), timestamps=stamps)
            if not np.array_equal(result.ids, found["sequences"][0].numpy()):
                continue                                            # a near tie decided otherwise: not this test's
            mine = token_timestamps(result, alignments=[align(result, w, frames=cut)
                                                        for w in range(len(result.windows))])
            want = found["token_timestamps"][0].numpy()
            assert mine.shape == want.shape and np.abs(mine - want).max() <= 0.02 + 1e-6, (stamps, cut)
            compared += 1
    assert compared >= 3
