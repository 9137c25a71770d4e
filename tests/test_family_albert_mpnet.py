"""ALBERT (layers shared by groups, factorised embeddings), MPNet (T5's relative buckets in every layer), nomic-bert
(RoPE, SwiGLU, post-norm) and mBART / Pegasus with untied embeddings against transformers' committed references
(tests/fixtures/make_fixtures.py, make_seq2seq_fixtures.py): the encoders' padded batch and every layer are in
test_families.py; here left padding, one longer sequence with the masked-LM logits, ALBERT's shared layers held
once and trained as one tensor (gradients against torch autograd, grads/<name>.npz), the knobs refused in one line,
a save read back, and the CLI; then the untied encoder–decoders' forward, cache step, greedy ids and gradients."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import qkv
from qkv import QkvError
from qkv.checkpoints.families import family_of, weights_from_tensors
from conftest import (MODELS, TOL_ATTENTION, TOL_HIDDEN, check_encoder_saved_reads_back, check_gradients,
                      check_left_padding, check_single_sequence, edited, max_abs, reference, run_main)

NAMES = ("albert", "mpnet", "nomic_bert")


@pytest.mark.parametrize("name", NAMES)
def test_left_padding_and_a_longer_sequence_equal_the_reference(name):
    check_left_padding(name, logits=True)
    check_single_sequence(name, logits=True)


def test_albert_runs_each_stored_layer_where_transformers_does():
    """3 passes over 2 groups of 2 layers: passes 0, 1 run group 0 (int(p / 1.5)), pass 2 group 1, each group's
    layers in turn: 6 blocks, the attentions and hidden states of each as transformers records them."""
    cfg = qkv.load(MODELS / "albert").config
    assert (cfg.n_layers, cfg.shared_groups, cfg.group_depth, cfg.embed_dim) == (6, 2, 2, 24)
    assert [cfg.stored_layer(j) for j in range(6)] == [0, 1, 0, 1, 2, 3]
    assert reference("albert")["attentions"].shape[0] == 6 and reference("albert")["hidden_states"].shape[0] == 7


def test_albert_blocks_of_one_stored_layer_hold_the_same_arrays():
    """No weight is copied: blocks 0 and 2 read stored layer 0's very arrays (each block its own tree)."""
    w = qkv.load(MODELS / "albert").weights
    b0, b2, b1 = w.blocks[0], w.blocks[2], w.blocks[1]
    assert b0 is not b2
    for a, b in ((b0.attn.W_Q, b2.attn.W_Q), (b0.ffn.W_out, b2.ffn.W_out), (b0.ffn_norm.weight, b2.ffn_norm.weight)):
        assert a is b
    assert not np.shares_memory(b0.attn.W_Q, b1.attn.W_Q)
    assert w.W_embed.shape == (24, 32) and w.W_head.shape == (32, 24) and np.shares_memory(w.W_vocab, w.tok_embed)
    from safetensors.numpy import load_file

    stored = load_file(str(MODELS / "albert" / "model.safetensors"))
    assert w.nbytes() == sum(t.nbytes for t in stored.values())      # each stored layer's bytes counted once


def test_mpnet_adds_its_relative_bias_to_every_layer():
    """The table (32 buckets, H) is read: without it the logits move far from transformers'."""
    ref = reference("mpnet")
    model = qkv.load(MODELS / "mpnet")
    cfg = model.config
    assert model.weights.rel_bias.shape == (32, cfg.n_heads) and (cfg.relative_buckets, cfg.relative_max_distance) == (
        32, 128)
    assert (cfg.positions_from_ids, cfg.position_offset, cfg.pad_token_id) == (True, 2, 1)
    model.weights.rel_bias = np.zeros_like(model.weights.rel_bias)
    assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) > 1e-2


def test_nomic_bert_reads_the_fused_file_and_turns_q_and_k():
    """Wqkv's rows are [Q; K; V] (views); fc12 is the gate, fc11 the up projection; RoPE base 1000, d_k 12."""
    model = qkv.load(MODELS / "nomic_bert")
    cfg, b = model.config, model.weights.blocks[0]
    knobs = (cfg.position, cfg.rope_theta, cfg.d_head, cfg.gated_ffn, cfg.norm_place)
    assert knobs == ("rope", 1000.0, 12, True, "post")
    from safetensors.numpy import load_file

    stored = load_file(str(MODELS / "nomic_bert" / "model.safetensors"))
    qkv_rows, layer = stored["nomic_bert.encoder.layers.0.attn.Wqkv.weight"], "nomic_bert.encoder.layers.0.mlp."
    for i, W in enumerate((b.attn.W_Q, b.attn.W_K, b.attn.W_V)):
        np.testing.assert_array_equal(W, qkv_rows[48 * i:48 * (i + 1)].T)
    np.testing.assert_array_equal(b.ffn.W_gate, stored[layer + "fc12.weight"].T)
    np.testing.assert_array_equal(b.ffn.W_in, stored[layer + "fc11.weight"].T)
    assert b.attn.b_Q is None and b.attn.b_O is None and b.ffn.b_in is None
    assert model.weights.pos_embed is None and model.weights.type_embed.shape == (2, 32)


