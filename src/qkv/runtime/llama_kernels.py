"""The numba kernels of llama.cpp's arithmetic (runtime.llama_arith): y = x @ W for W of a kind with a product
there (Q4_0, Q5_0, Q8_0, Q4_1, Q5_1; the K-quants Q4_K, Q5_K, Q6_K), bit for bit the definition
`llama_arith.llama_matvec` (tests/test_llama_kernels.py), compiled.

One entry per kind, called as the exact kernels are (`stored_kernels.MATVEC`): `MATVEC[kind](x, *bits, y)`,
x (R, d_in) float32 C-ordered, any R, BITS a StoredMatrix's parts with its float16 scales as their uint16 bits
(`StoredMatrix.bits`, widened exactly by `stored_kernels.f16`). Each entry

    1. quantises x once (`_quantize`, all R rows): per block of 32, amax, d_32 = amax/127, q = rint(x·(127/amax))
       (ties to even), d = fp16(d_32), and for the Q8_1 kinds s = fp16(d_32·Σq) — float16 rounding done by
       frexp/ldexp in float64 (`_fp16`, ties to even, subnormals and overflow as float16's);
    2. runs its row kernel (`_rows_of`) over CHUNKS chunks of output rows, one per numba thread: each row o of T
       unpacked once to integers, then for each row r of x and block b the 8 lanes of 4 integer products (exact),
       acc_k ← fp32(fp64(fp32(d_w·d_x))·lane_k + acc_k) (the definition's fused multiply-add), and at the end of
       the row ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) (+ Σ_b fp32(m_w·s_x), summed in block order).

The K-quants (`_quantize_k`, `_k_rows_of`): x quantised once to Q8_K (per 256: the first largest |x| m,
iscale = −127/m, q = min(127, rint(x·iscale)), d = 1/iscale, the 16 sums of 16), each row of T unpacked once to
its unsigned integers, sub-block scales and mins, then per super-block the 8 integer lanes of llama_arith.k_lanes
(exact, int64), acc_k ← the fused multiply-add with fp32(d_x·d_w), and the mins as the definition adds them
(Q4_K: 4 lanes, (a0+a2)+(a1+a3); Q5_K: one float32 sum of fused multiply-adds).

No fastmath: every float operation is the definition's, in its order (a reassociated sum would not be
bit-equal). Not fast yet: the lanes are scalar code, ~1.2 G weights/s on one thread here against the exact
kernels' ~13 (1536 × 576, Q4_1 or Q8_0, one row of x; 2-core AMD EPYC, AVX2, a busy machine); integer SIMD is
the next step (issue 49). Kept on disk by `kernel_cache` as the exact kernels are (each entry whole, its
parallel loop its own, checked when read back; never numba's own cache).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from numba import njit, prange

from . import kernel_cache, simd, stored_kernels
from .stored_kernels import CHUNKS, _chunk, f16

Q8_0, Q4, Q5 = 0, 1, 2            # how a block's 32 weights are unpacked (`_unpack`)


@njit
def _fp16(v):
    """float32 V → the nearest float16 (ties to even) → float32, as NumPy's astype(float16) rounds."""
    m, e = math.frexp(np.float64(v))                      # v = m·2^e, 0.5 ≤ |m| < 1
    step = max(e - 11, -24)                               # 11 significant bits; float16's subnormals: steps of 2⁻²⁴
    r = math.ldexp(np.rint(math.ldexp(m, e - step)), step)   # exact scalings, one rounding
    if abs(r) > 65504.0:                                  # past float16's largest: infinity
        r = math.copysign(np.inf, r)
    return np.float32(r)


@njit
def _quantize(x, sums):
    """x (R, d_in) → q (R, nb, 32) int8, d (R, nb) float32, s (R, nb) float32 (SUMS: Q8_1's s; else zeros), as
    llama_arith.quantize_activations(x, "Q8_0" / "Q8_1")."""
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
            if sums:
                s[r, b] = _fp16(d32 * np.float32(total))
    return q, d, s


@njit(inline="always")
def _unpack(how, q, h, o, offset, w):
    """Row o of T as its integers into W (nb, 32) int32: Q8_0's int8; a Q4's nibbles (byte j of a block: weight j
    low, 16 + j high) − OFFSET; a Q5's with bit j of h[o, b] as weight j's fifth bit, − OFFSET."""
    for b in range(w.shape[0]):
        if how == Q8_0:
            for j in range(32):
                w[b, j] = np.int32(q[o, b, j])
            continue
        bits = np.int64(h[o, b]) if how == Q5 else np.int64(0)
        for j in range(16):
            v = np.int32(q[o, b, j])
            w[b, j] = ((v & 15) | np.int32(((bits >> j) & 1) << 4)) - offset
            w[b, 16 + j] = ((v >> 4) | np.int32(((bits >> (j + 16)) & 1) << 4)) - offset


