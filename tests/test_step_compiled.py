"""The one-token step in one compiled call a layer (core.step_compiled) against the readable step it replaces
(layer.step_block, QKV_STEP=readable): on every decoder family fixture with float32 weights, on GGUF files of
every stored kind in both arithmetics, over 200 greedy tokens of SmolLM2, and kept on disk between processes.
Where a block cannot take it (`refusal`), generation takes the readable step and its numbers are unchanged."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import qkv
from qkv.core import step_compiled as sc
from qkv.core import step_math as sm
from qkv.runtime.errors import QkvError
from qkv.writing.generate import decode

from conftest import DECODER_FIXTURES, FIXTURES, MODELS
from test_decode_fast import step_logits

REL = 1e-6              # the relative error of each logits vector, ‖compiled − readable‖ ÷ ‖readable‖ (the issue's
                        # bound), worst over rows and steps. Most float32 families are bit-equal (REL 0); BLOOM, MPT,
                        # Falcon-RW and Gemma 2 differ in the last bit where the readable step's float32 product
                        # (BLAS: OpenBLAS here sums x·W_out of these sizes in another order) is not the compiled one's
                        # (x_i·W_i added one row after another), and Gemma 2's soft-cap (NumPy's tanh, libm's)


def both_ways(model, monkeypatch, steps: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """(compiled logits, readable logits, compiled layer calls) of a padded batch of two prompts."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, model.config.vocab_size, size=(2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[1, :3] = 0                                                       # left padding in row 1
    calls = []
    real = sc.step
    monkeypatch.setattr(sc, "step", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setenv("QKV_STEP", "compiled")
    fast = np.stack(step_logits(model, ids, mask, steps))             # (steps + 1, B, 1, V)
    monkeypatch.setenv("QKV_STEP", "readable")
    n = len(calls)
    plain = np.stack(step_logits(model, ids, mask, steps))
    assert len(calls) == n                                                # readable: never the compiled step
    return fast, plain, n


def relative(a: np.ndarray, b: np.ndarray) -> float:
    """The worst relative error of the logits vectors (…, V) of A against B."""
    return float((np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)).max())


@pytest.mark.parametrize("name", DECODER_FIXTURES)
def test_every_decoder_family_takes_the_compiled_step_or_keeps_the_readable_one(name, monkeypatch):
    model = qkv.load(str(MODELS / name))
    blocks = getattr(model.weights, "blocks", None) or []
    able = sum(sc.refusal(model.config, b) is None for b in blocks)
    fast, plain, calls = both_ways(model, monkeypatch)
    # phi3's step past original_max_position_embeddings (12) reads the whole sequence again (LongRoPE's long
    # table, tests/test_cache.py): a pass of many rows, not a one-token step
    steps = 5 if model.config.family == "phi3" else 6
    assert calls == able * steps
    if able:
        assert relative(fast, plain) <= REL
    else:
        assert np.array_equal(fast, plain)


def test_the_families_it_takes():
    """What the compiled step is for, at least: Llama, Mistral, Qwen2, Phi-3, Gemma (GELU), GLM (pairs turned
    interleaved, half the head rotated), and the families of q/k norms, output norms, LayerNorm, parallel blocks
    and ALiBi; what it leaves to the readable step, with its reason."""
    for name in ("llama_gqa", "llama_mqa", "llama_yarn", "mistral", "qwen2", "qwen2_sliding", "phi3", "gemma", "glm",
                 "qwen3", "exaone4", "hunyuan_v1_dense",           # q/k norms of each head (Hunyuan: after RoPE)
                 "olmo2", "olmo3", "gemma2", "gemma3_text", "glm4",  # norms on the outputs; OLMo 2's of all q, k
                 "granite", "llama_mlp_bias", "arcee",             # the multiplier; the FFN's biases; ReLU²
                 "gpt2", "gpt_neo", "gpt_neox", "gpt_neox_sequential", "gptj", "phi", "phi2", "falcon",  # LayerNorm,
                 "starcoder2", "stablelm", "cohere", "bloom", "mpt", "falcon_rw"):   # parallel, per-head, ALiBi
        model = qkv.load(str(MODELS / name))
        assert {sc.refusal(model.config, b) for b in model.weights.blocks} == {None}, name
    for name, why in (("opt", "not a pre-norm block"), ("gpt_oss", "sinks"), ("deepseek_v3", "attention box"),
                      ("mixtral", "its FFN")):
        model = qkv.load(str(MODELS / name))
        assert all(why in sc.refusal(model.config, b) for b in model.weights.blocks), name


