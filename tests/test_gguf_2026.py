"""GGUF files of the models of 2025–26 (issue 47): llama.cpp's `ernie4_5-moe`, `dots1`, `exaone4`, `deepseek2`,
`gpt-oss`, `mamba` and `nomic-bert` (make test: no torch).

Each file is written on the fly as llama.cpp's convert_hf_to_gguf.py lays it out (tests/fixtures/gguf_convert.py:
gguf's own tensor names, experts stacked (E, out, in), the choice bias as exp_probs_b.bias (E,), each layer's window
as attention.sliding_window_pattern), and read by qkv:
  * ernie4_5_moe: the committed fixture (its reference against transformers is in test_gguf_families.py's NAMES);
    here its F16 file, the file's names and keys, and routed layers every interval-th (llama.cpp's rule);
  * dots1: the committed fixture has group-limited choice and a sliding layer, which llama.cpp's dots1 does not
    run: refused by the writer, and written without them (`lossy`) it is the directory's model without them,
    number for number and weight for weight;
  * exaone4: the fixture's vocabulary (256) is too small for the writer's byte tokenizer, so a random directory
    of its config with 300 tokens (qkv.init) is written and read back: the same knobs and logits bit for bit,
    with its window and without;
  * deepseek2: the deepseek_v2 fixture is in test_gguf_families.py's NAMES (against transformers); here DeepSeek-V3
    (q's latent, σ router with its choice bias and groups; the fixture's YaRN and biases, which this writer does not
    write, left out) from a random directory, kv_b_proj split per head into attn_k_b, attn_v_b and joined back;
  * gpt-oss: llama.cpp fixes the clamp (limit 7, α 1.702) and truncates YaRN's ramp; the fixture (limit 0.6, YaRN
    untruncated) is refused by the writer, and written without them it is the directory's model with them, number
    for number; its experts in MXFP4 are gguf's own dequantisation of the blocks;
  * mamba: the committed fixture against transformers' reference (A written as −exp(A_log), read back as log(−A):
    within float32's rounding; the conv squeezed and unsqueezed);
  * nomic-bert: the committed fixture's encoder (llama.cpp drops the masked-LM head) against transformers' hidden
    states and attention weights, its WordPiece tokenizer (written in llama.cpp's phantom-space form) giving the
    same ids.
Every name and key of qkv's tables for these archs, and of the files, is one gguf.constants declares for the arch.
tests/live/test_live_gguf_2026.py compares such files with transformers on other knob values.
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
from conftest import FIXTURES, MODELS, TOL_ATTENTION, TOL_HIDDEN, max_abs, reference, run_main
from qkv.checkpoints import gguf_cache
from qkv.checkpoints.gguf_archs import ARCHS
from qkv.runtime.errors import QkvError

sys.path.insert(0, str(FIXTURES))
import gguf_convert as C  # noqa: E402
import make_gguf_fixtures as F  # noqa: E402
from gguf_names import check_table, llama_cpp  # noqa: E402

NEW_ARCHS = ("ernie4_5-moe", "dots1", "exaone4", "deepseek2", "gpt-oss", "mamba", "nomic-bert")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_tables_name_what_llama_cpp_declares(arch):
    """qkv's table of ARCH: every tensor part (blk.{i}.<part>, the stacked experts, the top tensors) and every metadata
    key it reads is one gguf.constants declares for the arch."""
    check_table(arch)


def _exaone4_directory(tmp_path, **change):
    """A random exaone4 directory of the fixture's config with 300 tokens (and CHANGE), saved by qkv."""
    hf = json.loads((MODELS / "exaone4" / "config.json").read_text()) | {"vocab_size": 300} | change
    return qkv.init(hf, seed=1, initializer_range=0.2).save(tmp_path / "hf")


def _files(tmp_path):
    """One file of each new arch: (arch, path)."""
    yield "ernie4_5-moe", C.convert(MODELS / "ernie4_5_moe", tmp_path / "e.gguf")
    yield "dots1", C.convert(MODELS / "dots1", tmp_path / "d.gguf", lossy=True)
    yield "exaone4", C.convert(_exaone4_directory(tmp_path), tmp_path / "x.gguf")
    yield "deepseek2", C.convert(_deepseek_v3_directory(tmp_path), tmp_path / "v3.gguf")
    yield "gpt-oss", C.convert(MODELS / "gpt_oss", tmp_path / "o.gguf", lossy=True)
    yield "mamba", C.convert(MODELS / "mamba", tmp_path / "m.gguf")
    yield "nomic-bert", C.convert(MODELS / "nomic_bert", tmp_path / "n.gguf")


