"""The head-statistics benchmark runs, checks its backends agree, and writes its section."""

from __future__ import annotations

from qkv.bench import heads as hb


def test_the_synthetic_corpus_is_the_same_everywhere():
    texts = hb.synthetic_corpus(50)
    assert texts == hb.synthetic_corpus(50) and len(set(texts)) > 40
    assert all(t.endswith(".") and t[0].isupper() for t in texts)
    assert hb.synthetic_corpus(3, seed=1) != hb.synthetic_corpus(3, seed=0)


def test_a_small_run_gives_a_markdown_section(tmp_path):
    result = hb.measure(sentences=40, workers=2, ray=False)
    assert [r["backend"] for r in result["rows"]] == ["one process", "local cores"]
    assert result["rows"][0]["speedup"] == 1.0 and result["tokens"] > 40
    text = hb.markdown(result, command="qkv bench heads --sentences 40 --backend local")
    assert text.startswith("## Head statistics over a corpus")
    assert "| local cores | 2 |" in text and "qkv bench heads --sentences 40 --backend local" in text
