"""qkv's interpretability tools against TransformerLens (make test-live), on the GPT-2 fixture.

TransformerLens 4 wraps the transformers model in a TransformerBridge; with
`enable_compatibility_mode(no_processing=True)` its weights and numbers are the raw model's
(no LayerNorm folding, no centring), and its cache has the HookedTransformer hook names.

    logit lens         qkv `logit_lens` row l  =  TL `accumulated_resid(apply_ln=True)[l] @ W_U + b_U`
                       (TL's rows: resid_pre 0..L-1, then the last resid_post: the same L+1 states)
    direct logit attr. qkv `direct_logit_attribution` = TL `logit_attrs` of `stack_head_results` and
                       `decompose_resid`, the final LN's scale frozen. TL's documented route folds the
                       final LN's γ into W_U (fold_ln=True) and β into b_U; centring and value-bias
                       folding stay off, so each head's Z and output are the raw model's.
    head ablation      qkv `forward(ablate=[(l, h)], how="zero")` = TL with blocks.l.attn.hook_z[:, :, h] = 0
    induction score    qkv `pattern_score(A, induction_pattern(ids))` = TL `detect_head(.., "induction_head")`
                       with its defaults (error_measure "mul", exclude_bos and exclude_current_token
                       off): the same definition, Σ(A ⊙ P) / ΣA with the same P. qkv has no BOS or
                       current-token exclusion; TL's defaults leave both in, as qkv does.

All within 1e-4 max-abs (float32).
"""

from __future__ import annotations

from importlib.metadata import version

import numpy as np
import pytest
import torch  # module-level imports: without the reference stack these tests fail, never skip
from transformer_lens import TransformerBridge
from transformer_lens.head_detector import detect_head
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

import qkv
from conftest import MODELS
from live_helpers import TOL_HIDDEN, max_abs
from qkv.analysis import direct_logit_attribution, logit_lens
from qkv.analysis.detectors import induction_pattern, pattern_score

pytestmark = pytest.mark.live

FIXTURE = MODELS / "gpt2"
TARGET, OTHER = 17, 42          # the logit difference that direct logit attribution explains


def bridge(**processing) -> TransformerBridge:
    """The fixture in TransformerLens, eager attention, with the given weight processing."""
    hf = AutoModelForCausalLM.from_pretrained(FIXTURE, dtype=torch.float32, attn_implementation="eager").eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(FIXTURE, bos_token="<s>")
    tl = TransformerBridge.boot_transformers(str(FIXTURE), hf_model=hf, tokenizer=tokenizer)
    tl.enable_compatibility_mode(disable_warnings=True, **processing)
    return tl


@pytest.fixture(scope="module")
def raw() -> TransformerBridge:
    """The raw model's numbers: no folding, no centring."""
    return bridge(no_processing=True)


@pytest.fixture(scope="module")
def folded() -> TransformerBridge:
    """The final LN's γ folded into W_U and β into b_U (TL's route for DLA), nothing centred."""
    return bridge(fold_ln=True, center_writing_weights=False, center_unembed=False, fold_value_biases=False)


@pytest.fixture(scope="module")
def model():
    return qkv.load(FIXTURE)


@pytest.fixture(scope="module")
def ids() -> np.ndarray:
    return np.random.default_rng(3).integers(3, 400, 9)            # (n,) no special tokens


def test_transformer_lens_is_the_raw_model(raw, model, ids):
    """The bridge runs the fixture as qkv does (else the comparisons below would mean nothing)."""
    with torch.no_grad():
        theirs = raw(torch.as_tensor(ids[None])).numpy()
    error = max_abs(model.forward(ids[None]).logits, theirs)
    print(f"transformer-lens {version('transformer-lens')}: logits {error:.2e}")
    assert error <= TOL_HIDDEN


def test_logit_lens_equals_accumulated_resid(raw, model, ids):
    with torch.no_grad():
        _, cache = raw.run_with_cache(torch.as_tensor(ids[None]))
        resid, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)   # (L+1, 1, n, d)
        theirs = (resid[:, 0] @ raw.W_U + raw.b_U).numpy()                          # (L+1, n, V)
    L = model.config.n_layers
    assert labels == [f"{l}_pre" for l in range(L)] + ["final_post"]
    ours = logit_lens(model, ids.tolist())
    assert ours.shape == theirs.shape == (L + 1, len(ids), model.config.vocab_size)
    per_layer = np.abs(ours - theirs).max(axis=(1, 2))
    print("logit lens per layer " + " ".join(f"{e:.1e}" for e in per_layer))
    assert per_layer.max() <= TOL_HIDDEN


