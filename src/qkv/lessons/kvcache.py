"""`qkv explain kv-cache`: what the KV cache holds and what it saves, token by token (guide: kv-cache, KV 캐시).

    without a cache   each new token runs the whole sequence again: m tokens → Q, K, V of all m
    with the cache    the prompt runs once (prefill) and leaves every layer's K, V behind; each step
                      then feeds the newest token alone, and its query reads the m cached keys

Greedy generation of a few tokens from the text on SmolLM2, both ways, in this process: the
cache's contents (per layer K and V of shape (Hkv, m, d_k), after RoPE) checked against a
full pass, each step's time (best of REPEATS) and FLOPs counted from the weights' shapes,
and the check that both ways choose the same token with logits equal within 1e-4. The cache
of the same model with H K/V heads (MHA) and one (MQA) is computed beside the model's (GQA).
Multi-head latent attention (DeepSeek: cfg.latent) caches a latent per token and layer instead (r_kv numbers and
a shared RoPE key of d_rot, qkv.core.cache): its page says what that latent is, checks it by expanding it into
every head's K and V (latent.latent_keys) against a full pass, and sets its bytes beside MHA's and MQA's.
A stack of layers of different kinds (Jamba, Granite 4's hybrid, Qwen3-Next, MiniMax, Falcon-H1) caches K and V in
its attention layers alone, and a state of a fixed size in its Mamba, delta or lightning layers (qkv.core.cache): the
page checks the attention layers' K, V, counts the state's bytes beside them (K, V growing by the token, the state
not), and its FLOPs count the attention layers (the other boxes cost a step the same at any m). A Mamba stack keeps no
K, V at all: refused in one line.
No torch: qkv.core.cache.KVCache, Model.last_logits and threads.StepThreads, as qkv.writing.generate.decode
uses them.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.text import Text

from ..core.cache import KVCache
from ..runtime.errors import QkvError
from .attention import DEFAULT_TEXT
from ..writing.generate import check_can_generate
from ..runtime.threads import StepThreads, decode_threads
from ..core.labels import shorten
from ..core.weights import MoEWeights
from . import Page, nbytes, same, shape
from ..viz.words import texts

TEXTS = texts("kvcache")           # {language: its words} (viz/words: one module per language)
DEFAULT_MODEL = "smollm2"
NEW_TOKENS = 8
REPEATS = 3                     # each step is timed this many times, the fastest kept
MAX_TEXT_TOKENS = 512             # the text is run whole at every step without the cache: keep it short
TOL_LOGITS = 1e-4


@dataclass
class Step:
    """One new token, chosen with the cache and without it."""

    fed: int                    # tokens fed to the model this step: the prompt (prefill), then 1
    m: int                      # keys the new query reads (the sequence so far)
    token: str                  # the chosen token, as a reader sees it
    token_id: int
    seconds_cache: float        # the step with the cache (best of REPEATS)
    seconds_full: float         # the whole sequence recomputed
    flops_cache: int
    flops_full: int
    diff: float                 # max |logits with the cache − logits without|
    same: bool                  # both choose the same token


@dataclass
class Layout:
    """The cache of this model's shape with H_kv K/V heads."""

    name: str                   # MHA, GQA, MQA
    H_kv: int
    bytes_per_token: int
    bytes_now: int              # for the tokens of this run
    bytes_context: int          # for the model's whole context
    own: bool = False           # the model's own cache (← on the page)


@dataclass
class Lesson:
    model: str
    L: int
    H: int
    H_kv: int
    d_k: int
    d_model: int
    d_ff: int
    V: int
    gated: bool
    context: int                # the model's max_positions
    prompt: list[str]           # the prompt's tokens
    steps: list[Step]
    layouts: list[Layout]
    text: str                   # the prompt and the continuation
    diff_cache: float           # cached K, V − a full pass's k, v (every attention layer)
    latent: dict | None = None  # MLA's sizes (r_kv, d_rot, d_nope, d_v, r_q: `latent_sizes`); None: K, V cached
    L_attn: int = 0             # the layers that keep K, V (KVCache.layers): L, or a hybrid's attention layers
    state_bytes: int = 0        # the other layers' fixed state, bytes a sequence (KVCache.state_bytes); 0: none
    state_layers: int = 0       # how many layers keep such a state
    state_kind: str = ""        # what state: "Mamba", "Mamba-2", "gated delta", "lightning"

    @property
    def n(self) -> int:
        """Tokens in the cache at the end: the prompt and every new token but the last (never fed)."""
        return len(self.prompt) + len(self.steps) - 1


