"""GGUF files of the state-space models and hybrids (issue 47): llama.cpp's `jamba`, `mamba2`, `granitehybrid` and
`falcon-h1` (make test: no torch).

Each file is written on the fly as llama.cpp's convert_hf_to_gguf.py lays it out (tests/fixtures/gguf_convert.py:
gguf's own tensor names; A written as −exp(A_log), the conv's weight squeezed to (channels, k); Mamba-2's A and D as
(H, 1), dt_bias as ssm_dt.bias, its gated norm's weight by group (G, E / G); Jamba's experts stacked (E, out, in) and
its K/V heads one count a layer, 0 on a Mamba layer; Granite's fused [gate; up] FFNs split, its Q/K rows permuted as
Llama's), and read by qkv:
  * jamba: the committed fixture (Mamba / attention / Mamba / attention, FFNs routed in layers 0 and 3) against
    transformers' reference: a padded batch (both sides), every layer's input, the attention layers' weights, greedy
    ids with and without the cache; the tensors the directory's bit for bit but A_log (float32's rounding of
    log(−(−exp(A_log))));
  * mamba2: the committed fixture (8 heads in 2 groups) the same way; the file has no chunk size (transformers' 256,
    the same numbers) and no clamp of Δ (the fixture has none);
  * granitehybrid: the committed fixture (Mamba-2 / attention / Mamba-2, every FFN routed with a shared one, Granite's
    four multipliers, no positions) the same way as Jamba's; its multipliers float32 in the file;
  * falcon-h1: llama.cpp folds the µP multipliers into the weights and normalises the mixer's output after the gate;
    the fixture normalises before it, so the writer refuses it and writes it `lossy` (its norm after the gate): read
    back with every multiplier 1, it is the directory's model with that norm, number for number (1e-5: the folding's
    float32 rounding), its tensors the directory's times their multipliers.
Every name and key of qkv's tables for these archs, and of the files, is one gguf.constants declares for the arch.
tests/live/test_live_gguf_hybrids.py compares such files with transformers on other knob values.
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
from conftest import FIXTURES, MODELS, TOL_ATTENTION, TOL_HIDDEN, edited, max_abs, reference
from qkv.checkpoints import gguf_cache
from qkv.checkpoints.gguf_archs import ARCHS
from qkv.core.stack import transformer
from qkv.core.trace import Recorder
from qkv.runtime.errors import QkvError

sys.path.insert(0, str(FIXTURES))
import gguf_convert as C  # noqa: E402
import make_gguf_fixtures as F  # noqa: E402
from gguf_names import assert_refused_in_one_line, check_table, llama_cpp

HYBRID_ARCHS = {"jamba": "jamba", "mamba2": "mamba2", "granitehybrid": "granitemoehybrid",    # GGUF arch → fixture
                "falcon-h1": "falcon_h1"}
LOSSY = {"falcon_h1"}                        # fixtures llama.cpp's converter writes only lossy (Falcon-H1's norm)
FLOAT32_EPS = float(np.float32(1e-6)), float(np.float32(1e-5))


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_tables_name_what_llama_cpp_declares(arch):
    """qkv's table of ARCH: every tensor part (blk.{i}.<part>, the stacked experts, the top tensors) and every metadata
    key it reads is one gguf.constants declares for the arch."""
    check_table(arch)


@pytest.mark.parametrize("arch, name", HYBRID_ARCHS.items())
def test_files_hold_llama_cpp_names_and_keys(arch, name, tmp_path):
    """Every tensor of the fixture's file (its name without .weight / .bias, the layer as {i}) and every metadata key is
    gguf.constants' for the arch, and qkv reads the file as the family."""
    path = C.convert(MODELS / name, tmp_path / f"{name}.gguf", lossy=name in LOSSY)
    tensors, keys = llama_cpp(arch)
    reader = gguf.GGUFReader(path)
    names = {t.name.removesuffix(".weight").removesuffix(".bias") for t in reader.tensors}     # (ssm_a: no kind)
    layered = {".".join(["blk", "{i}", *n.split(".")[2:]]) if n.startswith("blk.") else n for n in names}
    assert layered <= tensors, sorted(layered - tensors)
    meta = {f.name for f in reader.fields.values() if not f.name.startswith("GGUF.")}
    ours = {k for k in meta if k.startswith(f"{arch}.")}
    assert ours and ours <= keys, sorted(ours - keys)
    assert qkv.load(path).config.family == ARCHS[arch].family


