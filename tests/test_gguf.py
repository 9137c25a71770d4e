"""GGUF loading (checkpoints/gguf.py; its cache, checkpoints/gguf_cache.py): equal to transformers, cached
safely, and every bad file is one line and exit 2.

The committed files in tests/fixtures/gguf/ (a llama with GQA in Q8_0/Q4_1/Q5_1 and a qwen2
with biases and a separate output in F16/Q4_0/Q5_0/BF16) come with transformers' logits and
attentions on a padded batch (tests/fixtures/make_gguf_fixtures.py): qkv equals them within
1e-4 (logits) and 1e-5 (attention). tests/live/test_live_gguf.py checks every architecture
× tensor type against live transformers. Damaged files are written on the fly with the
same script (numpy and the gguf package only).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as V

import qkv
from conftest import FIXTURES, PATIENCE, TOL_ATTENTION, TOL_HIDDEN, max_abs, run_main
from qkv.checkpoints import gguf, gguf_cache
from qkv.runtime.errors import QkvError

sys.path.insert(0, str(FIXTURES))
import make_gguf_fixtures as F  # noqa: E402

LLAMA = F.HERE / "tiny-llama.gguf"
QWEN2 = F.HERE / "tiny-qwen2.gguf"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test converts into its own cache."""
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(F.HERE / "reference.npz") as z:
        return {k.split("/")[1]: z[k] for k in z.files if k.startswith(name + "/")}


# ── equal to the reference ───────────────────────────────────────────────────────

@pytest.mark.parametrize("name", F.COMMITTED)
def test_equals_transformers(name):
    ref = reference(name)
    out = qkv.load(F.HERE / f"{name}.gguf").forward(ref["ids"], ref["mask"])
    valid = ref["mask"].astype(bool)                                  # (B, n): padding rows are meaningless
    assert max_abs(out.logits[valid], ref["logits"][valid]) <= TOL_HIDDEN
    for b in range(len(valid)):                                       # (L, B, H, n, n), valid query rows
        assert max_abs(out.attentions[:, b][:, :, valid[b]], ref["attentions"][:, b][:, :, valid[b]]) <= TOL_ATTENTION


def test_config_from_metadata():
    llama, qwen2 = qkv.load(LLAMA).config, qkv.load(QWEN2).config
    assert (llama.family, llama.n_heads, llama.n_kv_heads, llama.d_head, llama.d_model) == ("llama", 4, 2, 16, 64)
    assert llama.tied_embeddings and not llama.qkv_bias and llama.rope_theta == 100000.0
    assert llama.norm_eps == pytest.approx(1e-5) and (llama.bos_token_id, llama.eos_token_id) == (1, 2)
    assert qwen2.family == "qwen2" and qwen2.qkv_bias and not qwen2.tied_embeddings
    assert qwen2.vocab_size == len(F.vocabulary()[0])


@pytest.mark.parametrize("keys", [{"llama.rope.scaling.type": ("linear", V.STRING),
                                   "llama.rope.scaling.factor": (4.0, V.FLOAT32)},
                                  {"llama.rope.scale_linear": (4.0, V.FLOAT32)}])
def test_linear_rope_scaling(tmp_path, keys):
    """llama.cpp's linear RoPE scaling (new and old keys) reaches the config, as llama.cpp applies it
    (transformers' GGUF loader drops it)."""
    path = _model(tmp_path / "scaled.gguf", lambda meta, tensors: meta.update(keys))
    assert qkv.load(path).config.rope_scaling == {"rope_type": "linear", "factor": 4.0}


def test_unpermuted_exactly(tmp_path):
    """An F32 llama file gives back the Hugging Face weights it was written from, bit for bit
    (llama.cpp's Q/K row permutation undone); a qwen2 file is not permuted."""
    from safetensors.numpy import load_file

    for kind in ("llama", "qwen2"):
        spec = dict(F.SPECS[kind], **F.SMALL)
        path = F.make(tmp_path / f"{kind}.gguf", spec, "F32")
        mine = load_file(gguf_cache.converted(path) / "model.safetensors")
        original = F.hf_weights(spec)
        assert set(mine) == set(original)
        assert all(np.array_equal(mine[k], w) for k, w in original.items())


