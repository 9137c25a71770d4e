"""The float32 steps of the compiled one-token step (core/step_compiled.py), each the readable step's to the bit
where NumPy's own order can be followed: np.add.reduce's pairwise sums (`pairwise32`, `pairwise64`), NumPy's
float32 exp (`exp32`), the activations of ops.ACTIVATIONS (`act`), RMSNorm and LayerNorm (`norm_of`), and the
scores' dot products and the weighted sum of V in attention.one_query_dots' and one_query_sum's orders (`dots`,
`weigh`). numba code: compiled where first called, kept on disk with the layers that call it
(runtime.kernel_cache)."""

from __future__ import annotations

import math

import numpy as np

from ..runtime.kernel_cache import named as _named
from ..runtime.llama_arith import GGML_EXPF
from .ops import _ERF_ALPHA, _ERF_BETA

try:
    from numba import njit
except ImportError:                                   # no numba: nothing here is used (step_compiled.refusal)
    njit = None

ERF_ALPHA = np.array(_ERF_ALPHA, np.float32)          # ops.erf's coefficients, as its float32 arrays hold them
ERF_BETA = np.array(_ERF_BETA, np.float32)
TANH_A = np.float32(-2.0 * math.sqrt(2.0 / math.pi) * 0.044715)   # ops.gelu_tanh's two constants
TANH_B = np.float32(2.0 * math.sqrt(2.0 / math.pi))
SQRT_HALF = np.float32(1.0 / math.sqrt(2.0))                       # ops.gelu's 1/√2


def _pairwise_of(kind):
    """The sum of a[0:n] in np.add.reduce's order, its partial sums in KIND (np.float32, or np.float64 for a sum of
    float32 numbers in float64): NumPy's pairwise summation. A block of n ≤ 128 is summed in eight accumulators
    r[i % 8], added ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the last n % 8 one by one (n < 8: one
    by one); a longer one is split at n₂ = n/2 rounded down to a multiple of 8, each half summed so and the two
    added — here with a stack instead of recursion (tests/test_step_compiled.py: bit-equal to np.add.reduce)."""

    @njit(inline="always")
    def block(a, lo, n):
        if n < 8:
            res = kind(a[lo])
            for i in range(lo + 1, lo + n):
                res += kind(a[i])
            return res
        r0, r1, r2, r3 = kind(a[lo]), kind(a[lo + 1]), kind(a[lo + 2]), kind(a[lo + 3])
        r4, r5, r6, r7 = kind(a[lo + 4]), kind(a[lo + 5]), kind(a[lo + 6]), kind(a[lo + 7])
        end = lo + n - n % 8
        for i in range(lo + 8, end, 8):
            r0 += kind(a[i])
            r1 += kind(a[i + 1])
            r2 += kind(a[i + 2])
            r3 += kind(a[i + 3])
            r4 += kind(a[i + 4])
            r5 += kind(a[i + 5])
            r6 += kind(a[i + 6])
            r7 += kind(a[i + 7])
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for i in range(end, lo + n):
            res += kind(a[i])
        return res

    def pairwise(a, n):
        if n <= 128:
            return block(a, 0, n)
        los = np.empty(64, np.int64)                   # the stack of blocks: start, length, halves done
        ns = np.empty(64, np.int64)
        done = np.zeros(64, np.int64)
        sums = np.empty(64, np.float64)                # their sums (a float32 sum is exact in float64)
        top, k = 0, 0
        los[0], ns[0] = 0, n
        while top >= 0:
            lo, m = los[top], ns[top]
            if m <= 128:
                sums[k] = block(a, lo, m)
                k += 1
                top -= 1
                continue
            half = m // 2
            half -= half % 8
            if done[top] == 2:                         # both halves summed: add them, as NumPy's + does
                sums[k - 2] = kind(kind(sums[k - 2]) + kind(sums[k - 1]))
                k -= 1
                top -= 1
                continue
            done[top] += 1
            top += 1
            los[top], ns[top], done[top] = (lo, half, 0) if done[top - 1] == 1 else (lo + half, m - half, 0)
        return kind(sums[0])

    return njit(_named(pairwise, f"pairwise_{np.dtype(kind).name}"))


