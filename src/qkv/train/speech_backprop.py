"""Training Whisper: its loss, and the gradient of every weight through the decoder, the cross-attention, the
encoder and the two convolutions in front of it.

    front     F = GELU(conv₂(GELU(conv₁(X))))          X (B, 2·S, mels) → (B, S, d_model); conv₂ of stride 2
    encoder   M = Blocks_enc(F + P_enc)                  the encoder–decoder's own pass (qkv.core.seq2seq_backward),
    decoder   Y = Blocks_dec(E[tgt_in] + P_dec, M)       F given as the encoder's "token embeddings"
    loss      mean −log softmax(Y·Eᵀ)[label]             labels −100 are not learned

Backwards: seq2seq_backward gives every weight's gradient and dF (the gradient of its source tokens); the
convolutions' backward is here (`front_backward`):

    h = GELU(c),  c = windows(x)·W + b      dc = dh ⊙ GELU'(c);  dW = windowsᵀ·dc,  db = Σ dc,
                                            dx = each window's share of dc·Wᵀ, added back where it read x

The loss is transformers' WhisperForConditionalGeneration(input_features, labels=…) with decoder_input_ids given.
The encoder's position table, which transformers keeps fixed, is learned here as the other tables are.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..core.blocks import convolve
from ..core.blocks_backward import linear
from ..core.config import ModelConfig
from ..core.ops import ACTIVATION_BACKWARDS, ACTIVATIONS
from ..core.seq2seq_backward import backward, taped
from ..core.weights import ConvWeights, Seq2SeqWeights
from ..runtime.errors import QkvError
from .backprop import token_loss


@dataclass
class FrontTape:
    """What each convolution read and made before its GELU: the backward's inputs."""

    inputs: list[np.ndarray]             # x of each convolution (B, T_in, C_in)
    pre: list[np.ndarray]                # c = conv(x) (B, T_out, C_out)


def front(x: np.ndarray, convs: list[ConvWeights], tape: FrontTape | None = None) -> np.ndarray:
    """Log-mel frames x (B, 2·S, mels) through the convolutions, each followed by GELU (erf): (B, S, d_model). The
    forward of qkv.core.blocks.embed's front end, keeping what the backward reads in TAPE."""
    for conv in convs:
        c = convolve(x, conv)                                                # (B, T_out, C_out)
        if tape is not None:
            tape.inputs.append(x)
            tape.pre.append(c)
        x = ACTIVATIONS["gelu"](c)                                           # (B, T_out, C_out)
    return x


def conv_backward(dc: np.ndarray, x: np.ndarray, conv: ConvWeights) -> tuple[np.ndarray, ConvWeights]:
    """(dx, the convolution's gradients) of c = windows(x)·W + b, dc (B, T_out, C_out), x (B, T_in, C_in): output
    step t read input rows t·stride − padding + j, j < kernel."""
    B, T, C = x.shape
    k, s, p = conv.kernel, conv.stride, conv.padding
    T_out = dc.shape[1]
    padded = np.pad(x, ((0, 0), (p, p), (0, 0)))                              # (B, T + 2p, C)
    span = s * (T_out - 1) + 1
    windows = np.concatenate([padded[:, j:j + span:s] for j in range(k)], axis=-1)   # (B, T_out, k·C)
    dwin, dW, db = linear(dc, windows, conv.W, True)                          # (B, T_out, k·C), (k·C, C_out), (C_out,)
    dpad = np.zeros_like(padded)                                              # (B, T + 2p, C)
    for j in range(k):                                                        # window j read rows j, j + s, …
        dpad[:, j:j + span:s] += dwin[..., j * C:(j + 1) * C]
    return dpad[:, p:p + T], ConvWeights(dW, db, k, s, p)


def front_backward(dout: np.ndarray, convs: list[ConvWeights], tape: FrontTape) -> tuple[np.ndarray, list[ConvWeights]]:
    """(d frames, each convolution's gradients) of `front`, from dout (B, S, d_model), its output's gradient."""
    grads: list[ConvWeights] = [None] * len(convs)                           # type: ignore[list-item]
    d = dout
    for i in reversed(range(len(convs))):
        dc = ACTIVATION_BACKWARDS["gelu"](d, tape.pre[i])                    # (B, T_out, C_out)
        d, grads[i] = conv_backward(dc, tape.inputs[i], convs[i])
    return d, grads


def without_front(weights: Seq2SeqWeights) -> Seq2SeqWeights:
    """The same weights with the encoder reading given rows (the front's output) as its token embeddings: no
    convolutions, and a table of its own (one row, never read: its gradient stays apart from the decoder's)."""
    enc = weights.encoder
    own = np.zeros((1, enc.pos_embed.shape[1]), enc.pos_embed.dtype)        # (1, d_model)
    return Seq2SeqWeights(replace(enc, front=None, tok_embed=own), weights.decoder)


def loss_and_grads(weights: Seq2SeqWeights, cfg: ModelConfig, frames: np.ndarray, tgt_in: np.ndarray,
                   labels: np.ndarray) -> tuple[float, Seq2SeqWeights]:
    """Mean cross-entropy of LABELS (B, n_tgt) (−100: not learned) given log-mel FRAMES (B, 2·S, mels) and the
    decoder's input TGT_IN (B, n_tgt), and every weight's gradient as a Seq2SeqWeights tree whose encoder holds
    the convolutions' (`front`) and whose table is the decoder's (tied to W_vocab: one gradient)."""
    counted = labels != -100                                                  # (B, n_tgt)
    if not counted.any():
        raise QkvError("no label to learn from; give transcripts of at least one token")
    convs = weights.encoder.front
    if convs is None:
        raise QkvError("speech training reads log-mel frames through Whisper's convolutions; give a Whisper model")
    tape = FrontTape([], [])
    rows = front(frames, convs, tape)                                         # (B, S, d_model)
    plain = without_front(weights)
    ids = np.zeros(rows.shape[:2], np.int64)                                  # (B, S): the rows are the tokens
    m, h, logits, tapes = taped(plain, cfg, ids, np.ones_like(ids), tgt_in, source_tokens=rows)
    loss, dlogits = token_loss(logits, np.where(counted, labels, 0), counted)
    given: dict[str, np.ndarray] = {}
    grads = backward(dlogits, m, h, plain, cfg, tapes, inputs=given)
    _, g_front = front_backward(given["source_tokens"], convs, tape)
    grads.encoder.front = g_front
    grads.encoder.tok_embed = grads.decoder.tok_embed                         # the one table (tied W_vocab)
    return loss, grads
