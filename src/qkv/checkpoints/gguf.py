"""GGUF files (llama.cpp's format): read with ggml-org's `gguf` package.

A GGUF file holds the config as metadata keys, the tokenizer (tokens, merges, types, the
pre-tokenizer's name, the chat template) and the tensors, often quantised. qkv describes it
as an ordinary Hugging Face directory (`describe`) —

    config.json  tokenizer.json  tokenizer_config.json  qkv_source.json (the file it stands for)

— and a load (by default, "stored") reads the tensors from the GGUF file itself (gguf_stored: the
quantised matrices as their blocks, in place). A float32 or float64 load adds model.safetensors,
every tensor dequantised to float32 (`write_tensors`; about 2 s for SmolLM2-135M), and maps it
like any other checkpoint. This module converts; where the directories are kept, once per file, is
gguf_cache.py's (`described`, `with_tensors`).

Architectures (each one's table of metadata keys and tensor names is in its family's module, GGUF = {…};
gguf_archs.py reads them and undoes what llama.cpp's converter changed): `llama` (Llama, SmolLM2, and Mistral, which
llama.cpp writes as `llama`; Q/K rows un-permuted), `qwen2`, `qwen3`, `gemma`, `olmo2`, `phi2`,
`gptneox` (Pythia), `gpt2`, `starcoder2`, `stablelm`, `granite` (its multipliers), `arcee`, `phi3` (without
LongRoPE), `command-r` (Cohere), `falcon`, `bloom` and `mpt` (ALiBi), and the mixtures `qwen2moe`,
`qwen3moe`, `olmoe` and Mixtral (`llama` with experts); of 2025–26 `ernie4_5-moe`, `dots1`, `exaone4`,
`deepseek2` (latent attention: attn_k_b and attn_v_b joined back into kv_b_proj), `gpt-oss` (sinks, MXFP4
experts, YaRN), `mamba` and `mamba2` (state-space blocks: no heads; `ssm_dimensions`) and the hybrids `jamba` and
`granitehybrid` (Mamba layers among attention ones, one K/V count a layer: `hybrid_layers`) and `falcon-h1` (both in
every layer, its µP multipliers folded into the weights); `apertus` (xIELU's numbers as metadata arrays), `llama4`
(experts and a shared one, chunks and NoPE layers as llama.cpp fixes them) and `qwen3next` (gated delta layers among
gated attention ones). Anything the engine would silently compute differently from llama.cpp is refused with one line:
other architectures, metadata keys the arch's table does not read (soft-capping, sliding windows, …), scaled RoPE
other than linear, `rope_freqs` (Llama 3's frequency factors: read as a longrope table where the arch's table has
it, llama (Llama 3.x), apertus and llama4: `rope_freqs`; refused elsewhere), tensors nothing reads (but the few in IGNORED) or missing
ones, shapes that disagree with the metadata.
"""

from __future__ import annotations

import json
import math
import struct
from collections import deque
from dataclasses import dataclass
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import write_atomic
from ..runtime.io_json import Fields, read_json
from . import gguf_archs, gguf_tokenizer
from .common import unread, unread_error
from .gguf_reader import metadata, open_reader
from .table import gguf_rope_kind

QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "MXFP4")
CONVERTER_VERSION = 4          # bump when the conversion of a file read before changes: cached directories are rebuilt
THREADS = 2                    # tensors dequantised at once (NumPy releases the GIL in the products)
SOURCE_LIMIT = 1 << 16         # bytes of a qkv_source.json (describe writes ~200)
MAX_VOCAB = 1 << 31            # a config.json's vocab_size, as the cache's reader accepts it

