"""GGUF files (llama.cpp's format): read with ggml-org's `gguf` package, dequantised to float32.

A GGUF file holds the config as metadata keys, the tokenizer (tokens, merges, types, the
pre-tokenizer's name, the chat template) and the tensors, often quantised. qkv turns it,
once, into an ordinary Hugging Face directory in its cache —

    config.json  model.safetensors (float32)  tokenizer.json  tokenizer_config.json

— and loads that like any other checkpoint: memory-mapped, zero-copy. The first load of a
file pays for reading and dequantising (about 2 s for SmolLM2-135M); every later load
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

Architectures: `llama` (Llama, SmolLM2, and Mistral, which llama.cpp writes as `llama`) and
`qwen2` (q/k/v biases, rows not permuted). Anything the engine would silently compute
differently from llama.cpp is refused with one line: other architectures, mixtures of
experts, partial or scaled RoPE other than linear, `rope_freqs` (Llama 3.1's frequency
factors), tensors nothing reads (but the few in IGNORED) or missing ones, shapes that
disagree with the metadata.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..engine.errors import QkvError
from ..engine.io import write_directory
from . import gguf_tokenizer
from .common import unread, unread_error
from .gguf_reader import check_file, metadata, open_reader

ARCHITECTURES = ("llama", "qwen2")
QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
CONVERTER_VERSION = 3          # bump when the conversion changes: cached directories are rebuilt
THREADS = 2                    # tensors dequantised at once (NumPy releases the GIL in the products)

_TENSOR_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}

# Tensors a llama.cpp file may hold that qkv never reads ({i}: a layer, *: anything). Every other
# tensor outside the tables above is refused; `rope_freqs` (Llama 3.1's per-frequency factors) too,
# with its own reason: it changes RoPE, so it cannot be left unread.
IGNORED = {
    "blk.{i}.attn_rot_embd.*": "RoPE's inverse frequencies, which old files stored (llama.cpp computes "
                               "them from rope.freq_base, as qkv does)",
}


def hf_name(name: str) -> str | None:
    """A GGUF tensor name → its Hugging Face name (None for a name outside the table)."""
    stem, _, kind = name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = (stem.split(".", 2) + ["", ""])[:3]
        if part in _TENSOR_NAMES and layer.isdigit():
            return f"layers.{int(layer)}.{_TENSOR_NAMES[part]}.{kind}"
        return None
    return f"{_GLOBAL_NAMES[stem]}.{kind}" if stem in _GLOBAL_NAMES else None


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order so rotate-half RoPE applies (as transformers' loader does).

    llama.cpp's converter interleaves each head's two rotary halves, rows (h, half, i) →
    (h, i, half); we put them back: (out, …) viewed as (H, d_k/2, 2, …) → (H, 2, d_k/2, …).
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ── metadata → config.json ──────────────────────────────────────────────────────

def _number(meta: dict, key: str, kind=int, default=None):
    """A metadata number, checked: one clear error when it is missing or of the wrong kind."""
    value = meta.get(key, default)
    if value is None:
        raise QkvError(f"the GGUF file lacks {key!r}; it is not a complete llama.cpp model")
    if isinstance(value, list):
        raise QkvError(f"the GGUF value {key} is a list (one per layer); qkv runs models whose layers are all "
                       "alike")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and int(value) != value):
        what = "a whole number" if kind is int else "a number"
        raise QkvError(f"the GGUF value {key} = {value!r:.60} is not {what}; the file is damaged")
    if not math.isfinite(float(value)) or value < 0:
        raise QkvError(f"the GGUF value {key} = {value!r} is out of range; the file is damaged")
    return kind(value)


def _rope_scaling(meta: dict, a: str) -> dict | None:
    """llama.cpp's RoPE scaling keys → Hugging Face `rope_scaling` (None, or linear)."""
    kind = meta.get(f"{a}.rope.scaling.type")
    factor = meta.get(f"{a}.rope.scaling.factor", meta.get(f"{a}.rope.scale_linear"))
    if kind is None:
        kind = "linear" if factor is not None else "none"
    if kind == "none" or (kind == "linear" and factor in (None, 1, 1.0)):
        return None
    if kind != "linear":
        raise QkvError(f"GGUF RoPE scaling {kind!r:.40} is not supported; qkv runs plain and 'linear' RoPE")
    factor = _number({"f": factor}, "f", float)
    if factor <= 0:
        raise QkvError(f"the GGUF RoPE scaling factor {factor} is not positive; the file is damaged")
    return {"rope_type": "linear", "factor": factor}