def test_fast_reader_parses_like_the_package():
    """gguf.py's checked reader (plain-array reads) gives the same fields and tensors as gguf.GGUFReader."""
    import gguf as package

    for path in (LLAMA, QWEN2):
        ours, theirs = gguf.open_reader(path), package.GGUFReader(path)
        assert list(ours.fields) == list(theirs.fields)
        for key, field in theirs.fields.items():
            assert ours.fields[key].contents() == field.contents(), key
            assert ours.fields[key].types == field.types, key
        for a, b in zip(ours.tensors, theirs.tensors, strict=True):
            assert (a.name, a.tensor_type, a.shape.tolist()) == (b.name, b.tensor_type, b.shape.tolist())
            assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data)


def test_in_order_equals_map():
    items = list(range(20))
    assert list(gguf.in_order(lambda x: x * x, items)) == [x * x for x in items]

    def fail(x):
        if x == 7:
            raise QkvError("seven")
        return x

    with pytest.raises(QkvError, match="seven"):
        list(gguf.in_order(fail, items))


# ── the cache ────────────────────────────────────────────────────────────────────

def entries(cache: Path) -> list[str]:
    """The conversions in CACHE (not the compiled kernels beside them: runtime.kernel_cache)."""
    return sorted(p.name for p in cache.iterdir() if p.name != "kernels") if cache.exists() else []


def test_second_load_does_not_convert(monkeypatch, private_cache):
    """The config and tokenizer are written once; the float32 tensors once, and only for a float32 load."""
    calls = []
    for step in ("describe", "write_tensors"):
        real = getattr(gguf_cache, step)                     # looked up where the cache calls it
        monkeypatch.setattr(gguf_cache, step, lambda *a, real=real, step=step: (calls.append(step), real(*a)))
    first = qkv.load(LLAMA)                                  # stored: nothing but the description written
    second = qkv.load(LLAMA)
    assert calls == ["describe"] and not (private_cache / entries(private_cache)[0] / "model.safetensors").exists()
    third, fourth = qkv.load(LLAMA, dtype="float32"), qkv.load(LLAMA, dtype="float32")
    assert calls == ["describe", "write_tensors"]
    assert len(entries(private_cache)) == 1
    for other in (second, third, fourth):
        np.testing.assert_array_equal(first.weights.tok_embed, other.weights.tok_embed)


def test_changed_file_is_converted_again(tmp_path, private_cache):
    path = shutil.copy(LLAMA, tmp_path / "m.gguf")
    before = qkv.load(path).weights.tok_embed.copy()
    (first,) = entries(private_cache)
    F.make(path, dict(F.COMMITTED_SPECS["tiny-llama"]), seed=1)            # other weights, same place
    after = qkv.load(path).weights.tok_embed
    (second,) = entries(private_cache)                                   # the stale conversion is gone
    assert first != second and not np.array_equal(before, after)


@pytest.mark.parametrize("name, damage", [
    ("qkv_source.json", "{"),                                            # cut short
    ("qkv_source.json", '{"gguf": ' + "[" * 10000 + "]" * 10000 + "}"),   # nested past Python's parser
    ("qkv_source.json", '{"gguf": 3}'),
    ("qkv_source.json", "\xff"),
    ("config.json", '{"vocab_size": "many"}'),
    ("config.json", ""),
])
@pytest.mark.parametrize("dtype", [None, "float32"])
def test_a_damaged_cache_entry_is_a_cache_miss(private_cache, capfd, name, damage, dtype):
    """A qkv_source.json or config.json in qkv's own GGUF cache that is not what qkv wrote: converted again, said
    once on stderr, and the model loads as before (not a traceback, nor a load as a plain directory)."""
    before = qkv.load(LLAMA, dtype=dtype)
    entry = gguf_cache._key(LLAMA)
    (private_cache / entry / name).write_bytes(damage.encode("latin-1"))
    capfd.readouterr()
    after = qkv.load(LLAMA, dtype=dtype)
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and f"the GGUF cache entry {private_cache / entry} is damaged" in err, err
    np.testing.assert_array_equal(after.forward([[5, 6, 7]]).logits, before.forward([[5, 6, 7]]).logits)
    assert [e for e in entries(private_cache) if "llama" in e] == [entry]          # rebuilt in place, no leftovers
    assert json.loads((private_cache / entry / name).read_text())
    qkv.load(LLAMA, dtype=dtype)
    assert capfd.readouterr().err == ""                                  # rebuilt: said once


