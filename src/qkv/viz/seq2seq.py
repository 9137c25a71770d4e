"""The three kinds of attention of an encoder–decoder, as the views show them (guide: self-cross).

    encoder   source × source     self-attention, bidirectional          (L_enc, H, n_src, n_src)
    decoder   target × target     self-attention, causal                 (L_dec, H, n_tgt, n_tgt)
    cross     target × source     Q from the decoder, K and V from the   (L_dec, H, n_tgt, n_src)
                                  encoder's output

`Seq2SeqModel.run` gives the decoder's Trace with `.encoder` and `.cross`. Its rows are the tokens
the decoder READ: row t reads target token t (row 0 the start token) and its logits choose token
t + 1. The cross view labels each row by the token it WROTE instead — "when the decoder writes 'I'
it looks at '나는'" — so `written` shifts the labels by one: row t is labelled with token t + 1,
and the last row, whose choice the trace does not hold, with the model's most likely next token
(argmax of its logits: the end of the sentence, for a translation that stopped there).

    kind_traces(trace, tokenizer)     {"cross": …, "encoder": …, "decoder": …}, each a plain Trace
    save_seq2seq_figures(trace, out)  cross heatmaps per decoder layer, both stacks' self-attention
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..runtime.errors import QkvError
from ..core.trace import LayerTrace, Trace
from .drawing import check_formats, save_all
from .figures import focused_head, head_heatmap, layer_grid, model_overview

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..runtime.io import FileBatch

KINDS = ("encoder", "decoder", "cross")          # the viewer's order; "cross" is shown first
UNKNOWN_NEXT = "…"                               # the last row's label when neither logits nor tokenizer tell it

NAMES = {"encoder": "Encoder", "decoder": "Decoder", "cross": "Cross"}
CAPTIONS = {
    "encoder": "Encoder self-attention: source tokens (rows, the queries) against source tokens (columns, "
               "the keys). Bidirectional: every source token sees every other.",
    "decoder": "Decoder self-attention: target tokens as the decoder read them (row t reads token t; the first "
               "is the start token) against the target so far (columns); causal: a token never sees later ones.",
    "cross": "Cross-attention: target tokens (rows, the queries, from the decoder) against source tokens "
             "(columns, the keys and values, from the encoder's output). Each row is labelled by the token it "
             "WROTE: row t is the query that produced target token t + 1 (it reads token t; the last row: the "
             "model's most likely next token).",
}
CROSS_AXES = ("source token (key, from the encoder)", "target token written (row t: query that wrote it)")


def check_seq2seq(trace: Trace) -> None:
    """An encoder–decoder's trace (Seq2SeqModel.run), with attention weights in all three parts."""
    if trace.encoder is None or trace.cross is None:
        raise QkvError("this trace is not an encoder–decoder's; make it with Seq2SeqModel.run or .generate(trace=True)")
    for what, t in (("encoder", trace.encoder), ("decoder", trace), ("cross", trace.cross)):
        if t.attentions is None:
            raise QkvError(f"the trace's {what} holds no attention weights; run the model with keep=('attentions',)")


def written(trace: Trace, tokenizer=None) -> tuple[np.ndarray, list[str]]:
    """(ids (n_tgt,), tokens) of what each decoder row wrote: row t → token t + 1 of the decoder's
    input; the last row → the argmax of its logits (id -1 when the trace kept no logits), spelled by
    TOKENIZER (UNKNOWN_NEXT without one)."""
    ids = np.asarray(trace.ids, dtype=np.int64)                              # (n_tgt,)
    last = int(np.argmax(trace.logits[-1])) if trace.logits is not None else -1
    token = UNKNOWN_NEXT if last < 0 or tokenizer is None else tokenizer.id_to_token(last)
    return np.append(ids[1:], last), [*trace.tokens[1:], token]


def cross_written(trace: Trace, tokenizer=None) -> Trace:
    """The cross-attention trace with its rows labelled by what they wrote (`written`); the same
    attention arrays (n_tgt × n_src). Every row wrote a target token, none is a prompt: no
    prompt_length (the decoder's trace says what was generated)."""
    c = trace.cross
    ids, tokens = written(trace, tokenizer)
    return Trace(tokens=tokens, ids=ids, hidden=None, logits=None, layers=c.layers, text=trace.text,
                 prompt_length=None, model=c.model, family=c.family,
                 causal=False, spelling=c.spelling, source_tokens=c.source_tokens)


def kind_traces(trace: Trace, tokenizer=None) -> dict[str, Trace]:
    """The encoder's, the decoder's and the cross-attention's traces (cross rows: what they wrote)."""
    check_seq2seq(trace)
    decoder = replace(trace, encoder=None, cross=None)                       # the decoder's own, alone
    return {"encoder": trace.encoder, "decoder": decoder, "cross": cross_written(trace, tokenizer)}


def mean_of_heads(trace: Trace, layer: int) -> Trace:
    """A trace of one layer whose only "head" is the mean over the layer's heads (H, n_q, n_k) → (1, n_q, n_k)."""
    lt = trace.layer(layer)
    mean = lt.attentions.mean(axis=0, keepdims=True)                         # (1, n_q, n_k)
    return Trace(tokens=trace.tokens, ids=trace.ids, hidden=None, logits=None, text=trace.text,
                 layers={lt.layer: LayerTrace(layer=lt.layer, attentions=mean)}, model=trace.model,
                 family=trace.family, causal=trace.causal, spelling=trace.spelling, source_tokens=trace.source_tokens)


def save_seq2seq_figures(trace: Trace, out: str | os.PathLike | "FileBatch", *, layer: int = -1,
                         head: int | None = None, tokenizer=None, model_name: str | None = None,
                         formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """The figures of an encoder–decoder's trace into OUT (a directory, all files or none, or a FileBatch):

    cross_heatmap_layer{L}_head{h}  one head's cross-attention of decoder layer L (default: its most
                                    focused head), the weights written in the cells
    cross_mean_layer{L}             the mean of layer L's heads: the alignment of target and source words
    cross_layer{l}                  each decoder layer's heads side by side
    encoder_overview, decoder_overview   every layer × head of each stack's self-attention
    """
    formats = check_formats(formats)
    kinds = kind_traces(trace, tokenizer)
    cross, name = kinds["cross"], trace.model if model_name is None else model_name
    layer = cross.layer(layer).layer
    head = focused_head(cross, layer) if head is None else head
    H = cross.layer(layer).attentions.shape[0]
    makers: list[tuple[str, Callable[[], "Figure"]]] = [
        (f"cross_heatmap_layer{layer}_head{head}",
         lambda: head_heatmap(cross, layer, head, model_name=f"{name} cross-attention", axes=CROSS_AXES)),
        (f"cross_mean_layer{layer}",
         lambda: head_heatmap(mean_of_heads(cross, layer), layer, 0, model_name=f"{name} cross-attention",
                              what=f"mean of {H} heads", axes=CROSS_AXES)),
    ]
    for l in cross.layer_ids:
        makers.append((f"cross_layer{l}", lambda l=l: layer_grid(
            cross, l, model_name=f"{name} cross-attention",
            axes="rows = target token written, columns = source tokens")))
    makers += [("encoder_overview", lambda: model_overview(kinds["encoder"], model_name=f"{name} encoder self-attention")),
               ("decoder_overview", lambda: model_overview(kinds["decoder"], model_name=f"{name} decoder self-attention"))]
    return save_all(out, makers, formats)
