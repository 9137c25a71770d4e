"""The training benchmark: one training step of qkv against torch, same model, batch and AdamW.

    a model (MODELS: the induction task's attention-only Llama, a small GPT-2, a small Llama)
      ─qkv.init(seed)─▶ params: checkpoint name → float32 array (the family's `tensors`)
      ─load_state_dict─▶ the same numbers in transformers' *ForCausalLM (eager attention, train mode,
                          no dropout), torch on as many threads as NumPy's BLAS
    one step, timed taking turns (median of `repeats` rounds after a warm-up):
      qkv:    loss_and_grads(weights = views of params) → grads_by_name → AdamW.step   (as `qkv train`)
      torch:  model(ids, labels=ids).loss → loss.backward() → opt.step() → opt.zero_grad(set_to_none=True)
    tokens/s = B·n ÷ the step's seconds; the first two steps' losses must agree (same model, same AdamW).

Memory (`activation_memory`): tracemalloc (NumPy reports its buffers to it) around one
loss_and_grads, started after the weights exist so they are not counted: what is held when the
forward ends and the loss is taken (everything kept for backward, and the logits), against
`kept_floats`; and the peak of the whole call (gradients and the backward's temporaries too).
torch's side: the bytes autograd saves for backward (saved_tensors_hooks), parameters excluded.

`measure` returns plain dicts; `markdown` turns them into the docs/benchmarks.md section.
torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass, field
from typing import Callable
from unittest import mock

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from . import common
from . import markdown as md
from .common import cpu_snapshot, others_cores, time_interleaved, torch_machine_facts


@dataclass(frozen=True)
class Spec:
    """A benchmarked model: its config.json (what qkv.init and transformers both read) and batch B × n."""

    label: str
    hf: dict
    batch: int
    tokens: int
    optim: dict = field(default_factory=lambda: dict(OPTIM))


# AdamW as `qkv train` sets it (train/loop.py: betas, eps); weight decay on matrices only.
OPTIM = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01}
MODELS = {
    "induction": Spec("induction: attention-only Llama (d_ff 0), as qkv train --task induction", {
        "model_type": "llama", "vocab_size": 64, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 0, "max_position_embeddings": 65, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True}, batch=32, tokens=65),
    "gpt2": Spec("small GPT-2", {
        "model_type": "gpt2", "vocab_size": 512, "n_embd": 256, "n_layer": 4, "n_head": 4, "n_inner": 1024,
        "n_positions": 512}, batch=16, tokens=128),
    "llama": Spec("small Llama (GQA, SwiGLU)", {
        "model_type": "llama", "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 688,
        "max_position_embeddings": 512, "tie_word_embeddings": False}, batch=16, tokens=128),
}
MEMORY_MODEL = "gpt2"
MEMORY_TOKENS = (64, 128, 256, 512)
REPEATS = 7
SETTLE = 0.3               # seconds of sleep before each timed step (OpenBLAS's idle workers spin ~0.1 s)
TOL_LOSS = 1e-4            # |qkv's loss − torch's| on the first two steps
TARGET = 0.7               # qkv's tokens/s ≥ 0.7× torch's
COMMAND = "qkv bench train --out docs/benchmarks.md"


def reference_stack():
    """(torch, transformers) for this benchmark, or a QkvError that says how to install them."""
    return common.reference_stack("train")


# ── qkv's side ───────────────────────────────────────────────────────────────────

def qkv_model(spec: Spec, seed: int = 0) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """(config, params): a fresh model of SPEC as `qkv train` starts one, params by checkpoint name."""
    from .. import init
    from ..checkpoints.families import family_of

    model = init(spec.hf, seed=seed)
    cfg = model.config
    return cfg, family_of(cfg.family).tensors(model.weights, cfg)     # new float32 arrays


def qkv_step(params: dict[str, np.ndarray], cfg: ModelConfig, ids: np.ndarray, optim: dict | None = None
             ) -> Callable[[], float]:
    """One training step of qkv on ids (B, n), as a function returning the loss; each call updates
    PARAMS in place: weights (views of params) → loss_and_grads → grads_by_name → AdamW.step."""
    from ..checkpoints import weights_from_tensors
    from ..train.gradients import grads_by_name
    from ..train.backprop import loss_and_grads
    from ..train.optim import AdamW

    weights = weights_from_tensors(params, cfg)                       # views: the step shows through
    opt = AdamW(params, **(optim or OPTIM))                           # no decay on 1-D (biases, norms)

    def step() -> float:
        loss, tree = loss_and_grads(weights, cfg, ids)
        opt.step(grads_by_name(tree, cfg))
        return loss
    return step


def kept_floats(cfg: ModelConfig, B: int, n: int) -> dict[str, int]:
    """Floats held when the forward ends, by what holds them (the forward's Tape, core/blocks_backward.py):

        per block   X and X₁ (the norms' inputs), Norm(X), Q, K, V, Concat(Z), Norm(X₁)   B·n·(4d + 2·H·d_k + 2·Hkv·d_k)
                    A = softmax(S)                                                     B·H·n²
                    the FFN's x·W_in + b and act(…) (and x·W_gate, gated)               B·n·d_ff·(2 or 3)
        at the top  the last block's output, its final norm, the logits               B·n·(2d + V)
    """
    d, dq, dkv = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head
    L = cfg.n_layers
    return {"blocks": L * B * n * (4 * d + 2 * dq + 2 * dkv),
            "A": L * B * cfg.n_heads * n * n,
            "ffn": L * B * n * cfg.d_ff * (3 if cfg.gated_ffn else 2),
            "top": B * n * (2 * d + cfg.vocab_size)}


def activation_memory(cfg: ModelConfig, params: dict[str, np.ndarray], batch: int, tokens=MEMORY_TOKENS,
                      seed: int = 0) -> list[dict]:
    """Per n: bytes held when the loss is taken (the forward's tapes + logits), the peak of the whole
    loss_and_grads call, and kept_floats' prediction; tracemalloc counts only what the call allocates."""
    from ..checkpoints import weights_from_tensors
    from ..train import backprop as grads

    weights = weights_from_tensors(params, cfg)
    itemsize = next(iter(params.values())).itemsize
    rng = np.random.default_rng(seed)
    rows = []
    for n in tokens:
        if not 2 <= n <= cfg.max_positions:
            raise QkvError(f"--memory-tokens {n} is outside 2..{cfg.max_positions}; choose a length in it")
        ids = rng.integers(0, cfg.vocab_size, size=(batch, n))        # (B, n)
        at_loss = []
        loss_fn = grads.next_token_loss

        def noting(*args, _loss=loss_fn, _at=at_loss):
            _at.append(tracemalloc.get_traced_memory()[0])            # the forward is done, nothing freed yet
            return _loss(*args)

        tracing = tracemalloc.is_tracing()                            # someone else's tracing is left on
        if not tracing:
            tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            with mock.patch.object(grads, "next_token_loss", noting):
                grads.loss_and_grads(weights, cfg, ids)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            if not tracing:
                tracemalloc.stop()
        formula = kept_floats(cfg, batch, n)
        rows.append({"tokens": n, "batch": batch, "kept_bytes": at_loss[0] - base, "peak_bytes": peak - base,
                     "formula_bytes": itemsize * sum(formula.values()), "A_bytes": itemsize * formula["A"]})
    return rows


# ── torch's side ─────────────────────────────────────────────────────────────────

def torch_model(cfg: ModelConfig, params: dict[str, np.ndarray]):
    """transformers' *ForCausalLM of CFG holding PARAMS (copies), float32, eager attention, train mode."""
    torch, transformers = reference_stack()
    from ..checkpoints.families import family_of

    hf = transformers.AutoConfig.for_model(**family_of(cfg.family).hf_config(cfg))    # dropout 0
    model = transformers.AutoModelForCausalLM.from_config(hf, attn_implementation="eager", dtype=torch.float32)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in params.items()},
                                                strict=False)
    tied = {"lm_head.weight"} if cfg.tied_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"qkv's tensors do not fill transformers' model: missing {missing}, "
                           f"unexpected {unexpected}")
    if cfg.d_ff == 0 and cfg.family == "gpt2":                        # Llama runs d_ff 0 as it is
        for block in model.transformer.h:
            block.mlp = _attention_only_mlp(torch, block.mlp)
    return model.train()


