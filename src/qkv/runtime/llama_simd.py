"""ggml's eight lanes as values in numba code: what the kernels of llama.cpp's arithmetic (`llama_kernels`) hold
in registers.

A block's 32 weights and its 32 quantised activations are each an LLVM <32 x i8> (`I8x32`); their products,
summed 4 consecutive at a time, are the 8 integer lanes of ggml's AVX2 dot products, an <8 x i32> (`I32x8`);
each lane's float32 accumulator is an <8 x float> (`F32x8`). As in `simd`, a value of these types is a local
variable LLVM keeps in registers, each operation below a few vector instructions (`dot`: vpsignb ×2 and
vpdpbusd with AVX-512 VNNI, or vpmaddubsw and vpmaddwd with AVX2, as ggml multiplies; `fma8`: vcvtdq2ps and
vfmadd231ps), where scalar code per lane ran at a tenth of the speed.

    bytes32(a)              the 32 bytes a[0:32] (int8 or uint8)
    nibbles32(a)            a Q4 block's 16 bytes a[0:16] as its 32 integers: low nibbles (weights 0–15), then high
    hbits32(h)              bit j of the uint32 h at bit 4 of byte j (a Q5 block's fifth bits)
    field32(a, s, m, up)    ((a[j] >> s) & m) << up for the 32 bytes a[0:32] (uint8): K-quants' nibbles and bits
    bor(a, b), bsub(a, k)   a | b;  a − k in each byte          bstore(v, out)   out[0:32] = v (int8)
    dot(w, x)               lane k = Σ_{j<4} w[4k + j]·x[4k + j], signed bytes, exact (|Σ| ≤ 4·128·127)
    udot(w, x)              the same for unsigned weights below 128 (no sign trick)
    sdot(w, x, s0, s1)      udot's lanes times s0 (lanes 0–3) and s1 (4–7): the K-quants' sub-block scales
    lzero(), ladd(a, b), lsub(a, b), lscale(a, s)       0; a + b; a − b; a·s (s an int32)
    lpairsums(bs, sc)       lane k = bs[2k]·sc[2k] + bs[2k + 1]·sc[2k + 1] (bs int32 [16], sc int8 [16]: Q6_K)
    lmins(bs, mn)           lane i = mn[i]·(bs[2i] + bs[2i + 1]) (mn uint8 [8]: Q4_K/Q5_K's mins)
    lhalves(a)              lanes 0–3: a[2k] + a[2k + 1]; lanes 4–7: 0       lsum(a)   Σ lanes (int32)
    lstore(a, out)          out[0:8] = a (int32)
    lrows(a0, …, a7)        lane j = Σ lanes of a_j: eight rows' lanes to one whole sum a row (the repacked Q4_0)
    lsplat(k)               k in each lane (an int32)       llane(a, k)   lane k (an int32)
    fzero()                 0 in the 8 float32 lanes
    fvec(s0, …, s7)         the 8 float32s as lanes          fscale(v, s)   v·s in each lane (one rounding)
    fhalves(h0, …, h7)      the 8 float16s whose bits are the uint16s h_k, as float32 lanes (exact; F16C: vcvtph2ps)
    fmav(acc, v, lanes)     acc_k ← fma(v_k, fp32(lane_k), acc_k): a scale a lane     flane(v, k)   lane k
    fma8(acc, s, lanes)     acc_k ← fma(s, fp32(lane_k), acc_k), rounded once: the definition's fused multiply-add
                            (llama_arith._fma32);  fma1(a, b, c): the same of three float32s
    hsum8(acc)              ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) in float32: ggml's hsum_float_8
    hsum4(acc)              (l0 + l2) + (l1 + l3): Q4_K's four lanes of mins
    half_round(v)           float32 → the nearest float16 → float32, by the machine's conversion (F16C)

Integer operations are exact (the sums stay far below 2³¹); the float operations are the definition's, in its
order.

One rounding. The definition's step is a fused multiply-add (llama_arith._fma32: a·b + c rounded once, as
vfmadd231ps rounds it), so the kernels take the machine's own: one instruction a block. (An earlier definition
rounded the float64 sum to float32, twice, and the kernels had to test each lane for where that equals one
rounding: ~20 % of a block's work, and not what ggml computes.)

Each function reads its array from its first element: the kernels pass contiguous slices. `prefetch(a)` asks
for a[0]'s cache line ahead of its use.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from .simd import first, splat, vector_type

_I8, _I16, _I32, _F32, _F64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType(), ir.DoubleType()
_B32 = ir.VectorType(_I8, 32)                      # <32 x i8>   a block's integers
_L8 = ir.VectorType(_I32, 8)                       # <8 x i32>   the integer lanes
_F8 = ir.VectorType(_F32, 8)                       # <8 x float> the lanes' accumulators


i8x32 = vector_type("I8x32", _B32)
i32x8 = vector_type("I32x8", _L8)
f32x8 = vector_type("F32x8", _F8)


def _load(context, builder, arytype, ary, n: int) -> ir.Value:
    """The <n x i8> at the array's first element (alignment 1: slices start anywhere)."""
    return first(context, builder, arytype, ary, _I8, n)


