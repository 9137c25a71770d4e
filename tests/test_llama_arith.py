"""llama.cpp's arithmetic (runtime.llama_arith): the activations' block quantisation by hand, the block products
against their formula, and qkv's logits with every product in llama.cpp's arithmetic against llama.cpp's own
(tests/fixtures/gguf/llamacpp_logits.npz, made by make_llamacpp_logits_fixture.py with llama-cpp-python 0.3.36,
on one thread and two: identical).

Measured (max |qkv − llama.cpp| over the stored logits):
    tiny llama GGUFs (Q4_0, Q8_0, Q4_1 + Q5_1; 24 positions, the last 8 stored):
        exact products                    0.027 – 0.048
        llama.cpp products                0 (to the bit), with llama.cpp's float32 KV cache; with its default
                                          float16 cache too once q, k, v and A are rounded to float16 (hooks)
    tiny llama GGUFs of K-quants (Q4_K, Q5_K, Q6_K; d_model 256, one layer; 24 positions, all stored):
        exact products                    0.14 – 0.23 (0.058 – 0.13 at the first position)
        llama.cpp products                0 at every position for Q4_K; float32 / float16 cache, first
                                          positions equal of fox / chat / code: Q5_K 24 / 20 / 9 and 19 / 24 / 12,
                                          Q6_K 24 / 24 / 24 and 6 / 24 / 24 (then up to 0.11: one 8-bit step)
    SmolLM2 Q4_1 (every 32nd logit; 10 / 16 / 20 positions of the prompts fox / chat / code), float32 KV cache:
        exact products                    1.06 – 1.46 (0.23 – 0.61 at the first position)
        llama.cpp products                0.81 – 0.98; 0 at the first position of fox and code, 0.46 of chat
        + ggml's RMSNorm (rms_norm)       0 for the first 3 / 3 / 6 positions
        + ggml's RoPE angles              0 for the first 7 / 3 / 6 positions, then 0.71 – 0.86 (mean 0.48 – 0.54)
        + ggml's SiLU (its own e^x)       0 for the first 7 / 7 / 6 positions, then up to 0.63 / 0.79 / 1.0
        (llama.cpp's float16 cache, q, k, v and A rounded to float16: 0 for the first 1 / 3 / 4 positions)
    Past those SmolLM2 is as far from llama.cpp as llama.cpp is from itself: one ulp anywhere (here the order
    of attention's sums) moves a block's 8-bit rounding by a whole step, and 30 layers spread it (llama.cpp
    reading the prompt in one batch or a token at a time agrees for 3 / 6 / 5 positions, then differs by up to
    1.0). Following it there needs its attention's order of summation too (not defined yet).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import qkv
from qkv.runtime import llama_arith
from qkv.runtime.errors import QkvError
from qkv.runtime.llama_arith import k_weight_integers, llama_matvec, quantize_activations, weight_integers
from qkv.runtime.stored import StoredMatrix
from conftest import FIXTURES, run_main

sys.path.insert(0, str(FIXTURES))

GGUF = FIXTURES / "gguf"
TINY = ("tiny-llama", "tiny-llama-q4_0", "tiny-llama-q8_0")
TINY_K = ("tiny-llama-q4_k", "tiny-llama-q5_k", "tiny-llama-q6_k")
PROMPTS = ("fox", "chat", "code")
SAME = 1e-6            # "equal to llama.cpp": measured 0 (bit for bit)
APART = 0.01           # exact products differ from llama.cpp by more than this (measured ≥ 0.027)


@pytest.fixture(scope="module")
def fixture():
    return np.load(GGUF / "llamacpp_logits.npz")


# ── the activations' quantisation, by hand ───────────────────────────────────────────────

def block(*head: float, fill: float = 0.0, per: int = 32) -> np.ndarray:
    """One row of one block: HEAD then FILL."""
    return np.array(list(head) + [fill] * (per - len(head)), np.float32)[None]


def test_q8_0_rounds_ties_to_even_as_avx2_and_away_as_the_reference():
    x = block(127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 3.2, -3.7)            # amax 127: x·127/amax = x exactly
    even = quantize_activations(x, "Q8_0")
    assert even.q[0, 0, :8].tolist() == [127, 0, 2, 2, 0, -2, 3, -4]
    assert even.d[0, 0] == 1.0 and even.s is None
    away = quantize_activations(x, "Q8_0", ties="away")
    assert away.q[0, 0, :8].tolist() == [127, 1, 2, 3, -1, -2, 3, -4]
    with pytest.raises(QkvError):
        quantize_activations(x, "Q8_0", ties="up")


def test_q8_0_scale_is_rounded_to_float16_but_the_integers_use_the_float32_scale():
    x = block(1.0, -0.5, 0.25)
    a = quantize_activations(x, "Q8_0")
    # 1/127 = 0.0078740…: float16's step there is 2⁻¹⁷, and 0.0078740 − 2⁻⁷ is 8.06 steps → 2⁻⁷ + 8·2⁻¹⁷
    assert a.d[0, 0] == np.float32(2 ** -7 + 8 * 2 ** -17) != np.float32(1) / np.float32(127)
    assert a.q[0, 0, :3].tolist() == [127, -64, 32]                 # −63.5 → −64 (even), 31.75 → 32
    assert a.q.dtype == np.int8 and a.q.shape == (1, 1, 32)


def test_q8_1_keeps_the_block_sum_scaled_by_the_unrounded_scale():
    x = block(1.0, 0.0625)
    a = quantize_activations(x, "Q8_1")
    total = 127 + 8                                                  # 0.0625·127 = 7.94 → 8
    assert a.q[0, 0, :2].tolist() == [127, 8] and int(a.q.sum()) == total
    d32 = np.float32(1) / np.float32(127)
    assert a.s[0, 0] == np.float16(d32 * np.float32(total)).astype(np.float32)
    assert a.s[0, 0] != np.float16(a.d[0, 0] * total)                # not the float16 scale's product


def test_a_block_of_zeros_quantises_to_zero_and_blocks_are_independent():
    x = np.concatenate([block(), block(2.0, 1.0)], axis=-1)           # (1, 64): a zero block, then amax 2
    a = quantize_activations(x, "Q8_1")
    assert a.d[0].tolist() == [0.0, np.float32(np.float16(np.float32(2) / np.float32(127)))]
    assert not a.q[0, 0].any() and a.s[0, 0] == 0 and a.q[0, 1, :2].tolist() == [127, 64]   # 63.5 → 64 (even)
    with pytest.raises(QkvError):
        quantize_activations(np.ones((1, 48), np.float32), "Q8_0")


def test_q8_k_maps_the_signed_extreme_to_minus_127_with_a_float32_scale():
    x = block(0.5, -2.0, 1.0, per=256)                                # the extreme −2: iscale = 63.5
    a = quantize_activations(x, "Q8_K")
    assert a.q[0, 0, :3].tolist() == [32, -127, 64]                  # 31.75 → 32; 63.5 → 64 (even)
    assert a.d[0, 0] == np.float32(1) / np.float32(63.5)
    assert a.bsums[0, 0].tolist() == [32 - 127 + 64] + [0] * 15
    b = quantize_activations(-x, "Q8_K")                              # the extreme +2 maps to −127 too: the
    assert np.array_equal(b.q, a.q) and b.d[0, 0] == -a.d[0, 0]       # same integers, the scale negated


# ── the products ─────────────────────────────────────────────────────────────────────────

def stored_matrix(kind: str, rows: int = 5, cols: int = 96, seed: int = 0) -> StoredMatrix:
    rng = np.random.default_rng(seed)
    raw = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32),
                               getattr(gguf.GGMLQuantizationType, kind))
    return StoredMatrix(kind, np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1), cols)


@pytest.mark.parametrize("kind", llama_arith.PRODUCTS_32)
def test_weight_integers_and_scales_give_back_the_dequantised_weights(kind):
    w = stored_matrix(kind)
    q, d, m = weight_integers(w)                                      # (d_out, nb, 32), (d_out, nb)
    t = d[..., None] * q + (0 if m is None else m[..., None])         # (d_out, nb, 32)
    assert np.array_equal(t.reshape(w.d_out, w.d_in).astype(np.float32), w.dequantized().T)


@pytest.mark.parametrize("kind", llama_arith.PRODUCTS_32)
def test_the_product_is_the_block_formula_and_within_the_rounding_bound_of_the_exact_one(kind):
    w = stored_matrix(kind)
    x = np.random.default_rng(1).standard_normal((3, w.d_in)).astype(np.float32) * 3
    y = llama_matvec(w, x)                                            # (3, d_out)
    q, d, m = weight_integers(w)
    a = quantize_activations(x, llama_arith.VEC_DOT[kind])
    ints = np.einsum("obj,rbj->rob", q.astype(np.int64), a.q.astype(np.int64))        # (R, d_out, nb) exact
    plain = (np.float32(1) * d[None] * a.d[:, None]).astype(np.float64) * ints        # fp32(d_w·d_x) · Σ q q
    if m is not None:
        plain = plain + (m[None] * a.s[:, None]).astype(np.float64)
    assert np.allclose(y, plain.sum(-1), rtol=1e-6, atol=1e-6 * np.abs(plain).sum(-1).max())
    # x differs from d_x·q_x by half a step, and 127 times the float16 rounding of the scale (≤ 2⁻¹¹ relative);
    # y from x @ W by Σ|W|·that
    err = np.abs(x.reshape(3, -1, 32) - a.d[..., None] * a.q).reshape(3, -1)         # (R, d_in)
    assert np.all(err <= a.d.repeat(32, axis=1) * (0.5 + 127 * 2 ** -11) * 1.001)
    bound = err @ np.abs(w.dequantized()) + 1e-4                                      # (R, d_out)
    assert np.all(np.abs(y - x @ w.dequantized()) <= bound)
    assert np.abs(y - x @ w.dequantized()).max() > 1e-4                                # and it is not the exact one


# ── the K-quants' products (super-blocks of 256, Q8_K activations) ──────────────────────────

def k_matrix(kind: str, rows: int = 5, cols: int = 512, seed: int = 0) -> StoredMatrix:
    """A random K-quant W (gguf.quants cannot quantise K-quants: random super-blocks with sane scales)."""
    import make_gguf_fixtures as F

    return StoredMatrix(kind, F.random_blocks((rows, cols), kind, seed), cols)


@pytest.mark.parametrize("kind", llama_arith.PRODUCTS_K)
def test_k_weight_integers_scales_and_mins_give_back_the_dequantised_weights(kind):
    w = k_matrix(kind)
    kw = k_weight_integers(w)                                         # q (d_out, nb, 256), sc (d_out, nb, S)
    assert kw.q.shape == (5, 2, 256) and kw.q.max() == {"Q4_K": 15, "Q5_K": 31, "Q6_K": 63}[kind]
    assert kw.sc.shape == (5, 2, 16 if kind == "Q6_K" else 8) and (kw.m is None) == (kind == "Q6_K")
    # d·sc·q − dmin·m (Q6_K: d·sc·(q − 32)) in float64, rounded once: the gguf package's float32 weights
    assert np.array_equal(kw.dequantized().astype(np.float32), w.dequantized().T)


def k_plain(w: StoredMatrix, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The K-quant block formula in float64, any order: Σ_b fp32(d_x·d_w)·Σ_sub sc·Σ q_w·q_x − fp32(d_x·dmin)·Σ m·S,
    and a bound on the magnitudes the float sums see (the integers' products taken with |q_x|, Q6_K's q_w unsigned
    and its −32 part apart, as ggml's lanes hold them): (R, d_out) each."""
    kw = k_weight_integers(w)
    a = quantize_activations(x, "Q8_K")
    S = kw.sc.shape[-1]
    qx = a.q.astype(np.int64).reshape(*a.q.shape[:2], S, -1)                          # (R, nb, S, 256/S)
    qw = kw.q.astype(np.int64).reshape(*kw.q.shape[:2], S, -1)                        # (d_out, nb, S, 256/S)
    off = 32 if w.kind == "Q6_K" else 0
    ints = (np.einsum("obsj,rbsj->robs", qw - off, qx) * kw.sc[None]).sum(-1)       # (R, d_out, nb) exact
    big = (np.einsum("obsj,rbsj->robs", qw + off, np.abs(qx)) * np.abs(kw.sc[None])).sum(-1)
    scale = (a.d[:, None] * kw.d[None]).astype(np.float64)                            # (R, d_out, nb)
    terms, size = scale * ints, np.abs(scale) * big
    if kw.m is not None:
        S_x = a.bsums.astype(np.int64).reshape(*a.bsums.shape[:2], 8, 2).sum(-1)       # (R, nb, 8)
        mins = -(a.d[:, None] * kw.dmin[None]).astype(np.float64) * np.einsum("obs,rbs->rob", kw.m, S_x)
        terms, size = terms + mins, size + np.abs(mins)
    return terms.sum(-1), size.sum(-1)