# Tensors a llama.cpp file may hold that qkv never reads ({i}: a layer, *: anything). Every other
# tensor outside the arch's table is refused; `rope_freqs` (a llama3 RoPE's per-frequency factors) is read where
# the arch's table has it and refused elsewhere with its own reason: it changes RoPE, so it cannot be left unread.
IGNORED = {
    "blk.{i}.attn_rot_embd.*": "RoPE's inverse frequencies, which old files stored (llama.cpp computes "
                               "them from rope.freq_base, as qkv does)",
}


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
    kind, factor = gguf_rope_kind(meta, a)
    if kind == "none":
        return None
    if kind != "linear":
        raise QkvError(f"GGUF RoPE scaling {kind!r:.40} is not supported; qkv runs plain and 'linear' RoPE")
    factor = _number({"f": factor}, "f", float)
    if factor <= 0:
        raise QkvError(f"the GGUF RoPE scaling factor {factor} is not positive; the file is damaged")
    return {"rope_type": "linear", "factor": factor}


def dimensions(meta: dict, a: str) -> dict:
    """The sizes every arch has, read and checked: d, H, Hkv, d_head, L, f, n_ctx, theta, eps, rope_dims (a
    state-space arch's: `ssm_dimensions`)."""
    arch = gguf_archs.ARCHS[a]
    if f"{a}.ssm.inner_size" in meta:
        if not meta.get(f"{a}.attention.head_count"):              # Mamba: no attention (head_count 0)
            return ssm_dimensions(meta, a)
        meta, kinds = hybrid_layers(meta, a)                         # Jamba: scan layers among attention ones
        scan = {k: v for k, v in ssm_dimensions(meta, a).items() if k in ("d_inner", "d_state", "d_conv", "dt_rank")}
        return dimensions({k: v for k, v in meta.items() if not k.startswith(f"{a}.ssm.")}, a) | scan | \
            ({"kinds": kinds} if kinds else {})
    d = _number(meta, f"{a}.embedding_length")
    H = _number(meta, f"{a}.attention.head_count")
    Hkv = _number(meta, f"{a}.attention.head_count_kv", default=H)
    if d <= 0 or H <= 0 or Hkv <= 0 or H % Hkv:
        raise QkvError(f"the GGUF file has d_model {d}, {H} heads and {Hkv} K/V heads, which do not fit "
                       "together (the heads must be a multiple of the K/V heads); the file is damaged")
    if f"{a}.attention.kv_lora_rank" in meta:       # latent attention (DeepSeek): written as one K/V head over the
        Hkv, mla = H, f"{a}.attention.key_length_mla" in meta     # latent, each head's sizes the *_mla keys (older
        d_head = _number(meta, f"{a}.attention.key_length{'_mla' if mla else ''}")    # files: H heads of them)
        d_v = _number(meta, f"{a}.attention.value_length{'_mla' if mla else ''}")
        if min(d_head, d_v) <= 0:
            raise QkvError(f"the GGUF heads have key size {d_head} and value size {d_v}; the file is damaged")
    else:
        d_head = _number(meta, f"{a}.attention.key_length", default=d // H)
        d_v = _number(meta, f"{a}.attention.value_length", default=d_head)
        if d_head <= 0 or d_head % 2 or d_v != d_head:
            raise QkvError(f"the GGUF heads have key size {d_head} and value size {d_v}; qkv needs them equal and "
                           "even")
    eps = f"{a}.attention.layer_norm_rms_epsilon" if arch.norm == "rms" else f"{a}.attention.layer_norm_epsilon"
    dims = {"d": d, "H": H, "Hkv": Hkv, "d_head": d_head, "d_v": d_v, "L": _number(meta, f"{a}.block_count"),
            "f": _number(meta, f"{a}.feed_forward_length"), "n_ctx": _number(meta, f"{a}.context_length"),
            "theta": _number(meta, f"{a}.rope.freq_base", float, 10000.0), "eps": _number(meta, eps, float),
            "rope_dims": _number(meta, f"{a}.rope.dimension_count", default=d_head)}
    if arch.experts:                                                 # E experts, k chosen for each token
        fe = _number(meta, f"{a}.expert_feed_forward_length", default=dims["f"])
        shared = _number(meta, f"{a}.expert_shared_count", default=0)   # dots1: shared experts, each fe wide
        dims |= {"E": _number(meta, f"{a}.expert_count"), "k": _number(meta, f"{a}.expert_used_count"),
                 "f_expert": fe, "f_shared": _number(meta, f"{a}.expert_shared_feed_forward_length",
                                                     default=fe * shared),
                 # layer i is routed when i ≥ dense_lead and (i + 1) % moe_step == 0 (llama.cpp's rule)
                 "dense_lead": _number(meta, f"{a}.leading_dense_block_count", default=0),
                 "moe_step": _number(meta, f"{a}.interleave_moe_layer_step", default=1)}
        if not 0 < dims["k"] <= dims["E"] or not dims["f_expert"] or (a == "qwen2moe" and not dims["f_shared"]) \
                or not dims["moe_step"]:
            raise QkvError(f"the GGUF mixture has {dims['E']} experts, {dims['k']} chosen per token, experts "
                           f"{dims['f_expert']} wide (shared {dims['f_shared']}), every {dims['moe_step']} layer "
                           "routed; it needs 0 < chosen ≤ experts, widths and a step above 0; the file is damaged")
    if min(dims["L"], dims["f"], dims["theta"], dims["n_ctx"]) <= 0:
        raise QkvError("the GGUF file has no layers, no FFN width, no context or a zero RoPE base; the file is "
                       "damaged")
    return dims


def ssm_dimensions(meta: dict, a: str) -> dict:
    """A state-space arch's sizes (Mamba: no heads, no FFN, no positions): d, L, eps, n_ctx and the scan's E channels
    (d_inner), N (d_state), conv taps, Δ's rank; the rest as one head of E channels with no RoPE (what the common
    config expects)."""
    dims = {"d": _number(meta, f"{a}.embedding_length"), "L": _number(meta, f"{a}.block_count"),
            "n_ctx": _number(meta, f"{a}.context_length"),
            "eps": _number(meta, f"{a}.attention.layer_norm_rms_epsilon", float),
            "d_inner": _number(meta, f"{a}.ssm.inner_size"), "d_state": _number(meta, f"{a}.ssm.state_size"),
            "d_conv": _number(meta, f"{a}.ssm.conv_kernel"), "dt_rank": _number(meta, f"{a}.ssm.time_step_rank")}
    if min(dims.values()) <= 0:
        raise QkvError(f"the GGUF {a} model has a size of 0 ({', '.join(k for k, v in dims.items() if v <= 0)}); the "
                       "file is damaged")
    E = dims["d_inner"]
    return dims | {"H": 1, "Hkv": 1, "d_head": E, "d_v": E, "f": 0, "theta": 10000.0, "rope_dims": E}


def hybrid_layers(meta: dict, a: str) -> tuple[dict, tuple[str, ...] | None]:
    """A hybrid's layers (Jamba): attention.head_count_kv written one per layer, 0 for a scan layer ("mamba"), the
    K/V heads for an attention one ("attention"). META with head_count_kv the one count of its attention layers, and
    the layers' kinds (None: one count for all, every layer both, Falcon-H1's); counts that differ between attention
    layers, or a list of another length, are refused."""
    L = _number(meta, f"{a}.block_count")
    per_layer = meta.get(f"{a}.attention.head_count_kv")
    if not isinstance(per_layer, list):                              # Falcon-H1: both in every layer
        return meta, None
    if len(per_layer) != L or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in per_layer):
        raise QkvError(f"the GGUF value {a}.attention.head_count_kv holds {len(per_layer)} counts for {L} layers (or "
                       "counts that are no whole numbers); the file is damaged")
    counts = sorted({h for h in per_layer if h})
    if len(counts) > 1:
        raise QkvError(f"the GGUF {a} model's attention layers have {counts} K/V heads; qkv runs hybrids whose "
                       "attention layers are all alike")
    kinds = tuple("attention" if h else "mamba" for h in per_layer)
    return meta | {f"{a}.attention.head_count_kv": counts[0] if counts else 1}, kinds