def test_files_hold_llama_cpp_names_and_keys(tmp_path):
    """Every tensor of each file (its name without .weight / .bias, the layer as {i}) and every metadata key is
    gguf.constants' for the arch, and qkv reads each file."""
    for arch, path in _files(tmp_path):
        tensors, keys = llama_cpp(arch)
        reader = gguf.GGUFReader(path)
        names = {t.name.removesuffix(".weight").removesuffix(".bias") for t in reader.tensors}   # (ssm_a: no kind)
        layered = {".".join(["blk", "{i}", *n.split(".")[2:]]) if n.startswith("blk.") else n for n in names}
        assert layered <= tensors, (arch, sorted(layered - tensors))
        meta = {f.name for f in reader.fields.values() if not f.name.startswith("GGUF.")}
        ours = {k for k in meta if k.startswith(f"{arch}.")}
        assert ours and ours <= keys, (arch, sorted(ours - keys))
        assert qkv.load(path).config.family in (ARCHS[arch].family, "deepseek_v3")      # (deepseek2: V2 or V3)


# ── ernie4_5-moe ──────────────────────────────────────────────────────────────────────────────────────────────────

def test_ernie_moe_f16_file_is_the_model_within_its_rounding(tmp_path):
    """Ernie 4.5 MoE in F16 (matrices and the stacked experts; norms and the choice bias F32), read in place (the
    default load) and as float32: each tensor within half an F16 step of the fixture's, the logits near transformers'
    (0.02: float16's rounding of weights ~0.15), and the experts each token is sent to the same as the directory's."""
    path = C.convert(MODELS / "ernie4_5_moe", tmp_path / "f16.gguf", "F16")
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(MODELS / "ernie4_5_moe" / "model.safetensors").items()}
    assert set(mine) == set(theirs)
    for k, w in theirs.items():
        assert max_abs(mine[k], w) <= np.abs(w).max() * 2.0 ** -11 + 1e-7, k
    ref = reference("ernie4_5_moe")
    stored, f32 = qkv.load(path), qkv.load(path, dtype=np.float32)
    for model in (stored, f32):
        assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) <= 0.02
    ids = ref["single_input_ids"][0]
    directory = qkv.load(MODELS / "ernie4_5_moe").run(ids)
    for i in (1, 2):                                                  # the routed layers
        np.testing.assert_array_equal(np.sort(f32.run(ids).layers[i].experts, -1),
                                      np.sort(directory.layers[i].experts, -1))


def test_ernie_moe_q8_0_file_is_the_model_within_its_rounding(tmp_path):
    """A 64-wide Ernie 4.5 MoE (every row a whole number of Q8_0's 32-value blocks) in Q8_0, the experts' stacks too:
    each tensor within half a Q8_0 step (max|w| / 127 of its block, the step itself a float16: + 127 of its
    rounding) of the directory's; the default load (the matrices kept as their blocks) and a float32 load give the
    same logits (1e-4). (The logits are not compared with the directory's: a rounding can flip a router's choice.)"""
    hf = json.loads((MODELS / "ernie4_5_moe" / "config.json").read_text()) | {
        "vocab_size": 320, "hidden_size": 64, "head_dim": 16, "intermediate_size": 64, "moe_intermediate_size": 32}
    directory = qkv.init(hf, seed=5, initializer_range=0.2).save(tmp_path / "hf")
    path = C.convert(directory, tmp_path / "q8.gguf", "Q8_0")
    assert {t.tensor_type.name for t in gguf.GGUFReader(path).tensors if len(t.shape) > 1} == {"Q8_0"}
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(directory / "model.safetensors").items()}
    assert set(mine) == set(theirs)
    for k, w in theirs.items():
        assert max_abs(mine[k], w) <= np.abs(w).max() / 127 * (0.5 + 127 * 2.0 ** -11) + 1e-6, k   # (scale: f16)
    ids = np.arange(3, 20)[None]
    stored, f32 = qkv.load(path).forward(ids).logits, qkv.load(path, dtype=np.float32).forward(ids).logits
    assert max_abs(stored, f32) <= 1e-4