def _same_tensors(path, name: str) -> None:
    """The float32 directory qkv makes of the file holds the fixture's tensors: bit for bit, but A_log (float32's
    rounding of log(−(−exp(A_log))): 4 ulp)."""
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(MODELS / name / "model.safetensors").items()}
    assert set(mine) == set(theirs), sorted(set(mine) ^ set(theirs))
    for k, w in theirs.items():
        if k.endswith("A_log"):
            np.testing.assert_allclose(mine[k], w, rtol=4 * np.finfo(np.float32).eps, atol=1e-6)
        else:
            assert np.array_equal(mine[k], w), k


def _greedy_ids(model, ref) -> None:
    """Greedy ids with and without the cache: transformers'."""
    new = ref["greedy_ids"].shape[1] - ref["single_input_ids"].shape[1]
    assert np.array_equal(model.generate(ref["single_input_ids"], new, temperature=0, stop_at_eos=False),
                          ref["greedy_ids"])
    assert np.array_equal(model.generate(ref["single_input_ids"], new, temperature=0, stop_at_eos=False,
                                         use_cache=False), ref["greedy_ids_no_cache"])


def _edited(tmp_path, name: str, meta: dict, drop: str | None = None):
    """Fixture NAME's GGUF file with metadata keys set (None: removed), without the tensors whose name holds DROP."""
    directory = MODELS / name
    hf = json.loads((directory / "config.json").read_text())
    arch = C.ARCH[hf["model_type"]]
    m = {"general.architecture": (arch, V.STRING)} | C.metadata(hf, arch, name in LOSSY) | C.vocabulary(directory, hf)
    m = {k: v for k, v in (m | meta).items() if v is not None}
    tensors = C.tensors(hf, load_file(directory / "model.safetensors"), arch)
    return F.write(tmp_path / "x.gguf", m, {k: (w, None) for k, w in tensors.items() if not (drop and drop in k)})


# ── jamba ─────────────────────────────────────────────────────────────────────────────────────────────────────────

def test_jamba_file_equals_transformers(tmp_path):
    """llama.cpp's jamba file of the fixture (F32): the directory's knobs (the attention layers from the per-layer K/V
    heads, the routed ones from the routers the file holds); a padded batch's logits, hidden states and every layer's
    input at the real positions (1e-4), the attention layers' weights (1e-5), one sequence, greedy ids with and without
    the cache: transformers' numbers; the tensors the directory's."""
    path = C.convert(MODELS / "jamba", tmp_path / "j.gguf")
    ref, model = reference("jamba"), qkv.load(path)
    assert model.config == qkv.load(MODELS / "jamba").config.with_(norm_eps=FLOAT32_EPS[0])
    assert model.config.layer_kinds == ("mamba", "attention", "mamba", "attention")
    assert [model.config.moe_layer(i) for i in range(4)] == [True, False, False, True]
    _equals_reference(model, ref)
    _same_tensors(path, "jamba")


def _equals_reference(model, ref) -> None:
    """A hybrid against its fixture's reference: a padded batch's logits, hidden states and every layer's input at the
    real positions (1e-4), the attention layers' weights (1e-5), one sequence, greedy ids with and without the cache."""
    attention = [i for i, kind in enumerate(model.config.layer_kinds) if kind == "attention"]
    real = ref["attention_mask"].astype(bool)
    rec = Recorder(keep=("residual", "attentions"))
    hidden, logits = transformer(model.weights, model.config, ref["input_ids"], ref["attention_mask"], rec=rec)
    assert max_abs(logits[real], ref["logits"][real]) <= TOL_HIDDEN
    assert max_abs(hidden[real], ref["hidden"][real]) <= TOL_HIDDEN
    for i in range(model.config.n_layers):                          # the hybrids' hidden_states: each layer's input
        assert max_abs(rec.store[i]["residual"][real], ref["hidden_states"][i][real]) <= TOL_HIDDEN
    for j, i in enumerate(attention):                                # the attention layers' weights
        for b, keep in enumerate(real):
            got = rec.store[i]["attentions"][b][:, keep][:, :, keep]
            assert max_abs(got, ref["attentions"][j, b][:, keep][:, :, keep]) <= TOL_ATTENTION
    single = model.forward(ref["single_input_ids"])
    assert max_abs(single.logits, ref["single_logits"]) <= TOL_HIDDEN
    if "single_attentions" in ref:                                   # (Granite's fixture keeps the batch's only)
        assert max_abs(single.attentions[attention], ref["single_attentions"]) <= TOL_ATTENTION
    _greedy_ids(model, ref)