def _pick(builder, v: ir.Value, at: list[int]) -> ir.Value:
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, len(at)), at))


def _pairs(builder, v: ir.Value) -> ir.Value:
    """<2n x T> → <n x T>: each even element plus the next."""
    n = v.type.count // 2
    return builder.add(_pick(builder, v, list(range(0, 2 * n, 2))), _pick(builder, v, list(range(1, 2 * n, 2))))


@intrinsic
def bytes32(typingctx, a):
    def codegen(context, builder, sig, args):
        return _load(context, builder, sig.args[0], args[0], 32)
    return i8x32(a), codegen


@intrinsic
def nibbles32(typingctx, a):
    def codegen(context, builder, sig, args):
        v = _load(context, builder, sig.args[0], args[0], 16)
        lo = builder.and_(v, ir.Constant(v.type, [15] * 16))
        hi = builder.lshr(v, ir.Constant(v.type, [4] * 16))
        return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
    return i8x32(a), codegen


@intrinsic
def hbits32(typingctx, h):
    def codegen(context, builder, sig, args):
        word = splat(builder, builder.trunc(args[0], _I32), 32)
        at, one = ir.Constant(word.type, list(range(32))), ir.Constant(word.type, [1] * 32)
        bits = builder.and_(builder.lshr(word, at), one)
        return builder.shl(builder.trunc(bits, _B32), ir.Constant(_B32, [4] * 32))
    return i8x32(types.uint32), codegen


@intrinsic
def field32(typingctx, a, shift, mask, up):
    def codegen(context, builder, sig, args):
        v = _load(context, builder, sig.args[0], args[0], 32)
        s, m, u = (splat(builder, builder.trunc(x, _I8), 32) for x in args[1:])
        return builder.shl(builder.and_(builder.lshr(v, s), m), u)
    return i8x32(a, types.intp, types.intp, types.intp), codegen


@intrinsic
def bstore(typingctx, v, a):
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[1])(context, builder, args[1]).data
        builder.store(args[0], builder.bitcast(data, _B32.as_pointer()), align=1)
        return context.get_dummy_value()
    return types.void(i8x32, a), codegen


