"""A family's tables, as data: its Hugging Face tensors (one `Row` each) and its llama.cpp architectures
(one `Arch` each), which a family module declares and this module reads both ways.

    Row(ours, hf, shape, how, when)
      ours   where the tensor lives in Weights: "tok_embed", "final_norm.weight", or, in every block i,
             "block.attn.W_Q"; a fused tensor names its parts: ("block.attn.W_Q", "block.attn.W_K", …)
      hf     its name in the checkpoint, relative to the base model ({i}: the layer)
      shape  our shape, in the config's sizes: d (d_model), q (H·d_k), kv (Hkv·d_k), f (d_ff), V, P (positions),
             T (token types), dk (d_k), H, Hkv (heads), e (d_embed), E (embed_dim), o (the positions'
             offset), R (relative position buckets), p (a tower's projection); a sum is written a+b; a fused
             row gives the whole, `parts` each part
      how    SAME (stored as we multiply), LINEAR (torch's Linear, stored (out, in): ours is its transpose,
             a view), CONV1D (GPT-2's Conv1D, (in, out)), BY_GROUP (fused Q/K/V rows by K/V group), Head
             (W_vocab, or the tied embeddings), Gamma (a norm's γ, Gemma's less one), or a family's own How
      when   the configs that hold it (None: all); `layers`: the blocks that do; `also`: a tensor whose
             presence brings it (a task head's); `optional`: read only when the checkpoint has it

`both_ways(ROWS, prefix)` gives a family module its `weights(store, cfg, dtype)` (read_table: what loading and
qkv.init do) and `tensors(weights, cfg)` (write_table: every tensor back under its full name, what saving
does), both from the same rows, so a name or a transpose cannot differ between the two. The helpers below
(`linear`, `layer_norm`, `attention`, `gated_ffn`, `fused_qkv`, `lm_head`) write the rows most families share.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Callable

import numpy as np

from ..core.config import ModelConfig
from ..core.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, PoolWeights, Weights, XIELUWeights
from ..runtime.errors import QkvError
from .common import c_arrays, columns, conv1d


# ── how a tensor is stored ───────────────────────────────────────────────────────

class How:
    """Stored as we multiply: read and written as it is. Subclasses say another layout."""

    def read(self, store, name: str, shape: tuple[int, ...], dtype, cfg: ModelConfig):
        return store.get(name, shape, dtype)

    def write(self, value, cfg: ModelConfig):
        return value

    def split(self, value, bounds: list[tuple[int, int]], cfg: ModelConfig) -> list:
        """A fused tensor's parts, each (start, stop) of our last axis: views."""
        return [value[..., start:stop] for start, stop in bounds]

    def write_all(self, name: str, value, cfg: ModelConfig) -> dict:
        """{checkpoint name: array} of VALUE, the tensor NAME (one, unless the file splits it: StableLM's
        per-head norms)."""
        return {name: self.write(value, cfg)}


class Linear(How):
    """torch's Linear: the file holds W (out, in), ours is (in, out): its transpose, a view, no copy."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name, shape[::-1], dtype).T

    def write(self, value, cfg):
        return value.T


class Conv1D(How):
    """GPT-2's Conv1D: the file holds W (in, out), as we multiply (common.conv1d: 16-bit rows rewritten)."""

    def read(self, store, name, shape, dtype, cfg):
        return conv1d(store, name, shape[0], shape[1], dtype)

    def split(self, value, bounds, cfg):
        return [columns(value, start, stop) for start, stop in bounds]       # a stored matrix stays stored