def flops(fed: int, m: int, d_model: int, H: int, H_kv: int, d_k: int, d_ff: int, L: int, V: int,
          gated: bool, latent: dict | None = None) -> int:
    """FLOPs (2 per multiply-add) of one pass feeding `fed` tokens whose queries read m keys, every score
    counted (masked ones too), logits of the last position only:

        L · [ 2·fed·d_model·(H + 2·Hkv)·d_k          Q, K, V projections
            + 2·2·H·fed·m·d_k                        S = Q·Kᵀ and Z = A·V
            + 2·fed·H·d_k·d_model                    Concat(Z)·W_O
            + 2·fed·d_model·d_ff·(3 gated | 2) ]     the FFN
        + 2·d_model·V                                logits = H·W_vocab
    """
    if latent is not None:
        return L * latent_flops(fed, m, d_model, H, d_k, **latent) + L * 2 * fed * d_model * d_ff * (3 if gated else 2) \
            + 2 * d_model * V
    per_layer = (2 * fed * d_model * (H + 2 * H_kv) * d_k + 4 * H * fed * m * d_k + 2 * fed * H * d_k * d_model
                 + 2 * fed * d_model * d_ff * (3 if gated else 2))
    return L * per_layer + 2 * d_model * V


def latent_flops(fed: int, m: int, d_model: int, H: int, d_k: int, r_kv: int, d_rot: int, d_nope: int, d_v: int,
                 r_q: int) -> int:
    """FLOPs of one MLA layer's attention feeding `fed` tokens whose queries read m keys:

        2·f·d_model·(r_q + r_kv + d_rot) + 2·f·r_q·H·d_k   q's latent and q, the K/V latent and the RoPE key
          (no q latent: 2·f·d_model·(H·d_k + r_kv + d_rot))
        + 2·m·r_kv·H·(d_nope + d_v)                         every cached latent expanded to K_nope, V (each step)
        + 2·H·f·m·(d_k + d_v)                              S = Q·Kᵀ and Z = A·V
        + 2·f·H·d_v·d_model                                Concat(Z)·W_O
    """
    q = 2 * fed * (d_model * r_q + r_q * H * d_k) if r_q else 2 * fed * d_model * H * d_k
    return (q + 2 * fed * d_model * (r_kv + d_rot) + 2 * m * r_kv * H * (d_nope + d_v) + 2 * H * fed * m * (d_k + d_v)
            + 2 * fed * H * d_v * d_model)


def latent_sizes(cfg) -> dict | None:
    """MLA's sizes as `latent_flops` and the page read them; None for a model that caches K and V."""
    if not cfg.latent:
        return None
    return dict(r_kv=cfg.kv_lora_rank, d_rot=cfg.rotary_dim, d_nope=cfg.d_head - cfg.rotary_dim, d_v=cfg.d_value,
                r_q=cfg.q_lora_rank)


