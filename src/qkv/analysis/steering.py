"""Steering vectors that are not SAE features: contrastive activation addition and directional ablation, kept in
llama.cpp's control-vector files (qkv.checkpoints.control_vector) so that one vector steers qkv and llama.cpp.

Where: every vector here lives on the stream leaving a block, qkv's hook point "L.residual_out" (= "(L+1).residual",
the stream entering block L + 1), the point llama.cpp adds its direction.L to. A layer L here is that block: the
same number in qkv, in the file and in llama.cpp (blocks 1..L−1; llama.cpp cannot steer block 0's output).

Contrastive activation addition (Rimsky et al. 2023, "Steering Llama 2 via Contrastive Activation Addition"):
the difference of the mean activations of two sets of texts, at one layer,

    v_L = mean_{t ∈ positive} x_L(t) − mean_{t ∈ negative} x_L(t)             (d_model,)

x_L(t) being the stream leaving block L at the text's last token (position="last": the one position that has read
the whole text, as Rimsky et al. read the answer's token), or its mean over the text's tokens but the first
(position="mean": the first position is the attention sink, whose stream is far larger than the rest on most
decoders and says nothing about the text). The sets need not be paired: a difference of means is the mean of the
pairs' differences when they are. The vector is stored as it is (not normalised), so scale 1 moves the stream by
the gap between the two sets' means, and steering adds

    x_L ← x_L + scale · v_L            at every position, every pass (the prompt's, then each new token's)

Directional ablation (Arditi et al. 2024, "Refusal in language models is mediated by a single direction"): a unit
direction r̂'s component removed from the stream everywhere,

    x ← x − (x·r̂) r̂                    at the embeddings ("0.residual"), after attention ("L.residual_mid") and
                                        leaving every block ("L.residual_out"), every position

so no block reads r̂ and none writes it (a parallel block, which has no stream between attention and its FFN,
is ablated at its input and output).

    v = contrastive_vector(model, ["I love it", …], ["I hate it", …], layers=[12])   # {12: (d_model,)}
    model.with_hooks(steering_hooks({12: v[12]}, scale=4)).generate("The movie was", 20)
    model.with_hooks(ablation_hooks(v[12], model.config)).generate("The movie was", 20)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..checkpoints.control_vector import ControlVector, read_control_vector
from ..runtime.errors import QkvError

if TYPE_CHECKING:
    from ..core.config import ModelConfig
    from ..models.model import Model

POSITIONS = ("last", "mean")
POINT = "residual_out"                  # where a vector of layer L is read and added: "L.residual_out"


def check_layers(layers: Iterable[int], n_layers: int) -> list[int]:
    """LAYERS as 1..L−1 (negative counts from the end), sorted, or one error (llama.cpp steers no other)."""
    out = set()
    for layer in layers:
        full = layer + n_layers if layer < 0 else layer
        if not 1 <= full < n_layers:
            raise QkvError(f"layer {layer} cannot carry a control vector: the model's blocks are 0..{n_layers - 1} "
                           f"and llama.cpp steers the output of blocks 1..{n_layers - 1}; choose one of those")
        out.add(int(full))
    if not out:
        raise QkvError("no layer given; choose one of the model's blocks from 1 on, e.g. --layer 12")
    return sorted(out)


def text_activations(model: "Model", text: str, layers: Sequence[int], position: str = "last",
                     point: str = POINT) -> dict[int, np.ndarray]:
    """{L: x_L} (d_model,) of one text: the stream at "L.POINT", at its last token or averaged over its tokens but
    the first (module doc)."""
    if position not in POSITIONS:
        raise QkvError(f"unknown position {position!r}; give one of {', '.join(POSITIONS)}")
    routed = [layer for layer in layers if point in ("neurons", "ffn_pre") and model.config.moe_layer(layer)]
    if routed:
        raise QkvError(f"layer {routed[0]} of {model.name} routes its FFN among experts and records no {point!r} "
                       "(one d_ff hidden); read another point, e.g. residual_out")
    trace = model.run(text, layers=list(layers), keep=(point,))
    out = {}
    for layer in layers:
        value = getattr(trace.layer(layer), point)
        if value is None:                                       # a MoE layer's neurons, a norm a family lacks
            raise QkvError(f"layer {layer} of {model.name} records no {point!r} (see qkv.core.trace); read another "
                           "point, e.g. residual_out")
        x = np.asarray(value, dtype=np.float64)                                         # (n, width)
        out[layer] = x[-1] if position == "last" or len(x) == 1 else x[1:].mean(axis=0)  # (d_model,)
    return out


def side_activations(model: "Model", texts: Sequence[str], layers: Sequence[int], position: str = "last",
                     progress: Callable[[int, int], None] | None = None,
                     point: str = POINT) -> dict[int, np.ndarray]:
    """{L: X_L (N, width) float64}: each text's activation at "L.POINT" (`text_activations`), one pass a text;
    progress(done, total) after each."""
    if not texts:
        raise QkvError("no text to read; give at least one")
    rows: dict[int, list[np.ndarray]] = {layer: [] for layer in layers}
    for i, text in enumerate(texts):
        for layer, x in text_activations(model, text, layers, position, point).items():
            rows[layer].append(x)
        if progress is not None:
            progress(i + 1, len(texts))
    return {layer: np.stack(xs) for layer, xs in rows.items()}


def mean_activations(model: "Model", texts: Sequence[str], layers: Sequence[int],
                     position: str = "last") -> dict[int, np.ndarray]:
    """{L: mean over TEXTS of x_L} (d_model,) float64."""
    return {layer: x.mean(axis=0) for layer, x in side_activations(model, texts, layers, position).items()}


def contrastive_vector(model: "Model", positive: Sequence[str], negative: Sequence[str], layers: Iterable[int],
                       position: str = "last") -> dict[int, np.ndarray]:
    """Contrastive activation addition: {L: mean(positive) − mean(negative)} (d_model,) float64 at each of LAYERS
    (1..L−1; module doc)."""
    return contrast(model, positive, negative, layers, position).vectors


@dataclass
class Contrast:
    """Both sides' activations at each layer ({L: (N±, d_model)}), and the difference of their means."""
    positive: dict[int, np.ndarray]
    negative: dict[int, np.ndarray]

    @property
    def vectors(self) -> dict[int, np.ndarray]:
        return {layer: self.positive[layer].mean(axis=0) - self.negative[layer].mean(axis=0)
                for layer in self.positive}                                              # {L: (d_model,)}

    def summary(self) -> list[dict]:
        """Per layer: ‖v‖, the mean ‖x‖ of the texts' streams (what scale 1 is against), and each side's mean
        projection on v̂ (their gap is ‖v‖; how far apart the sides' texts lie along it, per text: the overlap)."""
        rows = []
        for layer, v in self.vectors.items():
            norm = float(np.linalg.norm(v))
            r = v / norm if norm > 0 else v                                              # (d_model,)
            plus, minus = self.positive[layer] @ r, self.negative[layer] @ r             # (N+,), (N−,)
            both = np.concatenate([self.positive[layer], self.negative[layer]])          # (N, d_model)
            rows.append({"layer": layer, "norm": norm,
                         "stream_norm": float(np.linalg.norm(both, axis=1).mean()),
                         "positive_projection": float(plus.mean()), "negative_projection": float(minus.mean()),
                         "separated": bool(plus.min() > minus.max())})
        return rows