class Head(Linear):
    """W_vocab (d, V) from lm_head (V, d), or tok_embedᵀ (tied; then nothing is written). Which, by two rules:
    PREFER_STORED, a tied checkpoint that holds a head anyway has it read (Llama; else it is never read);
    ABSENT_TIES, an untied checkpoint without a head is tied (GPT-2; else its head is missing)."""

    def __init__(self, prefer_stored: bool = True, absent_ties: bool = False):
        self.prefer_stored, self.absent_ties = prefer_stored, absent_ties

    def tied(self, store, name: str, cfg: ModelConfig) -> bool:
        """Whether W_vocab is tok_embedᵀ rather than the stored head NAME."""
        if cfg.tied_embeddings:
            return not (self.prefer_stored and store.has(name))
        return self.absent_ties and not store.has(name)

    def write(self, value, cfg):
        return None if cfg.tied_embeddings else value.T


class Gamma(How):
    """A norm's γ, held as NormWeights: stored as it is, or (when `plus_one(cfg)`: Gemma's RMSNorm, x·(1 + w))
    less one. Its row's `ours` names the norm itself ("block.attn_norm"): it has no bias."""

    def __init__(self, plus_one: Callable[[ModelConfig], bool] = lambda cfg: False):
        self.plus_one = plus_one

    def read(self, store, name, shape, dtype, cfg):
        g = store.get(name, shape, dtype)
        return NormWeights(g + 1, stored_offset=1.0) if self.plus_one(cfg) else NormWeights(g)

    def write(self, value, cfg):
        return value.weight - value.stored_offset if value.stored_offset else value.weight


class ByGroup(How):
    """A fused Q/K/V Linear whose rows go by K/V group: each group's query heads, then its k, then its v
    (Falcon; with a group a head, q, k, v of each head: GPT-NeoX, BLOOM). Ours is [W_Q | W_K | W_V]; each part
    is copied out (a view cannot regroup rows)."""

    def read(self, store, name, shape, dtype, cfg):
        return store.get(name, shape[::-1], dtype)                         # (q + 2·kv, d) or (q + 2·kv,)

    def split(self, value, bounds, cfg):
        Hkv, G, dk = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.d_head
        rest = value.shape[1:]
        grouped = value.reshape(Hkv, G + 2, dk, *rest)                     # (Hkv, G + 2, d_k, …)
        parts = [grouped[:, :G], grouped[:, G], grouped[:, G + 1]]
        return [np.ascontiguousarray(p.reshape(-1, *rest).T) for p in parts]   # (d, H·d_k), (d, Hkv·d_k) ×2

    def write(self, value, cfg):                                           # (d, q + 2·kv) or (q + 2·kv,)
        Hkv, G, dk = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.d_head
        rows = value.T                                                     # [Q; K; V]
        rest = rows.shape[1:]
        q, k, v = np.split(rows, [Hkv * G * dk, Hkv * (G + 1) * dk])
        parts = [q.reshape(Hkv, G, dk, *rest), k.reshape(Hkv, 1, dk, *rest), v.reshape(Hkv, 1, dk, *rest)]
        return np.concatenate(parts, axis=1).reshape(rows.shape)


SAME, LINEAR, CONV1D, BY_GROUP = How(), Linear(), Conv1D(), ByGroup()


# ── the rows ─────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Row:
    """One tensor of the checkpoint: where it goes among our weights, its name, our shape, how it is stored."""
    ours: str | tuple[str, ...]
    hf: str
    shape: str
    how: How = SAME
    when: Callable[[ModelConfig], bool] | None = None
    parts: str | None = None          # a fused row: each part's size along our last axis, e.g. "q kv kv"
    root: bool = False                # saved outside the base model (lm_head): no prefix
    also: str | tuple[str, ...] | None = None   # read, whatever `when` says, when the checkpoint holds one of
                                      # these tensors (a task head's); written whenever the weights hold it
    optional: bool = False            # read only when the checkpoint holds it (a bias some checkpoints have)
    layers: Callable[[ModelConfig, int], bool] | None = None   # the blocks that hold it (None: every one)

    def holds(self, cfg: ModelConfig, store=None, i: int | None = None) -> bool:
        """Whether CFG's checkpoint holds this row (block I's): reading, as STORE answers `also` and `optional`;
        writing (no STORE), a row with `also` or `optional` is written whenever the weights hold it."""
        if i is not None and self.layers is not None and not self.layers(cfg, i):
            return False
        if store is None:
            return self.when is None or bool(self.when(cfg)) or self.also is not None or self.optional
        also = (self.also,) if isinstance(self.also, str) else self.also or ()
        if not (self.when is None or self.when(cfg) or any(store.has(a.format(i=i)) for a in also)):
            return False
        return not self.optional or store.has(self.hf.format(i=i))


