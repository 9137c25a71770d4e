"""T5Gemma (Gemma 2's blocks as an encoder–decoder) against transformers, from the committed fixture.

tests/fixtures/make_seq2seq_fixtures.py made seq2seq/t5gemma: T5GemmaForConditionalGeneration with 2 + 2 layers
(sliding, full), window 3, GQA 4 / 2 heads of 12, query_pre_attn_scalar 16, soft-caps that bite (scores 4, logits
2.5), each stack its own table and an untied lm_head.out_proj; its outputs on a right-padded source batch with
padded decoder inputs, and greedy ids. No torch here: tests/live/test_live_t5gemma.py checks other knob values
(tied, left padding, other windows, GQA, rope) and the gradients against transformers live.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import qkv
from conftest import FIXTURES, TOL_ATTENTION, TOL_HIDDEN, check_gradients, max_abs, run_main
from qkv.checkpoints import FAMILIES
from qkv.models.seq2seq import Seq2SeqModel
from qkv.runtime.errors import QkvError

HERE = FIXTURES / "seq2seq" / "t5gemma"
NEW = 8                                                      # the fixture's greedy length


@pytest.fixture(scope="module")
def model() -> Seq2SeqModel:
    return qkv.load(HERE)


@pytest.fixture(scope="module")
def r() -> dict[str, np.ndarray]:
    with np.load(HERE / "reference.npz") as z:
        return {k: z[k] for k in z.files}


def rows_max(att: np.ndarray, expected: np.ndarray, rows: np.ndarray) -> float:
    """Max difference of (L, B, H, n_q, n_k) attention over each batch row's real query rows."""
    return max(max_abs(att[:, b][:, :, rows[b]], expected[:, b][:, :, rows[b]]) for b in range(len(rows)))


def test_the_config_reads_both_modules(model):
    c = model.config
    assert isinstance(model, Seq2SeqModel) and c.family == "t5gemma" and c.encoder_decoder
    assert (c.n_layers, c.n_decoder_layers, c.n_heads, c.n_kv_heads, c.d_head) == (2, 2, 4, 2, 12)
    assert c.layer_windows == (3, None) and c.encoder_layer_windows == (4, None)    # |i − j| ≤ 3 is < 4
    assert c.encoder_config().layer_windows == (4, None)
    assert (c.attn_softcap, c.final_softcap, c.score_scale) == (4.0, 2.5, 16 ** -0.5)
    assert c.scale_embedding and c.position == "rope" and c.rope_theta == 100.0
    assert c.decoder_start_token_id == c.bos_token_id == 2 and not c.tied_embeddings


def test_each_stack_reads_its_own_table(model):
    w = model.weights
    assert not np.shares_memory(w.encoder.tok_embed, w.decoder.tok_embed)
    assert not np.shares_memory(w.decoder.W_vocab, w.decoder.tok_embed)
    assert max_abs(w.encoder.tok_embed, w.decoder.tok_embed) > 1e-2
    blk = w.decoder.blocks[0]
    assert blk.cross_out_norm is not None and blk.attn_out_norm is not None and blk.ffn_out_norm is not None
    assert blk.cross_attn.W_K.shape == (32, 2 * 12)                          # GQA: 2 K/V heads in cross too
    assert w.encoder.blocks[0].cross_attn is None


def test_padded_batch_equals_reference(model, r):
    """Logits, both hidden states and the three kinds of attention, right-padded source and target:
    logits and hidden within 1e-4, attention weights within 1e-5."""
    out = model.forward(r["input_ids"], r["attention_mask"], r["decoder_input_ids"], r["decoder_attention_mask"])
    src, tgt = r["attention_mask"].astype(bool), r["decoder_attention_mask"].astype(bool)
    assert max_abs(out.logits[tgt], r["logits"][tgt]) <= TOL_HIDDEN
    assert max_abs(out.hidden[tgt], r["decoder_hidden"][tgt]) <= TOL_HIDDEN
    assert max_abs(out.encoder_hidden[src], r["encoder_hidden"][src]) <= TOL_HIDDEN
    assert rows_max(out.encoder_attentions, r["encoder_attentions"], src) <= TOL_ATTENTION
    assert rows_max(out.attentions, r["decoder_attentions"], tgt) <= TOL_ATTENTION
    assert rows_max(out.cross_attentions, r["cross_attentions"], tgt) <= TOL_ATTENTION
    assert out.cross_attentions.shape == (2, 2, 4, r["decoder_input_ids"].shape[1], r["input_ids"].shape[1])
    assert not out.cross_attentions[:, 1, :, :, ~src[1]].any()                       # padding is never read
    assert np.abs(out.logits).max() < 2.5                                             # the logits' soft-cap