def contrast(model: "Model", positive: Sequence[str], negative: Sequence[str], layers: Iterable[int],
             position: str = "last") -> Contrast:
    """Both sides' activations at LAYERS (1..L−1), for `contrastive_vector` and its summary."""
    layers = check_layers(layers, model.config.n_layers)
    if not positive or not negative:
        raise QkvError("contrastive activation addition needs texts on both sides; give --positive and --negative "
                       "texts (or files of them, one a line)")
    return Contrast(side_activations(model, positive, layers, position),
                    side_activations(model, negative, layers, position))


def steering_hooks(directions: Mapping[int, np.ndarray], scale: float = 1.0) -> dict:
    """{"L.residual_out": fn}: fn adds SCALE · directions[L] to every position of the stream leaving block L (the
    point llama.cpp adds its direction.L to), for model.run/generate(hooks=...) or model.with_hooks(...)."""
    hooks = {}
    for layer, v in directions.items():
        add = float(scale) * np.asarray(v, dtype=np.float64)                            # (d_model,)

        def steer(value: np.ndarray, layer: int, add: np.ndarray = add) -> np.ndarray:
            if value.shape[-1] != add.shape[0]:
                raise QkvError(f"the steering vector is {add.shape[0]} wide and the stream at layer {layer} is "
                               f"{value.shape[-1]}; give a vector made on this model")
            return value + add.astype(value.dtype)                                      # (B, n, d_model)

        hooks[f"{int(layer)}.{POINT}"] = steer
    return hooks


