"""checkpoints: resolving sources, loading every layout, and one clear error for each mistake."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import qkv
from qkv.checkpoints import resolve
from conftest import MODELS, TOL_HIDDEN, max_abs, reference


def copy_fixture(name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(MODELS / name, dst)
    return dst


def logits(model, name="gpt2"):
    return model.forward(reference(name)["single_input_ids"]).logits


def test_default_model_loads_by_alias(minilm):
    assert minilm.config.family == "bert" and minilm.config.n_heads == 12 and minilm.config.d_model == 384
    assert resolve("minilm") == resolve("sentence-transformers/all-MiniLM-L6-v2")


def test_weights_are_memory_mapped_not_copied(minilm):
    w = minilm.weights.tok_embed
    assert not w.flags.owndata and not w.flags.writeable        # a view of the mapped file


@pytest.mark.parametrize("source, match", [
    ("no-such-model", "not a directory"),
    ("./missing/dir", "not a directory"),
    ("someone/not-cached", "not in the Hugging Face cache"),
])
def test_unknown_sources(source, match):
    with pytest.raises(qkv.QkvError, match=match):
        qkv.load(source)


def test_a_file_is_not_a_model(tmp_path):
    with pytest.raises(qkv.QkvError, match="is a file"):
        qkv.load(copy_fixture("gpt2", tmp_path) / "config.json")


def test_missing_or_broken_config(tmp_path):
    d = copy_fixture("gpt2", tmp_path)
    (d / "config.json").write_text("{not json")
    with pytest.raises(qkv.QkvError, match="not valid JSON"):
        qkv.load(d)
    (d / "config.json").unlink()
    with pytest.raises(qkv.QkvError, match="no config.json"):
        qkv.load(d)


def test_unsupported_model_type(tmp_path):
    d = copy_fixture("gpt2", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "wav2vec2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(qkv.QkvError, match="model_type 'wav2vec2' is not supported"):
        qkv.load(d)


def test_config_and_tensors_disagree(tmp_path):
    d = copy_fixture("llama_gqa", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_key_value_heads"] = 4
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(qkv.QkvError, match=r"k_proj.weight has shape .* config.json implies"):
        qkv.load(d)


def test_missing_tensor(tmp_path):
    d = copy_fixture("gpt2", tmp_path)
    tensors = load_file(d / "model.safetensors")
    del tensors[next(k for k in tensors if k.endswith("h.1.ln_2.weight"))]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(qkv.QkvError, match="no tensor 'h.1.ln_2.weight'"):
        qkv.load(d)


def test_pickle_weights_are_refused(tmp_path):
    d = copy_fixture("gpt2", tmp_path)
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    with pytest.raises(qkv.QkvError, match="pickle"):
        qkv.load(d)


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage header"])
def test_damaged_safetensors(tmp_path, damage):
    d = copy_fixture("gpt2", tmp_path)
    path = d / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[: len(data) // 2],
                      "garbage header": struct.pack("<Q", 40) + b"\xff" * 60}[damage])
    with pytest.raises(qkv.QkvError, match="safetensors|truncated|re-download"):
        qkv.load(d)


def test_sharded_checkpoint(tmp_path):
    d = copy_fixture("gpt2", tmp_path)
    tensors = load_file(d / "model.safetensors")
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, d / fname)
    (d / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {k: f for f, keys in halves.items() for k in keys}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert max_abs(logits(qkv.load(d)), reference("gpt2")["single_logits"]) <= TOL_HIDDEN


def write_bf16(tensors: dict[str, np.ndarray], path):
    """A safetensors file in bfloat16 (NumPy has no bfloat16: keep the top 16 bits by hand)."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = (np.ascontiguousarray(arr, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def truncate_to_bf16(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)


@pytest.mark.parametrize("kind", ["F16", "BF16"])
def test_half_precision_checkpoints_upcast(tmp_path, kind):
    d = copy_fixture("gpt2", tmp_path)
    tensors = load_file(d / "model.safetensors")
    if kind == "F16":
        save_file({k: v.astype(np.float16) for k, v in tensors.items()}, d / "model.safetensors")
        rounded = {k: v.astype(np.float16).astype(np.float32) for k, v in tensors.items()}
    else:
        write_bf16(tensors, d / "model.safetensors")
        rounded = {k: truncate_to_bf16(v) for k, v in tensors.items()}
    model = qkv.load(d)
    assert model.weights.tok_embed.dtype == np.float32
    want = next(v for k, v in rounded.items() if k.endswith("wte.weight"))
    assert np.array_equal(model.weights.tok_embed, want)


