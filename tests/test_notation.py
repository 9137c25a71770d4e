"""One meaning for each letter a learner reads: S is the scores Q·Kᵀ/√d_k (A = softmax(S + M)), Z is a head's
A·V, H the final hidden states that logits = H·W_vocab reads — in the guide (en/ko), `qkv explain`, the pipeline
page, the README and the Trace's docstrings. A second meaning (S unscaled and then divided again, Z as the final
hidden states) is what this test refuses."""

import re
from pathlib import Path

import qkv

ROOT = Path(qkv.__file__).parent
REPO = ROOT.parent.parent
FILES = [REPO / "README.md", REPO / "docs" / "guide.md", REPO / "docs" / "guide.ko.md",
         ROOT / "viz" / "words" / "en.py", ROOT / "viz" / "words" / "ko.py", ROOT / "viz" / "assets" / "pipeline.js",
         ROOT / "viz" / "assets" / "pipeline_kit.js",
         ROOT / "core" / "trace.py", ROOT / "lessons" / "attention.py", ROOT / "lessons" / "attention_render.py"]
WRONG = {
    r"S\s*/\s*√d_k": "S divided by √d_k (S already is)",
    r"softmax\(S\s*/": "softmax of S divided again",
    r"\bS\s*=\s*Q·Kᵀ(?!\s*(/|·|\+))": "S without its scale",
    r"Z_last|Z·W_vocab|Z · W_vocab|mean_i\(Z": "Z as the final hidden states",
}


def test_each_letter_has_one_meaning():
    found = []
    for path in FILES:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for pattern, why in WRONG.items():
                if re.search(pattern, line):
                    found.append(f"{path.name}:{n}: {why}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_the_trace_and_the_pipeline_say_the_same():
    from qkv.core.trace import INTERMEDIATES as ARRAYS
    from qkv.viz.pipeline_text import TEXTS

    assert "S = Q·Kᵀ/√d_k" in ARRAYS["scores"] and "softmax(S + M)" in ARRAYS["attentions"]
    for lang in ("en", "ko"):
        assert TEXTS[lang]["p_s_f"] == "S = Q·Kᵀ / √d_k" and TEXTS[lang]["p_a_f"].startswith("A = softmax(S + M)")
        assert TEXTS[lang]["p_logits_f"].startswith("logits = H · W_vocab")