@intrinsic
def bor(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.or_(args[0], args[1])
    return i8x32(i8x32, i8x32), codegen


@intrinsic
def bsub(typingctx, a, k):
    def codegen(context, builder, sig, args):
        return builder.sub(args[0], splat(builder, builder.trunc(args[1], _I8), 32))
    return i8x32(i8x32, types.intp), codegen


# How `dot`, `udot` and `sdot` multiply: what the machine does best, chosen once (numba compiles for this CPU;
# the kernel cache keys its files by the CPU too). Each gives the same exact integers (tests/test_llama_kernels.py
# compiles all three here).
#   vnni     AVX-512 VNNI / AVX-VNNI: vpdpbusd, 4 unsigned × signed byte products summed in an int32 lane
#   avx2     vpmaddubsw (pairs of unsigned × signed bytes in int16: no saturation, |pair| ≤ 2·128·127), then
#            vpmaddwd (pairs of those in int32, times 1 or a sub-block's scale) — ggml's AVX2 path
#   generic  int16 products and pairwise sums in plain LLVM vectors (any machine)
# A signed weight goes through the unsigned × signed products by ggml's sign trick: |w| · (x with w's sign).


def _features() -> str:
    import platform

    import llvmlite.binding as ll
    from numba import config

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ""
    return config.CPU_FEATURES if config.CPU_FEATURES is not None else ll.get_host_cpu_features().flatten()


def _multiply() -> str:
    have = set(_features().split(","))
    if "+avxvnni" in have or {"+avx512vnni", "+avx512vl"} <= have:
        return "vnni"
    return "avx2" if "+avx2" in have else "generic"


MULTIPLY = _multiply()


def _call(builder, name: str, ret: ir.Type, args: list) -> ir.Value:
    fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(ret, [a.type for a in args]))
    return builder.call(fn, args)


_I16x16 = ir.VectorType(_I16, 16)


def _lanes(builder, how: str, w: ir.Value, x: ir.Value, scales: ir.Value | None) -> ir.Value:
    """Lane k = Σ_{j<4} w[4k + j]·x[4k + j] (·scales[k]), w unsigned bytes (below 128) and x signed."""
    if how == "vnni" and scales is None:
        return _call(builder, "llvm.x86.avx512.vpdpbusd.256", _L8, [ir.Constant(_L8, [0] * 8), w, x])
    if how in ("vnni", "avx2"):
        pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _I16x16, [w, x])
        by = ir.Constant(_I16x16, [1] * 16) if scales is None else scales
        return _call(builder, "llvm.x86.avx2.pmadd.wd", _L8, [pairs, by])
    w16, x16 = builder.zext(w, ir.VectorType(_I16, 32)), builder.sext(x, ir.VectorType(_I16, 32))
    two = _pairs(builder, builder.sext(builder.mul(w16, x16), ir.VectorType(_I32, 32)))        # <16 x i32>
    if scales is not None:
        two = builder.mul(two, builder.sext(scales, ir.VectorType(_I32, 16)))
    return _pairs(builder, two)


def _signed(builder, how: str, w: ir.Value, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(|w|, x with w's sign; 0 where w is 0): unsigned × signed products of the same sums."""
    if how != "generic":
        return (_call(builder, "llvm.x86.avx2.psign.b", _B32, [w, w]),
                _call(builder, "llvm.x86.avx2.psign.b", _B32, [x, w]))
    zero = ir.Constant(_B32, [0] * 32)
    negative = builder.icmp_signed("<", w, zero)
    return (builder.select(negative, builder.sub(zero, w), w),
            builder.select(negative, builder.sub(zero, x), builder.select(builder.icmp_signed("==", w, zero), zero, x)))


def _dot(how: str):
    @intrinsic
    def dot(typingctx, w, x):
        """Lane k = Σ_{j<4} w[4k + j]·x[4k + j], w and x signed bytes."""
        def codegen(context, builder, sig, args):
            return _lanes(builder, how, *_signed(builder, how, *args), None)
        return i32x8(i8x32, i8x32), codegen
    return dot


def _udot(how: str):
    @intrinsic
    def udot(typingctx, w, x):
        """The same for unsigned weights below 128 (Q4_1, Q5_1): no sign trick."""
        def codegen(context, builder, sig, args):
            return _lanes(builder, how, args[0], args[1], None)
        return i32x8(i8x32, i8x32), codegen
    return udot


def _sdot(how: str):
    @intrinsic
    def sdot(typingctx, w, x, s0, s1):
        """Lane k = (s0 for k < 4, else s1)·Σ_{j<4} w[4k + j]·x[4k + j], w unsigned below 128 (the K-quants' sub-block
        scales, |s| < 2¹⁵, applied to the int16 pairs as ggml does)."""
        def codegen(context, builder, sig, args):
            a, b = (splat(builder, builder.trunc(s, _I16), 16) for s in args[2:])
            scales = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, 16), [*range(8), *range(16, 24)]))
            return _lanes(builder, how, args[0], args[1], scales)
        return i32x8(i8x32, i8x32, types.int32, types.int32), codegen
    return sdot


