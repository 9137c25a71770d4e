"""Hostile and careless input (issue 11): every malformed config, weight file, tokenizer, saved
trace and command-line value ends in one line on stderr naming the problem, exit code 2, and
no file left behind. Each case is built here, from the committed fixtures, and run through the
real entry point (`qkv.cli.app.main`)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

import qkv
from conftest import MODELS, PATIENCE, run_main

TEXT = "the cat sat"


def copy_model(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(MODELS / name, dst)
    return dst


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def assert_one_line(monkeypatch, capsys, tmp_path: Path, args: list[str], match: str) -> None:
    """`qkv ARGS` exits 2 with one stderr line containing MATCH, and leaves tmp_path as it was."""
    before = files_under(tmp_path)
    code, _, err = run_main(monkeypatch, capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("qkv: error: "), err
    assert match.lower() in lines[0].lower(), lines[0]
    assert files_under(tmp_path) == before, files_under(tmp_path) ^ before


# ── config.json: types and ranges of every knob (family, key, value, what the error names) ──

DELETE = object()

CONFIG_CASES = [
    ("gpt2", "n_embd", "64", "n_embd"),
    ("gpt2", "n_embd", 64.0, "n_embd"),
    ("gpt2", "n_embd", True, "n_embd"),
    ("gpt2", "n_head", 0, "n_head"),
    ("gpt2", "n_head", -4, "n_head"),
    ("gpt2", "n_head", 5, "not divisible"),
    ("gpt2", "n_layer", [2], "n_layer"),
    ("gpt2", "n_layer", 1, "config.json says 1 layer but the checkpoint holds layers up to 1"),   # strict: not 1 of 2
    ("llama_gqa", "num_hidden_layers", 1, "config.json says 1 layer but the checkpoint holds layers up to 1"),
    ("gpt2", "n_positions", None, "n_positions"),
    ("gpt2", "vocab_size", 0, "vocab_size"),
    ("gpt2", "vocab_size", 10 ** 30 + 0.5, "vocab_size"),
    ("gpt2", "layer_norm_epsilon", -1e-5, "layer_norm_epsilon"),
    ("gpt2", "layer_norm_epsilon", "tiny", "layer_norm_epsilon"),
    ("gpt2", "activation_function", ["gelu"], "activation_function"),
    ("gpt2", "activation_function", "swishy", "not supported"),
    ("gpt2", "model_type", ["gpt2"], "model_type"),
    ("gpt2", "model_type", {"a": 1}, "model_type"),
    ("gpt2", "model_type", DELETE, "model_type"),
    ("gpt2", "tie_word_embeddings", "yes", "tie_word_embeddings"),
    ("gpt2", "n_inner", -1, "n_inner"),
    ("gpt2", "eos_token_id", "2", "eos_token_id"),
    ("gpt2", "eos_token_id", [2, "x"], "eos_token_id"),
    ("gpt2", "bos_token_id", 1.5, "bos_token_id"),
    ("llama_gqa", "num_key_value_heads", 3, "num_key_value_heads"),
    ("llama_gqa", "num_key_value_heads", 16, "num_key_value_heads"),
    ("llama_gqa", "num_key_value_heads", 8, "k_proj.weight has shape"),          # valid, but not these weights
    ("llama_gqa", "num_key_value_heads", 0, "num_key_value_heads"),
    ("llama_gqa", "num_attention_heads", "4", "num_attention_heads"),
    ("llama_gqa", "hidden_size", 0, "hidden_size"),
    ("llama_gqa", "head_dim", -16, "head_dim"),
    ("llama_gqa", "intermediate_size", 1e3, "intermediate_size"),
    ("llama_gqa", "num_hidden_layers", 0, "num_hidden_layers"),
    ("llama_gqa", "max_position_embeddings", "128", "max_position_embeddings"),
    ("llama_gqa", "rope_theta", "abc", "rope_theta"),
    ("llama_gqa", "rope_theta", 0, "rope_theta"),
    ("llama_gqa", "rope_theta", -10000.0, "rope_theta"),
    ("llama_gqa", "rope_scaling", "linear", "rope_scaling"),
    ("llama_gqa", "rope_scaling", [1, 2], "rope_scaling"),
    ("llama_gqa", "rope_scaling", {"rope_type": ["linear"]}, "rope_scaling.rope_type"),
    ("llama_gqa", "rope_scaling", {"rope_type": "linear", "factor": "2"}, "rope_scaling.factor"),
    ("llama_gqa", "rope_scaling", {"rope_type": "linear", "factor": 0}, "rope_scaling.factor"),
    # in range for their type, not for the model: 1/θ^(2i/d) or p·ω/factor overflow float32 (NaN in every score)
    ("llama_gqa", "rope_theta", 5e-324, "rope_theta=5e-324 must be a finite number above 1"),
    ("llama_gqa", "rope_theta", 1.0, "rope_theta=1.0 must be a finite number above 1"),
    ("llama_gqa", "rope_scaling", {"rope_type": "linear", "factor": 1e-300}, "factor=1e-300 must be from 0.001"),
    ("llama_gqa", "rope_scaling", {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192}, "llama3 needs low_freq_factor"),
    ("llama_gqa", "rope_scaling", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192}, "high_freq_factor > low_freq_factor"),
    ("llama_gqa", "rope_parameters", "default", "rope_parameters"),
    ("llama_gqa", "rope_parameters", {"rope_theta": "x"}, "rope_parameters.rope_theta"),
    ("llama_gqa", "rms_norm_eps", -1e-6, "rms_norm_eps"),
    ("llama_gqa", "rms_norm_eps", 0, "rms_norm_eps"),
    ("llama_gqa", "hidden_act", ["silu"], "hidden_act"),
    ("llama_gqa", "attention_bias", "false", "attention_bias"),
    ("llama_gqa", "partial_rotary_factor", 2, "partial_rotary_factor"),
    ("mistral", "sliding_window", 0, "sliding_window"),
    # sizes past generous bounds (some shape lists before any tensor is read: 10⁹ labels' names, each layer's kind)
    ("vit", "num_labels", 10**9, "num_labels = 1000000000 is not a positive integer up to 1,048,576"),
    ("vit", "num_hidden_layers", 10**9, "num_hidden_layers = 1000000000 is not a positive integer up to 16,384"),
    ("gemma3_text", "num_hidden_layers", 10**9, "num_hidden_layers = 1000000000 is not a positive integer up to"),
    ("gpt2", "n_head", 2**20, "n_head = 1048576 is not a positive integer up to 16,384"),
    ("llama_gqa", "max_position_embeddings", 10**18, "max_position_embeddings = 1000000000000000000 is not a "
                                                     "positive integer up to 2,147,483,647"),
    ("llama_gqa", "intermediate_size", 10**12, "intermediate_size = 1000000000000 is not a whole number up to"),
    ("mixtral", "num_local_experts", 10**9, "num_local_experts = 1000000000 is not a positive integer up to"),
    ("whisper", "num_mel_bins", 10**9, "num_mel_bins = 1000000000 is not a positive integer up to 4,096"),
    ("gemma3_text", "sliding_window_pattern", 0, "sliding_window_pattern = 0 is not a positive integer"),
    ("gemma3_text", "sliding_window_pattern", "6", "sliding_window_pattern = '6' is not a positive integer"),
    ("gemma3_text", "rope_local_base_freq", 1.0, "rope_local_base_freq = 1.0 is not a RoPE base above 1"),
    ("gemma3_text", "rope_local_base_freq", 0.5, "rope_local_base_freq = 0.5 is not a RoPE base above 1"),
    ("mistral", "sliding_window", -5, "sliding_window"),
    ("mistral", "sliding_window", "4096", "sliding_window"),
    ("bert", "num_attention_heads", 5, "not divisible"),
    ("bert", "type_vocab_size", 0, "type_vocab_size"),
    ("bert", "layer_norm_eps", None, None),                       # null = absent: loads with the default
    ("bert", "position_embedding_type", 3, "position_embedding_type"),
]


@pytest.mark.parametrize("family, key, value, match", CONFIG_CASES,
                         ids=[f"{f}-{k}-{v!r:.20}" for f, k, v, _ in CONFIG_CASES])
def test_config_values(monkeypatch, capsys, tmp_path, family, key, value, match):
    d = copy_model(tmp_path, family)
    hf = json.loads((d / "config.json").read_text())
    if value is DELETE:
        del hf[key]
    else:
        hf[key] = value
    (d / "config.json").write_text(json.dumps(hf))
    if match is None:
        assert qkv.load(d).config.norm_eps == 1e-12
        return
    assert_one_line(monkeypatch, capsys, tmp_path, ["show", TEXT, "--model", str(d)], match)


@pytest.mark.parametrize("family, ids", [
    ("gpt2", {"eos_token_id": 50256, "bos_token_id": 50256, "pad_token_id": None}),   # GPT2Config's defaults
    ("llama_gqa", {"eos_token_id": [2, 10**9], "pad_token_id": 10**9}),
])
def test_special_ids_outside_the_vocabulary_load(monkeypatch, capsys, tmp_path, family, ids):
    """An eos, bos or pad id the vocabulary lacks loads, as transformers loads it (item 10: tiny and test
    checkpoints keep GPT-2's 50256): `show` runs; writing runs to the length asked (an absent eos never ends
    it) and says so once on stderr."""
    d = copy_model(tmp_path, family)
    hf = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**hf, **ids}))
    code, _, err = run_main(monkeypatch, capsys, "show", TEXT, "--model", str(d))
    assert code == 0 and err == "", err
    model = qkv.load(d)
    absent = {k: v for k, v in ids.items() if v is not None and k != "eos_token_id"}
    assert model.config.absent_special_ids() == {**absent, "eos_token_id": 50256 if family == "gpt2" else 10**9}
    prompt = np.array([[5, 6, 7], [8, 9, 10]])
    first = model.generate(prompt, 6, temperature=0)
    assert first.shape == (2, 9) and ((0 <= first) & (first < model.config.vocab_size)).all()
    np.testing.assert_array_equal(model.generate(prompt, 6, temperature=0, stop=[int(first[0, 3])]
                                                 )[0, :4], first[0, :4])          # a row ends, the other goes on
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "outside its" in err, err
    assert ("writing stops only at the length asked" in err) == (family == "gpt2")   # llama_gqa's eos 2 can end it


def test_sizes_past_the_bounds_or_the_memory_are_one_line(monkeypatch):
    """A ModelConfig made in Python is bounded like a config.json; a fresh model (qkv.init, training) whose
    sizes are in range but whose tensors the free memory cannot hold is refused before the first one is drawn."""
    from qkv.core.config import ModelConfig

    base = dict(family="gpt2", vocab_size=100, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_positions=128)
    for knob, value in (("n_layers", 10**9), ("n_kv_heads", 2**20), ("vocab_size", 2**40), ("max_positions", 10**18)):
        with pytest.raises(qkv.QkvError, match=f"{knob}={value:,} is more than qkv reads"):
            ModelConfig(**{**base, knob: value})
    monkeypatch.setattr("qkv.runtime.tuning.available_memory", lambda: 1 << 30)        # 1 GiB free
    with pytest.raises(qkv.QkvError, match=r"a fresh gpt2 model of these sizes does not fit in memory: its tensor "
                                           r"wte.weight \(10000000, 64\) alone needs about 9.5 GiB and 1.0 GiB is free"):
        qkv.init(ModelConfig(**{**base, "vocab_size": 10**7}))
    assert qkv.init(ModelConfig(**base)).config.vocab_size == 100                      # what fits is made


def test_a_tokenizer_larger_than_the_vocabulary(monkeypatch, capsys, tmp_path):
    """Ids beyond the embedding table are refused once, at load (the mistral fixture has V = 352)."""
    d = copy_model(tmp_path, "mistral")
    shutil.copy(MODELS / "llama_gqa" / "tokenizer.json", d / "tokenizer.json")
    assert_one_line(monkeypatch, capsys, tmp_path, ["show", TEXT, "--model", str(d)],
                    "the tokenizer has 400 tokens but the model only 352")


@pytest.mark.parametrize("text", ["[1]", '"config"', "null", "{", "[" * 100_000 + "]" * 100_000, "\xff\xfe"])
def test_config_not_an_object(monkeypatch, capsys, tmp_path, text):
    d = copy_model(tmp_path, "gpt2")
    (d / "config.json").write_text(text, encoding="latin-1")
    assert_one_line(monkeypatch, capsys, tmp_path, ["show", TEXT, "--model", str(d)], "config.json")


# ── safetensors headers ──────────────────────────────────────────────────────────

def safetensors_bytes(header: dict | bytes, data: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape,
            "data_offsets": list(offsets) if isinstance(offsets, tuple) else offsets}


HEADER_CASES = [
    ("offsets-strings", {"a": entry(offsets=["0", "8"])}, b"\0" * 8, "data_offsets"),
    ("offsets-floats", {"a": entry(offsets=[0.0, 8.0])}, b"\0" * 8, "data_offsets"),
    ("offsets-null", {"a": entry(offsets=None)}, b"\0" * 8, "data_offsets"),
    ("offsets-three", {"a": entry(offsets=[0, 4, 8])}, b"\0" * 8, "data_offsets"),
    ("offsets-negative", {"a": entry(offsets=[-8, 0])}, b"\0" * 8, "data_offsets"),
    ("offsets-reversed", {"a": entry(offsets=[8, 0])}, b"\0" * 8, "data_offsets"),
    ("offsets-past-end", {"a": entry(offsets=[0, 8])}, b"\0" * 4, "data_offsets"),
    ("offsets-huge", {"a": entry(offsets=[0, 2 ** 70])}, b"\0" * 8, "data_offsets"),
    ("offsets-bool", {"a": entry(offsets=[False, True])}, b"\0" * 8, "data_offsets"),
    ("overlapping", {"a": entry(offsets=(0, 8)), "b": entry(offsets=(4, 12))}, b"\0" * 12, "overlap"),
    ("size-mismatch", {"a": entry(shape=(3,), offsets=(0, 8))}, b"\0" * 8, "needs 12"),
    # the tensors must cover the data without a gap, as the safetensors library requires
    ("hole", {"a": entry(offsets=(0, 8)), "b": entry(offsets=(12, 20))}, b"\0" * 20, "starts at byte 12 of the data, not 8"),
    ("leading-bytes", {"a": entry(offsets=(4, 12))}, b"\0" * 12, "starts at byte 4 of the data, not 0"),
    ("trailing-bytes", {"a": entry(offsets=(0, 8))}, b"\0" * 12, "the data holds 12 bytes but its tensors cover 8"),
    ("shape-int", {"a": entry(shape=2)}, b"\0" * 8, "shape"),
    ("shape-null", {"a": entry(shape=None)}, b"\0" * 8, "shape"),
    ("shape-floats", {"a": entry(shape=[2.0])}, b"\0" * 8, "shape"),
    ("shape-negative", {"a": entry(shape=[-2])}, b"\0" * 8, "shape"),
    ("dtype-list", {"a": entry(dtype=["F32"])}, b"\0" * 8, "dtype"),
    ("dtype-unknown", {"a": entry(dtype="F8_E4M3")}, b"\0" * 8, "dtype"),
    ("entry-not-object", {"a": [1, 2]}, b"", "not a safetensors file"),
    ("entry-missing-key", {"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, "not a safetensors file"),
    ("header-list", b"[]", b"", "not a safetensors file"),
    ("header-not-json", b"{nope", b"", "not a safetensors file"),
    ("header-deep", b"[" * 200_000 + b"]" * 200_000, b"", "not a safetensors file"),
    ("header-deep-object", b'{"a":' * 200_000 + b"1" + b"}" * 200_000, b"", "not a safetensors file"),
    ("header-bad-utf8", b'{"\xff": 1}', b"", "not a safetensors file"),
]


@pytest.mark.parametrize("header, data, match", [c[1:] for c in HEADER_CASES], ids=[c[0] for c in HEADER_CASES])
def test_safetensors_headers(monkeypatch, capsys, tmp_path, header, data, match):
    d = copy_model(tmp_path, "gpt2")
    (d / "model.safetensors").write_bytes(safetensors_bytes(header, data))
    assert_one_line(monkeypatch, capsys, tmp_path, ["show", TEXT, "--model", str(d)], match)


@pytest.mark.parametrize("raw, match", [
    (b"", "too short"),
    (b"\x01\x02", "too short"),
    (struct.pack("<Q", 2 ** 63), "bad header"),                 # a header longer than the file
    (struct.pack("<Q", 100) + b"{}", "bad header"),
])
def test_safetensors_length(monkeypatch, capsys, tmp_path, raw, match):
    d = copy_model(tmp_path, "gpt2")
    (d / "model.safetensors").write_bytes(raw)
    assert_one_line(monkeypatch, capsys, tmp_path, ["show", TEXT, "--model", str(d)], match)


def rewrite_tensor(d: Path, name: str, change) -> None:
    """Rewrite model.safetensors with tensor NAME replaced by change(array) (same layout otherwise)."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(d / "model.safetensors")
    tensors[name] = change(tensors[name])
    save_file(tensors, d / "model.safetensors")


