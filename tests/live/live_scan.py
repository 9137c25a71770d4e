"""What the live checks of the state-space and linear-attention families (test_live_mamba.py, _mamba2, _jamba,
_granitemoehybrid, _falcon_h1, _minimax) share: writing greedily beside transformers, a model qkv saves read back by
transformers, and a Mamba-2 mixer's implied attention in float64. Each family's file keeps its configs and what its
reference returns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from live_helpers import TOL_HIDDEN, decoder_positions, padded_batch, perturb_, save

import qkv
from qkv.core.mamba2 import implied_attention, mixer_parts
from qkv.core.stack import transformer
from qkv.core.trace import Recorder

NEW = 8                 # tokens written in each greedy check


def build_scan(cls, config, seed: int) -> torch.nn.Module:
    """transformers' CLS(CONFIG) made under SEED, every parameter perturbed (SEED + 1), float32, eval mode (the
    attention implementation the config says: `live_helpers.build` switches to eager, which a scan has none of)."""
    torch.manual_seed(seed)
    model = cls(config)
    perturb_(model, seed + 1)
    return model.float().eval()


def check_streams(model, ours, vocab: int, side: str, seed: int, key: str = "residual", hidden=None,
                  positions: bool = False, attentions: bool = False) -> tuple:
    """A padded batch (lengths 11, 7, 9 padded on SIDE, ids of SEED): qkv's logits and each layer's stream KEY
    ("residual": what enters it; "residual_out": what leaves it) equal transformers' (its hidden_states[layer]) at
    the real positions within TOL_HIDDEN; HIDDEN(model, ids, mask): transformers' final hidden states, compared too.
    POSITIONS: transformers gets positions counted over the real tokens (as generate gives them); ATTENTIONS: its
    weights are returned, and qkv's recorded. (transformers' output, qkv's Recorder, the real positions (B, n))."""
    ids, mask = padded_batch(vocab, [11, 7, 9], seed, side=side)
    more = {"position_ids": torch.from_numpy(decoder_positions(mask))} if positions else {}
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_hidden_states=True,
                    output_attentions=attentions, use_cache=False, **more)
    rec = Recorder(keep=(key, "attentions") if attentions else (key,))
    ours_hidden, logits = transformer(ours.weights, ours.config, ids, mask, rec=rec)
    real = mask.astype(bool)
    assert np.abs(logits - ref.logits.numpy())[real].max() < TOL_HIDDEN
    if hidden is not None:
        assert np.abs(ours_hidden - hidden(model, ids, mask))[real].max() < TOL_HIDDEN
    for layer in range(ours.config.n_layers):
        got = rec.store[layer][key]
        assert np.abs(got - ref.hidden_states[layer].numpy())[real].max() < TOL_HIDDEN, (side, layer)
    return ref, rec, real


def hf_writing(model, ids: np.ndarray, mask: np.ndarray, cached: bool = True) -> np.ndarray:
    """transformers' greedy ids for IDS (B, n) under MASK + NEW tokens, never stopping early; CACHED: with its cache
    (without it, each token from a full pass)."""
    with torch.no_grad():
        return model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW,
                              do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=cached).numpy()


def check_writing(model, ours, vocab: int, seed: int, cached: bool = True) -> np.ndarray:
    """One prompt of 9 ids (SEED): qkv's greedy ids with its cache and without are transformers'; a left-padded batch
    of prompts of 9 and 6 (SEED + 1) written together: qkv's are transformers' (its padding masked in the first pass
    only). CACHED: transformers writes with its cache (where its cached writing is its full pass's). The prompt."""
    prompt = padded_batch(vocab, [9], seed)[0]
    want = hf_writing(model, prompt, np.ones_like(prompt), cached)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False), want)
    assert np.array_equal(ours.generate(prompt, max_new_tokens=NEW, stop_at_eos=False, use_cache=False), want)
    ids, mask = padded_batch(vocab, [9, 6], seed + 1, side="left")
    want = hf_writing(model, ids, mask, cached)
    assert np.array_equal(ours.generate(ids, max_new_tokens=NEW, attention_mask=mask, stop_at_eos=False), want)
    return prompt


def check_read_back(cls, model, ours, prompt: np.ndarray, directory: Path, **call) -> None:
    """What qkv saves of OURS (to DIRECTORY), transformers reads (cls.from_pretrained) with MODEL's logits on PROMPT
    (1, n) within 1e-5; CALL: more arguments of both passes (use_cache=False)."""
    back = cls.from_pretrained(ours.save(directory)).eval()
    with torch.no_grad():
        a = back(input_ids=torch.from_numpy(prompt), **call).logits.numpy()
        b = model(input_ids=torch.from_numpy(prompt), **call).logits.numpy()
    assert np.abs(a - b).max() < 1e-5


def check_mamba2_identity(path: Path) -> None:
    """Each Mamba-2 mixer of the checkpoint at PATH (every layer's, or a hybrid's Mamba-2 layers'): its implied
    attention applied to the scan's input is the scan's output, every head, to 1e-9 in float64."""
    ours64 = qkv.load(path, dtype=np.float64)
    ids = padded_batch(ours64.config.vocab_size, [13], 5)[0]
    trace = ours64.run(ids[0].tolist(), keep=("attn_in",))
    mixers = [(i, b.mixer) for i, b in enumerate(ours64.weights.blocks) if getattr(b, "mixer", None) is not None]
    assert mixers
    for layer, mixer in mixers:
        f = mixer_parts(trace.layer(layer).attn_in[None], mixer, ours64.config.mamba, ours64.config.activation)
        y = np.einsum("bhts,bshp->bthp", implied_attention(f.dt, f.A, f.Bm, f.Cm), f.x)
        assert np.abs(y - f.y).max() < 1e-9, layer


def check_original_embedding_name(cls, config, directory: Path) -> None:
    """state-spaces' checkpoints (Mamba, Mamba-2) say backbone.embedding.weight, which transformers renames when
    loading: CLS(CONFIG) saved to DIRECTORY under that name reads as transformers' model (logits within TOL_HIDDEN)."""
    from safetensors.torch import load_file, save_file

    model = build_scan(cls, config, 77)
    save(model, directory)
    tensors = load_file(directory / "model.safetensors")
    tensors["backbone.embedding.weight"] = tensors.pop("backbone.embeddings.weight")
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    ids = padded_batch(211, [9], 5)[0]
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert np.abs(qkv.load(directory).forward(ids).logits - want).max() < TOL_HIDDEN