def test_windows_reach_as_transformers_masks_them(model, r):
    """Layer 0 slides: the encoder's query i sees |i − j| ≤ 3 (both ways), the decoder's i − j < 3; layer 1 sees
    every key (the decoder's causally). Exact zeros where masked, none where seen."""
    out = model.forward(r["input_ids"][:1], None, r["decoder_input_ids"][:1])
    n, m = out.encoder_attentions.shape[-1], out.attentions.shape[-1]
    i, j = np.arange(n)[:, None], np.arange(n)[None]
    enc = out.encoder_attentions[:, 0]                                             # (L, H, n, n)
    assert not enc[0][:, np.abs(i - j) > 3].any() and (enc[0][:, np.abs(i - j) <= 3] > 0).all()
    assert (enc[1] > 0).all()
    i, j = np.arange(m)[:, None], np.arange(m)[None]
    dec = out.attentions[:, 0]
    assert not dec[0][:, (i - j >= 3) | (j > i)].any() and (dec[0][:, (i - j < 3) & (j <= i)] > 0).all()
    assert not dec[1][:, j > i].any() and (dec[1][:, j <= i] > 0).all()


def test_every_layer_and_the_trace(model, r):
    """run(): the residual stream entering every block of both stacks equals transformers' hidden_states[i]."""
    trace = model.run(r["input_ids"][0], target=r["decoder_input_ids"][0], keep=("residual", "attentions", "k"))
    for i in range(model.config.n_layers):
        assert max_abs(trace.encoder.layer(i).residual, r["encoder_hidden_states"][i, 0]) <= TOL_HIDDEN
    for i in range(model.config.n_decoder_layers):
        assert max_abs(trace.layer(i).residual, r["decoder_hidden_states"][i, 0]) <= TOL_HIDDEN
    assert max_abs(trace.logits, r["logits"][0]) <= TOL_HIDDEN
    assert max_abs(trace.cross.attentions, r["cross_attentions"][:, 0]) <= TOL_ATTENTION
    assert max_abs(trace.encoder.attentions, r["encoder_attentions"][:, 0]) <= TOL_ATTENTION
    assert trace.cross.layer(0).k.shape == (2, r["input_ids"].shape[1], 12)         # Hkv cross K heads, of the source


def test_greedy_with_and_without_the_cache_equals_transformers(model, r):
    one = model.generate(r["greedy_input_ids"], NEW, temperature=0, stop_at_eos=False)
    assert one.tolist() == r["greedy_ids"].tolist()
    ids, mask = r["input_ids"], r["attention_mask"]
    cached = model.generate(ids, NEW, attention_mask=mask, temperature=0, stop_at_eos=False)
    plain = model.generate(ids, NEW, attention_mask=mask, temperature=0, stop_at_eos=False, use_cache=False)
    assert cached.tolist() == plain.tolist() == r["batch_greedy_ids"].tolist()
    assert len(set(cached[0].tolist())) > 3                                          # not one token repeated


def test_the_cache_step_equals_the_whole_pass(model, r):
    """Each step after the cache's past (the window of layer 0 sliding past it) equals a teacher-forced pass."""
    ids, mask = r["input_ids"], r["attention_mask"]
    written = r["batch_greedy_ids"]
    full = model.forward(ids, mask, written[:, :-1]).logits                          # (B, NEW, V)
    memory = model.memory(model.encoder_output(ids, mask))
    cache = model.new_cache(len(ids), NEW)
    for t in range(NEW):
        step = model.decoder_logits(written[:, t:t + 1], memory, mask, cache=cache)   # (B, 1, V)
        assert max_abs(step[:, 0], full[:, t]) <= 1e-5


def test_float64_agrees_with_float32(model, r):
    m64 = qkv.load(HERE, dtype=np.float64)
    o32 = model.forward(r["input_ids"], r["attention_mask"], r["decoder_input_ids"])
    o64 = m64.forward(r["input_ids"], r["attention_mask"], r["decoder_input_ids"])
    assert o64.logits.dtype == np.float64 and max_abs(o32.logits, o64.logits) <= TOL_HIDDEN