def sizes(cfg: ModelConfig) -> dict[str, int]:
    """The symbols a row's shape is written in, for CFG."""
    return {"d": cfg.d_model, "q": cfg.n_heads * cfg.d_head, "kv": cfg.n_kv_heads * cfg.d_head, "f": cfg.d_ff,
            "V": cfg.vocab_size, "P": cfg.max_positions, "T": cfg.type_vocab_size or 0, "dk": cfg.d_head,
            "H": cfg.n_heads, "Hkv": cfg.n_kv_heads, "e": cfg.d_embed or cfg.d_model,
            "E": cfg.embed_dim or cfg.d_model, "o": cfg.position_offset, "R": cfg.relative_buckets or 0,
            "p": cfg.d_proj or 0}


def _size(term: str, known: dict[str, int]) -> int:
    """A size written as symbols and whole numbers joined by + (e.g. "q+kv+kv", "3")."""
    return sum(int(t) if t.isdigit() else known[t] for t in term.split("+"))


def shape_of(spec: str, known: dict[str, int]) -> tuple[int, ...]:
    """ "d q" → (d_model, H·d_k)."""
    return tuple(_size(t, known) for t in spec.split())


_CLASSES = {"attn": AttentionWeights, "cross_attn": AttentionWeights, "ffn": FFNWeights, "shared": FFNWeights,
            "xielu": XIELUWeights, "pool": PoolWeights, "probe_attn": AttentionWeights, "probe_ffn": FFNWeights}


def _build(cls, parts: dict):
    """A weights dataclass from {field: value or nested dict}; fields not given are None (or their default)."""
    kwargs = {}
    for f in fields(cls):
        if f.name in parts:
            v = parts[f.name]
            if isinstance(v, dict):
                v = _build(_CLASSES.get(f.name, NormWeights if f.name.endswith("norm") else None), v)
            kwargs[f.name] = v
        elif f.default is MISSING and f.default_factory is MISSING:
            kwargs[f.name] = None
    return cls(**kwargs)


def _place(tree: dict, path: str, value) -> None:
    """VALUE at PATH ("attn.W_Q") of the nested dicts TREE."""
    *outer, last = path.split(".")
    for key in outer:
        tree = tree.setdefault(key, {})
    tree[last] = value


def _get(obj, path: str):
    """The value at PATH ("attn.q_norm") of weights OBJ; None where a step is absent."""
    for key in path.split("."):
        obj = getattr(obj, key) if obj is not None else None
    return obj


def _each(rows, cfg: ModelConfig, store=None, n_layers: int | None = None):
    """(row, block index or None, checkpoint name) of every tensor CFG's checkpoint holds (reading: STORE's), in
    row order (the rows of a block repeated for each block; the head last, after the embeddings it may be)."""
    top = [r for r in rows if not _in_block(r)]
    block = [r for r in rows if _in_block(r)]
    for r in top:
        if not isinstance(r.how, Head) and r.holds(cfg, store):
            yield r, None, r.hf
    for i in range(cfg.n_layers if n_layers is None else n_layers):
        for r in block:
            if r.holds(cfg, store, i):
                yield r, i, r.hf.format(i=i)
    for r in top:
        if isinstance(r.how, Head) and r.holds(cfg, store):
            yield r, None, r.hf


def _in_block(row: Row) -> bool:
    first = row.ours[0] if isinstance(row.ours, tuple) else row.ours
    return first.startswith("block.")


