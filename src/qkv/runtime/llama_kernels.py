"""The numba kernels of llama.cpp's arithmetic (runtime.llama_arith): y = x @ W for W of a kind with a product
there (Q4_0, Q5_0, Q8_0, Q4_1, Q5_1; the K-quants Q4_K, Q5_K, Q6_K), bit for bit the definition
`llama_arith.llama_matvec` (tests/test_llama_kernels.py), compiled.

One entry per kind, called as the exact kernels are (`stored_kernels.MATVEC`): `MATVEC[kind](x, *bits, y)`,
x (R, d_in) float32 C-ordered, any R, BITS a StoredMatrix's parts with its float16 scales as their uint16 bits
(`StoredMatrix.bits`, widened exactly by `stored_kernels.f16`). Each entry

    1. quantises x once (`_quantize`, all R rows): per block of 32, amax, d_32 = amax/127, q = rint(x·(127/amax))
       (ties to even), d = fp16(d_32), and for the Q8_1 kinds s = fp16(d_32·Σq) — float16 rounding by the CPU's
       conversion or by frexp/ldexp in float64 (`_fp16`, ties to even, subnormals and overflow as float16's);
    2. runs its row kernel (`_rows_of`) over CHUNKS chunks of output rows, one per numba thread: for each row r
       of x, row o of T and block b, the 8 lanes of 4 integer products (exact), acc_k ← fma(fp32(d_w·d_x),
       fp32(lane_k), acc_k) (the definition's fused multiply-add, rounded once), and at the end of the row ((l0+l4)+(l2+l6)) +
       ((l1+l5)+(l3+l7)) (+ Σ_b fp32(m_w·s_x), summed in block order).

The K-quants (`_quantize_k`, `_k_rows_of`): x quantised once to Q8_K (per 256: the first largest |x| m,
iscale = −127/m, q = min(127, rint(x·iscale)), d = 1/iscale, the 16 sums of 16), then per super-block the 8
integer lanes of llama_arith.k_lanes (exact, int32), acc_k ← the fused multiply-add with fp32(d_x·d_w), and the
mins as the definition adds them (Q4_K: 4 lanes, (a0+a2)+(a1+a3); Q5_K: one float32 sum of fused multiply-adds).

How it is fast (integer SIMD, as ggml's own kernels, with numba values from `llama_simd`): a block's weights and
activations are each one vector of 32 bytes, unpacked in registers (nibbles, fifth bits, K-quants' 6-bit
fields); its 8 lanes come from vpdpbusd (AVX-512 VNNI) or vpmaddubsw + vpmaddwd (AVX2) — the K-quants' sub-block
scales applied to the int16 pairs, as ggml does; the float step is one float32 fused multiply-add per block
(`llama_simd`, "One rounding"); the
32-block kinds run eight (row of x, row of T) pairs at once so that their chains of multiply-adds overlap, the
next rows of T prefetched; the K-quants a pair at a time (eight chunks of integer work between two float steps),
a row of T unpacked once for every row of x. A Q4_0 T that llama.cpp repacks (rows a multiple of 8,
llama_arith.repacked) sums each row's block whole: eight rows' sums gathered into the lanes of one vector
(`llama_simd.lrows`) take one multiply-add a block between them, and its nibbles multiply x unsigned, the 8s
taken off through x's block sums (no sign trick): one thread, one row of x, in cache, 30 against 25 G weights/s
for the 8-lane order it replaced (the 1B shape's 2048 × 2048 and 8192 × 2048).
No fastmath: every float operation is the definition's, in its order (a reassociated sum would not be
bit-equal).

Measured (G weights/s, the best of repeated calls, beside the exact kernels `stored_kernels.MATVEC` in the same
run; AMD EPYC 2-core VM, Zen 4: AVX2, AVX-512 and VNNI; SmolLM2's shapes, random blocks; an idle machine):
          one row of x (decoding)                                                        128 rows (a prompt)
          one thread                             two threads                             one / two threads
          llama.cpp  exact      ÷ exact    before  llama.cpp  exact      ÷ exact    before  llama.cpp      exact
    Q4_0  12.2–16.1  12.8–15.6  0.95–1.04  1.3     17.4–30.0  20.1–30.9  0.87–1.02  2.5     13–18 / 20–36  47–62
    Q4_1  11.1–14.7  11.6–15.8  0.93–1.04  1.2     16.1–27.1  18.3–29.1  0.88–1.02  2.4     11–17 / 24–33  49–62
    Q8_0  12.9–18.7  12.2–17.3  0.99–1.08  1.2     19.5–34.9  21.9–33.3  0.89–1.08  2.4     14–19 / 27–38  58–68
    Q4_K  21.3–24.4  10.9–11.2  1.96–2.19  1.8     34.9–48.3  20.3–22.3  1.72–2.17  3.5     27–28 / 43–56  36–78
    Q6_K   9.5–10.0   7.9–8.0   1.21–1.26  1.6     17.5–20.1  15.4–15.9  1.14–1.26  3.2     22 / 33–41     31–52
(ranges over the shapes: 576 → 1536, 1536 → 576, 576 → 576, 576 → 192 — the smallest the slowest, x's quantising
and the threads' start a larger share; the K-quants 1536 → 576, 2048 → 2048, 2048 → 8192, 576 being no multiple
of 256. "before": the scalar kernels this replaced, 6–16× slower. A prompt's exact product dequantises tiles for
BLAS, which runs its own two threads in both columns.) The tied vocabulary, Q8_0 576 → 49152, read from memory:
11–17 on one thread against the exact kernel's 16–17 (it varies from run to run), 29–33 on two (exact 33). The
float step is what bounds the 32-block kinds: with the float64 step on every block they ran at 0.7–0.8× the exact
kernels. (The table is from before the definition's multiply-add became ggml's one rounding, which the machine's
FMA computes without testing each lane: since, one thread, one row of x, in cache, Q8_0 25, Q4_0 22, Q4_1 21 G
weights/s, 1.4–1.6× the exact kernels; read from memory, the eight-row kernel streams Q8_0 at ~16 GB/s on two
threads where the exact one reaches ~26.)
Kept on disk by `kernel_cache` as the exact kernels are (each entry whole, its parallel loop its own, checked when
read back; never numba's own cache).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from numba import njit, prange

from . import kernel_cache, llama_arith, llama_simd, simd, stored_kernels
from .kernel_cache import named
from .llama_arith import GEMM_ROWS, REPACK_ROWS
from .llama_simd import (bor, bstore, bsub, bytes32, dot, fhalves, field32, flane, fma1, fma8, fmav, fscale, fvec,
                         fzero, half_round, hbits32, hsum4, hsum8, ladd, lhalves, llane, lmins, lpairsums, lrows, lscale,
                         lsplat, lsub, lsum, lzero, nibbles32, prefetch, sdot, udot)
from .stored_kernels import CHUNKS, _chunk, f16

Q8_0, Q4, Q5 = 0, 1, 2            # how a block's 32 weights are unpacked (`_weights`)


@njit
def _fp16_by_frexp(v):
    """float32 V → the nearest float16 (ties to even) → float32, as NumPy's astype(float16) rounds."""
    m, e = math.frexp(np.float64(v))                      # v = m·2^e, 0.5 ≤ |m| < 1
    step = max(e - 11, -24)                               # 11 significant bits; float16's subnormals: steps of 2⁻²⁴
    r = math.ldexp(np.rint(math.ldexp(m, e - step)), step)   # exact scalings, one rounding
    if abs(r) > 65504.0:                                  # past float16's largest: infinity
        r = math.copysign(np.inf, r)
    return np.float32(r)


