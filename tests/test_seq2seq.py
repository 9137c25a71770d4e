"""Encoder–decoders (Marian, BART, T5) against transformers, from committed fixtures.

tests/fixtures/make_seq2seq_fixtures.py made them: tiny random checkpoints with every parameter
perturbed, their outputs on a padded source batch with padded decoder inputs, and greedy ids.
No torch here: tests/live/test_live_seq2seq.py re-checks random configs against transformers live.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from safetensors import safe_open

import qkv
from conftest import FIXTURES, TOL_ATTENTION, TOL_HIDDEN, max_abs
from qkv.checkpoints import FAMILIES
from qkv.core.positions import relative_buckets, sinusoidal_halves, sinusoidal_table
from qkv.models.seq2seq import Seq2SeqModel

SEQ2SEQ = FIXTURES / "seq2seq"
NAMES = ["marian", "bart", "t5", "t5_gated", "mbart", "pegasus", "mt5", "umt5"]
NEW = 8                                                      # the fixtures' greedy length


def ref(name: str) -> dict[str, np.ndarray]:
    with np.load(SEQ2SEQ / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    return request.param, qkv.load(SEQ2SEQ / request.param), ref(request.param)


def valid_rows(att: np.ndarray, expected: np.ndarray, rows: np.ndarray) -> float:
    """Max difference of (L, B, H, n_q, n_k) attention over the real query rows of each batch row."""
    return max(max_abs(att[:, b][:, :, rows[b]], expected[:, b][:, :, rows[b]]) for b in range(len(rows)))


def test_load_gives_a_seq2seq_model(case):
    name, model, _ = case
    assert isinstance(model, Seq2SeqModel) and model.config.encoder_decoder
    assert model.config.family == name.split("_")[0]
    assert model.weights.encoder.tok_embed is model.weights.decoder.tok_embed      # one shared table


def test_padded_batch_equals_reference(case):
    """Logits, both hidden states and the three kinds of attention, padded source and target."""
    _, model, r = case
    out = model.forward(r["input_ids"], r["attention_mask"], r["decoder_input_ids"], r["decoder_attention_mask"])
    src, tgt = r["attention_mask"].astype(bool), r["decoder_attention_mask"].astype(bool)
    assert max_abs(out.logits[tgt], r["logits"][tgt]) <= TOL_HIDDEN
    assert max_abs(out.hidden[tgt], r["decoder_hidden"][tgt]) <= TOL_HIDDEN
    assert max_abs(out.encoder_hidden[src], r["encoder_hidden"][src]) <= TOL_HIDDEN
    L, B, H, n_src, _ = r["encoder_attentions"].shape
    L_dec, n_tgt = r["decoder_attentions"].shape[0], r["decoder_attentions"].shape[3]
    assert out.encoder_attentions.shape == (L, B, H, n_src, n_src)
    assert out.attentions.shape == (L_dec, B, H, n_tgt, n_tgt)
    assert out.cross_attentions.shape == (L_dec, B, H, n_tgt, n_src)                 # never square here
    assert valid_rows(out.encoder_attentions, r["encoder_attentions"], src) <= TOL_ATTENTION
    assert valid_rows(out.attentions, r["decoder_attentions"], tgt) <= TOL_ATTENTION
    assert valid_rows(out.cross_attentions, r["cross_attentions"], tgt) <= TOL_ATTENTION
    assert not out.cross_attentions[:, 1, :, :, ~src[1]].any()                       # padding is never read
    assert np.allclose(out.cross_attentions.sum(-1), 1, atol=1e-5)


def test_every_layer_and_the_trace(case):
    """run(): the residual stream entering every block of both stacks equals transformers'
    hidden_states[i]; the trace holds the three kinds of attention with their tokens."""
    _, model, r = case
    trace = model.run(r["input_ids"][0], target=r["decoder_input_ids"][0], keep=("residual", "attentions", "k"))
    for i in range(model.config.n_layers):
        assert max_abs(trace.encoder.layer(i).residual, r["encoder_hidden_states"][i, 0]) <= TOL_HIDDEN
    for i in range(model.config.n_decoder_layers):
        assert max_abs(trace.layer(i).residual, r["decoder_hidden_states"][i, 0]) <= TOL_HIDDEN
    assert max_abs(trace.encoder.hidden, r["encoder_hidden"][0]) <= TOL_HIDDEN
    assert max_abs(trace.logits, r["logits"][0]) <= TOL_HIDDEN
    assert max_abs(trace.cross.attentions, r["cross_attentions"][:, 0]) <= TOL_ATTENTION
    assert max_abs(trace.attentions, r["decoder_attentions"][:, 0]) <= TOL_ATTENTION
    assert max_abs(trace.encoder.attentions, r["encoder_attentions"][:, 0]) <= TOL_ATTENTION
    n_src, n_tgt = r["input_ids"].shape[1], r["decoder_input_ids"].shape[1]
    assert (trace.causal, trace.encoder.causal, trace.cross.causal) == (True, False, False)
    assert trace.cross.source_tokens == trace.encoder.tokens and len(trace.cross.key_labels) == n_src
    assert len(trace.cross.labels) == n_tgt and trace.prompt_length == 1
    assert trace.cross.layer(0).k.shape == (model.config.n_heads, n_src, model.config.d_head)   # K from the source


def test_greedy_equals_transformers(case):
    """Token for token, one source and the padded batch; ids begin with decoder_start_token_id."""
    _, model, r = case
    one = model.generate(r["greedy_input_ids"], NEW, temperature=0, stop_at_eos=False)
    assert one.tolist() == r["greedy_ids"].tolist()
    batch = model.generate(r["input_ids"], NEW, attention_mask=r["attention_mask"], temperature=0, stop_at_eos=False)
    assert batch.tolist() == r["batch_greedy_ids"].tolist()
    assert (batch[:, 0] == model.config.decoder_start_token_id).all()


def test_cache_path_equals_no_cache_path(case):
    """The KV cache (and the cross K, V computed once) changes nothing: the same ids, and every
    step's logits equal a full teacher-forced forward pass over the written ids."""
    _, model, r = case
    ids, mask = r["input_ids"], r["attention_mask"]
    cached = model.generate(ids, NEW, attention_mask=mask, temperature=0, stop_at_eos=False)
    plain = model.generate(ids, NEW, attention_mask=mask, temperature=0, stop_at_eos=False, use_cache=False)
    assert cached.tolist() == plain.tolist()
    full = model.forward(ids, mask, cached[:, :-1]).logits                       # (B, NEW, V)
    memory = model.memory(model.encoder_output(ids, mask))
    cache = model.new_cache(len(ids), NEW)
    for t in range(NEW):
        step = model.decoder_logits(cached[:, t:t + 1], memory, mask, cache=cache)   # (B, 1, V)
        assert max_abs(step[:, 0], full[:, t]) <= 1e-5


