"""Tokens as a reader sees them (qkv.inputs.tokenizer: label, visible, shorten), and the colours every
view shares (qkv.viz.palette): figures, terminal and viewer agree."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import qkv
from qkv.inputs.tokenizer import Tokenizer
from qkv.core.labels import label, labels_of, readable, shorten, token_bytes, visible
from conftest import MODELS


@pytest.fixture(scope="module")
def smollm2():
    return qkv.load("smollm2")


def test_byte_level_labels_are_the_tokenizers_own_decoding_over_the_whole_vocabulary(smollm2):
    """Reference: the tokenizers library's decode of each id alone. Where it decodes to U+FFFD (a piece of a
    character), the label shows the piece's bytes in ⟨⟩ and the rest as the decoded text; never a byte glyph."""
    tok = smollm2.tokenizer
    assert tok.spelling == "byte-level"
    pieces = 0
    for i in range(tok.vocab_size):
        text, spelled, shown = tok.decode([i]), tok.id_to_token(i), tok.label(i)
        if "\ufffd" in text and "⟨" in shown:
            pieces += 1
            cut = re.findall(r"⟨([0-9A-F ]+)⟩", shown)
            assert all(bytes.fromhex(h) in token_bytes(spelled, "byte-level") for h in cut), (i, spelled, shown)
            rest = re.sub(r"⟨[^⟩]*⟩", "", shown)
            assert rest == ("" if text.strip("\ufffd") == "" else visible(text.replace("\ufffd", ""))), (i, shown)
        else:
            assert shown == visible(text), (i, spelled, text)
    assert 0 < pieces < tok.vocab_size // 10
    assert tok.labels(tok.encode(" capital\n\tof")[0]) == ["␣capital", "↵", "⇥", "of"]


def test_pieces_of_characters_read_with_their_neighbours(smollm2):
    """Byte-level BPE cuts Korean, Japanese and emoji into bytes: each piece shows its bytes and the character
    it belongs to, whole characters show as themselves, and no byte glyph (ì, Ħ, ľ) is left."""
    text = "서울은 한국의 수도 東京 🙂"
    ids = smollm2.tokenizer.encode(text)[0]
    shown = smollm2.tokenizer.labels(ids)
    assert not any(ch in "".join(shown) for ch in "ìĦľļ¸ĿĢíķêµŃ")
    assert shown[:3] == ["⟨EC:서⟩", "⟨84:서⟩", "⟨9C:서⟩"]                    # 서 = EC 84 9C, one byte a token
    chars = [m for lab in shown for m in re.findall(r"⟨[0-9A-F ]+:(.)⟩", lab)]
    for ch in "서울은한국의수":
        assert ch in chars
    pieces = [bytes.fromhex(h) for lab in shown for h in re.findall(r"⟨([0-9A-F ]+)", lab)]
    assert b"".join(pieces).decode("utf-8") in text.replace(" ", "")        # the bytes, in order, are the text's
    trace = smollm2.run(text, keep=())
    assert trace.labels == shown
    assert labels_of(["ìĿ", "Ģ", "<|im_end|>", "Ġì"], "byte-level") == ["⟨EC 9D:은⟩", "⟨80:은⟩", "<|im_end|>", "␣⟨EC⟩"]
    assert labels_of(["ÿ", "Ġa"], "byte-level") == ["⟨FF⟩", "␣a"]                # a byte UTF-8 never uses


def test_wordpiece_tokens_stay_as_spelled(minilm):
    ids, tokens = minilm.tokenizer.encode("The qkvness of tokenizers.")
    assert minilm.tokenizer.spelling == "plain"
    assert tokens[0] == "[CLS]" and any(t.startswith("##") for t in tokens)
    assert minilm.tokenizer.labels(ids) == tokens


