"""Handwritten digits read by a Vision Transformer: the task `qkv train --task digits` learns, whose result qkv
ships as `digits-vit`.

The data are scikit-learn's handwritten digits (1,797 images of 8 × 8 pixels, 16 grey levels, from the UCI
optical digits set; they ship inside scikit-learn, nothing is downloaded), drawn as a reader would draw them:
dark ink on white, pixel = 255 − 255·v/16. A fixed fifth of them (TEST_SHARE, the same for every seed) is held
out and never trained on; the test accuracy is measured on it.

The model: a ViT of 8 × 8 grey images cut into 2 × 2 patches — 16 patch tokens after [CLS], 17 tokens in all —
pre-norm LayerNorm blocks with a GELU FFN, learned positions, the classifier on [CLS] (labels "0" … "9"). Each
training image is moved by at most one pixel left, right, up or down (white coming in): a batch depends on
(seed, step) alone, so a run resumed from a checkpoint equals one never stopped.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..inputs.images import ImageProcessing, normalise, patches_of
from .backprop import image_loss_and_grads

SIZE, PATCH = 8, 2
TEST_SHARE = 0.2              # held out: a fixed permutation's first fifth (359 of 1,797 images)
SPLIT_SEED = 29               # that permutation's seed: the split never depends on the run's --seed
LABELS = [str(i) for i in range(10)]
PROCESSING = ImageProcessing(size=(SIZE, SIZE), resample=2, image_mean=(0.5,), image_std=(0.5,))


@lru_cache(maxsize=1)
def digits() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8, 1) uint8, dark ink on white; labels (1797,) int64) from scikit-learn."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise QkvError("the digits come with scikit-learn; run: pip install scikit-learn") from None
    data = load_digits()
    ink = np.asarray(data.images, np.float64)                                   # 0 … 16
    images = np.rint(255 - ink * (255 / 16)).astype(np.uint8)[..., None]        # (N, 8, 8, 1)
    return images, np.asarray(data.target, np.int64)


def split() -> tuple[np.ndarray, np.ndarray]:
    """(train indices, test indices): disjoint, fixed for every run."""
    n = len(digits()[1])
    order = np.random.default_rng(SPLIT_SEED).permutation(n)
    k = int(round(n * TEST_SHARE))
    return np.sort(order[k:]), np.sort(order[:k])


def vit_config(d_model: int, layers: int, heads: int) -> ModelConfig:
    """The digits ViT: 8 × 8 grey images in 2 × 2 patches, pre-norm, GELU, 10 labels."""
    return ModelConfig(family="vit", vocab_size=len(LABELS), d_model=d_model, n_layers=layers, n_heads=heads,
                       d_ff=2 * d_model, max_positions=1 + (SIZE // PATCH) ** 2, causal=False, norm="layer",
                       norm_place="pre", norm_eps=1e-6, position="learned", activation="gelu", final_norm=True,
                       lm_head=True, image_size=(SIZE, SIZE), patch_size=(PATCH, PATCH), num_channels=1)


def shifted(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each image (B, H, W, 1) moved by −1, 0 or +1 pixel in each direction, white where nothing comes in."""
    out = np.full_like(images, 255)
    H, W = images.shape[1:3]
    for i, (dy, dx) in enumerate(rng.integers(-1, 2, (len(images), 2))):
        out[i, max(dy, 0):H + min(dy, 0), max(dx, 0):W + min(dx, 0)] = \
            images[i, max(-dy, 0):H + min(-dy, 0), max(-dx, 0):W + min(-dx, 0)]
    return out


def _png(image: np.ndarray, f) -> None:
    from PIL import Image

    Image.fromarray(image[..., 0], "L").save(f, format="PNG")


def accuracy(model, images: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(share classified right, mean cross-entropy) of IMAGES (N, H, W, 1) uint8 under MODEL (an ImageModel)."""
    z = model.forward(normalise(images, model.processing), attentions=False).logits.astype(np.float64)   # (N, 10)
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float((z.argmax(axis=1) == labels).mean()), float(-logp[np.arange(len(labels)), labels].mean())


class DigitsTask:
    """What the training loop (`loop.Run`) reads: the config, each step's batch, its loss and gradients, the
    records (held-out accuracy), and how the model's images are processed (`processing`, `labels`)."""

    name = "digits"
    tokenizer = None
    processing = PROCESSING
    labels = LABELS

    def __init__(self, s, tokenizer_file: Path | None = None):
        self.s = s
        if s.d_model % s.heads:
            raise QkvError(f"--d-model {s.d_model} is not a multiple of --heads {s.heads}; choose sizes that divide")
        self.config = vit_config(s.d_model, s.layers, s.heads)
        self.images, self.targets = digits()
        self.train, self.test = split()

    def describe(self) -> str:
        return (f"scikit-learn's handwritten digits, 8 × 8 pixels in 2 × 2 patches (17 tokens with [CLS]): "
                f"{len(self.train):,} to learn from, {len(self.test):,} held out")

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(patches (B, 16, 4), labels (B,)) of STEP: a function of (seed, step) alone."""
        rng = np.random.default_rng([self.s.seed, step])
        pick = self.train[rng.integers(0, len(self.train), self.s.batch)]
        pixels = normalise(shifted(self.images[pick], rng), self.processing)      # (B, 1, 8, 8)
        return patches_of(pixels, self.config), self.targets[pick]

    def loss_and_grads(self, weights, batch):
        return image_loss_and_grads(weights, self.config, *batch)

    def tokens(self, batch) -> int:
        return int(batch[0].shape[0] * (1 + batch[0].shape[1]))

    def finish(self, out: Path) -> list[Path]:
        """OUT/examples/digit-0.png … digit-9.png: the first held-out image of each digit (what digits-vit ships
        to try it on), as 8 × 8 grey PNGs."""
        from ..runtime.io import real_directory, write_atomic

        folder = real_directory(out / "examples")
        written = []
        for d in range(10):
            i = self.test[self.targets[self.test] == d][0]
            written.append(write_atomic(folder / f"digit-{d}.png", lambda f, i=i: _png(self.images[i], f)))
        return written

    def record(self, model) -> dict:
        """The held-out images: the share classified right, and their mean loss."""
        acc, loss = accuracy(model, self.images[self.test], self.targets[self.test])
        return {"accuracy": round(acc, 4), "val_loss": round(loss, 4)}
