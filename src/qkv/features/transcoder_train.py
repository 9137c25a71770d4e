"""Training a transcoder for every chosen layer at once, streamed from the live model: what `qkv transcoders
train` runs. No activations are stored: each step runs the model on a batch of token windows and trains every
layer's transcoder on what that pass's FFNs read and wrote.

    corpus ─tokenizer─▶ windows of ≤ context tokens (first position dropped: the attention sink)
      step s: rows s·B .. (s+1)·B − 1 of the windows in a shuffled order (epoch e: rng(seed, e))
      ─model, blocks 0..max(layers) (float32)─▶ every layer's ffn_in x (B, d) and ffn_out y (B, d)
      ─for each layer: L, ∂L (transcoder.py) → ∂W_dec ⊥ its rows → AdamW → W_dec's rows unit norm

DIR/qkv.json              settings, the model and corpus (name, sha256), per layer v_y (the output's variance) and
                          s_x = √(mean ‖x‖²) of the input and out_scale c (below), the state (step, tokens) and
                          each layer's last numbers
DIR/log.jsonl             a line a step: step, loss, fvu, aux, l0, dead (means over the layers), seconds (of training,
                          over every session), the step's own (step_seconds: wall clock, pass_seconds: the model's
                          pass, cpu_seconds: CPU time of every thread), and the per-layer lists under "layers"
DIR/checkpoints/step-N.npz  every layer's params, AdamW state and dead-latent counts, the step (the newest 2)
DIR/layer_NN/             layer NN's transcoder in SAELens's layout (features/saelens.py: cfg.json +
                          sae_weights.safetensors; hook_name blocks.NN.ln2.hook_normalized, hook_name_out
                          blocks.NN.hook_mlp_out), at every checkpoint and at the end

Initialisation (per layer, from step 0's batch): init_sae with the output's sample (W_dec's rows random unit
directions (rng(seed, layer)), W_enc = W_decᵀ, b_dec = the geometric median of y), b_enc = −x̄·W_enc (every
latent's pre-activation centred on the batch); JumpReLU's θ = threshold·s_x. JumpReLU's knobs are in the paper's
units, activations scaled to E‖x‖² = 1: ε = bandwidth·s_x. The trainer keeps log θ as its parameter (AdamW on
log θ, as the paper), the transcoder's "threshold" is exp(log θ).

The target in the input's units: an FFN's output is not the size of its input (SmolLM2: ‖y − ȳ‖ is 8-13 × ‖x‖),
and with W_dec's rows of norm 1 the activations would have to grow that much, one AdamW step at a time. While they
grow, the few latents that grew first win every token's TopK and the rest never fire again (measured on SmolLM2's
layer 18, 120 steps at lr 1e-3: 85 % of latents dead, held-out FVU 0.62). So each layer trains on y / c with
c = √v_y / s_x (fixed at step 0, kept in qkv.json as "out_scale"), and the transcoder written out predicts y
itself: W_dec, b_dec (and W_skip) times c (the same 120 steps: FVU 0.51; with b_enc centred, 0.51 → 0.506 and
dead 39 % → 24 %). Runs written before out_scale existed read it as 1 and resume as they began.

Measured (SmolLM2, all 30 layers, 4608 latents, k 32, 4096 tokens a step, float32, 2 cores shared with other
work): 27-37 s a step, of which the model's pass 15-25 s and the 30 transcoders ~12 s (~0.4 s each: the encoder's
product ~0.2 s, the rest sparse, transcoder.py); ~36-41 CPU seconds a step. A checkpoint of the 30 layers is 1.8 GB.

Resume bit for bit: a step's batch depends only on (seed, step), the model pass is deterministic, and a
checkpoint holds every array exactly (npz, no pickle); a run killed at any moment and started again ends with the
same arrays as one never stopped (the mechanisms of features/train.py: atomic fsynced checkpoints, the newest
two kept, Ctrl-C finishing the step).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import open_regular, real_directory, write_text
from ..runtime.io_json import Fields, parse_json
from ..train.loop import (CHECKPOINTS, LOG_FILE, _deferred_interrupt, checkpoint_files, remove_unfinished,
                          write_checkpoint)
from ..train.optim import AdamW
from .sae import SAE, SAEConfig, init_sae, normalize_decoder, project_decoder_grad, variance
from .saelens import save_saelens
from .train import BETAS, EPS, end_step, read_entries
from .transcoder import jumprelu_loss_and_grads, topk_loss_and_grads
from .transcoder_settings import ANOTHER_OUT, FORMAT, RUN_FILE, TranscoderSettings, read_run



def layer_dir(layer: int) -> str:
    return f"layer_{layer:02d}"


# ── the token stream ────────────────────────────────────────────────────────────

@dataclass
class Windows:
    """The corpus cut into windows: ids (T,) int32 one after another, starts (W + 1,), and the rows each
    window gives (its tokens past the first SKIP). Step s reads rows s·B.. of the windows in epoch order."""

    ids: np.ndarray
    starts: np.ndarray
    skip: int

    @property
    def rows(self) -> np.ndarray:
        return np.diff(self.starts) - self.skip                            # (W,)

    def order(self, seed: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(len(self.starts) - 1)

    def pieces(self, step: int, batch: int, seed: int) -> list[tuple[int, int, int]]:
        """(window, lo, hi) for step STEP's BATCH rows: rows lo..hi−1 of each window (after the skipped first)."""
        rows, per_epoch = self.rows, int(self.rows.sum())
        out, at, end = [], step * batch, (step + 1) * batch
        while at < end:
            epoch, offset = divmod(at, per_epoch)
            order = self.order(seed, epoch)
            cum = np.cumsum(rows[order])                                   # rows up to each window's end
            i = int(np.searchsorted(cum, offset, side="right"))
            w = int(order[i])
            lo = offset - (int(cum[i]) - int(rows[w]))
            hi = min(int(rows[w]), lo + end - at)
            out.append((w, lo, hi))
            at += hi - lo
        return out


