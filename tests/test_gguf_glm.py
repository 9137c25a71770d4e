"""GLM's GGUF files (issue 47): llama.cpp's `chatglm`, which its converter (ChatGLMModel) writes for GlmForCausalLM
directories and for THUDM's ChatGLM2/3 and glm-4-9b-chat checkpoints (make test: no torch).

Each file is written on the fly as convert_hf_to_gguf.py lays it out (tests/fixtures/gguf_convert.py: GLM's tensors as
stored, gate_up_proj as ffn_up; context d_model, eps 1e-5 and RoPE base 10000 · rope_ratio whatever the directory says,
rope.dimension_count (d_model / heads) · partial_rotary_factor) and read by qkv as model_type glm:
  * the committed fixture (head_dim 12 ≠ d_model / heads 8, rope_theta 30000, eps 1e-6) is what the converter loses:
    refused by the writer, and written as the converter writes it anyway, a file llama.cpp cannot load (its q rows
    must be d_model), refused by qkv in one line;
  * random directories of other knob values (qkv.init: partial_rotary_factor 0.25, 0.5, 1; GQA, MQA, MHA; with and
    without q/k/v biases; tied or not) read back as the directory's model: its knobs (the context llama.cpp's,
    d_model), its tensors and its logits and greedy ids bit for bit;
  * another RoPE base or eps is read as llama.cpp runs the file (10000, 1e-5), not as the directory says;
  * THUDM's layout (query_key_value written as one attn_qkv [Q; K; V]) reads as the same model;
  * what llama.cpp's chatglm would not run as qkv does (attn_output's bias, rope_freqs, another key, a head size of
    its own, half the biases) is refused in one line.
tests/live/test_live_glm.py compares such files with transformers on the directory.
"""

from __future__ import annotations

import json
import sys

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as V
from safetensors.numpy import load_file

import qkv
from conftest import FIXTURES, MODELS, run_main
from qkv.checkpoints import gguf_cache
from qkv.checkpoints.families import about
from qkv.runtime.errors import QkvError

sys.path.insert(0, str(FIXTURES))
import gguf_convert as C  # noqa: E402
from gguf_names import check_names, check_table, edited_file  # noqa: E402

IDS = np.arange(3, 20)[None]                                         # (1, 17) ids of the writer's 300


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


def _directory(tmp_path, name="hf", **change):
    """A random GLM directory of the fixture's config with 300 tokens, d_model / heads per head (8), RoPE base 10000
    and eps 1e-5 (what a chatglm file can hold), and CHANGE; saved by qkv."""
    hf = json.loads((MODELS / "glm" / "config.json").read_text()) | {
        "vocab_size": 300, "head_dim": 8, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}
    return qkv.init(hf | change, seed=5, initializer_range=0.2).save(tmp_path / name)


def _as_stored(directory) -> dict[str, np.ndarray]:
    return {k.removeprefix("model."): v for k, v in load_file(directory / "model.safetensors").items()}


def test_table_and_file_name_what_llama_cpp_declares(tmp_path):
    """qkv's chatglm table, and a file the writer lays out, name only tensors and keys gguf.constants declares for
    `chatglm`; the families table shows GLM's GGUF archs."""
    check_table("chatglm")
    check_names("chatglm", C.convert(_directory(tmp_path), tmp_path / "x.gguf"))
    assert next(r.gguf for r in about() if r.about.types == ("glm",)) == ("chatglm",)


def test_fixture_is_what_the_converter_loses(tmp_path, monkeypatch, capsys):
    """The committed fixture's RoPE base, eps and head size (12, not d_model / heads = 8) are not in a chatglm file:
    the writer refuses it; written as the converter writes it (a random directory of its config, 300 tokens), the
    file's q rows (48; k's, v's 24) are not the d_model (32; 16) llama.cpp's chatglm loads, and qkv refuses it in one
    line."""
    with pytest.raises(ValueError, match="rope_theta, rms_norm_eps, head_dim"):
        C.convert(MODELS / "glm", tmp_path / "no.gguf")
    hf = json.loads((MODELS / "glm" / "config.json").read_text()) | {"vocab_size": 300}
    path = C.convert(qkv.init(hf, seed=5).save(tmp_path / "hf"), tmp_path / "x.gguf", lossy=True)
    with pytest.raises(QkvError, match=r"tensor blk\.0\.attn_[qkv]\.(weight|bias) has shape \((48|24)\b.*, but the "
                                       r"metadata implies \((32|16)\b.*; the file is damaged") as e:
        qkv.load(path)
    assert "\n" not in str(e.value)
    code, _, err = run_main(monkeypatch, capsys, "show", "the cat", "--model", str(path))
    assert code == 2 and err.startswith("qkv: error: ") and err.count("\n") == 1, err


CASES = {
    "fixture-gqa-bias-half": {},
    "quarter-mqa-nobias-tied-L3": {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 1,
                                   "num_hidden_layers": 3, "attention_bias": False, "tie_word_embeddings": True,
                                   "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                       "partial_rotary_factor": 0.25}},
    "full-mha-bias-dk16": {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
                           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 1.0}},
}


