"""`qkv explain [TOPIC] [TEXT]`: topics dispatch, the old walkthrough is unchanged, mistakes are one line."""

from __future__ import annotations

import pytest

from conftest import MODELS, run_main
from qkv.checkpoints import digits_dir


@pytest.mark.parametrize("topic, heading, files", [
    ("positions", "② RoPE: 위치만큼 회전하는 Q와 K",
     {"positions_sinusoidal", "positions_rope", "positions_learned"}),
    ("kv-cache", "① 캐시에 담기는 것", {"kvcache"}),
    ("gqa", "① 누가 무엇을 읽나: 쿼리 헤드 9개, K/V 헤드 3개", {"gqa"}),
])
def test_each_topic_in_korean_with_figures(monkeypatch, capsys, tmp_path, topic, heading, files):
    out = tmp_path / "figs"
    code, stdout, err = run_main(monkeypatch, capsys, "explain", topic, "--lang", "ko", "--out", str(out))
    assert code == 0, err
    assert f"qkv explain {topic} · SmolLM2-135M-Instruct" in stdout and heading in stdout
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(f"{f}.{ext}" for f in files for ext in ("png", "svg"))
    assert all(f"wrote {out / name}" in stdout for name in written)


def test_a_topic_with_its_text_and_model(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "explain", "gqa", "A dog ran home", "--model", "minilm")
    assert code == 0, err
    assert "all-MiniLM-L6-v2 is plain multi-head attention (MHA)" in out and "'A dog ran home'" in out


def test_the_walkthrough_is_unchanged(monkeypatch, capsys, tmp_path):
    code, out, err = run_main(monkeypatch, capsys, "explain", "The cat sat on the mat")
    assert code == 0, err
    assert "qkv explain · all-MiniLM-L6-v2 · layer 0 · head 2 of 12" in out and "⑧ Why divide by √d_k" in out
    # a text that is a topic's name, through the attention topic; --out writes the followed head's heatmap
    code, out, err = run_main(monkeypatch, capsys, "explain", "attention", "positions", "--out", str(tmp_path))
    assert code == 0, err
    assert "positions" in out.split("⓪")[1].split("①")[0]                        # the tokens of the text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["explain_layer0_head2.png", "explain_layer0_head2.svg"]


def test_help_lists_the_topics(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "explain", "--help")
    assert code == 0
    for topic in ("attention", "positions", "kv-cache", "gqa", "sparse", "flash", "ffn"):
        assert f"\n    {topic} " in out, topic


@pytest.mark.parametrize("args, message", [
    (["kvcache"], "'kvcache' is not a topic; did you mean 'kv-cache'?"),
    (["Positions"], "did you mean 'positions'?"),
    (["cats", "dogs"], "'cats' is not a topic"),
    (["gqa", "--lang", "xx"], "unknown language 'xx'"),
    (["positions", "--head", "1"], "positions does not take them"),
    (["kv-cache", "--model", "minilm"], "keeps no KV cache"),
    (["gqa", "--model", "ko-en-tiny"], "is an encoder–decoder"),
    # an image or speech model given to a lesson that follows text: one line naming what reads its input
    ([str(digits_dir() / "digit-3.png"), "--model", "digits-vit"], "digits-vit is an image model and qkv explain "
     "attention follows a text; for its patches run: qkv explain vit IMAGE --model digits-vit"),
    (["positions", "3", "--model", "digits-vit"], "qkv explain positions follows a text"),
    (["ffn", "--model", "digits-vit"], "qkv explain ffn follows a text"),
    (["features.npy", "--model", str(MODELS / "whisper")], "reads speech (log-mel features) and qkv explain "
     "attention follows a text; look at it with: qkv show FEATURES.npy"),
    (["vit", "--model", str(MODELS / "whisper")], "reads speech (log-mel features) and qkv explain vit follows an image"),
])
def test_mistakes_give_one_line_and_exit_2(monkeypatch, capsys, tmp_path, args, message):
    out_dir = tmp_path / "never"
    code, out, err = run_main(monkeypatch, capsys, "explain", *args, "--out", str(out_dir))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qkv: error: ") and message in lines[0], err
    assert not out_dir.exists()                                                   # nothing half-written
