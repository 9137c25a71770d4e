"""Llama-3.2-1B-shaped GGUF files of random weights, for `qkv bench generate --model FILE.gguf --stored`.

    python benchmarks/make_llama_1b_gguf.py --vocab-from SmolLM2-135M-Instruct.Q4_1.gguf --out DIR

writes DIR/llama-1b-shaped-f16.gguf (every matrix float16) and, quantised from it by llama.cpp itself
(llama-cpp-python's `llama_model_quantize`, 2 threads), DIR/llama-1b-shaped-{q4_0,q4_k_m,q8_0}.gguf. Run it
with a Python that has numpy, gguf and llama-cpp-python (`--no-quantize`: numpy and gguf only). The files are
~2.5 GB / 0.7–1.3 GB each: keep them outside the repository; this script is the command that remakes them.

The shape is Llama-3.2-1B's (L 16, d_model 2048, 32 query heads / 8 K/V heads of 64, d_ff 8192, V 128256,
RoPE θ 500000, RMSNorm ε 1e-5, W_vocab tied to the embedding); its llama3 RoPE scaling is left out: it
only slows RoPE's lowest frequencies (other angles, the same work and the same bytes read a step), and random
weights have nothing to keep in tune with it. Weights: normal, σ 0.02, from a fixed generator seed; norms 1. Llama-3's
own tokenizer is not shipped here, so the vocabulary is another byte-level BPE's: SmolLM2's (its 49152 tokens,
merges, pre-tokenizer and chat template, read from `--vocab-from`), padded to 128256 with unused tokens
`<|unused_N|>` (llama.cpp's token type UNUSED) that no text encodes to. llama.cpp and qkv both load it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

LLAMA_1B = {"n_layers": 16, "d_model": 2048, "n_heads": 32, "n_kv_heads": 8, "d_head": 64, "d_ff": 8192,
            "vocab_size": 128256, "rope_theta": 500000.0, "rms_eps": 1e-5, "context": 131072}
SIGMA = 0.02
SEED = 1
QUANTS = ("Q4_0", "Q4_K_M", "Q8_0")          # llama.cpp's LLAMA_FTYPE_MOSTLY_<name>
UNUSED = 5                                    # llama.cpp's token type of a token no text encodes to
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
                  "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                  "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template")


def read_vocab(gguf_path: Path) -> dict:
    """A GGUF file's byte-level BPE tokenizer: tokens, token types, merges and the scalar keys above."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    fields = reader.fields
    if "tokenizer.ggml.tokens" not in fields or fields["tokenizer.ggml.model"].contents() != "gpt2":
        sys.exit(f"{gguf_path.name} has no byte-level BPE ('gpt2') tokenizer; give SmolLM2's GGUF")
    vocab = {"tokens": list(fields["tokenizer.ggml.tokens"].contents()),
             "types": [int(t) for t in fields["tokenizer.ggml.token_type"].contents()],
             "merges": list(fields["tokenizer.ggml.merges"].contents())}
    vocab.update({k: fields[k].contents() for k in TOKENIZER_KEYS if k in fields})
    return vocab


def fitted(vocab: dict, size: int) -> dict:
    """VOCAB padded to SIZE tokens with unused ones (or refused when it has more: its merges would dangle)."""
    n = len(vocab["tokens"])
    if n > size:
        sys.exit(f"the vocabulary has {n} tokens, more than the {size} of the shape")
    pad = [f"<|unused_{i}|>" for i in range(n, size)]
    return dict(vocab, tokens=vocab["tokens"] + pad, types=vocab["types"] + [UNUSED] * len(pad))


