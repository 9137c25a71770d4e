"""GGUF files of every architecture qkv runs, against transformers (make test: no torch).

Each committed Hugging Face fixture whose knobs llama.cpp's converter can write (tests/fixtures/
models/{qwen3, gemma, olmo2, phi2, gpt_neox, gpt2, stablelm, qwen2, llama_gqa, granite, bloom, arcee,
ernie4_5_moe, deepseek_v2}; starcoder2
and phi3 without their sliding window, phi3 without LongRoPE, mixtral without its window; cohere refused:
llama.cpp's command-r holds no attention biases; gemma2 refused: its query_pre_attn_scalar is not d_head,
which llama.cpp's file cannot say) is written as a GGUF file on the fly, the way convert_hf_to_gguf.py lays
it out (tests/fixtures/gguf_convert.py: gguf's own tensor names, Q/K permuted for llama, Gemma's norms + 1,
GPT-NeoX's and BLOOM's Q/K/V regrouped, GPT-2's Conv1D transposed, experts stacked). qkv.load(file.gguf)
must give transformers' numbers on the directory (reference.npz): logits and hidden states 1e-4, attention
weights 1e-5, every layer, greedy ids with the KV cache; an F32 file gives back the directory's own weights
bit for bit. The MoE, Falcon and MPT fixtures (mixtral, qwen2_moe, qwen3_moe, olmoe, falcon, falcon_rw,
mpt) each hold a knob llama.cpp's file loses (a window, dense layers, attention biases, OLMoE's eps,
Falcon's ReLU, ALiBi, MPT's softmax_scale): the fixture writer refuses them; Mixtral's file without the
window is checked against the directory without it. tests/live/test_live_gguf_families.py checks other
knob values against live transformers.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from gguf import GGUFValueType as V

import qkv
from conftest import FIXTURES, MODELS, TOL_ATTENTION, TOL_HIDDEN, max_abs, reference, run_main
from qkv.checkpoints import gguf_cache
from qkv.runtime.errors import QkvError

sys.path.insert(0, str(FIXTURES))
import gguf_convert as C  # noqa: E402
import make_gguf_fixtures as F  # noqa: E402
from gguf_names import assert_refused_in_one_line, forward_equals_reference  # noqa: E402

NAMES = ["qwen3", "gemma", "olmo2", "phi2", "gpt_neox", "gpt2", "stablelm", "qwen2", "llama_gqa", "granite",
         "bloom", "arcee", "ernie4_5_moe", "deepseek_v2"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, object]:
    """Each fixture as an F32 GGUF file (written once for the module)."""
    out = tmp_path_factory.mktemp("gguf")
    return {name: C.convert(MODELS / name, out / f"{name}.gguf") for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_padded_batch_equals_transformers(files, name):
    ref = reference(name)
    model = qkv.load(files[name])
    forward_equals_reference(model, ref)
    n = int(ref["attention_mask"][1].sum())                          # every layer's residual stream, row 1 alone
    trace = model.run(ref["input_ids"][1, :n], keep=("residual",))
    for i in range(model.config.n_layers):
        assert max_abs(trace.layer(i).residual, ref["hidden_states"][i, 1, :n]) <= TOL_HIDDEN


@pytest.mark.parametrize("name", NAMES)
def test_single_sequence_greedy_and_float64(files, name):
    ref = reference(name)
    model = qkv.load(files[name])
    single = model.forward(ref["single_input_ids"])
    assert max_abs(single.logits, ref["single_logits"]) <= TOL_HIDDEN
    assert max_abs(single.attentions, ref["single_attentions"]) <= TOL_ATTENTION
    greedy = model.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False)      # the KV cache
    assert greedy.tolist() == ref["greedy_ids"].tolist()
    assert model.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False,
                          use_cache=False).tolist() == ref["greedy_ids"].tolist()
    m64 = qkv.load(files[name], dtype=np.float64)
    assert max_abs(m64.forward(ref["single_input_ids"]).logits, single.logits) <= TOL_HIDDEN
    ids = ref["single_input_ids"][0, :9]                               # left padding = the row alone
    padded = model.forward(np.concatenate([[0, 0, 0], ids])[None], np.array([[0, 0, 0] + [1] * 9])).logits[0, 3:]
    assert max_abs(padded, model.forward(ids[None]).logits[0]) <= TOL_HIDDEN


@pytest.mark.parametrize("name", NAMES)
def test_f32_file_gives_back_the_weights(files, name):
    """The converted directory's tensors are the fixture's own, bit for bit (the converter's
    changes undone exactly; Gemma's norms, stored as 1 + w, within float32's rounding of 1 + w),
    and its config reads as the same knobs."""
    from safetensors.numpy import load_file

    mine = load_file(gguf_cache.converted(files[name]) / "model.safetensors")
    theirs = load_file(MODELS / name / "model.safetensors")
    strip = ("model.", "gpt_neox.", "transformer.")
    theirs = {next((k[len(p):] for p in strip if k.startswith(p)), k): v for k, v in theirs.items()}
    if name == "bloom":                                              # llama.cpp writes the tied head as a copy
        theirs["lm_head.weight"] = theirs["word_embeddings.weight"]
    assert set(mine) == set(theirs)
    for k, w in theirs.items():
        if name == "gemma" and "norm" in k:                          # (1 + w) − 1 in float32: w within an ulp of 1
            assert max_abs(mine[k], w) <= np.finfo(np.float32).eps, k
        else:
            assert np.array_equal(mine[k], w), k
    a, b = qkv.load(files[name]).config, qkv.load(MODELS / name).config
    assert a.family == b.family and a.qkv_bias == b.qkv_bias
    assert a.tied_embeddings == b.tied_embeddings or name == "bloom"             # BLOOM's file: a copy, untied
    assert (a.d_head, a.n_kv_heads, a.rotary_dim, a.parallel_residual, a.qk_norm) == \
        (b.d_head, b.n_kv_heads, b.rotary_dim, b.parallel_residual, b.qk_norm)


@pytest.mark.parametrize("name", ["qwen3", "gpt_neox", "phi2"])
def test_tokenizer_from_the_file(files, name):
    ref = reference(name)
    assert qkv.load(files[name]).encode(str(ref["text"]))[0].tolist() == ref["text_ids"].tolist()


def test_phi2_fused_qkv_equals_three(files, tmp_path):
    """Files converted from the original Phi-2 layout hold one attn_qkv ([Q; K; V] rows): the same model."""
    fused = C.convert(MODELS / "phi2", tmp_path / "fused.gguf", fused=True)
    ref = reference("phi2")
    a = qkv.load(fused).forward(ref["input_ids"], ref["attention_mask"]).logits
    np.testing.assert_array_equal(a, qkv.load(files["phi2"]).forward(ref["input_ids"], ref["attention_mask"]).logits)


@pytest.mark.parametrize("name", ["gpt_neox", "gemma", "olmo2", "gpt2"])
def test_quantised_file_is_the_model_within_its_rounding(tmp_path, name):
    """Q8_0 weights: each tensor within Q8_0's rounding (half a step of 32-value blocks scaled to
    max|w| / 127) of the fixture's, after the converter's changes are undone; the model's
    logits near transformers' (the live test compares qwen3's and gpt2's quantised files with
    transformers' own GGUF loader, which does not read the other archs)."""
    from safetensors.numpy import load_file

    path = C.convert(MODELS / name, tmp_path / "q8.gguf", "Q8_0")
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = load_file(MODELS / name / "model.safetensors")
    theirs = {next((k[len(p):] for p in ("model.", "gpt_neox.", "transformer.") if k.startswith(p)), k): v
              for k, v in theirs.items()}
    for k, w in theirs.items():
        assert max_abs(mine[k], w) <= np.abs(w).max() / 127 * 0.51 + 1e-6, k
    ref = reference(name)
    out = qkv.load(path).forward(ref["single_input_ids"])
    assert max_abs(out.logits, ref["single_logits"]) <= 0.2