def test_nomic_bert_reads_nomic_bert_config_defaults():
    """A config.json that leaves the sizes out (nomic-embed-text's names them n_embd, n_layer, …) reads
    NomicBertConfig's defaults, as transformers does: 768 wide, 12 layers and heads, 3072, SwiGLU (silu), RoPE 1000."""
    from qkv.checkpoints.families import config_of

    cfg = config_of({"model_type": "nomic_bert", "n_embd": 768, "activation_function": "swiglu"})
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_ff, cfg.vocab_size) == (768, 12, 12, 3072, 30528)
    assert (cfg.activation, cfg.rope_theta, cfg.max_positions, cfg.norm_eps) == ("silu", 1000.0, 2048, 1e-12)


def test_mpnet_left_padding_equals_the_row_alone():
    """Positions count the ids that are not pads (as RoBERTa's); the relative bias counts every position, so a
    row's real tokens keep their distances to one another whatever pads come first."""
    ref = reference("mpnet")
    model = qkv.load(MODELS / "mpnet")
    real = ref["left_attention_mask"][0].astype(bool)
    alone = model.forward(ref["left_input_ids"][:, real])
    padded = model.forward(ref["left_input_ids"], ref["left_attention_mask"])
    assert max_abs(padded.logits[0, real], alone.logits[0]) <= TOL_HIDDEN


@pytest.mark.parametrize("name", NAMES)
def test_gradients_equal_autograd(name):
    """grads/<name>.npz: transformers' *ForMaskedLM loss and torch autograd's gradient of every parameter, within
    1e-4 relative error (or 1e-6 absolute for a gradient that is 0 but for rounding: K's bias). ALBERT's stored
    layers get the sum over the blocks that read them (stored layer 0: blocks 0 and 2), MPNet's table every
    layer's dB by bucket."""
    check_gradients(qkv.load(MODELS / name), name, labels=True, atol=1e-6)


def test_albert_shared_gradient_is_the_sum_not_one_use():
    """The one-block gradient alone (what summing nothing would give) is far from autograd's."""
    from qkv.core.backward import backward, taped
    from qkv.train.backprop import masked_lm_targets, token_loss

    ref = np.load(MODELS.parent / "grads" / "albert.npz")
    model = qkv.load(MODELS / "albert")
    targets, counted = masked_lm_targets(ref["labels"], ref["input_ids"])
    g_ref = ref["grad.albert.encoder.albert_layer_groups.0.albert_layers.0.attention.query.weight"]
    found = {}
    for shared in (True, False):                                    # False: each block's gradient on its own
        cfg = model.config if shared else model.config.with_(shared_groups=0, group_depth=1)
        h, logits, tape = taped(model.weights, cfg, ref["input_ids"], ref["attention_mask"])
        _, dlogits = token_loss(logits, targets, counted)
        found[shared] = backward(dlogits, h, logits, model.weights, cfg, tape)
    assert found[True].blocks[0] is found[True].blocks[2]           # one tree per stored layer
    np.testing.assert_allclose(found[True].blocks[0].attn.W_Q.T, g_ref, rtol=1e-3, atol=1e-6)
    alone = found[False].blocks[0].attn.W_Q.T
    assert np.linalg.norm(alone - g_ref) > 0.1 * np.linalg.norm(g_ref)
    np.testing.assert_allclose(alone + found[False].blocks[2].attn.W_Q.T, g_ref, rtol=1e-3, atol=1e-6)


def test_albert_trains_its_shared_tensor_in_place():
    """Weights over a dict of tensors (what training updates) read each stored tensor once: a step on it moves
    every block that reads it."""
    model = qkv.load(MODELS / "albert")
    params = {k: np.array(v) for k, v in family_of("albert").tensors(model.weights, model.config).items()}
    w = weights_from_tensors(params, model.config)
    name = "albert.encoder.albert_layer_groups.0.albert_layers.0.attention.query.weight"
    assert all(np.shares_memory(w.blocks[j].attn.W_Q, params[name]) for j in (0, 2))
    params[name] += 1.0
    assert w.blocks[2].attn.W_Q[0, 0] == params[name][0, 0]


