"""ViT against live transformers: random checkpoints of other knob values than the committed fixtures (square and
not, q/k/v biases or none, 1 or 3 channels, head_dim other than d/H, tanh GELU, a ViTModel with its pooler), their
image processing on a JPEG, the backward against autograd, and digits-vit read by ViTForImageClassification."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import ViTConfig, ViTForImageClassification, ViTModel
from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

import qkv
from qkv.checkpoints import digits_dir
from qkv.train import gradients

from live_helpers import TOL_ATTENTION, TOL_HIDDEN

CASES = [
    dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40, image_size=16,
         patch_size=4, num_channels=3, num_labels=7),
    dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=24, image_size=[9, 14],
         patch_size=[3, 7], num_channels=1, qkv_bias=False, hidden_act="gelu_new", num_labels=3, layer_norm_eps=1e-5),
    dict(hidden_size=24, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, image_size=11,
         patch_size=5, num_channels=3, num_labels=4, head_dim=20),
]


def _perturbed(model, seed: int):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("cls", [ViTForImageClassification, ViTModel])
def test_random_vit_equals_transformers(tmp_path, case, cls):
    torch.manual_seed(case)
    config = ViTConfig(**CASES[case])
    ref = _perturbed(cls(config), case + 1)
    ref.save_pretrained(tmp_path)
    ref = cls.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ours = qkv.load(tmp_path)
    h, w = ours.config.image_size
    x = torch.randn((3, config.num_channels, h, w), generator=torch.Generator().manual_seed(case))
    with torch.no_grad():
        out = ref(pixel_values=x, output_attentions=True, output_hidden_states=True)
    mine = ours.forward(x.numpy())
    assert np.abs(mine.attentions - np.stack([a.numpy() for a in out.attentions])).max() <= TOL_ATTENTION
    if cls is ViTForImageClassification:
        assert np.abs(mine.logits - out.logits.numpy()).max() <= TOL_HIDDEN
        labels = torch.tensor([0, 1, config.num_labels - 1])
        ref.zero_grad()
        ref(pixel_values=x, labels=labels).loss.backward()
        loss, grads = gradients(ours, x.numpy(), labels=labels.numpy())
        ref_grads = {k: p.grad.numpy() for k, p in ref.named_parameters() if p.grad is not None}
        for name in ("vit.embeddings.patch_embeddings.projection.weight", "vit.embeddings.cls_token",
                     "vit.embeddings.position_embeddings", "classifier.weight"):
            g = ref_grads[name]
            assert np.linalg.norm(grads[name] - g) / np.linalg.norm(g) < 1e-4, name
    else:
        assert np.abs(mine.hidden - out.last_hidden_state.numpy()).max() <= TOL_HIDDEN


def test_image_processing_of_a_jpeg_equals_transformers():
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (37, 51, 3), dtype=np.uint8)).save(buf, format="JPEG")
    model = qkv.load(digits_dir())
    for resample in (0, 2, 3):
        settings = dict(size={"height": 8, "width": 8}, resample=resample, image_mean=[0.5], image_std=[0.5])
        proc = ViTImageProcessorPil(**settings)
        grey = Image.open(io.BytesIO(buf.getvalue())).convert("L")
        expected = proc(images=grey, return_tensors="np")["pixel_values"][0]
        from dataclasses import replace
        model.processing = replace(model.processing, resample=resample)
        _, mine = model.pixel_values(Image.open(io.BytesIO(buf.getvalue())))
        assert np.abs(mine - expected).max() <= 1e-6


def test_transformers_reads_digits_vit():
    """The shipped digits-vit is a ViTForImageClassification: the same logits and the same labels."""
    from qkv.train.digits import digits, split

    ours = qkv.load("digits-vit")
    ref = ViTForImageClassification.from_pretrained(digits_dir(), attn_implementation="eager").eval()
    images, labels = digits()
    test = split()[1][:64]
    from qkv.inputs.images import normalise

    x = normalise(images[test], ours.processing)
    with torch.no_grad():
        expected = ref(pixel_values=torch.from_numpy(x)).logits.numpy()
    assert np.abs(ours.forward(x).logits - expected).max() <= TOL_HIDDEN
    assert [ref.config.id2label[i] for i in range(10)] == ours.labels == [str(i) for i in range(10)]