@pytest.mark.parametrize("change, match", [
    (lambda a: a.astype(np.int32), "must be floats"),
    (lambda a: a.astype(np.int8), "must be floats"),
    (lambda a: (a > 0), "must be floats"),
    (lambda a: np.where(np.arange(a.size).reshape(a.shape) == 5, np.nan, a).astype(a.dtype), "NaN"),
    (lambda a: np.where(np.arange(a.size).reshape(a.shape) == 0, np.inf, a).astype(a.dtype), "h.1.mlp.c_fc.weight"),
    (lambda a: np.full_like(a, -np.inf), "infinite"),
])
def test_weights_of_the_wrong_kind(monkeypatch, capsys, tmp_path, change, match):
    d = copy_model(tmp_path, "gpt2")
    rewrite_tensor(d, "transformer.h.1.mlp.c_fc.weight", change)
    for command in (["show", TEXT], ["generate", TEXT, "-n", "2"], ["heads", TEXT, "--json"], ["next", TEXT]):
        assert_one_line(monkeypatch, capsys, tmp_path, [*command, "--model", str(d)], match)


@pytest.mark.parametrize("dtype, value, weights, match", [
    (np.float64, 1e300, None, "holds values beyond float32's range (|x| up to 1e+300)"),
    (np.float64, 1e300, "bfloat16", "holds values beyond float32's range"),
    (np.float32, 1e5, "float16", "holds values beyond float16's range (|x| up to 1e+05"),
])
def test_values_beyond_the_type_held_are_one_line_without_a_warning(monkeypatch, capsys, tmp_path, dtype, value,
                                                                     weights, match):
    d = copy_model(tmp_path, "gpt2")
    rewrite_tensor(d, "transformer.h.1.mlp.c_fc.weight", lambda a: np.full_like(a, value, dtype=dtype))
    args = (["--weights", weights] if weights else []) + ["show", TEXT, "--model", str(d)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                            # a RuntimeWarning before the line fails the test
        assert_one_line(monkeypatch, capsys, tmp_path, args, match)


def test_large_finite_weights_are_not_taken_for_inf(tmp_path):
    d = copy_model(tmp_path, "gpt2")
    rewrite_tensor(d, "transformer.h.1.mlp.c_fc.weight", lambda a: np.full_like(a, 3e38))   # the float32 sum overflows
    qkv.load(d)


@pytest.mark.parametrize("index, match", [
    ("{not json", "not a safetensors index"),
    ('{"weight_map": ' + "[" * 10000 + "]" * 10000 + "}", "not a safetensors index (it is nested too deeply"),
    ("[]", "not a safetensors index"),
    ("{}", "not a safetensors index"),
    ('{"weight_map": []}', "not a safetensors index"),
    ('{"weight_map": {}}', "not a safetensors index"),
    ('{"weight_map": {"wte.weight": 3}}', "not a safetensors index"),
    ('{"weight_map": {"wte.weight": "../model.safetensors"}}', "not a safetensors index"),
    ('{"weight_map": {"wte.weight": "/etc/passwd"}}', "not a safetensors index"),
    ('{"weight_map": {"wte.weight": "model-00001.safetensors"}}', "missing"),
])
def test_sharded_index(monkeypatch, capsys, tmp_path, index, match):
    d = copy_model(tmp_path, "gpt2")
    (d / "model.safetensors").rename(d / "weights.bin.safetensors")
    (d / "model.safetensors.index.json").write_text(index)
    assert_one_line(monkeypatch, capsys, tmp_path, ["show", TEXT, "--model", str(d)], match)


# ── command-line values ──────────────────────────────────────────────────────────

BAD_UTF8 = b"caf\xff".decode("utf-8", "surrogateescape")          # what Python makes of argv bytes 0xff


@pytest.mark.parametrize("args, match", [
    (["show", BAD_UTF8], "not valid UTF-8"),
    (["show", BAD_UTF8, "--out", "{tmp}/figs"], "not valid UTF-8"),
    (["generate", BAD_UTF8, "--model", "{gpt2}"], "not valid UTF-8"),
    (["generate", BAD_UTF8, "--model", "{gpt2}", "--trace", "{tmp}/t"], "not valid UTF-8"),
    (["explain", BAD_UTF8], "not valid UTF-8"),
    (["next", BAD_UTF8, "--model", "{gpt2}"], "not valid UTF-8"),
    (["chat", BAD_UTF8], "not valid UTF-8"),
    (["chat", "hello", "--system", BAD_UTF8], "not valid UTF-8"),
    (["generate", TEXT, "--model", "{gpt2}", "--seed", "-1"], "seed"),
    (["chat", "hello", "--seed", "-1"], "seed"),
    (["generate", TEXT, "--model", "minilm", "--trace", "{tmp}/t"], "decoder"),
    (["show", TEXT, "--layer", "99", "--out", "{tmp}/figs"], "layer 99"),
    (["show", "   ", "--out", "{tmp}/figs"], "empty"),
])
def test_command_line_values(monkeypatch, capsys, tmp_path, args, match):
    args = [a.format(tmp=tmp_path, gpt2=MODELS / "gpt2") for a in args]
    assert_one_line(monkeypatch, capsys, tmp_path, args, match)
    assert not (tmp_path / "figs").exists() and not (tmp_path / "t").exists()


def test_show_refuses_attention_that_does_not_fit(monkeypatch, capsys, tmp_path):
    """L·H·n² is estimated before anything is allocated; the message says how to ask for less."""
    import qkv.cli.app

    monkeypatch.setattr(qkv.cli.app, "memory_bound", lambda: 100_000)
    assert_one_line(monkeypatch, capsys, tmp_path, ["show", TEXT * 20, "--out", str(tmp_path / "figs")],
                    "drop --out to keep one layer (--layer), or give at most")
    assert_one_line(monkeypatch, capsys, tmp_path, ["show", TEXT * 40], "give at most")
    code, out, _ = run_main(monkeypatch, capsys, "show", TEXT)          # a short text still fits
    assert code == 0 and "tokens" in out


# ── saved traces ─────────────────────────────────────────────────────────────────

@pytest.fixture
def saved_trace(tmp_path) -> Path:
    model = qkv.load(MODELS / "gpt2")
    return model.run(TEXT, keep=("attentions",)).save(tmp_path / "trace")


def test_a_good_trace_loads(saved_trace):
    t = load_trace(saved_trace)
    assert t.attentions.shape[2] == len(t.tokens)


def load_trace(d: Path):
    from qkv.core.trace import Trace

    return Trace.load(d)


def edit_json(d: Path, change) -> None:
    meta = json.loads((d / "trace.json").read_text())
    (d / "trace.json").write_text(json.dumps(change(meta)))


def edit_npz(d: Path, **arrays) -> None:
    with np.load(d / "trace.npz") as z:
        kept = {k: z[k] for k in z.files}
    if "attentions" in arrays:                                   # full weights in place of a causal trace's triangles
        kept.pop("attentions_lower", None)
    kept.update(arrays)
    np.savez_compressed(d / "trace.npz", **{k: v for k, v in kept.items() if v is not None})


def lower_too(d: Path, n: int) -> None:
    """Both the full weights and the lower triangles: which would be the trace?"""
    with np.load(d / "trace.npz") as z:
        kept = {k: z[k] for k in z.files}
    np.savez(d / "trace.npz", **kept, attentions=np.zeros((2, 4, n, n), np.float32))


TRACE_CASES = [
    ("json-list", lambda d, n: (d / "trace.json").write_text("[1, 2]"), "not a JSON object"),
    ("json-no-tokens", lambda d, n: edit_json(d, lambda m: {k: v for k, v in m.items() if k != "tokens"}), "tokens"),
    ("json-tokens-ints", lambda d, n: edit_json(d, lambda m: {**m, "tokens": list(range(n))}), "tokens"),
    ("json-tokens-str", lambda d, n: edit_json(d, lambda m: {**m, "tokens": "abc"}), "tokens"),
    ("json-one-token-less", lambda d, n: edit_json(d, lambda m: {**m, "tokens": m["tokens"][:-1]}), "does not match"),
    ("json-source-tokens", lambda d, n: edit_json(d, lambda m: {**m, "source_tokens": ["a"]}), "does not match"),
    ("json-causal-str", lambda d, n: edit_json(d, lambda m: {**m, "causal": "yes"}), "causal"),
    ("json-prompt-length", lambda d, n: edit_json(d, lambda m: {**m, "prompt_length": 99}), "prompt_length"),
    ("json-prompt-length-neg", lambda d, n: edit_json(d, lambda m: {**m, "prompt_length": -1}), "prompt_length"),
    ("json-model-list", lambda d, n: edit_json(d, lambda m: {**m, "model": ["x"]}), "model"),
    ("json-not-json", lambda d, n: (d / "trace.json").write_text("{"), "does not hold a qkv trace"),
    ("json-bad-utf8", lambda d, n: (d / "trace.json").write_bytes(b'{"tokens": ["\xff"]}'), "does not hold a qkv trace"),
    ("json-missing", lambda d, n: (d / "trace.json").unlink(), "does not hold a qkv trace"),
    ("json-deep", lambda d, n: (d / "trace.json").write_text("[" * 100_000 + "]" * 100_000),
     "does not hold a qkv trace"),
    ("npz-missing", lambda d, n: (d / "trace.npz").unlink(), "does not hold a qkv trace"),
    ("npz-not-zip", lambda d, n: (d / "trace.npz").write_bytes(b"PK\x03\x04 not really"), "does not hold a qkv trace"),
    ("npz-no-ids", lambda d, n: edit_npz(d, ids=None), "ids"),
    ("npz-attn-3d", lambda d, n: edit_npz(d, attentions=np.zeros((2, 4, n), np.float32)), "attentions have shape"),
    ("npz-attn-wrong-n", lambda d, n: edit_npz(d, attentions=np.zeros((2, 4, n + 1, n + 1), np.float32)),
     "attentions have shape"),
    ("npz-attn-ints", lambda d, n: edit_npz(d, attentions=np.zeros((2, 4, n, n), np.int64)), "attentions have shape"),
    ("npz-lower-and-full", lower_too, "one of them"),
    ("npz-lower-short", lambda d, n: edit_npz(d, attentions_lower=np.zeros((2, 4, n * (n + 1) // 2 - 1), np.float32)),
     "attentions_lower have shape"),
    ("npz-lower-4d", lambda d, n: edit_npz(d, attentions_lower=np.zeros((2, 4, n, n), np.float32)),
     "attentions_lower have shape"),
    ("npz-lower-ints", lambda d, n: edit_npz(d, attentions_lower=np.zeros((2, 4, n * (n + 1) // 2), np.int64)),
     "attentions_lower have shape"),
    ("npz-no-attentions", lambda d, n: edit_npz(d, attentions_lower=None), "one of them"),
    ("npz-layers-repeat", lambda d, n: edit_npz(d, layers=np.array([0, 0])), "layers"),
    ("npz-layers-float", lambda d, n: edit_npz(d, layers=np.array([0.0, 1.0])), "layers"),
    ("npz-layers-fewer", lambda d, n: edit_npz(d, layers=np.array([0])), "attentions_lower have shape"),
    ("npz-ids-2d", lambda d, n: edit_npz(d, ids=np.zeros((1, n), np.int64)), "ids"),
    ("npz-ids-float", lambda d, n: edit_npz(d, ids=np.zeros(n, np.float32)), "ids"),
    ("npz-object", lambda d, n: edit_npz(d, ids=np.array([None] * n, dtype=object)), "does not hold a qkv trace"),
    # values, not only shapes: what the engine's outputs are (softmax rows, token ids, layer numbers)
    ("npz-attn-nan", lambda d, n: edit_npz(d, attentions=np.full((2, 4, n, n), np.nan, np.float32)), "NaN or inf"),
    ("npz-attn-negative", lambda d, n: edit_npz(d, attentions=causal_rows(n) * -1), "weights ≥ 0"),
    ("npz-attn-negative-edited", lambda d, n: (edit_npz(d, attentions=causal_rows(n) * -1),
                                               edit_json(d, lambda m: {**m, "rows": "edited"})), "weights ≥ 0"),
    ("npz-attn-rows-5", lambda d, n: edit_npz(d, attentions=causal_rows(n) * 5), "in \\[0, 1\\]|sum to 1"),
    ("json-rows-other", lambda d, n: edit_json(d, lambda m: {**m, "rows": "whatever"}), "'rows' must be"),
    ("npz-attn-rows-half", lambda d, n: edit_npz(d, attentions=causal_rows(n) * 0.5), "each sum to 1"),
    ("npz-layers-huge", lambda d, n: edit_npz(d, layers=np.array([0, 10**6])), "layer numbers from 0 to 9999"),
    ("npz-ids-negative", lambda d, n: edit_npz(d, ids=np.full(n, -1)), "token ids"),
    ("json-fifo", lambda d, n: ((d / "trace.json").unlink(), os.mkfifo(d / "trace.json")), "not a regular file"),
    ("npz-dev-zero", lambda d, n: ((d / "trace.npz").unlink(), (d / "trace.npz").symlink_to("/dev/zero")),
     "not a regular file"),
    ("json-dev-urandom", lambda d, n: ((d / "trace.json").unlink(), (d / "trace.json").symlink_to("/dev/urandom")),
     "not a regular file"),
]


def causal_rows(n: int) -> np.ndarray:
    """(2, 4, n, n) causal attention rows that each sum to 1 (uniform over the keys seen)."""
    A = np.tril(np.ones((n, n), np.float32))
    return np.broadcast_to(A / A.sum(-1, keepdims=True), (2, 4, n, n)).copy()


@pytest.mark.parametrize("spoil, match", [c[1:] for c in TRACE_CASES], ids=[c[0] for c in TRACE_CASES])
def test_saved_traces(saved_trace, spoil, match):
    n = len(json.loads((saved_trace / "trace.json").read_text())["tokens"])
    spoil(saved_trace, n)
    with pytest.raises(qkv.QkvError, match=match) as e:
        load_trace(saved_trace)
    assert "\n" not in str(e.value)


def test_a_zip_bomb_is_refused_before_it_expands(saved_trace):
    """512 MiB of zeros (compressed < 4 MB): the zip directory's sizes are read, nothing is inflated."""
    path = saved_trace / "trace.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("attentions.npy", "w", force_zip64=True) as f:
            f.write(np.lib.format.magic(1, 0))
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f4", "fortran_order": False, "shape": (1, 1, 11585, 11585)})
            block = bytes(1 << 21)
            for _ in range(256):                                           # 512 MiB
                f.write(block)
    assert path.stat().st_size < 4 << 20
    with pytest.raises(qkv.QkvError, match="would expand to 512 MiB"):
        load_trace(saved_trace)


def test_an_npy_header_claiming_more_than_it_holds(saved_trace):
    path = saved_trace / "trace.npz"
    with zipfile.ZipFile(path, "w") as z:
        header = b"{'descr': '<i8', 'fortran_order': False, 'shape': (1000000000000,), }"
        header += b" " * (63 - (10 + len(header)) % 64) + b"\n"                 # .npy: 64-byte aligned
        z.writestr("ids.npy", np.lib.format.magic(1, 0) + struct.pack("<H", len(header)) + header + bytes(64))
    with pytest.raises(qkv.QkvError, match="claims shape"):
        load_trace(saved_trace)


@pytest.mark.parametrize("dtype", ["int8", "no such type", object(), np.int64, "complex64", "bfloat16 "])
def test_a_dtype_the_engine_does_not_compute_in_is_one_line(dtype):
    with pytest.raises(qkv.QkvError, match="is not supported; use one of float32, float64") as e:
        qkv.load(MODELS / "gpt2", dtype=dtype)
    assert "\n" not in str(e.value)
    with pytest.raises(qkv.QkvError, match="is not supported"):        # the engine computes in 32 or 64 bits
        qkv.load(MODELS / "gpt2").astype("bfloat16" if dtype == "int8" else dtype)
    model = qkv.load(MODELS / "gpt2", dtype="float64")                # names and types NumPy knows
    assert model.dtype == np.float64 and qkv.load(MODELS / "gpt2", dtype=np.float32).dtype == np.float32
    with pytest.raises(qkv.QkvError, match="is not supported"):
        model.astype(dtype)                                           # an int8 copy would compute nonsense


EXTREME = {                                     # finite values that overflow float32 in the products that follow
    "wte": ("transformer.wte.weight", 3e38),
    "c_attn": ("transformer.h.0.attn.c_attn.weight", 1e20),
}


@pytest.mark.parametrize("which", sorted(EXTREME))
@pytest.mark.parametrize("args", [
    ["show", "the cat sat"], ["show", "the cat sat", "--out", "{out}"], ["heads", "the cat sat", "--json"],
    ["next", "the cat sat"], ["generate", "the cat", "-n", "3", "--trace", "{out}"], ["lens", "the cat sat"],
    ["rollout", "the cat sat"], ["dla", "the cat sat", "--token", " the"],
    ["patch", "the cat sat", "the dog sat", "--token", " the", "--other", " a"],
    ["circuits", "--layer", "0", "--head", "0", "the cat sat"], ["explain", "the cat sat", "--layer", "0", "--head", "0"],
])
def test_extreme_finite_weights_stop_in_one_line_naming_where(monkeypatch, capsys, tmp_path, which, args):
    """wte = 3e38 or q/k weights of 1e20 pass the NaN/Inf weight check but overflow in the pass: every command
    stops with one line naming where the stream first stopped being finite, never a table of nan or invalid JSON."""
    d = copy_model(tmp_path, "gpt2")
    name, value = EXTREME[which]
    rewrite_tensor(d, name, lambda a: np.full_like(a, value))
    args = [a.replace("{out}", str(tmp_path / "out")) for a in args]
    code, out, err = run_main(monkeypatch, capsys, *args, "--model", str(d))
    assert code == 2, (code, out[-300:], err[-300:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "not finite" in lines[0] and "nan" not in out.lower(), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [
    ["heads", "--file", "{fifo}", "--model", "{gpt2}"], ["train", "--text", "{fifo}", "--out", "{out}"],
    ["activations", "--layer", "0", "--tokens", "8", "--file", "{fifo}", "--out", "{out}", "--model", "{gpt2}"],
])
def test_a_fifo_or_a_device_given_as_input_is_refused_without_waiting(monkeypatch, capsys, tmp_path, args):
    """A FIFO with no writer would block the open (or the first read) forever; /dev/zero never ends."""
    os.mkfifo(tmp_path / "fifo")
    for source in (tmp_path / "fifo", Path("/dev/zero")):
        given = [a.replace("{fifo}", str(source)).replace("{out}", str(tmp_path / "out"))
                 .replace("{gpt2}", str(MODELS / "gpt2")) for a in args]
        code, _, err = run_main(monkeypatch, capsys, *given)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "not a regular file" in err and ("a FIFO" in err) == (source.name == "fifo"), err


@pytest.mark.parametrize("content", [b"PK\x03\x04 not a zip at all", b"", b"\x93NUMPY garbage", None])
def test_a_corrupt_heads_checkpoint_is_one_line(monkeypatch, capsys, tmp_path, content):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\n" * 3)
    checkpoint = tmp_path / "heads.npz"
    if content is None:
        np.savez(checkpoint, meta=np.array("[1, 2]"))                # a real .npz, not a heads checkpoint
    else:
        checkpoint.write_bytes(content)
    code, _, err = run_main(monkeypatch, capsys, "heads", "--file", str(corpus), "--checkpoint", str(checkpoint),
                            "--model", str(MODELS / "gpt2"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is not a qkv heads checkpoint" in err, err


@pytest.mark.parametrize("args", [["show", "the cat sat"], ["models"], ["heads", "the cat sat", "--json"]])
def test_output_to_a_full_disk_is_one_line(args):
    """stdout on /dev/full: every write fails with ENOSPC (at the latest at the final flush)."""
    import subprocess
    import sys

    model = [] if args == ["models"] else ["--model", str(MODELS / "gpt2")]
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "qkv", *args, *model], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=PATIENCE)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines == ["qkv: error: cannot write the output (No space left on device); "
                                              "free some space or write elsewhere"], done.stderr