@pytest.mark.parametrize("change", CASES.values(), ids=CASES.keys())
def test_file_is_its_directory(tmp_path, change):
    """A GLM directory written as llama.cpp's converter does reads as the directory's model: its knobs (partial RoPE,
    GQA, biases, tied head; eps float32's 1e-5, the context d_model as the converter writes it), its tensors bit for
    bit (gate_up_proj from ffn_up as stored), and its logits and greedy ids bit for bit."""
    directory = _directory(tmp_path, **change)
    path = C.convert(directory, tmp_path / "x.gguf")
    ours, read = qkv.load(directory), qkv.load(path)
    assert read.config == ours.config.with_(norm_eps=float(np.float32(1e-5)), max_positions=ours.config.d_model)
    assert (read.config.family, read.config.rope_interleaved) == ("glm", True)
    mine, theirs = _as_stored(gguf_cache.converted(path)), _as_stored(directory)
    assert set(mine) == set(theirs) and all(np.array_equal(mine[k], w) for k, w in theirs.items())
    np.testing.assert_array_equal(read.forward(IDS).logits, ours.forward(IDS).logits)
    np.testing.assert_array_equal(read.generate(IDS, 6, temperature=0, stop_at_eos=False),
                                  ours.generate(IDS, 6, temperature=0, stop_at_eos=False))


def test_another_base_and_eps_read_as_llama_cpp_runs_them(tmp_path):
    """ChatGLMModel writes freq_base 10000 (GLM's rope_theta unread) and eps 1e-5 (rms_norm_eps unread): a directory
    with 5e5 and 1e-6 is refused by the writer, and its file (written as the converter writes it) is the directory's
    model with base 10000 and eps 1e-5, bit for bit, not the directory's own numbers."""
    rope = {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5}
    directory = _directory(tmp_path, rms_norm_eps=1e-6, rope_parameters=rope)
    with pytest.raises(ValueError, match="rope_theta, rms_norm_eps$"):
        C.convert(directory, tmp_path / "no.gguf")
    read, ours = qkv.load(C.convert(directory, tmp_path / "x.gguf", lossy=True)), qkv.load(directory)
    as_run = ours.with_config(rope_theta=10000.0, norm_eps=float(np.float32(1e-5)), max_positions=ours.config.d_model)
    assert read.config == as_run.config
    np.testing.assert_array_equal(read.forward(IDS).logits, as_run.forward(IDS).logits)
    assert np.abs(read.forward(IDS).logits - ours.forward(IDS).logits).max() > 1e-3


def _fused(hf: dict, weights: dict) -> dict:
    """THUDM's layout (ChatGLM2/3, glm-4-9b-chat: query_key_value): each layer's attn_q/k/v (and biases) as one
    attn_qkv, rows [Q; K; V]."""
    stored, out = C.tensors(hf, weights, "chatglm"), {}
    for i in range(hf["num_hidden_layers"]):
        for kind in ("weight", "bias"):
            parts = [f"blk.{i}.attn_{x}.{kind}" for x in "qkv"]
            if parts[0] in stored:                                   # (H·d_k + 2·Hkv·d_k, d) or its bias
                joined = np.concatenate([stored[p] for p in parts])
                out |= {p: None for p in parts} | {f"blk.{i}.attn_qkv.{kind}": joined}
    return out


@pytest.mark.parametrize("bias", [True, False])
def test_fused_query_key_value_reads_as_the_same_model(tmp_path, bias):
    """A chatglm file of THUDM's layout (one attn_qkv a layer, with its bias or without) is split back into
    q_proj, k_proj, v_proj: the directory's model, logits bit for bit."""
    directory = _directory(tmp_path, attention_bias=bias)
    hf = json.loads((directory / "config.json").read_text())
    fused = _fused(hf, load_file(directory / "model.safetensors"))
    path = edited_file(tmp_path, directory, "chatglm", {}, fused)
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    assert "blk.1.attn_qkv.weight" in names and "blk.1.attn_q.weight" not in names
    assert ("blk.1.attn_qkv.bias" in names) == bias
    read, ours = qkv.load(path), qkv.load(directory)
    assert read.config.qkv_bias == bias
    np.testing.assert_array_equal(read.forward(IDS).logits, ours.forward(IDS).logits)


@pytest.mark.parametrize("meta, tensors, fragment", [
    ({}, {"blk.0.attn_output.bias": np.zeros(32, np.float32)}, "'blk.0.attn_output.bias'"),
    ({}, {"rope_freqs.weight": np.ones(2, np.float32)}, "scales RoPE per frequency (rope_freqs"),
    ({"chatglm.attention.sliding_window": (4, V.UINT32)}, {}, "'chatglm.attention.sliding_window'"),
    ({"chatglm.attention.key_length": (12, V.UINT32), "chatglm.attention.value_length": (12, V.UINT32)}, {},
     "4 heads of 12 in d_model 32"),
    ({}, {"blk.0.attn_k.bias": None, "blk.0.attn_v.bias": None}, "lacks the tensor"),
], ids=["attn_output-bias", "rope_freqs", "sliding-window", "head-size-of-its-own", "half-the-biases"])
def test_refusals_in_one_line(tmp_path, meta, tensors, fragment):
    """What llama.cpp's chatglm does not run as qkv would (an attn_output bias: its graph adds none; rope_freqs: its
    graph reads none; a key qkv would drop; a head size other than d_model / heads: its q rows are d_model; q's bias
    without k's and v's, which qkv's one switch cannot say): one line each."""
    path = edited_file(tmp_path, _directory(tmp_path), "chatglm", meta, tensors)
    with pytest.raises(QkvError) as e:
        qkv.load(path)
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)