def build(model, text: str | None = None, new_tokens: int = NEW_TOKENS, repeats: int = REPEATS) -> Lesson:
    """Generate `new_tokens` greedily from `text` with the cache and without it; every number checked."""
    text = text or DEFAULT_TEXT
    cfg = model.config
    if not cfg.causal or getattr(model.weights, "W_vocab", None) is None or cfg.encoder_decoder:
        raise QkvError(f"{model.name} does not write text one token at a time ({cfg.family}), so it keeps no KV "
                       "cache; use a decoder: qkv explain kv-cache --model smollm2 (the default)")
    if not KVCache.kv_layers(cfg):              # a Mamba stack: a state in every layer, no K, V
        raise QkvError(f"{model.name} keeps no K and V: each of its {cfg.n_layers} layers keeps a {state_kind(cfg)} "
                       f"state of a fixed size instead ({KVCache.state_bytes(cfg, model.dtype):,} bytes in all); use a "
                       "model with attention layers: qkv explain kv-cache --model smollm2")
    ids, _ = model.encode(text)
    ids = np.asarray(ids, np.int64)[None]                                  # (1, n)
    if ids.shape[1] > MAX_TEXT_TOKENS:
        raise QkvError(f"the text has {ids.shape[1]} tokens; the lesson runs the whole text again at every step "
                       f"(timed {repeats} times), so give at most {MAX_TEXT_TOKENS}")
    check_can_generate(model, ids.shape[1], new_tokens)
    dims = _dims(model)
    cache = KVCache(cfg, 1, ids.shape[1] + new_tokens, dtype=model.dtype)  # (L_attn, 1, Hkv, max_len, d_k) × 2
    seq, new, steps = ids, ids, []
    threads = StepThreads(decode_threads())
    for _ in range(new_tokens):
        ones = np.ones_like(seq)
        start, state = cache.length, copy.deepcopy(cache.state)   # a hybrid's states: a repeat starts from them

        def again(start=start, state=state):
            cache.length = start                       # a repeat writes over what the last one appended
            cache.state = copy.deepcopy(state)         # and reads the states as they were (None: none)

        def step(new=new, ones=ones):
            if new.shape[1] == 1:                      # one token: 1 or 2 BLAS threads, as decode runs it
                return threads.run(lambda: model.last_logits(new, ones, cache=cache))
            return model.last_logits(new, ones, cache=cache)

        t_cache, with_cache = _best(repeats, step, before=again)
        t_full, full = _best(repeats, lambda: model.last_logits(seq, ones))
        with_cache, full = with_cache[0, -1], full[0, -1]                  # (V,) each
        diff = same(f"the logits of new token {len(steps) + 1} with the KV cache", with_cache, full, TOL_LOGITS,
                    rel=True)
        token_id = int(np.argmax(with_cache))
        chosen = int(np.argmax(full))
        if chosen != token_id and full[token_id] < full[chosen] - 2 * TOL_LOGITS * max(1.0, abs(full[chosen])):
            raise RuntimeError(f"lesson: with the cache token {token_id}, without it {chosen}")
        m = seq.shape[1]
        steps.append(Step(fed=new.shape[1], m=m, token=shorten(model.tokenizer.label(token_id), 14),
                          token_id=token_id, seconds_cache=t_cache, seconds_full=t_full,
                          flops_cache=flops(new.shape[1], m, **dims), flops_full=flops(m, m, **dims),
                          diff=diff, same=chosen == token_id))
        new = np.array([[token_id]])
        seq = np.concatenate([seq, new], axis=1)
    # what the cache holds: the K, V (after RoPE) a full pass computes for the same tokens
    cached = seq[0, :-1]                                                   # the last token was never fed
    trace = model.run(cached.tolist(), keep=("k", "v"))
    n = len(cached)
    diff_cache = max(same(f"cached {name} of layer {i}", held[0], getattr(trace.layer(i), name), 1e-4, rel=True)
                     for i in cache.layers for name, held in zip(("k", "v"), held_kv(model, cache, i, n)))
    return Lesson(model=model.name, L=cfg.n_layers, H=cfg.n_heads, H_kv=cfg.n_kv_heads, d_k=cfg.d_head,
                  d_model=cfg.d_model, d_ff=dims["d_ff"], V=dims["V"], gated=dims["gated"], context=cfg.max_positions,
                  prompt=model.tokenizer.labels(ids[0]), steps=steps, layouts=cache_layouts(cfg, n, model.dtype),
                  text=model.tokenizer.decode(seq[0].tolist()), diff_cache=diff_cache, latent=latent_sizes(cfg),
                  L_attn=len(cache.layers), state_bytes=KVCache.state_bytes(cfg, model.dtype),
                  state_layers=sum(KVCache.state_numbers(cfg, i) > 0 for i in range(cfg.n_layers)),
                  state_kind=state_kind(cfg))


def state_kind(cfg) -> str:
    """What fixed state the layers without K, V (or beside it: Falcon-H1) keep; "" for a transformer."""
    if cfg.mamba is not None:
        return "Mamba-2" if hasattr(cfg.mamba, "conv_dim") else "Mamba"   # core.mamba2.Mamba2 has conv_dim
    if cfg.delta is not None:
        return "gated delta"
    return "lightning" if cfg.lightning is not None else ""