HALVES = stored_kernels._converts_halves()


@njit
def _fp16(v):
    """The same by the CPU's own conversion where it has one (x86's F16C: 0.8 against 11 ns, 0.7 against 1.2 µs to
    quantise a row of 576), else by frexp/ldexp (LLVM would call a runtime function the JIT may not find)."""
    return half_round(v) if HALVES else _fp16_by_frexp(v)


SUMS_Q8_1, SUMS_WHOLE = 1, 2      # _quantize's s: Q8_1's fp16(d_32·Σq), or Σq itself (exact, for a repacked Q4_0)


@njit
def _quantize(x, sums):
    """x (R, d_in) → q (R, nb, 32) int8, d (R, nb) float32, s (R, nb) float32 (SUMS_Q8_1: Q8_1's s; SUMS_WHOLE: Σq;
    else zeros), as llama_arith.quantize_activations(x, "Q8_0" / "Q8_1")."""
    R, nb = x.shape[0], x.shape[1] // 32
    q = np.empty((R, nb, 32), np.int8)
    d = np.empty((R, nb), np.float32)
    s = np.zeros((R, nb), np.float32)
    for r in range(R):
        for b in range(nb):
            xb = x[r, b * 32:b * 32 + 32]
            amax = np.float32(0)
            for j in range(32):
                a = abs(xb[j])
                if a > amax:
                    amax = a
            d32 = amax / np.float32(127)
            inv = np.float32(127) / amax if amax != 0 else np.float32(0)
            total = 0
            for j in range(32):
                v = np.int8(np.rint(xb[j] * inv))
                q[r, b, j] = v
                total += np.int32(v)
            d[r, b] = _fp16(d32)
            if sums == SUMS_Q8_1:
                s[r, b] = _fp16(d32 * np.float32(total))
            elif sums == SUMS_WHOLE:
                s[r, b] = np.float32(total)
    return q, d, s