def cut_windows(tokenizer, texts, context: int, skip: int, rows: int) -> Windows:
    """TEXTS (strings) tokenized and cut into windows of ≤ CONTEXT tokens (analysis.corpus.windows), until
    ROWS rows or the corpus's end; windows without a row past the skipped first are dropped."""
    from ..analysis.corpus import template_of, windows

    template = template_of(tokenizer)
    parts, starts, have = [], [0], 0
    for text in texts:
        if not text.strip():
            continue
        try:
            ids, _ = tokenizer.encode(text)
        except QkvError:
            continue
        for piece in windows(np.asarray(ids), context, template) if len(ids) else []:
            if len(piece) > skip:
                parts.append(piece.astype(np.int32))
                starts.append(starts[-1] + len(piece))
                have += len(piece) - skip
        if have >= rows:
            break
    if not parts:
        raise QkvError("the corpus gives no window of tokens; give a longer --file or another --corpus")
    return Windows(np.concatenate(parts), np.array(starts, np.int64), skip)


def ffn_rows(model, layers: list[int], win: Windows, pieces: list[tuple[int, int, int]]) -> dict[int, tuple]:
    """One pass over the windows of PIECES (right-padded, masked, blocks 0..max(LAYERS) only) → {layer: (x, y)}:
    x the FFN's input after its norm ("ffn_in"), y its output ("ffn_out"), (B, d) float32 each, rows in order."""
    from ..core.stack import transformer
    from ..core.trace import Recorder

    lengths = np.array([win.starts[w + 1] - win.starts[w] for w, _, _ in pieces])
    ids = np.zeros((len(pieces), int(lengths.max())), np.int64)                      # (b, n)
    for i, (w, _, _) in enumerate(pieces):
        ids[i, :lengths[i]] = win.ids[win.starts[w]:win.starts[w + 1]]
    mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)     # (b, n)
    rec = Recorder(layers=layers, keep=("ffn_in", "ffn_out"))
    transformer(model.weights, model.config, ids, mask, rec=rec, stop=max(layers) + 1)
    s = win.skip
    out = {}
    for layer in layers:
        got = rec.store[layer]
        x = np.concatenate([got["ffn_in"][i, s + lo:s + hi] for i, (_, lo, hi) in enumerate(pieces)])
        y = np.concatenate([got["ffn_out"][i, s + lo:s + hi] for i, (_, lo, hi) in enumerate(pieces)])
        out[layer] = (np.ascontiguousarray(x, np.float32), np.ascontiguousarray(y, np.float32))   # (B, d) each
    return out


# ── one layer's trainer ─────────────────────────────────────────────────────────