@pytest.mark.parametrize("kind", llama_arith.PRODUCTS_K)
def test_a_k_quant_product_is_the_block_formula_and_within_the_rounding_bound_of_the_exact_one(kind):
    w = k_matrix(kind)
    x = np.random.default_rng(1).standard_normal((3, w.d_in)).astype(np.float32) * 3
    y = llama_matvec(w, x)                                            # (3, d_out)
    assert y.shape == (3, 5) and y.dtype == np.float32
    plain, size = k_plain(w, x)
    assert np.all(np.abs(y - plain) <= 3e-7 * size)          # ≤ nb + 3 float32 roundings of it (measured ≤ 1.5e-8)
    # x differs from d_x·q_x by half a step (d_x is 1/iscale in float32, no float16 rounding); y from x @ W by Σ|W|·that
    a = quantize_activations(x, "Q8_K")
    err = np.abs(x.reshape(3, -1, 256) - a.d[..., None] * a.q).reshape(3, -1)        # (R, d_in)
    assert np.all(err <= np.abs(a.d).repeat(256, axis=1) * (0.5 + 1e-5))
    bound = err @ np.abs(w.dequantized()) + 1e-5                                      # (R, d_out)
    assert np.all(np.abs(y - x @ w.dequantized()) <= bound)
    assert np.abs(y - x @ w.dequantized()).max() > 1e-4                                # and it is not the exact one