def test_cache_off_leaves_nothing(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("QKV_CACHE", "off")
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    model = qkv.load(LLAMA)
    assert model.forward([[5, 6, 7]]).logits.shape == (1, 3, model.config.vocab_size)
    with pytest.raises(QkvError):
        qkv.load(F.make(tmp_path / "bad.gguf", dict(F.COMMITTED_SPECS["tiny-llama"]),
                        edit=lambda meta, t: t.pop("blk.1.ffn_up.weight")))
    assert list(tmp.iterdir()) == [] and gguf_cache.cache_root() is None


def test_planted_symlink_is_not_followed(tmp_path, private_cache):
    """A link at the place the conversion would go: refused in one line; its target untouched."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "qkv_source.json").write_text("{}")                      # looks like a finished conversion
    private_cache.mkdir()
    (private_cache / gguf_cache._key(LLAMA)).symlink_to(target)
    with pytest.raises(QkvError, match="not written by qkv"):
        qkv.load(LLAMA)
    assert sorted(p.name for p in target.iterdir()) == ["qkv_source.json"]
    assert [p for p in private_cache.iterdir() if p.name.startswith(".")] == []          # no temporary left


def test_concurrent_conversions(tmp_path, private_cache):
    """Three processes convert the same file at once: all load it, one conversion stays, no leftovers."""
    code = textwrap.dedent(f"""
        import qkv
        m = qkv.load({str(LLAMA)!r})
        print(float(m.forward([[5, 6, 7]]).logits.sum()))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, QKV_CACHE=str(private_cache))) for _ in range(3)]
    results = [p.communicate(timeout=PATIENCE) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in results]
    assert len({out for out, _ in results}) == 1
    (entry,) = entries(private_cache)
    assert json.loads((private_cache / entry / "qkv_source.json").read_text())["gguf"] == str(LLAMA.resolve())


@pytest.mark.parametrize("first", ["qkv", "stray"])
def test_a_directory_that_appears_during_the_conversion(private_cache, monkeypatch, first):
    """Another process finished first (runtime.io.write_directory keeps its directory): a qkv
    conversion is used, anything else refused in one line; no temporary directory is left."""
    describe = gguf_cache.describe

    def racing(path, out):
        describe(path, out)
        theirs = private_cache / gguf_cache._key(LLAMA)
        if first == "qkv":
            shutil.copytree(out, theirs)
        else:
            theirs.mkdir()
            (theirs / "notes.txt").write_text("mine")

    monkeypatch.setattr(gguf_cache, "describe", racing)
    if first == "qkv":
        assert qkv.load(LLAMA).config.family == "llama"
    else:
        with pytest.raises(QkvError, match="appeared there, not written by qkv"):
            qkv.load(LLAMA)
    assert entries(private_cache) == [gguf_cache._key(LLAMA)]                # theirs, kept; nothing else


# ── the CLI ──────────────────────────────────────────────────────────────────────

def test_models_lists_smollm2(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "models")
    assert code == 0 and "smollm2" in out and "SmolLM2-135M-Instruct" in out


def test_model_option_takes_a_gguf_file(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "generate", "the cat", "--model", str(LLAMA), "-n", "3",
                              "-t", "0")
    assert code == 0, err
    assert out.strip().startswith("the cat")


