"""GGUF files of Llama 4's text model (issue 47): llama.cpp's `llama4` (make test: no torch).

Each file is written on the fly as llama.cpp's convert_hf_to_gguf.py lays it out (tests/fixtures/gguf_convert.py:
gguf's own tensor names, no Q/K permutation (RoPE on interleaved pairs in both), the fused experts split and
transposed into ffn_gate_exps / ffn_up_exps (E, f, d) and ffn_down_exps (E, d, f), feed_forward_length the dense FFN's
width, the llama3 RoPE as rope_freqs), and read by qkv. llama.cpp's loader fixes what the file cannot say — chunks of
8192, no RoPE in every 4th layer, the temperature's floor 8192 and scale 0.1, q/k norms unless 128 experts, routed
layers every interleave_moe_layer_step-th, no biases — so the committed fixture (chunks of 4, floor 3, scale 0.5,
biases, routed layers 1 and 2) is refused by the writer, and a random directory of its sizes with llama.cpp's values
(4 layers: the last without RoPE; every 2nd routed) is written and read back: the same knobs, the same numbers.
tests/live/test_live_gguf_apertus_qwen3next_llama4.py compares such files with transformers.
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
from conftest import FIXTURES, MODELS, TOL_ATTENTION, max_abs, run_main
from qkv.checkpoints import gguf_cache
from qkv.runtime.errors import QkvError
from gguf_names import check_names, edited_file

sys.path.insert(0, str(FIXTURES))
import gguf_convert as C  # noqa: E402

# What llama.cpp's llama4 runs (the fixture's sizes): Llama4TextConfig's chunk, NoPE interval, temperature.
LLAMA_CPP = {"attention_bias": False, "interleave_moe_layer_step": 2, "num_hidden_layers": 4, "vocab_size": 400}
DROPPED = ("attention_chunk_size", "floor_scale", "attn_scale", "no_rope_layers", "layer_types", "moe_layers")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


def directory(tmp_path, seed: int = 1, **change):
    """A random Llama 4 text model of the fixture's sizes with llama.cpp's fixed values (LLAMA_CPP, and CHANGE),
    saved by qkv with its interleave_moe_layer_step written (qkv writes moe_layers alone)."""
    hf = {k: v for k, v in json.loads((MODELS / "llama4_text" / "config.json").read_text()).items()
          if k not in DROPPED} | LLAMA_CPP | change
    out = qkv.init(hf, seed=seed, initializer_range=0.2).save(tmp_path / f"hf{seed}")
    config = json.loads((out / "config.json").read_text())
    step = {"interleave_moe_layer_step": hf["interleave_moe_layer_step"]}
    (out / "config.json").write_text(json.dumps(config | step))
    return out


def test_llama4_writer_refuses_the_fixture():
    """The fixture's chunk, NoPE layers, temperature, biases and routed layers are none llama.cpp's file can hold: the
    writer refuses it, naming each (never writes them away)."""
    hf = json.loads((MODELS / "llama4_text" / "config.json").read_text())
    with pytest.raises(ValueError, match="llama4_text: llama.cpp's file loses attention_bias, attention_chunk_size, "
                                         "no_rope_layers, temperature, moe_layers"):
        C.metadata(hf, "llama4")


def test_llama4_file_is_its_directory(tmp_path):
    """The file's names and keys are gguf.constants'; it reads as the directory's knobs (chunks of 8192 on the RoPE
    layers, layer 3 without RoPE and its queries tuned by position, layers 1 and 3 routed with the shared expert, q/k
    norms) but the RoPE, a longrope table of rope_freqs turning each pair as the llama3 RoPE does; its tensors the
    directory's bit for bit (the experts joined back); a padded batch's logits (1e-5: float32's rounding of the two
    RoPE forms) and attention weights, the float32 load's and the cached generation's the directory's."""
    d = directory(tmp_path)
    path = C.convert(d, tmp_path / "l4.gguf")
    check_names("llama4", path)
    read, ours = qkv.load(path), qkv.load(d)
    c = read.config
    assert (c.attention_chunk, c.chunked_layers, c.no_rope_layers, c.temperature_floor, c.temperature_scale) == \
        (8192, (0, 1, 2), (3,), 8192, pytest.approx(0.1))
    assert (c.dense_layers, c.n_experts, c.d_shared_expert, c.qk_l2_norm, c.qkv_bias) == ((0, 2), 4, 16, True, False)
    assert c.rope_scaling["rope_type"] == "longrope"
    assert c == ours.config.with_(rope_scaling=c.rope_scaling, norm_eps=float(np.float32(ours.config.norm_eps)))
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(d / "model.safetensors").items()}
    assert set(mine) == set(theirs), sorted(set(mine) ^ set(theirs))
    assert all(np.array_equal(mine[k], w) for k, w in theirs.items())
    ids = np.arange(3, 23).reshape(2, 10)
    mask = np.ones_like(ids)
    mask[0, :3] = 0
    a, b = read.forward(ids, mask), ours.forward(ids, mask)
    real = mask.astype(bool)
    assert 0 <= max_abs(a.logits[real], b.logits[real]) <= 1e-5
    assert max_abs(a.attentions[:, 1], b.attentions[:, 1]) <= TOL_ATTENTION
    assert max_abs(qkv.load(path, dtype=np.float32).forward(ids).logits, ours.forward(ids).logits) <= 1e-5
    assert read.generate(ids[:1], 6, temperature=0, stop_at_eos=False).tolist() == \
        ours.generate(ids[:1], 6, temperature=0, stop_at_eos=False).tolist()


