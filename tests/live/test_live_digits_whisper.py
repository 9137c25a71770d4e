"""digits-whisper (the tiny Whisper qkv trains and ships) read by live transformers: WhisperProcessor reads its folder,
WhisperForConditionalGeneration writes the same ids from each example utterance, and its token timestamps
(generate(return_token_timestamps=True) over the generation config's alignment heads, the sound's frames as the
attention_mask) equal qkv's within one 20 ms frame."""

from __future__ import annotations

import json

import numpy as np
import soundfile
import torch
from transformers import WhisperForConditionalGeneration, WhisperProcessor

import qkv
from qkv.checkpoints import speech_dir
from qkv.writing.timestamps import token_timestamps


def test_transformers_writes_and_times_the_examples_as_qkv():
    folder = speech_dir()
    processor = WhisperProcessor.from_pretrained(folder)
    ref = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    ours = qkv.load("digits-whisper")
    examples = json.loads((folder / "examples.json").read_text())
    for e in examples:
        samples, rate = soundfile.read(folder / e["file"], dtype="float32")
        assert rate == 16_000
        inputs = processor(samples, sampling_rate=rate, return_tensors="pt", return_attention_mask=True)
        with torch.no_grad():
            found = ref.generate(inputs.input_features, attention_mask=inputs.attention_mask, num_beams=1,
                                 do_sample=False, return_token_timestamps=True)
        result = ours.transcribe(folder / e["file"])
        np.testing.assert_array_equal(result.ids, found["sequences"][0].numpy())
        assert processor.decode(found["sequences"][0], skip_special_tokens=True).strip() == e["text"]
        mine, want = token_timestamps(result), found["token_timestamps"][0].numpy()
        assert mine.shape == want.shape and np.abs(mine - want).max() <= 0.02 + 1e-6, e["file"]
