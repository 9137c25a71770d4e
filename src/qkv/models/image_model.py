"""A Vision Transformer (ViT) as qkv holds it: the same engine as every text model, whose tokens are an
image's patches (qkv.inputs.images) and whose "vocabulary" is the classifier's labels.

    image ─preprocess─▶ pixel_values (C, H, W) ─patches_of─▶ (P, C·p·p)
      ─embed─▶ X = [CLS; patches·W_patch + b_patch] + P      (1 + P, d_model)
      └─▶ L × pre-norm block (LayerNorm, attention, LayerNorm, GELU FFN) ─▶ final LayerNorm
      └─▶ logits = H·W_vocab + b_vocab, read at [CLS] (row 0): the classifier

Nothing of the pass is new: `transformer` runs it with the patches as `tokens` (blocks.embed projects them
and puts [CLS] first), so hooks, ablation, recording, the tape and its backward are the text models' own.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Iterable, Mapping

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.hooks import HookFn, Hooks
from ..inputs.images import SUFFIXES, ImageProcessing, patch_labels, patches_of, preprocess
from .model import Model, Output
from ..core.labels import shorten
from ..core.trace import DEFAULT_KEEP, Trace
from ..core.weights import Weights


class ImageModel(Model):
    """A loaded ViT: config, weights (W_patch, b_patch; tok_embed[0] is [CLS]), how its images are
    processed, and the names of its labels (config.json's id2label)."""

    def __init__(self, config: ModelConfig, weights: Weights, tokenizer=None, name: str = "model",
                 processing: ImageProcessing | None = None, labels: list[str] | None = None,
                 source: str | None = None):
        super().__init__(config, weights, None, name, source)
        self.processing = processing or ImageProcessing.of(None, config)
        self.labels = labels if labels is not None else [str(i) for i in range(config.vocab_size)]

    def __repr__(self) -> str:
        c = self.config
        return (f"ImageModel({self.name!r}: {c.family}, {c.image_size[0]}×{c.image_size[1]} pixels in "
                f"{c.grid[0]}×{c.grid[1]} patches, L={c.n_layers}, H={c.n_heads}, d_model={c.d_model}, "
                f"{len(self.labels) if self.weights.W_vocab is not None else 'no'} labels)")

    def with_config(self, **changes) -> "ImageModel":
        return ImageModel(self.config.with_(**changes), self.weights, None, self.name, self.processing, self.labels,
                          self.source)

    def astype(self, dtype) -> "ImageModel":
        return ImageModel(self.config, self.weights.astype(dtype), None, self.name, self.processing, self.labels,
                          self.source)

    # inputs ------------------------------------------------------------------

    def pixel_values(self, image) -> tuple[np.ndarray, np.ndarray]:
        """An image (a path, a PIL image, a uint8 array) → (shown (H, W, C) uint8, pixel_values (C, H, W)
        float32), processed as the checkpoint's preprocessor_config.json says."""
        return preprocess(image, self.processing, self.config)

    def check_pixels(self, pixel_values) -> np.ndarray:
        """pixel_values (B, C, H, W) or (C, H, W), finite numbers of this model's size → (B, C, H, W)."""
        x = np.asarray(pixel_values)
        x = x[None] if x.ndim == 3 else x
        c = self.config
        want = (c.num_channels, *c.image_size)
        if x.ndim != 4 or x.shape[1:] != want or not np.issubdtype(x.dtype, np.floating) or x.shape[0] == 0:
            raise QkvError(f"pixel_values must be floats of shape (B, {', '.join(map(str, want))}), got "
                           f"{x.dtype} {x.shape}; give model.pixel_values(image)[1] for an image")
        if not np.isfinite(x).all():
            raise QkvError("pixel_values hold inf or NaN; give finite numbers")
        return x.astype(self.dtype, copy=False)

    def encode(self, text):
        raise QkvError(f"{self.name} reads images, not text: look at one with qkv show IMAGE --model {self.name} "
                       "(from Python: model.run(image)), or give a text model")

    def check_image(self, image) -> None:
        """A string that names no file and no image file is text given to an image model: one clear error (not
        "no image file The cat sat on the mat")."""
        if isinstance(image, str) and not os.path.exists(image) and (
                os.path.splitext(image)[1].lower() not in SUFFIXES or "\n" in image):
            raise QkvError(f"{self.name} reads images, not text: {shorten(image, 40)!r} is no image file; give the "
                           "path of a PNG or JPEG file (or a text model)")

    def _ids(self, batch: int) -> np.ndarray:
        """The ids of BATCH images (B, 1 + P): [CLS] is row 0 of the table; the patches read none (their tokens).
        (B, P) without a class token (SigLIP)."""
        c = self.config
        return np.zeros((batch, int(c.class_token) + c.grid[0] * c.grid[1]), np.int64)

    # the passes --------------------------------------------------------------

    def forward(self, pixel_values, attention_mask=None, token_type_ids=None, *, attentions: bool = True,
                ablate: Iterable[tuple[int, int]] | None = None, how: str = "zero",
                hooks: Mapping[str, HookFn] | None = None) -> Output:
        """pixel_values (B, C, H, W) → Output(hidden (B, 1 + P, d), logits (B, labels) of [CLS] | None (a ViT
        without classifier), attentions (L, B, H, 1 + P, 1 + P)): transformers' ViTForImageClassification."""
        if attention_mask is not None or token_type_ids is not None:
            raise QkvError("an image model reads every patch: give pixel_values only")
        x = self.check_pixels(pixel_values)
        ids = self._ids(len(x))
        out = self._output(ids, np.ones_like(ids), attentions, self.ablation(ablate, how),
                           Hooks.of(self.hooks, hooks, self.config, self.name), tokens=patches_of(x, self.config))
        return replace(out, logits=None if out.logits is None else out.logits[:, 0])

    def run(self, image=None, *, pixel_values=None, layers: Iterable[int] | None = None,
            keep: Iterable[str] = DEFAULT_KEEP, heads: Iterable[int] | None = None,
            ablate: Iterable[tuple[int, int]] | None = None, how: str = "zero",
            hooks: Mapping[str, HookFn] | None = None, top: int = 32) -> Trace:
        """One image through the model, keeping what you ask for (as Model.run): the trace's tokens are
        "[CLS]", "patch (0, 0)", … row by row; trace.image is the image the model read (H, W, C) uint8 and
        trace.grid its patches' (rows, columns); trace.logits (1 + P, V): row 0, [CLS]'s, is the classification.
        Give IMAGE (a path, a PIL image, a uint8 array) or PIXEL_VALUES (C, H, W) already processed."""
        if (image is None) == (pixel_values is None):
            raise QkvError("give an image (a path, a PIL image or a uint8 array) or pixel_values, one of them")
        shown = None
        if pixel_values is None:
            self.check_image(image)
            shown, pixel_values = self.pixel_values(image)
        x = self.check_pixels(pixel_values)
        if x.shape[0] != 1:
            raise QkvError(f"run reads one image; got a batch of {x.shape[0]}: use forward for batches")
        return self._trace(self._ids(1)[0], patch_labels(self.config), image if isinstance(image, str) else None,
                           layers, keep, heads, self.ablation(ablate, how),
                           Hooks.of(self.hooks, hooks, self.config, self.name), top, patches_of(x, self.config),
                           image=shown if shown is not None else _shown_of(pixel_values, self.processing),
                           grid=self.config.grid, label_names=None if self.weights.W_vocab is None else list(self.labels))

    def classify(self, image, k: int = 5) -> list[tuple[str, float]]:
        """The K most probable labels of IMAGE and their probabilities, softmax over [CLS]'s logits."""
        if self.weights.W_vocab is None:
            raise QkvError(f"{self.name} has no classifier (a ViTModel); load a ViTForImageClassification checkpoint")
        return top_labels(self.forward(self.pixel_values(image)[1], attentions=False).logits[0], self.labels, k)

    def generate(self, *args, **kwargs):
        raise QkvError(f"{self.name} is an image classifier: it writes no text; use run(image) or classify(image)")

    stream = chat = generate


def top_labels(logits: np.ndarray, names: list[str], k: int) -> list[tuple[str, float]]:
    """The K most probable of NAMES and their probabilities, softmax of LOGITS (V,) in float64, most probable first."""
    z = np.asarray(logits, np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    return [(names[i], float(p[i])) for i in np.argsort(-p, kind="stable")[:max(1, int(k))]]


def _shown_of(pixel_values: np.ndarray, processing: ImageProcessing) -> np.ndarray:
    """Processed pixel_values (C, H, W) back to a viewable (H, W, C) uint8 image (the normalisation undone)."""
    x = np.asarray(pixel_values, np.float64)
    if x.ndim == 4:
        x = x[0]
    if processing.do_normalize:
        x = x * np.array(processing.image_std)[:, None, None] + np.array(processing.image_mean)[:, None, None]
    if processing.do_rescale:
        x = x / processing.rescale_factor
    return np.clip(np.rint(x), 0, 255).astype(np.uint8).transpose(1, 2, 0)
