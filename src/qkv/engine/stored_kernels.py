"""The numba kernels of engine.stored (imported on first use: numba takes half a second to import).

One function per kind and task, each a loop over the blocks of a row with its own unpacking (numba
compiles each on first use, cached on disk). fastmath "reassoc" lets the inner sums run in SIMD lanes
(float32 sums in another order: within rounding of the plain order); NaN and infinity keep their meaning.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

FAST = {"reassoc", "contract"}
CHUNKS = 2                   # row chunks a product is split into, one per numba thread

# Each kernel: rows o0..o1 of T against every row of x. The products of a block are summed into lane
# arrays (never a sum per block: that horizontal add stops the SIMD loop), each scaled by its block's
# d; x and the bytes are read through per-block slices (LLVM then drops the index checks).

@njit(cache=True, fastmath=FAST)
def _rows_q8_0(x, q, d, y, o0, o1):
    nb = d.shape[1]
    lanes = np.zeros(32, np.float32)
    for r in range(x.shape[0]):
        for o in range(o0, o1):
            lanes[:] = 0
            qo = q[o]
            for b in range(nb):
                db, xb, qb = d[o, b], x[r, b * 32:b * 32 + 32], qo[b]
                for j in range(32):
                    lanes[j] += db * (xb[j] * np.float32(np.int32(qb[j])))
            y[r, o] = lanes.sum()

@njit(cache=True, fastmath=FAST)
def _rows_q4(xl, xh, sums, q, d, m, mscale, offset, y, o0, o1):
    """Q4_0 (mscale 0: no m, offset 8) and Q4_1 (mscale 1, offset 0): w = d·(q − offset) + m. xl, xh (R, nb, 16): each
    block's first and last 16 numbers of x, apart (the nibbles' order), contiguous."""
    nb = d.shape[1]
    lo, hi = np.zeros(16, np.float32), np.zeros(16, np.float32)
    for r in range(xl.shape[0]):
        for o in range(o0, o1):
            lo[:] = 0
            hi[:] = 0
            tail = np.float32(0)
            qo = q[o]
            for b in range(nb):
                db, qb, xlb, xhb = d[o, b], qo[b], xl[r, b], xh[r, b]
                for j in range(16):
                    v = np.int32(qb[j])
                    lo[j] += db * (xlb[j] * np.float32(v & 15))
                    hi[j] += db * (xhb[j] * np.float32(v >> 4))
                tail += (mscale * m[o, b] - db * offset) * sums[r, b]
            y[r, o] = lo.sum() + hi.sum() + tail

@njit(cache=True, fastmath=FAST)
def _rows_q5(xl, xh, sums, q, d, m, mscale, h, offset, y, o0, o1):
    """Q5_0 (mscale 0, offset 16) and Q5_1 (mscale 1, offset 0): w = d·(q − offset) + m, q = nibble | high bit · 16."""
    nb = d.shape[1]
    lo, hi = np.zeros(16, np.float32), np.zeros(16, np.float32)
    for r in range(xl.shape[0]):
        for o in range(o0, o1):
            lo[:] = 0
            hi[:] = 0
            tail = np.float32(0)
            qo = q[o]
            for b in range(nb):
                db, qb, xlb, xhb = d[o, b], qo[b], xl[r, b], xh[r, b]
                bits = np.int64(h[o, b])
                for j in range(16):
                    v = np.int32(qb[j])
                    a = (v & 15) | np.int32(((bits >> j) & 1) << 4)
                    c = (v >> 4) | np.int32(((bits >> (j + 16)) & 1) << 4)
                    lo[j] += db * (xlb[j] * np.float32(a))
                    hi[j] += db * (xhb[j] * np.float32(c))
                tail += (mscale * m[o, b] - db * offset) * sums[r, b]
            y[r, o] = lo.sum() + hi.sum() + tail

# The K-quants: blocks of 256 numbers. Q4_K/Q5_K: four runs of 32 bytes, each holding sub-blocks 2i (low
# nibbles) and 2i + 1 (high nibbles), w = d·scale·q − dmin·min, q's fifth bit (Q5_K) bit 2i or 2i + 1 of
# the 32 high-bit bytes. Q6_K: two halves of 128, each from 64 low-nibble bytes and 32 bytes of 2-bit
# pairs, w = d·scale·(q − 32) with a scale per 16 numbers.

@njit(cache=True, fastmath=FAST)
def _k_tail(sums, dmin, mn, r, o, b):
    """Σ over a K block's 8 sub-blocks of dmin·min·Σx: what the minimums take off."""
    mnb, sb = mn[o, b], sums[r, b * 8:b * 8 + 8]
    t = np.float32(0)
    for k in range(8):
        t += np.float32(mnb[k]) * sb[k]
    return dmin[o, b] * t

