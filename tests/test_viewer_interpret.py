"""The viewer's panels beyond attention weights: the "lens", "rollout" and "patch" sections.

Each section is read back from the page the way the browser reads it (the JSON in the
document, its base64 + deflate arrays decoded here with zlib) and compared with an independent
computation: the engine's full logit lens (qkv.analysis.logit_lens, softmax in float64 here),
attention_rollout / attention_flow, and patch(). Tolerances are the documented quantisation:
probabilities ±0.5/65535 (uint16), rollout and flow ±0.5/255 (uint8), effects 5 decimals.
Also: `qkv patch --model minilm` (the sentence-embedding metric) and its identities, the
pages `qkv show / lens / rollout / patch --out` and `generate --trace` write, and bad input.
"""

from __future__ import annotations

import base64
import re
import zlib

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from test_viewer import data_of, random_trace
from qkv.analysis import attention_rollout, logit_lens
from qkv.analysis.lens import KEEP
from qkv.analysis.patch import EMBEDDING, patch, patch_one, sentence_embedding
from qkv.analysis.rollout import MAX_FLOW_WORK, attention_flow, flow_fits
from qkv.analysis.sections import lens_payload, patch_payload, rollout_payload
from qkv.runtime.errors import QkvError
from qkv.viz.html import viewer_html
from qkv.viz.interpret_payload import LENS_K, PROB_PRECISION, lens_section
from qkv.viz.payload import PRECISION

CAT, DOG = "The cat sat on the mat", "The dog sat on the mat"


def unpack(enc: dict) -> np.ndarray:
    """An array of the payload, decoded here from its documented encoding (not with qkv's decoder)."""
    dtype = {"u8": "<u1", "u16": "<u2", "i32": "<i4"}
    q = np.frombuffer(zlib.decompress(base64.b64decode(enc["data"])), dtype[enc["dtype"]]).reshape(enc["shape"])
    return q / enc["scale"] if enc.get("scale") else q


def lens_reference(model, ids, k: int = LENS_K) -> dict:
    """From the engine's (L+1, n, V) logit lens: P(final prediction), its rank, each cell's top k (float64)."""
    z = logit_lens(model, ids).astype(np.float64)                          # (L+1, n, V)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    final = np.argmax(z[-1], axis=-1)                                      # (n,)
    at = z[:, np.arange(z.shape[1]), final]                                # (L+1, n)
    order = np.argsort(-z, axis=-1, kind="stable")[..., :k]                # (L+1, n, k)
    return {"predicted": final, "prob": p[:, np.arange(z.shape[1]), final],
            "rank": 1 + (z > at[..., None]).sum(-1), "top_ids": order, "top_prob": np.take_along_axis(p, order, -1)}


def check_lens(section: dict, ref: dict) -> None:
    assert section["predicted"] == ref["predicted"].tolist()
    assert np.abs(unpack(section["prob"]) - ref["prob"]).max() <= PROB_PRECISION + 1e-6
    assert (unpack(section["rank"]) == ref["rank"]).all()
    assert (unpack(section["top_ids"]) == ref["top_ids"]).all()
    assert np.abs(unpack(section["top_prob"]) - ref["top_prob"]).max() <= PROB_PRECISION + 1e-6


# the lens ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt2", "llama_gqa"])
def test_lens_section_equals_the_engines_logit_lens(name):
    model = qkv.load(MODELS / name)
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, 11).tolist()
    trace = model.run(ids, keep=("attentions",) + KEEP)
    data = data_of(viewer_html(trace, sections={"lens": lens_payload(model, trace)}, view="lens"))
    assert data["view"] == "lens" and data["lens"]["rows"] == model.config.n_layers + 1
    check_lens(data["lens"], lens_reference(model, ids))
    spelled = dict(zip(data["lens"]["spelling"]["ids"], data["lens"]["spelling"]["tokens"]))
    assert all(spelled[i] == model.tokenizer.label(i) for i in unpack(data["lens"]["top_ids"]).ravel())
    # a trace without the residual stream (a generation's) is run again for the lens: the same section
    again = lens_payload(model, model.run(ids, keep=("attentions",)))
    assert again == lens_payload(model, trace)