def test_ernie_moe_routes_every_interval_th_layer(tmp_path):
    """interleave_moe_layer_step 2 and no leading dense layer: layers 1 and 3 routed, 0 and 2 dense (llama.cpp's rule
    and Ernie4_5_MoeDecoderLayer's, moe_layer_end_index the last layer): the file holds a routed layer's tensors
    there only, and reads as the directory's model, bit for bit."""
    hf = json.loads((MODELS / "ernie4_5_moe" / "config.json").read_text()) | {
        "num_hidden_layers": 4, "moe_layer_start_index": 0, "moe_layer_interval": 2, "moe_layer_end_index": -1}
    directory = qkv.init(hf, seed=2, initializer_range=0.2).save(tmp_path / "hf")
    path = C.convert(directory, tmp_path / "e.gguf")
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    assert {i for i in range(4) if f"blk.{i}.ffn_gate_exps.weight" in names} == {1, 3}
    assert {i for i in range(4) if f"blk.{i}.ffn_gate.weight" in names} == {0, 2}
    ours, read = qkv.load(directory), qkv.load(path)
    assert read.config.dense_layers == ours.config.dense_layers == (0, 2)
    assert read.config == ours.config.with_(norm_eps=float(np.float32(ours.config.norm_eps)))
    ids = np.arange(3, 20)[None]
    np.testing.assert_array_equal(read.forward(ids).logits, ours.forward(ids).logits)


def test_ernie_moe_refusals(tmp_path):
    """The writer refuses what llama.cpp's ernie4_5-moe cannot hold (use_bias, routed layers ending before the last);
    a file whose shared experts are not a whole number of experts wide is refused in one line."""
    for change in ({"use_bias": True}, {"moe_layer_end_index": 1}):
        hf = json.loads((MODELS / "ernie4_5_moe" / "config.json").read_text()) | change
        with pytest.raises(ValueError, match="no biases and routes layers up to the last"):
            C.metadata(hf, "ernie4_5-moe")
    path = _edited(tmp_path, "ernie4_5_moe", {"ernie4_5-moe.expert_shared_feed_forward_length": (24, V.UINT32)})
    with pytest.raises(QkvError, match="not a multiple of the experts' 16") as e:
        qkv.load(path)
    assert "\n" not in str(e.value)


def _edited(tmp_path, name: str, meta: dict, lossy: bool = False):
    """Fixture NAME's GGUF file with metadata keys set (None: removed)."""
    directory = MODELS / name
    hf = json.loads((directory / "config.json").read_text())
    arch = C.ARCH[hf["model_type"]]
    m = {"general.architecture": (arch, V.STRING)} | C.metadata(hf, arch, lossy) | C.vocabulary(directory, hf)
    m = {k: v for k, v in (m | meta).items() if v is not None}
    tensors = C.tensors(hf, load_file(directory / "model.safetensors"), arch)
    return F.write(tmp_path / "x.gguf", m, {k: (w, None) for k, w in tensors.items()})


# ── dots1 ─────────────────────────────────────────────────────────────────────────────────────────────────────────

def test_dots1_file_is_its_directory_without_groups_and_window(tmp_path):
    """llama.cpp's dots1 has no group-limited choice and no sliding window: the fixture (4 groups, 2 kept; layer 2
    sliding) is refused by the writer, and written without them it gives back the directory's tensors bit for bit
    (the experts stacked, the choice bias (E,)) and the directory's model with expert_groups 1 and no window, number
    for number: σ scores, the choice bias, norm_topk_prob, routed_scaling_factor 2.5, the ungated shared experts and
    the dense first layer as the directory's."""
    with pytest.raises(ValueError, match="sliding_window, n_group"):
        C.convert(MODELS / "dots1", tmp_path / "no.gguf")
    path = C.convert(MODELS / "dots1", tmp_path / "d.gguf", lossy=True)
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(MODELS / "dots1" / "model.safetensors").items()}
    assert set(mine) == set(theirs) and all(np.array_equal(mine[k], w) for k, w in theirs.items())
    ours = qkv.load(path)
    directory = qkv.load(MODELS / "dots1").with_config(
        sliding_window=None, layer_windows=None, expert_groups=1, expert_groups_kept=1,
        norm_eps=float(np.float32(1e-6)))                            # the file's eps, float32
    assert ours.config == directory.config
    assert (ours.config.routed_scaling, ours.config.norm_top_k, ours.config.dense_layers) == (2.5, True, (0,))
    ref = reference("dots1")
    np.testing.assert_array_equal(ours.forward(ref["input_ids"], ref["attention_mask"]).logits,
                                  directory.forward(ref["input_ids"], ref["attention_mask"]).logits)
    np.testing.assert_array_equal(ours.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False),
                                  directory.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False))