def basis(directions: np.ndarray) -> np.ndarray:
    """Q (k, d) float64: orthonormal rows spanning DIRECTIONS ((d,) or (k, d)); one direction's is r̂ = r / ‖r‖.
    One error for a zero, dependent or non-finite set."""
    r = np.atleast_2d(np.asarray(directions, dtype=np.float64))                        # (k, d)
    if not np.isfinite(r).all() or r.shape[0] == 0:
        raise QkvError("the direction to ablate is not finite; give a finite vector")
    q, tri = np.linalg.qr(r.T)                                                          # (d, k), (k, k)
    small = np.abs(np.diag(tri)) <= 1e-12 * max(1.0, float(np.abs(r).max()))
    if small.any():
        raise QkvError("a direction to ablate is zero, or lies in the span of the others; give directions that "
                       "point somewhere new")
    return q.T                                                                          # (k, d)


def ablation_hooks(directions: np.ndarray, config: "ModelConfig") -> dict:
    """Directional ablation (Arditi et al. 2024): hooks removing the component along DIRECTIONS ((d,) one
    direction, x ← x − (x·r̂) r̂; (k, d) several, x ← x − Qᵀ(Q x) over their orthonormal basis Q) from the
    embeddings, the stream after attention (not on a parallel block, which has none) and every block's output,
    at every position (module doc)."""
    q = basis(directions)                                                               # (k, d_model)
    if q.shape[1] != config.d_model:
        raise QkvError(f"the direction to ablate is {q.shape[1]} wide and the model's stream is {config.d_model}; "
                       "give a direction made on this model")

    def ablate(value: np.ndarray, layer: int) -> np.ndarray:
        qq = q.astype(value.dtype)                                                      # (k, d_model)
        return value - (value @ qq.T) @ qq                                              # (B, n, d_model)

    hooks = {"0.residual": ablate, POINT: ablate}
    if not config.parallel_residual:
        hooks["residual_mid"] = ablate
    return hooks


# ── the command line's grammar: --steer FILE[@LAYER][:SCALE], --ablate-direction FILE[@LAYER] ────────────