def test_save_reads_back_with_the_files_names(model, r, tmp_path):
    from safetensors import safe_open

    again = qkv.load(model.save(tmp_path / "m"))
    assert again.config == model.config
    assert np.array_equal(again.forward(r["input_ids"]).logits, model.forward(r["input_ids"]).logits)
    with safe_open(str(HERE / "model.safetensors"), "np") as f:
        stored = set(f.keys())
    assert set(FAMILIES["t5gemma"].tensors(model.weights, model.config)) == stored
    hf = json.loads((tmp_path / "m" / "config.json").read_text())
    assert hf["encoder"]["layer_types"] == ["sliding_attention", "full_attention"] and hf["decoder"]["is_decoder"]
    fresh = qkv.init(json.loads((HERE / "config.json").read_text()), seed=0)
    assert isinstance(fresh, Seq2SeqModel) and fresh.forward(r["input_ids"]).logits.shape == (2, 1, 128)


def test_a_tied_head_is_the_decoders_table(tmp_path, r):
    """tie_word_embeddings true (and no lm_head.out_proj in the file): W_vocab is the decoder's table, a view."""
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "tied"
    shutil.copytree(HERE, d)
    hf = json.loads((d / "config.json").read_text()) | {"tie_word_embeddings": True}
    (d / "config.json").write_text(json.dumps(hf))
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["lm_head.out_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    tied = qkv.load(d)
    assert np.shares_memory(tied.weights.decoder.W_vocab, tied.weights.decoder.tok_embed)
    assert "lm_head.out_proj.weight" not in FAMILIES["t5gemma"].tensors(tied.weights, tied.config)


def test_keys_no_t5gemma_reads_are_ignored_as_transformers_ignores_them():
    """T5GemmaModuleConfig has no mlp_bias or use_bidirectional_attention (Gemma's): transformers' T5Gemma reads
    neither, so neither changes the knobs (a Gemma 2 config.json with them would be refused)."""
    hf = json.loads((HERE / "config.json").read_text())
    plain = FAMILIES["t5gemma"].config(hf)
    for which in ("encoder", "decoder"):
        hf[which] |= {"mlp_bias": True, "use_bidirectional_attention": True}
    assert FAMILIES["t5gemma"].config(hf) == plain


def test_absent_soft_caps_take_the_modules_defaults_and_null_is_none():
    hf = json.loads((HERE / "config.json").read_text())
    for which in ("encoder", "decoder"):
        del hf[which]["attn_logit_softcapping"], hf[which]["final_logit_softcapping"]
    c = FAMILIES["t5gemma"].config(hf)
    assert (c.attn_softcap, c.final_softcap) == (50.0, 30.0)                      # T5GemmaModuleConfig's
    for which in ("encoder", "decoder"):
        hf[which] |= {"attn_logit_softcapping": None, "final_logit_softcapping": None}
    c = FAMILIES["t5gemma"].config(hf)
    assert (c.attn_softcap, c.final_softcap) == (None, None)


@pytest.mark.parametrize("edit, message", [
    ({"decoder": {"hidden_size": 48}}, r"encoder and decoder differ \(d_model: 32 and 48\)"),
    ({"decoder": {"num_hidden_layers": 3, "layer_types": ["full_attention"] * 3}}, "encoder and decoder differ"),
    ({"encoder": {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 100.0, "factor": 2.0}},
      "decoder": {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 100.0, "factor": 2.0}}},
     "rope_type 'dynamic' is not supported"),
    ({"encoder": {"sliding_window": None}, "decoder": {"sliding_window": None}}, "no sliding_window"),
    ({"encoder": {"hidden_size": "32"}}, r"config.json \(encoder\).*hidden_size"),
    ({"is_encoder_decoder": False}, "T5Gemma's encoder alone"),
])
def test_knobs_qkv_cannot_honour_are_refused_in_one_line(tmp_path, edit, message):
    d = tmp_path / "m"
    shutil.copytree(HERE, d)
    hf = json.loads((d / "config.json").read_text())
    for which, keys in edit.items():
        hf[which] = hf[which] | keys if isinstance(keys, dict) else keys
    (d / "config.json").write_text(json.dumps(hf))
    with pytest.raises(QkvError, match=message) as e:
        qkv.load(d)
    assert "\n" not in str(e.value)


