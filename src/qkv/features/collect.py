"""Making an activation store (qkv.features.activations) from a corpus: what `qkv activations` runs.

    texts ─tokenizer─▶ windows of ≤ context tokens ─plan─▶ shards of shard_tokens rows
          ─worker: blocks 0..k-1 only (transformer(stop=k)), batches of ≤ BATCH_TOKENS─▶ DIR/acts-00000.npy …

Positions: every real token of each window, except its first with skip_first (the default for decoders):
position 0 of a decoder's window is where attention "sinks", and its residual stream has a norm far above
the others' (SmolLM2 entering layer 15: 22,700 against a median of 153, ~150×): an SAE trained with it spends
its capacity and its loss there (float16, at most 65,504, still holds it there; a row it cannot hold is an
error, never an inf). Encoders keep it unless asked.

Resume: the same command again continues after the last shard meta.json lists (a kill -9 loses at most the
shards in flight) and gives the same bits as a run never stopped: a shard's rows depend only on the corpus
and the settings, never on which worker made it or when. A larger token count grows the store (the same bits
as a run asked for that many). Other settings or another corpus: one error naming the difference.
Memory: per worker one batch's pass, its rows written into the shard's file as they are made (pwrite, not a
memory map: a full disk is one error).
Workers: 1 (this process), N local processes or Ray actors, each taking whole shards (qkv.features.shards makes
them); meta.json lists shards in order as they are done.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import real_directory, refuse_link
from .activations import (CONTEXT, SHARD_TOKENS, SITES, Activations, check_settings, new_meta, read_meta, save_meta,
                          shard_name)
from .shards import Job, Spec, run_jobs

if TYPE_CHECKING:
    from ..models.model import Model
    from .corpora import Texts

# ── the plan: which window rows go into which shard ─────────────────────────────

def plan(texts: "Texts", tokenizer, context: int, skip: int, shard_tokens: int, tokens: int, first: int,
         read: dict) -> Iterator[Job]:
    """Jobs for shards FIRST, FIRST+1, … from READ on, until TOKENS rows in all or the corpus's end.
    A window's kept rows are its positions SKIP..n-1; a text that cannot be encoded is skipped (and counted)."""
    from ..analysis.corpus import template_of, windows

    template = template_of(tokenizer)
    left = tokens - first * shard_tokens
    k, pieces, have, skipped = first, [], 0, int(read.get("skipped", 0))
    t0, w0, r0 = int(read["text"]), int(read["window"]), int(read["row"])
    for index, _, text in texts.texts(t0):
        try:
            ids, _ = tokenizer.encode(text)
            parts = windows(ids, context, template) if len(ids) else []
        except QkvError:
            skipped += 1
            continue
        for w, piece in enumerate(parts):
            if index == t0 and w < w0:
                continue
            lo = r0 if (index, w) == (t0, w0) else 0
            n = max(len(piece) - skip, 0)
            while lo < n and left > 0:
                hi = min(n, lo + shard_tokens - have, lo + left)
                pieces.append((piece, lo, hi))
                have, left, lo = have + hi - lo, left - (hi - lo), hi
                if have == shard_tokens or left == 0:
                    nxt = (index, w, lo) if lo < n else (index, w + 1, 0)
                    yield Job(k, pieces, {"text": nxt[0], "window": nxt[1], "row": nxt[2], "skipped": skipped})
                    k, pieces, have = k + 1, [], 0
            if left == 0:
                return
    if pieces:
        yield Job(k, pieces, {"text": texts.count, "window": 0, "row": 0, "skipped": skipped})


# ── the whole run ────────────────────────────────────────────────────────────────

def check_model(model: "Model", layer: int, site: str) -> int:
    """LAYER (negative from the end) → 0..L-1 of a single-stack model with a tokenizer, or one error."""
    if getattr(model.config, "encoder_decoder", False):
        raise QkvError(f"{model.name} is an encoder–decoder; qkv activations reads a single stack (a decoder such as "
                       "--model smollm2, or an encoder such as minilm)")
    if model.tokenizer is None:
        raise QkvError(f"{model.name} has no tokenizer.json, so text cannot be encoded; add the checkpoint's tokenizer.json")
    if site not in SITES:
        raise QkvError(f"unknown site {site!r}; choose one of {', '.join(SITES)}")
    if site == "ffn_out" and model.config.d_ff == 0 and not model.config.n_experts:
        raise QkvError(f"{model.name} has no FFN (d_ff = 0), so no ffn_out; choose --site resid or attn_out")
    return model.check_layer(layer)


