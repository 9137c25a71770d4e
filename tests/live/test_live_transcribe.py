"""Whisper's writing and sound in, against live transformers: random checkpoints and generation configs of other
knob values than the committed fixtures (tests/fixtures/make_transcribe_fixtures.py) — English-only (no language,
no task), no forced_decoder_ids, no max_initial_timestamp_index, other suppress lists, an untied proj_out, a
language given by token, no generation_config.json at all — ids equal to generate(num_beams=1) with and without
timestamps, short and long inputs; and log-mel features of random sounds equal to WhisperFeatureExtractor."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from transformers import (GenerationConfig, LogitsProcessor, WhisperConfig, WhisperFeatureExtractor,
                          WhisperForConditionalGeneration)

import qkv
from qkv.inputs.audio import log_mel

V, EOT, SOT, LANG0, TRANSLATE, TRANSCRIBE, NO_TS = 90, 30, 31, 32, 36, 37, 40     # 41..89: timestamps
LANGS = ("en", "ko", "es", "it")


class Gaps(LogitsProcessor):
    def __init__(self):
        self.gaps = []

    def __call__(self, input_ids, scores):
        top = torch.topk(scores.float(), 2, dim=-1).values
        self.gaps.append(float(top[:, 0] - top[:, 1]))
        return scores


GENERATION = [
    dict(max_length=25, lang_to_id={f"<|{l}|>": LANG0 + i for i, l in enumerate(LANGS)},
         task_to_id={"translate": TRANSLATE, "transcribe": TRANSCRIBE}, no_timestamps_token_id=NO_TS,
         is_multilingual=True, suppress_tokens=[1, 2, TRANSLATE, TRANSCRIBE], begin_suppress_tokens=[EOT]),
    dict(max_length=18, no_timestamps_token_id=NO_TS, is_multilingual=False, max_initial_timestamp_index=2,
         suppress_tokens=[4], begin_suppress_tokens=[]),
    None,                                                               # no generation_config.json
]
REQUESTS = [dict(), dict(timestamps=True), dict(language="<|es|>", task="translate"), dict(max_new_tokens=5)]


@pytest.mark.parametrize("g", range(len(GENERATION)))
@pytest.mark.parametrize("seed", [0, 1])
def test_random_whisper_writes_as_transformers(tmp_path, g, seed):
    torch.manual_seed(seed)
    config = WhisperConfig(vocab_size=V, num_mel_bins=6 + seed, d_model=16 + 8 * seed, encoder_layers=1 + seed,
                           decoder_layers=2 - seed, encoder_attention_heads=2, decoder_attention_heads=2,
                           encoder_ffn_dim=20, decoder_ffn_dim=20, max_source_positions=7 + seed,
                           max_target_positions=36, pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT,
                           decoder_start_token_id=SOT, tie_word_embeddings=bool(seed), init_std=0.3,
                           suppress_tokens=None, begin_suppress_tokens=None)
    ref = WhisperForConditionalGeneration(config)
    gen = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        for _, p in sorted(ref.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    ref.generation_config = GenerationConfig(decoder_start_token_id=SOT, eos_token_id=EOT, pad_token_id=EOT,
                                             bos_token_id=EOT, **(GENERATION[g] or {}))
    ref.save_pretrained(tmp_path)
    if GENERATION[g] is None:
        (tmp_path / "generation_config.json").unlink()
    ref = WhisperForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ours = qkv.load(tmp_path)
    window = 2 * config.max_source_positions
    checked = 0
    for r, request in enumerate(REQUESTS):
        if g > 0 and (request.get("language") or request.get("timestamps") and g == 2):
            continue                                    # English-only / no timestamps token: refused by both
        for frames in (window, 3 * window + 5):
            if frames > window and not (request.get("timestamps") or g == 1):
                continue
            x = torch.randn((1, config.num_mel_bins, frames), generator=gen)
            gaps = Gaps()
            with torch.no_grad():
                expected = ref.generate(x, num_beams=1, do_sample=False, language=request.get("language"),
                                        task=request.get("task"), return_timestamps=request.get("timestamps"),
                                        max_new_tokens=request.get("max_new_tokens"), logits_processor=[gaps])
            if min(gaps.gaps) < 1e-3:
                continue                                # a near tie: rounding may choose either
            mine = ours.transcribe(x[0].numpy(), **request)
            np.testing.assert_array_equal(mine.ids, expected[0].numpy(), err_msg=f"request {r}, {frames} frames")
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("mels", [80, 128])
@pytest.mark.parametrize("seconds", [0.3, 7.0, 30.0, 33.3])
def test_features_of_random_sounds(mels, seconds):
    rng = np.random.default_rng(int(seconds * 10) + mels)
    n = int(16000 * seconds)
    t = np.arange(n) / 16000
    x = (0.2 * rng.standard_normal(n) * np.sin(2 * np.pi * 0.7 * t) + 0.3 * np.sin(2 * np.pi * 880 * t)
         ).astype(np.float32)
    fe = WhisperFeatureExtractor(feature_size=mels)
    expected = fe(x, sampling_rate=16000, return_tensors="np", padding="longest" if n > 480000 else "max_length",
                  truncation=n <= 480000).input_features[0]
    mine = log_mel(x, mels)
    assert mine.shape == expected.shape and np.abs(mine - expected).max() <= 1e-4


def test_a_whisper_shaped_model_transcribes_a_sound_file_as_transformers(tmp_path):
    """The real window (80 mels, 1500 positions: 30 s), a 41 s sound file at 44.1 kHz stereo: qkv reads it
    (soundfile, mono, soxr "HQ" to 16 kHz, log-mel) and writes long-form; transformers gets the same samples through
    WhisperFeatureExtractor(truncation=False, padding="longest") and generate — the same ids."""
    import soundfile
    import soxr

    torch.manual_seed(4)
    config = WhisperConfig(vocab_size=V, num_mel_bins=80, d_model=16, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
                           decoder_ffn_dim=16, max_source_positions=1500, max_target_positions=48, pad_token_id=EOT,
                           bos_token_id=EOT, eos_token_id=EOT, decoder_start_token_id=SOT, init_std=0.3,
                           suppress_tokens=None, begin_suppress_tokens=None)
    ref = WhisperForConditionalGeneration(config)
    ref.generation_config = GenerationConfig(decoder_start_token_id=SOT, eos_token_id=EOT, pad_token_id=EOT,
                                             bos_token_id=EOT, **GENERATION[0])
    ref.save_pretrained(tmp_path / "m")
    ref = WhisperForConditionalGeneration.from_pretrained(tmp_path / "m", attn_implementation="eager").eval()
    rng = np.random.default_rng(11)
    t = np.arange(int(44100 * 41.0)) / 44100
    left = 0.3 * np.sin(2 * np.pi * 330 * t * (1 + 0.2 * np.sin(0.5 * t))) + 0.05 * rng.standard_normal(len(t))
    soundfile.write(tmp_path / "s.wav", np.stack([left, 0.5 * left], 1).astype(np.float32), 44100, subtype="FLOAT")
    mono = np.stack([left, 0.5 * left], 1).astype(np.float32).mean(axis=1, dtype=np.float32)
    x = WhisperFeatureExtractor(feature_size=80)(soxr.resample(mono, 44100, 16000, quality="HQ"),
                                                 sampling_rate=16000, truncation=False, padding="longest",
                                                 return_tensors="pt").input_features
    gaps = Gaps()
    with torch.no_grad():
        expected = ref.generate(x, num_beams=1, do_sample=False, language="ko", return_timestamps=True,
                                logits_processor=[gaps])
    mine = qkv.load(tmp_path / "m").transcribe(tmp_path / "s.wav", language="ko")
    assert np.abs(mine.features - x[0].numpy()).max() <= 1e-4
    np.testing.assert_array_equal(mine.ids, expected[0].numpy())
    assert min(gaps.gaps) > 1e-4 and len(mine.windows) >= 2      # not by luck: the logits agree to ~1e-5