if njit is not None:
    pairwise32 = _pairwise_of(np.float32)              # np.add.reduce of float32 numbers
    pairwise64 = _pairwise_of(np.float64)              # … of float32 numbers widened to float64 (ggml's Σx²)


# NumPy's float32 exp (its AVX2 / AVX-512 kernel, numpy/_core/src/umath: simd_exp_f32), step by step: k = rint(x·log₂e),
# y = x − k·ln 2 in two parts (Cody–Waite, fused multiply-adds), exp(x) = 2^k·P(y)/Q(y), P of degree 5 and Q of 2.
_EXP_LOG2E = np.float32(1.442695040888963407359924681001892137)
_EXP_LN2 = (np.float32(-6.93145752e-1), np.float32(-1.42860677e-6))
_EXP_P = tuple(np.float32(c) for c in (9.999999999980870924916e-01, 7.257664613233124478488e-01,
                                       2.473615434895520810817e-01, 5.114512081637298353406e-02,
                                       6.757896990527504603057e-03, 5.082762527590693718096e-04))
_EXP_Q = tuple(np.float32(c) for c in (1.0, -2.742335390411667452936e-01, 2.159509375685829852307e-02))
_EXP_RANGE = (np.float32(-103.97208404541015625), np.float32(88.72283935546875))
_RINT = np.float32(12582912.0)                         # 1.5·2²³: (v + it) − it rounds v to an integer, ties to even

if njit is not None:
    from ..runtime.llama_simd import fma1

    @njit
    def exp32(x):
        """e^x of a float32 as np.exp computes it where it has its AVX2 / AVX-512 kernel (bit for bit; elsewhere
        NumPy takes the C library's expf, within 3 ulp of this). Never inlined into fastmath code: its steps are
        its own (LLVM keeps each instruction's flags)."""
        if x != x:
            return x
        if x >= _EXP_RANGE[1]:
            return np.float32(np.inf)
        if x <= _EXP_RANGE[0]:
            return np.float32(0)
        k = (x * _EXP_LOG2E + _RINT) - _RINT
        y = fma1(k, _EXP_LN2[1], fma1(k, _EXP_LN2[0], x))
        p, q = _EXP_P, _EXP_Q
        num = fma1(fma1(fma1(fma1(fma1(p[5], y, p[4]), y, p[3]), y, p[2]), y, p[1]), y, p[0])
        den = fma1(fma1(q[2], y, q[1]), y, q[0])
        return np.float32(np.float64(num / den) * 2.0 ** int(k))   # × 2^k rounded once (subnormals too)


