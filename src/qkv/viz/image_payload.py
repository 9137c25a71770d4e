"""The viewer's "image" part of an image model's trace (ViT): the image as a PNG, its grid of patches and the
predicted labels; its format is in `payload`'s module doc, beside every other part of the page's JSON."""

from __future__ import annotations

import numpy as np

from ..models.image_model import top_labels
from ..core.trace import Trace

PREDICTED = 3             # labels an image page lists


def image_payload(trace: Trace) -> dict | None:
    """The "image" part of the payload (`payload` module doc) of an image model's trace; None for a text's."""
    if trace.image is None or trace.grid is None:
        return None
    import base64
    import io

    from PIL import Image

    pixels = trace.image[:, :, 0] if trace.image.shape[2] == 1 else trace.image         # (H, W) or (H, W, 3)
    png = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(png, format="PNG")
    (H, W), (rows, cols) = trace.image.shape[:2], trace.grid
    predicted = []
    if trace.logits is not None and trace.label_names:
        predicted = [{"label": str(label), "p": round(p, 4)}                             # [CLS]'s logits
                     for label, p in top_labels(trace.logits[0], trace.label_names, PREDICTED)]
    return {"png": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode("ascii"),
            "height": int(H), "width": int(W), "rows": int(rows), "cols": int(cols),
            "patch": [int(H // rows), int(W // cols)], "first": 1, "predicted": predicted}
