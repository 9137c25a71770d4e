"""qkv attribute against torch autograd and Captum (make test-live), on random decoders that are not the
committed fixtures: the shapes of test_live_reference (GPT-2 tied/untied, Llama MHA/GQA/MQA, head_dim ≠ d/H,
attention biases, …) and of test_live_families (GPT-NeoX, Phi).

    gradient × input   qkv = Σ_d e·∂z/∂e with e the embedding module's output (a forward hook), torch autograd,
                       within 1e-4 of the largest Σ_d |e·∂z/∂e| (float32)
    ig                 qkv = Captum's IntegratedGradients of z as a function of the embeddings (inputs_embeds),
                       zero baseline, method "gausslegendre", 64 steps (the same nodes: `tolerance=0`, no
                       refinement), within 1e-4 of the largest |score|; both miss z(e) − z(0) by the same
                       amount (Captum's convergence delta)
"""

from __future__ import annotations

import copy
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch  # module-level imports: without the reference stack these tests fail, never skip
from captum.attr import IntegratedGradients
from transformers import GPT2LMHeadModel, GPTNeoXForCausalLM, PhiForCausalLM

import qkv
from qkv.analysis.input_attribution import attribute

from live_helpers import build, save
from test_live_families import CASES as NEOX_CASES, PHI_CASES
from test_live_reference import DECODER_CASES, GPT2_CASES, decoder_config, gpt2_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from make_attribution_fixtures import grads as embedding_grads  # noqa: E402

pytestmark = pytest.mark.live

FAMILY_CASES = ([pytest.param(GPTNeoXForCausalLM, *c.values, id=c.id) for c in NEOX_CASES]
                + [pytest.param(PhiForCausalLM, *c.values, id=c.id) for c in PHI_CASES])
LENGTH = 10


def check(model: torch.nn.Module, directory, seed: int, ig: bool) -> None:
    save(model, directory)
    ours = qkv.load(directory)
    ids = np.random.default_rng(seed).integers(3, model.config.vocab_size, LENGTH)
    x = torch.tensor(ids[None])
    with torch.no_grad():
        target = int(model(x).logits[0, -1].argmax())
    e, g = embedding_grads(model, x, target, None)             # the fixtures' own reference (torch autograd)
    a = attribute(ours, ids.tolist(), target, method="grad-x-input")
    assert a.target == target
    assert np.abs(a.scores - (e * g).sum(-1)).max() <= 1e-4 * np.abs(e * g).sum(-1).max()
    if not ig:
        return
    ig_ref = IntegratedGradients(lambda emb: model(inputs_embeds=emb).logits[:, -1, target])
    emb = torch.tensor(e[None])
    ref, delta = ig_ref.attribute(emb, baselines=torch.zeros_like(emb), n_steps=64,
                                  method="gausslegendre", return_convergence_delta=True)
    want = ref[0].sum(-1).detach().numpy()
    b = attribute(ours, ids.tolist(), target, method="ig", steps=64, keep_first=False,   # as Captum: every row
                  tolerance=0)                                                          # moves, 64 nodes kept
    assert np.abs(b.scores - want).max() <= 1e-4 * np.abs(want).max() + 1e-6
    gap = b.logit - b.baseline_logit                       # Captum's delta: Σ scores − (z(e) − z(0))
    assert abs((b.scores.sum() - gap) - float(delta[0])) <= 1e-3 * max(abs(gap), 1e-3)


@pytest.mark.parametrize("case", GPT2_CASES)
def test_gpt2(case, tmp_path):
    cfg = gpt2_config(case["d"], case["heads"], case.get("layers", 2), case["act"], case.get("inner"),
                      case["tied"], case.get("eps", 1e-5))
    check(build(GPT2LMHeadModel, cfg, seed=300 + case["d"]), tmp_path, 5, ig=True)


@pytest.mark.parametrize(("cls", "config_cls", "kw", "lengths"), DECODER_CASES)
def test_decoder(cls, config_cls, kw, lengths, tmp_path, request):
    cfg = decoder_config(config_cls, **copy.deepcopy(kw))
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    check(build(cls, cfg, seed=seed), tmp_path, seed, ig=request.node.callspec.indices["cls"] < 3)


@pytest.mark.parametrize(("cls", "config"), FAMILY_CASES)
def test_families(cls, config, tmp_path, request):
    seed = zlib.crc32(request.node.callspec.id.encode()) % 10_000
    check(build(cls, config, seed=seed), tmp_path, seed, ig=False)


# ── encoder–decoders: random Marian and BART configs (test_live_seq2seq_grads's) ────────────────────────

from test_live_seq2seq_grads import CASES as SEQ2SEQ_CASES, random_seq2seq  # noqa: E402


@pytest.mark.parametrize("cls, config_cls, kw", SEQ2SEQ_CASES)
def test_encoder_decoders(cls, config_cls, kw, tmp_path):
    """gradient × input over the source's and the target's tokens equals autograd's through each stack's
    embedding module (the fixture script's `seq2seq` reference, on a random checkpoint saved here)."""
    from make_attribution_fixtures import seq2seq_reference

    model = random_seq2seq(cls, config_cls, kw, seed=2)
    directory = tmp_path / "model"
    model.save_pretrained(directory)
    ref = seq2seq_reference(model)
    a = attribute(qkv.load(directory), ref["input_ids"].tolist(), prefix=ref["decoder_ids"][1:].tolist())
    assert a.target == int(ref["target"])
    n = len(ref["input_ids"])
    for side, got in (("source", a.scores[:n]), ("target", a.scores[n:])):
        e, g = ref[f"{side}_embeddings"], ref[f"{side}_grad"]
        assert np.abs(got - (e * g).sum(-1)).max() <= 1e-4 * np.abs(e * g).sum(-1).max(), side