def q6_k_block(low: int, high: int, scales: list[int], d: float) -> np.ndarray:
    """One Q6_K super-block's 210 bytes, every weight's integer (high << 4) | low: ql, qh, int8 scales, fp16 d."""
    ql = np.full(128, low | (low << 4), np.uint8)
    qh = np.full(64, high * 0b01010101, np.uint8)                                    # the 2 bits of all four
    sc = np.array(scales, np.int8).view(np.uint8)
    return np.concatenate([ql, qh, sc, np.frombuffer(np.float16(d).tobytes(), np.uint8)])


def test_q6_k_lanes_take_the_minus_32_through_the_activations_sums_as_ggml_does():
    """Every weight 33 (q − 32 = 1) with scale 1 in sub-blocks 0–7 and 2 in 8–15; x with one value per lane
    position: ggml's lane k = Σ_chunks sc·Σ_4 33·q_x − 32·(sc·bsum of sub-blocks 2k, 2k+1)."""
    w = StoredMatrix("Q6_K", q6_k_block(1, 2, [1] * 8 + [2] * 8, 0.5)[None], 256)
    assert np.array_equal(k_weight_integers(w).q, np.full((1, 1, 256), 33, np.uint8))
    x = np.zeros(256, np.float32)
    x[0], x[20], x[100] = 127.0, -1.0, 2.0    # chunk 0 lane 0 (sub-block 0), lane 5 (sub-block 1); chunk 3 lane 1
    a = quantize_activations(x[None], "Q8_K")
    assert a.q[0, 0, [0, 20, 100]].tolist() == [-127, 1, -2] and a.d[0, 0] == np.float32(1) / np.float32(-1)
    lanes = llama_arith.k_lanes(k_weight_integers(w), a.q, a.bsums, 0)[0, 0]          # (8,)
    # products: lane 0: 1·33·(−127); lane 5: 1·33·1; lane 1: 1·33·(−2) (sub-block 6: chunk 3's first half)
    # −32·bsums: sub-blocks 0 (Σ −127) and 1 (Σ 1) → lane 0; sub-block 6 (Σ −2) → lane 3
    want = [33 * -127 - 32 * (-127 + 1), -66, 0, -32 * -2, 0, 33, 0, 0]
    assert lanes.tolist() == want
    assert sum(want) == -127 + 1 - 2                                                 # Σ sc·(q − 32)·q_x: the same total
    y = llama_matvec(w, x[None])
    d = np.float32(-1) * np.float32(0.5)
    assert y[0, 0] == llama_arith._hsum8(np.array(want, np.float32) * d)