def mixtral_view(meta: dict) -> dict:
    """llama.cpp writes Mixtral as arch 'llama' with llama.expert_count: the same metadata under
    'mixtral.*', read by gguf_archs' mixtral table (any other file unchanged)."""
    if meta.get("general.architecture") != "llama" or meta.get("llama.expert_count", 0) in (0, None):
        return meta
    return {("mixtral." + k[len("llama."):] if k.startswith("llama.") else k): v for k, v in meta.items()} \
        | {"general.architecture": "mixtral"}


def hf_config(meta: dict) -> tuple[dict, dict]:
    """GGUF metadata → (the config.json of the same model in Hugging Face layout, the sizes read);
    vocab_size, the special token ids and what the tensors say (tied, biases) are added by `convert`."""
    if meta.get("general.type", "model") != "model":
        raise QkvError(f"the GGUF file is a {meta['general.type']!r:.30} (e.g. a LoRA adapter), not a model; "
                       "give the model's own .gguf file")
    if meta.get("split.count", 1) != 1:
        raise QkvError(f"the GGUF file is one part of a model split in {meta['split.count']!r:.10}; merge the parts "
                       "first (llama.cpp's `llama-gguf-split --merge`)")
    a = meta.get("general.architecture")
    arch = gguf_archs.arch_of(a)
    if meta.get(f"{a}.expert_count", 0) not in (0, None) and not arch.experts:
        raise QkvError(f"the GGUF {a} model is a mixture of experts ({a}.expert_count = {meta[f'{a}.expert_count']}), "
                       f"which llama.cpp's {a} is not; the file is damaged")
    gguf_archs.check_keys(meta, a)
    dims = dimensions(meta, a)
    cfg = {"model_type": arch.family, "architectures": [arch.architecture]}
    cfg |= gguf_archs.config(meta, a, dims)
    cfg["torch_dtype"] = "float32"
    scaling = None if dims.get("rope_read") else _rope_scaling(meta, a)     # (gpt-oss's YaRN: its module reads it)
    if scaling:
        if arch.family == "gpt2":
            raise QkvError("the GGUF gpt2 model declares RoPE scaling, but GPT-2 has no RoPE; the file is damaged")
        cfg["rope_scaling"] = scaling
        cfg["rope_parameters"] = cfg["rope_parameters"] | scaling
    return cfg, dims


