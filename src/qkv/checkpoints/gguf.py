"""GGUF files (llama.cpp's format): read with ggml-org's `gguf` package, dequantised to float32.

A GGUF file holds the config as metadata keys, the tokenizer (tokens, merges, types, the
pre-tokenizer's name, the chat template) and the tensors, often quantised. qkv turns it,
once, into an ordinary Hugging Face directory in its cache —

    config.json  model.safetensors (float32)  tokenizer.json  tokenizer_config.json

— and loads that like any other checkpoint: memory-mapped, zero-copy. The first load of a
file pays for reading and dequantising (a few seconds for SmolLM2-135M); every later load
maps the cached file. `QKV_CACHE=off` converts in a temporary directory instead.

    GGUF tensor name            Hugging Face name (LlamaModel)
    token_embd                  embed_tokens
    blk.{i}.attn_norm           layers.{i}.input_layernorm
    blk.{i}.attn_q / k / v      layers.{i}.self_attn.q_proj / k_proj / v_proj   (Q, K: see _unpermute)
    blk.{i}.attn_output         layers.{i}.self_attn.o_proj
    blk.{i}.ffn_norm            layers.{i}.post_attention_layernorm
    blk.{i}.ffn_gate / up / down  layers.{i}.mlp.gate_proj / up_proj / down_proj
    output_norm                 norm
    output (absent when tied)   lm_head
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
import numpy as np

from ..errors import QkvError
from . import gguf_tokenizer

ARCHITECTURES = ("llama", "mistral", "qwen2")
QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
CONVERTER_VERSION = 1          # bump when the conversion changes: cached directories are rebuilt

_TENSOR_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def hf_name(name: str) -> str | None:
    """A GGUF tensor name → its Hugging Face name (None for tensors qkv does not use, e.g. rope_freqs)."""
    stem, _, kind = name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        if part in _TENSOR_NAMES:
            return f"layers.{layer}.{_TENSOR_NAMES[part]}.{kind}"
        return None
    return f"{_GLOBAL_NAMES[stem]}.{kind}" if stem in _GLOBAL_NAMES else None


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order so rotate-half RoPE applies (as transformers' loader does).

    llama.cpp's converter interleaves each head's two rotary halves, rows (h, half, i) →
    (h, i, half); we put them back: (out, …) viewed as (H, d_k/2, 2, …) → (H, 2, d_k/2, …).
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def open_reader(path: Path):
    """The gguf package's reader, or one clear error for a file that is not GGUF."""
    import gguf

    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise QkvError(f"cannot read {path}: {e.strerror}; give a readable .gguf file") from None
    if magic != b"GGUF":
        raise QkvError(f"{path} is not a GGUF file (it does not start with 'GGUF'); give a llama.cpp .gguf model")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, TypeError, OverflowError, MemoryError, struct.error) as e:
        raise QkvError(f"{path} is a damaged GGUF file ({type(e).__name__}: {e}); re-download it") from None


def metadata(reader) -> dict:
    """Every scalar and string metadata value (arrays of tokens and merges are left to the tokenizer)."""
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "merges", "token_type", "scores")):
            continue
        try:
            meta[key] = field.contents()
        except (ValueError, IndexError, TypeError, UnicodeDecodeError):
            continue
    return meta


def _number(meta: dict, key: str, kind=int, default=None):
    """A metadata number, checked: one clear error when it is missing or of the wrong kind."""
    value = meta.get(key, default)
    if value is None:
        raise QkvError(f"the GGUF file lacks {key!r}; it is not a complete llama.cpp model")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and int(value) != value):
        raise QkvError(f"the GGUF value {key} = {value!r} is not a {kind.__name__}; the file is damaged")
    return kind(value)


