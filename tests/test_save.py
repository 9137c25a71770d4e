"""Fresh models and saving them: qkv.init, Model.save, each family's hf_config / tensors, and
weights_from_tensors (issue 12, item 3). transformers reading the saved files: tests/live/test_live_save.py."""

from __future__ import annotations

import json
import os
import struct
from dataclasses import fields, is_dataclass

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import qkv
from qkv import ModelConfig, QkvError
from qkv.checkpoints import FAMILIES, bert, gpt2, llama, weights_from_tensors
from qkv.checkpoints import save as save_module
from qkv.checkpoints.tensors import TensorStore
from qkv.inputs.tokenizer import Tokenizer
from qkv.core.weights import Weights
from conftest import MODELS

# ── configs: every family, each a set of knob values ─────────────────────────────

GPT2 = dict(family="gpt2", vocab_size=96, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=32,
            activation="gelu_tanh", tied_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
LLAMA = dict(family="llama", vocab_size=96, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_positions=64,
             norm="rms", norm_eps=1e-6, position="rope", activation="silu", gated_ffn=True, qkv_bias=False,
             out_bias=False, ffn_bias=False, pad_token_id=0, bos_token_id=1, eos_token_id=2, pad_embedding_frozen=True)
BERT = dict(family="bert", vocab_size=96, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_positions=32,
            causal=False, norm_place="post", norm_eps=1e-12, activation="gelu", type_vocab_size=2,
            embed_norm=True, final_norm=False, lm_head=False, pad_token_id=0, pad_embedding_frozen=True)

CONFIGS = {
    "gpt2-tied": ModelConfig(**GPT2),
    "gpt2-untied": ModelConfig(**{**GPT2, "tied_embeddings": False, "activation": "gelu"}),
    "gpt2-attention-only": ModelConfig(**{**GPT2, "d_ff": 0, "n_layers": 3}),
    "gpt2-no-token-ids": ModelConfig(**{**GPT2, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}),
    "llama-mha-untied": ModelConfig(**LLAMA),
    "llama-gqa-tied": ModelConfig(**{**LLAMA, "n_heads": 8, "n_kv_heads": 2, "tied_embeddings": True}),
    "llama-mqa-head-dim": ModelConfig(**{**LLAMA, "n_kv_heads": 1, "d_head": 16, "eos_token_id": [2, 3]}),
    "llama-bias-theta": ModelConfig(**{**LLAMA, "qkv_bias": True, "out_bias": True, "rope_theta": 5e5}),
    "llama-rope-linear": ModelConfig(**{**LLAMA, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "llama-rope-llama3": ModelConfig(**{**LLAMA, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}),
    "llama-attention-only": ModelConfig(**{**LLAMA, "d_ff": 0}),
    "mistral-window": ModelConfig(**{**LLAMA, "family": "mistral", "n_kv_heads": 2, "sliding_window": 4,
                                     "norm_eps": 1e-5}),
    "mistral-no-window": ModelConfig(**{**LLAMA, "family": "mistral", "tied_embeddings": True}),
    "qwen2-biases": ModelConfig(**{**LLAMA, "family": "qwen2", "n_kv_heads": 2, "qkv_bias": True,
                                   "rope_theta": 1e6, "tied_embeddings": True}),
    "bert": ModelConfig(**BERT),
    "bert-relu-3-types": ModelConfig(**{**BERT, "activation": "relu", "type_vocab_size": 3}),
}
DECODERS = [k for k, c in CONFIGS.items() if c.causal]


def ids_and_mask(cfg: ModelConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(2, 11) ids in [3, V); the second row right-padded (its last 4 positions have mask 0)."""
    ids = np.random.default_rng(seed).integers(3, cfg.vocab_size, (2, 11))
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    return ids, mask


def outputs(model: qkv.Model, ids, mask) -> np.ndarray:
    out = model.forward(ids, mask, attentions=False)
    return out.hidden if out.logits is None else out.logits


def leaves(weights: Weights) -> dict[str, np.ndarray]:
    """Every array of a Weights tree by its path, e.g. "blocks.0.attn.W_Q"."""
    found = {}

    def walk(obj, path):
        if isinstance(obj, np.ndarray):
            found[path] = obj
        elif isinstance(obj, list):
            for i, x in enumerate(obj):
                walk(x, f"{path}.{i}")
        elif is_dataclass(obj):                       # (NormWeights.stored_offset is a number, no array)
            for f in fields(obj):
                walk(getattr(obj, f.name), f"{path}.{f.name}".lstrip("."))

    walk(weights, "")
    return found


# ── hf_config: every knob, read back ─────────────────────────────────────────────

@pytest.mark.parametrize("name", CONFIGS)
def test_hf_config_reads_back_as_the_same_config(name):
    cfg = CONFIGS[name]
    family = FAMILIES[cfg.family]
    hf = family.hf_config(cfg)
    back = qkv.checkpoints.config_of(json.loads(json.dumps(hf)))           # through JSON, as a file would
    assert back == cfg
    assert back.rope_scaling == cfg.rope_scaling                           # not part of ==
    assert hf["model_type"] == cfg.family and len(hf["architectures"]) == 1


def test_hf_config_names_what_transformers_reads():
    hf = llama.hf_config(CONFIGS["qwen2-biases"])
    assert hf["architectures"] == ["Qwen2ForCausalLM"] and "attention_bias" not in hf
    assert hf["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}
    hf = llama.hf_config(CONFIGS["llama-bias-theta"])
    assert hf["attention_bias"] is True and hf["mlp_bias"] is False and hf["architectures"] == ["LlamaForCausalLM"]
    assert llama.hf_config(CONFIGS["mistral-window"])["sliding_window"] == 4
    hf = gpt2.hf_config(CONFIGS["gpt2-attention-only"])
    assert hf["n_inner"] == 0 and hf["architectures"] == ["GPT2LMHeadModel"]
    assert hf["activation_function"] == "gelu_new" and hf["tie_word_embeddings"] is True
    assert bert.hf_config(CONFIGS["bert"])["architectures"] == ["BertModel"]


@pytest.mark.parametrize("cfg, match", [
    (ModelConfig(**{**GPT2, "norm": "rms"}), "norm='rms'"),
    (ModelConfig(**{**GPT2, "n_kv_heads": 2}), "n_kv_heads=2"),
    (ModelConfig(**{**LLAMA, "sliding_window": 8}), "sliding_window=8"),
    (ModelConfig(**{**LLAMA, "family": "mistral", "qkv_bias": True}), "qkv_bias=True"),
    (ModelConfig(**{**LLAMA, "family": "qwen2", "out_bias": True, "qkv_bias": True}), "qkv_bias=True|out_bias=True"),
    (ModelConfig(**{**LLAMA, "qkv_bias": True}), "qkv_bias=True"),
    (ModelConfig(**{**BERT, "bos_token_id": 5}), "bos_token_id=5"),
])
def test_hf_config_refuses_knobs_the_family_cannot_hold(cfg, match):
    with pytest.raises(QkvError, match=match):
        FAMILIES[cfg.family].hf_config(cfg)


def test_attention_only_configs():
    assert ModelConfig(**{**GPT2, "d_ff": 0}).d_ff == 0
    with pytest.raises(QkvError, match="d_ff=-1 must be positive, or 0"):
        ModelConfig(**{**GPT2, "d_ff": -1})
    hf = gpt2.hf_config(CONFIGS["gpt2-tied"])
    assert qkv.checkpoints.config_of({**hf, "n_inner": 0}).d_ff == 0             # 0 is not "absent"
    assert qkv.checkpoints.config_of({**hf, "n_inner": None}).d_ff == 4 * 32      # null is: 4·d_model
    del hf["n_inner"]
    assert qkv.checkpoints.config_of(hf).d_ff == 4 * 32
    with pytest.raises(QkvError, match="n_inner = -1"):
        qkv.checkpoints.config_of({**hf, "n_inner": -1})


# ── tensors: transformers' names and shapes, both ways ───────────────────────────

def test_tensor_names_are_transformers_names():
    t = gpt2.tensors(qkv.init(ModelConfig(**{**GPT2, "n_layers": 1})).weights, ModelConfig(**{**GPT2, "n_layers": 1}))
    h = "transformer.h.0"
    assert {k: v.shape for k, v in t.items()} == {
        "transformer.wte.weight": (96, 32), "transformer.wpe.weight": (32, 32),
        f"{h}.ln_1.weight": (32,), f"{h}.ln_1.bias": (32,),
        f"{h}.attn.c_attn.weight": (32, 96), f"{h}.attn.c_attn.bias": (96,),
        f"{h}.attn.c_proj.weight": (32, 32), f"{h}.attn.c_proj.bias": (32,),
        f"{h}.ln_2.weight": (32,), f"{h}.ln_2.bias": (32,),
        f"{h}.mlp.c_fc.weight": (32, 64), f"{h}.mlp.c_fc.bias": (64,),
        f"{h}.mlp.c_proj.weight": (64, 32), f"{h}.mlp.c_proj.bias": (32,),
        "transformer.ln_f.weight": (32,), "transformer.ln_f.bias": (32,)}         # tied: no lm_head
    cfg = ModelConfig(**{**LLAMA, "n_layers": 1, "family": "qwen2", "n_kv_heads": 2, "qkv_bias": True, "d_head": 4})
    t = llama.tensors(qkv.init(cfg).weights, cfg)
    a, m = "model.layers.0.self_attn", "model.layers.0.mlp"
    assert {k: v.shape for k, v in t.items()} == {
        "model.embed_tokens.weight": (96, 32), "model.layers.0.input_layernorm.weight": (32,),
        f"{a}.q_proj.weight": (16, 32), f"{a}.q_proj.bias": (16,), f"{a}.k_proj.weight": (8, 32),
        f"{a}.k_proj.bias": (8,), f"{a}.v_proj.weight": (8, 32), f"{a}.v_proj.bias": (8,),
        f"{a}.o_proj.weight": (32, 16), "model.layers.0.post_attention_layernorm.weight": (32,),
        f"{m}.gate_proj.weight": (48, 32), f"{m}.up_proj.weight": (48, 32), f"{m}.down_proj.weight": (32, 48),
        "model.norm.weight": (32,), "lm_head.weight": (96, 32)}                  # untied
    cfg = ModelConfig(**{**BERT, "n_layers": 1})
    names = set(bert.tensors(qkv.init(cfg).weights, cfg))
    assert "embeddings.word_embeddings.weight" in names and "encoder.layer.0.attention.output.LayerNorm.bias" in names
    assert len(names) == 5 + 16 and not any(n.startswith(("bert.", "pooler")) for n in names)


@pytest.mark.parametrize("name", CONFIGS)
def test_tensors_then_weights_from_tensors_is_the_same_model(name):
    cfg = CONFIGS[name]
    model = qkv.init(cfg, seed=3)
    t = FAMILIES[cfg.family].tensors(model.weights, cfg)
    for arr in t.values():
        assert arr.flags.c_contiguous and arr.dtype == np.float32
        assert not any(np.shares_memory(arr, w) for w in leaves(model.weights).values())   # new arrays
    weights = weights_from_tensors(t, cfg)
    ids, mask = ids_and_mask(cfg)
    np.testing.assert_array_equal(outputs(qkv.Model(cfg, weights), ids, mask), outputs(model, ids, mask))
    # Every array of the Weights is a view into the dict: nothing copied (an empty one holds no memory).
    for path, arr in leaves(weights).items():
        assert arr.size == 0 or any(np.shares_memory(arr, x) for x in t.values()), path
    assert set(FAMILIES[cfg.family].tensors(weights, cfg)) == set(t)


def test_weights_from_tensors_sees_in_place_updates():
    cfg = CONFIGS["gpt2-untied"]
    t = gpt2.tensors(qkv.init(cfg).weights, cfg)
    w = weights_from_tensors(t, cfg)
    t["transformer.h.0.attn.c_attn.weight"][1, 32 + 5] += 1.0         # W_K[1, 5]
    t["lm_head.weight"] *= 2
    assert w.blocks[0].attn.W_K[1, 5] == t["transformer.h.0.attn.c_attn.weight"][1, 37]
    np.testing.assert_array_equal(w.W_vocab, t["lm_head.weight"].T)
    cfg = CONFIGS["llama-gqa-tied"]
    t = llama.tensors(qkv.init(cfg).weights, cfg)
    w = weights_from_tensors(t, cfg)
    t["model.layers.1.self_attn.q_proj.weight"][3, 7] = 42.0           # (out, in): W_Q[7, 3]
    t["model.embed_tokens.weight"][5] -= 1.0                           # tied: W_vocab[:, 5] moves with it
    assert w.blocks[1].attn.W_Q[7, 3] == 42.0
    np.testing.assert_array_equal(w.W_vocab[:, 5], t["model.embed_tokens.weight"][5])


def test_weights_from_tensors_refuses_mismatches():
    cfg = CONFIGS["llama-mha-untied"]
    t = llama.tensors(qkv.init(cfg).weights, cfg)
    with pytest.raises(QkvError, match="one float type"):
        weights_from_tensors({**t, "model.norm.weight": t["model.norm.weight"].astype(np.float64)}, cfg)
    with pytest.raises(QkvError, match="no tensor 'lm_head.weight'"):
        weights_from_tensors({k: v for k, v in t.items() if k != "lm_head.weight"}, cfg)
    with pytest.raises(QkvError, match=r"q_proj.weight has shape \(32, 32\) but the config implies \(64, 32\)"):
        weights_from_tensors(t, cfg.with_(d_head=16))


# ── init: as transformers initialises, deterministic in the seed ─────────────────

@pytest.mark.parametrize("name", ["gpt2-untied", "llama-gqa-tied", "bert"])
def test_init_is_deterministic_in_the_seed(name):
    cfg = CONFIGS[name]
    a, b, c = (FAMILIES[cfg.family].tensors(qkv.init(cfg, seed=s).weights, cfg) for s in (7, 7, 8))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
        if a[k].ndim == 2 and a[k].size:
            assert not np.array_equal(a[k], c[k]), k


def test_init_statistics_gpt2():
    cfg = ModelConfig(**{**GPT2, "vocab_size": 1000, "d_model": 64, "d_ff": 256, "n_layers": 4,
                         "tied_embeddings": False})
    t = gpt2.tensors(qkv.init(cfg, seed=0).weights, cfg)
    for name, x in t.items():
        if name.endswith("c_proj.weight"):
            assert abs(x.std() / (0.02 / np.sqrt(8)) - 1) < 0.06, name          # σ/√(2L)
        elif x.ndim == 2:
            assert abs(x.std() / 0.02 - 1) < 0.06 and abs(x.mean()) < 0.002, name
        elif name.endswith(".bias"):
            assert not x.any(), name
        else:
            assert (x == 1).all(), name
    assert t["transformer.wte.weight"][0].any()                  # GPT-2's wte has no padding row


def test_init_statistics_llama_and_bert():
    cfg = ModelConfig(**{**LLAMA, "vocab_size": 1000, "d_model": 64, "d_ff": 128, "n_layers": 4, "pad_token_id": 3})
    t = llama.tensors(qkv.init(cfg, seed=1).weights, cfg)
    for name, x in t.items():
        if x.ndim == 2:
            assert abs(x.std() / 0.02 - 1) < 0.06, name           # no depth scaling outside GPT-2
        else:
            assert (x == 1).all(), name                            # RMSNorm γ
    emb = t["model.embed_tokens.weight"]
    assert not emb[3].any() and emb[2].any() and emb[4].any()      # nn.Embedding(padding_idx=3)
    cfg = CONFIGS["bert"]
    t = bert.tensors(qkv.init(cfg, seed=1).weights, cfg)
    assert not t["embeddings.word_embeddings.weight"][0].any()
    assert t["embeddings.position_embeddings.weight"][0].any()
    assert (t["embeddings.LayerNorm.weight"] == 1).all() and not t["encoder.layer.1.output.LayerNorm.bias"].any()


def test_init_from_a_config_dict():
    hf = json.loads((MODELS / "llama_gqa" / "config.json").read_text())     # initializer_range 0.15
    model = qkv.init(hf, seed=2)
    assert model.config == qkv.load(MODELS / "llama_gqa").config
    W = model.weights.blocks[0].attn.W_Q
    assert abs(W.std() / 0.15 - 1) < 0.1
    assert abs(qkv.init(hf, initializer_range=0.02).weights.blocks[0].attn.W_Q.std() / 0.02 - 1) < 0.1
    assert qkv.init(gpt2.hf_config(CONFIGS["gpt2-tied"])).config == CONFIGS["gpt2-tied"]


@pytest.mark.parametrize("kwargs, match", [
    (dict(config={"model_type": "wav2vec2"}), "model_type 'wav2vec2' is not supported"),
    (dict(config={"model_type": "gpt2", "n_embd": "64"}), "n_embd"),
    (dict(config="gpt2"), "ModelConfig or a config.json dict"),
    (dict(config=CONFIGS["bert"], seed=-1), "seed -1"),
    (dict(config=CONFIGS["bert"], dtype=np.float16), "float16 is not supported"),
    (dict(config=CONFIGS["bert"], initializer_range=0.0), "initializer_range"),
])
def test_init_refuses_bad_arguments(kwargs, match):
    with pytest.raises(QkvError, match=match):
        qkv.init(**kwargs)


# ── save → load: the same model ──────────────────────────────────────────────────

@pytest.mark.parametrize("name", CONFIGS)
def test_save_then_load_gives_the_same_outputs(name, tmp_path):
    cfg = CONFIGS[name]
    model = qkv.init(cfg, seed=5)
    assert model.save(tmp_path / "m") == tmp_path / "m"
    assert sorted(os.listdir(tmp_path / "m")) == ["config.json", "model.safetensors"]
    loaded = qkv.load(tmp_path / "m")
    assert loaded.config == cfg and loaded.config.rope_scaling == cfg.rope_scaling
    ids, mask = ids_and_mask(cfg)
    np.testing.assert_array_equal(outputs(loaded, ids, mask), outputs(model, ids, mask))
    # The file holds exactly `tensors`, as F32, with the metadata transformers asks for.
    stored = load_file(tmp_path / "m" / "model.safetensors")
    expected = FAMILIES[cfg.family].tensors(model.weights, cfg)
    assert stored.keys() == expected.keys()
    for k in expected:
        np.testing.assert_array_equal(stored[k], expected[k])
    raw = (tmp_path / "m" / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    assert header["__metadata__"] == {"format": "pt"}
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"F32"}
    assert json.loads((tmp_path / "m" / "config.json").read_text())["dtype"] == "float32"


def test_float64_saves_as_f64(tmp_path):
    cfg = CONFIGS["llama-gqa-tied"]
    model = qkv.init(cfg, seed=1, dtype=np.float64)
    qkv.save(model, tmp_path / "m")
    assert {v.dtype for v in load_file(tmp_path / "m" / "model.safetensors").values()} == {np.dtype(np.float64)}
    ids, mask = ids_and_mask(cfg)
    np.testing.assert_array_equal(outputs(qkv.load(tmp_path / "m", dtype=np.float64), ids, mask),
                                  outputs(model, ids, mask))
    f32 = qkv.init(cfg, seed=1)                                     # the same draw, rounded to float32
    np.testing.assert_array_equal(f32.weights.tok_embed, model.weights.tok_embed.astype(np.float32))


def test_zero_size_tensors_written_by_the_safetensors_library(tmp_path):
    """An attention-only GPT-2 whose file the reference library wrote: c_fc (d, 0) reads back."""
    cfg = CONFIGS["gpt2-attention-only"]
    model = qkv.init(cfg, seed=4)
    t = gpt2.tensors(model.weights, cfg)
    assert t["transformer.h.0.mlp.c_fc.weight"].shape == (32, 0)
    d = tmp_path / "m"
    d.mkdir()
    save_file(t, d / "model.safetensors", metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(gpt2.hf_config(cfg)))
    assert TensorStore(d).get("h.2.mlp.c_proj.weight", (0, 32)).shape == (0, 32)
    ids, mask = ids_and_mask(cfg)
    np.testing.assert_array_equal(outputs(qkv.load(d), ids, mask), outputs(model, ids, mask))


def test_attention_only_block_adds_attention_and_b_out():
    """d_ff = 0: FFN(x) = x·W_in (d, 0) → nothing, ·W_out (0, d) → zeros, + b_out."""
    cfg = CONFIGS["gpt2-attention-only"]
    t = gpt2.tensors(qkv.init(cfg, seed=4).weights, cfg)
    t["transformer.h.0.mlp.c_proj.bias"][:] = 0.5
    model = qkv.Model(cfg, weights_from_tensors(t, cfg))
    trace = model.run([5, 6, 7], keep=("ffn_out",))
    np.testing.assert_array_equal(trace.layers[0].ffn_out, np.full((3, 32), 0.5, np.float32))
    assert not trace.layers[1].ffn_out.any()


def test_tokenizer_is_saved_with_its_config(tmp_path):
    cfg = ModelConfig(**{**LLAMA, "vocab_size": 400})
    tok = Tokenizer(MODELS / "llama_gqa" / "tokenizer.json", chat_template="{{ messages[0]['content'] }}</s>",
                    special_tokens={"eos_token": "</s>", "bos_token": "<s>"})
    model = qkv.init(cfg, tokenizer=tok, name="fresh")
    model.save(tmp_path / "m")
    assert sorted(os.listdir(tmp_path / "m")) == ["config.json", "model.safetensors", "tokenizer.json",
                                                   "tokenizer_config.json"]
    loaded = qkv.load(tmp_path / "m")
    text = "The quick brown fox jumps over the lazy dog"
    np.testing.assert_array_equal(loaded.tokenizer.encode(text)[0], tok.encode(text)[0])
    assert loaded.tokenizer.chat_template == tok.chat_template
    assert loaded.tokenizer.special_tokens == {"eos_token": "</s>", "bos_token": "<s>"}
    assert loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi</s>"
    # Saving a model without a tokenizer over it takes the old tokenizer away.
    qkv.init(cfg).save(tmp_path / "m")
    assert sorted(os.listdir(tmp_path / "m")) == ["config.json", "model.safetensors"]
    assert qkv.load(tmp_path / "m").tokenizer is None


def test_init_refuses_a_tokenizer_larger_than_the_vocabulary():
    with pytest.raises(QkvError, match="the tokenizer has 400 tokens but the config only vocab_size 96"):
        qkv.init(CONFIGS["gpt2-tied"], tokenizer=Tokenizer(MODELS / "gpt2" / "tokenizer.json"))


# ── where a save may write ───────────────────────────────────────────────────────

def snapshot(root) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (None if p.is_dir() or p.is_symlink() else p.read_bytes())
            for p in sorted(root.rglob("*"))}


def test_overwriting_a_previous_save_and_an_empty_directory(tmp_path):
    cfg = CONFIGS["gpt2-tied"]
    qkv.init(cfg, seed=1).save(tmp_path / "m")
    second = qkv.init(cfg, seed=2)
    second.save(tmp_path / "m")
    ids, mask = ids_and_mask(cfg)
    np.testing.assert_array_equal(outputs(qkv.load(tmp_path / "m"), ids, mask), outputs(second, ids, mask))
    (tmp_path / "empty").mkdir()
    second.save(tmp_path / "empty")
    second.save(tmp_path / "new" / "nested")
    assert (tmp_path / "new" / "nested" / "model.safetensors").is_file()


def _hostile_targets(tmp_path):
    (tmp_path / "file").write_text("mine")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    (tmp_path / "foreign" / "config.json").write_text("{}")
    (tmp_path / "subdir").mkdir()
    (tmp_path / "subdir" / "model.safetensors").mkdir()


@pytest.mark.parametrize("target, match", [
    ("file", "is a file"),
    ("link", "is a symbolic link"),
    ("foreign", r"holds other files \(notes.txt\)"),
    ("subdir", r"holds other files \(model.safetensors\)"),
])
def test_hostile_targets_are_refused_and_left_alone(tmp_path, target, match):
    _hostile_targets(tmp_path)
    before = snapshot(tmp_path)
    model = qkv.init(CONFIGS["gpt2-tied"])
    with pytest.raises(QkvError, match=match) as e:
        model.save(tmp_path / target)
    assert "\n" not in str(e.value)
    assert snapshot(tmp_path) == before


def test_an_interrupted_save_leaves_no_partial_model(tmp_path, monkeypatch):
    cfg = CONFIGS["llama-gqa-tied"]
    model = qkv.init(cfg, seed=1)

    def half_then_crash(f, tensors, metadata=None):
        f.write(b"\0" * 1000)
        raise KeyboardInterrupt                          # e.g. Ctrl-C in the middle of the weights

    monkeypatch.setattr(save_module, "write_safetensors", half_then_crash)
    with pytest.raises(KeyboardInterrupt):
        model.save(tmp_path / "m")
    assert not (tmp_path / "m").exists()                 # the directory the save made is gone too
    monkeypatch.undo()
    model.save(tmp_path / "m")                           # a previous save, then a failed overwrite
    before = snapshot(tmp_path)

    def crash(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(save_module.FileBatch, "write_text", crash)   # after the weights were written
    with pytest.raises(QkvError, match="cannot save the model into .*No space left on device"):
        qkv.init(cfg, seed=2).save(tmp_path / "m")
    assert snapshot(tmp_path) == before                  # the previous model, whole; no temporary files
    ids, mask = ids_and_mask(cfg)
    np.testing.assert_array_equal(outputs(qkv.load(tmp_path / "m"), ids, mask), outputs(model, ids, mask))


def test_a_killed_saves_temporary_files_do_not_block_the_next(tmp_path):
    """kill -9 during a save leaves '.model.safetensors.<random>.tmp'; the next save goes ahead."""
    model = qkv.init(CONFIGS["gpt2-tied"])
    model.save(tmp_path / "m")
    (tmp_path / "m" / ".model.safetensors.k2j4x.tmp").write_bytes(b"\0" * 10)
    model.save(tmp_path / "m")
    (tmp_path / "m" / ".notes.txt.k2j4x.tmp").write_bytes(b"")
    with pytest.raises(QkvError, match="holds other files"):
        model.save(tmp_path / "m")