def test_q4_k_adds_its_mins_in_four_lanes_and_q5_k_in_one_fused_sum():
    """ggml's AVX2: Q4_K's mins term in 4 float lanes (sub-blocks 2k, 2k+1) accumulated by fused multiply-adds, added
    (a0+a2)+(a1+a3); Q5_K's in one float32 sum, `summs += dmin·Σ m·S`, which gcc contracts to a fused multiply-add
    (llama-cpp-python 0.3.36's libggml-cpu: vfmadd231ss). Two super-blocks, built here step by step."""
    fma = llama_arith._fma32
    for kind in ("Q4_K", "Q5_K"):
        w = k_matrix(kind, rows=3, cols=512, seed=4)
        x = np.random.default_rng(5).standard_normal((2, 512)).astype(np.float32)
        kw, a = k_weight_integers(w), quantize_activations(x, "Q8_K")
        acc = np.zeros((2, 3, 8), np.float32)
        acc_m = np.zeros((2, 3, 4), np.float32)
        summs = np.zeros((2, 3), np.float32)
        for b in range(2):
            d = a.d[:, b, None] * kw.d[None, :, b]                                    # (R, d_out) float32
            acc = fma(d[..., None], llama_arith.k_lanes(kw, a.q, a.bsums, b).astype(np.float32), acc)
            S = a.bsums[:, b].reshape(2, 8, 2).sum(-1)                                # (R, 8)
            mins = S[:, None] * kw.m[None, :, b]                                      # (R, d_out, 8)
            dmin = -(a.d[:, b, None] * kw.dmin[None, :, b])                           # (R, d_out) float32
            acc_m = fma(dmin[..., None], mins.reshape(2, 3, 4, 2).sum(-1).astype(np.float32), acc_m)
            summs = fma(dmin, mins.sum(-1).astype(np.float32), summs)
        tail = (acc_m[..., 0] + acc_m[..., 2]) + (acc_m[..., 1] + acc_m[..., 3]) if kind == "Q4_K" else summs
        assert np.array_equal(llama_matvec(w, x), llama_arith._hsum8(acc) + tail), kind


