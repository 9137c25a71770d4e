"""The viewer of an image model's trace in a real browser (Debian's Chromium, driven by Playwright, as
tests/test_browser.py): the image with a query's attention laid over it equals trace.attentions, clicking a
patch or a tile changes the query, and labels reach the page as text, never as HTML."""

from __future__ import annotations

import numpy as np
import pytest

import qkv
from qkv.analysis.sections import rollout_payload
from qkv.cli.show_image import predictions
from qkv.viz.html import save_viewer
from conftest import MODELS
from test_browser import assert_offline, browser, open_viewer, tab  # noqa: F401 (fixtures)
from test_browser_seq2seq import quantised
from test_show_image import DIGIT


@pytest.fixture(scope="module")
def three():
    return qkv.load("digits-vit").run(DIGIT)


@pytest.fixture(scope="module")
def noise():
    """The RGB ViT fixture on a random image: 3 × 3 patches of 4 × 5 pixels (not square)."""
    pixels = np.random.default_rng(1).integers(0, 256, (12, 15, 3), dtype=np.uint8)
    return qkv.load(str(MODELS / "vit")).run(pixels)


def overlay_values(page) -> list[int]:
    return [int(v) for v in page.get_attribute(".qkv-image-overlay", "data-values").split(",")]


def click_patch(page, r: int, c: int, patch: tuple[int, int]) -> None:
    box = page.eval_on_selector(".qkv-image-overlay", "c => c.getBoundingClientRect().toJSON()")
    scale = box["width"] / page.eval_on_selector(".qkv-image-pic", "i => i.naturalWidth")   # screen px per pixel
    page.mouse.click(box["x"] + (c + 0.5) * patch[1] * scale, box["y"] + (r + 0.5) * patch[0] * scale)


def test_the_overlay_holds_the_attention_of_cls_for_each_layer_and_head(tab, three, tmp_path):
    tab.page.context.set_offline(True)
    open_viewer(tab, save_viewer(three, tmp_path / "v.html", sections={"rollout": rollout_payload(three)}))
    page = tab.page
    assert tab.state()["query"] == "0" and page.is_visible(".qkv-image-pic")
    assert page.eval_on_selector(".qkv-image-pic", "i => i.complete && i.naturalWidth") == 8
    label, p = predictions(three, 1)[0]
    assert label == "3" and page.text_content(".qkv-image-predicted").startswith(f"predicted: 3 ({p:.3f})")
    for layer in (0, 2):
        page.select_option(".qkv-layer", str(layer))
        for h in range(4):
            page.select_option(".qkv-head", str(h))
            assert overlay_values(page) == quantised(three.attentions[layer, h])[0, 1:].tolist()
    page.select_option(".qkv-head", "-1")                                  # all heads: their mean, as selected()
    mean = np.floor(np.sum([quantised(a) for a in three.attentions[2]], axis=0) / 4 + 0.5).astype(int)
    assert overlay_values(page) == mean[0, 1:].tolist()
    assert len(page.query_selector_all(".qkv-image-tile")) == 17
    assert_offline(tab)
    assert tab.errors == []


def test_clicking_a_patch_or_a_tile_chooses_the_query(tab, noise, tmp_path):
    open_viewer(tab, save_viewer(noise, tmp_path / "v.html"))
    page = tab.page
    page.select_option(".qkv-head", "1")
    click_patch(page, 2, 1, (4, 5))                                        # patch (2, 1): token 1 + 2·3 + 1
    assert tab.state()["query"] == "8" and page.get_attribute(".qkv-image-overlay", "data-query") == "8"
    assert overlay_values(page) == quantised(noise.attentions[0, 1])[8, 1:].tolist()
    assert page.get_attribute(".qkv-image-tile >> nth=8", "aria-pressed") == "true"
    assert "query patch (2, 1), layer 0, head 1" in page.text_content(".qkv-image-readout")
    page.click(".qkv-image-tile >> nth=3")                                 # patch (0, 2)
    assert tab.state()["query"] == "3"
    assert overlay_values(page) == quantised(noise.attentions[0, 1])[3, 1:].tolist()
    page.click(".qkv-image-tile >> nth=0")                                 # [CLS] again
    assert tab.state()["query"] == "0"
    assert tab.errors == []


def test_hostile_and_korean_labels_are_shown_as_text(tab, three, tmp_path):
    hostile = '<img src=x onerror=alert(1)>고양이 "&amp;'
    names = list(three.label_names)
    names[3] = hostile                                                     # the predicted label
    open_viewer(tab, save_viewer(three.__class__(**{**three.__dict__, "label_names": names}), tmp_path / "v.html"))
    page = tab.page
    p = predictions(three, 1)[0][1]
    assert page.text_content(".qkv-image-predicted").startswith(f"predicted: {hostile} ({p:.3f})")
    assert len(page.query_selector_all("[data-qkv-root] img")) == 1       # the image, no other
    assert tab.dialogs == [] and tab.errors == []