def _used_tensors(reader, a: str, cfg: dict, dims: dict) -> list[tuple[str, object, tuple[int, ...]]]:
    """(GGUF name, GGUF tensor, shape) of every tensor the engine reads, each checked: known name,
    readable type, the shape the metadata implies; none missing. All before any work. Sets the
    config's tie_word_embeddings and attention_bias from which tensors the file has."""
    if dims["L"] * 4 > len(reader.tensors):
        raise QkvError(f"the GGUF file declares {dims['L']} layers but holds only "
                       f"{len(reader.tensors)} tensors; it is incomplete or damaged")
    names = {t.name for t in reader.tensors}
    if ROPE_FREQS in names:
        rope_freqs(next(t for t in reader.tensors if t.name == ROPE_FREQS), a, cfg, dims)
    chosen = gguf_archs.choices(a, names)
    cfg["tie_word_embeddings"] = chosen["tied"]
    if gguf_archs.ARCHS[a].by_tensors is not None:
        gguf_archs.ARCHS[a].by_tensors(cfg, dims, chosen)
    if cfg["model_type"] in ("llama", "qwen3", "gpt_neox", "gemma", "olmo2", "glm", "glm4"):
        cfg["attention_bias"] = chosen["attn_bias"]                  # Hugging Face: one switch for them all
    elif cfg["model_type"] == "starcoder2":
        cfg["use_bias"] = chosen["attn_bias"]                        # all six linear maps
    elif cfg["model_type"] == "falcon":                              # the fused rows' layout follows the norms
        dims["two_norms"] = chosen["two_norms"]
        new = chosen["two_norms"] or dims["Hkv"] > 1
        cfg |= {"new_decoder_architecture": new, "multi_query": dims["Hkv"] == 1,
                "num_ln_in_parallel_attn": 2 if chosen["two_norms"] else 1}
    elif cfg["model_type"] == "stablelm":
        cfg |= {"use_qkv_bias": chosen["attn_bias"], "qk_layernorm": chosen["qk_norm"]}
    elif cfg["model_type"] == "cohere":
        cfg["use_qk_norm"] = chosen["qk_norm"]
    shapes = gguf_archs.expected(a, dims, chosen)
    left = unread([t.name[:80] for t in reader.tensors if t.name not in shapes and t.name != ROPE_FREQS], set(),
                  IGNORED)
    if left:
        raise unread_error(left, "the GGUF file", f"{a} model of this config",
                           "qkv cannot run it (another variant of the architecture, or layers the metadata "
                           f"does not declare); use a plain {a} file")
    used = []
    for t in reader.tensors:
        if t.name not in shapes:
            continue                                     # IGNORED, or rope_freqs (read into the config)
        kind = t.tensor_type.name
        if kind not in QUANT_TYPES:
            raise QkvError(f"tensor {t.name} has GGUF type {kind}, which qkv does not read; use a file "
                           f"quantised as one of {', '.join(QUANT_TYPES)}")
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))   # ggml lists dims innermost first
        if shape != shapes[t.name]:
            raise QkvError(f"tensor {t.name} has shape {shape}, but the metadata implies {shapes[t.name]}; "
                           "the file is damaged")
        used.append((t.name, t, shape))
    missing = sorted(set(shapes) - {name for name, _, _ in used})
    if missing:
        raise QkvError(f"the GGUF file lacks the tensor {missing[0]} ({len(missing)} missing); it is "
                       "incomplete or damaged")
    return used


