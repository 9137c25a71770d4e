"""GGUF files of Qwen3-Next (issue 47): llama.cpp's `qwen3next` (make test: no torch).

Each file is written on the fly as llama.cpp's convert_hf_to_gguf.py lays it out (tests/fixtures/gguf_convert.py:
gguf's own tensor names; every RMSNorm but the gated delta rule's written as 1 + w; A as −exp(A_log), dt_bias as
ssm_dt.bias, the conv squeezed to (channels, k); in_proj_qkvz as stored (ssm_in, gguf 0.19's name) or, as the current
converter writes it, split into attn_qkv [Q; K; V] and attn_gate Z; the delta rule's sizes as ssm.* keys; every
full_attention_interval-th layer full), and read by qkv. llama.cpp runs every FFN routed with its top-k renormalised
and every interval-th layer full, so the committed fixture (a dense layer 1, full attention in layer 1 of 3 without an
interval) is refused by the writer, and random directories of its sizes (4 layers) are written and read back: the
same knobs, the same numbers. tests/live/test_live_gguf_apertus_qwen3next_llama4.py compares such files with transformers.
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

DROPPED = ("mlp_only_layers", "layer_types")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))


def directory(tmp_path, interval: int = 4, seed: int = 1, **change):
    """A random Qwen3-Next of the fixture's sizes with 4 layers, every INTERVAL-th full and every FFN routed (and
    CHANGE), saved by qkv (its layer_types) with full_attention_interval written beside them."""
    hf = {k: v for k, v in json.loads((MODELS / "qwen3_next" / "config.json").read_text()).items()
          if k not in DROPPED} | {"num_hidden_layers": 4, "full_attention_interval": interval} | change
    out = qkv.init(hf, seed=seed, initializer_range=0.2).save(tmp_path / f"hf{seed}")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"full_attention_interval": interval}))
    return out


def test_qwen3next_writer_refuses_the_fixture():
    """The fixture's dense layer and its one full layer among three (no interval marks it) are none llama.cpp's file
    can hold; nor are attention biases or top-k weights not renormalised: the writer refuses each, naming it."""
    hf = json.loads((MODELS / "qwen3_next" / "config.json").read_text())
    with pytest.raises(ValueError, match="qwen3_next: llama.cpp's file loses layer_types, dense layers"):
        C.metadata(hf, "qwen3next")
    fine = {k: v for k, v in hf.items() if k not in DROPPED}
    C.metadata(fine, "qwen3next")
    for change, what in (({"attention_bias": True}, "attention_bias"), ({"norm_topk_prob": False}, "norm_topk_prob"),
                         ({"linear_value_head_dim": 16}, "head sizes")):
        with pytest.raises(ValueError, match=f"loses {what}"):
            C.metadata(fine | change, "qwen3next")


@pytest.mark.parametrize("newer, interval", [(False, 2), (True, 4)])
def test_qwen3next_file_is_its_directory(tmp_path, newer, interval):
    """Either layout of in_proj_qkvz (ssm_in; attn_qkv and attn_gate) and interval: the file's names and keys are
    gguf.constants'; it reads as the directory's knobs (its delta and full layers, partial RoPE, the experts and the
    σ-gated shared one); its tensors the directory's (in_proj_qkvz joined back by key head bit for bit, the norms
    written 1 + w and A_log written −exp within float32's rounding); a padded batch's logits (1e-5), the full layers'
    attention weights (1e-5), the float32 load's logits and the cached generation the directory's."""
    d = directory(tmp_path, interval)
    path = C.convert(d, tmp_path / "q.gguf", fused=newer)
    check_names("qwen3next", path)
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    assert ("blk.0.attn_qkv.weight" in names, "blk.0.ssm_in.weight" in names) == (newer, not newer)
    read, ours = qkv.load(path), qkv.load(d)
    assert read.config.delta.layers == tuple(i for i in range(4) if (i + 1) % interval)
    assert read.config == ours.config.with_(norm_eps=float(np.float32(ours.config.norm_eps)))
    mine = load_file(gguf_cache.converted(path) / "model.safetensors")
    theirs = {k.removeprefix("model."): v for k, v in load_file(d / "model.safetensors").items()}
    assert set(mine) == set(theirs), sorted(set(mine) ^ set(theirs))
    for k, w in theirs.items():
        if k.endswith("A_log") or (k.endswith("norm.weight") and "linear_attn" not in k):
            np.testing.assert_allclose(mine[k], w, rtol=4 * np.finfo(np.float32).eps, atol=2 * np.finfo(np.float32).eps)
        else:
            assert np.array_equal(mine[k], w), k
    ids = np.arange(3, 23).reshape(2, 10)
    mask = np.ones_like(ids)
    mask[0, :3] = 0
    a, b = read.forward(ids, mask), ours.forward(ids, mask)
    real = mask.astype(bool)
    assert max_abs(a.logits[real], b.logits[real]) <= 1e-5
    full = [i for i in range(4) if i not in read.config.delta.layers]
    assert max_abs(a.attentions[full][:, 1], b.attentions[full][:, 1]) <= TOL_ATTENTION
    assert max_abs(qkv.load(path, dtype=np.float32).forward(ids).logits, ours.forward(ids).logits) <= 1e-5
    assert read.generate(ids[:1], 6, temperature=0, stop_at_eos=False).tolist() == \
        ours.generate(ids[:1], 6, temperature=0, stop_at_eos=False).tolist()


def test_qwen3next_norms_are_read_back_as_w(tmp_path):
    """The norms a file holds as 1 + w (every RMSNorm but the delta rule's gated one, which llama.cpp multiplies by
    its γ as stored) read back as w: a directory with random norm weights gives the same logits (1e-5)."""
    d = directory(tmp_path)
    weights = load_file(d / "model.safetensors")
    rng = np.random.default_rng(0)
    for k, w in weights.items():
        if k.endswith("norm.weight"):
            weights[k] = rng.normal(0, 0.5, w.shape).astype(np.float32)
    from safetensors.numpy import save_file
    save_file(weights, d / "model.safetensors")
    path = C.convert(d, tmp_path / "n.gguf", fused=True)
    ids = np.arange(3, 20)[None]
    assert max_abs(qkv.load(path).forward(ids).logits, qkv.load(d).forward(ids).logits) <= 1e-5
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}
    gated = np.asarray(stored["blk.0.ssm_norm.weight"].data)
    assert np.array_equal(gated, weights["model.layers.0.linear_attn.norm.weight"])     # as stored
    assert np.array_equal(np.asarray(stored["blk.0.attn_norm.weight"].data),
                          weights["model.layers.0.input_layernorm.weight"] + np.float32(1))


def test_qwen3next_f16_file_reads_in_place(tmp_path):
    """An F16 file (matrices and the stacked experts; the norms, A, dt_bias and the conv F32): the default load keeps
    the matrices' blocks and reads the changed tensors as values; its logits equal the float32 load's (1e-5)."""
    path = C.convert(directory(tmp_path), tmp_path / "q16.gguf", "F16", fused=True)
    ids = np.arange(3, 20)[None]
    assert max_abs(qkv.load(path).forward(ids).logits, qkv.load(path, dtype=np.float32).forward(ids).logits) <= 1e-5


def _edited(tmp_path, directory, meta: dict, tensors: dict | None = None):
    """DIRECTORY's qwen3next file with metadata keys set (None: removed) and tensors set (None: removed)."""
    return edited_file(tmp_path, directory, "qwen3next", meta, tensors)