def test_cli_runs_on_a_gptneox_file(files, monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "generate", "the cat", "--model", str(files["gpt_neox"]),
                              "-n", "3", "-t", "0")
    assert code == 0, err
    assert out.strip().startswith("the cat")


# ── refusals: one line each ───────────────────────────────────────────────────────

def _edited(tmp_path, name: str, meta: dict | None = None, drop: str | None = None):
    """The fixture's GGUF file with metadata keys set (None: removed) or a tensor left out."""
    directory = MODELS / name
    hf = json.loads((directory / "config.json").read_text())
    arch = C.ARCH[hf["model_type"]]
    m = {"general.architecture": (arch, V.STRING), "general.name": (name, V.STRING)} | C.metadata(hf, arch) \
        | C.vocabulary(directory, hf)
    for key, value in (meta or {}).items():
        if value is None:
            m.pop(key)
        else:
            m[key] = value
    from safetensors.numpy import load_file
    tensors = C.tensors(hf, load_file(directory / "model.safetensors"), arch)
    if drop:
        tensors.pop(drop)
    return F.write(tmp_path / "x.gguf", m, {k: (w, None) for k, w in tensors.items()})


REFUSED = {
    "softcapping": ("gemma", {"gemma.attn_logit_softcapping": (50.0, V.FLOAT32)}, None,
                    "'gemma.attn_logit_softcapping'"),
    "sliding-window-zero": ("olmo2", {"olmo2.attention.sliding_window": (0, V.UINT32)}, None,
                            "attention.sliding_window 0"),  # with a window it is OLMo 3 (test_gguf_olmo3.py)
    "alibi-max-bias": ("bloom", {"bloom.attention.max_alibi_bias": (4.0, V.FLOAT32)}, None,
                       "'bloom.attention.max_alibi_bias'"),
    "clamp-kqv": ("phi2", {"phi2.attention.clamp_kqv": (8.0, V.FLOAT32)}, None, "'phi2.attention.clamp_kqv'"),
    "gptneox-gqa": ("gpt_neox", {"gptneox.attention.head_count_kv": (2, V.UINT32)}, None, "none grouped"),
    "gpt2-head-size": ("gpt2", {"gpt2.attention.key_length": (8, V.UINT32),
                                "gpt2.attention.value_length": (8, V.UINT32)}, None, "d_model / heads"),
    "qwen3-partial-rope": ("qwen3", {"qwen3.rope.dimension_count": (8, V.UINT32)}, None, "partial RoPE"),
    "phi2-odd-rope": ("phi2", {"phi2.rope.dimension_count": (3, V.UINT32)}, None, "an even number"),
    "gptneox-residual": ("gpt_neox", {"gptneox.use_parallel_residual": (1, V.UINT32)}, None, "true or false"),
    "phi2-half-qkv": ("phi2", None, "blk.1.attn_v.weight", "lacks the tensor blk.1.attn_v.weight"),
    "qwen3-no-q-norm": ("qwen3", None, "blk.0.attn_q_norm.weight", "lacks the tensor blk.0.attn_q_norm"),
    "gpt2-no-positions": ("gpt2", None, "position_embd.weight", "lacks the tensor position_embd.weight"),
    "gptneox-half-biases": ("gpt_neox", None, "blk.0.attn_output.bias", "lacks the tensor blk.0.attn_output.bias"),
    "unknown-arch": ("gpt2", {"general.architecture": ("bitnet", V.STRING)}, None, "architecture 'bitnet'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_in_one_line(tmp_path, monkeypatch, capsys, case):
    name, meta, drop, fragment = REFUSED[case]
    path = _edited(tmp_path, name, meta, drop)
    assert_refused_in_one_line(path, fragment, monkeypatch, capsys)


def test_unknown_arch_lists_those_qkv_reads(tmp_path):
    with pytest.raises(QkvError, match="qkv runs ") as e:
        qkv.load(_edited(tmp_path, "gpt2", {"general.architecture": ("bitnet", V.STRING)}))
    named = str(e.value).split("qkv runs ")[1].split(" (")[0].split(", ")     # in name order, every one qkv reads
    assert named == sorted(named) and {"arcee", "bloom", "command-r", "falcon", "gemma", "gemma2", "glm4", "gpt2",
                                       "gptneox", "granite", "llama", "mpt", "olmo2", "olmoe", "phi2", "phi3", "qwen2",
                                       "qwen2moe", "qwen3", "qwen3moe", "stablelm", "starcoder2", "ernie4_5-moe",
                                       "dots1", "exaone4", "deepseek2", "gpt-oss", "mamba"} <= set(named)


@pytest.mark.parametrize("name", ["qwen3", "gemma", "olmo2", "phi2", "gpt_neox", "gpt2", "stablelm", "ernie4_5_moe",
                                  "deepseek_v2"])
def test_gradients_through_a_gguf_file_equal_autograd(files, name):
    """Training a model read from GGUF: qkv.train.gradients equals torch autograd on the directory
    (tests/fixtures/grads/NAME.npz, make_grad_fixtures.py): loss 1e-5, each gradient 1e-4 relative."""
    from qkv.train import gradients

    ref = np.load(FIXTURES / "grads" / f"{name}.npz")
    loss, grads = gradients(qkv.load(files[name]), ref["input_ids"], ref["attention_mask"])
    assert abs(loss - float(ref["loss"])) < 1e-5
    expected = {k[len("grad."):]: ref[k] for k in ref.files if k.startswith("grad.")}
    assert set(grads) == set(expected)
    for key, g_ref in expected.items():
        assert np.linalg.norm(grads[key] - g_ref) / np.linalg.norm(g_ref) < 1e-4, key


@pytest.mark.parametrize("pre", ["phi-2", "olmo", "mpt"])
def test_pre_tokenizers_of_these_archs(tmp_path, pre):
    """Phi-2's `phi-2` and the GPT-NeoX tokenizer's `olmo` / `mpt` (Pythia's files) are llama.cpp's
    GPT-2 regex: the same ids as `gpt-2`."""
    ref = reference("gpt_neox")
    path = _edited(tmp_path, "gpt_neox", {"tokenizer.ggml.pre": (pre, V.STRING)})
    assert qkv.load(path).encode(str(ref["text"]))[0].tolist() == ref["text_ids"].tolist()


def test_every_arch_is_a_family_qkv_runs():
    from qkv.checkpoints.families import FAMILIES
    from qkv.checkpoints.gguf_archs import ARCHS

    assert {a.family for a in ARCHS.values()} <= set(FAMILIES)


def test_starcoder2_file_is_its_directory_without_the_window(tmp_path):
    """llama.cpp's starcoder2 file has no sliding window (llama.cpp attends to every earlier token): the
    fixture written without it gives back its weights bit for bit and the directory's model with
    sliding_window=None, number for number (the live test compares such files with transformers)."""
    from safetensors.numpy import load_file

    path = C.convert(MODELS / "starcoder2", tmp_path / "sc2.gguf", lossy=True)
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(MODELS / "starcoder2" / "model.safetensors").items()}
    assert set(mine) == set(theirs) and all(np.array_equal(mine[k], w) for k, w in theirs.items())
    ours, directory = qkv.load(path), qkv.load(MODELS / "starcoder2").with_config(sliding_window=None)
    assert ours.config.sliding_window is None and ours.config.qkv_bias and ours.config.ffn_bias
    ref = reference("starcoder2")
    np.testing.assert_array_equal(ours.forward(ref["input_ids"], ref["attention_mask"]).logits,
                                  directory.forward(ref["input_ids"], ref["attention_mask"]).logits)
    np.testing.assert_array_equal(ours.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False),
                                  directory.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False))
    with pytest.raises(QkvError, match="'starcoder2.attention.sliding_window'"):
        hf = json.loads((MODELS / "starcoder2" / "config.json").read_text())
        meta = {"general.architecture": ("starcoder2", V.STRING)} | C.metadata(hf, "starcoder2", True) \
            | C.vocabulary(MODELS / "starcoder2", hf) | {"starcoder2.attention.sliding_window": (5, V.UINT32)}
        tensors = C.tensors(hf, load_file(MODELS / "starcoder2" / "model.safetensors"), "starcoder2")
        qkv.load(F.write(tmp_path / "w.gguf", meta, {k: (w, None) for k, w in tensors.items()}))