def test_jamba_f16_file_reads_in_place(tmp_path):
    """Jamba in F16 (every matrix, the stacked experts too; the fixture's sizes are too small for Q8_0's blocks of
    32): the default load keeps the blocks and reads the changed tensors (A, the conv) as values: its logits equal the
    float32 load's (1e-5) and transformers' within F16's rounding (0.02)."""
    path = C.convert(MODELS / "jamba", tmp_path / "j16.gguf", "F16")
    ids = reference("jamba")["single_input_ids"]
    stored, f32 = qkv.load(path).forward(ids).logits, qkv.load(path, dtype=np.float32).forward(ids).logits
    assert max_abs(stored, f32) <= 1e-5
    assert 0 < max_abs(f32, reference("jamba")["single_logits"]) <= 0.02


def test_jamba_writer_refuses_what_llama_cpp_loses(tmp_path):
    """What llama.cpp's jamba does not run (in_proj / out_proj biases, a GELU) is refused by the writer, never written
    away: the tests compare only with numbers llama.cpp itself would give."""
    hf = json.loads((MODELS / "jamba" / "config.json").read_text())
    for change in ({"mamba_proj_bias": True}, {"hidden_act": "gelu"}, {"mamba_conv_bias": False}):
        with pytest.raises(ValueError, match="jamba: llama.cpp's file loses"):
            C.metadata(hf | change, "jamba")


@pytest.mark.parametrize("meta, fragment", [
    ({"jamba.attention.head_count_kv": ([0, 2, 0, 1], V.ARRAY, V.UINT32)}, "attention layers have [1, 2] K/V heads"),
    ({"jamba.attention.head_count_kv": ([0, 2, 0], V.ARRAY, V.UINT32)}, "holds 3 counts for 4 layers"),
    ({"jamba.attention.head_count_kv": ([2, 0, 0, 0], V.ARRAY, V.UINT32)}, "a jamba model of this config never reads"),
    ({"jamba.ssm.inner_size": (48, V.UINT32)}, "48 Mamba channels for d_model 32"),
    ({"jamba.ssm.dt_b_c_rms": (True, V.BOOL)}, "jamba.ssm.dt_b_c_rms"),
])
def test_jamba_refusals_in_one_line(tmp_path, meta, fragment, monkeypatch, capsys):
    """Attention layers of different K/V heads, a count a layer of the wrong length, layers whose tensors are not the
    kind the counts say, channels no whole multiple of d_model, a key qkv does not read: one line each, and the CLI's
    one line with exit 2."""
    path = _edited(tmp_path, "jamba", meta)
    assert_refused_in_one_line(path, fragment, monkeypatch, capsys)


def test_jamba_routed_layers_no_period_makes_are_refused(tmp_path):
    """Routers on layers 0, 1 and 3 of 4 (no period and offset mark them: a JambaForCausalLM cannot hold it): one
    line."""
    directory = MODELS / "jamba"
    hf = json.loads((directory / "config.json").read_text())
    m = {"general.architecture": ("jamba", V.STRING)} | C.metadata(hf, "jamba") | C.vocabulary(directory, hf)
    tensors = C.tensors(hf, load_file(directory / "model.safetensors"), "jamba")
    for part in ("ffn_gate", "ffn_up", "ffn_down"):                   # layer 1's dense FFN → layer 0's experts
        tensors.pop(f"blk.1.{part}.weight")
        tensors[f"blk.1.{part}_exps.weight"] = tensors[f"blk.0.{part}_exps.weight"]
    tensors["blk.1.ffn_gate_inp.weight"] = tensors["blk.0.ffn_gate_inp.weight"]
    with pytest.raises(QkvError, match=r"routes layers \[0, 1, 3\] \(those holding") as e:
        qkv.load(F.write(tmp_path / "x.gguf", m, {k: (w, None) for k, w in tensors.items()}))
    assert "\n" not in str(e.value)


# ── mamba2 ────────────────────────────────────────────────────────────────────────────────────────────────────────

