"""Training an encoder–decoder (Marian, BART, mBART, Pegasus, T5, mT5, UMT5): its loss, and the gradient of
every weight through both stacks (qkv.core.seq2seq_backward: the passes keeping their tapes, the boxes'
backwards in reverse).

    loss      mean −log softmax(Y·W_vocab + b)[label]           labels −100 are not learned

The loss is transformers' for `model(input_ids, attention_mask, labels=labels)`: the decoder reads
[start] + labels[:-1] (mBART: start = the labels' language id, `decoder_inputs`).
"""

from __future__ import annotations

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.seq2seq_backward import backward, taped
from ..core.weights import Seq2SeqWeights
from .backprop import token_loss


def loss_and_grads(weights: Seq2SeqWeights, cfg: ModelConfig, src: np.ndarray, src_mask: np.ndarray,
                   tgt_in: np.ndarray, labels: np.ndarray) -> tuple[float, Seq2SeqWeights]:
    """Mean cross-entropy of labels (B, n_tgt) given the source (B, n_src) and the decoder's input tgt_in
    (B, n_tgt), and the gradient of every weight as a Seq2SeqWeights tree (one shared table: its
    gradient is the sum over the encoder's, the decoder's embeddings and a tied W_vocab). Labels −100:
    not learned. Inputs are checked by the caller (`gradients`, the training loop)."""
    counted = labels != -100                              # (B, n_tgt)
    if not counted.any():
        raise QkvError("no label to learn from; give target sentences of at least one token")
    m, h, logits, tapes = taped(weights, cfg, src, src_mask, tgt_in)
    loss, dlogits = token_loss(logits, np.where(counted, labels, 0), counted)
    return loss, backward(dlogits, m, h, weights, cfg, tapes)


def decoder_inputs(labels: np.ndarray, start: int | None, pad: int, from_labels: bool = False) -> np.ndarray:
    """transformers' shift_tokens_right: the decoder reads [start] + labels[:-1], −100 read as pad.
    from_labels (mBART's shift): start is each row's last token that is not pad (its language id), at
    index (number of non-pad tokens) − 1 as mBART counts it."""
    labels = np.where(labels == -100, pad, labels)                          # (B, n_tgt)
    tgt = np.empty_like(labels)
    if from_labels:
        last = np.maximum((labels != pad).sum(axis=1) - 1, 0)               # (B,) torch's gather would wrap −1: 0 here
        tgt[:, 0] = labels[np.arange(len(labels)), last]
    else:
        tgt[:, 0] = start
    tgt[:, 1:] = labels[:, :-1]
    return tgt