def test_phi3_file_is_its_directory_without_window_and_longrope(tmp_path):
    """llama.cpp disables Phi-3's sliding window (its file holds one; llama.cpp attends to every earlier
    token) and picks LongRoPE's factors by its context size rather than by the pass, so the fixture is
    written without LongRoPE and read without the window: its weights bit for bit (qkv_proj, gate_up_proj
    kept fused) and the directory's model with sliding_window=None and plain RoPE, number for number (the
    live test compares such files with transformers); a LongRoPE file is refused in one line."""
    from safetensors.numpy import load_file

    path = C.convert(MODELS / "phi3", tmp_path / "phi3.gguf", lossy=True)
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(MODELS / "phi3" / "model.safetensors").items()}
    assert set(mine) == set(theirs) and all(np.array_equal(mine[k], w) for k, w in theirs.items())
    ours = qkv.load(path)
    directory = qkv.load(MODELS / "phi3").with_config(sliding_window=None, rope_scaling=None)
    assert ours.config.sliding_window is None and ours.config.rotary_dim == directory.config.rotary_dim == 6
    ref = reference("phi3")
    np.testing.assert_array_equal(ours.forward(ref["input_ids"], ref["attention_mask"]).logits,
                                  directory.forward(ref["input_ids"], ref["attention_mask"]).logits)
    np.testing.assert_array_equal(ours.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False),
                                  directory.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False))
    with pytest.raises(ValueError, match="LongRoPE"):
        C.convert(MODELS / "phi3", tmp_path / "no.gguf")
    with pytest.raises(QkvError, match="LongRoPE") as e:
        hf = json.loads((MODELS / "phi3" / "config.json").read_text())
        meta = {"general.architecture": ("phi3", V.STRING)} | C.metadata(hf, "phi3", True) \
            | C.vocabulary(MODELS / "phi3", hf) | {"phi3.rope.scaling.attn_factor": (1.2, V.FLOAT32)}
        tensors = C.tensors(hf, load_file(MODELS / "phi3" / "model.safetensors"), "phi3")
        qkv.load(F.write(tmp_path / "w.gguf", meta, {k: (w, None) for k, w in tensors.items()}))
    assert "\n" not in str(e.value)


