"""OLMo 3 GGUF files (issue 47): llama.cpp writes Olmo3ForCausalLM as arch `olmo2` (its converter registers it on
Olmo2Model) with the window (attention.sliding_window), each layer's kind (attention.sliding_window_pattern: a bool
per layer, or a period), the sliding layers' base (rope.freq_base_swa) and the full layers' scaling (rope.scaling.*,
YaRN included); an olmo2 file with a window reads as OLMo 3, one without as OLMo 2 (test_gguf_families.py).

Files are written on the fly as convert_hf_to_gguf.py lays them out (tests/fixtures/gguf_convert.py), and read back:
  * the committed fixture (linear RoPE on the full layers, another base on the sliding ones): the directory's knobs,
    tensors and logits bit for bit, and transformers' numbers (reference.npz: logits and hidden 1e-4, attentions
    1e-5, greedy ids with and without the KV cache);
  * random directories (qkv.init) with YaRN on the full layers, the attention factor given or left to its default:
    the same model (logits within 1e-5);
  * llama.cpp's other spellings: the kinds as a period, no pattern (its default period 4), rope.scaling.attn_factor
    (llama.cpp multiplies cos and sin by it and by 1 + 0.1·ln s: transformers' attention_factor);
  * what cannot match is refused in one line: a damaged window or pattern, attn_factor without YaRN, YaRN's β or
    yarn_attn_factor other than those llama.cpp's olmo2 runs.
"""

from __future__ import annotations

import json
import math
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
from qkv.runtime.errors import QkvError

sys.path.insert(0, str(FIXTURES))
import gguf_convert as C  # noqa: E402
from gguf_names import assert_refused_in_one_line, check_names, edited_file, forward_equals_reference

TOL_ROUND_TRIP = 1e-5     # a directory and its file, logits max abs (the same float32 numbers: equal in practice)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def fixture_file(tmp_path_factory):
    """The committed olmo3 fixture as an F32 olmo2 file."""
    return C.convert(MODELS / "olmo3", tmp_path_factory.mktemp("gguf") / "olmo3.gguf")


def _same_config(read, ours) -> None:
    """READ (from a file) has OURS's knobs, its ε as the file stores it (float32)."""
    assert read == ours.with_(norm_eps=float(np.float32(ours.norm_eps)))


def test_file_names_what_llama_cpp_declares(fixture_file):
    """The olmo2 table (with OLMo 3's keys) and the file: every tensor name and key is one gguf.constants declares."""
    check_names("olmo2", fixture_file)


def test_fixture_file_is_its_directory(fixture_file):
    """The fixture's file reads as OLMo 3 with the directory's knobs (window, layer kinds, each kind's RoPE), its
    tensors bit for bit, and the directory's logits bit for bit."""
    ours, read = qkv.load(MODELS / "olmo3"), qkv.load(fixture_file)
    _same_config(read.config, ours.config)
    assert read.config.family == "olmo3" and read.config.layer_windows == (5, None, 5)
    assert (read.config.rope_theta, read.config.local_rope_theta) == (50000.0, 10000.0)
    mine = load_file(gguf_cache.converted(fixture_file) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(MODELS / "olmo3" / "model.safetensors").items()}
    assert set(mine) == set(theirs) and all(np.array_equal(mine[k], w) for k, w in theirs.items())
    ref = reference("olmo3")
    np.testing.assert_array_equal(read.forward(ref["input_ids"], ref["attention_mask"]).logits,
                                  ours.forward(ref["input_ids"], ref["attention_mask"]).logits)


def test_fixture_file_equals_transformers(fixture_file):
    """The file's model against transformers' numbers on the directory: the padded batch's logits, hidden states and
    attention weights on every real token, the single sequence, greedy ids with and without the KV cache."""
    ref, model = reference("olmo3"), qkv.load(fixture_file)
    forward_equals_reference(model, ref)
    single = model.forward(ref["single_input_ids"])
    assert max_abs(single.logits, ref["single_logits"]) <= TOL_HIDDEN
    for use_cache in (True, False):
        assert model.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False,
                              use_cache=use_cache).tolist() == ref["greedy_ids"].tolist()