def read_table(rows, store, cfg: ModelConfig, dtype, n_layers: int | None = None, **extra) -> Weights:
    """The Weights of CFG from STORE by ROWS: N_LAYERS blocks (None: cfg.n_layers; an encoder–decoder's decoder:
    its own), and EXTRA fields of Weights the family read itself (a table the stacks share)."""
    known = sizes(cfg)
    top: dict = dict(extra)
    blocks: list[dict] = [{} for _ in range(cfg.n_layers if n_layers is None else n_layers)]
    for r, i, name in _each(rows, cfg, store, len(blocks)):
        tree = top if i is None else blocks[i]
        shape = shape_of(r.shape, known)
        if isinstance(r.how, Head) and r.how.tied(store, name, cfg):
            value = top["tok_embed"].T                                # tied: W_vocab = Eᵀ
        else:
            value = r.how.read(store, name, shape, dtype, cfg)
        if r.parts is None:
            _place(tree, r.ours.removeprefix("block."), value)
            continue
        bounds, start = [], 0
        for part in r.parts.split():                                 # a fused tensor: each part of our last axis
            bounds.append((start, start + _size(part, known)))
            start += _size(part, known)
        for path, piece in zip(r.ours, r.how.split(value, bounds, cfg)):
            _place(tree, path.removeprefix("block."), piece)
    top["blocks"] = [_build(BlockWeights, b) for b in blocks]
    return _build(Weights, top)


def write_table(rows, weights: Weights, cfg: ModelConfig, prefix: str = "") -> dict[str, np.ndarray]:
    """Every tensor of WEIGHTS by ROWS, under its full name (PREFIX + name; a root row without it), as the
    file stores it: new C-ordered arrays; a tensor the weights do not hold (None) is left out."""
    t: dict = {}
    for r, i, name in _each(rows, cfg, n_layers=len(weights.blocks)):
        holder = weights if i is None else weights.blocks[i]
        paths = r.ours if isinstance(r.ours, tuple) else (r.ours,)
        values = [_get(holder, p.removeprefix("block.")) for p in paths]
        if any(v is None for v in values):
            continue
        value = values[0] if r.parts is None else np.concatenate(values, axis=values[0].ndim - 1)
        t |= {(n if r.root else prefix + n): v for n, v in r.how.write_all(name, value, cfg).items()}
    return c_arrays(t)


def both_ways(rows, prefix: str | Callable[[Weights], str] = ""):
    """A family module's `weights(store, cfg, dtype)` and `tensors(weights, cfg)`, both by ROWS (PREFIX: the base
    model's in the saved names, e.g. "model.", or of the weights: a task head's checkpoint has one, the bare
    encoder's none)."""
    def weights(store, cfg: ModelConfig, dtype) -> Weights:
        """The family's Weights from STORE (tensors by checkpoint name), by its table."""
        return read_table(rows, store, cfg, dtype)

    def tensors(weights: Weights, cfg: ModelConfig) -> dict[str, np.ndarray]:
        """Every tensor under transformers' full names, as its file stores it, by the family's table; new arrays."""
        return write_table(rows, weights, cfg, prefix(weights) if callable(prefix) else prefix)

    return weights, tensors


# ── rows many families share ─────────────────────────────────────────────────────

Knob = Callable[[ModelConfig], bool] | bool


def _when(knob: Knob, also=None):
    """A row's `when` of a knob (True: always) and, if given, of the row it belongs to."""
    if knob is True:
        return also
    return knob if also is None else (lambda cfg: knob(cfg) and also(cfg))


def linear(W: str, hf: str, shape: str, b: str | None = None, bias: Knob = True, when=None,
           how: How = LINEAR) -> list[Row]:
    """A torch Linear at HF (.weight, and .bias when B and BIAS hold) as our W (and b, our last axis)."""
    rows = [Row(W, f"{hf}.weight", shape, how, when)]
    if b is not None and bias is not False:
        rows.append(Row(b, f"{hf}.bias", shape.split()[-1], when=_when(bias, when)))
    return rows


