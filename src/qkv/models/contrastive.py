"""An image–text pair (CLIP, SigLIP) as qkv holds it: two towers, each the same engine as every model, and the
similarity of their embeddings.

    texts  ─TextTower─▶  hidden (B_t, n, d) ─pool─▶ text_embeds (B_t, p)      (core/pooling.py)
    images ─ImageTower─▶ hidden (B_i, P, d) ─pool─▶ image_embeds (B_i, p)
    logits_per_image = e^s · (image_embeds/‖·‖)·(text_embeds/‖·‖)ᵀ (+ b, SigLIP)        (B_i, B_t)
    probabilities: CLIP's softmax over the texts of each image; SigLIP's σ of each pair alone

Each tower is a Model (text) or an ImageModel (image) with `pooled`: run, trace, hooks, ablation and every view work
on it as on any encoder; `PairModel.text` and `.vision` are the towers of a pair checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..core.config import ModelConfig
from ..core.pooling import Pooled, pool
from ..core.weights import PairWeights, Weights
from ..inputs.images import ImageProcessing
from ..inputs.tokenizer import Tokenizer
from ..runtime.errors import QkvError
from .image_model import ImageModel
from .model import Model


class TextTower(Model):
    """A text tower (CLIPTextModel, SigLIP's): a Model whose hidden states pool into one embedding per text."""

    def __repr__(self) -> str:
        c = self.config
        return (f"TextTower({self.name!r}: {c.family}, L={c.n_layers}, H={c.n_heads}, d_model={c.d_model}, "
                f"V={c.vocab_size}, {'causal ' if c.causal else ''}encoder pooled at {c.pooling!r}"
                f"{f', projected to {c.d_proj}' if c.d_proj else ''})")

    def with_config(self, **changes) -> "TextTower":
        return TextTower(self.config.with_(**changes), self.weights, self.tokenizer, self.name, self.source)

    def astype(self, dtype) -> "TextTower":
        return TextTower(self.config, self.weights.astype(dtype), self.tokenizer, self.name, self.source)

    def batch(self, texts: str | Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Texts → (ids (B, n), mask (B, n)) as the pair's processor gives them: CLIP's padded to the longest with a
        mask; SigLIP's (pooled at the last row) padded to max_position_embeddings with no mask, as SiglipProcessor's
        padding="max_length" (the way SigLIP was trained: its pooled row then is always the same position)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if self.config.pooling != "last":
            return self.encode(texts)
        rows = [self.encode(t)[0] for t in texts]
        n, pad = self.config.max_positions, self.tokenizer.pad_token_id
        pad = self.config.pad_token_id if pad is None else pad
        if pad is None:
            raise QkvError(f"{self.name} has no pad token (tokenizer or config.json pad_token_id) to fill its texts to "
                           f"{n} tokens; set pad_token_id in config.json")
        ids = np.full((len(rows), n), pad, np.int64)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = row
        return ids, np.ones_like(ids)

    def pooled(self, texts=None, attention_mask=None, *, input_ids=None) -> Pooled:
        """TEXTS (a str or a list of them, encoded by `batch`) or INPUT_IDS (B, n) with ATTENTION_MASK → Pooled:
        pooler_output (B, d_model) and the embeddings compared (B, p), as transformers' get_text_features."""
        if (texts is None) == (input_ids is None):
            raise QkvError("give texts or input_ids, one of them")
        ids, mask = self.batch(texts) if input_ids is None else self.check_ids(input_ids, attention_mask)
        hidden = self.forward(ids, mask, attentions=False).hidden          # (B, n, d_model)
        return pool(hidden, ids, self.weights.pool, self.config)


class ImageTower(ImageModel):
    """An image tower (CLIPVisionModel, SiglipVisionModel): an ImageModel whose hidden states pool into one embedding
    per image (SigLIP's through its attention-pooling head)."""

    def with_config(self, **changes) -> "ImageTower":
        return ImageTower(self.config.with_(**changes), self.weights, None, self.name, self.processing, self.labels,
                          self.source)

    def astype(self, dtype) -> "ImageTower":
        return ImageTower(self.config, self.weights.astype(dtype), None, self.name, self.processing, self.labels,
                          self.source)

    def pixels(self, images) -> np.ndarray:
        """IMAGES (one image or a list: paths, PIL images, uint8 arrays) or pixel_values (floats (B, C, H, W) or
        (C, H, W)) → pixel_values (B, C, H, W), processed as preprocessor_config.json says."""
        if isinstance(images, np.ndarray) and np.issubdtype(images.dtype, np.floating):
            return self.check_pixels(images)
        many = images if isinstance(images, (list, tuple)) else [images]
        for image in many:
            self.check_image(image)
        return self.check_pixels(np.stack([self.pixel_values(image)[1] for image in many]))

    def pooled(self, images) -> Pooled:
        """IMAGES (see `pixels`) → Pooled: pooler_output (B, d_model), the embeddings compared (B, p) as
        transformers' get_image_features, and SigLIP's probe attention (B, H, P)."""
        if self.config.pooling is None:
            raise QkvError(f"{self.name} pools no embedding (a SiglipVisionModel without its head, vision_use_head "
                           "false); use a checkpoint with the head")
        hidden = self.forward(self.pixels(images), attentions=False).hidden   # (B, P', d_model)
        return pool(hidden, None, self.weights.pool, self.config)

    def classify(self, image, k: int = 5):
        raise QkvError(f"{self.name} is an image tower with no classifier; compare it with texts: load its pair "
                       "(a CLIPModel or SiglipModel checkpoint) and call model.similarity(images, texts)")


@dataclass
class Similarity:
    """The pair's scores of B_i images against B_t texts."""

    logits_per_image: np.ndarray            # (B_i, B_t) e^s·cos (+ b): transformers' logits_per_image
    probs: np.ndarray                       # (B_i, B_t) CLIP: softmax over each image's texts; SigLIP: σ each pair
    image_embeds: np.ndarray                # (B_i, p) normalised
    text_embeds: np.ndarray                 # (B_t, p) normalised
    kind: str                               # "softmax" (CLIP) or "sigmoid" (SigLIP): what `probs` is


class PairModel:
    """A CLIP or SigLIP checkpoint: its text tower (`text`), its image tower (`vision`) and the scalars of their
    similarity (weights.logit_scale, weights.logit_bias). SOURCE: what qkv.load was given (as Model.source; a tower
    alone does not load from it: its own is None)."""

    def __init__(self, config: ModelConfig, weights: PairWeights, tokenizer: Tokenizer | None = None,
                 name: str = "model", processing: ImageProcessing | None = None, source: str | None = None):
        self.config, self.weights, self.name, self.source = config, weights, name, source
        vision = config.with_(text_tower=None, family=f"{config.family}_vision_model")
        self.vision = ImageTower(vision, weights.vision, None, name, processing)
        self.text = TextTower(config.text_tower, weights.text, tokenizer, name)

    def __repr__(self) -> str:
        t, v = self.text.config, self.vision.config
        return (f"PairModel({self.name!r}: {self.config.family}, text L={t.n_layers} d_model={t.d_model}, image "
                f"{v.image_size[0]}×{v.image_size[1]} pixels L={v.n_layers} d_model={v.d_model})")

    @property
    def dtype(self) -> np.dtype:
        return self.weights.vision.tok_embed.dtype

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.text.tokenizer

    @property
    def arith(self) -> str:
        """How its passes compute: "exact" or "llama.cpp" (as Model.arith)."""
        return self.config.arith

    def astype(self, dtype) -> "PairModel":
        return PairModel(self.config, self.weights.astype(dtype), self.text.tokenizer, self.name,
                         self.vision.processing, self.source)

    def similarity(self, images, texts, attention_mask=None) -> Similarity:
        """IMAGES (see ImageTower.pixels) against TEXTS (a str, a list of them, or ids (B, n) with ATTENTION_MASK):
        transformers' CLIPModel / SiglipModel logits_per_image, and their probabilities."""
        given = isinstance(texts, np.ndarray) and np.issubdtype(texts.dtype, np.integer)
        t = self.text.pooled(input_ids=texts, attention_mask=attention_mask) if given else self.text.pooled(texts)
        return similarity(self.vision.pooled(images).embeds, t.embeds, self.weights)

    def run(self, *args, **kwargs):
        raise QkvError(f"{self.name} holds two towers: run one, model.vision.run(image) or model.text.run(text), "
                       "or compare them with model.similarity(images, texts)")

    def save(self, directory) -> None:
        raise QkvError("saving a pair is not in qkv; save each tower (model.text.save(DIR), model.vision.save(DIR): "
                       "a *WithProjection / Siglip*Model checkpoint each), without the similarity's logit scale")

    forward = generate = encode = run


def similarity(image_embeds: np.ndarray, text_embeds: np.ndarray, w: PairWeights) -> Similarity:
    """(B_i, p), (B_t, p) → Similarity: cosines scaled by e^s (+ b), as CLIPModel / SiglipModel compute them."""
    img = image_embeds / np.sqrt(np.sum(image_embeds ** 2, axis=-1, keepdims=True))   # (B_i, p)
    txt = text_embeds / np.sqrt(np.sum(text_embeds ** 2, axis=-1, keepdims=True))      # (B_t, p)
    logits = (txt @ img.T) * np.exp(w.logit_scale)                                      # (B_t, B_i) logits_per_text
    if w.logit_bias is not None:
        logits = logits + w.logit_bias
    per_image = logits.T                                                                # (B_i, B_t)
    z = per_image.astype(np.float64)
    if w.logit_bias is None:                                   # CLIP: which text, of these, fits each image
        p = np.exp(z - z.max(axis=1, keepdims=True))
        probs, kind = p / p.sum(axis=1, keepdims=True), "softmax"
    else:                                                      # SigLIP: each pair on its own
        probs, kind = 1 / (1 + np.exp(-z)), "sigmoid"
    return Similarity(per_image, probs, img, txt, kind)


def contrastive_model(cfg: ModelConfig, weights: Weights | PairWeights, tokenizer: Tokenizer | None, name: str,
                      processing: ImageProcessing | None, source: str | None = None
                      ) -> TextTower | ImageTower | PairModel:
    """The handle of a CLIP / SigLIP checkpoint: its pair, or the one tower it holds (SOURCE: what qkv.load was
    given)."""
    if cfg.text_tower is not None:
        return PairModel(cfg, weights, tokenizer, name, processing, source)
    if cfg.image_size is not None:
        return ImageTower(cfg, weights, None, name, processing, source=source)
    return TextTower(cfg, weights, tokenizer, name, source)
