"""GGUF files of Apertus, Qwen3-Next and Llama 4's text model (llama.cpp's `apertus`, `qwen3next`, `llama4`) against
live transformers (make test-live).

Random checkpoints of knob values the committed fixtures do not have (Apertus: another llama3 RoPE, MQA, xIELU's β and
ε away from their defaults, plain RoPE; Qwen3-Next: one key head for four value heads, conv taps 2, every third layer
full, the current converter's attn_qkv / attn_gate; two key heads of two value heads, every other layer full; Llama
4: llama.cpp's fixed chunk, NoPE layer and temperature with a llama3 RoPE, every other layer routed; 128 experts
without q/k norms) are built with transformers, saved, written as llama.cpp's convert_hf_to_gguf.py lays them out
(tests/fixtures/gguf_convert.py), and qkv.load(file.gguf) is compared with transformers on the directory as the
families' own live tests compare it (right- and left-padded batches within 1e-4 / 1e-5 at the real positions, greedy
ids with and without the cache, token for token).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import test_live_llama4 as L4
import test_live_qwen3_next as Q
from live_helpers import build, case_seed, check_decoder_live, hf_greedy, padded_batch, save
from test_live_exaone4_seed_hunyuan_apertus import _other_xielu_constants, apertus
from transformers import ApertusForCausalLM, Llama4ForCausalLM, Qwen3NextForCausalLM

import qkv

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
import gguf_convert as C  # noqa: E402

pytestmark = pytest.mark.live

NEW = 8
V = 300                                     # gguf_convert writes a tokenizer of 260 ids: the vocabulary holds them
LLAMA3 = {"rope_type": "llama3", "rope_theta": 2e4, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 3.0,
          "original_max_position_embeddings": 24}

APERTUS = [
    pytest.param(apertus(layers=2, kv=1, vocab=V, rope_parameters=LLAMA3), id="apertus-llama3-mqa"),
    pytest.param(apertus(vocab=V, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
                 id="apertus-plain-rope"),
]
QWEN3_NEXT = [
    pytest.param((Q.qwen3_next([Q.LIN, Q.LIN, Q.FULL], H=2, kv=1, hk=1, hv=4, conv=2, vocab=V), 3, True),
                 id="qwen3next-one-key-head-conv2-interval3-newer-layout"),
    pytest.param((Q.qwen3_next([Q.LIN, Q.FULL, Q.LIN, Q.FULL], hk=2, hv=2, dk=8, dv=8, top=1, vocab=V), 2, False),
                 id="qwen3next-every-other-full-top1-ssm-in"),
]
LLAMA4 = [
    pytest.param(L4.llama4(vocab=V, interleave_moe_layer_step=2, rope=LLAMA3), id="llama4-llama3-step2"),
    pytest.param(L4.llama4(vocab=V, layers=4, E=128, k=2, f=8, use_qk_norm=False), id="llama4-128-experts-no-qk-norm"),
]


def _greedy(model, ours) -> None:
    prompt = padded_batch(V, [9], 12, low=3)[0]
    want = hf_greedy(model, prompt, NEW)
    assert np.array_equal(ours.generate(prompt, NEW, temperature=0, stop_at_eos=False), want)
    assert np.array_equal(ours.generate(prompt, NEW, temperature=0, stop_at_eos=False, use_cache=False), want)


@pytest.mark.parametrize("config", APERTUS)
def test_apertus_gguf_equals_transformers(config, tmp_path, request):
    """The file of transformers' seeded Apertus (xIELU's numbers as metadata, the llama3 RoPE as rope_freqs):
    transformers' numbers on padded batches, its greedy ids with and without the cache."""
    model = build(ApertusForCausalLM, config, seed=case_seed(request))
    _other_xielu_constants(model)
    save(model, tmp_path / "hf")
    ours = qkv.load(C.convert(tmp_path / "hf", tmp_path / "model.gguf"))
    assert float(ours.weights.blocks[1].ffn.xielu.beta) == pytest.approx(0.4)
    check_decoder_live(model, ours, V, request.node.callspec.id, NEW)


@pytest.mark.parametrize("case", QWEN3_NEXT)
def test_qwen3next_gguf_equals_transformers(case, tmp_path, request):
    """The file of transformers' seeded Qwen3-Next (its full layers every INTERVAL-th, written in either layout):
    transformers' numbers on padded batches, its greedy ids with and without the cache."""
    config, interval, newer = case
    seed = case_seed(request)
    model = build(Qwen3NextForCausalLM, config, seed)
    save(model, tmp_path / "hf")
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(hf | {"full_attention_interval": interval}))
    ours = qkv.load(C.convert(tmp_path / "hf", tmp_path / "model.gguf", fused=newer))
    for side in ("right", "left"):
        Q.check_batch(model, ours, V, side, seed + 2, Q.TOLS)
    _greedy(model, ours)


@pytest.mark.parametrize("config", LLAMA4)
def test_llama4_gguf_equals_transformers(config, tmp_path, request):
    """The file of transformers' seeded Llama 4 (llama.cpp's chunk, NoPE layer and temperature, Llama4TextConfig's
    defaults): transformers' numbers on padded batches, its greedy ids with and without the cache."""
    model = build(Llama4ForCausalLM, config, seed=case_seed(request))
    save(model, tmp_path / "hf")
    ours = qkv.load(C.convert(tmp_path / "hf", tmp_path / "model.gguf"))
    assert ours.config.no_rope_layers == (3,) and ours.config.attention_chunk == 8192
    L4.check_padded_and_greedy(model, ours, config, request.node.callspec.id)
