"""GGUF files of Apertus (issue 47): llama.cpp's `apertus` (make test: no torch).

Each file is written on the fly as llama.cpp's convert_hf_to_gguf.py lays it out (tests/fixtures/gguf_convert.py:
gguf's own tensor names, no Q/K permutation, xIELU's four numbers of each layer as the metadata arrays xielu.alpha_p,
xielu.alpha_n, xielu.beta, xielu.eps instead of tensors, the llama3 RoPE as the factors of rope_freqs), and read by
qkv. The committed fixture's vocabulary (248) is smaller than the writer's byte tokenizer, so its directory is padded
to 300 tokens (new rows of embed_tokens and lm_head, zeros: no logit of the first 248 changes) and compared with
transformers' reference on those 248: a padded batch, every layer's input, every attention weight, one sequence,
greedy ids with and without the cache. rope_freqs reads as a longrope table (the factors s_i, attention factor 1): the
same rotation speeds ω_i / s_i as the directory's llama3 RoPE.
"""

from __future__ import annotations

import json
import sys

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as V
from safetensors.numpy import load_file, save_file

import qkv
from conftest import FIXTURES, MODELS, TOL_ATTENTION, TOL_HIDDEN, max_abs, reference, run_main
from qkv.checkpoints import gguf_cache
from qkv.core.positions import rope_inv_freq
from qkv.runtime.errors import QkvError

sys.path.insert(0, str(FIXTURES))
import gguf_convert as C  # noqa: E402
from gguf_names import check_names, edited_file  # noqa: E402

V_FIXTURE, V_PADDED = 248, 300


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


def padded(tmp_path, V: int = V_PADDED):
    """The apertus fixture with a vocabulary of V: V − 248 new rows of zeros in embed_tokens and lm_head (their logits
    0, no other changed)."""
    out = tmp_path / "apertus"
    out.mkdir()
    hf = json.loads((MODELS / "apertus" / "config.json").read_text()) | {"vocab_size": V}
    (out / "config.json").write_text(json.dumps(hf))
    t = load_file(MODELS / "apertus" / "model.safetensors")
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        t[k] = np.concatenate([t[k], np.zeros((V - V_FIXTURE, t[k].shape[1]), np.float32)])
    save_file(t, out / "model.safetensors")
    return out


@pytest.fixture
def file(tmp_path):
    return C.convert(padded(tmp_path), tmp_path / "a.gguf")


def test_tables_and_file_name_what_llama_cpp_declares(file):
    """Every name and key of qkv's apertus table and of the file is one gguf.constants declares for apertus; the file
    holds xIELU's numbers as metadata (none as a tensor) and the llama3 RoPE as rope_freqs."""
    check_names("apertus", file)
    reader = gguf.GGUFReader(file)
    assert not any("act_fn" in t.name for t in reader.tensors)
    assert {"xielu.alpha_p", "xielu.alpha_n", "xielu.beta", "xielu.eps", "apertus.rope.freq_base"} <= {
        f.name for f in reader.fields.values()}
    assert "rope_freqs.weight" in {t.name for t in reader.tensors}


def test_apertus_file_equals_transformers(file):
    """The file's model on the fixture's first 248 tokens: a padded batch's logits, final hidden states and every
    layer's input at the real positions (1e-4), every attention weight (1e-5), one sequence (1e-4), greedy ids with
    and without the cache: transformers' numbers."""
    ref, model = reference("apertus"), qkv.load(file)
    out = model.forward(ref["input_ids"], ref["attention_mask"])
    real = ref["attention_mask"].astype(bool)
    assert max_abs(out.logits[..., :V_FIXTURE][real], ref["logits"][real]) <= TOL_HIDDEN
    assert max_abs(out.hidden[real], ref["hidden"][real]) <= TOL_HIDDEN
    for b in range(len(real)):
        assert max_abs(out.attentions[:, b][:, :, real[b]], ref["attentions"][:, b][:, :, real[b]]) <= TOL_ATTENTION
    n = int(real[1].sum())
    trace = model.run(ref["input_ids"][1, :n], keep=("residual",))
    for i in range(model.config.n_layers):
        assert max_abs(trace.layer(i).residual, ref["hidden_states"][i, 1, :n]) <= TOL_HIDDEN
    single = model.forward(ref["single_input_ids"])
    assert max_abs(single.logits[..., :V_FIXTURE], ref["single_logits"]) <= TOL_HIDDEN
    assert max_abs(single.attentions, ref["single_attentions"]) <= TOL_ATTENTION
    new = ref["greedy_ids"].shape[1] - ref["single_input_ids"].shape[1]
    for cache in (True, False):
        assert model.generate(ref["single_input_ids"], new, temperature=0, stop_at_eos=False,
                              use_cache=cache).tolist() == ref["greedy_ids"].tolist()