def settings_of(model: "Model", source: str, layer: int, site: str, dtype: str, shard_tokens: int, tokens: int,
                context: int, skip_first: bool, texts: "Texts", split: str) -> tuple[dict, dict]:
    """(what a store must match to be continued, the corpus's record)."""
    must = {"model": model.name, "source": source, "layer": layer, "site": site, "d": model.config.d_model,
            "dtype": dtype, "shard_tokens": shard_tokens, "tokens": tokens, "context": context,
            "skip_first": skip_first, "split": split, "corpus_sha256": texts.sha256}
    return must, {"name": texts.name, "sha256": texts.sha256, "texts": texts.count, "split": split}


def _differences(meta: dict, must: dict) -> dict[str, tuple]:
    """{setting: (the store's, asked)} for every setting that differs."""
    have = {**meta["settings"], **{k: meta[k] for k in ("model", "layer", "site", "d", "dtype", "shard_tokens")},
            "corpus_sha256": (meta.get("corpus") or {}).get("sha256")}
    return {k: (have.get(k), v) for k, v in must.items() if have.get(k) != v}


def _extend(meta: dict, tokens: int) -> None:
    """A store asked for more tokens than it was: a last shard cut short by the old count is made again
    (its rows depend on the count only there), then the run goes on as one asked for TOKENS from the start."""
    meta["settings"]["tokens"], meta["done"] = tokens, False
    if meta["shards"] and meta["shards"][-1]["tokens"] < meta["shard_tokens"]:
        meta["tokens"] -= meta["shards"].pop()["tokens"]


@dataclass
class Collected:
    """What `collect_activations` did: the store, the tokens it holds, whether the corpus ran out first."""

    store: Activations
    tokens: int
    asked: int
    resumed_from: int              # tokens already there when this run began
    corpus_ended: bool
    skipped: int                   # texts that could not be encoded


def collect_activations(source: "str | Model", out: str | Path, *, layer: int, site: str, texts: "Texts",
                        tokens: int, dtype: str = "float32", shard_tokens: int = SHARD_TOKENS,
                        context: int = CONTEXT, skip_first: bool | None = None, split: str = "line",
                        workers: int = 1, backend: str = "local", address: str | None = None,
                        weights: str | None = None, arith: str = "exact",
                        progress: Callable[[int, int], None] | None = None) -> Collected:
    """Stream TEXTS through the model (SOURCE: a name or path, or a loaded Model with workers=1) and store
    SITE of LAYER for TOKENS tokens at OUT (see the module); continue a store of the same settings there.
    skip_first None: on for decoders. weights, arith: how SOURCE is loaded, here and in every worker.
    progress(tokens stored, tokens asked) after each shard."""
    return open_collection(source, out, layer=layer, site=site, texts=texts, tokens=tokens, dtype=dtype,
                           shard_tokens=shard_tokens, context=context, skip_first=skip_first, split=split,
                           workers=workers, backend=backend, address=address, weights=weights,
                           arith=arith).run(progress)


@dataclass
class Collection:
    """A store checked and opened for a run (`open_collection`), before any shard is made."""

    model: "Model"
    out: Path
    meta: dict
    texts: "Texts"
    spec: Spec
    context: int
    tokens: int
    workers: int
    backend: str
    address: str | None

    def run(self, progress: Callable[[int, int], None] | None = None) -> Collected:
        """Make the missing shards, listing each in meta.json as soon as it and those before it are done."""
        meta, out, spec = self.meta, self.out, self.spec
        before, first = meta["tokens"], len(meta["shards"])
        read = meta["shards"][-1].get("read") if first else {"text": 0, "window": 0, "row": 0, "skipped": 0}
        if read is None:
            raise QkvError(f"{out}/meta.json does not say where its last shard ends in the corpus (its read); "
                           "remake the store (qkv activations with a new --out)")
        if not meta["done"]:
            jobs: dict[int, Job] = {}

            def planned() -> Iterator[Job]:
                for job in plan(self.texts, self.model.tokenizer, self.context, spec.skip, meta["shard_tokens"],
                                self.tokens, first, read):
                    jobs[job.index] = job
                    yield job

            done: dict[int, int] = {}
            if progress is not None:
                progress(meta["tokens"], self.tokens)
            for index, rows in run_jobs(planned(), self.model, spec, self.workers, self.backend, self.address):
                done[index] = rows
                while len(meta["shards"]) in done:               # shards listed in order as they are done
                    k = len(meta["shards"])
                    meta["shards"].append({"file": shard_name(k), "tokens": done.pop(k), "read": jobs.pop(k).read})
                    meta["tokens"] += meta["shards"][-1]["tokens"]
                    save_meta(out, meta)
                    if progress is not None:
                        progress(meta["tokens"], self.tokens)
            meta["done"] = True
            save_meta(out, meta)
        last = meta["shards"][-1].get("read", read) if meta["shards"] else read
        return Collected(store=Activations(out, meta), tokens=meta["tokens"], asked=self.tokens, resumed_from=before,
                         corpus_ended=meta["tokens"] < self.tokens, skipped=int(last.get("skipped", 0)))