def _attention_only_mlp(torch, mlp):
    """GPT-2's MLP with d_ff = 0 is act(x·W_in)·W_out + b_out = b_out, which transformers' Conv1D cannot
    compute (it reshapes a (B, n, 0) tensor with -1); this module returns b_out, keeping the MLP's
    parameters under their names (c_fc, c_proj: zero-sized but for the bias)."""

    class BiasOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc, self.c_proj = mlp.c_fc, mlp.c_proj

        def forward(self, x):
            return self.c_proj.bias.expand_as(x)                      # (B, n, d) = 0·W_out + b_out

    return BiasOnly()


def torch_step(model, ids: np.ndarray, optim: dict | None = None) -> Callable[[], float]:
    """One training step of torch on ids (B, n): forward with labels=ids, backward, AdamW, zero_grad."""
    torch, _ = reference_stack()
    o = optim or OPTIM
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": o["weight_decay"]},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=o["lr"], betas=o["betas"], eps=o["eps"])
    ids_t = torch.from_numpy(ids)

    def step() -> float:
        loss = model(input_ids=ids_t, labels=ids_t).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step


def torch_saved_bytes(model, ids: np.ndarray) -> int:
    """Bytes of the tensors autograd keeps for backward in one forward (each storage once, parameters not)."""
    torch, _ = reference_stack()
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen[s.data_ptr()] = s.nbytes()
        return t

    ids_t = torch.from_numpy(ids)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids_t, labels=ids_t).loss
    del loss
    return sum(seen.values())