def test_sentencepiece_tokens_read_as_text(tmp_path):
    from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "▁Paris": 1, "<0x0A>": 2, "is": 3, "<0xE2>": 4}
    hf = HF(models.BPE(vocab, [], unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer(tmp_path / "tokenizer.json")
    assert tok.spelling == "sentencepiece"
    assert tok.labels([1, 2, 3, 4]) == ["␣Paris", "↵", "is", "⟨E2⟩"]          # a lone byte of "…": its byte


def test_readable_and_visible():
    assert readable("ĠParis", "byte-level") == " Paris" and readable("Ċ", "byte-level") == "\n"
    assert readable("ĠParis", "plain") == "ĠParis" and readable("##ing", "plain") == "##ing"
    assert readable("<|im_start|>", "byte-level") == "<|im_start|>"               # special tokens spell themselves
    assert label("ĠâĢ¦", "byte-level") == "␣…" and label("âĢ", "byte-level") == "⟨E2 80⟩"   # 2 of 3 bytes of "…"
    assert visible("a b\n\t") == "a␣b↵⇥" and visible("") == "∅" and visible("\x7f") == "\\x7f"
    assert shorten("abcdef", 4) == "abc…" and shorten("abcd", 4) == "abcd"


def test_every_view_shows_labels(tmp_path):
    from qkv.viz import figures
    from qkv.viz.html import viewer_html
    from test_viewer import data_of

    model = qkv.load(MODELS / "gpt2")
    trace = model.run("the cat\nsat", keep=("attentions",))
    assert "Ġc" in trace.tokens and "␣c" in trace.labels and "Ċ" in trace.tokens and "↵" in trace.labels
    data = data_of(viewer_html(trace))
    assert data["tokens"] == trace.tokens and data["labels"] == trace.labels        # spelled, and shown
    assert data["model"] == model.name and data["causal"] is True and data["family"] == "gpt2"
    ax = figures.head_heatmap(trace, 0, 0).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == trace.labels
    assert model.name in ax.get_title()                                             # named by the trace


# ── one palette ─────────────────────────────────────────────────────────────────

def test_the_viewer_uses_the_figures_colour_map_in_the_same_direction():
    from matplotlib import colormaps

    from qkv.viz.html import asset
    from qkv.viz.palette import CMAP, MASKED

    js = asset("viewer.js")
    stops = json.loads(re.search(r"const VIRIDIS = (\[\[.*?\]\]);", js, re.S).group(1))
    want = [[round(255 * c) for c in colormaps[CMAP](k / (len(stops) - 1))[:3]] for k in range(len(stops))]
    assert CMAP == "viridis" and stops == want                      # 0 dark → 1 bright, as the figures
    masked = json.loads(re.search(r"const MASKED = (\[.*?\]);", js).group(1))
    assert "#" + "".join(f"{c:02x}" for c in masked) == MASKED


def test_roles_have_one_colour_in_every_view():
    from qkv.cli.heads import ROLE_STYLES
    from qkv.analysis.roles import ROLES
    from qkv.viz.palette import ROLE_COLOURS, role_colours
    from qkv.viz.payload import trace_payload
    from test_viewer import random_trace

    assert set(ROLE_COLOURS) == set(ROLES)
    assert all(ROLE_STYLES[r].endswith(ROLE_COLOURS[r]) for r in ROLES)           # the terminal's table
    roles = [["previous", None, "my own"], ["[CLS]", "previous", None]]
    assert role_colours(roles) == {"previous": ROLE_COLOURS["previous"], "[CLS]": ROLE_COLOURS["[CLS]"]}
    payload = trace_payload(random_trace(["a", "b"], L=2, H=3), roles=roles)
    assert payload["role_colours"] == role_colours(roles)                          # the viewer's model view


def test_no_label_is_blank_or_invisible(smollm2):
    """Every label of SmolLM2's vocabulary shows something a reader can see: the no-break space (id
    15442) is ⍽, other invisible characters \\uNNNN (qkv lens printed an empty top-1 for it)."""
    import unicodedata

    tok = smollm2.tokenizer
    assert tok.label(15442) == "⍽"
    for i in range(tok.vocab_size):
        shown = tok.label(i)
        assert shown and not all(c.isspace() or unicodedata.category(c) in ("Zs", "Zl", "Zp", "Cf", "Cc")
                                 for c in shown), (i, shown)
    assert visible("a\u200bb\u3000c\u2028") == "a\\u200bb\\u3000c\\u2028"