def open_collection(source: "str | Model", out: str | Path, *, layer: int, site: str, texts: "Texts", tokens: int,
                    dtype: str = "float32", shard_tokens: int = SHARD_TOKENS, context: int = CONTEXT,
                    skip_first: bool | None = None, split: str = "line", workers: int = 1, backend: str = "local",
                    address: str | None = None, weights: str | None = None, arith: str = "exact") -> Collection:
    """Every check of `collect_activations`, the model loaded and the store at OUT made or matched: one error
    before any work (the command opens its progress bar after this)."""
    from ..analysis.backends import BACKENDS
    from ..models.loading import load

    check_settings(site, dtype, shard_tokens)
    if backend not in BACKENDS:
        raise QkvError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if not isinstance(tokens, (int, np.integer)) or tokens < 1:
        raise QkvError(f"tokens={tokens!r} must be an integer ≥ 1")
    if isinstance(source, str):
        model = load(source, dtype=weights, arith=arith)
    elif workers > 1 or backend != "local":
        raise QkvError("workers load the model themselves: give its source ('smollm2', a path), not a loaded Model")
    else:
        model, source = source, source.name
    layer = check_model(model, layer, site)
    skip_first = bool(model.config.causal) if skip_first is None else bool(skip_first)
    skip = 1 if skip_first else 0
    context = min(int(context), model.config.max_positions)
    if context <= skip:
        raise QkvError(f"a context of {context} tokens keeps none once the first is skipped; give --context ≥ 2")
    if backend == "ray":
        from ..analysis.backends import import_ray

        import_ray()
    must, corpus = settings_of(model, source, layer, site, dtype, shard_tokens, tokens, context, skip_first, texts, split)
    out = Path(out)
    try:
        refuse_link(out)                                  # a store is written into the folder given, not a link's
    except OSError as e:
        raise QkvError(f"cannot write to {out}: {e.strerror}; choose a real folder") from None
    meta = read_meta(out) if out.is_dir() else None
    if meta is None:
        if out.is_dir() and any(p for p in out.iterdir() if not p.name.startswith(".")):
            raise QkvError(f"{out} holds files but no activation store; give a new or empty directory")
        try:
            real_directory(out)
        except OSError as e:
            raise QkvError(f"cannot make {out}: {e.strerror}; choose a writable directory") from None
        meta = new_meta(model.name, layer, site, model.config.d_model, dtype, shard_tokens, corpus,
                        {k: must[k] for k in ("source", "tokens", "context", "skip_first", "split")})
        save_meta(out, meta)
    else:
        wrong = _differences(meta, must)
        if set(wrong) == {"tokens"} and tokens > wrong["tokens"][0]:
            _extend(meta, tokens)                                # more tokens: the same store, grown
            save_meta(out, meta)
        elif wrong:
            said = "; ".join(f"{k} {have!r} (asked: {asked!r})" for k, (have, asked) in wrong.items())
            raise QkvError(f"{out} holds a store made with other settings: {said}; rerun with its settings to "
                           "continue it (a larger --tokens grows it), or give another --out")
    for stray in out.glob(".acts-*.tmp"):                      # shards in flight when a run was killed
        stray.unlink(missing_ok=True)
    spec = Spec(source, weights, str(out.resolve()), layer, site, dtype, skip, model.arith)
    return Collection(model, out, meta, texts, spec, context, tokens, max(1, int(workers)), backend, address)