dot, udot, sdot = _dot(MULTIPLY), _udot(MULTIPLY), _sdot(MULTIPLY)


@intrinsic
def lzero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_L8, [0] * 8)
    return i32x8(), codegen


@intrinsic
def ladd(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.add(args[0], args[1])
    return i32x8(i32x8, i32x8), codegen


@intrinsic
def lsub(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.sub(args[0], args[1])
    return i32x8(i32x8, i32x8), codegen


@intrinsic
def lscale(typingctx, a, s):
    def codegen(context, builder, sig, args):
        return builder.mul(args[0], splat(builder, builder.trunc(args[1], _I32), 8))
    return i32x8(i32x8, types.int32), codegen


@intrinsic
def lpairsums(typingctx, bs, sc):
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        b = builder.load(builder.bitcast(data, ir.VectorType(_I32, 16).as_pointer()), align=4)
        s = builder.sext(_load(context, builder, sig.args[1], args[1], 16), ir.VectorType(_I32, 16))
        return _pairs(builder, builder.mul(b, s))
    return i32x8(bs, sc), codegen


@intrinsic
def lmins(typingctx, bs, mn):
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        b = builder.load(builder.bitcast(data, ir.VectorType(_I32, 16).as_pointer()), align=4)
        m = builder.zext(_load(context, builder, sig.args[1], args[1], 8), _L8)
        return builder.mul(_pairs(builder, b), m)
    return i32x8(bs, mn), codegen


@intrinsic
def lhalves(typingctx, a):
    def codegen(context, builder, sig, args):
        four = _pairs(builder, args[0])                                             # <4 x i32>
        return builder.shuffle_vector(four, ir.Constant(four.type, [0] * 4), ir.Constant(_L8, list(range(8))))
    return i32x8(i32x8), codegen


@intrinsic
def lsum(typingctx, a):
    def codegen(context, builder, sig, args):
        v = args[0]
        while v.type.count > 1:
            v = _pairs(builder, v)
        return builder.extract_element(v, ir.Constant(_I32, 0))
    return types.int32(i32x8), codegen


@intrinsic
def lstore(typingctx, v, a):
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[1])(context, builder, args[1]).data
        builder.store(args[0], builder.bitcast(data, _L8.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(i32x8, a), codegen


@intrinsic
def lrows(typingctx, a0, a1, a2, a3, a4, a5, a6, a7):
    def codegen(context, builder, sig, args):
        def pairs(u, v, first_half, second_half):                  # u, v lanes picked twice and added
            pick = [builder.shuffle_vector(u, v, ir.Constant(_L8, at)) for at in (first_half, second_half)]
            return builder.add(*pick)
        one = [pairs(args[i], args[i + 1], [0, 8, 2, 10, 4, 12, 6, 14], [1, 9, 3, 11, 5, 13, 7, 15])
               for i in range(0, 8, 2)]                            # [a_i 0+1, a_i+1 0+1, a_i 2+3, …]
        two = [pairs(one[i], one[i + 1], [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])
               for i in (0, 2)]                                    # [a_i..i+3 lanes 0–3, then lanes 4–7]
        return pairs(two[0], two[1], [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])
    return i32x8(*[i32x8] * 8), codegen


@intrinsic
def lsplat(typingctx, k):
    def codegen(context, builder, sig, args):
        return splat(builder, builder.trunc(args[0], _I32), 8)
    return i32x8(types.intp), codegen


@intrinsic
def fhalves(typingctx, h0, h1, h2, h3, h4, h5, h6, h7):
    def codegen(context, builder, sig, args):
        v = ir.Constant(ir.VectorType(_I16, 8), ir.Undefined)
        for k, h in enumerate(args):
            v = builder.insert_element(v, builder.trunc(h, _I16), ir.Constant(_I32, k))
        return builder.fpext(builder.bitcast(v, ir.VectorType(ir.HalfType(), 8)), _F8)
    return f32x8(*[types.uint16] * 8), codegen


@intrinsic
def fvec(typingctx, s0, s1, s2, s3, s4, s5, s6, s7):
    def codegen(context, builder, sig, args):
        v = ir.Constant(_F8, ir.Undefined)
        for k, s in enumerate(args):
            v = builder.insert_element(v, s, ir.Constant(_I32, k))
        return v
    return f32x8(*[types.float32] * 8), codegen


@intrinsic
def fscale(typingctx, v, s):
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], splat(builder, args[1], 8))
    return f32x8(f32x8, types.float32), codegen


@intrinsic
def fmav(typingctx, acc, v, lanes):
    """acc_k ← fma(v_k, fp32(lane_k), acc_k), rounded once (llvm.fma: vfmadd231ps)."""
    def codegen(context, builder, sig, args):
        acc, v, lanes = args
        return _call(builder, "llvm.fma.v8f32", _F8, [v, builder.sitofp(lanes, _F8), acc])
    return f32x8(f32x8, f32x8, i32x8), codegen


def _lane_of(vector, element):
    @intrinsic
    def lane(typingctx, v, k):
        """Lane k of V (a VECTOR of ELEMENTs)."""
        def codegen(context, builder, sig, args):
            return builder.extract_element(args[0], builder.trunc(args[1], _I32))
        return element(vector, types.intp), codegen
    return lane


llane, flane = _lane_of(i32x8, types.int32), _lane_of(f32x8, types.float32)


@intrinsic
def fzero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_F8, [0.0] * 8)
    return f32x8(), codegen


