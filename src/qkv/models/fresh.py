"""A fresh, untrained model of any family, initialised as transformers initialises it.

    every matrix and embedding table   N(0, σ²), σ = initializer_range (0.02)
    GPT-2's c_proj and mlp.c_proj      N(0, (σ/√(2L))²): the residual stream's writes, scaled by depth
    biases, LayerNorm β                0
    gpt-oss's sink logits, router bias N(0, σ²) (its experts' biases: 0)
    norm weights γ                     1
    xIELU's scalars (Apertus)          a_p = ln(e^0.8 − 1), a_n = ln(e^0.3 − 1), β = 0.5, ε = −1e-6 (XIELUActivation's)
    the padding token's embedding row  0 where cfg.pad_embedding_frozen (nn.Embedding's padding_idx)

How: the family's own loader (`weights(store, cfg, dtype)`) asks a store for each tensor by its
checkpoint name and shape; this store makes the tensor instead of reading it, by the rule for that
name. So init follows the same name-by-name table as loading, and a new family gets init for free.
Each tensor is drawn from its own generator, seeded by (seed, the tensor's name): the numbers depend
on nothing else (not on the order of the table), in float64, then rounded to the model's dtype.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from .image_model import ImageModel
from .model import Model
from .seq2seq import Seq2SeqModel
from ..inputs.tokenizer import Tokenizer
from ..checkpoints.families import config_of, family_of

INITIALIZER_RANGE = 0.02                    # σ of transformers' PreTrainedConfig.initializer_range
# The token tables of single-stack models. An encoder–decoder's shared table is drawn whole (torch would
# zero its pad row too), so that a fresh Marian, and the ko-en-tiny run that starts from one, stay as they were.
_TOKEN_TABLES = ("wte.weight", "embed_tokens.weight", "embeddings.word_embeddings.weight")
# xIELU's starting scalars (transformers' XIELUActivation: α_p = 0.8, α_n = 0.8 once β = 0.5 is added), by the
# tensor's last name under an mlp.act_fn.
_XIELU_START = {"alpha_p": math.log(math.expm1(0.8)), "alpha_n": math.log(math.expm1(0.8 - 0.5)), "beta": 0.5,
                "eps": -1e-6}


class _Initialiser:
    """A TensorStore that makes each tensor it is asked for (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, seed: int, std: float):
        self.cfg, self.seed, self.std = cfg, seed, std

    def has(self, name: str) -> bool:
        """A fresh checkpoint holds every tensor, except the head of a tied model (it is the embedding)."""
        return not (name == "lm_head.weight" and self.cfg.tied_embeddings)

    def get(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        _check_room(name, shape, self.cfg)
        last = name.rsplit(".", 1)[-1]
        if ".act_fn." in name and last in _XIELU_START:                 # xIELU's scalars (Apertus)
            return np.full(shape, _XIELU_START[last], dtype=dtype)
        drawn = name.endswith((".sinks", ".router.bias"))               # gpt-oss's sink logits, router bias: N(0, σ²)
        if not drawn and (len(shape) == 1 or name == "final_logits_bias"   # a bias / β (Marian's, BART's (1, V)), γ,
                          or name.endswith(("_proj_bias",                  # or gpt-oss's experts' biases (E, …),
                                            "e_score_correction_bias"))):  # Ernie 4.5's choice bias (1, E)
            is_gain = len(shape) == 1 and (name.endswith(".weight") or name.endswith(".gamma"))
            t = (np.ones if is_gain else np.zeros)(shape, dtype=dtype)
        else:                                                            # a matrix or a table
            std = self.std
            if self.cfg.family == "gpt2" and name.endswith("c_proj.weight"):
                std /= math.sqrt(2 * self.cfg.n_layers)
            rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
            t = (rng.standard_normal(shape) * std).astype(dtype)        # float64 draw, then rounded
            pad = self.cfg.pad_token_id
            if (name in _TOKEN_TABLES and self.cfg.pad_embedding_frozen and pad is not None
                    and 0 <= pad < self.cfg.vocab_size):
                t[pad] = 0                                               # the padding token's row
        return t


def _check_room(name: str, shape: tuple[int, ...], cfg: ModelConfig) -> None:
    """Refuse, before it is drawn, a tensor the memory free now cannot hold (its float64 draw and the copy in the
    model's dtype, ≤ 16 bytes a number): a config of sizes in range but too large for this machine is one line,
    not a MemoryError or the system killing qkv."""
    from ..runtime.tuning import available_memory

    need, free = 16 * math.prod(shape), available_memory()
    if free is not None and need > free:
        raise QkvError(f"a fresh {cfg.family} model of these sizes does not fit in memory: its tensor {name} "
                       f"{tuple(shape)} alone needs about {need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB is free; "
                       "give smaller sizes (vocab_size, d_model, d_ff, n_layers)")


def init(config: ModelConfig | dict, seed: int = 0, dtype=np.float32, tokenizer: Tokenizer | None = None,
         name: str = "fresh model", initializer_range: float | None = None) -> Model:
    """A new model with random weights, deterministic in `seed`.

    config: a ModelConfig, or a Hugging Face config.json dict (its model_type picks the family,
    its initializer_range, if any, the σ); tokenizer: the model's tokenizer, if it has one.
    """
    std = initializer_range
    if isinstance(config, dict):
        std = std if std is not None else config.get("initializer_range")
        config = config_of(config, where="the config")
    if not isinstance(config, ModelConfig):
        raise QkvError(f"init takes a ModelConfig or a config.json dict, not {type(config).__name__}")
    if config.mamba is not None:                   # (its A_log, D, Δ's bias have inits of their own, time_step_*)
        raise QkvError("a fresh Mamba model is not in qkv (it does not train here, and its S4D and Δ inits are "
                       "transformers' own); load a checkpoint, or make one with transformers' MambaForCausalLM")
    std = INITIALIZER_RANGE if std is None else std
    if isinstance(std, bool) or not isinstance(std, (int, float)) or not (math.isfinite(std) and std > 0):
        raise QkvError(f"initializer_range {std!r} must be a positive number; e.g. 0.02")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise QkvError(f"seed {seed!r} must be a whole number ≥ 0")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise QkvError(f"dtype {dtype} is not supported; use float32 or float64")
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise QkvError(f"the tokenizer has {tokenizer.vocab_size} tokens but the config only vocab_size "
                       f"{config.vocab_size}; make vocab_size at least the tokenizer's")
    store = _Initialiser(config, int(seed), float(std))
    weights = family_of(config.family).weights(store, config, dtype.type)
    if config.image_size is not None:
        return ImageModel(config, weights, None, name=name)
    return (Seq2SeqModel if config.encoder_decoder else Model)(config, weights, tokenizer, name=name)