def layer_norm(ours: str, hf: str, size: str = "d", bias: Knob = True, when=None) -> list[Row]:
    """A LayerNorm at HF: γ (.weight) and, when BIAS holds, β (.bias), as NormWeights OURS."""
    rows = [Row(f"{ours}.weight", f"{hf}.weight", size, when=when)]
    if bias is not False:
        rows.append(Row(f"{ours}.bias", f"{hf}.bias", size, when=_when(bias, when)))
    return rows


def attention(hf: str, qkv_bias: Knob = False, out_bias: Knob = False, out: str = "o_proj",
              ours: str = "block.attn") -> list[Row]:
    """The four torch Linears of an attention under HF — q_proj, k_proj, v_proj and OUT — as W_Q (d, q),
    W_K, W_V (d, kv), W_O (q, d), with Q/K/V's biases when QKV_BIAS and OUT's when OUT_BIAS: what most
    decoders hold."""
    return [*linear(f"{ours}.W_Q", f"{hf}.q_proj", "d q", f"{ours}.b_Q", qkv_bias),
            *linear(f"{ours}.W_K", f"{hf}.k_proj", "d kv", f"{ours}.b_K", qkv_bias),
            *linear(f"{ours}.W_V", f"{hf}.v_proj", "d kv", f"{ours}.b_V", qkv_bias),
            *linear(f"{ours}.W_O", f"{hf}.{out}", "q d", f"{ours}.b_O", out_bias)]


def gated_ffn(hf: str, gate: str = "gate_proj", up: str = "up_proj", down: str = "down_proj",
              ours: str = "block.ffn", **kw) -> list[Row]:
    """A gated FFN's three torch Linears under HF, no biases: W_gate, W_in (d, f) and W_out (f, d) (KW: the
    rows' other fields)."""
    return [Row(f"{ours}.W_gate", f"{hf}.{gate}.weight", "d f", LINEAR, **kw),
            Row(f"{ours}.W_in", f"{hf}.{up}.weight", "d f", LINEAR, **kw),
            Row(f"{ours}.W_out", f"{hf}.{down}.weight", "f d", LINEAR, **kw)]


def fused_qkv(hf: str, how: How = LINEAR, bias: Knob = False) -> list[Row]:
    """One Linear at HF holding W_Q, W_K, W_V ((d, q + 2·kv) ours, [Q; K; V] rows unless HOW says another order),
    and its bias when BIAS holds."""
    rows = [Row(("block.attn.W_Q", "block.attn.W_K", "block.attn.W_V"), f"{hf}.weight", "d q+kv+kv", how,
                parts="q kv kv")]
    if bias is not False:
        rows.append(Row(("block.attn.b_Q", "block.attn.b_K", "block.attn.b_V"), f"{hf}.bias", "q+kv+kv",
                        how if isinstance(how, ByGroup) else SAME, _when(bias), parts="q kv kv"))
    return rows


def lm_head(hf: str = "lm_head.weight", shape: str = "d V", **rules) -> Row:
    """W_vocab from the head at HF, beside the base model (RULES: Head's)."""
    return Row("W_vocab", hf, shape, Head(**rules), root=True)


def qk_norm(cfg: ModelConfig) -> bool:
    return bool(cfg.qk_norm)


def qkv_bias(cfg: ModelConfig) -> bool:
    return cfg.qkv_bias


def out_bias(cfg: ModelConfig) -> bool:
    return cfg.out_bias


def ffn_bias(cfg: ModelConfig) -> bool:
    return cfg.ffn_bias


def tied(cfg: ModelConfig) -> bool:
    return cfg.tied_embeddings


def routed_layer(cfg: ModelConfig, i: int) -> bool:        # layer i's FFN: experts behind a router
    return cfg.moe_layer(i)


def dense_layer(cfg: ModelConfig, i: int) -> bool:         # layer i's FFN: one dense FFN (an MoE model's dense layers)
    return not cfg.moe_layer(i)