@pytest.mark.parametrize("meta, fragment", [
    ({"dots1.expert_gating_func": (1, V.UINT32)}, "expert_gating_func 1"),
    ({"dots1.expert_weights_norm": (3, V.UINT32)}, "expert_weights_norm = 3"),
    ({"dots1.expert_shared_count": (0, V.UINT32)}, "shared experts are 0 wide"),
    ({"dots1.expert_group_count": (4, V.UINT32)}, "'dots1.expert_group_count'"),
])
def test_dots1_refusals_in_one_line(tmp_path, monkeypatch, capsys, meta, fragment):
    """A softmax dots1 (gating func 1), a non-boolean weights norm, no shared experts (the tensors are there), a group
    count (llama.cpp's dots1 reads none; qkv would drop it): one line each, exit 2 in the CLI."""
    path = _edited(tmp_path, "dots1", meta, lossy=True)
    with pytest.raises(QkvError) as e:
        qkv.load(path)
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)
    code, _, err = run_main(monkeypatch, capsys, "show", "the cat", "--model", str(path))
    assert code == 2 and err.startswith("qkv: error: ") and err.count("\n") == 1, err


# ── exaone4 ───────────────────────────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("change", [{}, {"sliding_window": None, "layer_types": ["full_attention"] * 3},
                                    {"layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}])
def test_exaone4_file_is_its_directory(tmp_path, change):
    """EXAONE 4 written as llama.cpp does (the window and a bool per layer; none without a window) reads as the
    directory's model: its knobs (windows, the full layers without RoPE while the model slides, each layer turned by
    RoPE without a window) and logits bit for bit, the directory's tensors bit for bit."""
    directory = _exaone4_directory(tmp_path, **change)
    path = C.convert(directory, tmp_path / "x.gguf")
    ours, read = qkv.load(directory), qkv.load(path)
    assert read.config == ours.config.with_(norm_eps=float(np.float32(ours.config.norm_eps)))
    assert (read.config.no_rope_layers == ()) == (change.get("sliding_window", 5) is None)
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(directory / "model.safetensors").items()}
    assert set(mine) == set(theirs) and all(np.array_equal(mine[k], w) for k, w in theirs.items())
    ids = np.arange(3, 20)[None]
    np.testing.assert_array_equal(read.forward(ids).logits, ours.forward(ids).logits)


@pytest.mark.parametrize("meta", [{"exaone4.attention.sliding_window_pattern": None},
                                  {"exaone4.attention.sliding_window": None},
                                  {"exaone4.attention.sliding_window_pattern": ([True, False], V.ARRAY, V.BOOL)}])
def test_exaone4_half_a_window_is_refused(tmp_path, meta):
    """A window without each layer's kind, the kinds without a window, or kinds for another number of layers: one
    line (llama.cpp would guess the rest)."""
    directory = _exaone4_directory(tmp_path)
    hf = json.loads((directory / "config.json").read_text())
    m = {"general.architecture": ("exaone4", V.STRING)} | C.metadata(hf, "exaone4") | C.vocabulary(directory, hf)
    m = {k: v for k, v in (m | meta).items() if v is not None}
    tensors = C.tensors(hf, load_file(directory / "model.safetensors"), "exaone4")
    with pytest.raises(QkvError, match="it needs both") as e:
        qkv.load(F.write(tmp_path / "w.gguf", m, {k: (w, None) for k, w in tensors.items()}))
    assert "\n" not in str(e.value)


# ── deepseek2 ─────────────────────────────────────────────────────────────────────────────────────────────────────