def test_cohere_fixture_is_refused_by_the_writer(tmp_path):
    """The cohere fixture has attention biases, which llama.cpp's command-r does not hold: the writer
    refuses it rather than compare numbers llama.cpp would not give (the live test compares bias-free
    command-r files, with and without q/k norms, with transformers). A command-r file without its
    logit_scale (llama.cpp requires one) is refused in one line."""
    with pytest.raises(ValueError, match="no biases"):
        C.convert(MODELS / "cohere", tmp_path / "c.gguf")
    hf = json.loads((MODELS / "cohere" / "config.json").read_text()) | {"attention_bias": False}
    meta = {"general.architecture": ("command-r", V.STRING)} | C.metadata(hf, "command-r") \
        | C.vocabulary(MODELS / "cohere", hf)
    meta.pop("command-r.logit_scale")
    from safetensors.numpy import load_file
    tensors = {k: w for k, w in C.tensors(hf, load_file(MODELS / "cohere" / "model.safetensors"), "command-r").items()
               if not k.endswith(".bias")}
    with pytest.raises(QkvError, match="logit_scale") as e:
        qkv.load(F.write(tmp_path / "w.gguf", meta, {k: (w, None) for k, w in tensors.items()}))
    assert "\n" not in str(e.value)


def test_gemma2_fixture_is_refused_by_the_writer(tmp_path):
    """The gemma2 fixture scales Q·Kᵀ by query_pre_attn_scalar 24 ≠ d_head 8; llama.cpp's gemma2 file holds
    no such value (it scales by 1/√d_k): refused rather than compared wrong (the live test compares files
    of query_pre_attn_scalar = head_dim with transformers, windows and soft-caps included). A file without
    its sliding window is refused in one line."""
    with pytest.raises(ValueError, match="query_pre_attn_scalar"):
        C.convert(MODELS / "gemma2", tmp_path / "g.gguf")
    hf = json.loads((MODELS / "gemma2" / "config.json").read_text()) | {"query_pre_attn_scalar": 8}
    meta = {"general.architecture": ("gemma2", V.STRING)} | C.metadata(hf, "gemma2") \
        | C.vocabulary(MODELS / "gemma2", hf)
    from safetensors.numpy import load_file
    tensors = C.tensors(hf, load_file(MODELS / "gemma2" / "model.safetensors"), "gemma2")
    ours = qkv.load(F.write(tmp_path / "ok.gguf", meta, {k: (w, None) for k, w in tensors.items()}))
    directory = qkv.load(MODELS / "gemma2").with_config(attn_scale=8 ** -0.5)      # the same file, scaled as llama.cpp
    assert ours.config.sliding_window == 5 and ours.config.layer_windows == directory.config.layer_windows
    ref = reference("gemma2")                                        # norms (1 + w) − 1: within float32's rounding
    assert max_abs(ours.forward(ref["input_ids"], ref["attention_mask"]).logits,
                   directory.forward(ref["input_ids"], ref["attention_mask"]).logits) <= 1e-5
    meta.pop("gemma2.attention.sliding_window")
    with pytest.raises(QkvError, match="sliding_window") as e:
        qkv.load(F.write(tmp_path / "w.gguf", meta, {k: (w, None) for k, w in tensors.items()}))
    assert "\n" not in str(e.value)