def held_kv(model, cache: KVCache, layer: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """LAYER's K and V of the first n cached tokens, (B, Hkv, n, d_k) each: the cache's own arrays, or MLA's latent
    and RoPE key expanded into every head's K and V, as its attention does (latent.latent_keys)."""
    r = cache.row(layer)                                       # the layer's row among the attention layers'
    k, v = cache.k[r, :, :, :n], cache.v[r, :, :, :n]
    if not model.config.latent:
        return k, v
    from ..core.latent import latent_keys
    return latent_keys(k, v, model.weights.blocks[layer].attn, model.config)


def _best(repeats: int, fn, before=None):
    """(fastest of `repeats` calls in seconds, the last call's result); BEFORE (untimed) runs before each call."""
    best, out = float("inf"), None
    for _ in range(max(1, repeats)):
        if before is not None:
            before()
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _dims(model) -> dict:
    """The sizes `flops` needs, read from the weights (a config that disagreed with them is a bug): the first
    attention layer's (a hybrid's other layers have another box), L the layers that attend."""
    cfg, w = model.config, model.weights
    attending = KVCache.kv_layers(cfg)
    b = w.blocks[attending[0]]
    H, H_kv, d_k, d_model = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    latent = latent_sizes(cfg)
    for name, got, want in _shapes(b.attn, cfg, latent) + [("W_vocab", w.W_vocab.shape, (d_model, cfg.vocab_size))]:
        if tuple(got) != want:
            raise RuntimeError(f"lesson: {name} is {tuple(got)}, the config says {want}")
    ffn = b.ffn
    if isinstance(ffn, MoEWeights):                     # a routed FFN: a token runs k experts (and a shared one)
        d_ff = cfg.experts_per_token * ffn.experts[0].W_in.shape[1] + (0 if ffn.shared is None else ffn.shared.W_in.shape[1])
        ffn = ffn.experts[0]
    else:
        d_ff = ffn.W_in.shape[1]
    return dict(d_model=d_model, H=H, H_kv=H_kv, d_k=d_k, d_ff=d_ff, L=len(attending),
                V=w.W_vocab.shape[1], gated=ffn.W_gate is not None, latent=latent)


def _shapes(a, cfg, latent: dict | None) -> list[tuple[str, tuple, tuple]]:
    """(name, shape, the shape the config says) of an attention's matrices, plain or MLA's."""
    H, H_kv, d_k, d = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    if latent is None:
        return [("W_Q", a.W_Q.shape, (d, H * d_k)), ("W_K", a.W_K.shape, (d, H_kv * d_k)),
                ("W_V", a.W_V.shape, (d, H_kv * d_k)), ("W_O", a.W_O.shape, (H * d_k, d))]
    r_q, d_v = latent["r_q"], latent["d_v"]
    q = [("W_Q", a.W_Q.shape, (d, r_q)), ("W_Q_b", a.W_Q_b.shape, (r_q, H * d_k))] if r_q else \
        [("W_Q", a.W_Q.shape, (d, H * d_k))]
    return q + [("W_K", a.W_K.shape, (d, latent["d_rot"])), ("W_V", a.W_V.shape, (d, latent["r_kv"])),
                ("W_KV_b", a.W_KV_b.shape, (latent["r_kv"], H * (latent["d_nope"] + d_v))),
                ("W_O", a.W_O.shape, (H * d_v, d))]


def cache_layouts(cfg, n: int, dtype) -> list[Layout]:
    """MHA (H K/V heads), the model's own, MQA (1): bytes per token = 2·L·Hkv·d_k·itemsize. MLA (DeepSeek): MHA and
    MQA caching the expanded K (d_k) and V (d_v), L·Hkv·(d_k + d_v)·itemsize, and its own latent between them,
    L·(r_kv + d_rot)·itemsize (`latent_layouts`)."""
    if cfg.latent:
        return latent_layouts(cfg, n, dtype)
    item = np.dtype(dtype).itemsize
    kinds = {cfg.n_heads: "MHA", 1: "MQA"}
    rows = []
    for h in sorted({cfg.n_heads, cfg.n_kv_heads, 1}, reverse=True):
        per = KVCache.bytes_per_token(cfg.with_(n_kv_heads=h), dtype)
        same(f"KV-cache bytes per token with {h} K/V heads", per, 2 * cfg.attention_layers * h * cfg.d_head * item, 0)
        rows.append(Layout(name=kinds.get(h, "GQA"), H_kv=h, bytes_per_token=per, bytes_now=per * n,
                           bytes_context=per * cfg.max_positions, own=h == cfg.n_kv_heads))
    return rows


def latent_layouts(cfg, n: int, dtype) -> list[Layout]:
    """MLA's cache beside what caching its expanded heads would hold: MHA (H heads of K and V), MLA (the latent and
    the shared RoPE key, what qkv's KVCache and transformers' hold: checked against a KVCache's own bytes), MQA."""
    item = np.dtype(dtype).itemsize
    L, H, d_k, d_v = cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.d_value
    per = KVCache.bytes_per_token(cfg, dtype)
    same("MLA's cache bytes per token", per, KVCache(cfg, 1, 1, dtype).nbytes, 0)
    same("MLA's cache bytes per token (closed form)", per, L * (cfg.kv_lora_rank + cfg.rotary_dim) * item, 0)
    sizes = [("MHA", H, L * H * (d_k + d_v) * item, False), ("MLA", 1, per, True), ("MQA", 1, L * (d_k + d_v) * item, False)]
    return [Layout(name=name, H_kv=h, bytes_per_token=b, bytes_now=b * n, bytes_context=b * cfg.max_positions, own=own)
            for name, h, b, own in sizes]


def own_layout(layouts: list[Layout], H_kv: int) -> Layout:
    """The row of `cache_layouts` that is the model's own (the one with its K/V heads; MLA's latent)."""
    return next(l for l in layouts if l.own)


def layout_name(layout: Layout, H_kv: int) -> str:
    return layout.name + (" ←" if layout.own else "")


def per_token(layout: Layout) -> str:
    return f"{layout.bytes_per_token:,} ({nbytes(layout.bytes_per_token)})"


# ── the page ─────────────────────────────────────────────────────────────────────

def render(lesson: Lesson, lang: str = "en") -> list:
    p, s = Page(TEXTS, lang), lesson
    last = s.steps[-1]
    out = [p.rule("title", bold=True, model=s.model), p.say("intro"),
           Text(""), p.rule("s_holds"),
           p.say("holds", L=s.L_attn, H=s.H, H_kv=s.H_kv, d_k=s.d_k, n=len(s.prompt), prompt=" ".join(s.prompt),
                 shape=shape(s.H_kv, len(s.prompt), s.d_k), per=own_layout(s.layouts, s.H_kv).bytes_per_token)
           if s.latent is None else
           p.say("holds_latent", L=s.L, H=s.H, d_k=s.d_k, n=len(s.prompt), prompt=" ".join(s.prompt),
                 c=shape(1, len(s.prompt), s.latent["r_kv"]), k=shape(1, len(s.prompt), s.latent["d_rot"]),
                 per=own_layout(s.layouts, s.H_kv).bytes_per_token, full=s.layouts[0].bytes_per_token, **s.latent),
           *state_lines(p, s, "holds_state_beside" if s.L_attn == s.L else "holds_state"),
           p.say("holds_check" if s.latent is None else "holds_check_latent", n=s.n, diff=s.diff_cache),
           Text(""), p.rule("s_steps", k=len(s.steps))]
    tab = p.table("#", "col_token", "col_fed", "m", "col_shape", "col_bytes", "col_ms_cache", "col_ms_full",
                  "col_flops_cache", "col_flops_full", "col_same")
    per = own_layout(s.layouts, s.H_kv).bytes_per_token
    for i, st in enumerate(s.steps, 1):
        p.row(tab, i, st.token, st.fed, st.m, entry_shape(s, st.m), nbytes(per * st.m),
              f"{1e3 * st.seconds_cache:.1f}", f"{1e3 * st.seconds_full:.1f}", f"{st.flops_cache / 1e6:,.0f}M",
              f"{st.flops_full / 1e6:,.0f}M", f"✓ {st.diff:.0e}" if st.same else f"✗ {st.diff:.0e}", bold_first=True)
    steps = s.steps[1:] or s.steps
    t_cache, t_full = sum(x.seconds_cache for x in steps), sum(x.seconds_full for x in steps)
    out += [p.say("steps", prompt=len(s.prompt)), tab, p.say("text", text=s.text),
            p.say("same", k=len(s.steps), diff=max(x.diff for x in s.steps), tol=TOL_LOGITS),
            Text(""), p.rule("s_cost"),
            p.say("flops" if s.latent is None else "flops_latent", ffn="3" if s.gated else "2", d_model=s.d_model,
                  H=s.H, H_kv=s.H_kv, d_k=s.d_k, d_ff=s.d_ff, L=s.L_attn, V=s.V, **(s.latent or {})),
            *state_lines(p, s, "flops_state"),
            p.say("cost", m=last.m, fc=last.flops_cache / 1e6, ff=last.flops_full / 1e6,
                  fr=last.flops_full / last.flops_cache, k=len(steps), tc=1e3 * t_cache, tf=1e3 * t_full,
                  tr=t_full / t_cache),
            p.say("ratio_memory" if t_full / t_cache < last.flops_full / last.flops_cache else "ratio_busy"),
            Text(""), p.rule("s_layouts")]
    lay = p.table("col_attention", "col_kv_heads", "col_per_token", p.t["col_now"].format(n=s.n), "col_context")
    for l in s.layouts:
        p.row(lay, layout_name(l, s.H_kv), l.H_kv, per_token(l), nbytes(l.bytes_now), nbytes(l.bytes_context),
              bold_first=True)
    mha, own, mqa = s.layouts[0], own_layout(s.layouts, s.H_kv), s.layouts[-1]
    if s.latent is not None:
        return out + [p.say("layouts_latent", L=s.L, d_k=s.d_k, n=s.n, context=s.context, **s.latent), lay,
                      p.say("layouts_end_latent", H=s.H, saving=mha.bytes_per_token / own.bytes_per_token,
                            mqa=mqa.bytes_per_token / own.bytes_per_token, **s.latent)]
    out += [p.say("layouts", L=s.L_attn, d_k=s.d_k, n=s.n, context=s.context), lay,
            p.say("layouts_end", H=s.H, H_kv=s.H_kv, saving=mha.bytes_per_token / own.bytes_per_token,
                  mqa=mha.bytes_per_token / mqa.bytes_per_token),
            *state_lines(p, s, "layouts_state", kv=nbytes(own.bytes_context))]
    return out


def state_lines(p: Page, s: Lesson, key: str, **more) -> list:
    """KEY's paragraph about a hybrid's fixed states ([] for a transformer: no state)."""
    if not s.state_layers:
        return []
    return [p.say(key, k=s.state_layers, L_all=s.L, L=s.L_attn, kind=s.state_kind, state=s.state_bytes,
                  state_h=nbytes(s.state_bytes), per=own_layout(s.layouts, s.H_kv).bytes_per_token,
                  context=s.context, **more)]


def entry_shape(s: Lesson, m: int) -> str:
    """What one layer's cache holds after m tokens: K's shape (V's is the same), or MLA's latent + RoPE key."""
    if s.latent is None:
        return shape(s.H_kv, m, s.d_k)
    return f"{shape(1, m, s.latent['r_kv'])} + {shape(1, m, s.latent['d_rot'])}"


# ── the figure ───────────────────────────────────────────────────────────────────

def figures(lesson: Lesson, out_dir: Path, lang: str = "en") -> list[Path]:
    """kvcache: time and FLOPs per step with and without the cache, and the cache's size (MHA/GQA/MQA)."""
    from ..viz.drawing import new_figure, styled, save_all

    t, s = Page(TEXTS, lang).t, lesson

    @styled
    def draw():
        fig = new_figure(13, 4)
        a, b, c = fig.subplots(1, 3)
        m = [x.m for x in s.steps]
        a.plot(m, [1e3 * x.seconds_full for x in s.steps], "o-", label=t["fig_full"])
        a.plot(m, [1e3 * x.seconds_cache for x in s.steps], "o-", label=t["fig_cache"])
        a.set(xlabel=t["fig_m"], ylabel="ms", title=t["fig_time"], ylim=(0, None))
        b.plot(m, [x.flops_full / 1e9 for x in s.steps], "o-", label=t["fig_full"])
        b.plot(m, [x.flops_cache / 1e9 for x in s.steps], "o-", label=t["fig_cache"])
        b.set(xlabel=t["fig_m"], ylabel="GFLOPs", title=t["fig_flops"], ylim=(0, None))
        tokens = np.linspace(0, s.context, 50)
        for l in s.layouts:
            c.plot(tokens, tokens * l.bytes_per_token / 2 ** 20, lw=2.5 if l.own else 1.2,
                   label=f"{l.name} (Hkv = {l.H_kv})")
        if s.state_bytes:                                  # a hybrid's states: the same at every length
            c.axhline(s.state_bytes / 2 ** 20, ls="--", color="0.4", label=t["fig_state"].format(kind=s.state_kind))
        c.set(xlabel=t["fig_tokens"], ylabel="MiB", title=t["fig_memory"].format(model=s.model))
        for ax in (a, b, c):
            ax.legend(fontsize=8)
        return fig

    return save_all(out_dir, [("kvcache", draw)], ["png", "svg"])