def _deepseek_v3_directory(tmp_path, **change):
    """A random DeepSeek-V3 directory of the fixture's config (q's latent, 4 groups, 2 kept, norm_topk_prob) with 300
    tokens, plain RoPE and no biases (and CHANGE), saved by qkv."""
    hf = json.loads((MODELS / "deepseek_v3" / "config.json").read_text()) | {
        "vocab_size": 300, "attention_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 2e4}}
    return qkv.init(hf | change, seed=3, initializer_range=0.2).save(tmp_path / "v3")


@pytest.mark.parametrize("change", [{}, {"q_lora_rank": None, "n_group": 1, "topk_group": 1, "norm_topk_prob": False}])
def test_deepseek_v3_file_is_its_directory(tmp_path, change):
    """DeepSeek-V3 written as llama.cpp does (latent attention as one K/V head of r_kv + d_rot, kv_b_proj per head as
    attn_k_b (H, r_kv, d_nope) and attn_v_b (H, d_v, r_kv), σ gating, the choice bias, groups) reads as the
    directory's model: its knobs and logits bit for bit, and kv_b_proj joined back bit for bit."""
    directory = _deepseek_v3_directory(tmp_path, **change)
    path = C.convert(directory, tmp_path / "v3.gguf")
    shapes = {t.name: tuple(int(x) for x in reversed(t.shape.tolist())) for t in gguf.GGUFReader(path).tensors}
    assert (shapes["blk.1.attn_k_b.weight"], shapes["blk.1.attn_v_b.weight"]) == ((4, 16, 8), (4, 12, 16))
    ours, read = qkv.load(directory), qkv.load(path)
    assert read.config == ours.config.with_(norm_eps=float(np.float32(ours.config.norm_eps)))
    assert (read.config.family, read.config.router_score, read.config.expert_groups) == \
        ("deepseek_v3", "sigmoid", 4 if not change else 1)
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(directory / "model.safetensors").items()}
    assert set(mine) == set(theirs) and all(np.array_equal(mine[k], w) for k, w in theirs.items())
    ids = np.arange(3, 20)[None]
    np.testing.assert_array_equal(read.forward(ids).logits, ours.forward(ids).logits)
    np.testing.assert_array_equal(read.generate(ids, 6, temperature=0, stop_at_eos=False),
                                  ours.generate(ids, 6, temperature=0, stop_at_eos=False))


def test_deepseek_writer_refuses_what_llama_cpp_loses(tmp_path):
    """The deepseek_v3 fixture has YaRN and attention biases (llama.cpp's deepseek2 holds no biases; YaRN's mscale is
    not written here): refused by the writer rather than compared wrong."""
    with pytest.raises(ValueError, match="attention biases, RoPE scaling"):
        C.convert(MODELS / "deepseek_v3", tmp_path / "x.gguf")


def test_deepseek2_file_of_the_older_layout_equals_transformers(tmp_path):
    """A deepseek2 file written before llama.cpp split kv_b_proj (H K/V heads of key size d_nope + d_rot, value size
    d_v, no *_mla keys; attn_kv_b whole) of the deepseek_v2 fixture: transformers' logits on a padded batch (1e-4),
    and the logits of the split layout's file bit for bit."""
    hf = json.loads((MODELS / "deepseek_v2" / "config.json").read_text())
    a, H = "deepseek2", hf["num_attention_heads"]
    meta = {"general.architecture": (a, V.STRING)} | C.metadata(hf, a) | C.vocabulary(MODELS / "deepseek_v2", hf)
    meta |= {f"{a}.attention.head_count_kv": (H, V.UINT32),
             f"{a}.attention.key_length": (hf["qk_nope_head_dim"] + hf["qk_rope_head_dim"], V.UINT32),
             f"{a}.attention.value_length": (hf["v_head_dim"], V.UINT32)}
    for key in ("key_length_mla", "value_length_mla"):
        meta.pop(f"{a}.attention.{key}")
    weights = load_file(MODELS / "deepseek_v2" / "model.safetensors")
    tensors = {k: w for k, w in C.tensors(hf, weights, a).items() if ".attn_k_b." not in k and ".attn_v_b." not in k}
    for i in range(hf["num_hidden_layers"]):
        tensors[f"blk.{i}.attn_kv_b.weight"] = weights[f"model.layers.{i}.self_attn.kv_b_proj.weight"]
    old = qkv.load(F.write(tmp_path / "old.gguf", meta, {k: (w, None) for k, w in tensors.items()}))
    ref = reference("deepseek_v2")
    real = ref["attention_mask"].astype(bool)
    logits = old.forward(ref["input_ids"], ref["attention_mask"]).logits
    assert max_abs(logits[real], ref["logits"][real]) <= TOL_HIDDEN
    new = qkv.load(C.convert(MODELS / "deepseek_v2", tmp_path / "new.gguf"))
    np.testing.assert_array_equal(logits, new.forward(ref["input_ids"], ref["attention_mask"]).logits)