def test_mamba2_file_equals_transformers(tmp_path):
    """llama.cpp's mamba2 file of the fixture (F32): the directory's knobs (but the chunk size, which llama.cpp does
    not write: the same numbers); a padded batch's logits, hidden states and every layer's input at the real
    positions, one sequence, greedy ids with and without the cache: transformers' numbers (1e-4); the tensors the
    directory's (A_log within float32's rounding; the rest bit for bit)."""
    path = C.convert(MODELS / "mamba2", tmp_path / "m2.gguf")
    ref, model = reference("mamba2"), qkv.load(path)
    directory = qkv.load(MODELS / "mamba2").config
    assert model.config == directory.with_(norm_eps=FLOAT32_EPS[1], mamba=directory.mamba.__class__(
        **{**vars(directory.mamba), "chunk_size": 256}))
    real = ref["attention_mask"].astype(bool)
    rec = Recorder(keep=("residual",))
    hidden, logits = transformer(model.weights, model.config, ref["input_ids"], ref["attention_mask"], rec=rec)
    assert max_abs(logits[real], ref["logits"][real]) <= TOL_HIDDEN
    assert max_abs(hidden[real], ref["hidden"][real]) <= TOL_HIDDEN
    for i in range(model.config.n_layers):                          # Mamba2's hidden_states: each layer's input
        assert max_abs(rec.store[i]["residual"][real], ref["hidden_states"][i][real]) <= TOL_HIDDEN
    assert max_abs(model.forward(ref["single_input_ids"]).logits, ref["single_logits"]) <= TOL_HIDDEN
    _greedy_ids(model, ref)
    _same_tensors(path, "mamba2")


def test_mamba2_f16_file_reads_in_place(tmp_path):
    """Mamba-2 in F16 (every matrix; A, D and the norm's groups too): the stored load's logits equal the float32
    load's (1e-5), and transformers' within F16's rounding (0.02)."""
    path = C.convert(MODELS / "mamba2", tmp_path / "m16.gguf", "F16")
    ids = reference("mamba2")["single_input_ids"]
    stored, f32 = qkv.load(path).forward(ids).logits, qkv.load(path, dtype=np.float32).forward(ids).logits
    assert max_abs(stored, f32) <= 1e-5
    assert max_abs(f32, reference("mamba2")["single_logits"]) <= 0.02


def test_mamba2_writer_refuses_a_clamp_llama_cpp_drops():
    """A time_step_limit other than (0, ∞) is not in llama.cpp's file (its scan does not clamp Δ): refused, and written
    away only when asked (lossy)."""
    hf = json.loads((MODELS / "mamba2" / "config.json").read_text()) | {"time_step_limit": [0.01, 0.5]}
    with pytest.raises(ValueError, match="time_step_limit"):
        C.metadata(hf, "mamba2")
    assert "mamba2.ssm.group_count" in C.metadata(hf, "mamba2", lossy=True)


@pytest.mark.parametrize("meta, fragment", [
    ({"mamba2.ssm.group_count": (3, V.UINT32)}, "8 heads and 3 groups"),
    ({"mamba2.ssm.group_count": None}, "the metadata implies"),
    ({"mamba2.ssm.state_size": (0, V.UINT32)}, "a size of 0 (d_state)"),
])
def test_mamba2_refusals_in_one_line(tmp_path, meta, fragment):
    """Groups that do not divide the heads, a file without its groups (one group: the tensors disagree), a zero size:
    one line each."""
    with pytest.raises(QkvError) as e:
        qkv.load(_edited(tmp_path, "mamba2", meta))
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


# ── granitehybrid ─────────────────────────────────────────────────────────────────────────────────────────────────

def test_granite_hybrid_file_equals_transformers(tmp_path):
    """llama.cpp's granitehybrid file of the fixture (F32): the directory's knobs (but what the file does not hold:
    the chunk size, the context, the multipliers and ε as float32); transformers' numbers as Jamba's file gives them
    (`_equals_reference`); the tensors the directory's: the experts' and shared FFN's [gate; up] joined back, Q and K
    un-permuted, bit for bit, A_log within float32's rounding."""
    path = C.convert(MODELS / "granitemoehybrid", tmp_path / "g.gguf")
    ref, model = reference("granitemoehybrid"), qkv.load(path)
    directory = qkv.load(MODELS / "granitemoehybrid").config
    f32 = lambda x: float(np.float32(x))                                     # noqa: E731
    assert model.config == directory.with_(
        norm_eps=f32(1e-6), residual_multiplier=f32(0.7), attn_scale=f32(0.3), max_positions=2 ** 20,
        mamba=directory.mamba.__class__(**{**vars(directory.mamba), "chunk_size": 256}))
    assert model.config.layer_kinds == ("mamba", "attention", "mamba")
    _equals_reference(model, ref)
    _same_tensors(path, "granitemoehybrid")