def test_the_sum_follows_avx2s_lanes():
    """Eight lanes of 4, each accumulated over the blocks, then added pairwise: (l0+l4)+(l2+l6) + (l1+l5)+(l3+l7)."""
    acc = np.array([1e8, 1, -1e8, 1, 1, 1, 1, 1], np.float32)
    assert llama_arith._hsum8(acc) == np.float32(np.float32(np.float32(1e8 + 1) + np.float32(-1e8 + 1)) + 4)
    assert llama_arith._hsum8(acc) != np.float32(1e8) + 1 - np.float32(1e8) + 5                 # a left-to-right sum


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_K"])
def test_a_repacked_matrix_is_ggmls_gemv_and_gemm_to_the_bit(kind):
    """A Q4_0 or Q4_K T of 16 rows (a multiple of 8: llama.cpp on x86 repacks it, llama_arith.repacked) against ggml's
    own products (tests/fixtures/gguf/ggml_ops.npz, make_ggml_ops_fixture.py: libggml-cpu through ctypes): equal to
    its gemv (one row of x) and its gemm (x's first four rows; Q4_K's gemm sums in other steps than its gemv) to the
    bit, in the definition and the compiled kernel, and five rows of x as ggml takes them (a four by gemm, the
    fifth by gemv). Its 15 rows alone (not repacked) are ggml's one-row dot product instead, whose 8-lane order gives
    other numbers (measured: 63 / 54 of 80 differ from gemv's)."""
    from qkv.runtime import llama_kernels

    ref = np.load(GGUF / "ggml_ops.npz")
    at = "" if kind == "Q4_0" else "k_"
    blocks, x = ref[f"{at}blocks"], ref["x" if kind == "Q4_0" else "k_x"]     # (16, bytes), (5, 512)
    w = StoredMatrix(kind, blocks, x.shape[1])
    assert llama_arith.repacked(kind, w.d_out) and not llama_arith.repacked(kind, 15)
    assert not any(llama_arith.repacked(other, 16) for other in ("Q8_0", "Q4_1", "Q5_K", "Q6_K"))
    gemv, gemm = ref[f"{at}gemv"], ref[f"{at}gemm"]
    for rows in (1, 4, 5):
        want = np.concatenate([gemm, gemv[4:5]]) if rows == 5 else gemm if rows == 4 else gemv[:1]
        assert np.array_equal(llama_matvec(w, x[:rows]), want), rows
        got = np.empty((rows, 16), np.float32)
        llama_kernels.MATVEC[kind](x[:rows], *w.bits, got)
        assert np.array_equal(got, want), rows
    assert all(np.array_equal(llama_matvec(w, x[r:r + 1])[0], gemv[r]) for r in range(5))
    fifteen = StoredMatrix(kind, np.ascontiguousarray(blocks[:15]), x.shape[1])    # 15 rows: the one-row dot
    assert np.array_equal(llama_matvec(fifteen, x), ref[f"{at}vec_dot"][:, :15])
    assert (ref[f"{at}vec_dot"] != gemv).sum() > 10                                # two orders, two answers
    assert np.allclose(ref[f"{at}vec_dot"], gemv, rtol=1e-5, atol=1e-5)            # of the same integers


def test_silu_and_swiglu_are_ggmls_to_the_bit():
    """ggml's SiLU of a row (its own e^x polynomial eight at a time, the C library's expf for the last n mod 8) and
    SwiGLU silu(g)·u, against ggml_vec_silu_f32 / ggml_vec_swiglu_f32 themselves (tests/fixtures/gguf/ggml_ops.npz:
    4,101 numbers, the range where e^x over- and underflows, ±0, ±3.4e38, a tail of 5): every one equal, where
    qkv's exact SiLU (NumPy's exp) differs in the last bit of many."""
    from qkv.core.ops import silu as exact_silu

    ref = np.load(GGUF / "ggml_ops.npz")
    x, g = ref["silu_x"], ref["silu_g"]
    ours = llama_arith.silu(x)
    assert np.array_equal(ours.view(np.uint32), ref["silu"].view(np.uint32))
    with np.errstate(over="ignore"):
        assert np.array_equal((ours * g).view(np.uint32), ref["swiglu"].view(np.uint32))
        assert (exact_silu(x).view(np.uint32) != ref["silu"].view(np.uint32)).sum() > 100
    rows = np.stack([x[:4096], x[5:4101]])                                         # row by row, the last axis
    assert np.array_equal(llama_arith.silu(rows)[1], llama_arith.silu(x[5:4101]))