class LayerTrainer:
    """A layer's transcoder, its AdamW (on log θ for JumpReLU) and dead-latent counts."""

    def __init__(self, sae: SAE, settings: TranscoderSettings, variance: float, scale: float, out_scale: float = 1.0):
        """SAE in training units (it predicts y / OUT_SCALE); VARIANCE v_y and SCALE s_x in the model's units."""
        self.sae, self.settings, self.variance, self.scale = sae, settings, float(variance), float(scale)
        self.out_scale = float(out_scale)
        self.params = {k: v for k, v in sae.params.items() if k != "threshold"}
        if settings.architecture == "jumprelu":
            self.params["log_threshold"] = np.log(sae.params["threshold"])
        self.opt = AdamW(self.params, lr=settings.lr, betas=BETAS, eps=EPS, weight_decay=0.0)
        self.since_fired = np.zeros(sae.config.d_sae, np.int64)

    def dead(self) -> np.ndarray:
        return self.since_fired >= self.settings.window()

    def step(self, x: np.ndarray, y: np.ndarray) -> dict:
        """One step on x (B, d_in), y (B, d_out) (the model's units); its numbers."""
        s, sae, c = self.settings, self.sae, self.out_scale
        dead = self.dead()
        if c != 1.0:
            y = y * np.float32(1 / c)                                          # (B, d_out) in training units
        v = self.variance / (c * c)                                           # FVU is the same in either units
        if s.architecture == "topk":
            st = topk_loss_and_grads(sae.params, sae.config, x, y, variance=v, dead=dead,
                                     k_aux=s.aux_k, aux_coef=s.aux_coef)
        else:
            st = jumprelu_loss_and_grads(sae.params, sae.config, x, y, variance=v, l0_coef=s.l0_coef,
                                         bandwidth=s.bandwidth * self.scale)
            g = st.grads.pop("threshold")
            st.grads["log_threshold"] = g * sae.params["threshold"]                 # ∂L/∂log θ = θ·∂L/∂θ
        if not np.isfinite(st.loss):
            raise QkvError(f"layer {sae.config.layer}'s loss became {st.loss}; lower --lr (now {s.lr:g})"
                           + (" or --l0-coef" if s.architecture == "jumprelu" else ""))
        project_decoder_grad(sae.params["W_dec"], st.grads["W_dec"])
        self.opt.step(st.grads)
        normalize_decoder(sae.params["W_dec"])
        if s.architecture == "jumprelu":
            np.exp(self.params["log_threshold"], out=sae.params["threshold"])
        self.since_fired += x.shape[0]
        self.since_fired[st.fired] = 0
        return {"loss": st.loss, "fvu": st.fvu, "aux": st.aux, "l0": st.l0, "dead": float(dead.mean())}

    def model_sae(self) -> SAE:
        """The transcoder in the model's units: W_dec, b_dec, W_skip times out_scale (a copy unless it is 1)."""
        c = self.out_scale
        if c == 1.0:
            return self.sae
        return SAE(self.sae.config, {k: v * np.float32(c) if k in OUTPUT_SIDE else v.copy()
                                     for k, v in self.sae.params.items()})

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """What a resume needs (views, not copies: the checkpoint is written before the next step)."""
        out = {f"{prefix}param/{k}": v for k, v in self.params.items()}
        out[f"{prefix}optim/step"] = np.array([self.opt.step_count], np.int64)     # AdamW.state_dict's, uncopied
        for k in self.params:
            out[f"{prefix}optim/m.{k}"], out[f"{prefix}optim/v.{k}"] = self.opt.m[k], self.opt.v[k]
        out[f"{prefix}since_fired"] = self.since_fired
        return out

    def check(self, arrays: dict[str, np.ndarray], prefix: str) -> str | None:
        """What is wrong with a checkpoint's arrays for this layer, None if nothing."""
        want = {f"{prefix}param/{k}": v for k, v in self.params.items()}
        want[f"{prefix}since_fired"] = self.since_fired
        for name, like in want.items():
            a = arrays.get(name)
            if a is None:
                return f"it has no {name}"
            if a.shape != like.shape or a.dtype != like.dtype:
                return f"its {name} is {a.dtype} {a.shape}, not {like.dtype} {like.shape}"
            if (name.endswith("since_fired") and (a < 0).any()) or not np.isfinite(a).all():
                return f"its {name} holds values out of range"
        return None

    def load(self, arrays: dict[str, np.ndarray], prefix: str) -> None:
        for k, v in self.params.items():
            v[...] = arrays[f"{prefix}param/{k}"]
        self.opt.load_state_dict({k[len(prefix) + 6:]: v for k, v in arrays.items() if k.startswith(prefix + "optim/")})
        self.since_fired[...] = arrays[f"{prefix}since_fired"]
        if self.settings.architecture == "jumprelu":
            np.exp(self.params["log_threshold"], out=self.sae.params["threshold"])