@njit(inline="always")
def _weights(how, q, h, o, b, offset):
    """Block b of row o of T as its 32 integers (llama_simd.I8x32): Q8_0's int8; a Q4's nibbles (byte j of a block:
    weight j low, 16 + j high) − OFFSET; a Q5's with bit j of h[o, b] as weight j's fifth bit, − OFFSET."""
    if how == Q8_0:
        return bytes32(q[o, b])
    w = nibbles32(q[o, b])
    if how == Q5:
        w = bor(w, hbits32(np.uint32(h[o, b])))
    return bsub(w, offset)


@njit(inline="always")
def _lanes(how, tail, w, x):
    """The 8 integer lanes of a block (exact); the Q8_1 kinds' weights are unsigned (no sign trick)."""
    return udot(w, x) if tail else dot(w, x)


@njit(inline="always")
def _y(acc, summs, tail):
    """ggml's hsum_float_8 of the lanes (+ Σ_b fp32(m_w·s_x), the Q8_1 kinds)."""
    return hsum8(acc) + summs if tail else hsum8(acc)


# A block of a (row of x, row of T): lanes = its 8 integer lanes (exact), acc_k ← fma(fp32(d_w·d_x), fp32(lane_k),
# acc_k) (the definition's fused multiply-add, rounded once: fma8), and the Q8_1 kinds'
# summs + fp32(m_w·s_x). The float part is what costs (the integer lanes alone ran ~3× faster), and one chain
# of these multiply-adds waits on each block's: eight pairs at a time overlap eight chains — eight rows of T
# against a row of x (decoding), or a row of T against eight rows of x (a prompt: the block's weights unpacked
# once for the eight). Measured against four at a time: +15 % (576 × 1536, Q8_0, one row of x, float64 steps).

@njit(inline="always")
def _step(how, tail, q, d, m, h, offset, o, b, w, x, dxb, sxb, acc, summs):
    """acc, summs after block b of row o of T (its integers W) against x's block (X, its scales DXB, SXB)."""
    acc = fma8(acc, f16(d[o, b]) * dxb, _lanes(how, tail, w, x))
    if tail:
        summs = summs + f16(m[o, b]) * sxb
    return acc, summs


@njit(inline="always")
def _row_step(how, tail, q, d, m, h, offset, o, b, x, dxb, sxb, acc, summs):
    """`_step` with row o's block b unpacked here."""
    return _step(how, tail, q, d, m, h, offset, o, b, _weights(how, q, h, o, b, offset), x, dxb, sxb, acc, summs)


@njit(inline="always")
def _eight_rows(how, tail, qx, dx, sx, q, d, m, h, offset, y, r, o, o1):
    """y[r, o:o + 8] (rows past o1 − 1 repeat it), the next eight rows of T asked for from memory meanwhile (the
    float chains leave too few loads in flight for the hardware's own prefetching: 3–5 G weights/s without, ~11
    with, on a 576 × 49152 Q8_0 matrix)."""
    last = o1 - 1
    o_1, o_2, o_3 = min(o + 1, last), min(o + 2, last), min(o + 3, last)
    o_4, o_5, o_6, o_7 = min(o + 4, last), min(o + 5, last), min(o + 6, last), min(o + 7, last)
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = fzero()
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0)
    for b in range(dx.shape[1]):
        for k in range(8):
            prefetch(q[min(o + 8 + k, q.shape[0] - 1), b])
        x, dxb, sxb = bytes32(qx[r, b]), dx[r, b], sx[r, b]
        a0, s0 = _row_step(how, tail, q, d, m, h, offset, o, b, x, dxb, sxb, a0, s0)
        a1, s1 = _row_step(how, tail, q, d, m, h, offset, o_1, b, x, dxb, sxb, a1, s1)
        a2, s2 = _row_step(how, tail, q, d, m, h, offset, o_2, b, x, dxb, sxb, a2, s2)
        a3, s3 = _row_step(how, tail, q, d, m, h, offset, o_3, b, x, dxb, sxb, a3, s3)
        a4, s4 = _row_step(how, tail, q, d, m, h, offset, o_4, b, x, dxb, sxb, a4, s4)
        a5, s5 = _row_step(how, tail, q, d, m, h, offset, o_5, b, x, dxb, sxb, a5, s5)
        a6, s6 = _row_step(how, tail, q, d, m, h, offset, o_6, b, x, dxb, sxb, a6, s6)
        a7, s7 = _row_step(how, tail, q, d, m, h, offset, o_7, b, x, dxb, sxb, a7, s7)
    y[r, o], y[r, o_1], y[r, o_2], y[r, o_3] = _y(a0, s0, tail), _y(a1, s1, tail), _y(a2, s2, tail), _y(a3, s3, tail)
    y[r, o_4], y[r, o_5], y[r, o_6], y[r, o_7] = _y(a4, s4, tail), _y(a5, s5, tail), _y(a6, s6, tail), _y(a7, s7, tail)