def test_ggml_rms_norm_and_rope_angles_are_qkvs_up_to_float32_rounding():
    from qkv.core.ops import rms_norm
    from qkv.core.positions import rope_cos_sin, rope_inv_freq

    x = np.random.default_rng(2).standard_normal((2, 5, 64)).astype(np.float32)
    g = np.random.default_rng(3).uniform(0.5, 2, 64).astype(np.float32)
    assert np.allclose(llama_arith.rms_norm(x, g, 1e-5), rms_norm(x, g, 1e-5), rtol=3e-7, atol=0)
    pos = np.arange(40)[None]                                                     # (1, 40)
    cos, sin = llama_arith.rope_cos_sin(pos, 64, 100000.0)                        # (1, 1, 40, 64)
    ref_cos, ref_sin = rope_cos_sin(pos, rope_inv_freq(64, 100000.0, dtype=np.float64))
    assert cos.shape == ref_cos.shape == (1, 1, 40, 64) and cos.dtype == np.float32
    assert np.abs(cos - ref_cos).max() < 2e-5 and np.abs(sin - ref_sin).max() < 2e-5   # angles ≤ 39: ulps of 39
    assert np.array_equal(cos[..., 0, :], np.ones((1, 1, 64), np.float32))        # position 0: no turn
    cos_i, sin_i = llama_arith.rope_cos_sin(pos, 64, 100000.0, interleaved=True)  # pairs (2i, 2i + 1)
    assert np.array_equal(cos_i[..., 0::2], cos[..., :32]) and np.array_equal(sin_i[..., 1::2], sin[..., :32])


def test_kinds_without_a_product_are_refused():
    w = stored_matrix("Q8_0")
    w.kind = "Q2_K"
    with pytest.raises(QkvError, match="Q2_K"):
        llama_matvec(w, np.ones((1, w.d_in), np.float32))
    with pytest.raises(QkvError, match="Q2_K"):
        k_weight_integers(w)


# ── qkv against llama.cpp's logits ──────────────────────────────────────────────────────

def to_half(value, layer):
    return value.astype(np.float16).astype(np.float32)


F16_CACHE = {"q": to_half, "k": to_half, "v": to_half, "attentions": to_half}   # llama.cpp's default KV cache


def logits(model, ids, cache: str) -> np.ndarray:
    """qkv's logits (n, V); CACHE f16kv: q, k, v and A rounded to float16 (llama.cpp keeps K and V in float16 and
    multiplies q and A with them as float16)."""
    hooks = F16_CACHE if cache == "f16kv" else None
    return model.forward(np.asarray(ids)[None], attentions=False, hooks=hooks).logits[0]


def same_file(fixture, name: str, path: Path) -> None:
    """The file on disk is the one the fixture was made from (make test installs SmolLM2's; a mismatch is a
    stale fixture: `make fixtures-llamacpp-logits` remakes it)."""
    assert path.exists(), f"{path} is missing"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(fixture[f"{name}/sha256"]), \
        f"{path.name} is not the file llamacpp_logits.npz was made from; run make fixtures-llamacpp-logits"


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_equal_llama_cpp_with_its_arithmetic(fixture, name):
    path = GGUF / f"{name}.gguf"
    same_file(fixture, name, path)
    model, exact = qkv.load(path, arith="llama.cpp"), qkv.load(path)
    assert (model.arith, exact.arith) == ("llama.cpp", "exact") and "llama.cpp arithmetic" in model.name
    for prompt in PROMPTS:
        key = f"{name}/{prompt}"
        assert float(fixture[f"{key}/threads_max_diff"]) == 0                      # one thread or two: the same
        for cache in ("f32kv", "f16kv"):
            ref = fixture[f"{key}/{cache}"]                                         # (last 8, V)
            ours = logits(model, fixture[f"{key}/ids"], cache)[-len(ref):]
            away = logits(exact, fixture[f"{key}/ids"], cache)[-len(ref):]
            assert np.abs(ours - ref).max() <= SAME, (key, cache)
            assert np.abs(away - ref).max() > APART, (key, cache)


@pytest.mark.parametrize("name", TINY_K)
def test_tiny_k_quant_models_equal_llama_cpp_with_its_arithmetic(fixture, name):
    """Every matrix of the block Q4_K / Q5_K / Q6_K (d_model 256, one layer; 24 positions stored): to the bit for
    the leading positions of every prompt and cache (measured ≥ 6; Q4_K all 24, and with the float32 cache Q6_K all
    24 and Q5_K 24 / 20 / 9), where exact products are ≥ 0.05 away from the first position on. Past them one ulp
    between the products (attention's sums, ggml's expf) moves an 8-bit rounding: every Q5_K product there was
    checked equal to ggml's own vec_dot to the bit given the same input (ctypes on libggml-cpu)."""
    path = GGUF / f"{name}.gguf"
    same_file(fixture, name, path)
    model, exact = qkv.load(path, arith="llama.cpp"), qkv.load(path)
    for prompt in PROMPTS:
        key = f"{name}/{prompt}"
        assert float(fixture[f"{key}/threads_max_diff"]) == 0
        for cache in ("f32kv", "f16kv"):
            ids, ref = fixture[f"{key}/ids"], fixture[f"{key}/{cache}"]                    # (24,), (24, V)
            ours, away = logits(model, ids, cache), logits(exact, ids, cache)
            lead = len(ref) if name == "tiny-llama-q4_k" or (name == "tiny-llama-q6_k" and cache == "f32kv") else 6
            assert np.abs(ours[:lead] - ref[:lead]).max() <= SAME, (key, cache)
            assert np.abs(away[:1] - ref[:1]).max() > 0.05, (key, cache)