def test_gradients_equal_autograd():
    """grads/t5gemma.npz (make_grad_fixtures.py): transformers' loss within 1e-5, every parameter's gradient within
    1e-4 relative error of torch autograd's — each stack's table, the untied head, every norm (the cross-attention's
    output norm too)."""
    grads = check_gradients(qkv.load(HERE), "t5gemma", labels=True)
    assert {"model.encoder.embed_tokens.weight", "lm_head.out_proj.weight",
            "model.decoder.layers.1.post_cross_attn_layernorm.weight"} <= set(grads)


def test_gradients_equal_finite_differences_float64():
    """loss_and_grads through both stacks (soft-capped logits and scores, the cross-attention's output norm,
    RoPE, the windows, each stack's table, the untied head) against central differences of the loss."""
    from qkv.train import seq2seq_backprop as S
    from test_backward import _arrays

    model = qkv.load(HERE).astype(np.float64)
    cfg, w = model.config, model.weights
    rng = np.random.default_rng(2)
    src = rng.integers(3, cfg.vocab_size, size=(2, 6))
    mask = np.ones_like(src)
    mask[1, 4:] = 0
    labels = rng.integers(3, cfg.vocab_size, size=(2, 5))
    labels[1, 3:] = -100
    tgt_in = S.decoder_inputs(labels, model.start_token, cfg.pad_token_id)
    _, g = S.loss_and_grads(w, cfg, src, mask, tgt_in, labels)
    grads, checked = dict(_arrays(g)), 0
    for key, value in _arrays(w):
        assert grads.get(key) is not None, key                    # every weight learns
        for i in rng.integers(0, value.size, 2):
            at = np.unravel_index(i, value.shape)
            keep = value[at]
            value[at] = keep + 1e-6
            up = S.loss_and_grads(w, cfg, src, mask, tgt_in, labels)[0]
            value[at] = keep - 1e-6
            down = S.loss_and_grads(w, cfg, src, mask, tgt_in, labels)[0]
            value[at] = keep
            assert grads[key][at] == pytest.approx((up - down) / 2e-6, abs=1e-7), f"{key}{at}"
            checked += 1
    assert {"decoder.blocks.0.cross_out_norm.weight", "encoder.blocks.1.attn_out_norm.weight"} <= set(grads)
    assert checked > 100


# ── the commands and the pipeline page ────────────────────────────────────────────────

def with_tokenizer(directory: Path) -> Path:
    """The fixture in DIRECTORY with a word-level tokenizer.json (pad 0, eos 1, bos 2, words w3 … w127)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    shutil.copytree(HERE, directory, dirs_exist_ok=True)
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{f"w{i}": i for i in range(3, 128)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "<eos>", "<bos>"])
    tok.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="module")
def words(tmp_path_factory) -> Path:
    return with_tokenizer(tmp_path_factory.mktemp("t5gemma"))


def test_show_heads_rollout_and_the_pipeline_page_run(words, monkeypatch, capsys, tmp_path):
    text = "w5 w17 w40 w9 w66 w23"
    code, _, err = run_main(monkeypatch, capsys, "show", "--model", str(words), "--out", str(tmp_path / "o"), text)
    assert code == 0 and (tmp_path / "o" / "pipeline.html").is_file(), err
    for command in ("heads", "rollout", "lens", "next"):
        code, out, err = run_main(monkeypatch, capsys, command, "--model", str(words), text)
        assert code == 0 and out, (command, err)
    code, out, err = run_main(monkeypatch, capsys, "generate", "--model", str(words), "-n", "4", text)
    written = qkv.load(words).generate(text, 4, temperature=0)
    assert code == 0 and out == written + "\n", err
    code, out, err = run_main(monkeypatch, capsys, "attribute", "--model", str(words), text)
    assert code == 0 and "src w5" in out, err
    code, out, err = run_main(monkeypatch, capsys, "patch", "--model", str(words), "--token", "w20", "--other", "w21",
                              text, "w5 w18 w40 w9 w66 w23")
    assert code == 0 and "cross-attention heads" in out, err


def test_dla_is_refused_in_one_line(words, monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "dla", "--model", str(words), "--token", "w20", "w5 w17 w40")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "normalises each attention and FFN output" in err