def test_a_lens_needs_a_decoder(minilm):
    with pytest.raises(QkvError, match="no LM head") as e:
        lens_payload(minilm, minilm.run(CAT, keep=KEEP))
    assert len(str(e.value).splitlines()) == 1


# rollout and flow ----------------------------------------------------------------

def test_rollout_section_equals_attention_rollout_and_flow(minilm):
    trace = minilm.run(CAT, keep=("attentions",))
    data = data_of(viewer_html(trace, sections={"rollout": rollout_payload(trace)}))
    ro = data["rollout"]
    assert np.abs(unpack(ro["rollout"]) - attention_rollout(trace)).max() <= PRECISION + 1e-7
    assert np.abs(unpack(ro["flow"]) - attention_flow(trace)).max() <= PRECISION + 1e-7
    assert data["view"] is None and data["lens"] is None and data["patch"] is None


def test_flow_is_left_out_past_the_limit_the_cli_uses(minilm):
    text = " ".join(["word"] * 30)                                           # 32 tokens: 6 · 32⁴ > MAX_FLOW_WORK
    trace = minilm.run(text, keep=("attentions",))
    n = len(trace.ids)
    assert not flow_fits(6, n) and flow_fits(6, 12)
    with pytest.raises(QkvError, match="too slow"):                          # what qkv rollout --flow says
        attention_flow(trace)
    ro = rollout_payload(trace)
    assert ro["flow"] is None and f"{MAX_FLOW_WORK:,}" in ro["flow_note"]
    assert np.abs(unpack(ro["rollout"]) - attention_rollout(trace)).max() <= PRECISION + 1e-7


# patching ------------------------------------------------------------------------

def test_patch_section_equals_patching(minilm):
    p = patch(minilm, CAT, DOG, EMBEDDING)
    data = data_of(viewer_html(minilm.run(CAT, keep=("attentions",)), sections={"patch": patch_payload(p)},
                               view="patch"))
    section = data["patch"]
    again = patch(minilm, CAT, DOG, EMBEDDING)                                # an independent run of the same patching
    for name in ("heads", "residual", "attn_out", "ffn_out"):
        assert np.abs(np.array(section["tables"][name]) - getattr(again, name)).max() <= 5e-6 + 1e-6
    assert (section["clean"], section["corrupted"], section["metric"]) == (CAT, DOG, again.metric)
    assert section["labels"][2] == "cat/dog" and section["metric_clean"] == pytest.approx(1.0, abs=1e-6)


def test_the_embedding_metric_and_its_identities(minilm):
    h_clean, h_corrupted = (minilm.run(t, keep=()).hidden for t in (CAT, DOG))      # (n, d_model) each
    e = [v.astype(np.float64).mean(0) / np.linalg.norm(v.astype(np.float64).mean(0)) for v in (h_clean, h_corrupted)]
    assert np.allclose(sentence_embedding(h_clean[None])[0], e[0], atol=1e-7)
    p = patch(minilm, CAT, DOG, EMBEDDING)
    assert p.clean == pytest.approx(1.0, abs=1e-6) and p.corrupted == pytest.approx(float(e[1] @ e[0]), abs=1e-5)
    assert patch_one(minilm, CAT, DOG, EMBEDDING, "residual", 0) == pytest.approx(1.0, abs=1e-6)    # all positions
    for layer in range(minilm.config.n_layers):
        assert patch_one(minilm, CAT, DOG, EMBEDDING, "residual", layer) == pytest.approx(1.0, abs=1e-5)
    assert p.residual[0, 2] == pytest.approx(1.0, abs=1e-5)                    # the one token that differs
    assert np.abs(np.delete(p.residual[0], 2)).max() == 0                      # the others are equal: not run
    same = patch(minilm, CAT, CAT, EMBEDDING, normalise=False)                 # clean into clean: nothing moves
    for table in (same.heads, same.residual, same.attn_out, same.ffn_out):
        assert not table.any()
    for what in ("heads", "residual", "attn_out", "ffn_out"):
        assert abs(patch_one(minilm, CAT, CAT, EMBEDDING, what, 3, normalise=False)) <= 1e-6
    with pytest.raises(QkvError, match="same metric"):
        patch(minilm, CAT, CAT, EMBEDDING)
    gpt2 = qkv.load(MODELS / "gpt2")
    with pytest.raises(QkvError, match="has an LM head") as e:
        patch(gpt2, [1, 2, 3], [1, 2, 4], EMBEDDING)
    assert len(str(e.value).splitlines()) == 1