def test_granite_hybrid_f16_file_reads_in_place(tmp_path):
    """Granite 4 hybrid in F16: the stored load (the fused gate and up values, joined; the rest as blocks) gives the
    float32 load's logits (1e-5), and transformers' within F16's rounding (0.02)."""
    path = C.convert(MODELS / "granitemoehybrid", tmp_path / "g16.gguf", "F16")
    ids = reference("granitemoehybrid")["single_input_ids"]
    stored, f32 = qkv.load(path).forward(ids).logits, qkv.load(path, dtype=np.float32).forward(ids).logits
    assert max_abs(stored, f32) <= 1e-5
    assert 0 < max_abs(f32, reference("granitemoehybrid")["single_logits"]) <= 0.02


def test_granite_hybrid_writer_refuses_what_llama_cpp_loses():
    """RoPE (llama.cpp turns Bamba's attention only), biases, a GELU, no experts: refused by the writer."""
    hf = json.loads((MODELS / "granitemoehybrid" / "config.json").read_text())
    for change in ({"position_embedding_type": "rope"}, {"attention_bias": True}, {"mamba_proj_bias": True},
                   {"hidden_act": "gelu"}, {"num_local_experts": 0}):
        with pytest.raises(ValueError, match="granitemoehybrid: llama.cpp's file loses"):
            C.metadata(hf | change, "granitehybrid")


@pytest.mark.parametrize("meta, fragment", [
    ({"granitehybrid.rope.scaling.finetuned": (True, V.BOOL)}, "rope.scaling.finetuned: Bamba's"),
    ({"granitehybrid.attention.head_count_kv": ([2, 2, 0], V.ARRAY, V.UINT32)}, "of this config never reads"),
    ({"granitehybrid.ssm.group_count": (3, V.UINT32)}, "8 heads and 3 groups"),
    ({"granitehybrid.expert_shared_feed_forward_length": (16, V.UINT32)}, "has shape"),
])
def test_granite_hybrid_refusals_in_one_line(tmp_path, meta, fragment):
    """RoPE in the attention layers, a K/V head count on a Mamba-2 layer (its tensors are not attention's), groups
    that do not divide the heads, a shared FFN width the tensors do not have: one line each."""
    with pytest.raises(QkvError) as e:
        qkv.load(_edited(tmp_path, "granitemoehybrid", meta))
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


# ── falcon-h1 ─────────────────────────────────────────────────────────────────────────────────────────────────────

MULTIPLIERS = ("attention_in_multiplier", "attention_out_multiplier", "key_multiplier", "ssm_in_multiplier",
               "ssm_out_multiplier", "embedding_multiplier", "lm_head_multiplier")


def _folded(tmp_path, change: dict | None = None, drop: str | None = None):
    """The Falcon-H1 fixture's file (lossy: its norm after the gate; without the tensors whose name holds DROP), and
    qkv's load of the directory as llama.cpp runs it (norm after the gate, and CHANGE)."""
    path = _edited(tmp_path, "falcon_h1", {}, drop)
    directory = edited(tmp_path, "falcon_h1", {"mamba_norm_before_gate": False} | (change or {}))
    if drop:                                                         # the directory without the dropped tensors too
        kept = {k: w for k, w in load_file(directory / "model.safetensors").items() if drop not in C.tensors(
            json.loads((directory / "config.json").read_text()), {k: w}, "falcon-h1").popitem()[0]}
        save_file(kept, directory / "model.safetensors")
    return qkv.load(path), qkv.load(directory)


