"""The numba kernels of runtime.stored (imported on first use: numba takes half a second to import).

The few-row products (decoding): each row of T against each row of x, a block's products summed in
sixteen float32 lanes held in registers (`simd.f32x16`, type F32x16: an LLVM vector, lowered to the machine's AVX2,
AVX-512 or NEON), the lanes summed once at the end of the row. A block's bytes are converted to floats
exactly (small integers; its float16 scales, read as bits from the file's blocks, by `f16`) and
multiplied by x in float32: activations are never quantised. One function
per kind and task, compiled on first use and kept on disk by `kernel_cache` (only the entries Python calls,
each whole: numba's own cache could save an entry that crashed the next process). fastmath "reassoc" lets the sums run in SIMD
lanes (float32 sums in another order: within rounding of the plain order); NaN and infinity keep their
meaning.

Measured (2048 × 1536 random blocks, one row of x, one thread; AMD EPYC, Zen, AVX2, 2 GHz), G weights/s:
                    Q8_0  Q4_0  Q4_1  Q5_0  Q5_1  Q4_K  Q5_K  Q6_K
    lanes in registers  5.5   4.7   4.6   2.3   2.3   3.1   1.8   2.0
    (two threads, the lanes kept in an array as before: 7.3, 3.1, 4.4, 1.8, 1.8, 2.5, 1.6, 1.5)
Four rows of T at a time, sharing the loads of x, was slower for every kind (registers spill).
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import llvmlite.binding as ll
from llvmlite import ir
from numba import config, njit, prange, types
from numba.core.extending import intrinsic

from . import kernel_cache, simd
from .simd import as_float32, bits32, field, int8s, vadd, vfma, vload, vmul, vsplat, vsum, vzero

FAST = {"reassoc", "contract"}
CHUNKS = 2                   # row chunks a product is split into, one per numba thread


# A block's float16 scales are read as their bits from the file's blocks and widened where they are used:
# by the CPU's own conversion (x86's F16C, ARM's FCVT: LLVM's fpext from half), else by moving the bits.
# Measured (SmolLM2's 121 products of a decoding step, one thread, the best of 60 each): 10.2–10.4 ms, as
# with float32 copies of the scales (10.2–10.6 ms; they took 4 bytes a block, +40 % of a Q4_1 file); through
# a 256 KB table, as ggml does without F16C: 11.2–11.9 ms (the weights streaming past evict it).

@intrinsic
def _cvt_f16(typingctx, h):
    """The float16 whose bits are the uint16 H as float32, by the machine's conversion (one instruction)."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@njit(inline="always")
def _move_f16(h):
    """The same by moving the bits (exact, with integers only): sign, exponent rebiased by 127 − 15 and mantissa
    moved into a float32's places; a subnormal (exponent 0) is its mantissa · 2⁻²⁴. A matrix with an infinite
    or NaN scale is refused when it is made, so the exponent 31 never comes here."""
    v = np.uint32(h)
    e = (v >> np.uint32(10)) & np.uint32(31)
    if e == 0:
        f = np.float32(v & np.uint32(1023)) * np.float32(2.0 ** -24)
        return -f if v & np.uint32(0x8000) else f
    return as_float32(((v & np.uint32(0x8000)) << np.uint32(16)) | ((e + np.uint32(112)) << np.uint32(23))
                      | ((v & np.uint32(1023)) << np.uint32(13)))


