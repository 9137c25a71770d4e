"""llama.cpp's arithmetic for a product with a GGUF block-quantised weight, in plain NumPy: the definition a
faster kernel is tested against (issue 49, the `llama.cpp` arithmetic).

qkv's `exact` product (runtime.stored) multiplies float32 activations by the exactly dequantised weight.
llama.cpp (ggml's CPU backend) does not: before `y = x @ W` it quantises each row of x, block by block, into
the weight type's partner ("vec_dot_type"), then multiplies small integers and applies the two scales:

    weight   activations   a block of 32 of x                                   y gets, per block b
    Q4_0     Q8_0          d_x = fp16(amax/127), q_x = rne(x · 127/amax)       fp32(d_w·d_x) · Σ (q_w − 8)·q_x
    Q5_0     Q8_0                                                               fp32(d_w·d_x) · Σ (q_w − 16)·q_x
    Q8_0     Q8_0                                                               fp32(d_w·d_x) · Σ q_w·q_x
    Q4_1     Q8_1          as Q8_0, and s_x = fp16(amax/127 · Σ q_x)           fp32(d_w·d_x) · Σ q_w·q_x + m_w·s_x
    Q5_1     Q8_1                                                               (the same, q_w of 5 bits)

(amax = max |x| over the block; rne: round to nearest, ties to even, as x86's `_mm256_round_ps` rounds; the
float32 scale amax/127 is rounded to float16 for d_x, while q_x uses 127/amax in float32 — ggml's AVX2
`quantize_row_q8_0` / `q8_1`; its portable reference rounds ties away from zero instead: `ties="away"`.)

The order of the float sums is ggml's AVX2 dot product's (`ggml_vec_dot_q4_0_q8_0` and its siblings): the
integer products of a block summed in 8 lanes of 4 consecutive weights (exact integers), each lane accumulated
over the blocks with a fused multiply-add acc ← fma(fp32(d_w·d_x), lane, acc), then the 8 lanes added as
((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)); the Q8_1 kinds add Σ_b fp32(m_w·s_x), summed in block order, last.
The fused multiply-add rounds once, as the machine's (`_fma32`: the exact product and sum in float64, rounded to
odd, then to float32).

Repacked Q4_0 and Q4_K (`repacked`). On x86 with AVX2 llama.cpp copies a Q4_0 or Q4_K matrix whose rows are a
multiple of 8 into blocks of eight rows when it loads it (its CPU_REPACK buffer, `q4_0_8x8`, `q4_K_8x8`), and its
gemv / gemm kernels sum each row's block whole, one fused multiply-add a block, no lanes (the same integers and
scales):
    Q4_0   y = Σ_b^(fma) fp32(d_w·d_x) · Σ_32 (q_w − 8)·q_x
    Q4_K   y = Σ_b^(fma) fp32(d_w·d_x) · Σ_8 sc·Σ_32 q_w·q_x  −  Σ_b^(fma) fp32(dmin_w·d_x) · Σ_8 m·S   (two chains;
           its gemm, the whole fours of a prompt's rows, a multiply-add each pair of sub-blocks instead of each 8)
qkv follows it for those matrices: equal to ggml's gemv and gemm to the bit (tests/fixtures/gguf/ggml_ops.npz),
and the 1B-shaped Q4_0 file's first logits equal llama.cpp's (0.045 apart before; Q4_K_M's stay apart through
SiLU, below). ARM builds repack in other layouts, and llama.cpp may take tinyBLAS for float matrices.

The K-quants multiply Q8_K activations (blocks of 256: d_x float32 = 1/iscale with iscale = −127/(the signed
largest value), q_x = min(127, rne(iscale·x)), and the 16 sums of each 16 q_x), per super-block of 256 of the
weight, whose unsigned integers q_w come in sub-blocks with 6-bit scales sc (Q4_K, Q5_K: 8 of 32, and 6-bit mins
m; Q6_K: 16 of 16, int8 scales, w = d·sc·(q_w − 32)). ggml's AVX2 dot products (`ggml_vec_dot_q4_K_q8_K` and
its siblings) keep the same 8 lanes — lane k the positions 4k..4k+3 of each 32 — with integer sums:

    Q4_K, Q5_K   lane_k = Σ_chunks sc·Σ_4 q_w·q_x (exact)       acc ← fma(fp32(d_x·d_w), fp32(lane_k), acc)
                 mins: S_i = Σ of sub-block i's q_x (two bsums); Q4_K: 4 lanes acc_m ← fma(−fp32(d_x·dmin),
                 m_2k·S_2k + m_2k+1·S_2k+1, acc_m), then (a0+a2)+(a1+a3); Q5_K: one float32 sum,
                 summs ← fma(−fp32(d_x·dmin), Σ_i m_i·S_i, summs) in super-block order (ggml writes
                 `summs += dmin·Σ`; gcc contracts it on an FMA machine: vfmadd231ss in llama-cpp-python
                 0.3.36's libggml-cpu, and its vec_dot equals this one to the bit, through ctypes)
    Q6_K         lane_k = Σ_chunks sc·Σ_4 q_w·q_x − 32·(sc_2k·bsum_2k + sc_2k+1·bsum_2k+1) (the −32 through the
                 activations' sums, ggml's lanes: not the per-position lanes' own share), then as above
    y = hsum8(acc) (+ the mins' sum).

(The integer lanes are converted to float32 with one rounding, as _mm256_cvtepi32_ps: exact below 2²⁴.)

Three of the steps between the products, as ggml computes them (`rms_norm`, `rope_cos_sin`, `silu`: its SwiGLU's
e^x is its own polynomial, not the C library's): with int8 blocks a one-ulp difference before a product can move
a rounding by a whole block step, so following llama.cpp past the first position needs its norms, RoPE angles
and SiLU to the bit too (and, further on, its attention's order of summation, not defined here).

`qkv.load(path, arith="llama.cpp")` runs a model this way: each StoredMatrix multiplies by `llama_matvec`'s
arithmetic (compiled: runtime.llama_kernels, bit-equal to it; without numba `llama_matvec` itself), and the
engine's RMSNorm and plain RoPE read ModelConfig.arith (core.blocks.norm, core.stack.rotation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import QkvError

# a weight kind: the activations' kind ggml multiplies it with (ggml-cpu's type_traits_cpu[...].vec_dot_type)
VEC_DOT = {"Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1",
           "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K"}
BLOCK = {"Q8_0": 32, "Q8_1": 32, "Q8_K": 256}
LANES = 8                     # AVX2: 8 float32 lanes, each the integer sum of 4 consecutive products
PRODUCTS_32 = ("Q4_0", "Q5_0", "Q8_0", "Q4_1", "Q5_1")          # blocks of 32 (weight_integers)
PRODUCTS_K = ("Q4_K", "Q5_K", "Q6_K")                            # super-blocks of 256 (k_weight_integers)
PRODUCTS = PRODUCTS_32 + PRODUCTS_K                              # the weight kinds llama_matvec multiplies
REPACKED = ("Q4_0", "Q4_K")    # kinds llama.cpp (x86, AVX2) repacks when their rows are a multiple of REPACK_ROWS
REPACK_ROWS = 8                # rows of T in one repacked block (its q4_0_8x8, q4_K_8x8)
GEMM_ROWS = 4                  # rows of x its gemm takes at once (the whole fours of a prompt's; the rest: gemv)


@dataclass
class QuantizedActivations:
    """Rows of x as ggml quantises them for a product. R rows, nb blocks of `per` numbers:

    q  (R, nb, per) int8     the integers
    d  (R, nb) float32       the scale, x ≈ d·q (Q8_0 / Q8_1: a float16's value; Q8_K: float32)
    s  (R, nb) float32       Q8_1: fp16(d_32·Σq) with d_32 the scale before its float16 rounding; else None
    bsums (R, nb, 16) int32  Q8_K: the sums of each 16 integers; else None
    """

    kind: str
    q: np.ndarray
    d: np.ndarray
    s: np.ndarray | None = None
    bsums: np.ndarray | None = None


def _round(v: np.ndarray, ties: str) -> np.ndarray:
    """Round float32 V to integers (as float32): ties to even (x86 _mm256_round_ps) or away from zero (roundf)."""
    if ties == "even":
        return np.rint(v)
    if ties == "away":
        return (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.float32)
    raise QkvError(f'ties is "even" or "away", not {ties!r}')


def _fp16(v: np.ndarray) -> np.ndarray:
    """float32 → the nearest float16 (ties to even, as F16C's _cvtss_sh) → float32."""
    return v.astype(np.float16).astype(np.float32)


def _blocks(x: np.ndarray, per: int) -> np.ndarray:
    """x (..., d_in) → float32 rows in blocks (R, d_in/per, per)."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % per:
        raise QkvError(f"llama.cpp quantises activations in blocks of {per}; a row of {x.shape[-1]} does not divide")
    return x.reshape(-1, x.shape[-1] // per, per)                      # (R, nb, per)


def quantize_activations(x: np.ndarray, kind: str, ties: str = "even") -> QuantizedActivations:
    """Rows of x (..., d_in) quantised as ggml quantises activations of KIND ("Q8_0", "Q8_1", "Q8_K").

    Q8_0 / Q8_1 (ggml's AVX2 quantize_row_q8_0 / q8_1), per block of 32:
        amax = max|x|,  d_32 = amax/127 (float32),  d = fp16(d_32),  q = round(x · (127/amax)),  0 when amax = 0
        Q8_1 also s = fp16(d_32 · Σq)
    Q8_K (quantize_row_q8_K_ref), per block of 256: m = the x of largest |x| (the first), iscale = −127/m,
        q = min(127, round(iscale·x)),  d = 1/iscale,  bsums = the sums of each 16 q's.
    """
    if kind not in BLOCK:
        raise QkvError(f"llama.cpp's activation kinds are {', '.join(BLOCK)}, not {kind!r}")
    xb = _blocks(x, BLOCK[kind])                                        # (R, nb, per)
    if kind == "Q8_K":
        return _quantize_q8_k(xb, ties)
    amax = np.abs(xb).max(axis=-1)                                      # (R, nb)
    d32 = amax / np.float32(127)                                        # (R, nb) float32
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)   # (R, nb)
    q = _round(xb * inv[..., None], ties).astype(np.int8)              # (R, nb, 32)
    s = _fp16(d32 * q.sum(axis=-1, dtype=np.int32).astype(np.float32)) if kind == "Q8_1" else None
    return QuantizedActivations(kind, q, _fp16(d32), s)


def _quantize_q8_k(xb: np.ndarray, ties: str) -> QuantizedActivations:
    """Q8_K: the signed extreme of each 256 maps to −127; d float32, no float16 rounding."""
    first = np.abs(xb).argmax(axis=-1)                                  # (R, nb) the first largest |x|
    m = np.take_along_axis(xb, first[..., None], axis=-1)[..., 0]        # (R, nb) its signed value
    with np.errstate(divide="ignore"):
        iscale = np.where(m != 0, np.float32(-127) / m, np.float32(0)).astype(np.float32)    # (R, nb)
        d = np.where(m != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)       # (R, nb)
    q = np.minimum(_round(xb * iscale[..., None], ties), 127).astype(np.int8)               # (R, nb, 256)
    bsums = q.reshape(*q.shape[:2], 16, 16).sum(axis=-1, dtype=np.int32)                      # (R, nb, 16)
    return QuantizedActivations("Q8_K", q, d, bsums=bsums)


def weight_integers(w) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A StoredMatrix's blocks as integers and scales, T = d·q (+ m) per block of 32:
    q (d_out, nb, 32) int8 (Q4_0: nibble − 8, Q5_0: 5 bits − 16, Q4_1/Q5_1: 0..15 / 0..31), d (d_out, nb) float32,
    m (d_out, nb) float32 for Q4_1 / Q5_1, else None (the file's float16 scales, widened exactly)."""
    kind = w.kind
    if kind not in PRODUCTS_32:
        raise QkvError(f"llama.cpp's arithmetic is defined here for {', '.join(PRODUCTS)} weights, not {kind}")
    if kind == "Q8_0":
        q, d = w.parts
        return np.asarray(q, dtype=np.int8), np.asarray(d, np.float32), None
    nibbles, d = w.parts[0], np.asarray(w.parts[1], np.float32)     # (d_out, nb, 16) uint8, (d_out, nb)
    q = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1).astype(np.int8)     # (d_out, nb, 32): weights 0–15, 16–31
    if kind in ("Q5_0", "Q5_1"):
        high = w.parts[-1]                                              # (d_out, nb) uint32, bit j: weight j's fifth bit
        bits = (high[..., None] >> np.arange(32, dtype=np.uint32)) & 1   # (d_out, nb, 32)
        q = q | (bits.astype(np.int8) << 4)
    if kind == "Q4_0":
        q = q - np.int8(8)
    if kind == "Q5_0":
        q = q - np.int8(16)
    m = np.asarray(w.parts[2], np.float32) if kind in ("Q4_1", "Q5_1") else None
    return q, d, m


@dataclass
class KWeights:
    """A K-quant StoredMatrix's super-blocks as ggml's AVX2 dot products read them (nb super-blocks of 256):

    q  (d_out, nb, 256) uint8     the unsigned integers (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63), in weight order
    sc (d_out, nb, S) int32       the sub-blocks' scales: Q4_K, Q5_K S = 8 of 32 (6 bits); Q6_K S = 16 of 16 (int8)
    d  (d_out, nb) float32        the super-block's scale (the file's float16, widened exactly)
    m  (d_out, nb, 8) int32       Q4_K, Q5_K: the sub-blocks' 6-bit mins; else None
    dmin (d_out, nb) float32      Q4_K, Q5_K: their scale; else None

    The weights: Q4_K, Q5_K  d·sc·q − dmin·m per sub-block;  Q6_K  d·sc·(q − 32)."""

    kind: str
    q: np.ndarray
    sc: np.ndarray
    d: np.ndarray
    m: np.ndarray | None = None
    dmin: np.ndarray | None = None

    def dequantized(self) -> np.ndarray:
        """T (d_out, nb·256) in float64 from the integers: the weights the block formula gives."""
        per = 256 // self.sc.shape[-1]
        sc = np.repeat(self.sc, per, axis=-1).astype(np.float64)                       # (d_out, nb, 256)
        if self.kind == "Q6_K":
            t = self.d[..., None].astype(np.float64) * sc * (self.q.astype(np.float64) - 32)
        else:
            t = (self.d[..., None].astype(np.float64) * sc * self.q
                 - self.dmin[..., None].astype(np.float64) * np.repeat(self.m, per, axis=-1))
        return t.reshape(t.shape[0], -1)


def _nibbles64(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 128 bytes (..., 128) → (..., 256): each 32 bytes give 64 weights, low nibbles then high."""
    chunks = qs.reshape(*qs.shape[:-1], 4, 32)                                          # (..., 4, 32)
    return np.concatenate([chunks & 15, chunks >> 4], axis=-1).reshape(*qs.shape[:-1], 256)


def k_weight_integers(w) -> KWeights:
    """A Q4_K / Q5_K / Q6_K StoredMatrix's integers, sub-block scales and mins (runtime.stored._unpack's parts)."""
    kind = w.kind
    if kind not in PRODUCTS_K:
        raise QkvError(f"llama.cpp's arithmetic is defined here for {', '.join(PRODUCTS)} weights, not {kind}")
    if kind == "Q6_K":
        ql, qh, sc, d = w.parts                          # (d_out, nb, 128), (d_out, nb, 64), (d_out, nb, 16) int8
        low = ql.reshape(*ql.shape[:2], 2, 2, 32)         # (d_out, nb, half, 2, 32): bytes 64h + 32i + l
        high = qh.reshape(*qh.shape[:2], 2, 1, 32)        # (d_out, nb, half, 1, 32): byte 32h + l
        # weight 128h + 32g + l, g = 0..3: nibble (g // 2) of byte 64h + 32(g % 2) + l, high bits 2g of qh
        lows = np.concatenate([low & 15, low >> 4], axis=3)                              # (…, half, 4, 32)
        highs = (high >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3                # (…, half, 4, 32)
        q = (lows | (highs << 4)).reshape(*ql.shape[:2], 256)                             # (d_out, nb, 256)
        return KWeights(kind, q, np.asarray(sc, np.int32), np.asarray(d, np.float32))
    if kind == "Q4_K":
        qs, d, dmin, sc, m = w.parts
        q = _nibbles64(qs)                                                              # (d_out, nb, 256)
    else:
        qs, qh, d, dmin, sc, m = w.parts
        # weight 32i + l (i = 0..7, l < 32): its fifth bit is bit i of qh[l]
        fifth = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1          # (d_out, nb, 8, 32)
        q = _nibbles64(qs) | (fifth.reshape(*qh.shape[:2], 256) << 4)                   # (d_out, nb, 256)
    return KWeights(kind, q, np.asarray(sc, np.int32), np.asarray(d, np.float32), np.asarray(m, np.int32),
                    np.asarray(dmin, np.float32))


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a·b + c rounded once, as a fused multiply-add (vfmadd231ps) rounds it. The product of two float32s
    is exact in float64; their sum s = fl64(p + c) with its error e = (p + c) − s (TwoSum, exact) is rounded to
    odd — s, or its neighbour towards e when s's last bit is even and e ≠ 0 — and a number rounded to odd at 53
    bits rounds to nearest at 24 as the exact one does (53 ≥ 24 + 2): one rounding, not two."""
    p = a.astype(np.float64) * b                                          # exact
    c = np.asarray(c, np.float64)
    s = p + c
    back = s - p
    e = (p - (s - back)) + (c - back)                                     # p + c = s + e exactly
    even = (np.ascontiguousarray(s).view(np.int64) & 1) == 0
    odd = np.nextafter(s, np.where(e > 0, np.inf, -np.inf))
    return np.where(even & (e != 0) & np.isfinite(s), odd, s).astype(np.float32)


def _hsum8(acc: np.ndarray) -> np.ndarray:
    """(..., 8) float32 lanes → (...,) as ggml's hsum_float_8 adds them: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))."""
    four = acc[..., :4] + acc[..., 4:]                                   # (..., 4)
    two = four[..., :2] + four[..., 2:]                                  # (..., 2)
    return two[..., 0] + two[..., 1]


def repacked(kind: str, d_out: int) -> bool:
    """Whether llama.cpp (x86, AVX2) multiplies a KIND matrix of D_OUT rows repacked, each block's sum whole: a
    Q4_0 or Q4_K matrix whose rows are a multiple of 8 (module docstring)."""
    return kind in REPACKED and d_out % REPACK_ROWS == 0


def llama_matvec(w, x: np.ndarray, ties: str = "even") -> np.ndarray:
    """x (..., d_in) @ W with llama.cpp's arithmetic, for W a runtime.stored.StoredMatrix of a PRODUCTS kind.

    y[r, o] = hsum8( Σ_b^(fma) fp32(d_w[o,b]·d_x[r,b]) · lane_k(Σ q_w·q_x) ) (+ Σ_b fp32(m_w[o,b]·s_x[r,b]))
    (a repacked Q4_0: Σ_b^(fma) fp32(d_w·d_x) · Σ q_w·q_x; the K-quants: `_k_matvec`) → (..., d_out) float32.
    Readable and slow (a loop over blocks): the definition, not the fast path."""
    if w.kind in PRODUCTS_K:
        return _k_matvec(w, x, ties)
    qw, dw, mw = weight_integers(w)                                     # (d_out, nb, 32), (d_out, nb), (d_out, nb)
    a = quantize_activations(x, VEC_DOT[w.kind], ties)                  # q (R, nb, 32), d (R, nb)
    R, nb = a.d.shape
    if repacked(w.kind, w.d_out):
        y = np.zeros((R, w.d_out), np.float32)                          # (R, d_out)
        for b in range(nb):
            whole = np.einsum("oj,rj->ro", qw[:, b].astype(np.int32), a.q[:, b].astype(np.int32))   # exact
            y = _fma32(dw[None, :, b] * a.d[:, b, None], whole.astype(np.float32), y)
        return y.reshape(*np.shape(x)[:-1], w.d_out)
    lanes_w = qw.reshape(w.d_out, nb, LANES, 4).astype(np.int32)        # (d_out, nb, 8, 4)
    lanes_x = a.q.reshape(R, nb, LANES, 4).astype(np.int32)             # (R, nb, 8, 4)
    acc = np.zeros((R, w.d_out, LANES), np.float32)                     # (R, d_out, 8)
    summs = np.zeros((R, w.d_out), np.float32)                          # (R, d_out)
    for b in range(nb):
        lane = np.einsum("okj,rkj->rok", lanes_w[:, b], lanes_x[:, b])  # (R, d_out, 8) exact integers
        scale = dw[None, :, b] * a.d[:, b, None]                        # (R, d_out) float32
        acc = _fma32(scale[..., None], lane.astype(np.float32), acc)    # (R, d_out, 8)
        if mw is not None:
            summs = summs + mw[None, :, b] * a.s[:, b, None]            # (R, d_out)
    y = _hsum8(acc)                                                     # (R, d_out)
    if mw is not None:
        y = y + summs
    return y.reshape(*np.shape(x)[:-1], w.d_out)


def k_lanes(kw: KWeights, qx: np.ndarray, bsums: np.ndarray, b: int) -> np.ndarray:
    """Super-block B's 8 integer lanes (R, d_out, 8) int64, as ggml's AVX2 K-quant dot products hold them: lane k
    the positions 4k..4k+3 of each 32, each chunk's four products times its sub-block's scale (Q6_K: the chunk's
    first 16 positions are one sub-block, its last 16 the next: lanes 0–3 and 4–7), Q6_K less 32·(sc·bsum) of
    sub-blocks 2k and 2k+1. qx (R, nb, 256) and bsums (R, nb, 16): the Q8_K activations."""
    d_out, R = kw.q.shape[0], qx.shape[0]
    w = kw.q[:, b].reshape(d_out, 8, LANES, 4).astype(np.int64)           # (d_out, chunk, lane, 4)
    a = qx[:, b].reshape(R, 8, LANES, 4).astype(np.int64)                 # (R, chunk, lane, 4)
    fours = np.einsum("oclj,rclj->rocl", w, a)                            # (R, d_out, chunk, lane)
    sc = kw.sc[:, b].astype(np.int64)                                     # (d_out, 8 or 16)
    if kw.kind == "Q6_K":
        per_lane = sc.reshape(d_out, 8, 2).repeat(4, axis=-1)             # (d_out, chunk, lane): sc[2c + k // 4]
        sub = 32 * (bsums[:, b].astype(np.int64)[:, None] * sc[None])     # (R, d_out, 16)
        return np.einsum("rocl,ocl->rol", fours, per_lane) - sub.reshape(R, d_out, 8, 2).sum(-1)
    return np.einsum("rocl,oc->rol", fours, sc)                           # (R, d_out, 8)


def _q4_k_repacked(kw: KWeights, a: QuantizedActivations, quads: int) -> np.ndarray:
    """A repacked Q4_K's y (R, d_out): two float chains, the sums Σ sc·Σ q_w·q_x and the mins Σ m·S, y = one − the
    other. Rows of x below QUADS (the whole fours of them: ggml's gemm) take a multiply-add a pair of sub-blocks;
    the rest (its gemv) one a super-block."""
    R, nb = a.d.shape
    d_out = kw.q.shape[0]
    w = kw.q.reshape(d_out, nb, 8, 32).astype(np.int64)                      # (d_out, nb, sub-block, 32)
    q = a.q.reshape(R, nb, 8, 32).astype(np.int64)                           # (R, nb, sub-block, 32)
    subs = np.einsum("obsj,rbsj->robs", w, q) * kw.sc[None].astype(np.int64)   # (R, d_out, nb, 8) sc·Σ q·q
    S = a.bsums.astype(np.int64).reshape(R, nb, 8, 2).sum(-1)                # (R, nb, 8) Σ q_x a sub-block
    mins = S[:, None] * kw.m[None].astype(np.int64)                          # (R, d_out, nb, 8) m·S
    y = np.empty((R, d_out), np.float32)
    for rows, step in ((slice(0, quads), 2), (slice(quads, R), 8)):        # sub-blocks a multiply-add
        one = np.zeros((len(range(R)[rows]), d_out), np.float32)            # (rows, d_out)
        other = np.zeros_like(one)
        for b in range(nb):
            scale = kw.d[None, :, b] * a.d[rows, b, None]                    # (rows, d_out) float32: d_w·d_x
            low = kw.dmin[None, :, b] * a.d[rows, b, None]
            for s in range(0, 8, step):
                sums = subs[rows, :, b, s:s + step].sum(-1).astype(np.float32)     # as vcvtdq2ps rounds
                one = _fma32(scale, sums, one)
                other = _fma32(low, mins[rows, :, b, s:s + step].sum(-1).astype(np.float32), other)
        y[rows] = one - other
    return y


def _k_matvec(w, x: np.ndarray, ties: str) -> np.ndarray:
    """x @ W for a K-quant W (module docstring): ggml_vec_dot_q{4,5,6}_K_q8_K's AVX2 order, super-block by
    super-block."""
    kw = k_weight_integers(w)
    a = quantize_activations(x, "Q8_K", ties)                            # q (R, nb, 256), d (R, nb), bsums (R, nb, 16)
    R, nb = a.d.shape
    if repacked(w.kind, w.d_out):
        return _q4_k_repacked(kw, a, R - R % GEMM_ROWS).reshape(*np.shape(x)[:-1], w.d_out)
    acc = np.zeros((R, w.d_out, LANES), np.float32)                     # (R, d_out, 8)
    acc_m = np.zeros((R, w.d_out, 4), np.float32)                       # (R, d_out, 4) Q4_K's mins
    summs = np.zeros((R, w.d_out), np.float32)                          # (R, d_out) Q5_K's mins
    for b in range(nb):
        d = a.d[:, b, None] * kw.d[None, :, b]                           # (R, d_out) float32: y.d · x.d
        lane = k_lanes(kw, a.q, a.bsums, b)                              # (R, d_out, 8) exact integers
        acc = _fma32(d[..., None], lane.astype(np.float32), acc)         # (R, d_out, 8)
        if kw.m is None:
            continue
        dmin = -(a.d[:, b, None] * kw.dmin[None, :, b])                  # (R, d_out) float32
        sums = a.bsums[:, b].astype(np.int64).reshape(R, 8, 2).sum(-1)  # (R, 8) each sub-block's Σ q_x
        mins = sums[:, None] * kw.m[None, :, b]                          # (R, d_out, 8) exact
        if w.kind == "Q4_K":
            pairs = mins.reshape(R, w.d_out, 4, 2).sum(-1)                # (R, d_out, 4) _mm_madd_epi16
            acc_m = _fma32(dmin[..., None], pairs.astype(np.float32), acc_m)
        else:
            summs = _fma32(dmin, mins.sum(-1).astype(np.float32), summs)  # summs += dmin·Σ: contracted (gcc)
    y = _hsum8(acc)                                                      # (R, d_out)
    if w.kind == "Q4_K":
        y = y + ((acc_m[..., 0] + acc_m[..., 2]) + (acc_m[..., 1] + acc_m[..., 3]))
    elif w.kind == "Q5_K":
        y = y + summs
    return y.reshape(*np.shape(x)[:-1], w.d_out)


# ── steps between the products, as ggml computes them ──────────────────────────────────────

def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm as ggml (ggml_compute_forward_rms_norm_f32, then ggml_mul by γ): the squares in float32 summed in
    float64, mean(x²) rounded to float32, r = 1/√(mean + eps) in float32, then x·r·γ (qkv's rms_norm divides
    by √(mean + eps): the same number, up to the last bit)."""
    sq = np.add.reduce((x * x).astype(np.float64), axis=-1, keepdims=True)   # (..., 1) Σ x² in float64
    mean = (sq / x.shape[-1]).astype(np.float32)                              # (..., 1)
    r = (np.float32(1) / np.sqrt(mean + np.float32(eps))).astype(np.float32)  # (..., 1)
    return (x * r) * weight                                                  # (..., d)


def _hex32(h: str) -> np.float32:
    return np.float32(float.fromhex(h))


# ggml's float32 e^x on AVX2 (ggml_v_expf, from Arm's optimized routines; within 1.5 ulp): x = n·ln 2 + b, n an
# integer by the 1.5·2²³ trick, b in two parts; e^b by a polynomial in b and b², then times 2^n (the exponent's
# bits), with a scaled path for |n| > 126 and ±inf / 0 past 192.
GGML_EXPF = dict(r=_hex32("0x1.8p23"), log2e=_hex32("0x1.715476p+0"),
                 ln2=(_hex32("0x1.62e4p-1"), _hex32("0x1.7f7d1cp-20")),
                 c=(_hex32("0x1.ffffecp-1"), _hex32("0x1.fffdb6p-2"), _hex32("0x1.555e66p-3"), _hex32("0x1.573e2ep-5"),
                    _hex32("0x1.0e4020p-7")))


def ggml_expf(x: np.ndarray) -> np.ndarray:
    """e^x of float32 X as ggml's AVX2 ggml_v_expf computes it, step for step (each fused multiply-add `_fma32`)."""
    x = np.asarray(x, np.float32)
    e_, (c1, c2, c3, c4, c5) = GGML_EXPF, GGML_EXPF["c"]
    with np.errstate(over="ignore", invalid="ignore"):                     # inf and 0 past the range, as ggml's
        z = _fma32(x, e_["log2e"], e_["r"])
        n = z - e_["r"]                                                    # the integer n, as float32
        b = _fma32(-n, e_["ln2"][1], _fma32(-n, e_["ln2"][0], x))          # x − n·ln 2
        e = z.view(np.int32) << np.int32(23)                               # n in the exponent's bits
        k = (e + np.float32(1).view(np.int32)).view(np.float32)            # 2^n
        u = b * b
        j = _fma32(_fma32(_fma32(c5, b, c4), u, _fma32(c3, b, c2)), u, c1 * b)   # e^b − 1
        near = _fma32(k, j, k)
        g = np.where(n <= 0, np.int32(-0x7E000000), np.int32(0))           # 0x82000000: the scaled path's sign
        s1 = (g + np.int32(0x7F000000)).view(np.float32)
        s2 = (e - g).view(np.float32)
        scaled = _fma32(s2, j, s2) * s1                                    # |n| > 126: 2^n in two factors
        far = s1 * s1                                                      # |n| > 192: inf or 0
    return np.where(np.abs(n) > 192, far, np.where(np.abs(n) > 126, scaled, near)).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU x / (1 + e^(−x)) of float32 rows as ggml's AVX2 ggml_vec_silu_f32 / ggml_vec_swiglu_f32 compute each row
    (the last axis): eight at a time with `ggml_expf`, the row's last n mod 8 with the C library's expf (here float64's
    e^x rounded: glibc's is within 0.502 ulp of it). SwiGLU is silu(g)·u, one float32 product."""
    x = np.asarray(x, np.float32)
    vec = x.shape[-1] - x.shape[-1] % 8
    out = np.empty_like(x)
    with np.errstate(over="ignore"):
        out[..., :vec] = x[..., :vec] / (np.float32(1) + ggml_expf(-x[..., :vec]))
        tail = x[..., vec:]
        out[..., vec:] = tail / (np.float32(1) + np.exp(-tail.astype(np.float64)).astype(np.float32))
    return out


def rope_cos_sin(positions: np.ndarray, d_rot: int, theta: float, interleaved: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of RoPE's angles as ggml makes them (ggml_rope_cache_init, no scaling): s = powf(θ, −2/d) in
    float32, the angles p, p·s, (p·s)·s, … each product rounded to float32 (not p·θ^(−2i/d)), then cosf and sinf
    (correctly rounded: float64's cos of the float32 angle, rounded). Laid out for rotate-half pairs (i, i + d/2),
    as qkv turns them (the converter's interleaved Q/K rows undone), or INTERLEAVED pairs (2i, 2i + 1) as
    core.positions.rope_cos_sin lays them: (B, 1, n, d_rot) each, positions (B, n)."""
    s = np.float32(np.float64(np.float32(theta)) ** np.float64(np.float32(-2.0) / np.float32(d_rot)))
    angles = np.empty((*positions.shape, d_rot // 2), np.float32)                # (B, n, d/2)
    angle = positions.astype(np.float32)                                          # (B, n)
    for i in range(d_rot // 2):
        angles[..., i] = angle
        angle = angle * s                                                         # float32, one rounding a step
    both = (np.repeat(angles, 2, axis=-1) if interleaved
            else np.concatenate([angles, angles], axis=-1)).astype(np.float64)   # (B, n, d)
    return np.cos(both).astype(np.float32)[:, None], np.sin(both).astype(np.float32)[:, None]