@njit(inline="always")
def _lane(wb, xb, at, scale, acc):
    """One lane's step: acc ← fp32(scale·Σ_{j<4} w[at + j]·x[at + j] + acc), the four products exact integers and
    scale·lane exact in float64 (24 + 17 bits): the definition's fused multiply-add (llama_arith._fma32)."""
    lane = (wb[at] * np.int32(xb[at]) + wb[at + 1] * np.int32(xb[at + 1])
            + wb[at + 2] * np.int32(xb[at + 2]) + wb[at + 3] * np.int32(xb[at + 3]))
    return np.float32(scale * np.float64(lane) + np.float64(acc))


def _rows_of(how):
    """The row kernel of a way of unpacking (HOW, a constant of the compiled code: its other branches dropped)."""

    @njit
    def rows(qx, dx, sx, q, d, m, h, offset, tail, y, o0, o1):
        """y[:, o0:o1] from the quantised rows (qx, dx, sx) and T's blocks (q; d, m: float16 bits of the scales and
        the Q8_1 kinds' minimums, m read when TAIL is 1; h: Q5's fifth bits) — llama_matvec's sums, in its order:
        each row of T unpacked once, then each row of x against it, its 8 lanes held in registers."""
        R, nb = dx.shape
        w = np.empty((nb, 32), np.int32)                  # (nb, 32) row o's integers
        dw = np.empty(nb, np.float32)                     # (nb,) its scales
        mw = np.zeros(nb, np.float32)                     # (nb,) its minimums (Q8_1 kinds)
        for o in range(o0, o1):
            _unpack(how, q, h, o, offset, w)
            for b in range(nb):
                dw[b] = f16(d[o, b])
                if tail:
                    mw[b] = f16(m[o, b])
            for r in range(R):
                a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = summs = np.float32(0)
                for b in range(nb):
                    wb, xb = w[b], qx[r, b]
                    scale = np.float64(dw[b] * dx[r, b])  # fp32(d_w·d_x), then exactly in float64
                    a0, a1 = _lane(wb, xb, 0, scale, a0), _lane(wb, xb, 4, scale, a1)
                    a2, a3 = _lane(wb, xb, 8, scale, a2), _lane(wb, xb, 12, scale, a3)
                    a4, a5 = _lane(wb, xb, 16, scale, a4), _lane(wb, xb, 20, scale, a5)
                    a6, a7 = _lane(wb, xb, 24, scale, a6), _lane(wb, xb, 28, scale, a7)
                    if tail:
                        summs = summs + mw[b] * sx[r, b]
                s = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))   # ggml's hsum_float_8
                y[r, o] = s + summs if tail else s
    return rows


_rows_q8_0, _rows_q4, _rows_q5 = _rows_of(Q8_0), _rows_of(Q4), _rows_of(Q5)


@njit(parallel=True)
def _mv_q8_0(x, q, d, y):
    qx, dx, sx = _quantize(x, 0)
    h = np.zeros((1, 1), np.uint32)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q8_0(qx, dx, sx, q, d, d, h, np.int32(0), 0, y, o0, o1)


@njit(parallel=True)
def _mv_q4_0(x, q, d, y):
    qx, dx, sx = _quantize(x, 0)
    h = np.zeros((1, 1), np.uint32)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q4(qx, dx, sx, q, d, d, h, np.int32(8), 0, y, o0, o1)


@njit(parallel=True)
def _mv_q4_1(x, q, d, m, y):
    qx, dx, sx = _quantize(x, 1)
    h = np.zeros((1, 1), np.uint32)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q4(qx, dx, sx, q, d, m, h, np.int32(0), 1, y, o0, o1)


@njit(parallel=True)
def _mv_q5_0(x, q, d, h, y):
    qx, dx, sx = _quantize(x, 0)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q5(qx, dx, sx, q, d, d, h, np.int32(16), 0, y, o0, o1)


@njit(parallel=True)
def _mv_q5_1(x, q, d, m, h, y):
    qx, dx, sx = _quantize(x, 1)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q5(qx, dx, sx, q, d, m, h, np.int32(0), 1, y, o0, o1)


# ── the K-quants: super-blocks of 256 with Q8_K activations ──────────────────────────────

K4, K5, K6 = 0, 1, 2              # Q4_K, Q5_K, Q6_K: how a super-block's 256 weights are unpacked (`_unpack_k`)


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
def _unpack_k(how, qs, qh, o, b, w):
    """Super-block b of row o of T as its 256 unsigned integers into W (256,) int32, in weight order (as
    llama_arith.k_weight_integers): Q4_K/Q5_K each 32 bytes of QS give 64 weights, low nibbles then high, Q5_K's
    weight 32i + l with bit i of qh[l] as its fifth; Q6_K QS the low nibbles, QH the pairs of high bits."""
    if how == K6:
        for h in range(2):
            for l in range(32):
                b0, b1 = np.int32(qs[o, b, 64 * h + l]), np.int32(qs[o, b, 64 * h + 32 + l])
                hb = np.int32(qh[o, b, 32 * h + l])
                w[128 * h + l] = (b0 & 15) | ((hb & 3) << 4)
                w[128 * h + 32 + l] = (b1 & 15) | (((hb >> 2) & 3) << 4)
                w[128 * h + 64 + l] = (b0 >> 4) | (((hb >> 4) & 3) << 4)
                w[128 * h + 96 + l] = (b1 >> 4) | (((hb >> 6) & 3) << 4)
        return
    for j in range(4):
        for l in range(32):
            v = np.int32(qs[o, b, 32 * j + l])
            w[64 * j + l] = v & 15
            w[64 * j + 32 + l] = v >> 4
    if how == K5:
        for l in range(32):
            bits = np.int32(qh[o, b, l])
            for i in range(8):
                w[32 * i + l] |= ((bits >> i) & 1) << 4