def write_f16(path: Path, vocab: dict, shape: dict = LLAMA_1B, seed: int = SEED,
              name: str = "Llama-3.2-1B-shaped") -> None:
    """A llama-architecture GGUF of SHAPE with random float16 matrices (normal, σ SIGMA) and float32 norms of 1.

    Q and K are written in GGUF's row order as they come (random numbers have no order to permute)."""
    import gguf

    s, rng = shape, np.random.default_rng(seed)
    d, d_kv = s["d_model"], s["n_kv_heads"] * s["d_head"]

    def matrix(rows: int, cols: int) -> np.ndarray:                     # (rows, cols): y = W x, GGUF's (out, in)
        return (SIGMA * rng.standard_normal((rows, cols), dtype=np.float32)).astype(np.float16)
    ones = np.ones(d, dtype=np.float32)                                 # (d_model,)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_block_count(s["n_layers"])
    w.add_context_length(s["context"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(s["d_ff"])
    w.add_head_count(s["n_heads"])
    w.add_head_count_kv(s["n_kv_heads"])
    w.add_rope_dimension_count(s["d_head"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_vocab_size(s["vocab_size"])
    v = fitted(vocab, s["vocab_size"])
    w.add_tokenizer_model(v["tokenizer.ggml.model"])
    w.add_tokenizer_pre(v.get("tokenizer.ggml.pre", "default"))
    w.add_token_list(v["tokens"])
    w.add_token_types(v["types"])
    w.add_token_merges(v["merges"])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("unknown_token_id", w.add_unk_token_id), ("padding_token_id", w.add_pad_token_id)):
        if f"tokenizer.ggml.{key}" in v:
            add(int(v[f"tokenizer.ggml.{key}"]))
    if "tokenizer.ggml.add_bos_token" in v:
        w.add_add_bos_token(bool(v["tokenizer.ggml.add_bos_token"]))
    if "tokenizer.chat_template" in v:
        w.add_chat_template(v["tokenizer.chat_template"])
    w.add_tensor("token_embd.weight", matrix(s["vocab_size"], d))     # (V, d_model), also W_vocab (tied)
    for i in range(s["n_layers"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        w.add_tensor(b + "attn_q.weight", matrix(s["n_heads"] * s["d_head"], d))     # (H·d_k, d_model)
        w.add_tensor(b + "attn_k.weight", matrix(d_kv, d))                             # (H_kv·d_k, d_model)
        w.add_tensor(b + "attn_v.weight", matrix(d_kv, d))
        w.add_tensor(b + "attn_output.weight", matrix(d, s["n_heads"] * s["d_head"]))  # (d_model, H·d_k)
        w.add_tensor(b + "ffn_norm.weight", ones)
        w.add_tensor(b + "ffn_gate.weight", matrix(s["d_ff"], d))                      # (d_ff, d_model)
        w.add_tensor(b + "ffn_up.weight", matrix(s["d_ff"], d))
        w.add_tensor(b + "ffn_down.weight", matrix(d, s["d_ff"]))                      # (d_model, d_ff)
    w.add_tensor("output_norm.weight", ones)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src: Path, dst: Path, kind: str, threads: int = 2) -> None:
    """DST = SRC quantised by llama.cpp to LLAMA_FTYPE_MOSTLY_<KIND> (its own choice of types per tensor)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
    params.nthread = threads
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        sys.exit(f"llama.cpp could not quantise {src.name} to {kind}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab-from", type=Path, required=True, help="a GGUF with a byte-level BPE tokenizer: SmolLM2's, as qkv ships it "
                    "(python -c 'from qkv.checkpoints import smollm2_file; print(smollm2_file())')")
    ap.add_argument("--out", type=Path, required=True, help="the directory to write the files in (made if missing)")
    ap.add_argument("--no-quantize", action="store_true", help="write the float16 file only")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp's threads while quantising")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    f16 = args.out / "llama-1b-shaped-f16.gguf"
    print(f"writing {f16.name}", file=sys.stderr)
    write_f16(f16, read_vocab(args.vocab_from))
    for kind in () if args.no_quantize else QUANTS:
        dst = args.out / f"llama-1b-shaped-{kind.lower()}.gguf"
        print(f"quantising to {dst.name}", file=sys.stderr)
        quantize(f16, dst, kind, args.threads)


if __name__ == "__main__":
    main()