# the pages the CLI writes ---------------------------------------------------------

def page_data(path) -> dict:
    return data_of(path.read_text(encoding="utf-8"))


def test_qkv_show_embeds_rollout_and_flow_for_an_encoder(tmp_path, monkeypatch, capsys, minilm):
    code, _, _ = run_main(monkeypatch, capsys, "show", CAT, "--out", str(tmp_path))
    assert code == 0
    data = page_data(tmp_path / "attention.html")
    trace = minilm.run(CAT, keep=("attentions",))
    assert data["lens"] is None and data["patch"] is None
    assert np.abs(unpack(data["rollout"]["rollout"]) - attention_rollout(trace)).max() <= PRECISION + 1e-6
    assert np.abs(unpack(data["rollout"]["flow"]) - attention_flow(trace)).max() <= PRECISION + 1e-6


def test_qkv_show_generate_and_lens_embed_the_lens_of_a_decoder(tmp_path, monkeypatch, capsys):
    gpt2 = str(MODELS / "gpt2")
    model = qkv.load(gpt2)
    code, _, _ = run_main(monkeypatch, capsys, "show", "the cat sat on", "--model", gpt2, "--out", str(tmp_path / "s"))
    assert code == 0
    data = page_data(tmp_path / "s" / "attention.html")
    ids = model.encode("the cat sat on")[0].tolist()
    check_lens(data["lens"], lens_reference(model, ids))
    trace = model.run(ids, keep=("attentions",))
    assert np.abs(unpack(data["rollout"]["rollout"]) - attention_rollout(trace)).max() <= PRECISION + 1e-6

    code, _, err = run_main(monkeypatch, capsys, "generate", "the cat", "--model", gpt2, "-n", "3", "-t", "0",
                            "--trace", str(tmp_path / "g"))
    assert code == 0 and "(--lens adds the Logit lens tab)" in err
    data = page_data(tmp_path / "g" / "attention.html")
    assert data["lens"] is None and data["rollout"]["flow"] is not None and data["next"] is not None
    code, _, err = run_main(monkeypatch, capsys, "generate", "the cat", "--model", gpt2, "-n", "3", "-t", "0",
                            "--trace", str(tmp_path / "g2"), "--lens")
    assert code == 0 and "--lens" not in err
    data = page_data(tmp_path / "g2" / "attention.html")
    ids = qkv.Trace.load(tmp_path / "g2").ids.tolist()
    check_lens(data["lens"], lens_reference(model, ids))
    assert data["rollout"]["flow"] is not None and data["next"] is not None
    for args in (["generate", "the cat", "--model", gpt2, "--lens"], ["chat", "Hi", "--lens"]):
        code, out, err = run_main(monkeypatch, capsys, *args)                # a tab of no viewer
        assert code == 2 and err == "qkv: error: --lens adds a tab to the viewer --trace writes; give --trace DIR too\n"

    code, out, _ = run_main(monkeypatch, capsys, "lens", "the cat sat on", "--model", gpt2, "--out", str(tmp_path / "l"))
    assert code == 0 and "lens.html" in out
    data = page_data(tmp_path / "l" / "lens.html")
    assert data["view"] == "lens" and data["rollout"] is None
    check_lens(data["lens"], lens_reference(model, model.encode("the cat sat on")[0].tolist()))

    code, out, _ = run_main(monkeypatch, capsys, "rollout", "the cat sat on", "--model", gpt2, "--out",
                            str(tmp_path / "r"))
    assert code == 0 and "rollout.html" in out
    data = page_data(tmp_path / "r" / "rollout.html")
    assert data["view"] == "rollout" and data["rollout"]["flow"] is None and "--flow" in data["rollout"]["flow_note"]


