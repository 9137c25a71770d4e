"""The weights laid out for speed: fewer, larger products, each matrix in the order BLAS reads fastest.

A decoding step multiplies one row by every matrix of the model, so it is bound by how fast
the weights stream from memory. Two things make them stream faster (measured on SmolLM2-135M,
one BLAS thread, docs/benchmarks.md):

  - each W (in, out) as a C-contiguous (row-major) array, rather than the transposed view of
    a checkpoint's (out, in) matrix: NumPy then asks OpenBLAS for its "N" matrix-vector
    kernel, which streams the rows ~1.4× faster than the "T" kernel over the same bytes;
  - one product instead of three for Q, K, V and one instead of two for SwiGLU's gate and up:
    W_QKV = [W_Q | W_K | W_V] and W_gate_in = [W_gate | W_in], side by side.

The guide's names stay: W_Q, W_K, W_V are views of W_QKV's columns (W_gate, W_in of
W_gate_in), so `weights.blocks[i].attn.W_Q` is still (d_model, H·d_k) and still the matrix
the math multiplies by. A tied W_vocab becomes a (d_model, V) C-contiguous array and the
embedding table its transposed view (one table, as before).

Every array is copied once into memory of its own, so nothing keeps the checkpoint's
memory-mapped file alive (its pages would otherwise count twice). `Model` does this for
decoders only: encoders never decode, their products have many rows (where the layout does
not matter), and their weights stay memory-mapped, shared by every process that loads them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from ..runtime.stored import StoredMatrix, StoredTable
from .weights import AttentionWeights, BlockWeights, FFNWeights, MoEWeights, NormWeights, Weights, ffns_of


def side_by_side(*matrices: np.ndarray) -> tuple[np.ndarray | None, list[np.ndarray]]:
    """[W_1 | W_2 | …] as one C-contiguous (in, Σ out) array, and each W_i as a view of its columns
    (stored matrices: their blocks joined, each W_i a view of its rows of the joined blocks; stored matrices of
    different kinds, as llama.cpp's Q4_K_M mixes Q4_K and Q6_K: (None, the matrices), multiplied one by one)."""
    if unjoinable(matrices):
        return None, list(matrices)
    if all(isinstance(W, StoredMatrix) for W in matrices):
        fused = StoredMatrix.joined(list(matrices))
        ends = np.cumsum([0] + [W.d_out for W in matrices])
        return fused, [fused.rows(slice(int(a), int(b))) for a, b in zip(ends, ends[1:])]
    fused = np.empty((matrices[0].shape[0], sum(W.shape[1] for W in matrices)),
                     dtype=np.result_type(*matrices), order="C")    # (in, Σ out)
    np.concatenate(matrices, axis=1, out=fused)
    views, start = [], 0
    for W in matrices:
        views.append(fused[:, start:start + W.shape[1]])       # (in, out_i), a view
        start += W.shape[1]
    return fused, views


def unjoinable(matrices) -> bool:
    """Stored matrices whose blocks cannot stand side by side (different kinds or widths)."""
    return (all(isinstance(W, StoredMatrix) for W in matrices)
            and len({(W.kind, W.d_in) for W in matrices}) > 1)


def _c(a: np.ndarray | None) -> np.ndarray | None:
    if isinstance(a, (StoredMatrix, StoredTable)):
        return a                                             # blocks stay where the file has them
    return None if a is None else np.array(a, order="C", copy=True)


def _norm(w: NormWeights | None) -> NormWeights | None:
    return None if w is None else NormWeights(_c(w.weight), _c(w.bias), w.stored_offset)


def _attention(w: AttentionWeights) -> AttentionWeights:
    W_QKV, (W_Q, W_K, W_V) = side_by_side(w.W_Q, w.W_K, w.W_V)
    return AttentionWeights(W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=_c(w.W_O), b_Q=_c(w.b_Q), b_K=_c(w.b_K), b_V=_c(w.b_V),
                            q_norm=_norm(w.q_norm), k_norm=_norm(w.k_norm),
                            b_O=_c(w.b_O), sinks=_c(w.sinks), W_Q_b=_c(w.W_Q_b), q_latent_norm=_norm(w.q_latent_norm),
                            kv_latent_norm=_norm(w.kv_latent_norm), W_KV_b=_c(w.W_KV_b), W_QKV=W_QKV,
                            W_Kr=_c(w.W_Kr), b_Kr=_c(w.b_Kr), W_Qr=_c(w.W_Qr), b_Qr=_c(w.b_Qr),
                            W_G=_c(w.W_G), b_G=_c(w.b_G))


def _ffn(w: FFNWeights | MoEWeights) -> FFNWeights | MoEWeights:
    if isinstance(w, MoEWeights):                                # each expert laid out as a dense FFN
        return MoEWeights(W_router=_c(w.W_router), experts=[_ffn(e) for e in w.experts],
                          shared=None if w.shared is None else _ffn(w.shared), W_shared_gate=_c(w.W_shared_gate),
                          b_choice=_c(w.b_choice), b_router=_c(w.b_router))
    if w.W_gate is None:
        return FFNWeights(W_in=_c(w.W_in), W_out=_c(w.W_out), b_in=_c(w.b_in), b_out=_c(w.b_out), xielu=w.xielu)
    W_gate_in, (W_gate, W_in) = side_by_side(w.W_gate, w.W_in)
    return FFNWeights(W_in=W_in, W_out=_c(w.W_out), b_in=_c(w.b_in), b_out=_c(w.b_out), W_gate=W_gate,
                      b_gate=_c(w.b_gate), W_gate_in=W_gate_in)


def _laid_out(W) -> bool:
    """A matrix as fast_layout leaves it: C order, or kept as stored."""
    return isinstance(W, (StoredMatrix, StoredTable)) or W.flags.c_contiguous


def _views_of(part, whole) -> bool:
    if isinstance(whole, StoredMatrix):
        return isinstance(part, StoredMatrix) and np.shares_memory(part.raw, whole.raw)
    return isinstance(part, np.ndarray) and np.shares_memory(part, whole)


def is_fast(weights: Weights) -> bool:
    """Whether `weights` is already laid out by `fast_layout` (its fused arrays and the named views agree)."""
    for b in weights.blocks:
        a = b.attn
        if a is None:                                    # a Mamba block (core/mamba.py): nothing to fuse
            continue
        if a.W_QKV is None and not unjoinable((a.W_Q, a.W_K, a.W_V)):
            return False
        if (a.W_QKV is not None and (not _laid_out(a.W_QKV) or not _views_of(a.W_Q, a.W_QKV))) or not _laid_out(a.W_O):
            return False
        for f in ffns_of(b.ffn):
            if (f.W_gate is not None and not unjoinable((f.W_gate, f.W_in))
                    and (f.W_gate_in is None or not _views_of(f.W_in, f.W_gate_in))):
                return False
            if not _laid_out(f.W_out):
                return False
    return weights.W_vocab is None or _laid_out(weights.W_vocab)


def fast_layout(weights: Weights, after_copy: Callable[[], None] | None = None) -> Weights:
    """The same weights (equal values, same names and shapes) laid out for speed; the input is left as it is.

    Idempotent: weights already laid out are returned unchanged. `after_copy` runs after each
    block and table is copied: a loader passes its TensorStore's `release`, so the pages of the
    mapped file just read leave the process and memory peaks at one copy of the weights, not two.
    """
    if is_fast(weights):
        return weights
    done = after_copy or (lambda: None)
    if isinstance(weights.W_vocab, StoredMatrix) or isinstance(weights.tok_embed, StoredTable):
        tied = isinstance(weights.tok_embed, StoredTable) and weights.tok_embed.matrix is weights.W_vocab
    else:
        tied = weights.W_vocab is not None and np.shares_memory(weights.W_vocab, weights.tok_embed)
    W_vocab = _c(weights.W_vocab)                                # (d_model, V), C order
    tok_embed = W_vocab.T if tied else _c(weights.tok_embed)     # tied: (V, d_model), a view of W_vocab
    done()
    blocks = []
    for b in weights.blocks:
        if b.attn is None:                                       # a Mamba block: kept as it is
            blocks.append(b)
            continue
        blocks.append(replace(b, attn_norm=_norm(b.attn_norm), attn=_attention(b.attn),   # (a subclass's own
                              ffn_norm=_norm(b.ffn_norm), ffn=_ffn(b.ffn),               # fields kept: Falcon-H1's
                              attn_out_norm=_norm(b.attn_out_norm),                      # mixer beside attention)
                              ffn_out_norm=_norm(b.ffn_out_norm), conv=b.conv, conv_norm=_norm(b.conv_norm)))
        done()
    return replace(weights, tok_embed=tok_embed, blocks=blocks, pos_embed=_c(weights.pos_embed),
                   type_embed=_c(weights.type_embed), embed_norm=_norm(weights.embed_norm),
                   final_norm=_norm(weights.final_norm), W_vocab=W_vocab, b_vocab=_c(weights.b_vocab),
                   embed_in=_c(weights.embed_in), unembed_in=_c(weights.unembed_in))
