"""Gemma 3 GGUF files (llama.cpp's arch `gemma3`, the text model; issue 47), read as model_type gemma3_text.

llama.cpp's converter (Gemma3Model) writes every norm as 1 + w (q/k norms too), the head when untied, the full layers'
RoPE base and linear scaling, the sliding layers' base (rope.freq_base_swa), the window, final_logit_softcapping when
set; what the file cannot say llama.cpp fixes: Q·Kᵀ by 1/√d_k (62 layers: 1/√(d_model / heads)), five sliding layers
of every six unless attention.sliding_window_pattern says otherwise (a bool per layer or a period), no window: every
layer full. Files are written on the fly as the converter lays them out (tests/fixtures/gguf_convert.py) and read back:
  * the committed fixture (query_pre_attn_scalar 16 ≠ d_k 8, kinds sliding / sliding / full) is refused by the writer;
    written as llama.cpp runs it (`lossy`: 1/√8, every layer sliding) it is the directory with those two knobs: the
    same knobs, tensors (norms within float32's rounding of (1 + w) − 1) and logits (1e-5);
  * the fixture's file with its kinds said (attention.sliding_window_pattern) and its q norms × √(d_k / 16) (the same
    scores under llama.cpp's 1/√d_k) equals transformers' reference: logits and hidden 1e-4, attentions 1e-5, greedy
    ids with and without the KV cache;
  * random directories (qkv.init) of other knob values round-trip (logits ≤ 1e-5): 7 layers (pattern 6), GQA,
    d_k ≠ d_model / heads, linear ×8 on the full layers, a final soft-cap, tied; 62 layers (1/√(d_model / heads)); no
    window (sliding_window_pattern 1);
  * the kinds' spellings and the sliding base as llama.cpp's loader reads them; what it would compute otherwise is
    refused in one line.
tests/live/test_live_gguf_gemma3.py compares such files with transformers on random checkpoints.
"""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
from gguf import GGUFValueType as V
from safetensors.numpy import load_file

import qkv
from conftest import FIXTURES, MODELS, TOL_HIDDEN, max_abs, reference
from qkv.checkpoints import gguf_cache
from qkv.checkpoints.families import about

sys.path.insert(0, str(FIXTURES))
import gguf_convert as C  # noqa: E402
import make_gguf_fixtures as F  # noqa: E402
from gguf_names import assert_refused_in_one_line, check_names, forward_equals_reference

TOL_ROUND_TRIP = 1e-5     # a directory and its file, logits max abs (norms (1 + w) − 1 in float32)
FIXTURE = MODELS / "gemma3_text"
LLAMA_CPP = dict(attn_scale=8 ** -0.5, layer_windows=None)      # the fixture as llama.cpp runs its file


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


def _file(tmp_path, directory=FIXTURE, meta: dict | None = None, tensors: dict | None = None):
    """DIRECTORY's gemma3 file as the writer lays it out (lossy: as llama.cpp runs it), metadata keys and tensors set
    (None: removed); a new name in TMP_PATH each call."""
    hf = json.loads((directory / "config.json").read_text())
    m = {"general.architecture": ("gemma3", V.STRING)} | C.metadata(hf, "gemma3", lossy=True) \
        | C.vocabulary(directory, hf)
    m = {k: v for k, v in (m | (meta or {})).items() if v is not None}
    t = C.tensors(hf, load_file(directory / "model.safetensors"), "gemma3") | (tensors or {})
    path = tmp_path / f"x{len(list(tmp_path.glob('x*.gguf')))}.gguf"
    return F.write(path, m, {k: (w, None) for k, w in t.items() if w is not None})


def _same_config(read, ours) -> None:
    """READ (from a file) has OURS's knobs, its ε as the file stores it (float32)."""
    assert read == ours.with_(norm_eps=float(np.float32(ours.norm_eps)))


def test_table_and_file_name_what_llama_cpp_declares(tmp_path):
    """qkv's gemma3 table and the fixture's file: every tensor name and key is one gguf.constants declares."""
    check_names("gemma3", C.convert(FIXTURE, tmp_path / "g.gguf", lossy=True))


def test_writer_refuses_what_the_file_loses(tmp_path):
    """The fixture's query_pre_attn_scalar (16, d_k 8) and kinds (sliding, sliding, full: llama.cpp's period 6 slides
    all three) are not in llama.cpp's file: the writer refuses rather than compare wrong numbers."""
    with pytest.raises(ValueError, match="query_pre_attn_scalar, layer_types"):
        C.convert(FIXTURE, tmp_path / "g.gguf")


