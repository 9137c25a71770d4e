"""An image as a sequence of tokens (ViT): read it, resize and normalise it as the checkpoint's image processor
does, and cut it into patches.

    file / array ─read_image─▶ PIL image ─preprocess─▶ pixel_values (C, H, W) float32
                 ─patches_of─▶ (P, C·p_h·p_w): patch (r, c) is the p_h × p_w square at row r, column c of the
                               grid, channel by channel and row by row, the order in which the patch
                               convolution's weights (d_model, C, p_h, p_w) flatten; so the convolution is one
                               product, patches·W_patch + b_patch (blocks.embed), and [CLS] goes first.

Every image is checked here, once, before a pixel is decoded where that is possible: a regular file of at most
MAX_BYTES, a format PIL reads (PNG, JPEG, GIF, BMP, WebP, TIFF), at most MAX_PIXELS pixels (a decompression
bomb — a small file that decodes to gigapixels — is refused from its header), and arrays of uint8 pixels.
Each problem is one QkvError that names it and the fix.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..runtime.io import open_regular

MAX_BYTES = 64 << 20             # an image file larger than this is refused before it is read
MAX_PIXELS = 40_000_000          # width × height; PIL's own bomb guard warns from 89 M and refuses from 179 M
FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF")
SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff")   # their files' names
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}   # PIL's numbers


@dataclass(frozen=True)
class ImageProcessing:
    """What a checkpoint's preprocessor_config.json says to do to an image before the model reads it, as
    transformers' ViTImageProcessor does it: resize to `size` (PIL, `resample`), × rescale_factor,
    then (x − mean) / std per channel. The defaults are ViTImageProcessor's."""

    size: tuple[int, int]                       # (height, width) after resizing
    resample: int = 2                           # PIL's filter number: 2 = bilinear
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    shortest_edge: int | None = None            # CLIP's: the shorter side resized to this, the aspect kept (size
                                                # is then what the center crop leaves); None: resize to `size`
    center_crop: bool = False                   # CLIP's: then the middle `size` pixels cut out (do_center_crop)

    @classmethod
    def of(cls, found: dict | None, cfg: ModelConfig, where: str = "preprocessor_config.json") -> "ImageProcessing":
        """The processing a preprocessor_config.json's dict gives (None: the defaults for CFG's image size), its
        every value checked: one QkvError naming the first bad one."""
        found = dict(found or {})

        def bad(key: str, want: str) -> QkvError:
            return QkvError(f"{where} {key} = {found.get(key)!r:.60} is not {want}; restore the checkpoint's {where}")

        size = found.get("size", {"height": cfg.image_size[0], "width": cfg.image_size[1]})
        shortest, crop = None, bool(found.get("do_center_crop")) and "crop_size" in found
        if crop and isinstance(size, dict) and set(size) == {"shortest_edge"}:    # CLIPImageProcessor's
            shortest, size = size["shortest_edge"], found["crop_size"]
            if not (isinstance(shortest, int) and not isinstance(shortest, bool) and 0 < shortest <= 8192):
                raise bad("size", "{\"shortest_edge\": S} of 1 to 8192 pixels")
            size = {"height": size, "width": size} if isinstance(size, int) and not isinstance(size, bool) else size
        if isinstance(size, dict) and set(size) >= {"height", "width"}:
            size = (size["height"], size["width"])
        elif isinstance(size, int) and not isinstance(size, bool):
            size = (size, size)
        else:
            raise bad("size", "{\"height\": H, \"width\": W}")
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 8192 for v in size):
            raise bad("size", "a height and a width of 1 to 8192 pixels")
        for key in ("do_resize", "do_rescale", "do_normalize"):
            if not isinstance(found.get(key, True), bool):
                raise bad(key, "true or false")
        if found.get("do_center_crop") and shortest is None:
            raise QkvError(f"{where} asks for a center crop, which qkv does only after resizing the shorter side "
                           "(CLIP's size {\"shortest_edge\": S} with a crop_size); resize instead (do_center_crop false)")
        resample = found.get("resample", 2)
        if resample not in RESAMPLE or isinstance(resample, bool):
            raise bad("resample", f"one of PIL's filters {sorted(RESAMPLE)}")
        factor = found.get("rescale_factor", 1 / 255)
        if not (isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor < math.inf):
            raise bad("rescale_factor", "a positive number")
        stats = {}
        for key in ("image_mean", "image_std"):
            v = found.get(key, 0.5)
            v = [v] * cfg.num_channels if isinstance(v, (int, float)) and not isinstance(v, bool) else v
            if not (isinstance(v, list) and len(v) == cfg.num_channels
                    and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)):
                raise bad(key, f"{cfg.num_channels} numbers, one per channel")
            if key == "image_std" and not all(x > 0 for x in v):
                raise bad(key, "positive numbers")
            stats[key] = tuple(float(x) for x in v)
        if not found.get("do_resize", True) and tuple(size) != tuple(cfg.image_size):
            size = cfg.image_size
        return cls(size=tuple(size), resample=int(resample), do_resize=found.get("do_resize", True),
                   do_rescale=found.get("do_rescale", True), rescale_factor=float(factor),
                   do_normalize=found.get("do_normalize", True), shortest_edge=shortest, center_crop=crop, **stats)

    def to_dict(self) -> dict:
        """preprocessor_config.json's dict (what `of` reads back), as ViTImageProcessor writes it."""
        size = {"height": self.size[0], "width": self.size[1]}
        cropped = {"size": {"shortest_edge": self.shortest_edge}, "do_center_crop": True, "crop_size": size,
                   "image_processor_type": "CLIPImageProcessor"} if self.shortest_edge else {}
        return {"image_processor_type": "ViTImageProcessor", "size": size,
                "resample": self.resample, "do_resize": self.do_resize, "do_rescale": self.do_rescale,
                "rescale_factor": self.rescale_factor, "do_normalize": self.do_normalize,
                "image_mean": list(self.image_mean), "image_std": list(self.image_std)} | cropped


