"""The speech task's tokenizer (qkv.train.speech) against live transformers: WhisperTokenizer, reading the files
the task writes, encodes a transcript to the ids qkv's tokenizer gives and decodes them back."""

from __future__ import annotations

import json

from transformers import WhisperTokenizer

from qkv.train import speech


def test_whisper_tokenizer_reads_the_task_s_files(tmp_path):
    tok = speech.whisper_tokenizer()
    (tmp_path / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(speech.tokenizer_config()), encoding="utf-8")
    hf = WhisperTokenizer.from_pretrained(tmp_path)
    full = tok.encode(" three one four").ids
    assert hf(" three one four").input_ids == full
    assert hf.decode(full, skip_special_tokens=True) == " three one four"