@njit(cache=True, fastmath=FAST)
def _rows_q4_k(x, sums, q, d, dmin, sc, mn, y, o0, o1):
    nb = d.shape[1]
    lanes = np.zeros(32, np.float32)
    for r in range(x.shape[0]):
        for o in range(o0, o1):
            lanes[:] = 0
            tail = np.float32(0)
            for b in range(nb):
                db, qb, scb = d[o, b], q[o, b], sc[o, b]
                for i in range(4):
                    s0, s1 = db * np.float32(scb[2 * i]), db * np.float32(scb[2 * i + 1])
                    at = b * 256 + 64 * i
                    x0, x1, qi = x[r, at:at + 32], x[r, at + 32:at + 64], qb[32 * i:32 * i + 32]
                    for j in range(32):
                        v = np.int32(qi[j])
                        lanes[j] += s0 * (x0[j] * np.float32(v & 15)) + s1 * (x1[j] * np.float32(v >> 4))
                tail -= _k_tail(sums, dmin, mn, r, o, b)
            y[r, o] = lanes.sum() + tail

@njit(cache=True, fastmath=FAST)
def _rows_q5_k(x, sums, q, qh, d, dmin, sc, mn, y, o0, o1):
    nb = d.shape[1]
    lanes = np.zeros(32, np.float32)
    for r in range(x.shape[0]):
        for o in range(o0, o1):
            lanes[:] = 0
            tail = np.float32(0)
            for b in range(nb):
                db, qb, hb, scb = d[o, b], q[o, b], qh[o, b], sc[o, b]
                for i in range(4):
                    s0, s1 = db * np.float32(scb[2 * i]), db * np.float32(scb[2 * i + 1])
                    at = b * 256 + 64 * i
                    x0, x1, qi = x[r, at:at + 32], x[r, at + 32:at + 64], qb[32 * i:32 * i + 32]
                    for j in range(32):
                        v, h = np.int32(qi[j]), np.int32(hb[j]) >> (2 * i)
                        lanes[j] += (s0 * (x0[j] * np.float32((v & 15) | ((h & 1) << 4)))
                                     + s1 * (x1[j] * np.float32((v >> 4) | ((h & 2) << 3))))
                tail -= _k_tail(sums, dmin, mn, r, o, b)
            y[r, o] = lanes.sum() + tail

@njit(cache=True, fastmath=FAST)
def _rows_q6_k(x, ql, qh, sc, d, y, o0, o1):
    nb = d.shape[1]
    lanes = np.zeros(16, np.float32)
    for r in range(x.shape[0]):
        for o in range(o0, o1):
            lanes[:] = 0
            for b in range(nb):
                db, lb, hb, scb = d[o, b], ql[o, b], qh[o, b], sc[o, b]
                for n in range(2):
                    for half in range(2):
                        k = 8 * n + half
                        s1, s2 = db * np.float32(scb[k]), db * np.float32(scb[k + 2])
                        s3, s4 = db * np.float32(scb[k + 4]), db * np.float32(scb[k + 6])
                        at, l0 = b * 256 + 128 * n + 16 * half, 64 * n + 16 * half
                        xa, xb = x[r, at:at + 16], x[r, at + 32:at + 48]
                        xc, xd = x[r, at + 64:at + 80], x[r, at + 96:at + 112]
                        la, lc = lb[l0:l0 + 16], lb[l0 + 32:l0 + 48]
                        hh = hb[32 * n + 16 * half:32 * n + 16 * half + 16]
                        for j in range(16):
                            a, c, h = np.int32(la[j]), np.int32(lc[j]), np.int32(hh[j])
                            lanes[j] += (s1 * (xa[j] * np.float32(((a & 15) | ((h & 3) << 4)) - 32))
                                         + s2 * (xb[j] * np.float32(((c & 15) | ((h & 12) << 2)) - 32))
                                         + s3 * (xc[j] * np.float32(((a >> 4) | (h & 48)) - 32))
                                         + s4 * (xd[j] * np.float32(((c >> 4) | ((h & 192) >> 2)) - 32)))
            y[r, o] = lanes.sum()

# 16-bit floats: each weight's bits moved into a float32's (bfloat16: the top half; float16: exponent and
# mantissa shifted into place with the sign, then × 2^112, which rebias the exponent and is exact for
# subnormals too) and reinterpreted in a register (`_as_float32`, an LLVM bitcast), so the loop streams
# the 16-bit words once and vectorises (~45 GB/s of bfloat16 from memory here, against ~14 through a buffer).