# ── hostile and careless files: one line, exit 2, never a traceback ──────────────

def _spec(kind="tiny-llama"):
    return dict(F.COMMITTED_SPECS[kind])


def _edit(**changes):
    """An edit that sets (value, type) metadata; None deletes the key."""
    def edit(meta, tensors):
        for key, value in changes.items():
            key = key.replace("__", ".")
            if value is None:
                meta.pop(key)
            else:
                meta[key] = value
    return edit


def _model(path, edit=None, kind="tiny-llama", **kw):
    return F.make(path, _spec(kind) if kind in F.COMMITTED_SPECS else kind, edit=edit, **kw)


def _bytes(data: bytes):
    return lambda path: (path.write_bytes(data), path)[1]


def _cut(fraction: float):
    return lambda path: _bytes(LLAMA.read_bytes()[:int(LLAMA.stat().st_size * fraction)])(path)


def _patched(key: str, skip: int, fmt: str, *values):
    def make(path):
        _model(path)
        F.patch_after_key(path, key, skip, fmt, *values)
        return path
    return make


def _tensor(name: str, value=None):
    def edit(meta, tensors):
        if value is None:
            tensors.pop(name)
        else:
            tensors[name] = value
    return edit


def _both(*edits):
    """One edit made of several, in order."""
    def edit(meta, tensors):
        for e in edits:
            e(meta, tensors)
    return edit


def _tensor_offset(name: str, value: int):
    """A file whose tensor NAME's data offset (its info: name, n_dims u32, dims u64 × n, type u32, offset u64)
    is VALUE: near 2⁶⁴ the reader's uint64 sums overflow."""
    def make(path):
        _model(path)
        raw = bytearray(path.read_bytes())
        at = raw.index(name.encode()) + len(name)
        n_dims = int.from_bytes(raw[at:at + 4], "little")
        at += 4 + 8 * n_dims + 4
        raw[at:at + 8] = value.to_bytes(8, "little")
        path.write_bytes(bytes(raw))
        return path
    return make


def _nan(meta, tensors):
    w = np.zeros((64,), np.float32)
    w[3] = np.nan
    tensors["output_norm.weight"] = (w, None)


def _header_count(offset: int, value: int):
    def make(path):
        _model(path)
        raw = bytearray(path.read_bytes())
        raw[offset:offset + 8] = value.to_bytes(8, "little")
        path.write_bytes(bytes(raw))
        return path
    return make


