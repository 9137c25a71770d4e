"""qkv.load: a source (a bundled name, a directory, a .gguf file, a cached repo id) → the handle of its kind
(Model, Seq2SeqModel, ImageModel, AudioModel), its weights read by the family's tables (qkv.checkpoints).
"""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.layout import fast_layout
from .audio_model import AudioModel
from .contrastive import PairModel, contrastive_model
from .image_model import ImageModel
from ..inputs.images import ImageProcessing
from .model import Model
from .seq2seq import Seq2SeqModel
from ..inputs.tokenizer import Tokenizer
from ..core.weights import check_dtype, leaves
from ..runtime.llama_arith import PRODUCTS
from ..runtime.stored import ARITHS, StoredMatrix
from ..checkpoints import DEFAULT, DEFAULT_ALIASES, LLM_ALIASES, config_json, gguf, json_object, resolve, vit
from ..checkpoints import gguf_cache
from ..checkpoints.families import config_of, family_of, read_weights
from ..checkpoints.families import weights_from_tensors  # noqa: F401 (qkv.checkpoints.weights_from_tensors)
from ..checkpoints.tensors import TensorStore


STORAGES = ("stored", "bfloat16", "float16")       # dtypes that say how weights are held (computing in float32)


LLAMA_CPP_NAMED = " (llama.cpp arithmetic)"      # after the name of a model loaded with arith="llama.cpp"


def load(source: str | os.PathLike = DEFAULT, dtype=None, arith: str = "exact"
         ) -> Model | Seq2SeqModel | ImageModel | AudioModel | PairModel:
    """Load a model: "minilm" (default), "smollm2", a local directory, a .gguf file, or a cached
    Hugging Face repo id. An encoder–decoder (Marian, BART, mBART, Pegasus, T5, mT5, UMT5) is a Seq2SeqModel,
    an image model (ViT, and "digits-vit") an ImageModel, Whisper an AudioModel; a CLIP or SigLIP pair a PairModel
    (a tower alone: a TextTower or ImageTower, models.contrastive).

    dtype: what the weights are held as. A GGUF file's default is "stored": its quantised matrices kept
    as the file's blocks (runtime.stored), read in place. Anything else defaults to float32, memory-mapped
    from safetensors (zero-copy); np.float64 computes in double precision, for checks (a GGUF file then
    is dequantised once into qkv's cache). "bfloat16" and "float16" hold every matrix in 16 bits (a
    checkpoint's own 16-bit matrices mapped as they are, others rounded once); "stored" on a safetensors
    checkpoint keeps each matrix as the file has it. Activations are float32 whatever the storage.

    arith: how the pass computes. "exact" (the default, and what analyses are checked against): float32
    activations, each product equal to the one with the exactly dequantised weights. "llama.cpp": a GGUF file's
    stored blocks (Q4_0, Q5_0, Q8_0, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K) multiplied as llama.cpp does — each row of
    activations quantised to 8 bits a block of 32 (the K-quants: of 256), integer dot products, its scales and order
    of sums (runtime.llama_arith; compiled: runtime.llama_kernels) — and RMSNorm and RoPE's angles as ggml
    computes them, so that the logits equal
    llama.cpp's on the tested files (tests/test_llama_arith.py). Other weights are refused in one line.
    `model.arith` (its config's) says which; the model's name says "llama.cpp arithmetic". `model.source` is
    SOURCE as a string, which another process loads again (analysis workers).
    """
    if arith not in ARITHS:
        raise QkvError(f"arith {arith!r:.40} is not an arithmetic qkv computes; use \"exact\" (float32 activations) "
                       "or \"llama.cpp\" (a GGUF file's blocks multiplied as llama.cpp does)")
    directory = resolve(source)
    source_gguf = gguf.source_of(directory)
    if dtype is None:
        dtype = "stored" if source_gguf is not None else np.float32
    storage = dtype if isinstance(dtype, str) and dtype in STORAGES else None
    dtype = np.dtype(np.float32) if storage else check_dtype(dtype)   # what the engine computes in
    if arith == "llama.cpp" and (source_gguf is None or storage != "stored"):
        held = ("a checkpoint that is not a GGUF file" if source_gguf is None
                else f"weights held as {storage or dtype.name}")
        raise QkvError(f"llama.cpp's arithmetic multiplies a GGUF file's stored blocks, not {held}; load a .gguf file "
                       "with its weights stored (its default: no dtype, no --weights), or use arith \"exact\"")
    hf = config_json(directory)
    cfg = config_of(hf)                               # model_type, types and ranges of every knob, the family's reader
    if arith != "exact":
        cfg = cfg.with_(arith=arith)                  # the norms and RoPE angles the engine computes
    if source_gguf is not None and storage is not None:
        from ..checkpoints.gguf_stored import GGUFTensors

        store = GGUFTensors(directory)                    # the file's blocks (and 16-bit floats) in place
    else:
        if source_gguf is not None:
            gguf_cache.with_tensors(directory)            # its tensors as float32 (written once)
        store = TensorStore(directory)
    if storage in ("bfloat16", "float16") or (storage == "stored" and source_gguf is None):
        from ..checkpoints.gguf_stored import HalfTensors

        store = HalfTensors(store, {"bfloat16": "BF16", "float16": "F16", "stored": None}[storage])
    weights = read_weights(store, cfg, dtype.type)   # every tensor read, or one the family may ignore
    store.release()                   # reading every tensor once (the NaN check) mapped all its pages
    if cfg.causal and not cfg.encoder_decoder:     # decoders: copied into the decoding layout (layout.py)
        weights = fast_layout(weights, after_copy=store.release)
    if arith == "llama.cpp":
        multiply_as_llama_cpp(weights)
    tok_path = directory / "tokenizer.json"
    own = getattr(family_of(cfg.family), "tokenizer", None)          # a family's own files (ESM's vocab.txt)
    tokenizer = Tokenizer.from_directory(directory) if tok_path.is_file() else own and own(directory)
    text_cfg = cfg.text_tower or cfg                 # an image–text pair (CLIP, SigLIP): its text tower's vocabulary
    if tokenizer is not None and tokenizer.vocab_size > text_cfg.vocab_size:     # ids are never checked again
        raise QkvError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {cfg.vocab_size} "
                       "(config.json vocab_size); use the tokenizer.json that came with the checkpoint")
    if gguf_cache.is_temporary(directory):
        shutil.rmtree(directory, ignore_errors=True)     # QKV_CACHE=off: the maps stay valid
    del store                 # its own matrices (rows fast_layout has since joined: Q, K re-ordered) go first,
    _give_back_heap()         # then the heap they took goes back to the system
    name = _display_name(source) + (LLAMA_CPP_NAMED if arith == "llama.cpp" else "")   # traces, pages
    given = str(source)                                   # model.source: what another process loads again
    if getattr(family_of(cfg.family), "TOWERS", False):          # CLIP, SigLIP: a tower, or both
        processing = image_processing(directory, cfg) if cfg.image_size is not None else None
        return contrastive_model(cfg, weights, tokenizer, name, processing, given)
    if cfg.image_size is not None:
        return image_model(directory, hf, cfg, weights, name, given)
    if cfg.audio_mels is not None:
        audio = AudioModel(cfg, weights, tokenizer, name=name, source=given)
        audio.directory = directory                  # its generation_config.json: how it writes (transcribe)
        return audio
    model = Seq2SeqModel if cfg.encoder_decoder else Model
    return model(cfg, weights, tokenizer, name=name, source=given)