def test_fixture_file_is_its_directory_as_llama_cpp_runs_it(tmp_path):
    """The fixture's file reads as gemma3_text with the directory's knobs but llama.cpp's scale and kinds: the head
    (untied), both kinds' RoPE (linear ×2 on the full layers, base 1e4 on the sliding ones) and MQA as the directory's;
    its tensors the directory's (norms within float32's rounding), its logits the directory's with those knobs."""
    path = C.convert(FIXTURE, tmp_path / "g.gguf", lossy=True)
    ours, read = qkv.load(FIXTURE).with_config(**LLAMA_CPP), qkv.load(path)
    _same_config(read.config, ours.config)
    assert (read.config.rope_theta, read.config.local_rope_theta, read.config.rope_scaling["factor"]) == \
        (1e6, 1e4, 2.0)
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(FIXTURE / "model.safetensors").items()}
    assert set(mine) == set(theirs) and "lm_head.weight" in mine
    for k, w in theirs.items():
        if "norm" in k:                                              # (1 + w) − 1
            assert max_abs(mine[k], w) <= 2.0 ** -23 * (1 + np.abs(w).max()), k
        else:
            np.testing.assert_array_equal(mine[k], w, err_msg=k)
    ref = reference("gemma3_text")
    assert max_abs(read.forward(ref["input_ids"], ref["attention_mask"]).logits,
                   ours.forward(ref["input_ids"], ref["attention_mask"]).logits) <= TOL_ROUND_TRIP


def test_fixture_file_equals_transformers(tmp_path):
    """The fixture's file with its kinds said (attention.sliding_window_pattern: true, true, false) and its q norms
    × √(8 / 16), so llama.cpp's 1/√d_k gives the directory's Q·Kᵀ / √16: transformers' numbers on the directory (the
    padded batch's logits, hidden states and attention weights on every real token, the single sequence, greedy ids
    with and without the KV cache)."""
    hf = json.loads((FIXTURE / "config.json").read_text())
    stored = C.tensors(hf, load_file(FIXTURE / "model.safetensors"), "gemma3")
    scaled = {k: w * np.float32(np.sqrt(8 / 16)) for k, w in stored.items() if k.endswith("attn_q_norm.weight")}
    path = _file(tmp_path, meta={"gemma3.attention.sliding_window_pattern": ([True, True, False], V.ARRAY, V.BOOL)},
                 tensors=scaled)
    ref, model = reference("gemma3_text"), qkv.load(path)
    assert model.config.layer_windows == (6, 6, None)
    forward_equals_reference(model, ref)
    assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) <= TOL_HIDDEN
    for use_cache in (True, False):
        assert model.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False,
                              use_cache=use_cache).tolist() == ref["greedy_ids"].tolist()


def _directory(tmp_path, config: dict, extra: dict | None = None):
    """A random gemma3_text directory of the fixture's config with CONFIG, saved by qkv (EXTRA: keys added to its
    config.json after, e.g. sliding_window_pattern, which qkv reads only without layer_types)."""
    hf = {k: v for k, v in json.loads((FIXTURE / "config.json").read_text()).items() if k != "layer_types"} | config
    directory = qkv.init(hf, seed=3, initializer_range=0.2).save(tmp_path / f"hf{len(list(tmp_path.glob('hf*')))}")
    if extra:
        saved = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps(saved | extra))
    return directory


LINEAR8 = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
           "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
PLAIN = {"full_attention": {"rope_type": "default", "rope_theta": 2e4},
         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}


@pytest.mark.parametrize("config, extra, windows", [
    (dict(num_hidden_layers=7, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, rope_parameters=LINEAR8,
          final_logit_softcapping=5.0, tie_word_embeddings=True, sliding_window=4), None, (4,) * 5 + (None, 4)),
    (dict(num_hidden_layers=62, head_dim=16, query_pre_attn_scalar=8, intermediate_size=16), None,
     tuple(None if i % 6 == 5 else 6 for i in range(62))),
    (dict(layer_types=["full_attention"] * 3, query_pre_attn_scalar=8, rope_parameters=PLAIN),
     {"sliding_window_pattern": 1}, (None, None, None)),
], ids=["L7-gqa-dk16-linear8-softcap-tied", "L62-scale-d-over-heads", "no-window"])
def test_random_directory_round_trips(tmp_path, config, extra, windows):
    """A random Gemma 3 directory of knob values the fixture lacks, written as llama.cpp's converter does, reads back
    as the same knobs and logits (≤ 1e-5) over more tokens than the window."""
    directory = _directory(tmp_path, config, extra)
    ours, read = qkv.load(directory), qkv.load(C.convert(directory, tmp_path / "y.gguf"))
    _same_config(read.config, ours.config)
    assert tuple(read.config.window(i) for i in range(read.config.n_layers)) == windows
    ids = np.arange(3, 40)[None]
    assert max_abs(read.forward(ids).logits, ours.forward(ids).logits) <= TOL_ROUND_TRIP