def test_the_norms_sums_are_numpys_pairwise_order():
    """np.add.reduce sums float32 numbers pairwise (eight accumulators a block of ≤ 128, halves at multiples of
    8): `_pairwise_of` is that order, bit for bit, in float32 and widened to float64 (ggml's Σx²)."""
    rng = np.random.default_rng(7)
    for n in [*range(1, 300), *range(300, 5001, 23), 4096, 5000]:
        a = (rng.standard_normal(n) * rng.uniform(0.01, 100)).astype(np.float32)
        assert sm.pairwise32(a, n) == np.add.reduce(a), n
        assert sm.pairwise64(a, n) == np.add.reduce(a.astype(np.float64)), n


@pytest.mark.parametrize("kind, arith", [("rms", "exact"), ("rms", "llama.cpp"), ("layer", "exact")])
def test_the_compiled_norms_are_the_readable_steps_to_the_bit(kind, arith):
    """`norm_of`: blocks.norm's numbers (a batch of rows) and layer.row_norm's (one row), bit for bit."""
    from types import SimpleNamespace
    from qkv.core.blocks import norm
    from qkv.core.layer import row_norm
    from qkv.core.weights import NormWeights
    rng = np.random.default_rng(3)
    f = sm.norm_of(arith == "llama.cpp")
    cfg = SimpleNamespace(norm=kind, arith=arith, norm_eps=1e-5)
    for d in (1, 5, 8, 64, 127, 129, 576, 2048, 3001):
        x = (rng.standard_normal((2, 1, d)) * 3 + 0.5).astype(np.float32)       # (B, 1, d)
        w = NormWeights(rng.standard_normal(d).astype(np.float32),
                        rng.standard_normal(d).astype(np.float32) if kind == "layer" else None)
        y = np.empty((2, d), np.float32)
        for b in range(2):
            f(kind == "layer", x[:, 0], b, 0, d, w.weight, sc._or_none(w.bias), np.float32(1e-5), y, 0)
        assert np.array_equal(y, norm(x, w, cfg)[:, 0]), d
        assert np.array_equal(y[:1], row_norm(x[:1], w, cfg)[:, 0]), d


def test_the_compiled_activations_are_ops_to_the_bit():
    """`act` is ops.ACTIVATIONS' float32 steps; its exp (`exp32`) NumPy's own kernel's where NumPy has it
    (AVX2 or AVX-512), else within 3 ulp of the C library's expf that NumPy then calls."""
    from numba import njit
    from numpy._core._multiarray_umath import __cpu_features__ as cpu
    from qkv.core.ops import ACTIVATIONS
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(100_000) * 4, rng.uniform(-110, 90, 100_000),
                        [0, -0.0, np.inf, -np.inf]]).astype(np.float32)
    simd_exp = cpu.get("AVX512F") or cpu.get("AVX2") and cpu.get("FMA3")
    @njit
    def each(no, x):
        y = np.empty_like(x)
        for i in range(x.shape[0]):
            y[i] = sm.exp32(x[i]) if no < 0 else sm.act(no, x[i])
        return y

    for name in (*sc.ACTS, "exp"):

        with np.errstate(over="ignore", invalid="ignore"):
            want = np.exp(x) if name == "exp" else ACTIVATIONS[name](x)
            got = each(-1 if name == "exp" else sc.ACTS.index(name), x)
        if simd_exp or name in ("gelu", "relu", "relu2"):
            assert np.array_equal(got, want, equal_nan=True), name
        else:
            assert np.allclose(got, want, rtol=4e-7, atol=0, equal_nan=True), name


@pytest.fixture(scope="module")
def gguf_maker():
    sys.path.insert(0, str(FIXTURES))
    import make_gguf_fixtures as F
    return F


# each file: W_Q/W_K/W_V, W_O, W_gate/W_in and W_out of four kinds (a plan is the kinds of its four products); the
# last: W_Q, W_K, W_V apart, V in another kind (Q4_K_M's layers), three products side by side
Q4_K_M = ("Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K")
EXACT = [("Q4_0", "Q4_1", "Q5_0", "Q5_1"), ("Q8_0", "Q4_K", "Q5_K", "Q6_K"), ("F16", "BF16", "Q6_K", "Q8_0"), Q4_K_M]
LLAMA = [("Q4_0", "Q4_1", "Q5_0", "Q5_1"), ("Q8_0", "Q4_K", "Q5_K", "Q6_K"), Q4_K_M]