def test_apertus_file_gives_back_the_directory(file):
    """The float32 directory qkv makes of the file holds the padded directory's tensors bit for bit (xIELU's numbers
    made from the metadata, each float32 as the checkpoint's), and its config the same knobs but the RoPE, whose
    longrope table turns each pair at the llama3 RoPE's speed (float32's rounding)."""
    mine = load_file(gguf_cache.converted(file) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(file.parent / "apertus" / "model.safetensors").items()}
    assert set(mine) == set(theirs), sorted(set(mine) ^ set(theirs))
    for k, w in theirs.items():
        assert mine[k].shape == w.shape and np.array_equal(mine[k], w), k
    read, ours = qkv.load(file).config, qkv.load(file.parent / "apertus").config
    assert read.rope_scaling["rope_type"] == "longrope" and ours.rope_scaling["rope_type"] == "llama3"
    assert read == ours.with_(rope_scaling=read.rope_scaling, norm_eps=float(np.float32(ours.norm_eps)),
                              pad_token_id=read.pad_token_id)
    np.testing.assert_allclose(rope_inv_freq(8, read.rope_theta, read.rope_scaling),
                               rope_inv_freq(8, ours.rope_theta, ours.rope_scaling), rtol=2e-7)


def test_apertus_stored_and_f16_loads(tmp_path):
    """An F16 file read in place (the default load: its matrices as blocks, xIELU's numbers from the metadata beside
    the norms, in the checkpoint's shapes) gives the float32 load's logits (1e-5), and transformers' within F16's
    rounding (0.02)."""
    path = C.convert(padded(tmp_path), tmp_path / "a16.gguf", "F16")
    ids = reference("apertus")["single_input_ids"]
    model = qkv.load(path)
    stored, f32 = model.forward(ids).logits, qkv.load(path, dtype=np.float32).forward(ids).logits
    assert max_abs(stored, f32) <= 1e-5
    xielu = model.weights.blocks[1].ffn.xielu                       # the checkpoint's shapes: (1,) and 0-d
    assert (np.shape(xielu.alpha_p), np.shape(xielu.beta), np.shape(xielu.eps)) == ((1,), (), ())
    assert 0 < max_abs(f32[..., :V_FIXTURE], reference("apertus")["single_logits"]) <= 0.02


def test_rope_freqs_of_ones_is_plain_rope(tmp_path):
    """A directory without RoPE scaling writes no rope_freqs, and a rope_freqs of ones (as llama.cpp's converter writes
    for factors that all round to 1) reads as plain RoPE: the same config either way."""
    hf = json.loads((MODELS / "apertus" / "config.json").read_text()) | {
        "vocab_size": V_PADDED, "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}
    directory = qkv.init(hf, seed=3, initializer_range=0.2).save(tmp_path / "hf")
    plain = C.convert(directory, tmp_path / "p.gguf")
    assert "rope_freqs.weight" not in {t.name for t in gguf.GGUFReader(plain).tensors}
    ones = _edited(tmp_path, directory, {}, {"rope_freqs.weight": np.ones(4, np.float32)})
    assert qkv.load(plain).config.rope_scaling is None and qkv.load(ones).config == qkv.load(plain).config


def _edited(tmp_path, directory, meta: dict, tensors: dict | None = None):
    """DIRECTORY's apertus file with metadata keys set (None: removed) and tensors set (None: removed)."""
    return edited_file(tmp_path, directory, "apertus", meta, tensors, more=C.xielu)


@pytest.mark.parametrize("meta, tensors, fragment", [
    ({"xielu.beta": None}, {}, "xielu.beta = None is not one finite number for each of its 2 layers"),
    ({"xielu.eps": ([-1e-6], V.ARRAY, V.FLOAT32)}, {}, "xielu.eps = [-9.99"),
    ({"xielu.alpha_p": ("0.8", V.STRING)}, {}, "xielu.alpha_p = '0.8'"),
    ({}, {"rope_freqs.weight": np.ones(3, np.float32)}, "rope_freqs.weight has shape (3,), but the metadata implies"),
    ({}, {"rope_freqs.weight": np.array([1, 4, 0, 4], np.float32)}, "holds factors that are not positive"),
    ({"apertus.rope.scaling.type": ("linear", V.STRING), "apertus.rope.scaling.factor": (2.0, V.FLOAT32)}, {},
     "scales RoPE by rope_freqs and by apertus.rope.scaling"),
    ({}, {"blk.0.ffn_gate.weight": np.zeros((80, 32), np.float32)}, "blk.0.ffn_gate.weight"),
    ({}, {"blk.1.attn_q_norm.weight": None}, "lacks the tensor blk.1.attn_q_norm.weight"),
])
def test_apertus_refusals_in_one_line(tmp_path, meta, tensors, fragment, monkeypatch, capsys):
    """xIELU's numbers missing, of another count than the layers or not numbers; rope_freqs of the wrong size, with a
    factor of 0, or beside a RoPE scaling; a tensor llama.cpp's apertus does not read (a gate) or one missing: one line
    each, and the CLI's one line with exit 2."""
    path = _edited(tmp_path, padded(tmp_path), meta, tensors)
    with pytest.raises(QkvError) as e:
        qkv.load(path)
    assert fragment in str(e.value) and "\n" not in str(e.value)
    code, out, err = run_main(monkeypatch, capsys, "next", "hi", "--model", str(path))
    assert code == 2 and fragment in err and err.count("\n") == 1


def test_apertus_writer_refuses_biases():
    """llama.cpp's apertus has no biases: the writer refuses a directory with them (never writes them away)."""
    hf = json.loads((MODELS / "apertus" / "config.json").read_text())
    with pytest.raises(ValueError, match="apertus: llama.cpp's apertus has no biases"):
        C.metadata(hf | {"attention_bias": True}, "apertus")