BAD = {
    "not-gguf": (_bytes(b"PK\x03\x04" + bytes(100)), "not a GGUF file"),
    "empty": (_bytes(b""), "is empty"),
    "truncated-header": (_cut(0.01), "damaged or truncated"),
    "truncated-tensors": (_cut(0.6), "damaged or truncated"),
    "bitnet": (lambda p: _model(p, _edit(general__architecture=("bitnet", V.STRING))), "architecture 'bitnet'"),
    "rwkv6": (lambda p: _model(p, _edit(general__architecture=("rwkv6", V.STRING))), "architecture 'rwkv6'"),
    "mistral-arch": (lambda p: _model(p, _edit(general__architecture=("mistral", V.STRING))), "'llama'"),
    "q2_k": (lambda p: F.make(p, "llama", types={"ffn": "Q2_K"}), "type Q2_K"),
    "iq2_xxs": (lambda p: F.make(p, "llama", types={"attn": "IQ2_XXS"}), "type IQ2_XXS"),
    "missing-metadata": (lambda p: _model(p, _edit(llama__block_count=None)), "lacks 'llama.block_count'"),
    "missing-eps": (lambda p: _model(p, _edit(llama__attention__layer_norm_rms_epsilon=None)), "rms_epsilon"),
    "string-count": (lambda p: _model(p, _edit(llama__block_count=("2", V.STRING))), "not a whole number"),
    "float-count": (lambda p: _model(p, _edit(llama__attention__head_count=(4.5, V.FLOAT32))), "whole number"),
    "per-layer-list": (lambda p: _model(p, _edit(llama__feed_forward_length=([128, 128], V.ARRAY, V.UINT32))),
                       "one per layer"),
    "head-counts": (lambda p: _model(p, _edit(llama__attention__head_count_kv=(3, V.UINT32))), "do not fit"),
    "huge-layers": (lambda p: _model(p, _edit(llama__block_count=(2**31, V.UINT32))), "declares 2147483648 layers"),
    "wrong-shape": (lambda p: _model(p, _tensor("blk.0.attn_v.weight", (np.zeros((16, 64), np.float32), None))),
                    "has shape (16, 64), but the metadata implies (32, 64)"),
    "missing-tensor": (lambda p: _model(p, _tensor("blk.1.ffn_down.weight")), "lacks the tensor"),
    "unknown-tensor": (lambda p: _model(p, _tensor("blk.0.ffn_gate_inp.weight", (np.zeros((4, 64), np.float32),
                                                                                None))), "'blk.0.ffn_gate_inp"),
    "llama-half-biases": (lambda p: _model(p, _tensor("blk.0.attn_q.bias", (np.zeros(64, np.float32), None))),
                          "lacks the tensor"),
    "softcapping": (lambda p: _model(p, _edit(llama__attn_logit_softcapping=(50.0, V.FLOAT32))),
                    "'llama.attn_logit_softcapping'"),
    "rope-freqs-qwen2": (lambda p: _model(p, _tensor("rope_freqs.weight", (np.full(8, 2.0, np.float32), None)),
                                          kind="tiny-qwen2"), "reads for apertus, llama, llama4 files only"),
    "rope-freqs-and-scaling": (lambda p: _model(p, _both(_tensor("rope_freqs.weight", (np.full(8, 2.0, np.float32), None)),
                                                         _edit(llama__rope__scaling__type=("linear", V.STRING),
                                                               llama__rope__scaling__factor=(2.0, V.FLOAT32)))),
                               "by rope_freqs and by llama.rope.scaling"),
    "yarn": (lambda p: _model(p, _edit(llama__rope__scaling__type=("yarn", V.STRING))), "scaling 'yarn'"),
    "experts": (lambda p: _model(p, _edit(llama__expert_count=(8, V.UINT32), llama__expert_used_count=(2, V.UINT32))),
                "mixtral model"),                            # read as Mixtral: its dense FFN is not one
    "partial-rope": (lambda p: _model(p, _edit(llama__rope__dimension_count=(8, V.UINT32))), "partial RoPE"),
    "vocab-size": (lambda p: _model(p, _edit(llama__vocab_size=(1000, V.UINT32))), "vocabulary of 1000"),
    "nan-weights": (lambda p: _model(p, _nan), "NaN"),
    "unknown-merge": (lambda p: _model(p, _edit(tokenizer__ggml__merges=(["Ġ t", "zz q"], V.ARRAY, V.STRING))),
                      "outside the vocabulary"),
    "unknown-pre": (lambda p: _model(p, _edit(tokenizer__ggml__pre=("nonesuch", V.STRING))), "'nonesuch'"),
    "huge-array": (_patched("tokenizer.ggml.tokens", 8, "<Q", 2**60), "more than the file holds"),
    "huge-byte-array": (_patched("tokenizer.ggml.token_type", 4, "<IQ", V.UINT8, 2**62), "more than the file"),
    "huge-string": (_patched("general.name", 4, "<Q", 2**62), "damaged or truncated"),
    "huge-key-count": (_header_count(16, 2**62), "metadata keys"),
    "huge-tensor-count": (_header_count(8, 2**62), "tensors"),
    "big-endian": (_bytes(b"GGUF" + (3).to_bytes(4, "big") + bytes(16)), "big-endian"),
    "adapter": (lambda p: _model(p, _edit(general__type=("adapter", V.STRING))), "LoRA adapter"),
    "split": (lambda p: _model(p, _edit(split__count=(3, V.UINT16))), "split in 3"),
    "version-1": (_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16)), "version 1"),
    "bad-alignment": (lambda p: _model(p, _edit(general__alignment=(48, V.UINT32))), "alignment"),
    "offset-overflow": (_tensor_offset("token_embd.weight", 2**64 - 32), "damaged"),
    # a tensor's bytes inside another's (its offset pointing into token_embd), or not where the alignment puts it
    "overlapping-tensors": (_tensor_offset("blk.1.attn_q.weight", 32), "damaged GGUF file (tensors "
                            "'token_embd.weight' and 'blk.1.attn_q.weight' overlap"),
    "unaligned-tensor": (_tensor_offset("blk.1.attn_q.weight", 4), "'blk.1.attn_q.weight' at offset 4 is not "
                         "aligned to 32 bytes"),
    # numbers in range for their type, not for the model: refused before the conversion is cached
    "eps-zero": (lambda p: _model(p, _edit(llama__attention__layer_norm_rms_epsilon=(0.0, V.FLOAT32))),
                 "x.gguf (its metadata read as config.json) rms_norm_eps = 0.0 is not a positive number; the "
                 "file's metadata is broken: use an intact copy"),
    "freq-base-tiny": (lambda p: _model(p, _edit(llama__rope__freq_base=(1e-45, V.FLOAT32))),
                       "rope_theta=1.401298464324817e-45 must be a finite number above 1"),
    "eos-outside": (lambda p: _model(p, _edit(tokenizer__ggml__eos_token_id=(10**9, V.UINT32))),
                    "tokenizer.ggml.eos_token_id 1000000000 is not a token id of its"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file(tmp_path, monkeypatch, capsys, case):
    make, fragment = BAD[case]
    path = make(tmp_path / "x.gguf")
    with pytest.raises(QkvError) as e:
        qkv.load(path)
    assert fragment in str(e.value) and "\n" not in str(e.value)
    code, _, err = run_main(monkeypatch, capsys, "show", "the cat", "--model", str(path))
    assert code == 2 and err.startswith("qkv: error: ") and err.count("\n") == 1 and fragment in err, err
    with pytest.raises(QkvError) as e:
        qkv.load(path, dtype="float32")
    assert fragment in str(e.value)                      # the float32 conversion refuses it too
    cache = tmp_path / "cache"
    left = [p for p in cache.iterdir()] if cache.exists() else []
    if case == "nan-weights":                        # a sound header: described (config, tokenizer), no tensors
        assert len(left) == 1 and not (left[0] / "model.safetensors").exists()
        assert not [p for p in left[0].iterdir() if p.name.startswith(".")]
    else:
        assert left == []


def test_directory_named_gguf(tmp_path, monkeypatch, capsys):
    (tmp_path / "x.gguf").mkdir()
    code, _, err = run_main(monkeypatch, capsys, "show", "the cat", "--model", str(tmp_path / "x.gguf"))
    assert code == 2 and "is a directory, not a GGUF file" in err and err.count("\n") == 1


def test_huge_declared_lengths_stay_small(tmp_path):
    """A header declaring 2⁶⁰-item arrays or 2⁶²-byte strings fails fast without allocating:
    checked in a child process's peak memory (generous bound; a hang would time out)."""
    paths = [BAD[c][0](tmp_path / f"{c}.gguf") for c in ("huge-array", "huge-byte-array", "huge-string",
                                                          "huge-key-count", "huge-tensor-count")]
    code = textwrap.dedent(f"""
        from qkv.checkpoints import gguf
        from qkv.runtime.errors import QkvError
        for p in {[str(p) for p in paths]!r}:
            try:
                gguf.open_reader(p)
                raise SystemExit("read " + p)
            except QkvError:
                pass
        status = open("/proc/self/status").read().split("VmHWM:")[1]     # peak resident set, this process only
        print(status.split()[0])                                          # (ru_maxrss survives exec: the parent's)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PATIENCE)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 300_000                                   # KiB: no gigabyte allocations