ROPE_FREQS = "rope_freqs.weight"


def rope_freqs(t, a: str, cfg: dict, dims: dict) -> None:
    """llama.cpp's rope_freqs (its converter's form of a llama3 RoPE: pair i turns at ω_i / s_i, s the tensor, the
    same at every length) into CFG's rope_parameters, for an arch whose table reads it ("rope_freqs" in its top): a
    longrope table, short and long factors both s and attention factor 1, which transformers and qkv compute as
    ω_i / s_i at every length. All ones: plain RoPE. Refused in one line: an arch whose table lacks it, a
    shape other than (rotated dims / 2,), factors that are no positive finite numbers, a RoPE scaling beside it."""
    if "rope_freqs" not in gguf_archs.ARCHS[a].top:
        readers = ", ".join(sorted(n for n, arch in gguf_archs.ARCHS.items() if "rope_freqs" in arch.top))
        raise QkvError(f"the GGUF {a} model scales RoPE per frequency (rope_freqs, as Llama 3.x does), which qkv "
                       f"reads for {readers} files only; use a {a} file without rope_freqs")
    shape = tuple(int(x) for x in reversed(t.shape.tolist()))
    if shape != (dims["rope_dims"] // 2,):
        raise QkvError(f"tensor {ROPE_FREQS} has shape {shape}, but the metadata implies ({dims['rope_dims'] // 2},) "
                       "(one factor per pair of turned dimensions); the file is damaged")
    if t.tensor_type.name not in QUANT_TYPES:
        raise QkvError(f"tensor {ROPE_FREQS} has GGUF type {t.tensor_type.name}, which qkv does not read; the file "
                       "is damaged")
    factors = _dequantised(t, shape)
    if not (factors > 0).all():
        raise QkvError(f"the GGUF file's {ROPE_FREQS} holds factors that are not positive; the file is damaged")
    if "rope_scaling" in cfg:
        raise QkvError(f"the GGUF {a} model scales RoPE by rope_freqs and by {a}.rope.scaling ({cfg['rope_scaling']}"
                       ") at once; qkv runs one of them: use a file with one")
    if (factors == 1).all():
        return
    table = [float(v) for v in factors]
    cfg["rope_parameters"] = {"rope_type": "longrope", "rope_theta": dims["theta"], "short_factor": table,
                              "long_factor": table, "original_max_position_embeddings": dims["n_ctx"],
                              "factor": 1.0, "attention_factor": 1.0}


# ── tensors → model.safetensors ─────────────────────────────────────────────────

def _dequantised(t, shape: tuple[int, ...]) -> np.ndarray:
    """One tensor as float32 in its Hugging Face (out, in) shape, as the file stores it."""
    import gguf

    try:
        with np.errstate(all="ignore"):                 # damaged scales (inf × 0) are said in one line below
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)
    except (ValueError, NotImplementedError) as e:
        raise QkvError(f"tensor {t.name} cannot be dequantised ({e}); the file is damaged") from None
    if not np.isfinite(w).all():
        raise QkvError(f"tensor {t.name} holds NaN or infinite values; the file is damaged")
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