def test_llama4_q8_0_file_reads_in_place(tmp_path):
    """A 64-wide Llama 4 in Q8_0 (every matrix a whole number of 32-value blocks, the stacked experts too): the default
    load keeps the blocks and joins the experts from their values; its logits equal the float32 load's (1e-4)."""
    d = directory(tmp_path, hidden_size=64, head_dim=16, intermediate_size=32, intermediate_size_mlp=64)
    path = C.convert(d, tmp_path / "q8.gguf", "Q8_0")
    assert {t.tensor_type.name for t in gguf.GGUFReader(path).tensors if len(t.shape) > 1} == {"Q8_0"}
    ids = np.arange(3, 20)[None]
    assert max_abs(qkv.load(path).forward(ids).logits, qkv.load(path, dtype=np.float32).forward(ids).logits) <= 1e-4


def test_llama4_maverick_has_no_qk_norm(tmp_path):
    """llama.cpp runs the 128-expert model (Maverick) without the q/k norms, every other with them: a file of 128
    experts reads with use_qk_norm false, as its directory has it; the same numbers."""
    d = directory(tmp_path, num_local_experts=128, use_qk_norm=False, intermediate_size=8)
    path = C.convert(d, tmp_path / "m.gguf")
    read, ours = qkv.load(path), qkv.load(d)
    assert read.config.qk_l2_norm is False and read.config.n_experts == 128
    ids = np.arange(3, 15)[None]
    assert max_abs(read.forward(ids).logits, ours.forward(ids).logits) <= 1e-5


def _edited(tmp_path, directory, meta: dict, tensors: dict | None = None):
    """DIRECTORY's llama4 file with metadata keys set (None: removed) and tensors set (None: removed)."""
    return edited_file(tmp_path, directory, "llama4", meta, tensors)


@pytest.mark.parametrize("meta, tensors, fragment", [
    ({"llama4.attention.sliding_window": (0, V.UINT32)}, {}, "attention.sliding_window 0 (MobileLLM's"),
    ({"llama4.attention.sliding_window": (-3, V.INT32)}, {}, "llama4.attention.sliding_window = -3 is not a whole"),
    ({"llama4.expert_feed_forward_length": None}, {}, "lacks 'llama4.expert_feed_forward_length'"),
    ({"llama4.interleave_moe_layer_step": None}, {}, "lacks 'llama4.interleave_moe_layer_step'"),
    ({"llama4.expert_feed_forward_length": (24, V.UINT32)}, {}, "blk.1.ffn_down_exps.weight has shape (4, 48, 16), but "
                                                                "the metadata implies (4, 48, 24)"),
    ({}, {"blk.0.attn_q.bias": np.zeros(48, np.float32)}, "blk.0.attn_q.bias"),
    ({}, {"rope_freqs.weight": np.ones(5, np.float32)}, "shape (5,), but the metadata implies (6,)"),
    ({"llama4.attention.clamp_kqv": (8.0, V.FLOAT32)}, {}, "llama4.attention.clamp_kqv"),
])
def test_llama4_refusals_in_one_line(tmp_path, meta, tensors, fragment, monkeypatch, capsys):
    """MobileLLM's window 0 (llama.cpp turns every layer but the last), a window that is no whole number, the experts'
    width missing or not the tensors', biases, rope_freqs of the wrong size, a key qkv does not read: one line each,
    and the CLI's one line with exit 2."""
    path = _edited(tmp_path, directory(tmp_path), meta, tensors)
    with pytest.raises(QkvError) as e:
        qkv.load(path)
    assert fragment in str(e.value) and "\n" not in str(e.value)
    code, out, err = run_main(monkeypatch, capsys, "next", "hi", "--model", str(path))
    assert code == 2 and fragment in err and err.count("\n") == 1