def hf_config(meta: dict) -> dict:
    """GGUF metadata → the config.json of the same model in Hugging Face layout (vocab_size
    and the special token ids are added by `convert`, from the tokenizer)."""
    if meta.get("general.type", "model") != "model":
        raise QkvError(f"the GGUF file is a {meta['general.type']!r:.30} (e.g. a LoRA adapter), not a model; "
                       "give the model's own .gguf file")
    if meta.get("split.count", 1) != 1:
        raise QkvError(f"the GGUF file is one part of a model split in {meta['split.count']!r:.10}; merge the parts "
                       "first (llama.cpp's `llama-gguf-split --merge`)")
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise QkvError(f"GGUF architecture {arch!r:.60} is not supported; qkv runs {', '.join(ARCHITECTURES)} "
                       "(Mistral files are 'llama')")
    a = arch
    if meta.get(f"{a}.expert_count", 0) not in (0, None):
        raise QkvError(f"the GGUF model is a mixture of experts ({a}.expert_count = {meta[f'{a}.expert_count']}), "
                       "which qkv does not run")
    d = _number(meta, f"{a}.embedding_length")
    H = _number(meta, f"{a}.attention.head_count")
    Hkv = _number(meta, f"{a}.attention.head_count_kv", default=H)
    if d <= 0 or H <= 0 or Hkv <= 0 or H % Hkv:
        raise QkvError(f"the GGUF file has d_model {d}, {H} heads and {Hkv} K/V heads, which do not fit "
                       "together (the heads must be a multiple of the K/V heads); the file is damaged")
    d_head = _number(meta, f"{a}.attention.key_length", default=d // H)
    d_v = _number(meta, f"{a}.attention.value_length", default=d_head)
    if d_head <= 0 or d_head % 2 or d_v != d_head:
        raise QkvError(f"the GGUF heads have key size {d_head} and value size {d_v}; qkv needs them equal and "
                       "even")
    rope_dims = _number(meta, f"{a}.rope.dimension_count", default=d_head)
    if rope_dims != d_head:
        raise QkvError(f"the GGUF model rotates {rope_dims} of {d_head} dimensions per head (partial RoPE, "
                       "or head counts that disagree with the file), which qkv does not run")
    cfg = {
        "model_type": arch, "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]],
        "hidden_size": d, "num_attention_heads": H, "num_key_value_heads": Hkv, "head_dim": d_head,
        "num_hidden_layers": _number(meta, f"{a}.block_count"),
        "intermediate_size": _number(meta, f"{a}.feed_forward_length"),
        "max_position_embeddings": _number(meta, f"{a}.context_length"),
        "rms_norm_eps": _number(meta, f"{a}.attention.layer_norm_rms_epsilon", float),
        "rope_theta": _number(meta, f"{a}.rope.freq_base", float, 10000.0),
        "hidden_act": "silu", "torch_dtype": "float32",
    }
    if min(cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["rope_theta"]) <= 0:
        raise QkvError("the GGUF file has no layers, no FFN width or a zero RoPE base; the file is damaged")
    scaling = _rope_scaling(meta, a)
    if scaling:
        cfg["rope_scaling"] = scaling
    return cfg


def expected_shapes(cfg: dict, tensor_names: set[str]) -> dict[str, tuple[int, ...]]:
    """Hugging Face name → shape of every tensor the engine reads, from the config; sets the
    config's tie_word_embeddings and attention_bias from which tensors the file has."""
    d, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    biases = {n for n in tensor_names if n.startswith("blk.") and n.endswith(".bias")}
    if cfg["model_type"] == "llama" and biases:
        cfg["attention_bias"] = True                         # Hugging Face: on q, k, v and o together
    cfg["tie_word_embeddings"] = "output.weight" not in tensor_names
    shapes = {"embed_tokens.weight": (V, d), "norm.weight": (d,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, d)
    for i in range(cfg["num_hidden_layers"]):
        a, m = f"layers.{i}.self_attn", f"layers.{i}.mlp"
        shapes |= {f"layers.{i}.input_layernorm.weight": (d,), f"layers.{i}.post_attention_layernorm.weight": (d,),
                   f"{a}.q_proj.weight": (q, d), f"{a}.k_proj.weight": (kv, d), f"{a}.v_proj.weight": (kv, d),
                   f"{a}.o_proj.weight": (d, q), f"{m}.gate_proj.weight": (f, d), f"{m}.up_proj.weight": (f, d),
                   f"{m}.down_proj.weight": (d, f)}
        if cfg["model_type"] == "qwen2" or cfg.get("attention_bias"):
            shapes |= {f"{a}.q_proj.bias": (q,), f"{a}.k_proj.bias": (kv,), f"{a}.v_proj.bias": (kv,)}
        if cfg.get("attention_bias"):
            shapes[f"{a}.o_proj.bias"] = (d,)
    return shapes


def _used_tensors(reader, cfg: dict) -> list[tuple[str, object, tuple[int, ...]]]:
    """(Hugging Face name, GGUF tensor, shape) of every tensor the engine reads, each checked:
    known name, readable type, the shape the metadata implies; none missing. All before any work."""
    if cfg["num_hidden_layers"] * 9 > len(reader.tensors):
        raise QkvError(f"the GGUF file declares {cfg['num_hidden_layers']} layers but holds only "
                       f"{len(reader.tensors)} tensors; it is incomplete or damaged")
    shapes = expected_shapes(cfg, {t.name for t in reader.tensors})
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise QkvError("the GGUF model scales RoPE per frequency (rope_freqs, as Llama 3.1 does), "
                       "which qkv does not support")
    named = [(hf_name(t.name), t) for t in reader.tensors]
    left = unread([t.name[:80] for name, t in named if name not in shapes], set(), IGNORED)
    if left:
        raise unread_error(left, "the GGUF file", f"{cfg['model_type']} model of this config",
                           "qkv cannot run it (another variant of the architecture, or layers the metadata "
                           "does not declare); use a plain llama or qwen2 file")
    used = []
    for name, t in named:
        if name not in shapes:
            continue                                     # IGNORED
        kind = t.tensor_type.name
        if kind not in QUANT_TYPES:
            raise QkvError(f"tensor {t.name} has GGUF type {kind}, which qkv does not read; use a file "
                           f"quantised as one of {', '.join(QUANT_TYPES)}")
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))   # ggml lists dims innermost first
        if shape != shapes[name]:
            raise QkvError(f"tensor {t.name} has shape {shape}, but the metadata implies {shapes[name]}; "
                           "the file is damaged")
        used.append((name, t, shape))
    missing = sorted(set(shapes) - {name for name, _, _ in used})
    if missing:
        raise QkvError(f"the GGUF file lacks the tensor of {missing[0]} ({len(missing)} missing); it is "
                       "incomplete or damaged")
    return used


