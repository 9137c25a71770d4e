"""runtime.io_json: every JSON file qkv is handed is read bounded and checked, each fault one QkvError."""

import os

import pytest

from qkv.runtime.errors import QkvError
from qkv.runtime.io_json import MAX_DEPTH, Fields, depth, read_json


def write(tmp_path, text, name="meta.json"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_reads_an_object(tmp_path):
    assert read_json(write(tmp_path, '{"a": [1, {"b": 2}]}')) == {"a": [1, {"b": 2}]}


@pytest.mark.parametrize("text, words", [
    ("[1, 2]", "not a JSON object"),
    ("{", "not valid JSON"),
    ('{"a": NaN}', "not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"a": ' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}", "nested too deeply"),
])
def test_faults_are_one_line(tmp_path, text, words):
    with pytest.raises(QkvError, match=words) as e:
        read_json(write(tmp_path, text), what="the store's meta.json", fix="remake the store")
    assert "\n" not in str(e.value) and "remake the store" in str(e.value) and "meta.json" in str(e.value)


def test_files_that_are_not_json_files(tmp_path):
    with pytest.raises(QkvError, match="is missing"):
        read_json(tmp_path / "none.json")
    with pytest.raises(QkvError, match="directory"):
        read_json(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(QkvError, match="FIFO"):                     # refused, never waited on
        read_json(fifo)
    (tmp_path / "big.json").write_bytes(b"{" + b" " * 2000 + b"}")
    with pytest.raises(QkvError, match="too large: it has 2,002 bytes, more than 1,000"):
        read_json(tmp_path / "big.json", limit=1000)
    (tmp_path / "latin.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(QkvError, match="not UTF-8"):
        read_json(tmp_path / "latin.json")


def test_depth():
    assert depth(1) == 0 and depth([]) == 1 and depth({"a": [1, {"b": []}]}) == 4


def test_fields_check_types_and_ranges():
    f = Fields({"n": 64, "x": 64.0, "bad": 64.7, "flag": True, "s": "relu", "l": [1], "o": {"k": 1}, "z": None},
               "cfg.json", fix="fix the SAE's cfg.json")
    assert f.integer("n", 1, 100) == 64 and f.integer("x", 1, 100) == 64
    assert f.integer("z", 1, 100, default=7) == 7 and f.integer("missing", 1, 100, default=None) is None
    assert f.text("s", choices=("relu", "topk")) == "relu" and f.boolean("flag") is True
    assert f.array("l") == [1] and f.object("o").integer("k", 0, 1) == 1
    for call, words in [(lambda: f.integer("bad", 1, 100), "d_in|bad must be a whole number"),
                        (lambda: f.integer("n", 1, 10), "from 1 to 10"),
                        (lambda: f.integer("flag", 0, 1), "not true/false"),
                        (lambda: f.number("s", 0, 1), "must be a number"),
                        (lambda: f.text("s", choices=("topk",)), "one of 'topk'"),
                        (lambda: f.boolean("n"), "true or false"),
                        (lambda: f.array("n"), "a list"),
                        (lambda: f.object("l"), "an object"),
                        (lambda: f.integer("missing", 1, 2), "has no missing")]:
        with pytest.raises(QkvError, match=words) as e:
            call()
        assert str(e.value).startswith("cfg.json") and str(e.value).endswith("fix the SAE's cfg.json")
    with pytest.raises(QkvError, match="cfg.json: o.k must be|cfg.json: o: k must be"):
        f.object("o").text("k")