@njit(inline="always")
def _one_row(how, tail, qx, dx, sx, q, d, m, h, offset, y, r, o):
    """y[r, o] alone, the row four rows of T ahead asked for meanwhile: Q8_0's twice as many bytes a weight are
    read from memory at ~2× the speed of eight interleaved rows (a 576 × 49152 table, two threads: ~30 against
    ~16 GB/s), which stay faster on rows in the cache and on the 4-bit kinds."""
    a, s = fzero(), np.float32(0)
    for b in range(dx.shape[1]):
        prefetch(q[min(o + 4, q.shape[0] - 1), b])
        a, s = _row_step(how, tail, q, d, m, h, offset, o, b, bytes32(qx[r, b]), dx[r, b], sx[r, b], a, s)
    y[r, o] = _y(a, s, tail)


@njit(inline="always")
def _eight_xs(how, tail, qx, dx, sx, q, d, m, h, offset, y, o, r, r1):
    """y[r:r + 8, o] (rows past r1 − 1 repeat it)."""
    last = r1 - 1
    r_1, r_2, r_3 = min(r + 1, last), min(r + 2, last), min(r + 3, last)
    r_4, r_5, r_6, r_7 = min(r + 4, last), min(r + 5, last), min(r + 6, last), min(r + 7, last)
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = fzero()
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0)
    for b in range(dx.shape[1]):
        w = _weights(how, q, h, o, b, offset)
        a0, s0 = _step(how, tail, q, d, m, h, offset, o, b, w, bytes32(qx[r, b]), dx[r, b], sx[r, b], a0, s0)
        a1, s1 = _step(how, tail, q, d, m, h, offset, o, b, w, bytes32(qx[r_1, b]), dx[r_1, b], sx[r_1, b], a1, s1)
        a2, s2 = _step(how, tail, q, d, m, h, offset, o, b, w, bytes32(qx[r_2, b]), dx[r_2, b], sx[r_2, b], a2, s2)
        a3, s3 = _step(how, tail, q, d, m, h, offset, o, b, w, bytes32(qx[r_3, b]), dx[r_3, b], sx[r_3, b], a3, s3)
        a4, s4 = _step(how, tail, q, d, m, h, offset, o, b, w, bytes32(qx[r_4, b]), dx[r_4, b], sx[r_4, b], a4, s4)
        a5, s5 = _step(how, tail, q, d, m, h, offset, o, b, w, bytes32(qx[r_5, b]), dx[r_5, b], sx[r_5, b], a5, s5)
        a6, s6 = _step(how, tail, q, d, m, h, offset, o, b, w, bytes32(qx[r_6, b]), dx[r_6, b], sx[r_6, b], a6, s6)
        a7, s7 = _step(how, tail, q, d, m, h, offset, o, b, w, bytes32(qx[r_7, b]), dx[r_7, b], sx[r_7, b], a7, s7)
    y[r, o], y[r_1, o], y[r_2, o], y[r_3, o] = _y(a0, s0, tail), _y(a1, s1, tail), _y(a2, s2, tail), _y(a3, s3, tail)
    y[r_4, o], y[r_5, o], y[r_6, o], y[r_7, o] = _y(a4, s4, tail), _y(a5, s5, tail), _y(a6, s6, tail), _y(a7, s7, tail)


# A Q4_0 matrix llama.cpp repacks (llama_arith.repacked: rows a multiple of 8): each row's whole integer sum of a
# block S, then acc ← fma(fp32(d_w·d_x), fp32(S), acc) — eight rows of T (decoding) or eight rows of x (a prompt) in
# the lanes of one multiply-add a block, where the 8-lane order above needs eight.

@njit(inline="always")
def _packed_w(q, o, b):
    """Block b of row o of a Q4_0 T as its signed integers (nibble − 8)."""
    return bsub(nibbles32(q[o, b]), 8)


@njit(inline="always")
def _scales(d, o, o_1, o_2, o_3, o_4, o_5, o_6, o_7, b):
    """The float16 scales d[o_k, b] of eight rows as float32 lanes (one conversion where the CPU has F16C)."""
    if HALVES:
        return fhalves(d[o, b], d[o_1, b], d[o_2, b], d[o_3, b], d[o_4, b], d[o_5, b], d[o_6, b], d[o_7, b])
    return fvec(f16(d[o, b]), f16(d[o_1, b]), f16(d[o_2, b]), f16(d[o_3, b]),
                f16(d[o_4, b]), f16(d[o_5, b]), f16(d[o_6, b]), f16(d[o_7, b]))


