"""Activation patching (qkv.analysis.patch) and `qkv patch`.

Identities that can fail:
  - patching clean into clean changes nothing: every table is 0, and a real patched pass (every
    head, every position) gives m(corrupted) back within 1e-5 (the normalised effect is refused:
    clean and corrupted give the same metric);
  - patching the whole residual stream entering block 0 gives the full effect, 1; and in the
    table, layer 0's row is 1 at the one token that differs and 0 elsewhere;
  - batched equals unbatched (each patched copy alone, batch=1) within 1e-5;
  - a cell equals the same patch made through the public hooks of a whole forward pass
    (model.run(corrupted, hooks=...)) within 1e-4;
  - on SmolLM2's indirect-object prompt, head 23.3 (the largest direct logit attribution)
    restores a large share of the answer.
Tolerances are on the normalised effect (float32 models).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv.analysis import patch
from qkv.analysis.patch import patch_one
from qkv.viz.interpret_figures import save_patching
from qkv.runtime.errors import QkvError

IOI = "When Mary and John went to the store, John gave a drink to"
IOI_CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"


def inputs(name: str, n: int = 9, at: int = 4):
    """A model, clean ids, corrupted ids (one token changed, at AT) and a metric: the two tokens whose
    logit difference the change moves most (random weights: a small difference would amplify rounding)."""
    model = qkv.load(MODELS / name)
    clean = np.random.default_rng(3).integers(0, model.config.vocab_size, n)
    corrupted = clean.copy()
    corrupted[at] = (clean[at] + 7) % model.config.vocab_size
    moved = model.run(clean, keep=()).logits[-1] - model.run(corrupted, keep=()).logits[-1]     # (V,)
    return model, clean.tolist(), corrupted.tolist(), (int(np.argmax(moved)), int(np.argmin(moved)))


def logit_diff(model, ids, metric, hooks=None) -> float:
    z = model.run(ids, keep=(), hooks=hooks).logits[-1]
    return float(z[metric[0]] - z[metric[1]])


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_patching_clean_into_clean_changes_nothing(name):
    model, clean, _, metric = inputs(name)
    with pytest.raises(QkvError, match="same metric") as e:
        patch(model, clean, clean, metric)
    assert len(str(e.value).splitlines()) == 1
    p = patch(model, clean, clean, metric, normalise=False)
    for table in (p.heads, p.residual, p.attn_out, p.ffn_out):
        assert not table.any()
    assert p.runs == 0 and p.skipped == model.config.n_layers * (model.config.n_heads + 3 * len(clean))
    for what in ("heads", "residual", "attn_out", "ffn_out"):                  # real passes, every head / position
        for layer in range(model.config.n_layers):
            assert abs(patch_one(model, clean, clean, metric, what, layer, normalise=False)) <= 1e-5


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2", "mistral"])
def test_the_whole_residual_stream_is_the_full_effect(name):
    model, clean, corrupted, metric = inputs(name, at=4)
    assert patch_one(model, clean, corrupted, metric, "residual", 0) == pytest.approx(1.0, abs=1e-6)
    p = patch(model, clean, corrupted, metric)
    assert p.residual[0, 4] == pytest.approx(1.0, abs=1e-5)                    # the one token that differs
    assert np.abs(np.delete(p.residual[0], 4)).max() <= 1e-5
    assert np.abs(p.residual[:, :4]).max() == 0                                # a decoder: earlier positions equal
    assert p.heads.shape == (model.config.n_layers, model.config.n_heads)
    assert p.attn_out.shape == p.ffn_out.shape == (model.config.n_layers, len(clean))
    assert np.abs(p.heads).max() > 1e-3                                        # something does carry it


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_batched_equals_unbatched(name):
    model, clean, corrupted, metric = inputs(name)
    batched = patch(model, clean, corrupted, metric)
    alone = patch(model, clean, corrupted, metric, batch=1)
    assert batched.passes < alone.passes and batched.runs == alone.runs
    for what in ("heads", "residual", "attn_out", "ffn_out"):
        assert np.abs(getattr(batched, what) - getattr(alone, what)).max() <= 1e-5, what


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_a_cell_equals_the_same_patch_through_public_hooks(name):
    model, clean, corrupted, metric = inputs(name)
    p = patch(model, clean, corrupted, metric)
    source = model.run(clean)
    m_clean, m_corrupt = logit_diff(model, clean, metric), logit_diff(model, corrupted, metric)
    assert (p.clean, p.corrupted) == (pytest.approx(m_clean, abs=1e-4), pytest.approx(m_corrupt, abs=1e-4))

    def effect(hooks):
        return (logit_diff(model, corrupted, metric, hooks) - m_corrupt) / (m_clean - m_corrupt)

    z = source.layer(1).heads                                                 # (H, n, d_k)
    assert effect({"1.heads.3": lambda v, layer: z[3]}) == pytest.approx(p.heads[1, 3], abs=1e-4)
    a = source.layer(0).attn_out                                              # (n, d_model)

    def one_position(value, layer, p=6):
        value = value.copy()
        value[:, p] = a[p]
        return value
    assert effect({"0.attn_out": one_position}) == pytest.approx(p.attn_out[0, 6], abs=1e-4)
    f = source.layer(1).ffn_out
    assert effect({"1.ffn_out": lambda v, layer: np.where(np.arange(len(clean))[:, None] == 8, f, v)}) \
        == pytest.approx(p.ffn_out[1, 8], abs=1e-4)


def test_an_encoder_with_a_metric_on_hidden_states():
    model = qkv.load(MODELS / "bert")
    rng = np.random.default_rng(0)
    clean = rng.integers(5, model.config.vocab_size, 8).tolist()
    corrupted = list(clean)
    corrupted[3] = (clean[3] + 11) % model.config.vocab_size
    direction = rng.normal(size=model.config.d_model)

    def probe(hidden):                                                        # (B, n, d_model) → (B,)
        return hidden[:, 0] @ direction
    assert patch_one(model, clean, corrupted, probe, "residual", 0) == pytest.approx(1.0, abs=1e-6)
    p = patch(model, clean, corrupted, probe, what=("heads", "residual"))
    assert p.attn_out is None and p.heads.shape == (2, 4)
    assert p.residual[0, 3] == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(QkvError, match="no LM head"):
        patch(model, clean, corrupted, (5, 9))


def test_mistakes_are_one_clear_error():
    model, clean, corrupted, metric = inputs("llama_gqa")
    with pytest.raises(QkvError, match="clean has 9 tokens and corrupted 10"):
        patch(model, clean, corrupted + [1], metric)
    with pytest.raises(QkvError, match="one number per row"):
        patch(model, clean, corrupted, lambda z: z[:, :2])
    with pytest.raises(QkvError, match="unknown patch"):
        patch(model, clean, corrupted, metric, what=("mlp",))
    with pytest.raises(QkvError, match="outside"):
        patch(model, clean, corrupted, (5, 10_000))


def test_smollm2_indirect_object(smollm2):
    """Head 23.3 writes ' Mary' most directly (DLA +2.86); patching it alone restores much of the answer."""
    assert len(smollm2.encode(IOI)[0]) == len(smollm2.encode(IOI_CORRUPTED)[0]) == 14
    effect = patch_one(smollm2, IOI, IOI_CORRUPTED, (" Mary", " John"), "heads", 23, [3])
    assert 0.4 < effect < 0.8                                                 # measured 0.58 (docs/patching.md)


def test_save_and_the_cli(tmp_path, monkeypatch, capsys):
    model, clean, corrupted, metric = inputs("gpt2")
    p = patch(model, clean, corrupted, metric)
    paths = save_patching(p, tmp_path / "py")
    assert sorted(f.name for f in paths) == ["patch.json", "patch.png", "patch.svg"]
    data = json.loads((tmp_path / "py" / "patch.json").read_text())
    assert np.allclose(data["heads"], p.heads, atol=1e-6) and len(data["residual"][0]) == len(clean)

    gpt2 = str(MODELS / "gpt2")
    out = tmp_path / "cli"
    code, text, err = run_main(monkeypatch, capsys, "patch", "the cat sat on the mat", "the dog sat on the mat",
                               "--model", gpt2, "--token", " a", "--other", " the", "--out", str(out))
    assert code == 0 and "L" in text and "patched copies" in text
    lines = err.strip().splitlines()                          # off a terminal: plain progress lines, total known
    written = json.loads((out / "patch.json").read_text())
    n, (L, H) = len(written["labels"]), np.shape(written["heads"])
    total = L * (H + 3 * n)                                   # L × (heads + residual, attn_out, ffn_out positions)
    assert lines[0].startswith("patched ") and lines[0].endswith(" s") and f"/{total} copies" in lines[0]
    assert lines[-1].startswith(f"patched {total}/{total} copies (100%)")
    data = json.loads((out / "patch.json").read_text())
    assert data["labels"][2:4] == ["␣c/␣d", "at/og"] and len(data["heads"]) == 2      # two tokens differ
    assert data["residual"][0][:2] == [0, 0] and (out / "patch.png").is_file()
    code, _, err = run_main(monkeypatch, capsys, "patch", "the cat sat", "the dog sat on the mat", "--model", gpt2,
                            "--token", " a", "--other", " the", "--out", str(tmp_path / "bad"))
    assert code == 2 and "the same count" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")