def multiply_as_llama_cpp(weights) -> None:
    """Every stored matrix of WEIGHTS (a Weights tree) set to multiply with llama.cpp's arithmetic
    (StoredMatrix.arith); one QkvError, before any is set, naming the first of a kind without a product there
    (F16, BF16). Tables only looked up (an untied embedding) are read exactly as ggml reads them."""
    matrices = list(_stored_matrices(weights, "weights"))
    for name, m in matrices:
        if m.kind not in PRODUCTS:
            raise QkvError(f"llama.cpp's arithmetic is defined here for {', '.join(PRODUCTS)} weights, and {name} is "
                           f"{m.kind}; use arith \"exact\", or a GGUF file whose matrices are all of those kinds "
                           "(llama-quantize --pure)")
    for _, m in matrices:
        m.arith = "llama.cpp"


def _stored_matrices(obj, name: str):
    """(where, matrix) for every StoredMatrix in the weight dataclasses OBJ ("weights.blocks[0].attn.W_QKV")."""
    return ((where, leaf) for where, leaf in leaves(obj, name) if isinstance(leaf, StoredMatrix))


def held_as(model):
    """What MODEL's weights are held as, as `load`'s dtype= says it: "stored" when a GGUF's blocks are kept (any
    StoredMatrix), else its float type — so another process loads the same model (analysis workers)."""
    return "stored" if next(_stored_matrices(model.weights, "weights"), None) is not None else model.dtype


def image_model(directory: Path, hf: dict, cfg: ModelConfig, weights, name: str, source: str | None = None
                ) -> ImageModel:
    """An image model (ViT) of DIRECTORY: its preprocessor_config.json (ViTImageProcessor's defaults without
    one) and the names of its labels (id2label of HF, its config.json); SOURCE: what qkv.load was given."""
    return ImageModel(cfg, weights, None, name, image_processing(directory, cfg), vit.labels_of(hf), source)


def image_processing(directory: Path, cfg: ModelConfig) -> ImageProcessing:
    """DIRECTORY's preprocessor_config.json (ViTImageProcessor's defaults without one), checked."""
    path = directory / "preprocessor_config.json"
    return ImageProcessing.of(json_object(path) if path.is_file() else None, cfg)


def _give_back_heap() -> None:
    """Return the heap a load freed to the system (glibc's malloc_trim; elsewhere nothing): reading a GGUF
    file's metadata makes ~50k small objects, whose freed pages glibc would otherwise keep (74 MB of
    resident memory for SmolLM2)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _display_name(source) -> str:
    text = str(source).lower()
    if text in DEFAULT_ALIASES:
        return "all-MiniLM-L6-v2"
    if text in LLM_ALIASES:
        return "SmolLM2-135M-Instruct"
    return str(source)