@njit(inline="always")
def _packed_rows(qx, dx, sx, q, d, y, r, o, o1):
    """y[r, o:o + 8] of a repacked Q4_0 T (rows past o1 − 1 repeat it), the next eight rows asked for meanwhile. The
    nibbles multiply x unsigned (no sign trick) and the 8s come off the whole sums: Σ(q − 8)·x = Σq·x − 8·Σx, with
    Σx = SX[r, b] (`_quantize`'s SUMS_WHOLE) — the same integers."""
    last = o1 - 1
    o_1, o_2, o_3 = min(o + 1, last), min(o + 2, last), min(o + 3, last)
    o_4, o_5, o_6, o_7 = min(o + 4, last), min(o + 5, last), min(o + 6, last), min(o + 7, last)
    acc = fzero()
    for b in range(dx.shape[1]):
        for k in range(8):
            prefetch(q[min(o + 8 + k, q.shape[0] - 1), b])
        x = bytes32(qx[r, b])
        s = lrows(udot(nibbles32(q[o, b]), x), udot(nibbles32(q[o_1, b]), x), udot(nibbles32(q[o_2, b]), x),
                  udot(nibbles32(q[o_3, b]), x), udot(nibbles32(q[o_4, b]), x), udot(nibbles32(q[o_5, b]), x),
                  udot(nibbles32(q[o_6, b]), x), udot(nibbles32(q[o_7, b]), x))
        s = lsub(s, lsplat(8 * np.intp(sx[r, b])))
        acc = fmav(acc, fscale(_scales(d, o, o_1, o_2, o_3, o_4, o_5, o_6, o_7, b), dx[r, b]), s)
    y[r, o], y[r, o_1], y[r, o_2], y[r, o_3] = flane(acc, 0), flane(acc, 1), flane(acc, 2), flane(acc, 3)
    y[r, o_4], y[r, o_5], y[r, o_6], y[r, o_7] = flane(acc, 4), flane(acc, 5), flane(acc, 6), flane(acc, 7)


@njit(inline="always")
def _packed_xs(qx, dx, q, d, y, o, r, r1):
    """y[r:r + 8, o] of a repacked Q4_0 T (rows of x past r1 − 1 repeat it): row o's block unpacked once for eight."""
    last = r1 - 1
    r_1, r_2, r_3 = min(r + 1, last), min(r + 2, last), min(r + 3, last)
    r_4, r_5, r_6, r_7 = min(r + 4, last), min(r + 5, last), min(r + 6, last), min(r + 7, last)
    acc = fzero()
    for b in range(dx.shape[1]):
        w = _packed_w(q, o, b)
        s = lrows(dot(w, bytes32(qx[r, b])), dot(w, bytes32(qx[r_1, b])), dot(w, bytes32(qx[r_2, b])),
                  dot(w, bytes32(qx[r_3, b])), dot(w, bytes32(qx[r_4, b])), dot(w, bytes32(qx[r_5, b])),
                  dot(w, bytes32(qx[r_6, b])), dot(w, bytes32(qx[r_7, b])))
        scales = fvec(dx[r, b], dx[r_1, b], dx[r_2, b], dx[r_3, b], dx[r_4, b], dx[r_5, b], dx[r_6, b], dx[r_7, b])
        acc = fmav(acc, fscale(scales, f16(d[o, b])), s)
    y[r, o], y[r_1, o], y[r_2, o], y[r_3, o] = flane(acc, 0), flane(acc, 1), flane(acc, 2), flane(acc, 3)
    y[r_4, o], y[r_5, o], y[r_6, o], y[r_7, o] = flane(acc, 4), flane(acc, 5), flane(acc, 6), flane(acc, 7)


X_TILE = 16384                    # bytes of quantised rows of x a row kernel runs over each row of T with (in L1)