def hf_config(meta: dict, tensor_names: set[str], vocab_size: int) -> dict:
    """GGUF metadata → the config.json of the same model in Hugging Face layout."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise QkvError(f"GGUF architecture {arch!r} is not supported; qkv runs {', '.join(ARCHITECTURES)}")
    a = arch
    d = _number(meta, f"{a}.embedding_length")
    H = _number(meta, f"{a}.attention.head_count")
    Hkv = _number(meta, f"{a}.attention.head_count_kv", default=H)
    if d <= 0 or H <= 0 or Hkv <= 0 or H % Hkv:
        raise QkvError(f"the GGUF file has d_model {d}, {H} heads and {Hkv} K/V heads, which do not fit "
                       "together; the file is damaged")
    d_head = _number(meta, f"{a}.attention.key_length", default=d // H)
    rope_dims = _number(meta, f"{a}.rope.dimension_count", default=d_head)
    if rope_dims != d_head:
        raise QkvError(f"the GGUF model rotates {rope_dims} of {d_head} dimensions per head (partial RoPE), "
                       "which qkv does not support")
    cfg = {
        "model_type": arch, "architectures": [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                                                "qwen2": "Qwen2ForCausalLM"}[arch]],
        "vocab_size": vocab_size, "hidden_size": d, "num_attention_heads": H, "num_key_value_heads": Hkv,
        "head_dim": d_head, "num_hidden_layers": _number(meta, f"{a}.block_count"),
        "intermediate_size": _number(meta, f"{a}.feed_forward_length"),
        "max_position_embeddings": _number(meta, f"{a}.context_length", default=2048),
        "rms_norm_eps": _number(meta, f"{a}.attention.layer_norm_rms_epsilon", float, 1e-5),
        "rope_theta": _number(meta, f"{a}.rope.freq_base", float, 10000.0),
        "hidden_act": "silu", "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": "float32",
    }
    scaling = meta.get(f"{a}.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise QkvError(f"GGUF rope scaling {scaling!r} is not supported; qkv reads 'linear' scaling")
        cfg["rope_scaling"] = {"rope_type": "linear",
                               "factor": _number(meta, f"{a}.rope.scaling.factor", float)}
    if arch == "mistral" and f"{a}.attention.sliding_window" in meta:
        cfg["sliding_window"] = _number(meta, f"{a}.attention.sliding_window")
    if arch == "llama" and "blk.0.attn_q.bias" in tensor_names:
        cfg["attention_bias"] = True
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        value = meta.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(value, int) and 0 <= value < vocab_size:
            cfg[key] = value
    return cfg


def _used_tensors(reader) -> list[tuple[str, object, tuple[int, ...]]]:
    """(Hugging Face name, GGUF tensor, Hugging Face shape) of every tensor the engine reads;
    an unreadable quantisation fails here, before any work."""
    used = []
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        if t.tensor_type.name not in QUANT_TYPES:
            raise QkvError(f"tensor {t.name} has GGUF type {t.tensor_type.name}, which qkv does not read; "
                           f"use a file quantised as one of {', '.join(QUANT_TYPES)}")
        used.append((name, t, tuple(int(x) for x in reversed(t.shape))))  # ggml lists dims innermost first
    return used


def _dequantised(t, shape: tuple[int, ...], cfg: dict) -> np.ndarray:
    """One tensor as float32 in its Hugging Face shape, Q and K rows back in rotate-half order."""
    import gguf

    try:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)
    except (ValueError, NotImplementedError) as e:
        raise QkvError(f"tensor {t.name} cannot be dequantised ({e}); the file is damaged") from None
    if cfg["model_type"] in ("llama", "mistral"):                  # llama.cpp's converter permuted these
        if t.name.endswith(("attn_q.weight", "attn_q.bias")):
            return _unpermute(w, cfg["num_attention_heads"])
        if t.name.endswith(("attn_k.weight", "attn_k.bias")):
            return _unpermute(w, cfg["num_key_value_heads"])
    return w


def write_safetensors(path: Path, shapes: list[tuple[str, tuple[int, ...]]], arrays) -> None:
    """A float32 safetensors file, written tensor by tensor: the header comes from the shapes,
    then each array of `arrays` (in the same order) is written and dropped."""
    header, offset = {}, 0
    for name, shape in shapes:
        size = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)                                      # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for (name, shape), w in zip(shapes, arrays):
            assert w.shape == shape, (name, w.shape, shape)
            f.write(np.ascontiguousarray(w, dtype="<f4").tobytes())


def convert(path: Path, out: Path) -> None:
    """Write the Hugging Face directory of GGUF file `path` into the (existing, empty) directory `out`."""
    reader = open_reader(path)
    meta = metadata(reader)
    tokenizer_json, tokenizer_config, vocab_size = gguf_tokenizer.build(reader, meta)
    used = _used_tensors(reader)
    cfg = hf_config(meta, {t.name for t in reader.tensors}, vocab_size)
    shapes = [(name, shape) for name, _, shape in used]
    if ("embed_tokens.weight", (vocab_size, cfg["hidden_size"])) not in shapes:
        raise QkvError(f"{path} has no token embedding of {vocab_size} × {cfg['hidden_size']}; "
                       "the file is incomplete or damaged")
    write_safetensors(out / "model.safetensors", shapes, (_dequantised(t, shape, cfg) for _, t, shape in used))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "tokenizer.json").write_text(tokenizer_json)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False))
    (out / "qkv_source.json").write_text(json.dumps({"gguf": str(path), "name": meta.get("general.name"),
                                                     "converter": CONVERTER_VERSION}, indent=2))


def cache_root() -> Path | None:
    """Where converted GGUF files live: $QKV_CACHE, else $XDG_CACHE_HOME/qkv or ~/.cache/qkv;
    None when QKV_CACHE is 'off'."""
    env = os.environ.get("QKV_CACHE")
    if env is not None and env.lower() in ("off", "0", "no", ""):
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qkv"


_TEMPORARY = "qkv-gguf-"


def is_temporary(directory: Path) -> bool:
    """Whether `directory` is a conversion made with QKV_CACHE=off (to delete once loaded)."""
    return directory.name.startswith(_TEMPORARY) and directory.parent == Path(tempfile.gettempdir())


def _key(path: Path) -> str:
    """A cache key that changes when the file (its place, size or modification time) or the converter does."""
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{CONVERTER_VERSION}"
    return f"{path.stem[:60]}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def converted(path: str | os.PathLike) -> Path:
    """The Hugging Face directory of a GGUF file: from the cache, or converted now (atomically)."""
    path = Path(path)
    root = cache_root()
    if root is None:
        out = Path(tempfile.mkdtemp(prefix=_TEMPORARY))
        try:
            convert(path, out)
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
        return out
    final = root / _key(path)
    if (final / "qkv_source.json").is_file() and not final.is_symlink():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".converting-"))
    except OSError as e:
        raise QkvError(f"cannot write the GGUF cache {root}: {e.strerror}; set QKV_CACHE to a writable "
                       "directory, or QKV_CACHE=off") from None
    try:
        convert(path, tmp)
        try:
            os.rename(tmp, final)                     # atomic; a directory never follows a planted link
        except OSError:
            if not (final / "qkv_source.json").is_file() or final.is_symlink():
                raise                                 # not another process winning the race
    except OSError as e:
        raise QkvError(f"cannot write the GGUF cache {root}: {e.strerror}; free some space, set QKV_CACHE "
                       "to a writable directory, or QKV_CACHE=off") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