# ── llama.cpp's architectures ────────────────────────────────────────────────────

@dataclass(frozen=True)
class Arch:
    """One llama.cpp architecture: its family, tensor table and the converter's changes (gguf_archs reads it)."""
    family: str                         # config.json model_type
    architecture: str                   # config.json architectures[0]
    layer: dict[str, str]               # GGUF part of blk.{i} → Hugging Face name under layers.{i} / h.{i}
    top: dict[str, str]                 # token_embd, output_norm, output (, position_embd) → names
    norm: str = "rms"                   # "rms" (eps: layer_norm_rms_epsilon) or "layer" (layer_norm_epsilon)
    biases: str = "none"                # "none", "all" (every linear), "qkv" (q/k/v always),
                                        # "optional" (attention's, all or none: which, the file says)
    norm_biases: bool = False           # LayerNorms with biases
    permuted: bool = False              # llama: Q, K rows interleaved per head
    plus_one: bool = False              # gemma: RMSNorm weights stored as 1 + w
    transposed: tuple[str, ...] = ()    # gpt2: parts whose Hugging Face weight is (in, out)
    partial_rope: bool = False          # rope.dimension_count may be less than the head
    layers: str = "layers"              # Hugging Face's name of the block list
    keys: tuple[str, ...] = ()          # <a>.* metadata keys of this arch beyond the common ones
    experts: dict[str, str] | None = None   # MoE: GGUF part → Hugging Face name with {e}, the expert
    activation: str = "silu"            # config.json hidden_act: the family's default (the file does not say)
    eps_key: str | None = None          # config.json's name of the norms' ε (None: rms_norm_eps / layer_norm_eps)
    config: Callable[[dict, str, dict, dict], dict] | None = None
    # (metadata, arch, sizes, the config.json gguf_archs built) → the family's config.json: its own keys
    by_tensors: Callable[[dict, dict, dict], None] | None = None
    # (config.json, sizes, gguf_archs.choices): what the file says only by the tensors it holds (Jamba's routed
    # layers), written into the config and the sizes
    plan: Callable[[str, str, str, tuple, dict], list | None] | None = None
    # (GGUF part, GGUF name, Hugging Face prefix of its layer, shape, sizes) → the Hugging Face tensors a layer's
    # tensor becomes, as gguf_archs.hf_tensors' plans (None: the common plan); what only this family's converter does
    also: tuple[str, ...] = ()          # other model_types its `config` may make of a file (olmo2: olmo3, with a
                                        # window): the README's table of families lists the arch in their rows too


# The GGUF tensor names of a Llama-style block, which many architectures share (each family module takes
# what its own differs in).
LLAMA_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}
LLAMA_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


def gguf_parallel(meta: dict, a: str, dims: dict, hf: dict) -> dict:
    """HF with use_parallel_residual as the GGUF file says (GPT-NeoX, StableLM; true when absent)."""
    parallel = meta.get(f"{a}.use_parallel_residual", True)
    if not isinstance(parallel, bool):
        raise QkvError(f"the GGUF value {a}.use_parallel_residual = {parallel!r:.20} is not true or false; the "
                       "file is damaged")
    dims["parallel"] = hf["use_parallel_residual"] = parallel
    return hf