def test_qkv_patch_on_minilm_writes_its_page(tmp_path, monkeypatch, capsys, minilm):
    code, out, _ = run_main(monkeypatch, capsys, "patch", CAT, DOG, "--model", "minilm", "--out", str(tmp_path))
    assert code == 0 and "cos(embedding, clean embedding) = 1.000 clean" in out
    assert sorted(f.name for f in tmp_path.iterdir()) == ["patch.html", "patch.json", "patch.png", "patch.svg"]
    data = page_data(tmp_path / "patch.html")
    assert data["view"] == "patch" and data["tokens"] == [str(t) for t in minilm.run(CAT, keep=()).tokens]
    ref = patch(minilm, CAT, DOG, EMBEDDING)
    assert np.abs(np.array(data["patch"]["tables"]["heads"]) - ref.heads).max() <= 6e-6


@pytest.mark.parametrize("args, message", [
    (["--model", "minilm", "--token", " cat"], "is an encoder: its patching metric is the cosine similarity"),
    (["--model", "minilm", "--other", " dog"], "is an encoder: its patching metric is the cosine similarity"),
    (["--model", str(MODELS / "gpt2")], "give --token and --other"),
    (["--model", str(MODELS / "gpt2"), "--token", " a"], "give --token and --other"),
])
def test_qkv_patch_refuses_the_wrong_metric_in_one_line(tmp_path, monkeypatch, capsys, args, message):
    code, _, err = run_main(monkeypatch, capsys, "patch", CAT, DOG, *args, "--out", str(tmp_path / "x"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_bad_sections_are_one_clear_error():
    trace = random_trace(["a", "b", "c"], L=2, H=2)
    rng = np.random.default_rng(0)
    ok = lens_section(rng.random((3, 3)), np.ones((3, 3), int), [0, 1, 2], np.zeros((3, 3, 2), int),
                      rng.random((3, 3, 2)), str, 10)
    cases = [({"mlp": ok}, None, "unknown viewer sections"),
             ({}, "lens", "cannot open 'lens' first"),
             ({"lens": ok}, "sideways", "cannot open 'sideways' first"),
             ({"lens": lens_section(rng.random((3, 4)), np.ones((3, 4), int), [0] * 4, np.zeros((3, 4, 2), int),
                                    rng.random((3, 4, 2)), str, 10)}, None, "about 4 tokens and the trace has 3")]
    for sections, view, message in cases:
        with pytest.raises(QkvError, match=re.escape(message)) as e:
            viewer_html(trace, sections=sections, view=view)
        assert len(str(e.value).splitlines()) == 1
    with pytest.raises(QkvError, match="lens arrays disagree"):
        lens_section(rng.random((3, 3)), np.ones((3, 2), int), [0, 1, 2], np.zeros((3, 3, 2), int),
                     rng.random((3, 3, 2)), str, 10)


def test_a_trace_kept_for_the_sections_needs_no_second_pass(monkeypatch):
    from qkv.analysis.sections import sections_keep, viewer_sections

    model = qkv.load(str(MODELS / "gpt2"))
    ids, _ = model.encode("The cat sat on the mat")
    trace = model.run("The cat sat on the mat", keep=sections_keep(model, len(ids)))
    again = viewer_sections(model, model.run("The cat sat on the mat", keep=("attentions",)))   # runs the lens pass
    monkeypatch.setattr(model, "run", lambda *a, **k: pytest.fail("a second pass over the text"))
    once = viewer_sections(model, trace)
    assert once == again and once["lens"] is not None
    assert sections_keep(model, 300) == ("attentions",) and viewer_sections(model, trace, lens_limit=3)["lens"] is None