@pytest.mark.parametrize("name, change, message", [
    ("albert", {"num_hidden_groups": 4}, "num_hidden_groups 4 is more than num_hidden_layers 3"),
    ("albert", {"inner_group_num": 0}, "inner_group_num = 0 is not a positive integer"),
    ("albert", {"num_hidden_groups": "2"}, "is not a positive integer"),
    ("albert", {"hidden_act": "mish"}, "activation 'mish'"),
    ("albert", {"num_attention_heads": 5}, "not divisible by 5"),
    ("mpnet", {"pad_token_id": 0}, "pads with id 1"),
    ("mpnet", {"relative_attention_num_buckets": 16}, "computes 32 buckets"),
    ("mpnet", {"max_position_embeddings": 2}, "no position after the pad row"),
    ("nomic_bert", {"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ("nomic_bert", {"hidden_act": "mish"}, "activation 'mish'"),
    ("nomic_bert", {"rope_parameters": {"rope_type": "wild", "rope_theta": 1000.0}}, "wild"),
])
def test_what_cannot_run_is_refused_in_one_line(tmp_path, name, change, message):
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(edited(tmp_path, name, change))
    assert "\n" not in str(e.value)


def test_albert_file_holding_another_layer_layout_is_refused(tmp_path):
    """A config.json with one group fewer than the file: the second group's tensors unread, refused."""
    with pytest.raises(QkvError, match="albert_layer_groups.1"):
        qkv.load(edited(tmp_path, "albert", {"num_hidden_groups": 1}))


@pytest.mark.parametrize("name", NAMES)
def test_save_reads_back_equal(tmp_path, name):
    from safetensors.numpy import load_file

    check_encoder_saved_reads_back(tmp_path, name, hidden=False)
    saved = set(load_file(str(tmp_path / "saved" / "model.safetensors")))
    assert saved == set(load_file(str(MODELS / name / "model.safetensors")))     # each stored layer once


def test_a_fresh_albert_shares_its_layers():
    cfg = qkv.load(MODELS / "albert").config
    w = qkv.init(cfg, seed=3).weights
    assert w.blocks[0].attn.W_O is w.blocks[2].attn.W_O and w.blocks[4].attn.W_O is not w.blocks[0].attn.W_O


@pytest.mark.parametrize("name, text", [("albert", "the cat sat on the [MASK] ."),
                                        ("mpnet", "The cat sat on the <mask>."),
                                        ("nomic_bert", "the cat sat on the [MASK] .")])
def test_next_reads_the_mask_token(monkeypatch, capsys, name, text):
    code, out, err = run_main(monkeypatch, capsys, "next", text, "--model", str(MODELS / name))
    assert code == 0 and "the masked token at position" in out, err


# ── mBART and Pegasus with untied embeddings (tests/fixtures/make_seq2seq_fixtures.py: *_untied) ──────────────

SEQ2SEQ = MODELS.parent / "seq2seq"
UNTIED = ("mbart_untied", "pegasus_untied")


def _seq2seq_ref(name: str) -> dict[str, np.ndarray]:
    with np.load(SEQ2SEQ / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", UNTIED)
def test_untied_stacks_read_their_own_tables(name):
    """tie_word_embeddings=false: the encoder reads encoder.embed_tokens, the decoder decoder.embed_tokens, the
    logits lm_head; none of them is another's view (float64 keeps them apart too)."""
    w = qkv.load(SEQ2SEQ / name).weights
    enc, dec = w.encoder.tok_embed, w.decoder.tok_embed
    assert not np.shares_memory(enc, dec) and not np.shares_memory(dec, w.decoder.W_vocab)
    assert max_abs(enc, dec) > 1e-2 and max_abs(dec, w.decoder.W_vocab.T) > 1e-2
    w64 = w.astype(np.float64)
    assert not np.shares_memory(w64.encoder.tok_embed, w64.decoder.tok_embed)
    assert max_abs(w64.decoder.tok_embed, dec) == 0 and max_abs(w64.encoder.tok_embed, enc) == 0


@pytest.mark.parametrize("name", UNTIED)
def test_untied_padded_batch_and_every_layer_equal_the_reference(name):
    model, r = qkv.load(SEQ2SEQ / name), _seq2seq_ref(name)
    out = model.forward(r["input_ids"], r["attention_mask"], r["decoder_input_ids"], r["decoder_attention_mask"])
    src, tgt = r["attention_mask"].astype(bool), r["decoder_attention_mask"].astype(bool)
    assert max_abs(out.logits[tgt], r["logits"][tgt]) <= TOL_HIDDEN
    assert max_abs(out.encoder_hidden[src], r["encoder_hidden"][src]) <= TOL_HIDDEN
    for b in range(2):
        assert max_abs(out.encoder_attentions[:, b][:, :, src[b]], r["encoder_attentions"][:, b][:, :, src[b]]) <= \
            TOL_ATTENTION
        assert max_abs(out.attentions[:, b][:, :, tgt[b]], r["decoder_attentions"][:, b][:, :, tgt[b]]) <= TOL_ATTENTION
        assert max_abs(out.cross_attentions[:, b][:, :, tgt[b]], r["cross_attentions"][:, b][:, :, tgt[b]]) <= \
            TOL_ATTENTION
    trace = model.run(r["input_ids"][0], target=r["decoder_input_ids"][0], keep=("residual",))
    for i in range(model.config.n_layers):
        assert max_abs(trace.encoder.layer(i).residual, r["encoder_hidden_states"][i, 0]) <= TOL_HIDDEN
    for i in range(model.config.n_decoder_layers):
        assert max_abs(trace.layer(i).residual, r["decoder_hidden_states"][i, 0]) <= TOL_HIDDEN


@pytest.mark.parametrize("name", UNTIED)
def test_untied_greedy_and_the_cache_step_equal_transformers(name):
    model, r = qkv.load(SEQ2SEQ / name), _seq2seq_ref(name)
    one = model.generate(r["greedy_input_ids"], 8, temperature=0, stop_at_eos=False)
    assert one.tolist() == r["greedy_ids"].tolist()
    batch = model.generate(r["input_ids"], 8, attention_mask=r["attention_mask"], temperature=0, stop_at_eos=False)
    assert batch.tolist() == r["batch_greedy_ids"].tolist()
    plain = model.generate(r["input_ids"], 8, attention_mask=r["attention_mask"], temperature=0, stop_at_eos=False,
                           use_cache=False)
    assert plain.tolist() == batch.tolist()
    full = model.forward(r["input_ids"], r["attention_mask"], batch[:, :-1]).logits              # (B, 8, V)
    memory = model.memory(model.encoder_output(r["input_ids"], r["attention_mask"]))
    cache = model.new_cache(2, 8)
    for t in range(8):
        step = model.decoder_logits(batch[:, t:t + 1], memory, r["attention_mask"], cache=cache)
        assert max_abs(step[:, 0], full[:, t]) <= 1e-5


@pytest.mark.parametrize("name", UNTIED)
def test_untied_gradients_equal_autograd(name):
    """Each stack's table its own gradient, lm_head its own; `shared` (read by no forward) none, as torch's."""
    grads = check_gradients(qkv.load(SEQ2SEQ / name), name, labels=True, atol=1e-6)
    assert "model.shared.weight" not in grads


@pytest.mark.parametrize("name", UNTIED)
def test_untied_save_reads_back_equal(tmp_path, name):
    from safetensors.numpy import load_file

    model, r = qkv.load(SEQ2SEQ / name), _seq2seq_ref(name)
    model.save(tmp_path / "saved")
    again = qkv.load(tmp_path / "saved")
    assert again.config == model.config and not again.config.tied_embeddings
    a = model.forward(r["input_ids"], r["attention_mask"], r["decoder_input_ids"]).logits
    np.testing.assert_array_equal(a, again.forward(r["input_ids"], r["attention_mask"], r["decoder_input_ids"]).logits)
    stored = set(load_file(str(SEQ2SEQ / name / "model.safetensors"))) - {"model.shared.weight"}
    assert set(load_file(str(tmp_path / "saved" / "model.safetensors"))) == stored


@pytest.mark.parametrize("name, edit, message", [
    ("mbart", {"tie_word_embeddings": False}, "tie_word_embeddings=false .* no encoder.embed_tokens"),
    ("pegasus", {"tie_word_embeddings": False}, "tie_word_embeddings=false .* no encoder.embed_tokens"),
    ("marian", {"tie_word_embeddings": False}, "marian with tie_word_embeddings=false"),
])
def test_an_untied_config_over_a_tied_file_is_refused_in_one_line(tmp_path, name, edit, message):
    d = tmp_path / name
    shutil.copytree(SEQ2SEQ / name, d)
    (d / "config.json").write_text(json.dumps(json.loads((d / "config.json").read_text()) | edit))
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(d)
    assert "\n" not in str(e.value)


def test_untied_input_attribution_reads_each_stacks_table():
    """Integrated gradients over the source's rows (the encoder's table) and the target's (the decoder's) sum to
    z(e) − z(0): the path starts and ends where the forward pass reads, within 2 %."""
    import qkv.analysis.input_attribution as IA

    model, r = qkv.load(SEQ2SEQ / "mbart_untied"), _seq2seq_ref("mbart_untied")
    src = r["greedy_input_ids"][0]
    a = IA.attribute(model, src.tolist(), prefix=[5, 6], method="ig")
    assert a.completeness <= 0.02, a.completeness
    start = model.config.decoder_start_token_id
    start = model.config.bos_token_id if start is None else start
    z = model.forward(src[None], None, np.array([[start, 5, 6]])).logits[0, -1, a.target]     # the pass's own z
    assert abs(a.logit - z) <= 1e-4