def read_image(source) -> "object":
    """SOURCE (a path, a PIL image, or a uint8 array (H, W) or (H, W, C), C 1, 3 or 4) → a PIL image, checked:
    a regular file of at most MAX_BYTES in one of FORMATS, at most MAX_PIXELS pixels (read from the header,
    before decoding: a decompression bomb never expands). The first frame of an animation."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(source, Image.Image):
        _check_pixels(source.size)
        _check_finite(source)
        return source
    if isinstance(source, np.ndarray):
        return _from_array(source)
    if not isinstance(source, (str, os.PathLike)):
        raise QkvError(f"an image is a file path, a PIL image or a uint8 array, not {type(source).__name__}")
    path = Path(source)
    try:
        with open_regular(path, MAX_BYTES) as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise QkvError(f"no image file {path}; give the path of a PNG or JPEG file") from None
    except OSError as e:
        raise QkvError(f"cannot read image {path}: {e.strerror or e}; give a regular image file of at most "
                       f"{MAX_BYTES >> 20} MB") from None
    import io

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
            _check_pixels(image.size, path)
            image.seek(0)
            image.load()
    except QkvError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        kind = "too many pixels" if "decompression" in type(e).__name__.lower() else "not an image PIL reads"
        raise QkvError(f"{path} is {kind}; give a PNG, JPEG, GIF, BMP, WebP or TIFF image") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise QkvError(f"{path} is a damaged image ({str(e)[:80]}); give a complete PNG or JPEG file") from None
    _check_finite(image, path)
    return image


def _check_finite(image, path: Path | None = None) -> None:
    """A floating-point image (PIL mode "F": a 32-bit float TIFF) whose pixels are NaN or infinite is refused:
    converting it to grey or RGB would turn them into 0 or 255 without a word, and the model would classify a
    picture the file does not hold (transformers would compute NaN logits from it)."""
    if image.mode != "F":
        return
    pixels = np.asarray(image, dtype=np.float32)                     # (H, W)
    bad = int(pixels.size - np.count_nonzero(np.isfinite(pixels)))
    if bad:
        where = f"{path} has" if path is not None else "the image has"
        raise QkvError(f"{where} {bad:,} of its {pixels.size:,} pixels NaN or infinite (a floating-point image); "
                       "give an image of finite pixels, e.g. a PNG")


def _check_pixels(size: tuple[int, int], path: Path | None = None) -> None:
    w, h = size
    if w <= 0 or h <= 0 or w * h > MAX_PIXELS:
        where = f"{path} is" if path is not None else "the image is"
        raise QkvError(f"{where} {w} × {h} pixels, more than qkv reads ({MAX_PIXELS // 1_000_000} million); "
                       "give a smaller image")


def _from_array(a: np.ndarray):
    from PIL import Image

    if a.dtype != np.uint8:
        raise QkvError(f"an image array must hold uint8 pixels 0–255, not {a.dtype}; give such an array "
                       "(or preprocessed pixel_values to model.forward)")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (3, 4))):
        raise QkvError(f"an image array is (H, W) or (H, W, C) with C 1, 3 or 4, not {a.shape}")
    _check_pixels((a.shape[1], a.shape[0]))
    return Image.fromarray(np.ascontiguousarray(a))


def preprocess(image, processing: ImageProcessing, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """An image (anything `read_image` takes) → (shown, pixel_values): shown (H, W, C) uint8, the image the
    model reads, resized (what views draw); pixel_values (C, H, W) float32, rescaled and normalised.
    Grey for a 1-channel model, RGB for 3 (a transparent image laid over white first, as transformers does)."""
    from PIL import Image

    image = read_image(image)
    mode = {1: "L", 3: "RGB"}.get(cfg.num_channels)
    if mode is None:
        raise QkvError(f"qkv reads images for models of 1 or 3 channels; this one has {cfg.num_channels}")
    try:
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
            white = Image.new("RGBA", image.size, (255, 255, 255, 255))
            image = Image.alpha_composite(white, image.convert("RGBA"))
        image = image.convert("RGB").convert(mode) if image.mode == "LAB" else image.convert(mode)   # LAB → L: via RGB
        if processing.shortest_edge is not None:
            image = _resize_and_crop(image, processing)
        elif processing.do_resize and image.size != (processing.size[1], processing.size[0]):
            image = image.resize((processing.size[1], processing.size[0]), resample=processing.resample)
    except (ValueError, OSError) as e:                    # a mode PIL cannot convert, pixels it cannot decode
        raise QkvError(f"the image (mode {image.mode}) cannot be read as {'grey' if mode == 'L' else 'RGB'} "
                       f"({str(e)[:60]}); save it as an RGB or grey PNG") from None
    shown = np.asarray(image, dtype=np.uint8).reshape(image.size[1], image.size[0], cfg.num_channels)
    if shown.shape[:2] != tuple(cfg.image_size):
        raise QkvError(f"the image is {shown.shape[0]} × {shown.shape[1]} pixels after processing but the model reads "
                       f"{cfg.image_size[0]} × {cfg.image_size[1]}; fix preprocessor_config.json's size")
    return shown, normalise(shown[None], processing)[0]


def _resize_and_crop(image, processing: ImageProcessing):
    """CLIPImageProcessor's: the shorter side resized to shortest_edge (the longer to int(S·long/short)), then the
    middle size[0] × size[1] pixels, from row (H − h) // 2 and column (W − w) // 2."""
    w, h = image.size
    if processing.do_resize:
        s = processing.shortest_edge
        short, long = min(w, h), max(w, h)
        new = (s, int(s * long / short)) if w <= h else (int(s * long / short), s)      # (width, height)
        image = image.resize(new, resample=processing.resample) if new != (w, h) else image
        w, h = image.size
    ch, cw = processing.size
    if ch > h or cw > w:
        raise QkvError(f"the image is {h} × {w} pixels after resizing, smaller than the {ch} × {cw} center crop "
                       "(qkv does not pad it); give a larger image")
    top, left = (h - ch) // 2, (w - cw) // 2
    return image.crop((left, top, left + cw, top + ch))