@pytest.mark.parametrize("meta, fragment", [
    ({"deepseek2.expert_weights_norm": (True, V.BOOL)}, "expert_weights_norm True"),
    ({"deepseek2.expert_gating_func": (3, V.UINT32)}, "expert_gating_func 3"),
    ({"deepseek2.attention.head_count_kv": (4, V.UINT32)}, "neither llama.cpp's latent layout"),
    ({"deepseek2.rope.scaling.yarn_log_multiplier": (0.1, V.FLOAT32)}, "'deepseek2.rope.scaling.yarn_log_multiplier'"),
    ({"deepseek2.attention.kv_lora_rank": None}, "key size"),
])
def test_deepseek2_refusals_in_one_line(tmp_path, meta, fragment):
    """A V2 (softmax) file that renormalises, an unknown gating function, the older layout's head count with the new
    layout's sizes, YaRN's keys, a latent without its rank: one line each."""
    path = _edited(tmp_path, "deepseek_v2", meta)
    with pytest.raises(QkvError) as e:
        qkv.load(path)
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


# ── gpt-oss ───────────────────────────────────────────────────────────────────────────────────────────────────────

def _as_llama_cpp_runs_gpt_oss(model):
    """MODEL (the gpt_oss fixture) with llama.cpp's clamp and YaRN's ramp truncated, as a gpt-oss file runs."""
    scaling = dict(model.config.rope_scaling) | {"truncate": True}
    return model.with_config(glu_limit=7.0, rope_scaling=scaling, norm_eps=float(np.float32(model.config.norm_eps)))


def test_gpt_oss_file_is_its_directory_as_llama_cpp_runs_it(tmp_path):
    """The fixture (swiglu_limit 0.6, YaRN with truncate false) is refused by the writer; written without them, its
    tensors come back bit for bit (gate_up_proj re-interleaved from ffn_gate_exps and ffn_up_exps, down_proj
    transposed back, the sinks, the router's bias) and it is the directory's model with llama.cpp's clamp and
    truncated YaRN, number for number: every layer sliding in turn by the file's window, sinks, biases."""
    with pytest.raises(ValueError, match="swiglu_limit, truncate"):
        C.convert(MODELS / "gpt_oss", tmp_path / "no.gguf")
    path = C.convert(MODELS / "gpt_oss", tmp_path / "o.gguf", lossy=True)
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(MODELS / "gpt_oss" / "model.safetensors").items()}
    assert set(mine) == set(theirs) and all(np.array_equal(mine[k], w) for k, w in theirs.items())
    ours, directory = qkv.load(path), _as_llama_cpp_runs_gpt_oss(qkv.load(MODELS / "gpt_oss"))
    assert ours.config == directory.config
    assert ours.config.layer_windows == (5, None, 5) and ours.config.attn_sinks
    ref = reference("gpt_oss")
    out = ours.forward(ref["input_ids"], ref["attention_mask"])
    np.testing.assert_array_equal(out.logits, directory.forward(ref["input_ids"], ref["attention_mask"]).logits)
    np.testing.assert_array_equal(ours.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False),
                                  directory.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False))