def test_direct_logit_attribution_equals_logit_attrs(folded, model, ids):
    ours = direct_logit_attribution(model, ids.tolist(), TARGET, OTHER)
    L, H = model.config.n_layers, model.config.n_heads
    with torch.no_grad():
        logits, cache = folded.run_with_cache(torch.as_tensor(ids[None]))

        def attrs(stack):                                                 # (k, 1, d) at the last position
            return cache.logit_attrs(stack, tokens=TARGET, incorrect_tokens=OTHER, pos_slice=-1).numpy()[:, 0]

        heads = attrs(cache.stack_head_results(layer=-1, pos_slice=-1)).reshape(L, H)
        parts, labels = cache.decompose_resid(layer=-1, mode="full", pos_slice=-1, return_labels=True)
        parts = dict(zip(labels, attrs(parts)))
        b_O = attrs(torch.stack([folded.blocks[l].attn.b_O for l in range(L)])[:, None])     # (L,)
        b_out = attrs(torch.stack([folded.blocks[l].mlp.b_out for l in range(L)])[:, None])  # (L,)
        b_U = float(folded.b_U[TARGET] - folded.b_U[OTHER])             # β·(W_U[t] − W_U[o]) + b_vocab
        logit = float(logits[0, -1, TARGET] - logits[0, -1, OTHER])
    assert labels == ["embed", "pos_embed"] + [f"{l}_{k}" for l in range(L) for k in ("attn_out", "mlp_out")]
    checks = {
        "heads": max_abs(ours.heads, heads),
        "ffns": max_abs(ours.ffns, np.array([parts[f"{l}_mlp_out"] for l in range(L)]) - b_out),
        "embeddings": abs(ours.rest["embeddings"] - (parts["embed"] + parts["pos_embed"])),
        "b_O": abs(ours.rest["attention biases b_O"] - b_O.sum()),
        "b_out": abs(ours.rest["FFN biases b_out"] - b_out.sum()),
        "β + b_vocab": abs(ours.rest["final norm bias β"] + ours.rest["vocabulary bias b_vocab"] - b_U),
        "logit": abs(ours.logit - logit),
    }
    print("direct logit attribution " + " ".join(f"{k} {v:.1e}" for k, v in checks.items()))
    assert max(checks.values()) <= TOL_HIDDEN
    # TL's attention layers are its heads plus b_O: the split qkv reports
    for l in range(L):
        assert abs(parts[f"{l}_attn_out"] - (heads[l].sum() + b_O[l])) <= TOL_HIDDEN
    assert abs(np.abs(heads).max()) > 10 * TOL_HIDDEN                   # the heads do write into the logit


@pytest.mark.parametrize("layer, head", [(0, 0), (0, 3), (1, 2)])
def test_zero_ablation_equals_zeroed_hook_z(raw, model, ids, layer, head):
    def zero(z, hook):                                                    # z (B, n, H, d_k)
        z = z.clone()
        z[:, :, head] = 0.0
        return z

    with torch.no_grad():
        theirs = raw.run_with_hooks(torch.as_tensor(ids[None]),
                                    fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero)]).numpy()
    ours = model.forward(ids[None], ablate=[(layer, head)], how="zero").logits
    plain = model.forward(ids[None]).logits
    error = max_abs(ours, theirs)
    print(f"ablate L{layer}H{head}: {error:.2e} (the ablation moves the logits by {max_abs(ours, plain):.2e})")
    assert max_abs(ours, plain) > 10 * TOL_HIDDEN                        # the ablation does something
    assert error <= TOL_HIDDEN


def test_induction_scores_equal_detect_head(raw, model):
    text = " the cat sat on the mat and looked at a red door near the old wall"
    tokens = raw.to_tokens(text + text)                                   # (1, n) TL's tokens (with its BOS)
    ids = tokens[0].numpy()
    pattern = induction_pattern(ids)                                      # (n, n)
    assert pattern.sum() >= len(ids) // 3                                 # the second copy can match
    theirs = detect_head(raw, text + text, "induction_head").numpy()     # (L, H)
    att = model.forward(ids[None]).attentions[:, 0]                      # (L, H, n, n)
    ours = pattern_score(att, pattern)
    error = max_abs(ours, theirs)
    print(f"induction scores {error:.2e}; range {ours.min():.3f}..{ours.max():.3f}")
    assert error <= TOL_HIDDEN