def _converts_halves() -> bool:
    """Whether numba's target converts float16 itself: every target but an x86 without F16C (where LLVM would
    call a runtime function the JIT may not find)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else ll.get_host_cpu_features().flatten()
    return "+f16c" in features.split(",")


f16 = _cvt_f16 if _converts_halves() else _move_f16   # plain form: np.uint16(h).view(np.float16).astype(np.float32)


# A block's contribution to one row of y, as sixteen lanes (their sum is the block's part of the dot
# product); what multiplies Σx of the block (a Q4_1 block's m, a Q4_0 block's −8·d) the row kernels add
# as a number of their own (the tail).

@njit(fastmath=FAST, inline="always")
def _q8_0_block(qb, db, xr, at):
    """w = d · q, q int8 [32]."""
    return vmul(vsplat(db), vfma(int8s(qb[:16]), vload(xr[at:at + 16]), vmul(int8s(qb[16:]), vload(xr[at + 16:at + 32]))))

@njit(fastmath=FAST, inline="always")
def _q4_block(qb, db, xr, at):
    """Σ q·x of a Q4 block (w = d·q + …): byte j holds weight j (low nibble) and weight 16 + j (high)."""
    lo, hi = field(qb, 0, 15), field(qb, 4, 15)
    return vmul(vsplat(db), vfma(lo, vload(xr[at:at + 16]), vmul(hi, vload(xr[at + 16:at + 32]))))

@njit(fastmath=FAST, inline="always")
def _q5_block(qb, hb, db, xr, at):
    """The same with q = nibble + 16 · fifth bit (bit j of the block's uint32 for weight j)."""
    sixteen = vsplat(np.float32(16))
    lo = vfma(bits32(hb, 0), sixteen, field(qb, 0, 15))
    hi = vfma(bits32(hb, 16), sixteen, field(qb, 4, 15))
    return vmul(vsplat(db), vfma(lo, vload(xr[at:at + 16]), vmul(hi, vload(xr[at + 16:at + 32]))))

@njit(fastmath=FAST, inline="always")
def _q45_k_block(qb, hb, scb, db, xr, at, five):
    """A Q4_K/Q5_K block of 256: four runs of 32 bytes, each holding sub-blocks 2i (low nibbles) and 2i + 1
    (high), w = d·scale·q − dmin·min (the minimums go to the tail); Q5_K's fifth bits: bit 2i / 2i + 1 of
    the 32 high-bit bytes."""
    acc = vzero()
    sixteen = vsplat(np.float32(16))
    for i in range(4):
        qi, x0 = qb[32 * i:32 * i + 32], at + 64 * i
        for half in range(2):
            qh, j = qi[16 * half:16 * half + 16], 16 * half
            lo, hi = field(qh, 0, 15), field(qh, 4, 15)
            if five:
                hh = hb[16 * half:16 * half + 16]
                lo, hi = vfma(field(hh, 2 * i, 1), sixteen, lo), vfma(field(hh, 2 * i + 1, 1), sixteen, hi)
            acc = vfma(vsplat(db * np.float32(scb[2 * i])), vmul(lo, vload(xr[x0 + j:x0 + j + 16])), acc)
            acc = vfma(vsplat(db * np.float32(scb[2 * i + 1])), vmul(hi, vload(xr[x0 + 32 + j:x0 + 48 + j])), acc)
    return acc

@njit(fastmath=FAST, inline="always")
def _q6_k_block(lb, hb, scb, db, xr, at):
    """A Q6_K block of 256: two halves of 128, each from 64 low-nibble bytes and 32 bytes of 2-bit pairs,
    w = d·scale·(q − 32) with a scale per 16 numbers."""
    acc = vzero()
    sixteen, off = vsplat(np.float32(16)), vsplat(np.float32(-32))
    for n in range(2):
        for half in range(2):
            k, x0, l0 = 8 * n + half, at + 128 * n + 16 * half, 64 * n + 16 * half
            la, lc = lb[l0:l0 + 16], lb[l0 + 32:l0 + 48]
            hh = hb[32 * n + 16 * half:32 * n + 16 * half + 16]
            q1 = vadd(vfma(field(hh, 0, 3), sixteen, field(la, 0, 15)), off)
            q2 = vadd(vfma(field(hh, 2, 3), sixteen, field(lc, 0, 15)), off)
            q3 = vadd(vfma(field(hh, 4, 3), sixteen, field(la, 4, 15)), off)
            q4 = vadd(vfma(field(hh, 6, 3), sixteen, field(lc, 4, 15)), off)
            acc = vfma(vsplat(db * np.float32(scb[k])), vmul(q1, vload(xr[x0:x0 + 16])), acc)
            acc = vfma(vsplat(db * np.float32(scb[k + 2])), vmul(q2, vload(xr[x0 + 32:x0 + 48])), acc)
            acc = vfma(vsplat(db * np.float32(scb[k + 4])), vmul(q3, vload(xr[x0 + 64:x0 + 80])), acc)
            acc = vfma(vsplat(db * np.float32(scb[k + 6])), vmul(q4, vload(xr[x0 + 96:x0 + 112])), acc)
    return acc

@njit(fastmath=FAST)
def _rows_q8_0(x, q, d, y, o0, o1):
    for r in range(x.shape[0]):
        xr = x[r]
        for o in range(o0, o1):
            acc, qo, do = vzero(), q[o], d[o]
            for b in range(do.shape[0]):
                acc = vadd(acc, _q8_0_block(qo[b], f16(do[b]), xr, 32 * b))
            y[r, o] = vsum(acc)

@njit(fastmath=FAST)
def _rows_q4(x, sums, q, d, m, mscale, offset, y, o0, o1):
    """Q4_0 (mscale 0: no m, offset 8) and Q4_1 (mscale 1, offset 0): w = d·(q − offset) + m."""
    for r in range(x.shape[0]):
        xr, sr = x[r], sums[r]
        for o in range(o0, o1):
            acc, tail, qo, do, mo = vzero(), np.float32(0), q[o], d[o], m[o]
            for b in range(do.shape[0]):
                db = f16(do[b])
                acc = vadd(acc, _q4_block(qo[b], db, xr, 32 * b))
                if mscale:
                    tail += f16(mo[b]) * sr[b]
                else:
                    tail -= offset * db * sr[b]
            y[r, o] = vsum(acc) + tail

@njit(fastmath=FAST)
def _rows_q5(x, sums, q, d, m, mscale, h, offset, y, o0, o1):
    """Q5_0 (mscale 0, offset 16) and Q5_1 (mscale 1, offset 0): w = d·(q − offset) + m, q = nibble | high bit · 16."""
    for r in range(x.shape[0]):
        xr, sr = x[r], sums[r]
        for o in range(o0, o1):
            acc, tail = vzero(), np.float32(0)
            for b in range(d.shape[1]):
                db = f16(d[o, b])
                acc = vadd(acc, _q5_block(q[o, b], h[o, b], db, xr, 32 * b))
                tail += (mscale * f16(m[o, b]) - offset * db) * sr[b]
            y[r, o] = vsum(acc) + tail

@njit(fastmath=FAST, inline="always")
def _k_tail(sr, dmin, mnb, b):
    """Σ over a K block's 8 sub-blocks of dmin·min·Σx: what the minimums take off."""
    t = np.float32(0)
    for k in range(8):
        t += np.float32(mnb[k]) * sr[b * 8 + k]
    return dmin * t

@njit(fastmath=FAST)
def _rows_q45_k(x, sums, q, qh, d, dmin, sc, mn, five, y, o0, o1):
    """Q4_K (five False: qh unused) and Q5_K; the minimums take dmin·Σ_k min_k·Σx off (`_k_tail`)."""
    for r in range(x.shape[0]):
        xr, sr = x[r], sums[r]
        for o in range(o0, o1):
            acc, tail = vzero(), np.float32(0)
            for b in range(d.shape[1]):
                acc = vadd(acc, _q45_k_block(q[o, b], qh[o, b], sc[o, b], f16(d[o, b]), xr, 256 * b, five))
                tail -= _k_tail(sr, f16(dmin[o, b]), mn[o, b], b)
            y[r, o] = vsum(acc) + tail

@njit(fastmath=FAST)
def _rows_q6_k(x, ql, qh, sc, d, y, o0, o1):
    for r in range(x.shape[0]):
        xr = x[r]
        for o in range(o0, o1):
            acc = vzero()
            for b in range(d.shape[1]):
                acc = vadd(acc, _q6_k_block(ql[o, b], qh[o, b], sc[o, b], f16(d[o, b]), xr, 256 * b))
            y[r, o] = vsum(acc)

# 16-bit floats: each weight's bits moved into a float32's (bfloat16: the top half; float16: exponent and
# mantissa shifted into place with the sign, then × 2^112, which rebias the exponent and is exact for
# subnormals too) and reinterpreted in a register (`simd.as_float32`, an LLVM bitcast), so the loop streams
# the 16-bit words once and vectorises (~45 GB/s of bfloat16 from memory here, against ~14 through a buffer).

@njit(inline="always")
def _half(h, bf16):
    if bf16:
        return as_float32(np.uint32(h) << 16)
    v = np.uint32(h)
    return as_float32(((v & np.uint32(0x7FFF)) << 13) | ((v & np.uint32(0x8000)) << 16)) * np.float32(5.192296858534828e33)

@njit(fastmath=FAST)
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

# The products: each an njit entry taking x (R, d_in) float32 C-ordered, the matrix's parts (StoredMatrix.bits)
# and y (R, d_out), which prepares what its kernel reads (block sums) and runs it over CHUNKS chunks of output rows, one per
# numba thread: one call from Python a product (a call's cost, ~8 µs in NumPy steps before, was a fifth of
# a small matrix's product). Each kind's entry holds its own parallel loop and no compiled function calls a
# parallel one, so that an entry read back from disk starts numba's thread pool itself (see kernel_cache).

@njit
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

@njit
def _chunk(out, c):
    """Output rows o0..o1 of chunk C of CHUNKS (the last may be shorter)."""
    step = (out + CHUNKS - 1) // CHUNKS
    return min(out, c * step), min(out, (c + 1) * step)

@njit(parallel=True)
def _mv_f16(x, u, y):
    for c in prange(CHUNKS):
        o0, o1 = _chunk(u.shape[0], c)
        _rows_half(x, u, False, y, o0, o1)

@njit(parallel=True)
def _mv_bf16(x, u, y):
    for c in prange(CHUNKS):
        o0, o1 = _chunk(u.shape[0], c)
        _rows_half(x, u, True, y, o0, o1)

@njit(parallel=True)
def _mv_q8_0(x, q, d, y):
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q8_0(x, q, d, y, o0, o1)

@njit(parallel=True)
def _mv_q4_0(x, q, d, y):
    sums = _sums(x)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q4(x, sums, q, d, d, np.float32(0), np.float32(8), y, o0, o1)

@njit(parallel=True)
def _mv_q4_1(x, q, d, m, y):
    sums = _sums(x)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q4(x, sums, q, d, m, np.float32(1), np.float32(0), y, o0, o1)

@njit(parallel=True)
def _mv_q5_0(x, q, d, h, y):
    sums = _sums(x)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q5(x, sums, q, d, d, np.float32(0), h, np.float32(16), y, o0, o1)

@njit(parallel=True)
def _mv_q5_1(x, q, d, m, h, y):
    sums = _sums(x)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q5(x, sums, q, d, m, np.float32(1), h, np.float32(0), y, o0, o1)

@njit(parallel=True)
def _mv_q4_k(x, q, d, dmin, sc, mn, y):
    sums = _sums(x)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q45_k(x, sums, q, q, d, dmin, sc, mn, False, y, o0, o1)

@njit(parallel=True)
def _mv_q5_k(x, q, qh, d, dmin, sc, mn, y):
    sums = _sums(x)
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q45_k(x, sums, q, qh, d, dmin, sc, mn, True, y, o0, o1)

@njit(parallel=True)
def _mv_q6_k(x, ql, qh, sc, d, y):
    for c in prange(CHUNKS):
        o0, o1 = _chunk(d.shape[0], c)
        _rows_q6_k(x, ql, qh, sc, d, y, o0, o1)

@njit
def _dq_rows_q8_0(q, d, out, o0, o1):
    nb = d.shape[1]
    for o in range(o0, o1):
        qo, row = q[o], out[o]
        for b in range(nb):
            db, qb, ob = f16(d[o, b]), qo[b], row[b * 32:b * 32 + 32]
            for j in range(32):
                ob[j] = db * np.float32(np.int32(qb[j]))


@njit
def _dq_rows_q4(q, d, m, offset, out, o0, o1):
    """w = d·(q − offset) + m (Q4_0: m zeros, offset 8; Q4_1: offset 0)."""
    nb = d.shape[1]
    for o in range(o0, o1):
        qo, row = q[o], out[o]
        for b in range(nb):
            db = f16(d[o, b])
            mb, qb, ob = f16(m[o, b]) - db * offset, qo[b], row[b * 32:b * 32 + 32]
            for j in range(16):
                v = np.int32(qb[j])
                ob[j] = db * np.float32(v & 15) + mb
                ob[16 + j] = db * np.float32(v >> 4) + mb


@njit
def _dq_rows_q5(q, d, m, h, offset, out, o0, o1):
    """w = d·(q − offset) + m, q = nibble | high bit · 16 (Q5_0: m zeros, offset 16; Q5_1: offset 0)."""
    nb = d.shape[1]
    for o in range(o0, o1):
        qo, row = q[o], out[o]
        for b in range(nb):
            db = f16(d[o, b])
            mb, qb, ob = f16(m[o, b]) - db * offset, qo[b], row[b * 32:b * 32 + 32]
            bits = np.int64(h[o, b])
            for j in range(16):
                v = np.int32(qb[j])
                ob[j] = db * np.float32((v & 15) | np.int32(((bits >> j) & 1) << 4)) + mb
                ob[16 + j] = db * np.float32((v >> 4) | np.int32(((bits >> (j + 16)) & 1) << 4)) + mb


@njit
def _dq_rows_q45_k(q, qh, d, dmin, sc, mn, five, out, o0, o1):
    nb = d.shape[1]
    for o in range(o0, o1):
        row = out[o]
        for b in range(nb):
            qb, db, dm = q[o, b], f16(d[o, b]), f16(dmin[o, b])
            for i in range(4):
                s0, s1 = db * np.float32(sc[o, b, 2 * i]), db * np.float32(sc[o, b, 2 * i + 1])
                m0, m1 = dm * np.float32(mn[o, b, 2 * i]), dm * np.float32(mn[o, b, 2 * i + 1])
                at = b * 256 + 64 * i
                for j in range(32):
                    v = np.int32(qb[32 * i + j])
                    lo, hi = v & 15, v >> 4
                    if five:
                        h = np.int32(qh[o, b, j]) >> (2 * i)
                        lo, hi = lo | ((h & 1) << 4), hi | ((h & 2) << 3)
                    row[at + j] = s0 * np.float32(lo) - m0
                    row[at + 32 + j] = s1 * np.float32(hi) - m1


@njit
def _dq_rows_q6_k(ql, qh, sc, d, out, o0, o1):
    nb = d.shape[1]
    for o in range(o0, o1):
        row = out[o]
        for b in range(nb):
            db = f16(d[o, b])
            for n in range(2):
                for l in range(32):
                    k = 8 * n + l // 16
                    a, c = np.int32(ql[o, b, 64 * n + l]), np.int32(ql[o, b, 64 * n + l + 32])
                    h = np.int32(qh[o, b, 32 * n + l])
                    at = b * 256 + 128 * n + l
                    row[at] = db * np.float32(sc[o, b, k]) * np.float32(((a & 15) | ((h & 3) << 4)) - 32)
                    row[at + 32] = db * np.float32(sc[o, b, k + 2]) * np.float32(((c & 15) | ((h & 12) << 2)) - 32)
                    row[at + 64] = db * np.float32(sc[o, b, k + 4]) * np.float32(((a >> 4) | (h & 48)) - 32)
                    row[at + 96] = db * np.float32(sc[o, b, k + 6]) * np.float32(((c >> 4) | ((h & 192) >> 2)) - 32)


# Dequantising feeds BLAS (the many-row path): one thread, so that numba's workers never wait on
# OpenBLAS's spinning ones between a tile and its product (two pools on two cores: 10× slower here).

@njit(fastmath=FAST)
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


# The same products as parts a compiled caller runs in its own parallel loop (core.step_compiled: a layer's
# one-token step in one call): ROWS[kind] = (prep, rows), prep(x) → what the rows read besides x (the block sums;
# nothing for Q8_0, Q6_K and the halves), rows(x, prep(x), bits, y, o0, o1) → y[:, o0:o1], bits StoredMatrix.bits.
# "F32": a float32 W (d_in, d_out) itself, bits (W,): y = x·W by columns o0..o1 (no BLAS inside numba; the same
# products summed in another order than NumPy's).

@njit
def _nothing(x):
    return x[:0, :0]


@njit
def _r_q8_0(x, p, bits, y, o0, o1):
    _rows_q8_0(x, bits[0], bits[1], y, o0, o1)


@njit
def _r_q4_0(x, p, bits, y, o0, o1):
    _rows_q4(x, p, bits[0], bits[1], bits[1], np.float32(0), np.float32(8), y, o0, o1)


@njit
def _r_q4_1(x, p, bits, y, o0, o1):
    _rows_q4(x, p, bits[0], bits[1], bits[2], np.float32(1), np.float32(0), y, o0, o1)


@njit
def _r_q5_0(x, p, bits, y, o0, o1):
    _rows_q5(x, p, bits[0], bits[1], bits[1], np.float32(0), bits[2], np.float32(16), y, o0, o1)


@njit
def _r_q5_1(x, p, bits, y, o0, o1):
    _rows_q5(x, p, bits[0], bits[1], bits[2], np.float32(1), bits[3], np.float32(0), y, o0, o1)


@njit
def _r_q4_k(x, p, bits, y, o0, o1):
    q, d, dmin, sc, mn = bits
    _rows_q45_k(x, p, q, q, d, dmin, sc, mn, False, y, o0, o1)


@njit
def _r_q5_k(x, p, bits, y, o0, o1):
    q, qh, d, dmin, sc, mn = bits
    _rows_q45_k(x, p, q, qh, d, dmin, sc, mn, True, y, o0, o1)


@njit
def _r_q6_k(x, p, bits, y, o0, o1):
    _rows_q6_k(x, bits[0], bits[1], bits[2], bits[3], y, o0, o1)


@njit
def _r_f16(x, p, bits, y, o0, o1):
    _rows_half(x, bits[0], False, y, o0, o1)


@njit
def _r_bf16(x, p, bits, y, o0, o1):
    _rows_half(x, bits[0], True, y, o0, o1)


@njit(fastmath=FAST)
def _r_f32(x, p, bits, y, o0, o1):
    """y[:, o0:o1] = x·W[:, o0:o1], W (d_in, d_out) float32: each row of W's columns o0..o1 added in, times x_i."""
    W = bits[0]
    acc = np.empty(o1 - o0, np.float32)
    for r in range(x.shape[0]):
        acc[:] = 0
        for i in range(x.shape[1]):
            xi, row = x[r, i], W[i]
            for o in range(o0, o1):
                acc[o - o0] += xi * row[o]
        y[r, o0:o1] = acc


ROWS = {"Q8_0": (_nothing, _r_q8_0), "Q4_0": (_sums, _r_q4_0), "Q4_1": (_sums, _r_q4_1), "Q5_0": (_sums, _r_q5_0),
        "Q5_1": (_sums, _r_q5_1), "Q4_K": (_sums, _r_q4_k), "Q5_K": (_sums, _r_q5_k), "Q6_K": (_nothing, _r_q6_k),
        "F16": (_nothing, _r_f16), "BF16": (_nothing, _r_bf16), "F32": (_nothing, _r_f32)}

MATVEC = {"Q8_0": _mv_q8_0, "Q4_0": _mv_q4_0, "Q4_1": _mv_q4_1, "Q5_0": _mv_q5_0, "Q5_1": _mv_q5_1,
          "Q4_K": _mv_q4_k, "Q5_K": _mv_q5_k, "Q6_K": _mv_q6_k, "F16": _mv_f16, "BF16": _mv_bf16}
DEQUANT = {"Q8_0": _dq_q8_0, "Q4_0": _dq_q4_0, "Q4_1": _dq_q4_1, "Q5_0": _dq_q5_0, "Q5_1": _dq_q5_1,
           "Q4_K": _dq_q4_k, "Q5_K": _dq_q5_k, "Q6_K": _dq_q6_k, "F16": _dq_f16, "BF16": _dq_bf16}

# What Python calls, kept on disk whole (their callees are compiled into them).
kernel_cache.keep([*MATVEC.values(), _dq_half, _dq_rows_q8_0, _dq_rows_q4, _dq_rows_q5, _dq_rows_q45_k, _dq_rows_q6_k],
                  [Path(__file__), Path(simd.__file__)])
