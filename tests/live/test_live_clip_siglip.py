"""CLIP and SigLIP against live transformers: random pairs and towers of other knob values than the committed
fixtures (image and patch sizes, 1 or 3 channels, projection widths, hidden_act, head counts, eos rules, SigLIP with
and without its head), padded both ways, and CLIP's / SigLIP's PIL image processors on images of other shapes."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (CLIPConfig, CLIPModel, CLIPTextConfig, CLIPTextModelWithProjection, CLIPVisionConfig,
                          CLIPVisionModel, SiglipConfig, SiglipModel, SiglipVisionConfig, SiglipVisionModel)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

import qkv
from qkv.inputs.images import ImageProcessing, preprocess

from live_helpers import TOL_ATTENTION, TOL_HIDDEN

TEXT = [dict(vocab_size=40, hidden_size=24, intermediate_size=20, num_hidden_layers=3, num_attention_heads=3,
             max_position_embeddings=16, hidden_act="gelu", eos_token_id=39, pad_token_id=0),
        dict(vocab_size=30, hidden_size=16, intermediate_size=40, num_hidden_layers=1, num_attention_heads=8,
             max_position_embeddings=10, hidden_act="quick_gelu", layer_norm_eps=1e-3, eos_token_id=2, pad_token_id=1)]
VISION = [dict(hidden_size=24, intermediate_size=30, num_hidden_layers=2, num_attention_heads=4, image_size=15,
               patch_size=5, num_channels=3, hidden_act="gelu_new"),
          dict(hidden_size=20, intermediate_size=12, num_hidden_layers=3, num_attention_heads=5, image_size=9,
               patch_size=3, num_channels=1, hidden_act="quick_gelu", layer_norm_eps=1e-4)]


def perturbed(model, seed: int):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return model.eval()


def saved(model, tmp_path):
    model.save_pretrained(tmp_path / "m")
    return qkv.load(tmp_path / "m"), qkv.load(tmp_path / "m", dtype=np.float64)


def batch(vocab: int, eos: int, n: int, left: bool):
    gen = torch.Generator().manual_seed(n)
    ids = torch.randint(3, vocab - 1, (2, n), generator=gen)
    ids[ids == eos] = 4
    mask = torch.ones_like(ids)
    real = n - 3
    if left:
        ids[1, :3], mask[1, :3] = 0, 0
        ids[:, -1] = eos
    else:
        ids[1, real:], mask[1, real:] = 0, 0
        ids[0, -1] = eos
        ids[1, real - 1] = eos
    return ids, mask


def close(a, b, tol) -> bool:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max()) <= tol


@pytest.mark.parametrize("t, v, left", [(0, 0, False), (1, 1, True), (0, 1, True)])
def test_clip_pairs_of_other_knobs(t, v, left, tmp_path):
    torch.manual_seed(10 + t + 2 * v)
    cfg = CLIPConfig(text_config=TEXT[t], vision_config=VISION[v], projection_dim=7 + t,
                     logit_scale_init_value=0.7, attn_implementation="eager")
    model = perturbed(CLIPModel(cfg), 20 + t)
    ours, ours64 = saved(model, tmp_path)
    ids, mask = batch(TEXT[t]["vocab_size"], TEXT[t]["eos_token_id"], 9, left)
    x = torch.randn(2, VISION[v]["num_channels"], VISION[v]["image_size"], VISION[v]["image_size"])
    with torch.no_grad():
        o = model(input_ids=ids, attention_mask=mask, pixel_values=x, output_attentions=True, output_hidden_states=True)
    real = mask.numpy().astype(bool)
    text = ours.text.forward(ids.numpy(), mask.numpy())
    assert close(text.hidden[real], o.text_model_output.last_hidden_state.numpy()[real], TOL_HIDDEN)
    vision = ours.vision.forward(x.numpy())
    assert close(vision.hidden, o.vision_model_output.last_hidden_state.numpy(), TOL_HIDDEN)
    assert close(vision.attentions, np.stack([a.numpy() for a in o.vision_model_output.attentions]), TOL_ATTENTION)
    for m in (ours, ours64):
        s = m.similarity(x.numpy(), ids.numpy(), mask.numpy())
        assert close(s.logits_per_image, o.logits_per_image.numpy(), TOL_HIDDEN)
        assert close(s.text_embeds, o.text_embeds.numpy(), TOL_HIDDEN)
        assert close(s.image_embeds, o.image_embeds.numpy(), TOL_HIDDEN)


@pytest.mark.parametrize("t, v, head", [(0, 0, True), (1, 1, True), (1, 0, True)])
def test_siglip_pairs_of_other_knobs(t, v, head, tmp_path):
    torch.manual_seed(30 + t + 2 * v)
    text = TEXT[t] | {"projection_size": VISION[v]["hidden_size"]}     # the image's embedding is its d_model wide
    vision = VISION[v] | {"vision_use_head": head}
    cfg = SiglipConfig(text_config=text, vision_config=vision, attn_implementation="eager")
    model = perturbed(SiglipModel(cfg), 40 + t)
    ours, ours64 = saved(model, tmp_path)
    ids, mask = batch(text["vocab_size"], text["eos_token_id"], 8, t == 1)
    x = torch.randn(3, vision["num_channels"], vision["image_size"], vision["image_size"])
    with torch.no_grad():
        o = model(input_ids=ids, attention_mask=mask, pixel_values=x)
    for m in (ours, ours64):
        s = m.similarity(x.numpy(), ids.numpy(), mask.numpy())
        assert close(s.logits_per_image, o.logits_per_image.numpy(), TOL_HIDDEN)


@pytest.mark.parametrize("v, head", [(0, False), (1, True)])
def test_image_towers_alone(v, head, tmp_path):
    """SiglipVisionModel with and without its head, CLIPVisionModel (no projection)."""
    torch.manual_seed(50 + v)
    siglip = perturbed(SiglipVisionModel(SiglipVisionConfig(**VISION[v], vision_use_head=head,
                                                            attn_implementation="eager")), 60 + v)
    ours, _ = saved(siglip, tmp_path / "s")
    x = torch.randn(2, VISION[v]["num_channels"], VISION[v]["image_size"], VISION[v]["image_size"])
    with torch.no_grad():
        o = siglip(pixel_values=x, output_attentions=True)
    assert close(ours.forward(x.numpy()).hidden, o.last_hidden_state.numpy(), TOL_HIDDEN)
    if head:
        assert close(ours.pooled(x.numpy()).embeds, o.pooler_output.numpy(), TOL_HIDDEN)
    else:
        with pytest.raises(qkv.QkvError, match="pools no embedding"):
            ours.pooled(x.numpy())
    clip = perturbed(CLIPVisionModel(CLIPVisionConfig(**VISION[v], attn_implementation="eager")), 70 + v)
    ours, _ = saved(clip, tmp_path / "c")
    with torch.no_grad():
        o = clip(pixel_values=x)
    pooled = ours.pooled(x.numpy())
    assert close(pooled.pooled, o.pooler_output.numpy(), TOL_HIDDEN) and pooled.embeds is pooled.pooled


def test_clip_text_with_projection_alone(tmp_path):
    torch.manual_seed(80)
    model = perturbed(CLIPTextModelWithProjection(CLIPTextConfig(**TEXT[0], projection_dim=5,
                                                                 attn_implementation="eager")), 81)
    ours, _ = saved(model, tmp_path)
    ids, mask = batch(40, 39, 10, True)
    with torch.no_grad():
        o = model(input_ids=ids, attention_mask=mask)
    assert close(ours.pooled(input_ids=ids.numpy(), attention_mask=mask.numpy()).embeds, o.text_embeds.numpy(),
                 TOL_HIDDEN)


@pytest.mark.parametrize("shape", [(31, 19), (19, 31), (40, 40), (7, 50)])
def test_image_processors_on_other_shapes(shape):
    """CLIP's shorter side resized then the middle cut out, SigLIP's resized: as their PIL processors, to the bit."""
    cfg = qkv.core.config.ModelConfig(family="x", vocab_size=1, d_model=8, n_layers=1, n_heads=1, d_ff=8,
                                      max_positions=10, causal=False, image_size=(12, 12), patch_size=(4, 4))
    pixels = np.random.default_rng(sum(shape)).integers(0, 256, (*shape, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG")
    image = Image.open(io.BytesIO(buf.getvalue()))
    clip = {"size": {"shortest_edge": 12}, "crop_size": {"height": 12, "width": 12}, "do_center_crop": True,
            "resample": 3, "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711]}
    siglip = {"size": {"height": 12, "width": 12}, "resample": 3, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    for kind, settings in ((CLIPImageProcessorPil, clip), (SiglipImageProcessorPil, siglip)):
        want = kind(**settings)(images=image, return_tensors="np")["pixel_values"][0]
        got = preprocess(image, ImageProcessing.of(settings, cfg), cfg)[1]
        np.testing.assert_array_equal(got, want)