def _k_rows_of(how):
    """The row kernel of a K-quant (HOW, a constant of the compiled code)."""

    @njit
    def rows(qx, dx, bsums, qs, qh, d, dmin, sc, mn, y, o0, o1):
        """y[:, o0:o1] from the Q8_K rows (qx, dx, bsums) and T's super-blocks (qs, qh: integers; d, dmin: float16
        bits; sc, mn: sub-block scales and mins, Q6_K's 16 int8 scales in sc) — llama_matvec's sums, in its order."""
        R, nb = dx.shape
        w = np.empty((nb, 256), np.int32)                 # row o's integers
        scales = np.empty((nb, 16), np.int64)             # its sub-blocks' scales (8 or 16)
        mins = np.zeros((nb, 8), np.int64)                # Q4_K, Q5_K: its mins
        dw = np.empty(nb, np.float32)
        dm = np.zeros(nb, np.float32)
        lanes = np.empty(8, np.int64)
        for o in range(o0, o1):
            for b in range(nb):
                _unpack_k(how, qs, qh, o, b, w[b])
                dw[b] = f16(d[o, b])
                for s in range(sc.shape[2]):
                    scales[b, s] = np.int64(sc[o, b, s])
                if how != K6:
                    dm[b] = f16(dmin[o, b])
                    for s in range(8):
                        mins[b, s] = np.int64(mn[o, b, s])
            for r in range(R):
                acc = np.zeros(8, np.float32)
                acc_m = np.zeros(4, np.float32)
                summs = np.float32(0)
                for b in range(nb):
                    for k in range(8):                    # lane k: positions 4k..4k+3 of each 32
                        total = np.int64(0)
                        for c in range(8):
                            at = 32 * c + 4 * k
                            four = np.int64(0)
                            for i in range(4):
                                four += np.int64(w[b, at + i]) * np.int64(qx[r, b, at + i])
                            s = scales[b, 2 * c + k // 4] if how == K6 else scales[b, c]
                            total += s * four
                        if how == K6:                     # the −32 through the sums of sub-blocks 2k, 2k+1
                            total -= 32 * (np.int64(bsums[r, b, 2 * k]) * scales[b, 2 * k]
                                           + np.int64(bsums[r, b, 2 * k + 1]) * scales[b, 2 * k + 1])
                        lanes[k] = total
                    scale = np.float64(dx[r, b] * dw[b])  # fp32(d_x·d_w), then exactly in float64
                    for k in range(8):
                        acc[k] = np.float32(scale * np.float64(np.float32(lanes[k])) + np.float64(acc[k]))
                    if how == K6:
                        continue
                    dmin_b = -(dx[r, b] * dm[b])          # float32
                    if how == K4:
                        for k in range(4):
                            pair = (mins[b, 2 * k] * (bsums[r, b, 4 * k] + bsums[r, b, 4 * k + 1])
                                    + mins[b, 2 * k + 1] * (bsums[r, b, 4 * k + 2] + bsums[r, b, 4 * k + 3]))
                            acc_m[k] = np.float32(np.float64(dmin_b) * np.float64(np.float32(pair))
                                                  + np.float64(acc_m[k]))
                    else:
                        total = np.int64(0)
                        for s in range(8):
                            total += mins[b, s] * (bsums[r, b, 2 * s] + bsums[r, b, 2 * s + 1])
                        summs = np.float32(np.float64(dmin_b) * np.float64(np.float32(total))   # fused, as
                                           + np.float64(summs))                             # gcc contracts it
                v = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
                if how == K4:
                    v = v + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
                elif how == K5:
                    v = v + summs
                y[r, o] = v
    return rows


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


MATVEC = {"Q8_0": _mv_q8_0, "Q4_0": _mv_q4_0, "Q4_1": _mv_q4_1, "Q5_0": _mv_q5_0, "Q5_1": _mv_q5_1,
          "Q4_K": _mv_q4_k, "Q5_K": _mv_q5_k, "Q6_K": _mv_q6_k}

# What Python calls, kept on disk whole (their callees, stored_kernels' _chunk too, are compiled into them).
kernel_cache.keep(list(MATVEC.values()), [Path(__file__), Path(stored_kernels.__file__), Path(simd.__file__)])