# ── tensors → model.safetensors ─────────────────────────────────────────────────

def _dequantised(t, shape: tuple[int, ...], cfg: dict) -> np.ndarray:
    """One tensor as float32 in its Hugging Face shape, Q and K rows back in rotate-half order."""
    import gguf

    try:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)
    except (ValueError, NotImplementedError) as e:
        raise QkvError(f"tensor {t.name} cannot be dequantised ({e}); the file is damaged") from None
    if not np.isfinite(w).all():
        raise QkvError(f"tensor {t.name} holds NaN or infinite values; the file is damaged")
    if cfg["model_type"] == "llama":                                # llama.cpp's converter permuted these
        if t.name.endswith(("attn_q.weight", "attn_q.bias")):
            return _unpermute(w, cfg["num_attention_heads"])
        if t.name.endswith(("attn_k.weight", "attn_k.bias")):
            return _unpermute(w, cfg["num_key_value_heads"])
    return w


def in_order(fn, items, workers: int = THREADS):
    """fn(item) for each item, yielded in order, at most `workers` computed ahead (so at most
    that many dequantised tensors are alive at once). Plain form: `(fn(x) for x in items)`."""
    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(workers) as pool:
        pending = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


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
            f.write(np.ascontiguousarray(w, dtype="<f4").data)        # no copy of the bytes