def gguf_positive(meta: dict, a: str, key: str, default=None) -> float:
    """The GGUF number <a>.KEY (DEFAULT when absent), which must be a positive number, else one error."""
    value = meta.get(f"{a}.{key}", default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
        raise QkvError(f"the GGUF value {a}.{key} = {value!r:.30} is missing or not a positive number; "
                       "the file is damaged")
    return float(value)


def gguf_rope_kind(meta: dict, a: str) -> tuple[str, object]:
    """llama.cpp's RoPE scaling keys as (kind, factor): rope.scaling.type ("linear" when the file gives only a factor,
    "none" when neither; a linear factor of 1 is "none") and rope.scaling.factor (or the older rope.scale_linear),
    unchecked: each reader says which kinds it runs and checks the factor."""
    kind = meta.get(f"{a}.rope.scaling.type")
    factor = meta.get(f"{a}.rope.scaling.factor", meta.get(f"{a}.rope.scale_linear"))
    kind = kind if kind is not None else ("linear" if factor is not None else "none")
    return ("none" if kind == "linear" and factor in (None, 1, 1.0) else kind), factor


def gguf_sliding_layers(meta: dict, a: str, L: int, period: int) -> list[bool]:
    """Whether each of the L layers slides, as llama.cpp's set_swa_pattern reads <a>.attention.sliding_window_pattern:
    a bool per layer, or a period p (layer i slides unless i % p = p − 1; 0: every layer); PERIOD without the key."""
    key = f"{a}.attention.sliding_window_pattern"
    pattern = meta.get(key, period)
    if isinstance(pattern, list):
        if len(pattern) != L or not all(isinstance(p, bool) for p in pattern):
            raise QkvError(f"the GGUF value {key} = {pattern!r:.40} must be one true or false per layer ({L}); the "
                           "file is damaged")
        return pattern
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 0:
        raise QkvError(f"the GGUF value {key} = {pattern!r:.20} is neither a bool per layer nor a whole number; the "
                       "file is damaged")
    return [pattern == 0 or i % pattern != pattern - 1 for i in range(L)]


# ── what a family is, in one line of the README's table ─────────────────────────

# What each kind of model runs, by qkv's command (the README's table of families, `qkv models --families`):
# views, analyses, writing (`qkv <command>`), training (`qkv.train.gradients`) and, for a mixture, the viewer's
# Experts tab. tests/test_family_table.py runs every one on a fixture of each kind, and checks the rest are
# refused in one line.
COMMANDS = {"views": ("show", "heads", "rollout", "experts"), "analyses": ("lens", "patch", "attribute", "dla"),
            "writing": ("next", "generate"), "training": ("gradients",)}
_DECODER = ("show", "heads", "rollout", "lens", "patch", "attribute", "dla", "next", "generate", "gradients")
KINDS: dict[str, tuple[str, ...]] = {
    "decoder": _DECODER,
    "MoE decoder": _DECODER + ("experts",),
    "encoder": ("show", "heads", "rollout", "patch", "attribute"),                 # no LM head: sentence embeddings
    "masked-LM encoder": ("show", "heads", "rollout", "lens", "patch", "attribute", "next", "gradients"),
    "encoder–decoder": ("show", "heads", "rollout", "lens", "patch", "attribute", "next", "generate", "gradients"),
    "image": ("show", "patch", "gradients"),
    "audio": ("show",),
}


@dataclass(frozen=True)
class About:
    """One row of the README's table of families: model_types a family module reads, as people know them, what
    they bring to the engine, and what they run as (a kind of KINDS: the commands that work). A family module
    declares its rows as ABOUT = (About(…), …); families.about gathers them, with the module's GGUF archs."""
    types: tuple[str, ...]              # config.json model_types (of the module's MODEL_TYPES), shown in one row
    models: str                         # the models people know them by
    brings: str                         # what the family brings to the engine: its knobs, in words
    kind: str                           # a key of KINDS
    refuses: tuple[str, ...] = ()       # commands of its kind that its checkpoints refuse (e.g. "dla": OLMo 2)
    when: str = ""                      # which of its checkpoints refuse them ("": every one)

    def __post_init__(self) -> None:
        assert self.kind in KINDS, f"About.kind {self.kind!r} is none of {list(KINDS)}"
        assert set(self.refuses) <= set(KINDS[self.kind]), f"{self.types} refuses {self.refuses}: not its kind's"

    def supports(self) -> tuple[str, ...]:
        """The commands that work on the row's checkpoints: its kind's, but those it refuses."""
        return tuple(c for c in KINDS[self.kind] if c not in self.refuses)