def write_safetensors(f, shapes: list[tuple[str, tuple[int, ...]]], arrays) -> None:
    """A float32 safetensors file into F (open for binary writing), tensor by tensor: the header comes
    from the shapes, then each array of `arrays` (in the same order) is written and dropped."""
    header, offset = {}, 0
    for name, shape in shapes:
        size = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)                                      # keep the data 8-byte aligned
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for (name, shape), w in zip(shapes, arrays):
        assert w.shape == shape, (name, w.shape, shape)
        f.write(np.ascontiguousarray(w, dtype="<f4").data)            # no copy of the bytes


# ── the file → its Hugging Face directory ───────────────────────────────────────

@dataclass
class Parsed:
    """What every use of a GGUF file reads first, all checked: its reader, architecture, config.json,
    sizes, and each tensor the engine reads with its plan (gguf_archs.hf_tensors: the Hugging Face
    tensors it becomes, and how)."""

    reader: object
    arch: str
    cfg: dict
    dims: dict
    plans: list                       # [(GGUF tensor, (out, in) shape, [(hf name, hf shape, fn)])]
    tokenizer: tuple[str, dict] | None    # (tokenizer.json, tokenizer_config) when asked for


def parse(path: Path, vocab_size: int | None = None) -> Parsed:
    """Read GGUF file PATH: its tokenizer too (which sets the vocabulary's size) unless VOCAB_SIZE is given."""
    reader = open_reader(path)
    meta = mixtral_view(metadata(reader))
    cfg, dims = hf_config(meta)
    a = meta["general.architecture"]
    tokenizer = None
    if vocab_size is None:
        tokenizer_json, tokenizer_config, vocab_size = gguf_tokenizer.build(reader, meta)
        tokenizer = (tokenizer_json, tokenizer_config)
        declared = meta.get(f"{a}.vocab_size", vocab_size)
        if declared != vocab_size:
            raise QkvError(f"the GGUF file declares a vocabulary of {declared!r:.20} but its tokenizer has "
                           f"{vocab_size} tokens; the file is damaged")
    cfg["vocab_size"] = dims["V"] = vocab_size
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        value = meta.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(value, int) and 0 <= value < vocab_size:
            cfg[key] = value
        elif value is not None and name != "padding":     # a writer that never meets its end, or a wrong start
            raise QkvError(f"the GGUF file's tokenizer.ggml.{name}_token_id {value!r:.20} is not a token id of its "
                           f"{vocab_size}-token vocabulary; the file is damaged: use an intact copy")
    used = _used_tensors(reader, a, cfg, dims)
    # Each tensor's float32 values by name, for a plan that joins two tensors (DeepSeek's kv_b, gpt-oss's gate_up).
    dims["values"] = {name: (lambda t=t, shape=shape: _dequantised(t, shape)) for name, t, shape in used}
    # Each GGUF tensor becomes one Hugging Face tensor (or, fused Q/K/V split, several; or, joined with another,
    # none), the converter's changes undone (gguf_archs.hf_tensors).
    plans = [(t, shape, gguf_archs.hf_tensors(a, name, shape, dims)) for name, t, shape in used]
    return Parsed(reader, a, cfg, dims, plans, tokenizer)