def test_falcon_h1_file_is_its_directory_with_the_multipliers_folded(tmp_path):
    """llama.cpp's falcon-h1 file of the fixture: its config every multiplier 1 (the weights hold them) and the
    directory's other knobs (its norm after the gate); a padded batch's logits, hidden states, every layer's input and
    attention weights, greedy ids with and without the cache: the directory's (1e-5, the folding's float32 rounding);
    each tensor the directory's times its multipliers (float32, bit for bit; A_log within its rounding)."""
    path = C.convert(MODELS / "falcon_h1", tmp_path / "f.gguf", lossy=True)
    ours, theirs = qkv.load(path), qkv.load(edited(tmp_path, "falcon_h1", {"mamba_norm_before_gate": False}))
    plain = qkv.load(edited(tmp_path / "plain", "falcon_h1", {"mamba_norm_before_gate": False, "mlp_multipliers": [
        1.0, 1.0], "ssm_multipliers": [1.0] * 5} | {k: 1.0 for k in MULTIPLIERS})).config
    mamba = plain.mamba.__class__(**{**vars(plain.mamba), "chunk_size": 256})
    assert ours.config == plain.with_(norm_eps=FLOAT32_EPS[0], mamba=mamba)
    ref = reference("falcon_h1")
    ids, mask = ref["input_ids"], ref["attention_mask"]
    real = mask.astype(bool)
    runs = []
    for model in (ours, theirs):
        rec = Recorder(keep=("residual", "attentions"))
        runs.append((*transformer(model.weights, model.config, ids, mask, rec=rec), rec.store))
    (h1, l1, s1), (h2, l2, s2) = runs
    assert max_abs(l1[real], l2[real]) <= 1e-5 and max_abs(h1[real], h2[real]) <= 1e-5
    for i in range(ours.config.n_layers):
        assert max_abs(s1[i]["residual"][real], s2[i]["residual"][real]) <= 1e-5
        assert max_abs(s1[i]["attentions"], s2[i]["attentions"]) <= 1e-5
    single = ref["single_input_ids"]
    for cache in (True, False):
        assert np.array_equal(ours.generate(single, 6, temperature=0, stop_at_eos=False, use_cache=cache),
                              theirs.generate(single, 6, temperature=0, stop_at_eos=False, use_cache=cache))
    hf = json.loads((MODELS / "falcon_h1" / "config.json").read_text())
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    given = {k.removeprefix("model."): v for k, v in load_file(MODELS / "falcon_h1" / "model.safetensors").items()}
    assert set(mine) == set(given)
    for k, w in given.items():
        if k.endswith("A_log"):
            np.testing.assert_allclose(mine[k], w, rtol=4 * np.finfo(np.float32).eps, atol=1e-6)
        else:
            assert np.array_equal(mine[k], C._falcon_h1_folded(hf, k, w)), k
    assert not np.array_equal(mine["layers.0.self_attn.k_proj.weight"], given["layers.0.self_attn.k_proj.weight"])


def test_falcon_h1_file_without_the_mixers_norm(tmp_path):
    """A file without ssm_norm tensors (mamba_rms_norm false: the gate alone) is read as such: the directory's model
    without the norm, number for number (1e-5)."""
    ours, theirs = _folded(tmp_path, {"mamba_rms_norm": False}, drop=".ssm_norm.")
    assert ours.config.mamba.norm == theirs.config.mamba.norm != "gated"
    ids = reference("falcon_h1")["single_input_ids"]
    assert max_abs(ours.forward(ids).logits, theirs.forward(ids).logits) <= 1e-5


def test_falcon_h1_writer_refuses_what_llama_cpp_loses():
    """The norm before the gate (unless lossy), biases, a tied head (llama.cpp's output would be the embeddings times
    embedding_multiplier, not lm_head_multiplier), a GELU: refused by the writer."""
    hf = json.loads((MODELS / "falcon_h1" / "config.json").read_text())
    with pytest.raises(ValueError, match="norm before the gate"):
        C.metadata(hf, "falcon-h1")
    for change in ({"attention_bias": True}, {"projectors_bias": True}, {"tie_word_embeddings": True},
                   {"hidden_act": "gelu"}):
        with pytest.raises(ValueError, match="falcon_h1: llama.cpp's file loses"):
            C.metadata(hf | change, "falcon-h1", lossy=True)


@pytest.mark.parametrize("meta, fragment", [
    ({"falcon-h1.attention.scale": (0.5, V.FLOAT32)}, "falcon-h1.attention.scale"),
    ({"falcon-h1.ssm.time_step_rank": (5, V.UINT32)}, "48 channels in 5 heads and 2 groups"),
    ({"falcon-h1.attention.head_count_kv": ([2, 0], V.ARRAY, V.UINT32)}, "never reads"),
])
def test_falcon_h1_refusals_in_one_line(tmp_path, meta, fragment):
    """A key qkv does not read (a scale of the scores), Mamba heads that do not divide the channels, a layer without
    attention (Falcon-H1's layers all have both): one line each."""
    with pytest.raises(QkvError) as e:
        qkv.load(_edited(tmp_path, "falcon_h1", meta))
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)