@intrinsic
def _as_float32(typingctx, bits):
    """The float32 whose bits are the uint32 BITS (no conversion: a bitcast)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen

@njit(cache=True, inline="always")
def _half(h, bf16):
    if bf16:
        return _as_float32(np.uint32(h) << 16)
    v = np.uint32(h)
    return _as_float32(((v & np.uint32(0x7FFF)) << 13) | ((v & np.uint32(0x8000)) << 16)) * np.float32(5.192296858534828e33)

@njit(cache=True, fastmath=FAST)
def _rows_half(x, u, bf16, y, o0, o1):
    """y[r, o] = Σ_k half(T[o, k])·x[r, k] as a plain reduction: "reassoc" lets LLVM keep several SIMD
    accumulators in registers (explicit lanes held in an array went through memory each step: a third of the speed)."""
    for o in range(o0, o1):                              # each row of T read from memory once, for every row of x
        uo = u[o]
        for r in range(x.shape[0]):
            xr = x[r]
            s = np.float32(0)
            for k in range(xr.shape[0]):
                s += _half(uo[k], bf16) * xr[k]
            y[r, o] = s

# The products: each an njit entry taking x (R, d_in) float32 C-ordered, the matrix's parts and y (R, d_out),
# which prepares what its kernel reads (block sums, split halves) and runs it over CHUNKS chunks of output
# rows, one per numba thread: one call from Python a product (a call's cost, ~8 µs in NumPy steps before,
# was a fifth of a small matrix's product).

@njit(cache=True)
def _sums(x):
    """Σ x over each block of 32: (R, d_in / 32)."""
    R, nb = x.shape[0], x.shape[1] // 32
    out = np.empty((R, nb), np.float32)
    for r in range(R):
        for b in range(nb):
            s = np.float32(0)
            for j in range(32):
                s += x[r, b * 32 + j]
            out[r, b] = s
    return out

@njit(cache=True)
def _split(x):
    """x (R, d_in) → each block's first and last 16 numbers apart and contiguous (the nibbles' order):
    2 × (R, nb, 16)."""
    R, nb = x.shape[0], x.shape[1] // 32
    xl, xh = np.empty((R, nb, 16), np.float32), np.empty((R, nb, 16), np.float32)
    for r in range(R):
        for b in range(nb):
            for j in range(16):
                xl[r, b, j] = x[r, b * 32 + j]
                xh[r, b, j] = x[r, b * 32 + 16 + j]
    return xl, xh

@njit(parallel=True, cache=True)
def _par_half(x, u, bf16, y):
    out = u.shape[0]
    step = (out + CHUNKS - 1) // CHUNKS
    for c in prange(CHUNKS):
        _rows_half(x, u, bf16, y, c * step, min(out, (c + 1) * step))

@njit(parallel=True, cache=True)
def _par_q8_0(x, q, d, y):
    out = d.shape[0]
    step = (out + CHUNKS - 1) // CHUNKS
    for c in prange(CHUNKS):
        _rows_q8_0(x, q, d, y, c * step, min(out, (c + 1) * step))

@njit(parallel=True, cache=True)
def _par_q4(xl, xh, sums, q, d, m, mscale, offset, y):
    out = d.shape[0]
    step = (out + CHUNKS - 1) // CHUNKS
    for c in prange(CHUNKS):
        _rows_q4(xl, xh, sums, q, d, m, mscale, offset, y, c * step, min(out, (c + 1) * step))

@njit(parallel=True, cache=True)
def _par_q5(xl, xh, sums, q, d, m, mscale, h, offset, y):
    out = d.shape[0]
    step = (out + CHUNKS - 1) // CHUNKS
    for c in prange(CHUNKS):
        _rows_q5(xl, xh, sums, q, d, m, mscale, h, offset, y, c * step, min(out, (c + 1) * step))

@njit(parallel=True, cache=True)
def _par_q4_k(x, sums, q, d, dmin, sc, mn, y):
    out = d.shape[0]
    step = (out + CHUNKS - 1) // CHUNKS
    for c in prange(CHUNKS):
        _rows_q4_k(x, sums, q, d, dmin, sc, mn, y, c * step, min(out, (c + 1) * step))

@njit(parallel=True, cache=True)
def _par_q5_k(x, sums, q, qh, d, dmin, sc, mn, y):
    out = d.shape[0]
    step = (out + CHUNKS - 1) // CHUNKS
    for c in prange(CHUNKS):
        _rows_q5_k(x, sums, q, qh, d, dmin, sc, mn, y, c * step, min(out, (c + 1) * step))

@njit(parallel=True, cache=True)
def _par_q6_k(x, ql, qh, sc, d, y):
    out = d.shape[0]
    step = (out + CHUNKS - 1) // CHUNKS
    for c in prange(CHUNKS):
        _rows_q6_k(x, ql, qh, sc, d, y, c * step, min(out, (c + 1) * step))

@njit(cache=True)
def _mv_f16(x, u, y):
    _par_half(x, u, False, y)

@njit(cache=True)
def _mv_bf16(x, u, y):
    _par_half(x, u, True, y)

@njit(cache=True)
def _mv_q8_0(x, q, d, y):
    _par_q8_0(x, q, d, y)

@njit(cache=True)
def _mv_q4_0(x, q, d, y):
    xl, xh = _split(x)
    _par_q4(xl, xh, _sums(x), q, d, d, np.float32(0), np.float32(8), y)

@njit(cache=True)
def _mv_q4_1(x, q, d, m, y):
    xl, xh = _split(x)
    _par_q4(xl, xh, _sums(x), q, d, m, np.float32(1), np.float32(0), y)

@njit(cache=True)
def _mv_q5_0(x, q, d, h, y):
    xl, xh = _split(x)
    _par_q5(xl, xh, _sums(x), q, d, d, np.float32(0), h, np.float32(16), y)

@njit(cache=True)
def _mv_q5_1(x, q, d, m, h, y):
    xl, xh = _split(x)
    _par_q5(xl, xh, _sums(x), q, d, m, np.float32(1), h, np.float32(0), y)

@njit(cache=True)
def _mv_q4_k(x, q, d, dmin, sc, mn, y):
    _par_q4_k(x, _sums(x), q, d, dmin, sc, mn, y)

@njit(cache=True)
def _mv_q5_k(x, q, qh, d, dmin, sc, mn, y):
    _par_q5_k(x, _sums(x), q, qh, d, dmin, sc, mn, y)

@njit(cache=True)
def _mv_q6_k(x, ql, qh, sc, d, y):
    _par_q6_k(x, ql, qh, sc, d, y)

@njit(cache=True)
def _dq_rows_q8_0(q, d, out, o0, o1):
    nb = d.shape[1]
    for o in range(o0, o1):
        qo, row = q[o], out[o]
        for b in range(nb):
            db, qb, ob = d[o, b], qo[b], row[b * 32:b * 32 + 32]
            for j in range(32):
                ob[j] = db * np.float32(np.int32(qb[j]))


@njit(cache=True)
def _dq_rows_q4(q, d, m, offset, out, o0, o1):
    """w = d·(q − offset) + m (Q4_0: m zeros, offset 8; Q4_1: offset 0)."""
    nb = d.shape[1]
    for o in range(o0, o1):
        qo, row = q[o], out[o]
        for b in range(nb):
            db, mb, qb, ob = d[o, b], m[o, b] - d[o, b] * offset, qo[b], row[b * 32:b * 32 + 32]
            for j in range(16):
                v = np.int32(qb[j])
                ob[j] = db * np.float32(v & 15) + mb
                ob[16 + j] = db * np.float32(v >> 4) + mb


@njit(cache=True)
def _dq_rows_q5(q, d, m, h, offset, out, o0, o1):
    """w = d·(q − offset) + m, q = nibble | high bit · 16 (Q5_0: m zeros, offset 16; Q5_1: offset 0)."""
    nb = d.shape[1]
    for o in range(o0, o1):
        qo, row = q[o], out[o]
        for b in range(nb):
            db, mb, qb, ob = d[o, b], m[o, b] - d[o, b] * offset, qo[b], row[b * 32:b * 32 + 32]
            bits = np.int64(h[o, b])
            for j in range(16):
                v = np.int32(qb[j])
                ob[j] = db * np.float32((v & 15) | np.int32(((bits >> j) & 1) << 4)) + mb
                ob[16 + j] = db * np.float32((v >> 4) | np.int32(((bits >> (j + 16)) & 1) << 4)) + mb


@njit(cache=True)
def _dq_rows_q45_k(q, qh, d, dmin, sc, mn, five, out, o0, o1):
    nb = d.shape[1]
    for o in range(o0, o1):
        row = out[o]
        for b in range(nb):
            qb = q[o, b]
            for i in range(4):
                s0, s1 = d[o, b] * np.float32(sc[o, b, 2 * i]), d[o, b] * np.float32(sc[o, b, 2 * i + 1])
                m0, m1 = dmin[o, b] * np.float32(mn[o, b, 2 * i]), dmin[o, b] * np.float32(mn[o, b, 2 * i + 1])
                at = b * 256 + 64 * i
                for j in range(32):
                    v = np.int32(qb[32 * i + j])
                    lo, hi = v & 15, v >> 4
                    if five:
                        h = np.int32(qh[o, b, j]) >> (2 * i)
                        lo, hi = lo | ((h & 1) << 4), hi | ((h & 2) << 3)
                    row[at + j] = s0 * np.float32(lo) - m0
                    row[at + 32 + j] = s1 * np.float32(hi) - m1


@njit(cache=True)
def _dq_rows_q6_k(ql, qh, sc, d, out, o0, o1):
    nb = d.shape[1]
    for o in range(o0, o1):
        row = out[o]
        for b in range(nb):
            for n in range(2):
                for l in range(32):
                    k = 8 * n + l // 16
                    a, c = np.int32(ql[o, b, 64 * n + l]), np.int32(ql[o, b, 64 * n + l + 32])
                    h = np.int32(qh[o, b, 32 * n + l])
                    at = b * 256 + 128 * n + l
                    row[at] = d[o, b] * np.float32(sc[o, b, k]) * np.float32(((a & 15) | ((h & 3) << 4)) - 32)
                    row[at + 32] = d[o, b] * np.float32(sc[o, b, k + 2]) * np.float32(((c & 15) | ((h & 12) << 2)) - 32)
                    row[at + 64] = d[o, b] * np.float32(sc[o, b, k + 4]) * np.float32(((a >> 4) | (h & 48)) - 32)
                    row[at + 96] = d[o, b] * np.float32(sc[o, b, k + 6]) * np.float32(((c >> 4) | ((h & 192) >> 2)) - 32)


# Dequantising feeds BLAS (the many-row path): one thread, so that numba's workers never wait on
# OpenBLAS's spinning ones between a tile and its product (two pools on two cores: 10× slower here).

@njit(cache=True, fastmath=FAST)
def _dq_half(u, bf16, out):
    """16-bit floats (rows, d_in) → float32 OUT, exactly (~4× NumPy's casting shift, which was a third of a
    bfloat16 prompt's time)."""
    for o in range(u.shape[0]):
        uo, row = u[o], out[o]
        for k in range(uo.shape[0]):
            row[k] = _half(uo[k], bf16)


def _dq_f16(u, out):
    _dq_half(u, False, out)


def _dq_bf16(u, out):
    _dq_half(u, True, out)


def _dq_q8_0(q, d, out):
    _dq_rows_q8_0(q, d, out, 0, d.shape[0])


def _dq_q4_0(q, d, out):
    _dq_rows_q4(q, d, np.zeros_like(d), np.float32(8), out, 0, d.shape[0])


def _dq_q4_1(q, d, m, out):
    _dq_rows_q4(q, d, m, np.float32(0), out, 0, d.shape[0])


def _dq_q5_0(q, d, h, out):
    _dq_rows_q5(q, d, np.zeros_like(d), h, np.float32(16), out, 0, d.shape[0])


def _dq_q5_1(q, d, m, h, out):
    _dq_rows_q5(q, d, m, h, np.float32(0), out, 0, d.shape[0])


def _dq_q4_k(q, d, dmin, sc, mn, out):
    _dq_rows_q45_k(q, q, d, dmin, sc, mn, False, out, 0, d.shape[0])


def _dq_q5_k(q, qh, d, dmin, sc, mn, out):
    _dq_rows_q45_k(q, qh, d, dmin, sc, mn, True, out, 0, d.shape[0])


def _dq_q6_k(ql, qh, sc, d, out):
    _dq_rows_q6_k(ql, qh, sc, d, out, 0, d.shape[0])


MATVEC = {"Q8_0": _mv_q8_0, "Q4_0": _mv_q4_0, "Q4_1": _mv_q4_1, "Q5_0": _mv_q5_0, "Q5_1": _mv_q5_1,
          "Q4_K": _mv_q4_k, "Q5_K": _mv_q5_k, "Q6_K": _mv_q6_k, "F16": _mv_f16, "BF16": _mv_bf16}
DEQUANT = {"Q8_0": _dq_q8_0, "Q4_0": _dq_q4_0, "Q4_1": _dq_q4_1, "Q5_0": _dq_q5_0, "Q5_1": _dq_q5_1,
           "Q4_K": _dq_q4_k, "Q5_K": _dq_q5_k, "Q6_K": _dq_q6_k, "F16": _dq_f16, "BF16": _dq_bf16}