def test_smollm2_leading_positions_equal_llama_cpp_with_its_arithmetic_norm_and_rope(fixture):
    """Products, RMSNorm, RoPE's angles and SiLU as ggml computes them: the first positions to the bit (float32 KV
    cache: measured 7 / 7 / 6 positions of fox / chat / code with ggml's SiLU (7 / 3 / 6 without), asserted 6, where
    llama.cpp agrees with itself for 3 / 6 / 5; its float16 cache: the first position, its dot products of float16
    K with q in their own order)."""
    from qkv.checkpoints import smollm2_file

    same_file(fixture, "smollm2", smollm2_file())
    model, exact = qkv.load(smollm2_file(), arith="llama.cpp"), qkv.load(smollm2_file())
    lead, step = 6, 32                                                             # every 32nd logit is stored
    for prompt in PROMPTS:
        key = f"smollm2/{prompt}"
        for cache, n in (("f32kv", lead), ("f16kv", 1)):
            ids, ref = fixture[f"{key}/ids"][:n], fixture[f"{key}/{cache}"][:n]   # (n,), (n, V / 32)
            ours = logits(model, ids, cache)[:, ::step]
            away = logits(exact, ids, cache)[:, ::step]
            assert np.abs(ours - ref).max() <= SAME, (key, cache)
            assert np.abs(away - ref).max() > 0.1, (key, cache)                    # measured 0.40 – 1.12


# ── choosing it: qkv.load, qkv --arith, qkv diff ─────────────────────────────────────────

def one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message
    return message


def test_llama_cpp_arithmetic_needs_a_gguf_files_stored_blocks_of_a_kind_it_multiplies(tmp_path, monkeypatch):
    import make_gguf_fixtures as F

    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))
    path = GGUF / "tiny-llama-q4_0.gguf"
    for dtype in (np.float32, np.float64, "bfloat16"):
        with pytest.raises(QkvError, match="stored blocks, not weights held as") as e:
            qkv.load(path, dtype=dtype, arith="llama.cpp")
        one_line(e)
    directory = tmp_path / "tiny"                                                  # a safetensors checkpoint
    qkv.load(path, dtype=np.float32).save(directory)
    with pytest.raises(QkvError, match="not a checkpoint that is not a GGUF file"):
        qkv.load(directory, arith="llama.cpp")
    with pytest.raises(QkvError, match="arith 'llama' is not"):
        qkv.load(path, arith="llama")
    with pytest.raises(QkvError, match="weights.W_vocab is BF16") as e:             # F16 table, BF16 W_vocab
        qkv.load(GGUF / "tiny-qwen2.gguf", arith="llama.cpp")
    assert "exact" in one_line(e)
    halves = F.make(tmp_path / "f16.gguf", "llama", types=dict(embed="Q8_0", attn="Q4_K", ffn="F16"))
    with pytest.raises(QkvError, match=r"weights.blocks\[0\].ffn.W_\w+ is F16"):
        qkv.load(halves, arith="llama.cpp")
    assert qkv.load(halves).arith == "exact"                                       # exact multiplies every kind


def test_a_loaded_model_carries_its_arithmetic_and_source():
    """qkv.load's arith and source as the model's attributes (not read back from its name): loading `source` again
    in `arith` gives the same model, as analysis workers do."""
    from qkv.analysis.run import model_fingerprint

    path = GGUF / "tiny-llama-q8_0.gguf"
    model, exact = qkv.load(path, arith="llama.cpp"), qkv.load(path)
    assert (model.arith, model.source) == ("llama.cpp", str(path)) and model.name.endswith("(llama.cpp arithmetic)")
    assert (exact.arith, exact.source) == ("exact", str(path))
    again = qkv.load(model.source, arith=model.arith)
    assert model_fingerprint(again) == model_fingerprint(model) != model_fingerprint(exact)
    ids = [[1, 5, 9, 3, 7]]
    np.testing.assert_array_equal(again.forward(ids).logits, model.forward(ids).logits)
    wide = model.astype(np.float64)                                 # dequantised: exact arithmetic, same source
    assert (wide.arith, wide.source) == ("exact", str(path))


