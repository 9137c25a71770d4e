"""The gradients a user asks for, by the checkpoint's own tensor names: decoders, masked-LM encoders and
encoder–decoders.

backprop.py and seq2seq_backprop.py compute gradients as Weights trees in the guide's names; this module
checks the inputs and names each gradient as the checkpoint's file (and torch's named_parameters())
names it, so that they compare one to one with torch autograd.
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .backprop import loss_and_grads
from .seq2seq_backprop import decoder_inputs, loss_and_grads as seq2seq_loss_and_grads


def grads_by_name(grads, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """A gradient tree under the checkpoint's own tensor names and shapes (the family's table in
    qkv.checkpoints), e.g. GPT-2's "transformer.h.0.attn.c_attn.weight" = [dW_Q | dW_K | dW_V].
    Buffers that are not learned (Marian's and BART's final_logits_bias) are left out."""
    from ..checkpoints import FAMILIES
    named = FAMILIES[cfg.family].tensors(grads, cfg)
    named.pop("final_logits_bias", None)
    return named


def gradients(model, input_ids, attention_mask=None, loss_mask=None, *, labels=None
              ) -> tuple[float, dict[str, np.ndarray]]:
    """(loss, gradients) of a model's mean cross-entropy, keyed by the checkpoint's tensor names in the
    shapes its file stores them (a tied W_vocab once), as torch's `named_parameters()` of the same model.

    Decoders: the loss is transformers' with labels=input_ids — position t predicts token t+1, and
    padding (attention_mask 0, on the right) is not learned; loss_mask (B, n) picks which positions'
    predictions count besides (e.g. the repeated half of a sequence).
    Masked-LM encoders (RoBERTa, DistilBERT, ELECTRA's generator): transformers' *ForMaskedLM loss,
    labels (B, n) the token each position must give (−100: not learned), no shift.
    Image classifiers (ViT): input_ids is pixel_values (B, C, H, W) and labels (B,) each image's label:
    ViTForImageClassification's cross-entropy on [CLS].
    Encoder–decoders (Marian, BART, mBART, Pegasus, T5, mT5, UMT5): input_ids is the source and labels
    (B, n_tgt) the target, −100 where there is nothing to learn; the decoder reads [decoder_start] +
    labels[:-1], as transformers' (mBART: its labels' last real token first).
    """
    if model.config.image_size is not None:                 # an image classifier (ViT): pixel_values, labels (B,)
        return _image_gradients(model, input_ids, labels)
    ids, mask = model.check_ids(input_ids, attention_mask)
    if model.config.encoder_decoder:
        if labels is None:
            raise QkvError("an encoder–decoder learns from labels: pass labels=target ids (B, n_tgt)")
        target = np.asarray(labels)
        target = target[None] if target.ndim == 1 else target
        if target.ndim != 2 or len(target) != len(ids):
            raise QkvError(f"labels must be (B, n_tgt) with one row per source row ({len(ids)}); got {target.shape}")
        model.check_ids(np.where(target == -100, 0, target))                   # ids in the vocabulary
        cfg = model.config
        start = None if cfg.start_from_labels else model.start_token
        tgt_in = decoder_inputs(target.astype(np.int64), start, cfg.pad_token_id or 0, cfg.start_from_labels)
        loss, grads = seq2seq_loss_and_grads(model.weights, cfg, ids, mask, tgt_in, target.astype(np.int64))
        return loss, grads_by_name(grads, cfg)
    if loss_mask is not None:
        loss_mask = np.asarray(loss_mask, dtype=bool).reshape(ids.shape) if np.size(loss_mask) == ids.size else None
        if loss_mask is None:
            raise QkvError(f"loss_mask must have the shape of input_ids {ids.shape}; give one True/False per token")
    if not model.config.causal and labels is not None:
        model.check_ids(np.where(np.asarray(labels) == -100, 0, labels))         # label ids in the vocabulary
    loss, grads = loss_and_grads(model.weights, model.config, ids, mask, loss_mask, labels)
    return loss, grads_by_name(grads, model.config)


def _image_gradients(model, pixel_values, labels) -> tuple[float, dict[str, np.ndarray]]:
    """`gradients` of an image classifier: pixel_values (B, C, H, W), labels (B,) label ids."""
    from ..inputs.images import patches_of
    from .backprop import image_loss_and_grads

    x = model.check_pixels(pixel_values)
    y = np.asarray(labels) if labels is not None else None
    if y is None or y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer) \
            or not ((0 <= y) & (y < model.config.vocab_size)).all():
        raise QkvError(f"an image classifier learns from labels: pass labels=(B,) label ids from 0 to "
                       f"{model.config.vocab_size - 1}, one per image ({len(x)})")
    loss, grads = image_loss_and_grads(model.weights, model.config, patches_of(x, model.config), y.astype(np.int64))
    return loss, grads_by_name(grads, model.config)