@pytest.mark.parametrize("arith, kinds", [("exact", k) for k in EXACT] + [("llama.cpp", k) for k in LLAMA])
def test_stored_weights_in_both_arithmetics(arith, kinds, gguf_maker, tmp_path, monkeypatch):
    """Stored matrices multiply by the kernels' own rows: the readable step's products exactly; what differs is
    the order of the sums around them (norms, scores)."""
    import gguf

    *qkv_kinds, o_kind, in_kind, out_kind = kinds
    apart = dict(zip(("attn_q", "attn_k", "attn_v"), qkv_kinds)) if len(qkv_kinds) == 3 else {}

    def kinds_of(meta, tensors):
        for name, (data, raw) in list(tensors.items()):
            parts = name.split(".")                                       # blk.N.attn_output.weight
            kind = ({"attn_output": o_kind, "ffn_down": out_kind, **apart}.get(parts[2])
                    if parts[0] == "blk" and parts[-1] == "weight" else None)
            if kind is not None:
                w = data.astype(np.float32) if raw is None else gguf.quants.dequantize(data, raw)
                tensors[name] = gguf_maker.encode(w, kind)

    for arch in ("llama", "qwen2"):                                       # qwen2: biases on Q, K, V
        path = gguf_maker.make(tmp_path / f"{arch}.gguf", arch, "Q8_0", edit=kinds_of,
                               types=dict(embed="Q8_0", attn=qkv_kinds[0], ffn=in_kind, output="Q8_0"))
        model = qkv.load(str(path), dtype="stored", arith=arith)
        assert {sc.plan_of(model.config, b).kinds for b in model.weights.blocks} == {kinds}
        fast, plain, calls = both_ways(model, monkeypatch, steps=4)
        assert calls == 4 * model.config.n_layers
        assert np.array_equal(fast, plain), arch                          # bit for bit in either arithmetic