@pytest.mark.parametrize("meta, windows", [
    ({"gemma3.attention.sliding_window_pattern": (2, V.UINT32)}, (6, None, 6)),    # i slides unless i % 2 = 1
    ({"gemma3.attention.sliding_window_pattern": ([False, False, True], V.ARRAY, V.BOOL)}, (None, None, 6)),
    ({"gemma3.attention.sliding_window_pattern": (0, V.UINT32)}, (6, 6, 6)),       # 0: every layer slides
    ({"gemma3.attention.sliding_window_pattern": (1, V.UINT32)}, (None, None, None)),
    ({}, (6, 6, 6)),                                                                 # period 6: layers 0–4 slide
    ({"gemma3.attention.sliding_window": None}, (None, None, None)),                # no window: every layer full
    ({"gemma3.attention.sliding_window": (0, V.UINT32)}, (None, None, None)),
])
def test_kinds_as_llama_cpp_reads_them(tmp_path, meta, windows):
    """Each layer's kind as llama.cpp's loader reads it (a bool per layer, a period, 6 without the key, none without
    a window): the model is the directory with those kinds (and llama.cpp's scale), number for number."""
    read = qkv.load(_file(tmp_path, meta=meta))
    assert tuple(read.config.window(i) for i in range(3)) == windows
    directory = tmp_path / "kinds"                                   # the fixture with these layer_types
    directory.mkdir()
    hf = json.loads((FIXTURE / "config.json").read_text())
    hf["layer_types"] = ["full_attention" if w is None else "sliding_attention" for w in windows]
    (directory / "config.json").write_text(json.dumps(hf))
    shutil.copy(FIXTURE / "model.safetensors", directory / "model.safetensors")
    theirs = qkv.load(directory).with_config(attn_scale=8 ** -0.5)
    _same_config(read.config, theirs.config)
    ids = np.arange(3, 20)[None]
    assert max_abs(read.forward(ids).logits, theirs.forward(ids).logits) <= TOL_ROUND_TRIP


def test_sliding_base_as_llama_cpp_reads_it(tmp_path):
    """rope.freq_base_swa turns the sliding layers (plain, whatever the full layers' scaling); without it, 10000
    (llama.cpp's gemma3), not rope.freq_base."""
    read = qkv.load(_file(tmp_path, meta={"gemma3.rope.freq_base_swa": (5e4, V.FLOAT32)}))
    assert (read.config.rope_theta, read.config.local_rope_theta, read.config.local_rope_scaling) == (1e6, 5e4, None)
    read = qkv.load(_file(tmp_path, meta={"gemma3.rope.freq_base_swa": None,
                                          "gemma3.rope.freq_base": (2e5, V.FLOAT32)}))
    assert (read.config.rope_theta, read.config.local_rope_theta) == (2e5, 1e4)


def test_final_softcap_read_and_attention_never_capped(tmp_path):
    """final_logit_softcapping c: logits = c·tanh(logits / c), as the directory with that knob; none without it."""
    read = qkv.load(_file(tmp_path, meta={"gemma3.final_logit_softcapping": (0.5, V.FLOAT32)}))
    assert (read.config.final_softcap, read.config.attn_softcap) == (0.5, None)
    logits = read.forward(np.arange(3, 20)[None]).logits
    assert np.abs(logits).max() < 0.5
    theirs = qkv.load(FIXTURE).with_config(**LLAMA_CPP, final_softcap=0.5)
    assert max_abs(logits, theirs.forward(np.arange(3, 20)[None]).logits) <= TOL_ROUND_TRIP


REFUSED = {
    "window-text": ({"gemma3.attention.sliding_window": ("6", V.STRING)}, "attention.sliding_window = '6'"),
    "pattern-short": ({"gemma3.attention.sliding_window_pattern": ([True, False], V.ARRAY, V.BOOL)},
                      "one true or false per layer (3)"),
    "pattern-text": ({"gemma3.attention.sliding_window_pattern": ("LLG", V.STRING)}, "neither a bool per layer"),
    "yarn": ({"gemma3.rope.scaling.type": ("yarn", V.STRING)}, "'yarn' is not supported for Gemma 3"),
    "swa-base-zero": ({"gemma3.rope.freq_base_swa": (0.0, V.FLOAT32)}, "gemma3.rope.freq_base_swa = 0.0"),
    "softcap-negative": ({"gemma3.final_logit_softcapping": (-3.0, V.FLOAT32)}, "final_logit_softcapping = -3.0"),
    "attn-softcap": ({"gemma3.attn_logit_softcapping": (50.0, V.FLOAT32)}, "'gemma3.attn_logit_softcapping'"),
    "attn-factor": ({"gemma3.rope.scaling.attn_factor": (1.5, V.FLOAT32)}, "'gemma3.rope.scaling.attn_factor'"),
    "vision-tower": ({"general.type": ("mmproj", V.STRING)}, "'mmproj'"),      # a multimodal model's other file
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_in_one_line(tmp_path, monkeypatch, capsys, case):
    meta, fragment = REFUSED[case]
    path = _file(tmp_path, meta=meta)
    assert_refused_in_one_line(path, fragment, monkeypatch, capsys)


def test_families_table_lists_gemma3():
    """`qkv models --families`: Gemma 3's row names llama.cpp's gemma3; Gemma 2's row is unchanged."""
    rows = {r.about.types: r.gguf for r in about()}
    assert rows[("gemma3_text",)] == ("gemma3",) and rows[("gemma2",)] == ("gemma2",)