@pytest.mark.parametrize("meta, tensors, fragment", [
    ({"qwen3next.ssm.group_count": None}, {}, "qwen3next.ssm.group_count = None is missing or not a positive whole"),
    ({"qwen3next.ssm.group_count": (3, V.UINT32)}, {}, "4 value heads (ssm.time_step_rank) for 3 key heads"),
    ({"qwen3next.expert_feed_forward_length": None}, {}, "expert_feed_forward_length = None is missing"),
    ({"qwen3next.full_attention_interval": (0, V.UINT32)}, {}, "full_attention_interval = 0 is missing or not"),
    ({"qwen3next.expert_shared_feed_forward_length": (16, V.UINT32)}, {},
     "blk.0.ffn_down_shexp.weight has shape (32, 24), but the metadata implies (32, 16)"),
    ({}, {"blk.1.attn_q.bias": np.zeros(128, np.float32)}, "blk.1.attn_q.bias"),
    ({}, {"blk.3.ssm_a": np.ones(4, np.float32)}, "blk.3.ssm_a"),
    ({}, {"blk.0.ssm_in.weight": None}, "lacks the tensor blk.0.ssm_in.weight"),
    ({"qwen3next.ssm.dt_b_c_rms": (True, V.BOOL)}, {}, "qwen3next.ssm.dt_b_c_rms"),
])
def test_qwen3next_refusals_in_one_line(tmp_path, meta, tensors, fragment, monkeypatch, capsys):
    """The key heads missing or not dividing the value heads, the experts' width missing, an interval of 0, a shared expert of another width than
    its tensors, a bias or a delta tensor in a full layer, a delta layer's projection missing, a key qkv does not read:
    one line each, and the CLI's one line with exit 2."""
    path = _edited(tmp_path, directory(tmp_path), meta, tensors)
    with pytest.raises(QkvError) as e:
        qkv.load(path)
    assert fragment in str(e.value) and "\n" not in str(e.value)
    code, out, err = run_main(monkeypatch, capsys, "next", "hi", "--model", str(path))
    assert code == 2 and fragment in err and err.count("\n") == 1