def normalise(shown: np.ndarray, processing: ImageProcessing) -> np.ndarray:
    """Images (B, H, W, C) uint8 → pixel_values (B, C, H, W) float32: × rescale_factor (in float64, then
    float32), then (x − mean) / std per channel in float32, as transformers' image processors compute it."""
    x = shown.transpose(0, 3, 1, 2).astype(np.float64)              # (B, C, H, W)
    if processing.do_rescale:
        x = x * processing.rescale_factor
    x = x.astype(np.float32)
    if processing.do_normalize:
        mean = np.array(processing.image_mean, np.float32)[:, None, None]
        std = np.array(processing.image_std, np.float32)[:, None, None]
        x = (x - mean) / std
    return x.astype(np.float32)


def patches_of(pixel_values: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """(B, C, H, W) → (B, P, C·p_h·p_w): the grid's patches row by row, each flattened channel, row, column
    (the patch convolution's weight order). Pixels past the last whole patch are not read, as a strided
    convolution leaves them."""
    B, C = pixel_values.shape[:2]
    (ph, pw), (rows, cols) = cfg.patch_size, cfg.grid
    x = pixel_values[:, :, :rows * ph, :cols * pw].reshape(B, C, rows, ph, cols, pw)
    return x.transpose(0, 2, 4, 1, 3, 5).reshape(B, rows * cols, C * ph * pw)     # (B, P, C·p_h·p_w)


def patch_labels(cfg: ModelConfig) -> list[str]:
    """The token labels of an image model's sequence: "[CLS]" (unless it has none: SigLIP), then "patch (row, col)"
    row by row."""
    rows, cols = cfg.grid
    return ["[CLS]"] * cfg.class_token + [f"patch ({r}, {c})" for r in range(rows) for c in range(cols)]