def test_a_model_in_llama_cpp_arithmetic_saves_as_its_weights(tmp_path, monkeypatch):
    """The arithmetic is how qkv multiplies, not a checkpoint's knob: saved, the folder loads in exact arithmetic
    with the weights the file holds (its logits the GGUF's own in exact arithmetic, to float32's rounding)."""
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))
    path = GGUF / "tiny-llama-q8_0.gguf"
    qkv.load(path, arith="llama.cpp").save(tmp_path / "saved")
    saved, exact = qkv.load(tmp_path / "saved"), qkv.load(path)
    ids = [[1, 5, 9, 3, 7]]
    assert saved.arith == "exact"
    np.testing.assert_allclose(saved.forward(ids).logits, exact.forward(ids).logits, atol=1e-5, rtol=0)


@pytest.fixture
def qkv_cli(monkeypatch, capsys):
    """`qkv ARGS` → (exit code, stdout, stderr), the global --weights and --arith put back after the test."""
    from qkv.cli import common

    for key in ("dtype", "arith"):
        monkeypatch.setitem(common._weights, key, None)
    return lambda *args: run_main(monkeypatch, capsys, *args)


def test_qkv_arith_generates_what_the_python_api_does(tmp_path, qkv_cli):
    """Sampled (a seed), so that the few hundredths llama.cpp's arithmetic moves the logits by show in the ids."""
    path = str(GGUF / "tiny-llama-q4_0.gguf")
    settings = dict(max_new_tokens=16, temperature=1.0, seed=0, trace=True)
    want = qkv.load(path, arith="llama.cpp").generate("the cat", **settings).ids
    exact = qkv.load(path).generate("the cat", **settings).ids
    code, out, err = qkv_cli("--arith", "llama.cpp", "generate", "the cat", "--model", path, "-n", "16", "-t", "1",
                             "--seed", "0", "--trace", str(tmp_path / "t"))
    assert code == 0, err
    saved = qkv.Trace.load(tmp_path / "t")
    assert np.array_equal(saved.ids, want) and not np.array_equal(want, exact)
    assert saved.model.endswith("(llama.cpp arithmetic)")                           # the trace and its page say so
    assert "llama.cpp arithmetic" in (tmp_path / "t" / "attention.html").read_text(encoding="utf-8")
    code, out, err = qkv_cli("--arith", "llama", "generate", "x", "--model", path)
    assert code == 2 and "--arith" in err and len(err.strip().splitlines()) == 1
    code, out, err = qkv_cli("--weights", "float32", "--arith", "llama.cpp", "generate", "x", "--model", path)
    assert code == 2 and "stored blocks" in err and len(err.strip().splitlines()) == 1


def test_qkv_diff_shows_what_llama_cpps_arithmetic_changes(qkv_cli):
    path = str(GGUF / "tiny-llama-q4_0.gguf")
    code, out, err = qkv_cli("diff", "the quick brown fox jumps over the lazy dog", "--model", path,
                             "--arith-b", "llama.cpp")
    assert code == 0, err
    assert f"A = {path} [stored], B = {path} [stored, llama.cpp]" in out
    kl = float(out.split("final logits KL(A‖B) mean ")[1].split(" ")[0].rstrip(","))
    assert kl > 0
    code, out, err = qkv_cli("diff", "x", "--model", path, "--arith-b", "llama.cpp", "--requantize-b", "Q8_0")
    assert code == 2 and "--requantize-b" in err and len(err.strip().splitlines()) == 1


def _fma_by_fractions(a, b, c) -> np.float32:
    """a·b + c rounded once to float32 (to nearest, ties to even), from the exact rational value."""
    from fractions import Fraction
    x = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    f = np.float32(float(x))
    near = (f, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf)))
    return min(near, key=lambda v: (abs(Fraction(float(v)) - x), int(np.float32(v).view(np.int32)) & 1))


def test_the_fused_multiply_add_rounds_once():
    """llama_arith._fma32 is a·b + c rounded once, as ggml's vfmadd231ps: on random operands and on a sum that
    lands halfway between two float32s only once rounded to float64 (1 + 2⁻²⁴ + 2⁻⁶⁰), where rounding twice
    (float64, then float32) gives 1 instead of 1 + 2⁻²³."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(3000) * 2.0 ** rng.integers(-20, 20, 3000)).astype(np.float32)
    b = rng.integers(-2 ** 24, 2 ** 24, 3000).astype(np.float32)                  # lanes: integers
    c = (rng.standard_normal(3000) * 2.0 ** rng.integers(-20, 40, 3000)).astype(np.float32)
    a[0], b[0], c[0] = np.float32(8390656 * 2.0 ** -71), np.float32(16773121), np.float32(1)   # a·b = 2⁻²⁴ + 2⁻⁶⁰
    got = llama_arith._fma32(a, b, c)
    assert got[0] == np.nextafter(np.float32(1), np.float32(2))
    assert np.float32(np.float64(a[0]) * np.float64(b[0]) + np.float64(c[0])) == 1     # twice rounded: 1
    assert all(got[i] == _fma_by_fractions(a[i], b[i], c[i]) for i in range(3000))