@njit(inline="always")
def _x_tile(d_in):
    """Rows of x a tile: as many as fill X_TILE bytes, at least 8."""
    return max(8, X_TILE // d_in)


def _rows_of(how, tail, offset):
    """The row kernel of a kind: HOW its blocks unpack, TAIL 1 for the Q8_1 kinds (weights w = d·q + m), OFFSET
    what its integers take off (Q4_0: 8, Q5_0: 16) — constants of the compiled code, its other branches dropped.
    A Q4_0 T whose rows are a multiple of 8 is multiplied in llama.cpp's repacked order (`_packed_rows`,
    `_packed_xs`)."""
    q4_0 = how == Q4 and not tail and offset == 8

    def rows(qx, dx, sx, q, d, m, h, y, o0, o1):
        """y[:, o0:o1] from the quantised rows (qx, dx, sx) and T's blocks (q; d, m: float16 bits of the scales and
        the Q8_1 kinds' minimums, m read when TAIL is 1; h: Q5's fifth bits) — llama_matvec's sums, in its order.
        Fewer than 8 rows of x: eight rows of T at a time; more: a tile of rows of x (held in L1) against each row of
        T, eight rows of x at a time. A last group of fewer than eight repeats its last row (the same number written
        again)."""
        R, nb = dx.shape
        if q4_0 and d.shape[0] % REPACK_ROWS == 0:        # llama.cpp's repacked Q4_0: eight rows in the lanes
            if R < 8:
                for r in range(R):
                    for o in range(o0, o1, 8):
                        _packed_rows(qx, dx, sx, q, d, y, r, o, o1)
                return
            tile = _x_tile(32 * nb)
            for r0 in range(0, R, tile):
                r1 = min(R, r0 + tile)
                for o in range(o0, o1):
                    for r in range(r0, r1, 8):
                        _packed_xs(qx, dx, q, d, y, o, r, r1)
            return
        if R < 8 and how == Q8_0:                         # decoding Q8_0: a row of T at a time, read as a stream
            for r in range(R):
                for o in range(o0, o1):
                    _one_row(how, tail, qx, dx, sx, q, d, m, h, offset, y, r, o)
            return
        if R < 8:                                         # decoding: each row of x against eight rows of T
            for r in range(R):
                for o in range(o0, o1, 8):
                    _eight_rows(how, tail, qx, dx, sx, q, d, m, h, offset, y, r, o, o1)
            return
        tile = _x_tile(32 * nb)
        for r0 in range(0, R, tile):                      # a tile of rows of x (in L1) against each row of T
            r1 = min(R, r0 + tile)
            for o in range(o0, o1):
                for r in range(r0, r1, 8):
                    _eight_xs(how, tail, qx, dx, sx, q, d, m, h, offset, y, o, r, r1)
    return njit(named(rows, f"rows32_{how}_{tail}_{offset}"))         # one name a kind (kernel_cache.named)


def _matvec_of(kind, how, tail, offset, at_m, at_h):
    """The entry of a 32-block KIND: `MATVEC[kind](x, *StoredMatrix.bits, y)`, its parts q, d (, m) (, h) — m at
    AT_M and h at AT_H of them (d's place when the kind has none: never read). It quantises x once (to Q8_1 when
    TAIL, else Q8_0; Q4_0 with the blocks' sums, for its repacked rows) and runs its row kernel over CHUNKS chunks
    of output rows, one per numba thread."""
    rows = _rows_of(how, tail, offset)
    sums = SUMS_Q8_1 if tail else SUMS_WHOLE if kind == "Q4_0" else 0

    def entry(x, *parts):
        q, d, m, h, y = parts[0], parts[1], parts[at_m], parts[at_h], parts[-1]
        qx, dx, sx = _quantize(x, sums)
        for c in prange(CHUNKS):
            o0, o1 = _chunk(d.shape[0], c)
            rows(qx, dx, sx, q, d, m, h, y, o0, o1)

    entry.__name__ = entry.__qualname__ = f"_mv_{kind.lower()}"        # kernel_cache's file of each entry

    def prep(x):
        return _quantize(x, sums)

    def part(x, p, bits, y, o0, o1):
        rows(p[0], p[1], p[2], bits[0], bits[1], bits[at_m], bits[at_h], y, o0, o1)

    ROWS[kind] = (njit(named(prep, f"prep_{kind.lower()}")), njit(named(part, f"part_{kind.lower()}")))
    return njit(parallel=True)(entry)


# MATVEC's products as parts a compiled caller runs in its own parallel loop (core.step_compiled), as
# stored_kernels.ROWS: ROWS[kind] = (prep, rows), prep(x) → x quantised, rows(x, prep(x), bits, y, o0, o1).
ROWS: dict = {}


_mv_q8_0 = _matvec_of("Q8_0", Q8_0, 0, 0, 1, 1)     # (x, q, d, y)
_mv_q4_0 = _matvec_of("Q4_0", Q4, 0, 8, 1, 1)       # (x, q, d, y)
_mv_q4_1 = _matvec_of("Q4_1", Q4, 1, 0, 2, 1)       # (x, q, d, m, y)
_mv_q5_0 = _matvec_of("Q5_0", Q5, 0, 16, 1, 2)      # (x, q, d, h, y)
_mv_q5_1 = _matvec_of("Q5_1", Q5, 1, 0, 2, 3)       # (x, q, d, m, h, y)


# ── the K-quants: super-blocks of 256 with Q8_K activations ──────────────────────────────

K4, K5, K6 = 0, 1, 2              # Q4_K, Q5_K, Q6_K: how a super-block's 256 weights are unpacked (`_k_chunk`)


@njit
def _quantize_k(x):
    """x (R, d_in) → q (R, nb, 256) int8, d (R, nb) float32, bsums (R, nb, 16) int32, as
    llama_arith.quantize_activations(x, "Q8_K") (quantize_row_q8_K_ref, ties to even)."""
    R, nb = x.shape[0], x.shape[1] // 256
    q = np.empty((R, nb, 256), np.int8)
    d = np.empty((R, nb), np.float32)
    bsums = np.zeros((R, nb, 16), np.int32)
    for r in range(R):
        for b in range(nb):
            xb = x[r, b * 256:b * 256 + 256]
            amax, m = np.float32(0), np.float32(0)
            for j in range(256):                          # the first largest |x|, its sign kept
                a = abs(xb[j])
                if a > amax:
                    amax, m = a, xb[j]
            iscale = np.float32(-127) / m if m != 0 else np.float32(0)
            d[r, b] = np.float32(1) / iscale if m != 0 else np.float32(0)
            for j in range(256):
                v = min(np.rint(xb[j] * iscale), np.float32(127))
                q[r, b, j] = np.int8(v)
                bsums[r, b, j // 16] += np.int32(np.int8(v))
    return q, d, bsums


@njit(inline="always")
def _k_chunk(how, qs, qh, o, b, c):
    """Weights 32c..32c + 31 of super-block b of row o of T as their unsigned integers (llama_simd.I8x32), as
    llama_arith.k_weight_integers orders them: Q4_K/Q5_K each 32 bytes of QS give 64 weights, low nibbles then high,
    Q5_K's weight 32c + l with bit c of qh[l] as its fifth; Q6_K (c = 4h + g) nibble g // 2 of QS's bytes
    64h + 32(g % 2) + l, and bits 2g, 2g + 1 of QH's byte 32h + l above them."""
    if how == K6:
        h, g = c // 4, c % 4
        low = field32(qs[o, b, 64 * h + 32 * (g % 2):], 4 * (g // 2), 15, 0)
        return bor(low, field32(qh[o, b, 32 * h:], 2 * g, 3, 4))
    w = field32(qs[o, b, 32 * (c // 2):], 4 * (c % 2), 15, 0)
    if how == K5:
        w = bor(w, field32(qh[o, b], c, 1, 4))
    return w


@njit(inline="always")
def _k_prefetch(how, qs, qh, sc, o, b):
    """Ask for super-block b of row o of T (its integers' bytes, high bits and scales) ahead of its use."""
    prefetch(qs[o, b])
    prefetch(qs[o, b, 64:])
    prefetch(qs[o, b, qs.shape[2] - 1:])
    prefetch(sc[o, b])
    if how != K4:
        prefetch(qh[o, b])


def _k_rows_of(how):
    """The row kernel of a K-quant (HOW, a constant of the compiled code)."""

    def rows(qx, dx, bsums, qs, qh, d, dmin, sc, mn, y, o0, o1):
        """y[:, o0:o1] from the Q8_K rows (qx, dx, bsums) and T's super-blocks (qs, qh: integers; d, dmin: float16
        bits; sc, mn: sub-block scales and mins, Q6_K's 16 int8 scales in sc) — llama_matvec's sums, in its order:
        per super-block the 8 integer lanes of llama_arith.k_lanes, each chunk of 32 times its scales (exact, int32),
        acc_k ← the fused multiply-add with fp32(d_x·d_w), and the mins as the definition adds them (a Q4_K T whose rows
        are a multiple of 8: llama.cpp's repacked order, the lanes and the mins each summed whole, two float chains; a
        prompt's whole fours of rows, as its gemm, a multiply-add each pair of sub-blocks)."""
        R, nb = dx.shape
        packed = how == K4 and d.shape[0] % REPACK_ROWS == 0   # llama.cpp's repacked Q4_K: whole sums, two chains
        tile = _x_tile(256 * nb)
        w = np.empty((nb if R > 1 else 0, 256), np.int8)  # several rows of x: row o's integers unpacked once
        for r0 in range(0, R, tile):                      # a tile of rows of x against every row of T
            for o in range(o0, o1):
                for b in range(w.shape[0]):
                    for c in range(8):
                        bstore(_k_chunk(how, qs, qh, o, b, c), w[b, 32 * c:])
                for r in range(r0, min(R, r0 + tile)):
                    acc, acc_m, summs = fzero(), fzero(), np.float32(0)
                    whole, less = np.float32(0), np.float32(0)
                    pairs = packed and r < R - R % GEMM_ROWS      # ggml's gemm rows: a multiply-add a pair
                    for b in range(nb):
                        if r == r0:                       # the next row of T's super-block asked for meanwhile
                            _k_prefetch(how, qs, qh, sc, min(o + 1, o1 - 1), b)
                        scale = dx[r, b] * f16(d[o, b])
                        lanes, pair = lzero(), lzero()
                        for c in range(8):                # lane k: positions 4k..4k+3 of each 32
                            x = bytes32(qx[r, b, 32 * c:])
                            if how == K6:
                                s0, s1 = np.int32(sc[o, b, 2 * c]), np.int32(sc[o, b, 2 * c + 1])
                            else:
                                s0 = s1 = np.int32(sc[o, b, c])
                            wc = _k_chunk(how, qs, qh, o, b, c) if R == 1 else bytes32(w[b, 32 * c:])
                            part = sdot(wc, x, s0, s1)
                            lanes = ladd(lanes, part)
                            if pairs:                     # sub-blocks c − 1, c: one multiply-add
                                pair = ladd(pair, part)
                                if c % 2 == 1:
                                    whole = fma1(scale, np.float32(lsum(pair)), whole)
                                    pair = lzero()
                        if how == K6:                     # the −32 through the sums of sub-blocks 2k, 2k+1
                            lanes = lsub(lanes, lscale(lpairsums(bsums[r, b], sc[o, b]), 32))
                            acc = fma8(acc, scale, lanes)         # |lane| < 2²⁶
                            continue
                        if packed:                        # Σ sc·Σ q·x and Σ m·S whole, as ggml's gemv
                            low = dx[r, b] * f16(dmin[o, b])
                            m_s = lmins(bsums[r, b], mn[o, b])          # lane i: m_i·S_i
                            if pairs:                                     # ggml's gemm: each pair of sub-blocks
                                m_pairs = lhalves(m_s)
                                for k in range(4):
                                    less = fma1(low, np.float32(llane(m_pairs, k)), less)
                            else:
                                whole = fma1(scale, np.float32(lsum(lanes)), whole)
                                less = fma1(low, np.float32(lsum(m_s)), less)
                            continue
                        acc = fma8(acc, scale, lanes)             # ≤ 31·127·4·63·8 < 2²³
                        dmin_b = -(dx[r, b] * f16(dmin[o, b]))    # float32
                        mins = lmins(bsums[r, b], mn[o, b])       # lane i: m_i·S_i
                        if how == K4:                             # 4 lanes: m_2k·S_2k + m_2k+1·S_2k+1
                            acc_m = fma8(acc_m, dmin_b, lhalves(mins))
                        else:                                     # fused, as gcc contracts it
                            summs = fma1(dmin_b, np.float32(lsum(mins)), summs)
                    if packed:
                        y[r, o] = whole - less
                        continue
                    v = hsum8(acc)
                    if how == K4:
                        v = v + hsum4(acc_m)                      # (a0+a2)+(a1+a3)
                    elif how == K5:
                        v = v + summs
                    y[r, o] = v
    return njit(named(rows, f"rows_k{how}"))                          # one name a kind (kernel_cache.named)


_rows_q4_k, _rows_q5_k, _rows_q6_k = _k_rows_of(K4), _k_rows_of(K5), _k_rows_of(K6)


@njit(parallel=True)
def _mv_q4_k(x, qs, d, dmin, sc, mn, y):
    qx, dx, bsums = _quantize_k(x)
    qh = np.zeros((1, 1, 1), np.uint8)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q4_k(qx, dx, bsums, qs, qh, d, dmin, sc, mn, y, o0, o1)


@njit(parallel=True)
def _mv_q5_k(x, qs, qh, d, dmin, sc, mn, y):
    qx, dx, bsums = _quantize_k(x)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q5_k(qx, dx, bsums, qs, qh, d, dmin, sc, mn, y, o0, o1)


@njit(parallel=True)
def _mv_q6_k(x, ql, qh, sc, d, y):
    qx, dx, bsums = _quantize_k(x)
    mn = np.zeros((1, 1, 1), np.uint8)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q6_k(qx, dx, bsums, ql, qh, d, d, sc, mn, y, o0, o1)


@njit
def _part_q4_k(x, p, bits, y, o0, o1):
    qs, d, dmin, sc, mn = bits
    _rows_q4_k(p[0], p[1], p[2], qs, np.zeros((1, 1, 1), np.uint8), d, dmin, sc, mn, y, o0, o1)


@njit
def _part_q5_k(x, p, bits, y, o0, o1):
    qs, qh, d, dmin, sc, mn = bits
    _rows_q5_k(p[0], p[1], p[2], qs, qh, d, dmin, sc, mn, y, o0, o1)


@njit
def _part_q6_k(x, p, bits, y, o0, o1):
    ql, qh, sc, d = bits
    _rows_q6_k(p[0], p[1], p[2], ql, qh, d, d, sc, np.zeros((1, 1, 1), np.uint8), y, o0, o1)


ROWS.update({"Q4_K": (_quantize_k, _part_q4_k), "Q5_K": (_quantize_k, _part_q5_k), "Q6_K": (_quantize_k, _part_q6_k)})

MATVEC = {"Q8_0": _mv_q8_0, "Q4_0": _mv_q4_0, "Q4_1": _mv_q4_1, "Q5_0": _mv_q5_0, "Q5_1": _mv_q5_1,
          "Q4_K": _mv_q4_k, "Q5_K": _mv_q5_k, "Q6_K": _mv_q6_k}

# What Python calls, kept on disk whole (their callees, stored_kernels' _chunk too, are compiled into them).
kernel_cache.keep(list(MATVEC.values()), [Path(__file__), Path(stored_kernels.__file__), Path(simd.__file__),
                                         Path(llama_simd.__file__), Path(llama_arith.__file__)])
