"""ESM-2 against live transformers, on random checkpoints of other knob values than the committed fixture's: 1–3
layers, 2–6 heads, token_dropout on or off (a batch whose rows 0 and 2 hold <mask>, 32, and 1 none), the
embeddings' LayerNorm (emb_layer_norm_before, ESM-1b's) or none, RoPE bases 10 000 and 500, LayerNorm ε 1e-5 and
1e-12, a tied or untied head, EsmModel (no head, its pooler unread). Each is saved by transformers, loaded by qkv and
compared on a right- and a left-padded batch (hidden states and logits within 1e-4, attention weights within
1e-5); the contact map equals EsmModel.predict_contacts on the right-padded batch (1e-5); a masked LM qkv saves
reads back in transformers with equal logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import (case_seed, check_encoder_live, check_encoder_saved_by_qkv, compare, max_abs, padded_batch,
                          run_reference, saved_and_loaded)
from transformers import EsmConfig, EsmForMaskedLM, EsmModel

from qkv.analysis.contacts import contact_features, predict

pytestmark = pytest.mark.live


def esm(d=48, heads=4, layers=2, ff=64, dropout=True, before=False, theta=10000.0, eps=1e-5, tied=True):
    return EsmConfig(vocab_size=33, hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers,
                     intermediate_size=ff, max_position_embeddings=64, position_embedding_type="rotary",
                     rope_theta=theta, token_dropout=dropout, mask_token_id=32, pad_token_id=1,
                     emb_layer_norm_before=before, layer_norm_eps=eps, tie_word_embeddings=tied,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.15,
                     attn_implementation="eager")


CASES = [
    pytest.param(EsmForMaskedLM, esm(), id="mlm-L2-h4-dropout"),
    pytest.param(EsmForMaskedLM, esm(heads=6, layers=3, dropout=False, before=True, theta=500.0, eps=1e-12,
                                     tied=False), id="mlm-L3-h6-norm-before-untied-theta500"),
    pytest.param(EsmModel, esm(d=32, heads=2, layers=1), id="model-L1-h2"),
]
LENGTHS = [13, 7, 10]


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_encoder_and_contacts(cls, config, tmp_path, request):
    model, ours = saved_and_loaded(cls, config, tmp_path, case_seed(request))
    assert ours.config.embed_norm == config.emb_layer_norm_before
    assert (ours.config.mask_dropout_id is not None) == config.token_dropout
    check_encoder_live(model, ours, config, (("right", LENGTHS), ("left", LENGTHS)), request.node.callspec.id,
                       pad_id=1)
    ids, mask = padded_batch(33, LENGTHS, seed=11, low=5, pad_id=1)
    ids[:, 0] = 0                                              # <cls> … <eos> as the tokenizer makes them
    ids[np.arange(len(LENGTHS)), np.array(LENGTHS) - 1] = 2
    ids[0, 3] = ids[0, 8] = ids[2, 4] = 32                     # <mask>: token_dropout rescales rows 0 and 2
    compare(ours.forward(ids, mask), run_reference(model, ids, mask), mask, label=f"{request.node.callspec.id}-masks")
    with torch.no_grad():
        want = model.predict_contacts(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    out = ours.forward(ids, mask)
    w = ours.weights
    assert max_abs(predict(contact_features(out.attentions, ids, mask), w.W_contact, w.b_contact), want) <= 1e-5


@pytest.mark.parametrize("config", [esm(), esm(heads=2, before=True, tied=False)], ids=["tied", "untied-norm"])
def test_a_model_qkv_saves_reads_back_in_transformers(config, tmp_path):
    check_encoder_saved_by_qkv(EsmForMaskedLM, config, tmp_path, [11, 7])


@pytest.mark.parametrize("config", [esm(), esm(heads=2, before=True, tied=False)], ids=["tied", "untied-norm"])
def test_masked_lm_gradients_equal_autograd(config, tmp_path, request):
    """A batch holding <mask> (token_dropout's factor per row, 0 on <mask>, 1/(1 − r) elsewhere): the loss within
    1e-5 and every parameter's gradient within 1e-4 relative error of torch autograd's (or 1e-6 absolute), under the
    same names (the contact head, which the loss does not read, has none in either)."""
    from qkv.train import gradients

    model, ours = saved_and_loaded(EsmForMaskedLM, config, tmp_path, case_seed(request))
    ids, mask = padded_batch(33, [12, 8], seed=4, low=4, pad_id=1)
    labels = np.where(mask == 1, ids, -100)
    ids[0, 2] = ids[1, 5] = 32                                 # <mask>: token_dropout's factor per row
    labels[:, ::3] = -100
    loss, grads = gradients(ours, ids, mask, labels=labels)
    out = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), labels=torch.from_numpy(labels))
    out.loss.backward()
    ref = {k: p.grad.numpy() for k, p in model.named_parameters() if p.grad is not None}
    assert abs(loss - out.loss.item()) < 1e-5 and set(grads) == set(ref)
    for key, g in ref.items():
        assert np.linalg.norm(grads[key] - g) / np.linalg.norm(g) < 1e-4 or max_abs(grads[key], g) < 1e-6, key