# ── the benchmark ────────────────────────────────────────────────────────────────

def measure(models=tuple(MODELS), repeats: int = REPEATS, warmup: int = 1, seed: int = 0,
            memory_tokens=MEMORY_TOKENS, threads: int | None = None, log: Callable[[str], None] = lambda m: None
            ) -> dict:
    """Time a training step of qkv and torch on each model; measure activation memory on MEMORY_MODEL.

    {"rows": [{"model", "label", "config", "batch", "tokens", "parameters", "qkv_s", "torch_s",
    "qkv_tokens_per_s", "torch_tokens_per_s", "ratio", "losses"}], "memory": [...], "machine": {...}, ...}
    """
    torch, transformers = reference_stack()
    from ..runtime.threads import blas_threads, cores

    for name in models:
        if name not in MODELS:
            raise QkvError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    limit = MODELS[MEMORY_MODEL].hf["n_positions"]
    for n in memory_tokens:
        if not 2 <= n <= limit:
            raise QkvError(f"--memory-tokens {n} is outside 2..{limit} (the {MEMORY_MODEL} model's context); "
                           "choose a length in it")
    threads = threads or cores()                                      # as `qkv train`: every core unless told
    torch.set_num_threads(threads)
    rows, rng = [], np.random.default_rng(seed)
    with blas_threads(threads):
        before = cpu_snapshot()
        for name in models:
            spec = MODELS[name]
            cfg, params = qkv_model(spec, seed)
            ids = rng.integers(0, cfg.vocab_size, size=(spec.batch, spec.tokens))   # (B, n)
            tm = torch_model(cfg, params)
            runs = {"qkv": qkv_step(params, cfg, ids, spec.optim), "torch": torch_step(tm, ids, spec.optim)}
            losses = [(runs["qkv"](), runs["torch"]()) for _ in range(2)]          # before, after one step
            worst = max(abs(a - b) for a, b in losses)
            if worst > TOL_LOSS:
                raise RuntimeError(f"{name}: qkv's and torch's losses differ by {worst:.2e} > {TOL_LOSS} "
                                   f"({losses}): not the same model or optimizer, the timing would be meaningless")
            log(f"{name}: losses agree ({worst:.1e}); timing {repeats} rounds")
            t = time_interleaved(runs, repeats=repeats, warmup=warmup, settle=SETTLE)
            tokens = ids.size
            rows.append({"model": name, "label": spec.label, "config": spec.hf, "batch": spec.batch,
                         "tokens": spec.tokens, "parameters": sum(p.size for p in params.values()),
                         "qkv_s": t["qkv"], "torch_s": t["torch"], "qkv_tokens_per_s": tokens / t["qkv"],
                         "torch_tokens_per_s": tokens / t["torch"], "ratio": t["torch"] / t["qkv"],
                         "losses": losses, "max_loss_diff": worst})
            del tm, runs
        others = others_cores(before, cpu_snapshot())
        memory = None
        if memory_tokens:
            spec = MODELS[MEMORY_MODEL]
            log(f"memory: {MEMORY_MODEL} at n = {', '.join(map(str, memory_tokens))}")
            cfg, params = qkv_model(spec, seed)
            memory = activation_memory(cfg, params, spec.batch, memory_tokens, seed)
            tm = torch_model(cfg, params)
            for row in memory:
                ids = rng.integers(0, cfg.vocab_size, size=(spec.batch, row["tokens"]))
                row["torch_saved_bytes"] = torch_saved_bytes(tm, ids)
    machine = torch_machine_facts(torch, transformers, threads)
    return {"rows": rows, "memory": memory, "memory_model": MEMORY_MODEL, "optim": OPTIM, "machine": machine,
            "others_cores": others, "repeats": repeats, "warmup": warmup, "settle_s": SETTLE, "seed": seed}


# ── the report ───────────────────────────────────────────────────────────────────

def markdown(result: dict, command: str = COMMAND) -> str:
    """The "Training" section of docs/benchmarks.md, from `measure`'s dict."""
    rows = result["rows"]
    worst = max((r["max_loss_diff"] for r in rows), default=0.0)
    return md.join("## Training", _method(result), _table(rows), _target(rows),
                   f"Same model, same AdamW: the losses of the first two steps agree within {worst:.1e} "
                   f"(tolerance {TOL_LOSS}).",
                   *_memory(result), md.torch_machine(result), md.reproduce(command))


