"""The numba kernels of engine.stored (imported on first use: numba takes half a second to import).

One function per kind and task, each a loop over the blocks of a row with its own unpacking (numba
compiles each on first use, cached on disk). fastmath "reassoc" lets the inner sums run in SIMD lanes
(float32 sums in another order: within rounding of the plain order); NaN and infinity keep their meaning.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

FAST = {"reassoc", "contract"}
CHUNKS = 2                   # row chunks a product is split into, one per numba thread

# Each kernel: rows o0..o1 of T against every row of x. The products of a block are summed into lane
# arrays (never a sum per block: that horizontal add stops the SIMD loop), each scaled by its block's
# d; x and the bytes are read through per-block slices (LLVM then drops the index checks).

@njit(cache=True, fastmath=FAST)
def _rows_q8_0(x, sums, q, d, y, o0, o1):
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
def _rows_q4(xl, xh, sums, q, d, m, offset, y, o0, o1):
    """Q4_0 (m zeros, offset 8) and Q4_1 (offset 0): w = d·(q − offset) + m. xl, xh (R, nb, 16): each
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
                tail += (m[o, b] - db * offset) * sums[r, b]
            y[r, o] = lo.sum() + hi.sum() + tail

@njit(cache=True, fastmath=FAST)
def _rows_q5(xl, xh, sums, q, d, m, h, offset, y, o0, o1):
    """Q5_0 (offset 16) and Q5_1 (offset 0): w = d·(q − offset) + m, q = nibble | high bit · 16."""
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
                tail += (m[o, b] - db * offset) * sums[r, b]
            y[r, o] = lo.sum() + hi.sum() + tail

@njit(parallel=True, cache=True)
def _mv_q8_0(x, sums, q, d, y):
    out = d.shape[0]
    step = (out + CHUNKS - 1) // CHUNKS
    for c in prange(CHUNKS):
        _rows_q8_0(x, sums, q, d, y, c * step, min(out, (c + 1) * step))

@njit(parallel=True, cache=True)
def _mv_q4_any(xl, xh, sums, q, d, m, offset, y):
    out = d.shape[0]
    step = (out + CHUNKS - 1) // CHUNKS
    for c in prange(CHUNKS):
        _rows_q4(xl, xh, sums, q, d, m, offset, y, c * step, min(out, (c + 1) * step))

@njit(parallel=True, cache=True)
def _mv_q5_any(xl, xh, sums, q, d, m, h, offset, y):
    out = d.shape[0]
    step = (out + CHUNKS - 1) // CHUNKS
    for c in prange(CHUNKS):
        _rows_q5(xl, xh, sums, q, d, m, h, offset, y, c * step, min(out, (c + 1) * step))

def _halves(x):
    """x (R, d_in) → each block's first and last 16 numbers, apart and contiguous: 2 × (R, nb, 16)."""
    blocks = x.reshape(x.shape[0], -1, 2, 16)
    return np.ascontiguousarray(blocks[:, :, 0]), np.ascontiguousarray(blocks[:, :, 1])

def _mv_q4_0(x, sums, q, d, y):
    _mv_q4_any(*_halves(x), sums, q, d, np.zeros_like(d), np.float32(8), y)

def _mv_q4_1(x, sums, q, d, m, y):
    _mv_q4_any(*_halves(x), sums, q, d, m, np.float32(0), y)

def _mv_q5_0(x, sums, q, d, h, y):
    _mv_q5_any(*_halves(x), sums, q, d, np.zeros_like(d), h, np.float32(16), y)

def _mv_q5_1(x, sums, q, d, m, h, y):
    _mv_q5_any(*_halves(x), sums, q, d, m, h, np.float32(0), y)

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


# Dequantising feeds BLAS (the many-row path): one thread, so that numba's workers never wait on
# OpenBLAS's spinning ones between a tile and its product (two pools on two cores: 10× slower here).

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


MATVEC = {"Q8_0": _mv_q8_0, "Q4_0": _mv_q4_0, "Q4_1": _mv_q4_1, "Q5_0": _mv_q5_0, "Q5_1": _mv_q5_1}
DEQUANT = {"Q8_0": _dq_q8_0, "Q4_0": _dq_q4_0, "Q4_1": _dq_q4_1, "Q5_0": _dq_q5_0, "Q5_1": _dq_q5_1}
