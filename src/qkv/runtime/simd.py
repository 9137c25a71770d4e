"""Sixteen float32 lanes as one value in numba code: what the stored-weight kernels (`stored_kernels`) add up in.

numba's arrays live in memory, so a kernel that sums a block's products into an array of lanes loads and
stores those lanes at every block (LLVM cannot prove the array aliases nothing), and a kernel that sums each
block to one number pays a horizontal add per block that stops LLVM's vectoriser. `F32x16` is an LLVM
vector <16 x float> held in a local variable: LLVM keeps it in registers (two on AVX2, one on AVX-512, four
on NEON; LLVM lowers it for whatever the machine has), and each operation below is one vector operation.

    vzero()             0 in every lane               vload(a)      a[0:16] (float32, contiguous)
    vstore(v, a)        a[0:16] = v
    vsplat(s)           s in every lane               vsum(v)       Σ lanes → float32
    vadd(a, b)          a + b                         vmul(a, b)    a · b
    vfma(a, b, c)       a · b + c (one FMA where the machine has it)
    field(a, shift, mask)   float((a[j] >> shift) & mask) for the 16 bytes a[0:16] (uint8): nibbles, bits
    int8s(a)                float(a[j]) for the 16 signed bytes a[0:16] (int8)
    bits32(h, shift)        float((h >> (shift + j)) & 1) for j = 0..15 of one uint32 h (Q5_0/Q5_1's fifth bits)
    as_float32(u)           the float32 whose bits are the uint32 u (a bitcast: 16-bit floats widened in place)

The conversions from bytes are exact (small integers); the sums are float32 sums in another order than a
plain loop's (within rounding, as numba's fastmath "reassoc" allows: NaN and infinity keep their meaning).
Each function reads its array from its first element: the kernels pass contiguous slices of 16 numbers.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic, models, register_model

LANES = 16
_F32, _I8, _I32 = ir.FloatType(), ir.IntType(8), ir.IntType(32)
_VF = ir.VectorType(_F32, LANES)                    # <16 x float>
_FLAGS = ("reassoc", "contract")                    # reorder and fuse sums; NaN and infinity kept


def vector_type(name: str, llvm: ir.Type) -> types.Type:
    """A numba type NAME whose values are the LLVM vector LLVM (kept in registers): F32x16 here, llama_simd's
    lanes and blocks."""
    class T(types.Type):
        def __init__(self):
            super().__init__(name=name)

    @register_model(T)
    class _Model(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, llvm)

    return T()


f32x16 = vector_type("F32x16", _VF)                  # sixteen float32 lanes (an LLVM <16 x float>)


def first(context, builder, arytype, ary, elem: ir.Type, n: int) -> ir.Value:
    """The <n x elem> at the array's first element (alignment of one element: slices start anywhere)."""
    data = context.make_array(arytype)(context, builder, ary).data
    vec = ir.VectorType(elem, n)
    return builder.load(builder.bitcast(data, vec.as_pointer()), align=1 if isinstance(elem, ir.IntType) and elem.width == 8 else 4)


def splat(builder, value: ir.Value, n: int = LANES) -> ir.Value:
    """VALUE in each of N lanes."""
    vec = ir.VectorType(value.type, n)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(_I32, n), [0] * n))


@intrinsic
def vzero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VF, [0.0] * LANES)
    return f32x16(), codegen


@intrinsic
def vload(typingctx, a):
    def codegen(context, builder, sig, args):
        return first(context, builder, sig.args[0], args[0], _F32, LANES)
    return f32x16(a), codegen


@intrinsic
def vstore(typingctx, v, a):
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[1])(context, builder, args[1]).data
        builder.store(args[0], builder.bitcast(data, _VF.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(f32x16, a), codegen


@intrinsic
def vsplat(typingctx, s):
    def codegen(context, builder, sig, args):
        return splat(builder, args[0])
    return f32x16(types.float32), codegen


@intrinsic
def vadd(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1], flags=_FLAGS)
    return f32x16(f32x16, f32x16), codegen


@intrinsic
def vmul(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1], flags=_FLAGS)
    return f32x16(f32x16, f32x16), codegen


@intrinsic
def vfma(typingctx, a, b, c):
    def codegen(context, builder, sig, args):
        return builder.fadd(builder.fmul(args[0], args[1], flags=_FLAGS), args[2], flags=_FLAGS)
    return f32x16(f32x16, f32x16, f32x16), codegen


@intrinsic
def vsum(typingctx, a):
    """Σ of the lanes, halving the vector each step (log2 16 = 4 adds)."""
    def codegen(context, builder, sig, args):
        v, n = args[0], LANES
        while n > 1:
            n //= 2
            lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n))))
            hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n, 2 * n))))
            v = builder.fadd(lo, hi, flags=_FLAGS)
        return builder.extract_element(v, ir.Constant(_I32, 0))
    return types.float32(f32x16), codegen


@intrinsic
def field(typingctx, a, shift, mask):
    """float((a[j] >> shift) & mask), j = 0..15, a uint8: low nibbles (0, 15), high (4, 15), a bit (k, 1)."""
    def codegen(context, builder, sig, args):
        q = first(context, builder, sig.args[0], args[0], _I8, LANES)
        s = splat(builder, builder.trunc(args[1], _I8))
        m = splat(builder, builder.trunc(args[2], _I8))
        return builder.uitofp(builder.and_(builder.lshr(q, s), m), _VF)
    return f32x16(a, types.intp, types.intp), codegen


@intrinsic
def int8s(typingctx, a):
    def codegen(context, builder, sig, args):
        return builder.sitofp(first(context, builder, sig.args[0], args[0], _I8, LANES), _VF)
    return f32x16(a), codegen


@intrinsic
def bits32(typingctx, h, shift):
    """float((h >> (shift + j)) & 1), j = 0..15: sixteen bits of one uint32, lane j the bit shift + j."""
    def codegen(context, builder, sig, args):
        word = splat(builder, builder.trunc(args[0], _I32))
        at = builder.add(splat(builder, builder.trunc(args[1], _I32)),
                         ir.Constant(ir.VectorType(_I32, LANES), list(range(LANES))))
        one = ir.Constant(ir.VectorType(_I32, LANES), [1] * LANES)
        return builder.uitofp(builder.and_(builder.lshr(word, at), one), _VF)
    return f32x16(types.uint32, types.intp), codegen


@intrinsic
def as_float32(typingctx, bits):
    """The float32 whose bits are the uint32 BITS (no conversion: a bitcast)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _F32)
    return types.float32(types.uint32), codegen