LOST = {"mixtral": "sliding_window", "olmoe": "rms_norm_eps", "qwen3_moe": "dense layers, attention biases",
        "qwen2_moe": "dense layers", "qwen2_moe_norm": "dense layers, norm_topk_prob, qkv_bias",
        "falcon": "activation, d_ff, rope_theta", "falcon_rw": "alibi, sequential block, biases, d_ff",
        "mpt": "softmax_scale"}


@pytest.mark.parametrize("name", sorted(LOST))
def test_fixtures_llama_cpp_would_run_otherwise_are_refused(tmp_path, name):
    """Each committed MoE, Falcon and MPT fixture has a knob llama.cpp's file loses (Mixtral's window,
    OLMoE's eps, Qwen's dense layers, Falcon's ReLU / RoPE base / d_ff, Falcon-RW's ALiBi, MPT's
    softmax_scale …): the
    fixture writer refuses it rather than compare wrong numbers (the live tests compare files of
    knobs llama.cpp keeps with transformers)."""
    with pytest.raises(ValueError, match=LOST[name]):
        C.convert(MODELS / name, tmp_path / "x.gguf")


def test_mixtral_file_is_its_directory_without_the_window(tmp_path):
    """Mixtral written as llama.cpp does (arch llama with experts, the window dropped): the experts,
    stacked (E, out, in) in the file, come back as the directory's own tensors bit for bit, and the
    model is the directory's without its window, number for number. (OLMoE's fixture, whose eps
    llama.cpp writes as 1e-5, has 256 tokens: too few for the fixture writer's byte tokenizer; the
    live tests compare OLMoE files with transformers.)"""
    from safetensors.numpy import load_file

    name, changes = "mixtral", {"sliding_window": None, "norm_eps": float(np.float32(1e-6))}   # the file's eps
    path = C.convert(MODELS / name, tmp_path / f"{name}.gguf", lossy=True)
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(MODELS / name / "model.safetensors").items()}
    assert set(mine) == set(theirs) and all(np.array_equal(mine[k], w) for k, w in theirs.items())
    ours, directory = qkv.load(path), qkv.load(MODELS / name).with_config(**changes)
    assert ours.config == directory.config
    ref = reference(name)
    np.testing.assert_array_equal(ours.forward(ref["input_ids"], ref["attention_mask"]).logits,
                                  directory.forward(ref["input_ids"], ref["attention_mask"]).logits)
    np.testing.assert_array_equal(ours.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False),
                                  directory.generate(ref["single_input_ids"], 8, temperature=0, stop_at_eos=False))