def parse_vector_spec(text: str, flag: str = "--steer", scaled: bool = True) -> tuple[str, int | None, float]:
    """"vec.gguf@12:4" → ("vec.gguf", 12, 4.0); "vec.gguf:-2" → ("vec.gguf", None, -2.0); "vec.gguf" →
    ("vec.gguf", None, 1.0). Read from the right, so a path may hold ':' or '@' (the whole of an existing file's
    name wins). One error unless the file exists."""
    text = str(text).strip()
    path, scale = text, 1.0
    head, sep, tail = text.rpartition(":")
    if scaled and sep and head and not Path(text).is_file():
        try:
            scale = float(tail)
            path = head
        except ValueError:
            pass
        if not np.isfinite(scale):
            raise QkvError(f"{flag} {text!r}: the scale {tail!r} is not a finite number; give e.g. {head}:4")
    layer = None
    head, sep, tail = path.rpartition("@")
    if sep and head and not Path(path).is_file():
        try:
            layer = int(tail)
            path = head
        except ValueError:
            pass
    if not Path(path).is_file():
        form = "FILE[@LAYER][:SCALE]" if scaled else "FILE[@LAYER]"
        raise QkvError(f"{flag} {text!r}: no control-vector file {path!r}; give {flag} {form}, FILE a .gguf that "
                       "`qkv steer make` or llama.cpp's cvector-generator wrote")
    return path, layer, scale


def pick_directions(vector: ControlVector, layer: int | None, flag: str = "--steer") -> dict[int, np.ndarray]:
    """The directions a spec applies: all of the file's (no @LAYER), the one at LAYER, or the file's only direction
    moved to LAYER (a vector made at one layer, applied at another)."""
    if layer is None:
        return dict(vector.directions)
    if layer in vector.directions:
        return {layer: vector.directions[layer]}
    if len(vector.directions) == 1:
        return {layer: next(iter(vector.directions.values()))}
    have = ", ".join(map(str, vector.directions))
    raise QkvError(f"{flag} {vector.path}@{layer}: the file holds directions for layers {have}, not {layer}; choose "
                   f"one of those, or drop @{layer} to apply them all")


def load_steering(model: "Model", specs: Sequence[str]) -> dict:
    """Hooks for --steer SPEC… (FILE[@LAYER][:SCALE], each file checked against MODEL): the vectors, scaled and
    summed per layer, added where llama.cpp adds them."""
    total: dict[int, np.ndarray] = {}
    for spec in specs:
        path, layer, scale = parse_vector_spec(spec)
        vector = read_control_vector(path)
        picked = pick_directions(vector, None if layer is None else _layer(model, layer, spec), "--steer")
        ControlVector(picked, vector.model_hint, path).check_fits(model.config.n_layers, model.config.d_model,
                                                                 model.name)
        for n, v in picked.items():
            total[n] = total.get(n, 0.0) + scale * v.astype(np.float64)                  # (d_model,)
    return steering_hooks(total)


def load_ablation(model: "Model", specs: Sequence[str]) -> dict:
    """Hooks for --ablate-direction SPEC… (FILE[@LAYER]: the file's direction at LAYER, or its only one): the span of
    the directions removed everywhere (`ablation_hooks`)."""
    rows = []
    for spec in specs:
        path, layer, _ = parse_vector_spec(spec, "--ablate-direction", scaled=False)
        vector = read_control_vector(path)
        if layer is None and len(vector.directions) > 1:
            have = ", ".join(map(str, vector.directions))
            raise QkvError(f"--ablate-direction {spec}: the file holds directions for layers {have}; say which one "
                           f"to remove everywhere, e.g. {path}@{next(iter(vector.directions))}")
        picked = pick_directions(vector, None if layer is None else _layer(model, layer, spec), "--ablate-direction")
        ControlVector(picked, vector.model_hint, path).check_fits(model.config.n_layers, model.config.d_model,
                                                                 model.name)
        rows.append(next(iter(picked.values())))
    return ablation_hooks(np.stack(rows), model.config)


def _layer(model: "Model", layer: int, spec: str) -> int:
    """A spec's @LAYER (negative from the end) as 1..L−1, or one error naming the spec."""
    n = model.config.n_layers
    full = layer + n if layer < 0 else layer
    if not 1 <= full < n:
        raise QkvError(f"{spec}: layer {layer} cannot carry a control vector: {model.name}'s blocks are 0..{n - 1} and "
                       f"llama.cpp steers the output of blocks 1..{n - 1}; choose one of those")
    return full
