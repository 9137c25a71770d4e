"""ALBERT, MPNet, nomic-bert and mBART / Pegasus with untied embeddings against live transformers, on random
checkpoints of other knob values than the committed fixtures'.

Encoders — ALBERT: groups dividing the passes or not (int(p / (L / G)) with L / G = 2.5), layers per group 1–3,
no sharing at all (G = L), E narrower than or as wide as d, tied or untied, gelu_new / relu / gelu, the
pre-training model (its sentence-order head unread); MPNet: 1–3 layers, other widths and heads, gelu_new / relu,
tied or untied, sequences long enough for the logarithmic buckets; nomic-bert: head_dim ≠ d / H, RoPE base and
linear scaling, gelu / silu, tied or untied, one or two token types. Each is saved by transformers, loaded by qkv
and compared on a right- and a left-padded batch (hidden states and logits within 1e-4, attention weights within
1e-5); the masked-LM ones' gradients equal torch autograd's (ALBERT's shared tensors: the sum over the blocks that
read them); a model qkv saves reads back in transformers with equal logits.
Encoder–decoders — mBART, Pegasus (and BART, which reads them alike) with tie_word_embeddings false: forward on
padded batches, greedy ids with and without the KV cache, gradients equal to autograd (each stack's table its own,
lm_head its own), and a fresh qkv model saved and read by transformers (only `shared`, which no forward reads,
missing).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from live_helpers import (INIT_RANGE, TOL_ATTENTION, TOL_HIDDEN, assert_gradients_equal, case_seed,
                          check_encoder_live, check_encoder_saved_by_qkv, check_masked_lm_gradients, max_abs,
                          padded_batch, saved_and_loaded)
from test_live_seq2seq import NEW, bart, build as build_seq2seq, reference
from test_live_seq2seq_families import hf_greedy, mbart, pegasus
from transformers import (AlbertConfig, AlbertForMaskedLM, AlbertForPreTraining, AlbertModel,
                          BartForConditionalGeneration, MBartForConditionalGeneration, MPNetConfig, MPNetForMaskedLM,
                          MPNetModel, NomicBertConfig, NomicBertForMaskedLM, NomicBertModel,
                          PegasusForConditionalGeneration)

import qkv
from qkv.train import gradients

pytestmark = pytest.mark.live


def albert(E=16, d=48, heads=4, layers=4, groups=2, inner=1, ff=64, act="gelu_new", tied=True, types=2, vocab=211):
    return AlbertConfig(vocab_size=vocab, embedding_size=E, hidden_size=d, num_attention_heads=heads,
                        num_hidden_layers=layers, num_hidden_groups=groups, inner_group_num=inner,
                        intermediate_size=ff, hidden_act=act, max_position_embeddings=48, type_vocab_size=types,
                        tie_word_embeddings=tied, initializer_range=INIT_RANGE, pad_token_id=0,
                        attn_implementation="eager")


def mpnet(d=48, heads=4, layers=2, ff=64, act="gelu", tied=True, eps=1e-5, vocab=211):
    return MPNetConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, num_hidden_layers=layers,
                       intermediate_size=ff, hidden_act=act, layer_norm_eps=eps, max_position_embeddings=130,
                       tie_word_embeddings=tied, initializer_range=INIT_RANGE, pad_token_id=1, bos_token_id=0,
                       eos_token_id=2, attn_implementation="eager")


def nomic(d=48, heads=4, head_dim=None, layers=2, ff=64, act="silu", tied=True, types=2, rope=None, vocab=211):
    return NomicBertConfig(vocab_size=vocab, hidden_size=d, num_attention_heads=heads, head_dim=head_dim,
                           num_hidden_layers=layers, intermediate_size=ff, hidden_act=act, max_position_embeddings=64,
                           type_vocab_size=types, tie_word_embeddings=tied, rope_parameters=rope,
                           initializer_range=INIT_RANGE, pad_token_id=0, attn_implementation="eager")


CASES = [
    pytest.param(AlbertForMaskedLM, albert(), id="albert-mlm-L4-G2"),
    pytest.param(AlbertForMaskedLM, albert(E=24, d=32, heads=2, layers=5, groups=2, inner=3, act="relu", tied=False,
                                           types=1), id="albert-mlm-L5-G2-inner3-untied-relu"),
    pytest.param(AlbertModel, albert(E=32, d=32, layers=3, groups=3, act="gelu"), id="albert-model-unshared-E=d"),
    pytest.param(AlbertForPreTraining, albert(E=16, d=48, heads=6, layers=2, groups=1, inner=2),
                 id="albert-pretraining-G1-inner2"),
    pytest.param(MPNetForMaskedLM, mpnet(), id="mpnet-mlm"),
    pytest.param(MPNetForMaskedLM, mpnet(d=48, heads=6, layers=3, act="gelu_new", tied=False),
                 id="mpnet-mlm-L3-untied"),
    pytest.param(MPNetModel, mpnet(d=32, heads=2, layers=1, act="relu", eps=1e-12), id="mpnet-model-h2-relu"),
    pytest.param(NomicBertForMaskedLM, nomic(), id="nomic-mlm"),
    pytest.param(NomicBertForMaskedLM, nomic(d=48, heads=6, head_dim=12, act="gelu", tied=False, types=1,
                                             rope={"rope_type": "default", "rope_theta": 10000.0}),
                 id="nomic-mlm-dk12-untied-gelu-theta1e4"),
    pytest.param(NomicBertModel, nomic(d=32, heads=4, layers=3, rope={"rope_type": "linear", "factor": 2.0,
                                                                       "rope_theta": 500.0}),
                 id="nomic-model-L3-linear2"),
]


@pytest.mark.parametrize(("cls", "config"), CASES)
def test_encoder(cls, config, tmp_path, request):
    model, ours = saved_and_loaded(cls, config, tmp_path, case_seed(request))
    lengths = [40, 25, 33] if config.model_type == "mpnet" else [11, 7, 9]      # MPNet: the far buckets too

    def prediction_logits(ref, ids, mask, tt):
        """ALBERT's pre-training model: its prediction_logits, not the sentence-order scores."""
        if cls is not AlbertForPreTraining:
            return "ref"
        with torch.no_grad():
            return model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                         token_type_ids=torch.from_numpy(tt)).prediction_logits.numpy()

    check_encoder_live(model, ours, config, (("right", lengths), ("left", lengths)), request.node.callspec.id,
                       pad_id=config.pad_token_id, logits=prediction_logits)


