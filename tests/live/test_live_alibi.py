"""Group B — BLOOM, Falcon and MPT against live transformers, on random checkpoints of many shapes.

BLOOM: 4, 5, 6 and 12 heads (ALiBi's slopes for a power of two and not), tied or untied, 1–3 layers.
Falcon: every layout its config allows — RoPE or ALiBi, multi_query (Falcon-7B), the per-head layout and
sequential blocks (Falcon-RW), the new decoder architecture with GQA and one or two norms (Falcon-40B),
biases or none, rope bases and linear scaling, 8 and 12 heads (bfloat16 slopes that are not exact).
MPT: 4, 6 and 12 heads, its softmax_scale or none, tied or untied.
Each is saved, loaded with qkv and compared on a right- and a left-padded batch (hidden states and logits
within 1e-4, attention weights within 1e-5), then greedy generation with and without the KV cache token for
token, a model qkv saves read back by transformers, and the gradients against torch autograd.

transformers' eager Falcon adds ALiBi twice (its SDPA path and the original Falcon-RW once): the reference
strips the second from the mask (make_fixtures.falcon_alibi_once), and a test checks the SDPA logits.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from live_helpers import (build, check_decoder_live, max_abs, padded_batch, save)
from transformers import BloomConfig, BloomForCausalLM, FalconConfig, FalconForCausalLM, MptConfig, MptForCausalLM

import qkv
from qkv.train import gradients

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_fixtures import falcon_alibi_once  # noqa: E402

pytestmark = pytest.mark.live
falcon_alibi_once()

NEW = 8
COMMON = dict(vocab_size=211, initializer_range=0.15, pad_token_id=0, bos_token_id=1, eos_token_id=2,
              attn_implementation="eager")


def bloom(d=64, heads=4, layers=2, tied=True, eps=1e-5):
    return BloomConfig(hidden_size=d, n_head=heads, n_layer=layers, tie_word_embeddings=tied, layer_norm_epsilon=eps,
                       **COMMON)


def falcon(d=64, heads=4, layers=2, **kw):
    return FalconConfig(hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers, max_position_embeddings=128,
                        **{"bias": False, "alibi": False, **kw}, **COMMON)


def mpt(d=64, heads=4, layers=2, tied=True, scale=None):
    return MptConfig(d_model=d, n_heads=heads, n_layers=layers, max_seq_len=64, tie_word_embeddings=tied,
                     attn_config={"softmax_scale": scale}, **COMMON)


BLOOM_CASES = [
    pytest.param(bloom(), id="bloom-h4-tied"),
    pytest.param(bloom(d=48, heads=6, layers=3, tied=False), id="bloom-h6-untied-L3"),
    pytest.param(bloom(d=40, heads=5, layers=1, eps=1e-6), id="bloom-h5-L1-eps1e-6"),
    pytest.param(bloom(d=96, heads=12), id="bloom-h12"),
]
FALCON_CASES = [
    pytest.param(falcon(multi_query=True, parallel_attn=True), id="falcon7b-mqa-parallel-rope"),
    pytest.param(falcon(d=48, heads=6, alibi=True, multi_query=False, parallel_attn=False, bias=True, ffn_hidden_size=80),
                 id="falconrw-alibi-sequential-bias-h6"),
    pytest.param(falcon(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=2, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 5e4}), id="falcon40b-gqa-two-norms-untied"),
    pytest.param(falcon(heads=8, new_decoder_architecture=True, num_kv_heads=1, num_ln_in_parallel_attn=1, alibi=True,
                        activation="relu", layers=3), id="newarch-mqa-one-norm-alibi-relu-L3"),
    pytest.param(falcon(multi_query=True, parallel_attn=False, bias=True, ffn_hidden_size=96,
                        rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
                 id="mqa-sequential-bias-linear-rope"),
    pytest.param(falcon(d=96, heads=12, alibi=True, multi_query=False, parallel_attn=True, activation="gelu"),
                 id="alibi-parallel-h12"),
]
MPT_CASES = [
    pytest.param(mpt(), id="mpt-h4-tied"),
    pytest.param(mpt(d=48, heads=6, tied=False, scale=0.2), id="mpt-h6-untied-softmax_scale0.2"),
    pytest.param(mpt(d=96, heads=12, layers=3), id="mpt-h12-L3"),
]
CASES = ([pytest.param(BloomForCausalLM, *c.values, id=c.id) for c in BLOOM_CASES]
         + [pytest.param(FalconForCausalLM, *c.values, id=c.id) for c in FALCON_CASES]
         + [pytest.param(MptForCausalLM, *c.values, id=c.id) for c in MPT_CASES])


def seeded(request) -> int:
    return zlib.crc32(request.node.callspec.id.encode()) % 10_000


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_family(cls, config, tmp_path, request):
    model = build(cls, config, seed=seeded(request))
    save(model, tmp_path)
    ours = qkv.load(tmp_path)
    assert ours.config.position == ("alibi" if getattr(config, "alibi", True) else "rope")
    check_decoder_live(model, ours, config.vocab_size, request.node.callspec.id, NEW)   # BLOOM: positions from the mask


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_gradients_equal_autograd(cls, config, tmp_path, request):
    model = build(cls, config, seed=seeded(request))
    save(model, tmp_path)
    ids, mask = padded_batch(config.vocab_size, [11, 7, 2], seed=5)
    model.zero_grad()
    labels = torch.tensor(ids).masked_fill(torch.tensor(mask) == 0, -100)
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), labels=labels, use_cache=False)
    out.loss.backward()
    ref = {k: p.grad.numpy() for k, p in model.named_parameters()}
    loss, grads = gradients(qkv.load(tmp_path), ids, mask)
    assert abs(loss - out.loss.item()) < 1e-5
    assert set(grads) == set(ref)
    worst = max((np.linalg.norm(grads[k] - g) / np.linalg.norm(g), k) for k, g in ref.items())
    assert worst[0] < 1e-4, f"{worst[1]}: relative error {worst[0]:.2e}"


@pytest.mark.parametrize(("cls", "config"), [CASES[1], CASES[5], CASES[7], CASES[8], CASES[11]])
def test_a_model_qkv_saves_reads_back_in_transformers(cls, config, tmp_path, request):
    model = build(cls, config, seed=seeded(request))
    save(model, tmp_path / "hf")
    qkv.load(tmp_path / "hf").save(tmp_path / "qkv")
    back = cls.from_pretrained(tmp_path / "qkv", attn_implementation="eager").eval()
    ids = padded_batch(211, [10], seed=3, low=3)[0]
    with torch.no_grad():
        a, b = model(torch.from_numpy(ids)).logits.numpy(), back(torch.from_numpy(ids)).logits.numpy()
    assert max_abs(a, b) < 1e-5


def test_falcon_alibi_equals_transformers_sdpa(tmp_path):
    """The reference Falcon ALiBi (eager, the second bias stripped) is transformers' SDPA path, which generate runs."""
    config = FALCON_CASES[1].values[0]
    model = build(FalconForCausalLM, config, seed=7)
    save(model, tmp_path)
    sdpa = FalconForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    ids, mask = padded_batch(config.vocab_size, [11, 6, 9], seed=11, side="left")
    with torch.no_grad():
        want = sdpa(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    got = qkv.load(tmp_path).forward(ids, mask).logits
    valid = mask.astype(bool)
    assert max_abs(got[valid], want[valid]) <= 1e-4