def convert(path: Path, out: Path) -> None:
    """Write the Hugging Face directory of GGUF file `path` into the (existing, empty) directory `out`."""
    reader = open_reader(path)
    meta = metadata(reader)
    cfg = hf_config(meta)
    tokenizer_json, tokenizer_config, vocab_size = gguf_tokenizer.build(reader, meta)
    declared = meta.get(f"{cfg['model_type']}.vocab_size", vocab_size)
    if declared != vocab_size:
        raise QkvError(f"the GGUF file declares a vocabulary of {declared!r:.20} but its tokenizer has "
                       f"{vocab_size} tokens; the file is damaged")
    cfg["vocab_size"] = vocab_size
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        value = meta.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(value, int) and 0 <= value < vocab_size:
            cfg[key] = value
    used = _used_tensors(reader, cfg)
    shapes = [(name, shape) for name, _, shape in used]
    arrays = in_order(lambda item: _dequantised(item[1], item[2], cfg), used)
    write_safetensors(out / "model.safetensors", shapes, arrays)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "tokenizer.json").write_text(tokenizer_json)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False))
    (out / "qkv_source.json").write_text(json.dumps({"gguf": str(Path(path).resolve()), "converter":
                                                     CONVERTER_VERSION, "name": meta.get("general.name")}, indent=2))


# ── the cache ───────────────────────────────────────────────────────────────────

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


def _convert_into(path: Path, out: Path) -> None:
    """convert(), with a full disk or an unwritable place reported in one line."""
    try:
        convert(path, out)
    except OSError as e:
        raise QkvError(f"cannot write the converted GGUF model to {out.parent}: {e.strerror}; free some space "
                       "or set QKV_CACHE to a writable directory") from None


def _drop_stale(root: Path, final: Path, source: Path) -> None:
    """Remove older conversions of the same file (it changed, or the converter did)."""
    for entry in root.glob(f"{_glob_escape(final.name.rsplit('-', 1)[0])}-*"):
        if entry == final or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            if json.loads((entry / "qkv_source.json").read_text()).get("gguf") == str(source.resolve()):
                shutil.rmtree(entry, ignore_errors=True)
        except (OSError, ValueError, AttributeError):
            continue


def _glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in text)


def converted(path: str | os.PathLike) -> Path:
    """The Hugging Face directory of a GGUF file: from the cache, or converted now (atomically:
    into a private temporary directory, then renamed into place: engine.io.write_directory)."""
    path = Path(path)
    check_file(path)
    root = cache_root()
    if root is None:
        out = Path(tempfile.mkdtemp(prefix=_TEMPORARY))
        try:
            _convert_into(path, out)
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
        return out
    final = root / _key(path)
    if final.is_symlink() or (os.path.lexists(final) and not (final / "qkv_source.json").is_file()):
        raise QkvError(f"{final} is in qkv's GGUF cache but was not written by qkv (a link or a stray file); "
                       "remove it, or set QKV_CACHE to another directory")
    if final.is_dir():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        placed = write_directory(final, lambda tmp: _convert_into(path, tmp))    # never onto a link
    except OSError as e:
        raise QkvError(f"cannot write the GGUF cache {root}: {e.strerror}; set QKV_CACHE to a writable "
                       "directory, or QKV_CACHE=off") from None
    if placed:
        _drop_stale(root, final, path)
    elif final.is_symlink() or not (final / "qkv_source.json").is_file():
        raise QkvError(f"cannot write the GGUF cache {root}: {final.name} appeared there, not written by qkv; "
                       "remove it, or set QKV_CACHE to another directory")
    # else another process converted the same file first: use its copy
    return final