OUTPUT_SIDE = ("W_dec", "b_dec", "W_skip")           # the params in y's units


def output_scale(v_y: float, s_x: float) -> float:
    """c = √v_y / s_x: how much larger the FFN's output varies than its input's size (the module docstring)."""
    c = math.sqrt(v_y) / s_x if s_x > 0 else float("inf")
    if not 0 < c < float("inf"):
        raise QkvError(f"the FFN's input and output on the first batch have sizes {s_x:g} and {math.sqrt(v_y):g}: "
                       "nothing to learn")
    return c


def fresh_layer(settings: TranscoderSettings, x: np.ndarray, y: np.ndarray, layer: int, model_name: str) -> SAE:
    """A new transcoder for LAYER from step 0's rows x (B, d_in), y (B, d_out) (the module docstring), in the
    units of its Y: pass y / out_scale to train in the input's units."""
    cfg = SAEConfig(d_in=x.shape[1], d_sae=settings.latents, k=settings.k, apply_b_dec_to_input=False,
                    model=model_name, layer=layer, site="ffn_in", architecture=settings.architecture,
                    d_out=y.shape[1], site_out="ffn_out")
    if x.shape[1] != y.shape[1]:
        raise QkvError(f"an FFN reads {x.shape[1]} and writes {y.shape[1]} numbers; W_enc = W_decᵀ needs them equal")
    plain = SAEConfig(d_in=x.shape[1], d_sae=settings.latents, architecture="relu", apply_b_dec_to_input=False,
                      d_out=y.shape[1], site_out="ffn_out")
    params = init_sae(plain, y, [settings.seed, layer]).params    # b_dec: y's median
    params["b_enc"] = -(x.mean(axis=0, dtype=np.float64) @ params["W_enc"]).astype(np.float32)   # (d_sae,) centred
    if settings.architecture == "jumprelu":
        params["threshold"] = np.full(settings.latents, settings.threshold * input_scale(x), np.float32)
    if settings.skip:
        params["W_skip"] = np.zeros((x.shape[1], y.shape[1]), np.float32)
    return SAE(cfg, params)


def input_scale(x: np.ndarray) -> float:
    """s_x = √(mean ‖x‖²): the paper's JumpReLU knobs are for activations scaled to E‖x‖² = 1."""
    return float(np.sqrt(np.mean(np.sum(np.asarray(x, np.float64) ** 2, axis=1))))


# ── a run in a directory ────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Source:
    """What a run trains on: the model (its name or path, as qkv.load takes it) and the corpus."""

    model: str
    corpus: str
    sha256: str
    layers: tuple[int, ...]
    d: int