def test_sampling_is_repeatable_and_stops(case):
    _, model, r = case
    ids = r["greedy_input_ids"]
    a = model.generate(ids, NEW, temperature=1.0, top_p=0.9, seed=3, stop_at_eos=False)
    b = model.generate(ids, NEW, temperature=1.0, top_p=0.9, seed=3, stop_at_eos=False)
    assert a.tolist() == b.tolist() and a.shape == (1, 1 + NEW)
    assert model.generate(ids, NEW, top_k=1, stop_at_eos=False).tolist() == r["greedy_ids"].tolist()
    greedy = r["batch_greedy_ids"]                               # (B, 1 + NEW)
    stop = int(greedy[0, 3])                                     # a token row 0 writes
    out = model.generate(r["input_ids"], NEW, attention_mask=r["attention_mask"], temperature=0, stop=stop,
                         stop_at_eos=False)
    ends = [list(row[1:]).index(stop) + 2 if stop in row[1:] else len(row) for row in greedy]   # kept columns
    assert out.shape == (len(greedy), max(ends))                 # generation ends when every row has stopped
    for row, expected, end in zip(out, greedy, ends):
        assert row[:end].tolist() == expected[:end].tolist()     # the same tokens up to the stop token
        assert (row[end:] == model.config.pad_token_id).all()    # then padding


def test_text_in_and_out():
    """A source text → the target text (BART's fixture has a tokenizer), streamed the same."""
    model, r = qkv.load(SEQ2SEQ / "bart"), ref("bart")
    ids, _ = model.encode(str(r["text"]))
    assert ids.tolist() == r["text_ids"].tolist()
    expected = model.tokenizer.decode(r["text_greedy_ids"][0, 1:], skip_special_tokens=True)
    assert model.generate(str(r["text"]), NEW, temperature=0, stop_at_eos=False) == expected
    assert "".join(model.stream(str(r["text"]), NEW, temperature=0, stop_at_eos=False)) == expected
    trace = model.generate(str(r["text"]), NEW, temperature=0, stop_at_eos=False, trace=True)
    assert trace.ids.tolist() == r["text_greedy_ids"][0].tolist()
    assert trace.cross.attentions.shape == (3, 4, 1 + NEW, len(ids)) and trace.encoder.text == str(r["text"])
    own = model.run(str(r["text"]), max_new_tokens=NEW)           # no target: its own greedy translation
    assert own.ids[0] == model.config.decoder_start_token_id and own.cross.source_tokens == trace.encoder.tokens


def test_float64_agrees_with_float32(case):
    name, model, r = case
    m64 = qkv.load(SEQ2SEQ / name, dtype=np.float64)
    o32 = model.forward(r["input_ids"], r["attention_mask"], r["decoder_input_ids"])
    o64 = m64.forward(r["input_ids"], r["attention_mask"], r["decoder_input_ids"])
    assert o64.logits.dtype == np.float64 and o32.logits.dtype == np.float32
    assert max_abs(o32.logits, o64.logits) <= TOL_HIDDEN
    assert max_abs(model.astype(np.float64).forward(r["input_ids"]).logits, m64.forward(r["input_ids"]).logits) < 1e-12