@intrinsic
def hsum8(typingctx, acc):
    def codegen(context, builder, sig, args):
        v = args[0]
        four = builder.fadd(_pick(builder, v, [0, 1, 2, 3]), _pick(builder, v, [4, 5, 6, 7]))   # l0+l4 … l3+l7
        two = builder.fadd(_pick(builder, four, [0, 1]), _pick(builder, four, [2, 3]))          # (l0+l4)+(l2+l6), …
        return builder.fadd(builder.extract_element(two, ir.Constant(_I32, 0)),
                            builder.extract_element(two, ir.Constant(_I32, 1)))
    return types.float32(f32x8), codegen


@intrinsic
def hsum4(typingctx, acc):
    def codegen(context, builder, sig, args):
        v = args[0]
        two = builder.fadd(_pick(builder, v, [0, 1]), _pick(builder, v, [2, 3]))                # l0+l2, l1+l3
        return builder.fadd(builder.extract_element(two, ir.Constant(_I32, 0)),
                            builder.extract_element(two, ir.Constant(_I32, 1)))
    return types.float32(f32x8), codegen


@intrinsic
def prefetch(typingctx, a):
    """Ask for a[0]'s cache line ahead of its use (llvm.prefetch: read, keep in all levels); no effect on values."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(data, ir.IntType(8).as_pointer())
        fn = builder.module.declare_intrinsic("llvm.prefetch", [ptr.type],
                                              ir.FunctionType(ir.VoidType(), [ptr.type, _I32, _I32, _I32]))
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return types.void(a), codegen


@intrinsic
def fma8(typingctx, acc, s, lanes):
    """acc_k ← fma(s, fp32(lane_k), acc_k): one rounding (llvm.fma: vfmadd231ps), the definition's `_fma32`."""
    def codegen(context, builder, sig, args):
        acc, s, lanes = args
        return _call(builder, "llvm.fma.v8f32", _F8, [splat(builder, s, 8), builder.sitofp(lanes, _F8), acc])
    return f32x8(f32x8, types.float32, i32x8), codegen


@intrinsic
def fma1(typingctx, a, b, c):
    """a·b + c of three float32s rounded once (llvm.fma.f32: vfmadd231ss)."""
    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.fma.f32", _F32, list(args))
    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def half_round(typingctx, v):
    """The float32 V rounded to the nearest float16 (ties to even, subnormals and overflow as float16's) and back:
    the machine's conversion (x86 F16C: vcvtps2ph, vcvtph2ps), where it has one (llama_kernels._fp16)."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), _F32)
    return types.float32(types.float32), codegen