@pytest.mark.parametrize("dtype, arith", [("stored", "exact"), ("stored", "llama.cpp"), (np.float32, "exact")])
def test_two_hundred_greedy_tokens_are_the_readable_steps(dtype, arith, monkeypatch):
    """SmolLM2 (stored Q4_1 and Q8_0 in either arithmetic, or dequantised to float32) writes the same 200 tokens
    either way."""
    model = qkv.load("smollm2", dtype=dtype, arith=arith)
    prompt = model.encode("The capital of France is")[0].reshape(1, -1)              # (1, n)
    calls = []
    real = sc.step
    monkeypatch.setattr(sc, "step", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setenv("QKV_STEP", "compiled")
    fast = model.generate(prompt, 200, temperature=0, stop_at_eos=False)
    assert len(calls) == 199 * model.config.n_layers
    monkeypatch.setenv("QKV_STEP", "readable")
    assert np.array_equal(fast, model.generate(prompt, 200, temperature=0, stop_at_eos=False))


@pytest.mark.parametrize("arith", ["exact", "llama.cpp"])
def test_random_prompts_take_the_same_steps_to_the_bit(arith, monkeypatch):
    """SmolLM2 stored, random prompts, a batch of two (one padded), a dozen steps: the compiled step's logits are
    the readable one's to the bit in either arithmetic. (In llama.cpp's, one ulp in a score moves a rounding to 8
    bits: when BLAS summed the readable step's scores, the two parted from the second new token.)"""
    model = qkv.load("smollm2", dtype="stored", arith=arith)
    for seed in (1, 2):
        fast, plain, calls = both_ways(model, monkeypatch, steps=12, seed=seed)
        assert calls == 12 * model.config.n_layers
        assert np.array_equal(fast, plain), seed


def test_hooks_recording_and_ablation_take_the_readable_step(monkeypatch):
    monkeypatch.setenv("QKV_STEP", "compiled")
    model = qkv.load(str(MODELS / "llama_gqa"))
    ids = np.arange(3, 9)[None]
    calls = []
    real = sc.step
    monkeypatch.setattr(sc, "step", lambda *a: calls.append(1) or real(*a))
    fast = model.generate(ids, 5, temperature=0, stop_at_eos=False)
    assert len(calls) == 4 * model.config.n_layers
    calls.clear()
    seen = []
    hooked = model.generate(ids, 5, temperature=0, stop_at_eos=False,
                            hooks={"0.heads": lambda z, layer: seen.append(layer) or z})
    assert np.array_equal(hooked, fast) and seen and not calls
    model.ablate([(0, 1)]).generate(ids, 3, temperature=0, stop_at_eos=False)
    assert not calls
    steps = list(decode(model, ids, np.ones_like(ids), 3, temperature=0, keep_attentions=True))
    assert not calls and steps[-1].attentions is not None                 # each step's A recorded
    monkeypatch.setenv("QKV_STEP", "readable")
    model.generate(ids, 3, temperature=0, stop_at_eos=False)
    assert not calls
    monkeypatch.setenv("QKV_STEP", "fastest")
    with pytest.raises(QkvError, match="QKV_STEP='fastest' is not a way"):
        model.generate(ids, 3, temperature=0, stop_at_eos=False)


# A child: for each PATH@ARITH on its command line, that model's logits compiled − readable (relative)
PLANS_CHILD = r"""
import json, os, sys
import numpy as np
import qkv
from qkv.core import step_compiled as sc
from qkv.core.cache import KVCache
out = {}
for arg in sys.argv[1:]:
    path, arith = arg.split("@")
    model = qkv.load(path, arith=arith)
    ids, mask = np.array([[1, 5, 9, 14]]), np.ones((1, 7), np.int64)
    both = []
    for how in ("compiled", "readable"):
        os.environ["QKV_STEP"] = how
        cache = KVCache(model.config, 1, 7)
        logits = [model.last_logits(ids, mask[:, :4], cache=cache)]
        for t in range(3):
            logits.append(model.last_logits(logits[-1][:, -1].argmax(-1)[:, None], mask[:, :5 + t], cache=cache))
        both.append(np.stack(logits))
    out[arg] = float(np.abs(both[0] - both[1]).max() / np.abs(both[1]).max())
print(json.dumps({"rel": out, "loaded": sum(sum(f.stats.cache_hits.values()) for f in sc._compiled.values())}))
"""


def test_plans_kept_on_disk_are_read_back_and_meet_in_a_third_process(gguf_maker, tmp_path):
    """Each plan is one entry of the kernel cache (runtime.kernel_cache, which also checks what it reads back:
    tests/test_kernel_cache.py). Two plans compiled in two processes (one GGUF file in exact and in llama.cpp
    arithmetic: their norms are other functions) and read back into a third keep their own callees: the readable
    step's numbers there (numba's function ids restart in each process; the callees are linked by name)."""
    from test_kernel_cache import environment
    env = environment(tmp_path / "cache")
    path = gguf_maker.make(tmp_path / "tiny.gguf", "llama", "F32")       # F32 rows: the quickest plans to compile
    exact, ggml = f"{path}@exact", f"{path}@llama.cpp"

    def child(*args) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", PLANS_CHILD, *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def result(p: subprocess.Popen) -> dict:
        out, err = p.communicate()
        assert p.returncode == 0, err[-3000:]
        return json.loads(out.splitlines()[-1])

    first = [child(exact), child(ggml)]                                   # side by side, one cache
    assert [result(p)["loaded"] for p in first] == [0, 0]
    assert len(list((tmp_path / "cache" / "kernels").rglob("_layer_*.nbk"))) == 2
    both = result(child(exact, ggml))
    assert both["loaded"] == 2 and max(both["rel"].values()) <= REL


def test_every_float32_checkpoint_takes_one_compiled_layer():
    """A plan is its arithmetic and its products' kinds: the families' differences are arguments, so every float32
    fixture the compiled step takes runs the same compiled layer (one compile a process, one file kept)."""
    plans = set()
    for name in DECODER_FIXTURES:
        model = qkv.load(str(MODELS / name))
        plans |= {sc.plan_of(model.config, b) for b in getattr(model.weights, "blocks", None) or []
                  if sc.refusal(model.config, b) is None}
    assert plans == {sc.Plan("exact", ("F32",) * 4)}


def test_import_qkv_leaves_numba_to_its_first_use():
    """numba (~0.3 s to import) comes in where a stored model or the first compiled step needs it, not with
    `import qkv`: every CLI run, worker and child process imports qkv."""
    done = subprocess.run([sys.executable, "-c", "import sys, qkv, qkv.core.stack; print('numba' in sys.modules)"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_the_compiled_ggml_silu_is_llama_arith_s_to_the_bit():
    """llama.cpp arithmetic's SiLU in the compiled layer (step_math.act's GGML_SILU, its e^x ggml's own polynomial;
    GGML_SILU + 1 for a row's last n mod 8, the C library's expf) against llama_arith.silu, the definition equal to
    ggml's (tests/fixtures/gguf/ggml_ops.npz: 4,101 numbers, e^x's over- and underflow, ±0, ±3.4e38, a tail of 5);
    and a llama.cpp-arithmetic plan's switches choose it, an exact one's not."""
    from numba import njit

    from qkv.runtime import llama_arith

    assert sm.GGML_SILU == sc.GGML_SILU
    x = np.load(FIXTURES / "gguf" / "ggml_ops.npz")["silu_x"]

    @njit
    def each(no, x, vec):
        out = np.empty_like(x)
        for i in range(x.shape[0]):
            out[i] = sm.act(no + 1 if no == sm.GGML_SILU and i >= vec else no, x[i])
        return out

    want = llama_arith.silu(x)
    got = each(sm.GGML_SILU, x, x.shape[0] - x.shape[0] % 8)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert not np.array_equal(each(0, x, 0).view(np.uint32), want.view(np.uint32))    # qkv's own SiLU differs
    path = FIXTURES / "gguf" / "tiny-llama-q4_0.gguf"
    for arith, no in (("llama.cpp", sc.GGML_SILU), ("exact", sc.ACTS.index("silu"))):
        model = qkv.load(path, arith=arith)
        assert sc.switches(model.config, model.weights.blocks[0])[2] == no