def describe(path: Path, out: Path) -> None:
    """Write the Hugging Face directory of GGUF file PATH, without its tensors, into the (existing, empty)
    directory OUT: config.json, the tokenizer's files, and qkv_source.json (which file it describes)."""
    from .families import config_of

    p = parse(path)
    try:                                                  # checked before anything is written (and cached)
        config_of(json.loads(json.dumps(p.cfg)), f"{path.name} (its metadata read as config.json)")
    except QkvError as e:
        message = str(e).replace("restore the checkpoint's config.json", "the file's metadata is broken: "
                                 "use an intact copy").replace("fix the model's config", "the file's metadata is "
                                                                 "broken: use an intact copy")
        raise QkvError(message if path.name in message else f"{path.name}: {message}") from None
    tokenizer_json, tokenizer_config = p.tokenizer
    (out / "config.json").write_text(json.dumps(p.cfg, indent=2))
    (out / "tokenizer.json").write_text(tokenizer_json)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False))
    name = metadata(p.reader).get("general.name")
    (out / "qkv_source.json").write_text(json.dumps({"gguf": str(Path(path).resolve()), "converter":
                                                     CONVERTER_VERSION, "name": name}, indent=2))


def source_of(directory: Path) -> Path | None:
    """The GGUF file a described directory stands for (its qkv_source.json); None for any other directory."""
    if not (directory / "qkv_source.json").is_file():
        return None
    try:
        found = _source_json(directory).get("gguf")
    except QkvError:
        return None
    return Path(found) if isinstance(found, str) and found else None


def _source_json(directory: Path) -> dict:
    """DIRECTORY's qkv_source.json, read bounded and checked (runtime.io_json), or one QkvError."""
    return read_json(directory / "qkv_source.json", what=f"{directory / 'qkv_source.json'}", limit=SOURCE_LIMIT,
                     fix="remove that folder of qkv's GGUF cache: it is remade from the .gguf file")


def _vocab_size(directory: Path) -> int:
    """The vocab_size of a described directory's config.json (which `describe` wrote)."""
    config = read_json(directory / "config.json", fix="remove that folder of qkv's GGUF cache: it is remade from "
                       "the .gguf file")
    return Fields(config, str(directory / "config.json"), "remove that folder of qkv's GGUF cache: it is remade "
                  "from the .gguf file").integer("vocab_size", 1, MAX_VOCAB)


def write_tensors(path: Path, out: Path) -> None:
    """OUT/model.safetensors: every tensor of GGUF file PATH dequantised to float32, in its Hugging Face
    name and shape (written atomically: runtime.io.write_atomic)."""
    p = parse(path, vocab_size=_vocab_size(out))
    shapes = [(hf, hf_shape) for _, _, plan in p.plans for hf, hf_shape, _ in plan]

    def arrays_of(item) -> list[np.ndarray]:
        t, shape, plan = item
        w = _dequantised(t, shape)
        return [fn(w) for _, _, fn in plan]

    arrays = (w for ws in in_order(arrays_of, p.plans) for w in ws)
    write_atomic(out / "model.safetensors", lambda f: write_safetensors(f, shapes, arrays))


def convert(path: Path, out: Path) -> None:
    """Write the whole Hugging Face directory of GGUF file `path`, tensors too, into the (existing, empty) directory `out`."""
    describe(path, out)
    write_tensors(path, out)