def _method(result: dict) -> str:
    o = result["optim"]
    return ("One training step, on the CPU in float32, of the same freshly initialised model on the same batch of "
            "random token ids: qkv `loss_and_grads` on weights that are views of the parameter dict, "
            "`grads_by_name`, `AdamW.step` (what `qkv train` does, without its clipping and schedule) "
            "against transformers' model (eager attention, train mode, dropout 0) with `loss.backward()`, "
            "`torch.optim.AdamW.step()`, `zero_grad(set_to_none=True)`. AdamW for both: "
            f"lr {o['lr']:g}, betas {tuple(o['betas'])}, eps {o['eps']:g}, weight decay {o['weight_decay']:g} "
            f"on matrices only. In the same process, taking turns; median of {result['repeats']} rounds after "
            f"{result['warmup']} warm-up, {result['settle_s']:g} s of sleep before each step. "
            "tokens/s = B·n ÷ the step's time.")


def _shape(r: dict) -> str:
    c = r["config"]
    d = c.get("n_embd", c.get("hidden_size"))
    L, H = c.get("n_layer", c.get("num_hidden_layers")), c.get("n_head", c.get("num_attention_heads"))
    kv = c.get("num_key_value_heads")
    f = c.get("n_inner", c.get("intermediate_size"))
    heads = f"H {H}" + (f" / {kv} K/V" if kv and kv != H else "")
    return f"L {L}, d {d}, {heads}, d_ff {f}, V {c['vocab_size']}"


def _table(rows: list[dict]) -> list[str]:
    cells = [[r["label"], _shape(r), f"{r['parameters'] / 1e6:.2f}M", f"{r['batch']} × {r['tokens']}",
              f"{1e3 * r['qkv_s']:.0f}", f"{1e3 * r['torch_s']:.0f}", f"{r['qkv_tokens_per_s']:,.0f}",
              f"{r['torch_tokens_per_s']:,.0f}", f"{r['ratio']:.2f}×"] for r in rows]
    return md.table(["model", "shape", "params", "B × n", "qkv ms", "torch ms", "qkv tokens/s", "torch tokens/s",
                     "qkv / torch"], cells, "llrrrrrrr")


def _target(rows: list[dict]) -> str:
    worst = min(rows, key=lambda r: r["ratio"])
    return md.target(f"Target: qkv's tokens/s ≥ {TARGET}× torch's on every model", worst["ratio"], TARGET,
                     f"at worst {worst['ratio']:.2f}× on {worst['model']}") + "."


def _memory(result: dict) -> list:
    mem = result.get("memory")
    if not mem:
        return []
    spec = MODELS[result["memory_model"]]
    mb = lambda b: f"{b / 2**20:.0f}"                                   # noqa: E731
    cells = []
    for i, r in enumerate(mem):
        grow = "" if i == 0 else f"{r['kept_bytes'] / mem[i - 1]['kept_bytes']:.2f}×"
        torch_mb = mb(r["torch_saved_bytes"]) if r.get("torch_saved_bytes") is not None else "—"
        cells.append([str(r["tokens"]), mb(r["kept_bytes"]), mb(r["formula_bytes"]),
                      f"{r['kept_bytes'] / r['formula_bytes']:.2f}", mb(r["A_bytes"]), grow, mb(r["peak_bytes"]),
                      torch_mb])
    intro = (f"**Memory** of one qkv `loss_and_grads` on the {spec.label} (B = {mem[0]['batch']}), counted by "
             "tracemalloc (NumPy reports its buffers to it; the weights existed before and are not counted): "
             "*kept* = what is held when the forward ends and the loss is taken — the tape backward reads, "
             "and the logits; *formula* = 4 bytes × (per block B·n·(4d + 2·H·d_k + 2·Hkv·d_k) for the norms' "
             "inputs and outputs, Q, K, V, Concat(Z), + B·H·n² for A, + B·n·d_ff·2 (3 gated) for the FFN; "
             "+ B·n·(2d + V) at the top); *A* is the formula's B·H·n² share; *peak* = the whole call's "
             "peak (gradients, dlogits and the backward's temporaries too); torch = the bytes autograd saves "
             "for backward in its forward (each storage once, parameters excluded).")
    table = md.table(["n", "kept MB", "formula MB", "kept / formula", "A MB", "kept ÷ row above", "peak MB",
                      "torch saved MB"], cells, "rrrrrrrr")
    first, last = mem[0], mem[-1]
    note = (f"From n = {first['tokens']} to {last['tokens']} the kept bytes grow "
            f"{last['kept_bytes'] / first['kept_bytes']:.1f}× for {last['tokens'] / first['tokens']:.0f}× the "
            f"tokens; A's share of the formula goes from {first['A_bytes'] / first['formula_bytes']:.0%} to "
            f"{last['A_bytes'] / last['formula_bytes']:.0%}.")
    return [intro, table, note]