def test_hugging_face_cache_is_searched_offline(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--someone--tiny-gpt2" / "snapshots" / "abc123"
    shutil.copytree(MODELS / "gpt2", snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    model = qkv.load("someone/tiny-gpt2")
    assert max_abs(logits(model), reference("gpt2")["single_logits"]) <= TOL_HIDDEN
    assert ("someone/tiny-gpt2", "gpt2 (supported) in the Hugging Face cache") in qkv.available()


def test_directory_without_tokenizer_runs_on_ids_only():
    model = qkv.load(MODELS / "llama_mqa")
    assert model.tokenizer is None
    assert model.forward([[1, 2, 3]]).logits.shape == (1, 3, model.config.vocab_size)
    assert model.run([1, 2, 3]).tokens == ["1", "2", "3"]
    with pytest.raises(qkv.QkvError, match="no tokenizer.json"):
        model.run("hello")


def test_bad_text_and_ids(minilm):
    gpt2 = qkv.load(MODELS / "gpt2")
    for text in ("", "   \n\t"):
        with pytest.raises(qkv.QkvError, match="empty"):
            minilm.run(text)
    with pytest.raises(qkv.QkvError, match="at most 512"):
        minilm.run("word " * 600)
    with pytest.raises(qkv.QkvError, match="at most 128"):
        gpt2.forward(np.zeros((1, 129), dtype=np.int64))
    with pytest.raises(qkv.QkvError, match="outside the vocabulary"):
        gpt2.forward([[1, 2, gpt2.config.vocab_size]])
    with pytest.raises(qkv.QkvError, match="outside the vocabulary"):
        gpt2.forward([[-1, 2]])
    with pytest.raises(qkv.QkvError, match="integers"):
        gpt2.forward([[1.5, 2.0]])
    with pytest.raises(qkv.QkvError, match="attention_mask has shape"):
        gpt2.forward([[1, 2, 3]], attention_mask=[[1, 1]])
    with pytest.raises(qkv.QkvError, match="empty"):
        gpt2.forward(np.zeros((1, 0), dtype=np.int64))


def test_hostile_text_is_just_text(minilm):
    t = minilm.run("<img src=x onerror=alert(1)> \x00 ﷽ 🙂 [SEP] [CLS]")
    assert np.isfinite(t.hidden).all() and np.isfinite(t.attentions).all()


@pytest.mark.parametrize("where, kind", [
    (MODELS / "gpt2", "Model"), (MODELS.parent / "seq2seq" / "t5", "Seq2SeqModel"), (MODELS / "vit", "ImageModel"),
    (MODELS / "whisper", "AudioModel"), (MODELS / "clip_siglip" / "clip", "PairModel"),
    (MODELS / "clip_siglip" / "clip_text", "TextTower"), (MODELS / "clip_siglip" / "siglip_vision", "ImageTower")])
def test_every_handle_carries_its_source_and_arithmetic(where, kind):
    """What qkv.load was given, as a string another process loads again (analysis workers), and how it computes;
    kept by astype. A model qkv.load did not make (fresh, or built from arrays) has no source."""
    model = qkv.load(where)
    assert type(model).__name__ == kind
    assert (model.source, model.arith) == (str(where), "exact")
    wide = model.astype(np.float64)
    assert (type(wide), wide.source, wide.arith) == (type(model), str(where), "exact")
    again = qkv.load(model.source)
    assert type(again) is type(model) and repr(again.config) == repr(model.config)
    if kind == "PairModel":
        assert model.text.source is None and model.vision.source is None     # a tower alone is not what it loads


def test_a_model_not_loaded_has_no_source(minilm):
    from qkv.models.fresh import init
    from qkv.models.model import Model

    assert minilm.source == "minilm" and minilm.name == "all-MiniLM-L6-v2"      # the name shown is not the source
    assert minilm.with_config(sliding_window=None).source == "minilm"
    assert Model(minilm.config, minilm.weights, minilm.tokenizer, name="minilm").source is None
    fresh = init(qkv.load(MODELS / "gpt2").config)
    assert (fresh.source, fresh.arith) == (None, "exact")