NOMIC = (("layers.", "encoder.layers."), ("embeddings.LayerNorm", "emb_ln"), ("self_attn.o_proj", "attn.out_proj"),
         ("up_proj", "fc11"), ("gate_proj", "fc12"), ("down_proj", "fc2"), ("post_attention_layernorm", "norm1"),
         ("post_mlp_layernorm", "norm2"))


def file_names(grads: dict[str, np.ndarray], model_type: str) -> dict[str, np.ndarray]:
    """torch's gradients under the checkpoint file's names: nomic-bert's as transformers saves them (q, k, v joined
    as attn.Wqkv, the mapping's other names); the others' as they are."""
    if model_type != "nomic_bert":
        return grads
    out = {}
    for key, g in grads.items():
        if ".self_attn.k_proj." in key or ".self_attn.v_proj." in key:
            continue
        if ".self_attn.q_proj." in key:
            g = np.concatenate([grads[key.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")])
            key = key.replace("self_attn.q_proj", "attn.Wqkv")
        for old, new in NOMIC:
            key = key.replace(old, new)
        out[key] = g
    return out


@pytest.mark.parametrize(("cls", "config"), [c for c in CASES if c.values[0].__name__.endswith("ForMaskedLM")])
def test_masked_lm_gradients_equal_autograd(cls, config, tmp_path, request):
    """Loss within 1e-5, each gradient within 1e-4 relative error (or 1e-6 absolute where it is 0 but for rounding);
    ALBERT's stored layers read by several blocks: one gradient, their sum."""
    check_masked_lm_gradients(cls, config, tmp_path, case_seed(request), [12, 8, 10], names=file_names)


@pytest.mark.parametrize(("cls", "config"), [
    pytest.param(AlbertForMaskedLM, albert(layers=3, groups=2, inner=2, tied=False), id="albert"),
    pytest.param(MPNetForMaskedLM, mpnet(tied=False), id="mpnet"),
    pytest.param(NomicBertForMaskedLM, nomic(head_dim=16, tied=False), id="nomic_bert"),
])
def test_a_model_qkv_saves_reads_back_in_transformers(cls, config, tmp_path):
    unused = {"predictions.bias", "lm_head.bias", "cls.predictions.bias"}    # untied: the head's bias no forward reads
    check_encoder_saved_by_qkv(cls, config, tmp_path, [10, 7], allowed_missing=unused)


# ── mBART and Pegasus with untied embeddings ──────────────────────────────────────

UNTIED = [
    pytest.param(MBartForConditionalGeneration, mbart(tie_word_embeddings=False), id="mbart-untied"),
    pytest.param(MBartForConditionalGeneration, mbart(d=40, heads=5, enc=1, dec=3, act="relu", scale=False, start=2,
                                                      tie_word_embeddings=False), id="mbart-untied-1x3-unscaled"),
    pytest.param(PegasusForConditionalGeneration, pegasus(tie_word_embeddings=False), id="pegasus-untied"),
    pytest.param(PegasusForConditionalGeneration, pegasus(d=36, heads=3, enc=3, dec=1, act="gelu",
                                                          tie_word_embeddings=False), id="pegasus-untied-d36-3x1"),
    pytest.param(BartForConditionalGeneration, bart(tie_word_embeddings=False), id="bart-untied"),
]


@pytest.mark.parametrize(("cls", "config"), UNTIED)
def test_untied_forward_and_greedy(cls, config, tmp_path):
    seed = sum(map(ord, f"{cls.__name__}{config.d_model}untied"))
    model = build_seq2seq(cls, config, seed)
    assert model.model.encoder.embed_tokens.weight.data_ptr() != model.model.decoder.embed_tokens.weight.data_ptr()
    model.save_pretrained(tmp_path)
    ours = qkv.load(tmp_path)
    assert not ours.config.tied_embeddings
    V, pad = config.vocab_size, config.pad_token_id
    start = config.decoder_start_token_id if config.decoder_start_token_id is not None else config.bos_token_id
    for side in ("right", "left"):
        ids, mask = padded_batch(V - 1, [9, 6, 3], seed + 2, low=3, side=side, pad_id=pad)
        dec, dec_mask = padded_batch(V - 1, [6, 4, 6], seed + 3, low=3, pad_id=pad)
        dec[:, 0] = start
        ref = reference(model, ids, mask, dec, dec_mask)
        out = ours.forward(ids, mask, dec, dec_mask)
        src, tgt = mask.astype(bool), dec_mask.astype(bool)
        assert max_abs(out.logits[tgt], ref["logits"][tgt]) <= TOL_HIDDEN
        assert max_abs(out.encoder_hidden[src], ref["encoder_hidden"][src]) <= TOL_HIDDEN
        for name, rows in (("encoder_attentions", src), ("attentions", tgt), ("cross_attentions", tgt)):
            got = getattr(out, name)
            assert max(max_abs(got[:, b][:, :, rows[b]], ref[name][:, b][:, :, rows[b]]) for b in range(3)) <= \
                TOL_ATTENTION, name
    greedy = hf_greedy(model, ids, mask, None)
    for cache in (True, False):
        got = ours.generate(ids, NEW, attention_mask=mask, temperature=0, stop_at_eos=False, use_cache=cache)
        assert got.tolist() == greedy.tolist(), cache


@pytest.mark.parametrize(("cls", "config"), UNTIED)
def test_untied_gradients_equal_autograd(cls, config, tmp_path):
    """Each stack's table gets its own gradient, lm_head its own; `shared` (read by no forward) none, as torch's."""
    model = build_seq2seq(cls, config, 7)
    model.save_pretrained(tmp_path)
    V, pad = config.vocab_size, config.pad_token_id
    ids, mask = padded_batch(V - 1, [8, 5, 7], 13, low=3, pad_id=pad)
    labels = np.random.default_rng(2).integers(3, V - 1, size=(3, 6))
    labels[2, 4:] = -100
    model.zero_grad()
    out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), labels=torch.from_numpy(labels),
                use_cache=False)
    out.loss.backward()
    sinusoids = config.model_type == "pegasus"
    ref = {k: p.grad.numpy() for k, p in model.named_parameters()
           if p.grad is not None and not (sinusoids and "embed_positions" in k)}
    loss, grads = gradients(qkv.load(tmp_path), ids, mask, labels=labels)
    assert abs(loss - out.loss.item()) < 1e-5
    assert "model.shared.weight" not in ref
    assert_gradients_equal(grads, ref)


@pytest.mark.parametrize(("cls", "make"), [(MBartForConditionalGeneration, mbart),
                                           (PegasusForConditionalGeneration, pegasus),
                                           (BartForConditionalGeneration, bart)])
def test_untied_fresh_model_loads_in_transformers(cls, make, tmp_path):
    """qkv.init of an untied config, saved: transformers reads every tensor qkv writes (only `shared`, which no forward
    reads, is missing) and computes the same logits."""
    config = make(tie_word_embeddings=False).to_dict()
    fresh = qkv.init(config, seed=5, initializer_range=0.2)
    assert not np.shares_memory(fresh.weights.encoder.tok_embed, fresh.weights.decoder.tok_embed)
    fresh.save(tmp_path / "m")
    model, info = cls.from_pretrained(tmp_path / "m", attn_implementation="eager", output_loading_info=True)
    assert set(info["missing_keys"]) == {"model.shared.weight"} and not info["unexpected_keys"], info
    ids, mask = padded_batch(config["vocab_size"] - 1, [8, 5], 11, low=3, pad_id=config["pad_token_id"])
    dec = np.array([[fresh.start_token, 5, 6, 7]] * 2)
    ref = reference(model.eval(), ids, mask, dec, np.ones_like(dec))
    assert max_abs(fresh.forward(ids, mask, dec).logits, ref["logits"]) <= TOL_HIDDEN
