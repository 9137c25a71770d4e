/* qkv's arrays, one format for every page (qkv/viz/wire.py writes and documents it):
 *   QKV_WIRE.decode({dtype, shape, scale?, data}) → Promise<the stored numbers: a typed array, f16 as Float64Array>
 */
(function (global) {
  "use strict";
  const TYPES = {u8: Uint8Array, u16: Uint16Array, i32: Int32Array, f16: Uint16Array, f32: Float32Array};

  async function inflate(b64) {
    if (typeof DecompressionStream === "undefined")
      throw new Error("this browser lacks DecompressionStream; use Chrome 80+, Firefox 113+ or Safari 16.4+");
    let packed = Uint8Array.fromBase64 ? Uint8Array.fromBase64(b64) : null;
    if (!packed) {
      const raw = atob(b64);
      packed = new Uint8Array(raw.length);
      for (let i = 0; i < raw.length; i++) packed[i] = raw.charCodeAt(i);
    }
    const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }
  function half(h) {                                // IEEE float16 bits → number
    const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
    return e === 0 ? s * f * 2 ** -24 : e === 31 ? (f ? NaN : s * Infinity) : s * (1 + f / 1024) * 2 ** (e - 15);
  }
  async function decode(enc) {
    const Kind = TYPES[enc.dtype], want = enc.shape.reduce((a, b) => a * b, 1);
    if (!Kind) throw new Error("unknown array dtype " + enc.dtype);
    const bytes = await inflate(enc.data);
    if (bytes.length !== want * Kind.BYTES_PER_ELEMENT) throw new Error(`an array has ${bytes.length} bytes, not ${want} ${enc.dtype}`);
    const q = Kind === Uint8Array ? bytes : new Kind(bytes.buffer, 0, want);      // little-endian, as browsers
    return enc.dtype === "f16" ? Float64Array.from(q, half) : q;
  }
  global.QKV_WIRE = {decode};
})(window);
