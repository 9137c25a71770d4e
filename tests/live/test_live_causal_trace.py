"""qkv trace-fact against ROME's hooks in transformers (make test-live), on random decoders deeper than the
committed fixtures (6 layers, so a window restores some layers and not others): every restored P(answer)
within 1e-5, for windows of 1, 3 and the paper's 10 (the fixture script's `reference`)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch  # noqa: F401  module-level: without the reference stack these tests fail, never skip
from transformers import GPT2LMHeadModel, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

import qkv
from qkv.analysis.causal_trace import trace_tokens

from live_helpers import build, save
from test_live_families import CASES as NEOX_CASES
from test_live_reference import decoder_config, gpt2_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_causal_trace_fixtures import reference  # noqa: E402

pytestmark = pytest.mark.live
WINDOWS = (1, 3, 10)


def check(model, directory) -> None:
    save(model, directory)
    ref = reference(model, seed=3, windows=WINDOWS)
    ours = qkv.load(directory)
    for w in WINDOWS:
        r = trace_tokens(ours, ref["input_ids"], tuple(ref["span"]), ref["noise"], window=w)
        assert r.answer == int(ref["answer"]) and abs(r.p_corrupted - ref["p_corrupted"]) <= 1e-5
        for kind, key in (("hidden", "hidden"), ("ffn", f"ffn_w{w}"), ("attn", f"attn_w{w}")):
            assert np.abs(r.tables[kind] - ref[key]).max() <= 1e-5, (w, kind)


def test_gpt2_six_layers(tmp_path):
    check(build(GPT2LMHeadModel, gpt2_config(64, 4, 6, "gelu_new", None, True, 1e-5), seed=41), tmp_path)


def test_llama_gqa_six_layers(tmp_path):
    cfg = decoder_config(LlamaConfig, heads=8, kv=2, layers=6, tie_word_embeddings=False)
    check(build(LlamaForCausalLM, cfg, seed=42), tmp_path)


def test_gpt_neox_parallel(tmp_path):
    config = NEOX_CASES[0].values[0]
    config.num_hidden_layers = 6
    check(build(GPTNeoXForCausalLM, config, seed=43), tmp_path)