class TranscoderRun:
    """A run in OUT: new (OUT missing or empty) or resumed from its newest checkpoint (`open_transcoder_run`)."""

    def __init__(self, out: str | Path, settings: TranscoderSettings, model, source: Source, win: Windows):
        self.out, self.settings, self.model, self.source, self.win = Path(out), settings.check(), model, source, win
        self.step = 0
        self.seconds = 0.0
        self.layers_at: int | None = None                                 # the step whose layers this process wrote
        self.resumed_from: Path | None = None
        self.skipped: list[str] = []
        if int(win.rows.sum()) < settings.batch:
            raise QkvError(f"the corpus gives {int(win.rows.sum()):,} tokens, fewer than one --batch of "
                           f"{settings.batch:,}; give a smaller --batch or a longer corpus")
        saved = read_run(self.out)
        if saved is None:
            self._fresh()
        else:
            self._agree(saved)
            self.trainers = {layer: self._trainer(layer, saved["layers"][layer]) for layer in source.layers}
            self._resume()
        self.start_step = self.step
        self.log = read_entries(self.out / LOG_FILE, upto=self.step)
        write_text(self.out / LOG_FILE, "".join(json.dumps(e) + "\n" for e in self.log))

    # setting up -----------------------------------------------------------------

    def _fresh(self) -> None:
        s, src = self.settings, self.source
        rows = ffn_rows(self.model, list(src.layers), self.win, self.win.pieces(0, s.batch, s.seed))
        self.trainers = {}
        for layer, (x, y) in rows.items():
            v = variance(y)
            if not 0 < v < float("inf"):
                raise QkvError(f"layer {layer}'s FFN output has variance {v:g} on the first batch: nothing to learn")
            s_x = input_scale(x)
            c = output_scale(v, s_x)
            sae = fresh_layer(s, x, (y / c).astype(np.float32), layer, src.model)
            self.trainers[layer] = LayerTrainer(sae, s, v, s_x, c)
        try:
            real_directory(self.out, (CHECKPOINTS,))
        except OSError as e:
            raise QkvError(f"cannot write to {self.out}: {e.strerror}; choose a writable directory") from None
        write_text(self.out / RUN_FILE, json.dumps(self.meta(), indent=1))
        write_text(self.out / LOG_FILE, "")

    def _trainer(self, layer: int, numbers: dict) -> LayerTrainer:
        """A layer's trainer shaped for a resume (its arrays come from the checkpoint)."""
        s, d = self.settings, self.source.d
        cfg = SAEConfig(d_in=d, d_sae=s.latents, k=s.k, apply_b_dec_to_input=False, model=self.source.model,
                        layer=layer, site="ffn_in", architecture=s.architecture, d_out=d, site_out="ffn_out")
        params = {name: np.zeros(shape, np.float32) for name, shape in cfg.shapes().items()}
        if s.architecture == "jumprelu":
            params["threshold"][:] = 1
        if s.skip:
            params["W_skip"] = np.zeros((d, d), np.float32)
        return LayerTrainer(SAE(cfg, params), s, numbers["variance"], numbers["scale"], numbers["out_scale"])

    def _agree(self, saved: dict) -> None:
        for f in fields(TranscoderSettings):
            if f.name == "checkpoint_every":                          # changes no number: a resume may change it
                continue
            have, want = getattr(saved["settings"], f.name), getattr(self.settings, f.name)
            if have != want:
                raise QkvError(f"{self.out} holds transcoders trained with --{f.name.replace('_', '-')} {have}, not "
                               f"{want}; give the same settings to continue it, or another --out")
        for key in ("model", "sha256", "layers", "d"):
            have, want = saved["source"][key], getattr(self.source, key)
            if have != want:
                what = {"sha256": "corpus (its sha256)"}.get(key, key)
                raise QkvError(f"{self.out} holds transcoders trained on another {what} ({have}, not {want}); give "
                               "the same model and corpus to continue it, or another --out")

    def meta(self, final: dict | None = None) -> dict:
        src = self.source
        meta = {"qkv": "transcoders", "format": FORMAT, "settings": self.settings.to_json(),
                "source": {"model": src.model, "corpus": src.corpus, "sha256": src.sha256, "layers": list(src.layers),
                           "d": src.d},
                "state": {"step": self.step, "tokens": self.step * self.settings.batch,
                          "seconds": round(self.seconds, 3)},
                "layers": {str(layer): {"variance": t.variance, "scale": t.scale, "out_scale": t.out_scale}
                           for layer, t in self.trainers.items()}}
        last = self.log[-1] if getattr(self, "log", None) else None
        if last is not None:
            for i, layer in enumerate(src.layers):
                meta["layers"][str(layer)].update({k: last["layers"][k][i] for k in ("fvu", "l0", "dead")})
        if final is not None:
            meta["final"] = final
        return meta

    # checkpoints ------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        return checkpoint_files(self.out)

    def save_checkpoint(self) -> Path:
        """Every layer's arrays + the step (`train.loop.write_checkpoint`: atomic, the newest KEEP stay); then the
        layers' SAELens directories and qkv.json."""
        arrays = {"step": np.array([self.step], np.int64)}
        for layer, t in self.trainers.items():
            arrays.update(t.arrays(f"L{layer}/"))
        meta = {"qkv": "transcoders", "format": FORMAT, "settings": self.settings.to_json(), "seconds": self.seconds}
        path = write_checkpoint(self.out, self.step, arrays, meta)
        self.write_layers()
        return path

    def write_layers(self, final: dict | None = None) -> list[Path]:
        """DIR/layer_NN/ (SAELens's layout) for every layer, then qkv.json (with FINAL, the run's last numbers).
        The layers are not written again when this process wrote them at this step (the last checkpoint's)."""
        written = [self.out / layer_dir(layer) for layer in self.trainers]
        if self.layers_at != self.step:
            for layer, t in self.trainers.items():
                save_saelens(t.model_sae(), self.out / layer_dir(layer), context_size=self.settings.context,
                             dataset_path=self.source.corpus)
            self.layers_at = self.step
        write_text(self.out / RUN_FILE, json.dumps(self.meta(final), indent=1))
        return written

    def _resume(self) -> None:
        remove_unfinished(self.out)                                      # writes a kill interrupted
        for path in reversed(self.checkpoints()):
            try:
                with open_regular(path) as f, np.load(f, allow_pickle=False) as z:
                    meta = Fields(parse_json(bytes(z["meta"]), f"{path}'s meta", ANOTHER_OUT), f"{path}'s meta")
                    saved = TranscoderSettings.from_json(meta.object("settings").data, f"{path}'s meta")
                    seconds = meta.number("seconds", 0, 1e12, 0.0)
                    arrays = {k: z[k] for k in z.files if k != "meta"}
            except (OSError, ValueError, KeyError, EOFError, QkvError):
                continue                                                  # unreadable (a kill mid-write)
            if replace(saved, checkpoint_every=self.settings.checkpoint_every) != self.settings:
                raise QkvError(f"{path} was written with other settings than {self.out / RUN_FILE}; {ANOTHER_OUT}")
            step = arrays.get("step")
            wrong = None if step is not None and step.shape == (1,) and 0 <= step[0] <= self.settings.steps \
                else "its step is missing or out of range"
            for layer, t in self.trainers.items():
                wrong = wrong or t.check(arrays, f"L{layer}/")
            if wrong is None:
                try:
                    for layer, t in self.trainers.items():
                        t.load(arrays, f"L{layer}/")
                except QkvError as e:
                    wrong = str(e)
            if wrong is not None:
                self.skipped.append(f"{path.name}: {wrong}")
                continue
            self.step, self.seconds, self.resumed_from = int(step[0]), seconds, path
            return
        raise _Restart()

    # training ---------------------------------------------------------------

    def train(self, on_step: Callable[[dict], None] = lambda e: None) -> None:
        """The steps left; a checkpoint every N and at the end; Ctrl-C → `Interrupted` after saving."""
        s = self.settings
        layers = list(self.source.layers)
        with _deferred_interrupt() as interrupted, open(self.out / LOG_FILE, "a", encoding="utf-8") as log:
            while self.step < s.steps:
                t0, cpu = time.perf_counter(), time.process_time()
                rows = ffn_rows(self.model, layers, self.win, self.win.pieces(self.step, s.batch, s.seed))
                t_pass = time.perf_counter() - t0
                per = [self.trainers[layer].step(*rows.pop(layer)) for layer in layers]
                self.step += 1
                took = time.perf_counter() - t0
                self.seconds += took
                entry = {"step": self.step, **{k: float(np.mean([p[k] for p in per]))
                                               for k in ("loss", "fvu", "aux", "l0", "dead")},
                         "seconds": round(self.seconds, 3), "step_seconds": round(took, 3),
                         "pass_seconds": round(t_pass, 3), "cpu_seconds": round(time.process_time() - cpu, 3),
                         "layers": {k: [p[k] for p in per] for k in ("fvu", "l0", "dead")}}
                end_step(self, entry, log, on_step, interrupted)

    def sae(self, layer: int) -> SAE:
        """Layer LAYER's transcoder in the model's units (as written to its directory)."""
        return self.trainers[layer].model_sae()


class _Restart(Exception):
    """A run directory without a readable checkpoint: begin it again."""


def open_transcoder_run(out: str | Path, settings: TranscoderSettings, model, source: Source,
                        win: Windows) -> TranscoderRun:
    """`TranscoderRun(...)`, starting over from step 0 when OUT holds settings but no readable checkpoint yet."""
    try:
        return TranscoderRun(out, settings, model, source, win)
    except _Restart:
        out = Path(out)
        for name in (RUN_FILE, LOG_FILE):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
        return TranscoderRun(out, settings, model, source, win)