def test_gpt_oss_mxfp4_experts_are_ggufs_own_dequantisation(tmp_path):
    """A gpt-oss file whose experts are MXFP4 blocks (as llama.cpp writes OpenAI's checkpoints; the rest F32): the
    experts qkv reads are exactly what gguf.quants.dequantize gives of those blocks, re-interleaved; the default
    (stored) load and a float32 load give the same logits."""
    hf = json.loads((MODELS / "gpt_oss" / "config.json").read_text()) | {
        "vocab_size": 300, "hidden_size": 64, "intermediate_size": 32, "head_dim": 16, "swiglu_limit": 7.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 2e4}}
    directory = qkv.init(hf, seed=4, initializer_range=0.2).save(tmp_path / "hf")
    meta = {"general.architecture": ("gpt-oss", V.STRING)} | C.metadata(hf, "gpt-oss") | C.vocabulary(directory, hf)
    tensors = C.tensors(hf, load_file(directory / "model.safetensors"), "gpt-oss")
    encoded = {k: F.encode(w, "MXFP4" if "_exps.weight" in k else "F32") for k, w in tensors.items()}
    path = F.write(tmp_path / "mx.gguf", meta, encoded)
    blocks = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in gguf.GGUFReader(path).tensors
              if t.tensor_type.name == "MXFP4"}
    assert len(blocks) == 3 * hf["num_hidden_layers"]
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    gate, up = blocks["blk.1.ffn_gate_exps.weight"], blocks["blk.1.ffn_up_exps.weight"]         # (E, f, d) each
    np.testing.assert_array_equal(mine["layers.1.mlp.experts.gate_up_proj"][..., 0::2], gate.transpose(0, 2, 1))
    np.testing.assert_array_equal(mine["layers.1.mlp.experts.gate_up_proj"][..., 1::2], up.transpose(0, 2, 1))
    np.testing.assert_array_equal(mine["layers.1.mlp.experts.down_proj"],
                                  blocks["blk.1.ffn_down_exps.weight"].transpose(0, 2, 1))
    ids = np.arange(3, 20)[None]
    np.testing.assert_allclose(qkv.load(path).forward(ids).logits,
                               qkv.load(path, dtype=np.float32).forward(ids).logits, atol=1e-5)


@pytest.mark.parametrize("meta, fragment", [
    ({"gpt-oss.attention.sliding_window": None}, "attention.sliding_window None"),
    ({"gpt-oss.rope.scaling.type": ("longrope", V.STRING)}, "'longrope'"),
    ({"gpt-oss.swiglu_clamp_exp": (7.0, V.FLOAT32)}, "'gpt-oss.swiglu_clamp_exp'"),
])
def test_gpt_oss_refusals_in_one_line(tmp_path, meta, fragment):
    """No window, another RoPE scaling, a key qkv does not read: one line each."""
    with pytest.raises(QkvError) as e:
        qkv.load(_edited(tmp_path, "gpt_oss", meta, lossy=True))
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


# ── mamba ─────────────────────────────────────────────────────────────────────────────────────────────────────────

def test_mamba_file_equals_transformers(tmp_path):
    """llama.cpp's mamba file of the fixture (F32): a padded batch's logits and hidden states (real positions), every
    layer's output, one sequence, greedy ids with and without the cache: transformers' numbers (1e-4); its tensors the
    directory's, bit for bit but A_log (log(−(−exp(A_log))): float32's rounding); the same knobs."""
    path = C.convert(MODELS / "mamba", tmp_path / "m.gguf")
    ref, model = reference("mamba"), qkv.load(path)
    assert model.config == qkv.load(MODELS / "mamba").config.with_(norm_eps=float(np.float32(1e-5)))
    real = ref["attention_mask"].astype(bool)
    trace = model.run(ref["input_ids"][0], keep=("residual_out",))
    out = model.forward(ref["input_ids"], ref["attention_mask"])
    assert max_abs(out.logits[real], ref["logits"][real]) <= TOL_HIDDEN
    assert max_abs(out.hidden[real], ref["hidden"][real]) <= TOL_HIDDEN
    for i in range(model.config.n_layers):                          # row 0: no padding
        assert max_abs(trace.layer(i).residual_out, ref["hidden_states"][i, 0]) <= TOL_HIDDEN
    assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) <= TOL_HIDDEN
    new = ref["greedy_ids"].shape[1] - ref["single_input_ids"].shape[1]
    assert np.array_equal(model.generate(ref["single_input_ids"], new, temperature=0, stop_at_eos=False),
                          ref["greedy_ids"])
    assert np.array_equal(model.generate(ref["single_input_ids"], new, temperature=0, stop_at_eos=False,
                                         use_cache=False), ref["greedy_ids_no_cache"])
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = load_file(MODELS / "mamba" / "model.safetensors")
    assert set(mine) == set(theirs)
    for k, w in theirs.items():
        if k.endswith("A_log"):
            np.testing.assert_allclose(mine[k], w, rtol=4 * np.finfo(np.float32).eps, atol=1e-6)
        else:
            assert np.array_equal(mine[k], w), k