if njit is not None:
    @njit
    def dots(qkv, b, at, g, kc, m, dk, s):
        """s_j = q·K_g[j] of the query at column AT of row b, as attention.one_query_dots defines it: each product
        rounded to float32, added in the order of d_k (no fused multiply-add); eight keys side by side."""
        for j0 in range(0, m - m % 8, 8):
            a0 = qkv[b, at] * kc[b, g, j0, 0]
            a1 = qkv[b, at] * kc[b, g, j0 + 1, 0]
            a2 = qkv[b, at] * kc[b, g, j0 + 2, 0]
            a3 = qkv[b, at] * kc[b, g, j0 + 3, 0]
            a4 = qkv[b, at] * kc[b, g, j0 + 4, 0]
            a5 = qkv[b, at] * kc[b, g, j0 + 5, 0]
            a6 = qkv[b, at] * kc[b, g, j0 + 6, 0]
            a7 = qkv[b, at] * kc[b, g, j0 + 7, 0]
            for i in range(1, dk):
                q = qkv[b, at + i]
                a0 += q * kc[b, g, j0, i]
                a1 += q * kc[b, g, j0 + 1, i]
                a2 += q * kc[b, g, j0 + 2, i]
                a3 += q * kc[b, g, j0 + 3, i]
                a4 += q * kc[b, g, j0 + 4, i]
                a5 += q * kc[b, g, j0 + 5, i]
                a6 += q * kc[b, g, j0 + 6, i]
                a7 += q * kc[b, g, j0 + 7, i]
            s[j0], s[j0 + 1], s[j0 + 2], s[j0 + 3] = a0, a1, a2, a3
            s[j0 + 4], s[j0 + 5], s[j0 + 6], s[j0 + 7] = a4, a5, a6, a7
        for j in range(m - m % 8, m):
            acc = qkv[b, at] * kc[b, g, j, 0]
            for i in range(1, dk):
                acc += qkv[b, at + i] * kc[b, g, j, i]
            s[j] = acc

    @njit
    def weigh(a, vc, b, g, m, z, at, dk):
        """z[b, at:at + d_k] = Σ_j a_j·V_g[j] as attention.one_query_sum defines it: each product rounded to
        float32, the keys added in their order (no fused multiply-add)."""
        if m == 0:
            return
        for i in range(dk):
            z[b, at + i] = a[0] * vc[b, g, 0, i]
        for j in range(1, m):
            for i in range(dk):
                z[b, at + i] += a[j] * vc[b, g, j, i]

    @njit
    def one_query_dots(q, k, s):
        """attention.one_query_dots with `dots`: q (B, Hkv·G·d_k), k (B, Hkv, m, d_k) → s (B, Hkv·G, m)."""
        B, Hkv, m, dk = k.shape
        G = q.shape[1] // (Hkv * dk)
        for b in range(B):
            for h in range(Hkv * G):
                dots(q, b, h * dk, h // G, k, m, dk, s[b, h])

    @njit
    def one_query_sum(a, v, z):
        """attention.one_query_sum with `weigh`: a (B, Hkv·G, m), v (B, Hkv, m, d_k) → z (B, Hkv·G·d_k)."""
        B, Hkv, m, dk = v.shape
        G = a.shape[1] // Hkv
        for b in range(B):
            for h in range(Hkv * G):
                weigh(a[b, h], v, b, h // G, m, z, h * dk, dk)


# ggml's float32 e^x (llama_arith.ggml_expf: its AVX2 ggml_v_expf), for llama.cpp arithmetic's SiLU: its constants.
_G_R, _G_LOG2E, _G_LN2, _G_C = (GGML_EXPF[k] for k in ("r", "log2e", "ln2", "c"))
GGML_SILU = 5                      # act's code of ggml's SiLU, step_compiled.GGML_SILU (+ 1: a row's last n mod 8)

if njit is not None:
    @njit(inline="always")
    def ggml_expf(x):
        """e^x of a float32 as llama_arith.ggml_expf, its 2^n and the scaled path's two factors by ldexp (exact)."""
        if x != x:
            return x
        z = fma1(x, _G_LOG2E, _G_R)
        n = z - _G_R
        b = fma1(-n, _G_LN2[1], fma1(-n, _G_LN2[0], x))
        u = b * b
        j = fma1(fma1(fma1(_G_C[4], b, _G_C[3]), u, fma1(_G_C[2], b, _G_C[1])), u, _G_C[0] * b)
        if abs(n) > 192:
            return np.float32(np.inf) if n > 0 else np.float32(0)
        if abs(n) > 126:                                  # 2^n as two factors, as ggml's s1 and s2
            s1 = np.float32(2.0 ** -125) if n <= 0 else np.float32(2.0 ** 127)
            s2 = np.float32(math.ldexp(1.0, int(n) + (125 if n <= 0 else -127)))
            return fma1(s2, j, s2) * s1
        k = np.float32(math.ldexp(1.0, int(n)))
        return fma1(k, j, k)

    @njit(inline="always")
    def act(no, v):
        """ops.ACTIVATIONS' activation NO (its place in step_compiled.ACTS; GGML_SILU, + 1: llama.cpp arithmetic's) of
        one float32 number, in its float32 steps (its exp NumPy's: `exp32`)."""
        if no == 0:                                       # SiLU: v / (1 + e^(−v))
            return v / (np.float32(1) + exp32(-v))
        if no == 1:                                       # GELU: ½v(1 + erf(v/√2)), ops.erf's rational form
            c = min(max(v * np.float32(SQRT_HALF), np.float32(-4)), np.float32(4))
            c2 = c * c
            p, q = ERF_ALPHA[0], ERF_BETA[0]
            for k in range(1, ERF_ALPHA.shape[0]):
                p = p * c2 + ERF_ALPHA[k]
            for k in range(1, ERF_BETA.shape[0]):
                q = q * c2 + ERF_BETA[k]
            return (np.float32(0.5) * v) * (np.float32(1) + (c * p) / q)
        if no == 2:                                       # GELU (tanh): v / (1 + e^(−2u)), ops.gelu_tanh's steps
            e = ((v * v) * TANH_A - TANH_B) * v           # −2u = −2√(2/π)(1 + 0.044715v²)·v
            return v / (exp32(e) + np.float32(1))
        if no == 3:                                       # ReLU
            return max(v, np.float32(0))
        if no == GGML_SILU:                               # llama.cpp arithmetic: ggml's SiLU (llama_arith.silu)
            return v / (np.float32(1) + ggml_expf(-v))
        if no == GGML_SILU + 1:                           # the same, a row's last n mod 8: the C library's expf
            return v / (np.float32(1) + np.float32(math.exp(-np.float64(v))))
        r = max(v, np.float32(0))                         # ReLU²
        return r * r


def norm_of(ggml: bool):
    """The compiled norms of an arithmetic: norm(layer_norm, src, b, at, n, γ, β, eps, dst, dt)."""

    def norm(layer_norm, src, b, at, n, g, beta, eps, dst, dt):
        """The norm of src[b, at:at + n] into dst[b, dt:dt + n] (in place when the same), as the readable step's
        float32 steps: RMSNorm x / √(Σx²/n + eps)·γ (llama.cpp arithmetic: ggml's, Σx² in float64, x·(1/√…)·γ),
        or (LAYER_NORM) LayerNorm (x − μ) / √(Σ(x − μ)²/n + eps)·γ + β; each Σ np.add.reduce's (`_pairwise_of`)."""
        t = np.empty(n, np.float32)
        if layer_norm:
            for i in range(n):
                t[i] = src[b, at + i]
            mean = np.float32(np.float64(pairwise32(t, n)) / n)
            for i in range(n):
                c = src[b, at + i] - mean
                t[i] = c * c
            var = np.float32(np.float64(pairwise32(t, n)) / n)
            root = np.float32(math.sqrt(var + eps))
            for i in range(n):
                y = ((src[b, at + i] - mean) / root) * g[i]
                dst[b, dt + i] = y + beta[i] if beta.shape[0] > 0 else y
            return
        for i in range(n):
            v = src[b, at + i]
            t[i] = v * v
        if ggml:
            mean = np.float32(pairwise64(t, n) / n)
            rr = np.float32(1) / np.float32(math.sqrt(np.float32(mean + eps)))
            for i in range(n):
                dst[b, dt + i] = (src[b, at + i] * rr) * g[i]
        else:
            mean = np.float32(np.float64(pairwise32(t, n)) / n)
            root = np.float32(math.sqrt(np.float32(mean + eps)))
            for i in range(n):
                dst[b, dt + i] = (src[b, at + i] / root) * g[i]

    return njit(_named(norm, "norm_ggml" if ggml else "norm_exact"))


if njit is not None:
    from pathlib import Path

    from ..runtime import kernel_cache
    kernel_cache.keep([one_query_dots, one_query_sum], [Path(__file__)])       # the readable step calls them