def _directory(tmp_path, full: dict, **change):
    """A random OLMo 3 directory of the fixture's config with the full layers' RoPE FULL (and CHANGE), by qkv."""
    hf = json.loads((MODELS / "olmo3" / "config.json").read_text())
    hf = hf | {"rope_parameters": hf["rope_parameters"] | {"full_attention": full}} | change
    return qkv.init(hf, seed=3, initializer_range=0.2).save(tmp_path / f"hf{len(list(tmp_path.glob('hf*')))}")


YARN = {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0, "original_max_position_embeddings": 32}


@pytest.mark.parametrize("full, change", [
    (YARN | {"attention_factor": 1 + 0.1 * math.log(4.0), "beta_fast": 32.0, "beta_slow": 1.0}, {}),   # as OLMo 3's
    (YARN, {"num_hidden_layers": 4, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}),
    ({"rope_type": "default", "rope_theta": 20000.0}, {}),
])
def test_random_directory_round_trips(tmp_path, full, change):
    """A random OLMo 3 directory (YaRN on the full layers, its attention factor said or left to transformers'
    default; or plain RoPE) written as llama.cpp does reads back as the same knobs and logits (≤ 1e-5) over more
    tokens than the window."""
    directory = _directory(tmp_path, full, **change)
    ours, read = qkv.load(directory), qkv.load(C.convert(directory, tmp_path / "y.gguf"))
    _same_config(read.config, ours.config)
    if full["rope_type"] == "yarn":
        assert read.config.rope_scaling["attention_factor"] == pytest.approx(1 + 0.1 * math.log(4.0), rel=1e-12)
        assert read.config.local_rope_scaling is None
    ids = np.arange(3, 40)[None]
    assert max_abs(read.forward(ids).logits, ours.forward(ids).logits) <= TOL_ROUND_TRIP


def test_attn_factor_scales_yarn_as_llama_cpp(tmp_path):
    """rope.scaling.attn_factor a: llama.cpp's olmo2 multiplies the full layers' cos and sin by a · (1 + 0.1·ln s),
    read as transformers' attention_factor; the file is the directory whose attention_factor is that product."""
    directory = _directory(tmp_path, YARN)
    path = edited_file(tmp_path, directory, "olmo2", {"olmo2.rope.scaling.attn_factor": (1.5, V.FLOAT32),
                                                      "olmo2.rope.scaling.yarn_attn_factor": None})
    read = qkv.load(path)
    product = 1.5 * (1 + 0.1 * math.log(4.0))
    assert read.config.rope_scaling["attention_factor"] == pytest.approx(product, rel=1e-12)
    theirs = qkv.load(_directory(tmp_path, YARN | {"attention_factor": product}))
    ids = np.arange(3, 40)[None]
    assert max_abs(read.forward(ids).logits, theirs.forward(ids).logits) <= TOL_ROUND_TRIP
    assert max_abs(read.forward(ids).logits, qkv.load(directory).forward(ids).logits) > 100 * TOL_ROUND_TRIP


@pytest.mark.parametrize("pattern, windows", [((2, V.UINT32), (5, None, 5)),         # layer i slides unless i % 2 = 1
                                              (None, (5, 5, 5)),                      # llama.cpp's period 4
                                              ((0, V.UINT32), (5, 5, 5)),             # 0: every layer slides
                                              ((1, V.UINT32), (None, None, None)),    # 1: none does
                                              (([False, False, True], V.ARRAY, V.BOOL), (None, None, 5))])
def test_pattern_spellings(tmp_path, pattern, windows):
    """The layers' kinds as llama.cpp's loader reads them: a bool per layer, a period, or none (period 4); the model
    is the directory's with those kinds, number for number."""
    path = edited_file(tmp_path, MODELS / "olmo3", "olmo2", {"olmo2.attention.sliding_window_pattern": pattern})
    read = qkv.load(path)
    assert tuple(read.config.window(i) for i in range(3)) == windows
    directory = tmp_path / "kinds"                                   # the fixture with these layer_types
    directory.mkdir()
    hf = json.loads((MODELS / "olmo3" / "config.json").read_text())
    hf["layer_types"] = ["full_attention" if w is None else "sliding_attention" for w in windows]
    (directory / "config.json").write_text(json.dumps(hf))
    shutil.copy(MODELS / "olmo3" / "model.safetensors", directory / "model.safetensors")
    theirs = qkv.load(directory)
    _same_config(read.config, theirs.config)
    ids = np.arange(3, 20)[None]
    np.testing.assert_array_equal(read.forward(ids).logits, theirs.forward(ids).logits)