def test_save_reads_back_and_init(case, tmp_path):
    """Model.save writes transformers' names (those of the fixture's own file) and reads back equal;
    qkv.init gives a fresh model of the same family."""
    name, model, r = case
    out = model.save(tmp_path / "m")
    again = qkv.load(out)
    assert again.config == model.config
    ids = r["input_ids"]
    assert np.array_equal(again.forward(ids).logits, model.forward(ids).logits)
    with safe_open(str(SEQ2SEQ / name / "model.safetensors"), "np") as f:
        stored = set(f.keys())
    assert set(FAMILIES[model.config.family].tensors(model.weights, model.config)) == stored
    fresh = qkv.init(json.loads((SEQ2SEQ / name / "config.json").read_text()), seed=0)
    assert isinstance(fresh, Seq2SeqModel) and fresh.forward(ids).logits.shape == (2, 1, model.config.vocab_size)
    if fresh.weights.decoder.b_vocab is not None:
        assert not fresh.weights.decoder.b_vocab.any()            # final_logits_bias starts at 0


# ── positions ────────────────────────────────────────────────────────────────────

def test_marian_sinusoids_are_the_guides_table_in_halves():
    """PE[p, i] = sin(p/10000^(2i/d)), PE[p, d/2 + i] = cos(…): the guide's interleaved table, columns reordered."""
    halves, table = sinusoidal_halves(50, 16), sinusoidal_table(50, 16)
    assert np.allclose(halves[:, :8], table[:, 0::2], atol=1e-6)            # sines
    assert np.allclose(halves[:, 8:], table[:, 1::2], atol=1e-6)            # cosines
    assert halves[3, 1] == np.float32(np.sin(3 / 10000 ** (2 / 16)))


def test_relative_buckets_known_values():
    """T5's default 32 buckets up to distance 128 (r = key − query)."""
    r = np.array([0, 1, -1, 7, -8, -20, -127, -128, -1000, 1000])
    both = relative_buckets(np.array([0]), r, True, 32, 128)[0]
    assert both.tolist() == [0, 17, 1, 23, 8, 10, 15, 15, 15, 31]
    causal = relative_buckets(np.array([0]), r, False, 32, 128)[0]
    assert causal.tolist() == [0, 0, 1, 0, 8, 17, 31, 31, 31, 0]            # the future has no bucket of its own


# ── mistakes ─────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("call, message", [
    (lambda m: m.forward(np.zeros((1, 0), int)), "empty"),
    (lambda m: m.forward([[1, 2, 10_000]]), "outside the vocabulary"),
    (lambda m: m.forward([[1, 2, 3]], decoder_input_ids=[[1, -4]]), "decoder_input_ids: token id -4"),
    (lambda m: m.forward([[1, 2, 3]], decoder_input_ids=[[0.5, 1.0]]), "decoder_input_ids: input_ids must be integers"),
    (lambda m: m.forward([[1, 2], [3, 4]], decoder_input_ids=[[1], [2], [3]]), "3 rows but the source 2"),
    (lambda m: m.forward([[1, 2, 3]], decoder_input_ids=np.ones((1, 500), int)), "handles at most"),
    (lambda m: m.forward([[1, 2, 3]], [[1, 1]]), "attention_mask has shape"),
    (lambda m: m.generate([[1, 2, 3]], 0), "max_new_tokens"),
    (lambda m: m.generate([[1, 2, 3]], 10_000), "max_new_tokens"),
    (lambda m: m.generate([[1, 2, 3]], 3, stop="x"), "stop strings need a text source"),
    (lambda m: m.generate([[1, 2, 3]], 3, temperature=-1), "temperature"),
    (lambda m: m.generate("a text", 3), "no tokenizer.json"),
    (lambda m: m.run([1, 2], target=[[1, 2], [3, 4]]), "2 rows but the source 1"),
    (lambda m: m.check_layer(7), "decoder layer 7 does not exist"),
])
def test_mistakes_are_one_line_errors(call, message):
    model = qkv.load(SEQ2SEQ / "marian")
    with pytest.raises(qkv.QkvError, match=message) as e:
        call(model)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name, edit, message", [
    ("marian", {"share_encoder_decoder_embeddings": False}, "separate source and target embeddings"),
    ("bart", {"tie_word_embeddings": False}, "tie_word_embeddings=false"),
    ("marian", {"tie_word_embeddings": False}, "tie_word_embeddings=false"),
    ("bart", {"decoder_ffn_dim": 96}, "different heads or FFN widths"),
    ("t5", {"feed_forward_proj": "gated-gelu-x"}, "feed_forward_proj"),
    ("t5", {"relative_attention_max_distance": 4}, "relative_max_distance"),
    ("t5", {"d_kv": "8"}, "d_kv"),
    ("bart", {"decoder_layers": 0}, "decoder_layers"),
    ("marian", {"scale_embedding": "yes"}, "scale_embedding"),
])
def test_bad_configs_are_refused(tmp_path, name, edit, message):
    d = tmp_path / name
    shutil.copytree(SEQ2SEQ / name, d)
    hf = json.loads((d / "config.json").read_text()) | edit
    (d / "config.json").write_text(json.dumps(hf))
    with pytest.raises(qkv.QkvError, match=message):
        qkv.load(d)