def test_mamba_f16_file_reads_in_place(tmp_path):
    """Mamba in F16 (every matrix, ssm_a too, which llama.cpp would keep F32): the default load reads the matrices as
    their blocks and the changed ones (A = −exp(A_log), the conv) as values, never as rows: its logits equal the
    float32 load's (1e-5), and transformers' within F16's rounding (0.02)."""
    path = C.convert(MODELS / "mamba", tmp_path / "m16.gguf", "F16")
    ids = reference("mamba")["single_input_ids"]
    stored, f32 = qkv.load(path).forward(ids).logits, qkv.load(path, dtype=np.float32).forward(ids).logits
    assert max_abs(stored, f32) <= 1e-5
    assert max_abs(f32, reference("mamba")["single_logits"]) <= 0.02


@pytest.mark.parametrize("meta, fragment", [
    ({"mamba.ssm.dt_b_c_rms": (True, V.BOOL)}, "Falcon-Mamba"),
    ({"mamba.ssm.inner_size": (48, V.UINT32)}, "48 channels for d_model 32"),
    ({"mamba.ssm.state_size": (0, V.UINT32)}, "a size of 0 (d_state)"),
])
def test_mamba_refusals_in_one_line(tmp_path, meta, fragment):
    """Falcon-Mamba's norms of Δ, B, C, channels no whole multiple of d_model, a zero size: one line each."""
    with pytest.raises(QkvError) as e:
        qkv.load(_edited(tmp_path, "mamba", meta))
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


# ── nomic-bert ────────────────────────────────────────────────────────────────────────────────────────────────────

def test_nomic_bert_file_equals_transformers(tmp_path):
    """llama.cpp's nomic-bert file of the fixture (the encoder; the masked-LM head is not written): transformers'
    hidden states on a padded batch with token types and on one sequence (1e-4), its attention weights (1e-5); the
    text's ids from the file's WordPiece vocabulary equal transformers' ([CLS] … [SEP]); the encoder's tensors bit for
    bit; the directory's knobs but the head."""
    path = C.convert(MODELS / "nomic_bert", tmp_path / "n.gguf")
    ref, model = reference("nomic_bert"), qkv.load(path)
    directory = qkv.load(MODELS / "nomic_bert").config
    assert model.config == directory.with_(lm_head=False, norm_eps=float(np.float32(1e-12)), bos_token_id=2)
    real = ref["attention_mask"].astype(bool)
    out = model.forward(ref["input_ids"], ref["attention_mask"], ref["token_type_ids"])
    assert out.logits is None and max_abs(out.hidden[real], ref["hidden"][real]) <= TOL_HIDDEN
    single = model.forward(ref["single_input_ids"])
    assert max_abs(single.hidden, ref["single_hidden"]) <= TOL_HIDDEN
    assert max_abs(single.attentions, ref["single_attentions"]) <= TOL_ATTENTION
    assert model.encode(str(ref["text"]))[0].tolist() == ref["text_ids"].tolist()
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("nomic_bert."): v for k, v in load_file(MODELS / "nomic_bert" / "model.safetensors")
              .items() if not k.startswith("cls.")}
    assert set(mine) == set(theirs) and all(np.array_equal(mine[k], w) for k, w in theirs.items())


@pytest.mark.parametrize("meta, fragment", [
    ({"nomic-bert.attention.causal": (True, V.BOOL)}, "attention.causal True"),
    ({"tokenizer.ggml.token_type_count": (0, V.UINT32)}, "token_type_count = 0"),
    ({"tokenizer.ggml.model": ("t5", V.STRING)}, "tokenizer model 't5'"),
])
def test_nomic_bert_refusals_in_one_line(tmp_path, meta, fragment):
    """Causal attention, no token types, a tokenizer other than WordPiece or byte-level BPE: one line each."""
    with pytest.raises(QkvError) as e:
        qkv.load(_edited(tmp_path, "nomic_bert", meta))
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)