def test_without_the_sliding_base_the_sliding_layers_take_freq_base(tmp_path):
    """No rope.freq_base_swa: the sliding layers turn at rope.freq_base (llama.cpp's default), plain."""
    read = qkv.load(edited_file(tmp_path, MODELS / "olmo3", "olmo2", {"olmo2.rope.freq_base_swa": None}))
    assert (read.config.rope_theta, read.config.local_rope_theta, read.config.local_rope_scaling) == \
        (50000.0, 50000.0, None)


REFUSED = {
    "window-zero": ({"olmo2.attention.sliding_window": (0, V.UINT32)}, "attention.sliding_window 0"),
    "window-text": ({"olmo2.attention.sliding_window": ("5", V.STRING)}, "attention.sliding_window '5'"),
    "pattern-short": ({"olmo2.attention.sliding_window_pattern": ([True, False], V.ARRAY, V.BOOL)},
                      "one true or false per layer (3)"),
    "pattern-numbers": ({"olmo2.attention.sliding_window_pattern": ([1, 0, 1], V.ARRAY, V.INT32)},
                        "one true or false per layer (3)"),
    "pattern-text": ({"olmo2.attention.sliding_window_pattern": ("LLG", V.STRING)}, "neither a bool per layer"),
    "attn-factor-linear": ({"olmo2.rope.scaling.attn_factor": (1.5, V.FLOAT32)}, "without YaRN"),
    "swa-base-zero": ({"olmo2.rope.freq_base_swa": (0.0, V.FLOAT32)}, "olmo2.rope.freq_base_swa = 0.0"),
    "yarn-beta": ({"olmo2.rope.scaling.type": ("yarn", V.STRING), "olmo2.rope.scaling.original_context_length":
                   (32, V.UINT32), "olmo2.rope.scaling.yarn_beta_fast": (16.0, V.FLOAT32)}, "yarn_beta_fast = 16.0"),
    "yarn-attn-factor": ({"olmo2.rope.scaling.type": ("yarn", V.STRING), "olmo2.rope.scaling.original_context_length":
                          (32, V.UINT32), "olmo2.rope.scaling.yarn_attn_factor": (2.0, V.FLOAT32)},
                         "yarn_attn_factor = 2.0"),
    "yarn-no-context": ({"olmo2.rope.scaling.type": ("yarn", V.STRING)}, "original_context_length = None"),
    "longrope": ({"olmo2.rope.scaling.type": ("longrope", V.STRING)}, "'longrope' is not supported for OLMo 3"),
    "unknown-key": ({"olmo2.attn_logit_softcapping": (50.0, V.FLOAT32)}, "'olmo2.attn_logit_softcapping'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_in_one_line(tmp_path, monkeypatch, capsys, case):
    meta, fragment = REFUSED[case]
    path = edited_file(tmp_path, MODELS / "olmo3", "olmo2", meta)
    assert_refused_in_one_line(path, fragment, monkeypatch, capsys)


def test_olmo2_file_with_attn_factor_is_refused(tmp_path):
    """An OLMo 2 file (no window) whose cos and sin llama.cpp would scale by rope.scaling.attn_factor: one line."""
    path = edited_file(tmp_path, MODELS / "olmo2", "olmo2", {"olmo2.rope.scaling.attn_factor": (1.25, V.FLOAT32)})
    with pytest.raises(QkvError, match="no Hugging Face OLMo 2") as e:
        qkv.load(path)
    assert "\n" not in str(e.value)


def test_families_table_lists_olmo2_for_olmo3():
    """`qkv models --families`: OLMo 3's row names llama.cpp's olmo2, which loads as it; OLMo 2's row is unchanged."""
    rows = {r.about.types: r.gguf for r in about()}
    assert rows[("olmo3",)] == ("olmo2",) and rows[("olmo2",)] == ("olmo2",)
