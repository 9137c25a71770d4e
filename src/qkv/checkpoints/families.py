"""The families qkv runs, by config.json's model_type: one module each (bert.py, gpt2.py, llama.py, moe.py;
gpt_neox.py, gptj.py, phi.py, cohere.py, granite.py (Llama's table with its multipliers), …; the encoders
roberta.py (and XLM-RoBERTa), distilbert.py, electra.py, modernbert.py; the image encoder vit.py;
the encoder–decoders marian.py, bart.py, mbart.py, pegasus.py, t5.py, mt5.py, umt5.py, whisper.py (speech), whose weights are a Seq2SeqWeights of two stacks).

Every family module is a table between the checkpoint's names and ours, read both ways:

    config(hf) -> ModelConfig            config.json → the knobs
    weights(store, cfg, dtype) -> Weights   tensors by checkpoint name → the guide's names
    hf_config(cfg) -> dict               the knobs → config.json (reads back as cfg)
    tensors(weights, cfg) -> dict        the guide's names → tensors under transformers' full names
    IGNORED                              the tensors a checkpoint may hold that `weights` never reads

Here they meet: `config_of` picks the family of a config.json, `read_weights` reads a checkpoint
strictly (every tensor read or IGNORED: an mBART checkpoint labelled BART is refused, not run with
its extra layer norms dropped), `weights_from_tensors` builds Weights that are views of a dict of
tensors (what training updates in place).
"""

from __future__ import annotations

import re
from types import ModuleType

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import Weights
from . import (bart, bert, bloom, cohere, distilbert, electra, falcon, gemma2, gpt2, gpt_neo, gpt_neox, gptj, granite,
               llama, marian, mbart, modernbert, moe, mpt, mt5, opt, pegasus, phi, phi3, roberta, stablelm, starcoder2,
               t5, umt5, vit, whisper)
from .common import check_config, unread, unread_error
from .tensors import TensorDict, TensorStore

FAMILIES: dict[str, ModuleType] = {"bert": bert, "gpt2": gpt2, "gpt_neox": gpt_neox, "llama": llama, "mistral": llama,
                                   "qwen2": llama, "qwen3": llama, "gemma": llama, "olmo2": llama, "phi": phi,
                                   "phi3": phi3, "stablelm": stablelm, "starcoder2": starcoder2, "opt": opt,
                                   "mixtral": moe, "qwen2_moe": moe, "qwen3_moe": moe, "olmoe": moe,
                                   "gptj": gptj, "cohere": cohere, "granite": granite,
                                   "bloom": bloom, "falcon": falcon, "mpt": mpt,
                                   "marian": marian, "bart": bart, "t5": t5, "mbart": mbart, "pegasus": pegasus,
                                   "mt5": mt5, "umt5": umt5,
                                   "gpt_neo": gpt_neo, "smollm3": llama, "gemma2": gemma2, "gemma3_text": gemma2,
                                   "roberta": roberta, "xlm-roberta": roberta, "distilbert": distilbert, "electra": electra,
                                   "modernbert": modernbert, "vit": vit, "whisper": whisper}


def family_of(kind: str) -> ModuleType:
    """The module of model_type / ModelConfig.family KIND, or one error naming the supported ones
    (also for a KIND that is not a string: a list, a number, None when config.json has none)."""
    if kind == "gemma3":                                 # the multimodal model: its text model alone runs
        raise QkvError("model_type 'gemma3' (Gemma3ForConditionalGeneration, text and images) is not supported; "
                       "use its text model, a Gemma3ForCausalLM checkpoint (model_type gemma3_text)")
    if not isinstance(kind, str) or kind not in FAMILIES:
        raise QkvError(f"model_type {kind!r:.60} is not supported; qkv runs {', '.join(sorted(FAMILIES))}")
    return FAMILIES[kind]


def config_of(hf: dict, where: str = "config.json") -> ModelConfig:
    """A config.json's dict → ModelConfig: the model_type first (an unsupported family is refused as
    such, not for a knob of its own that qkv's ranges reject), then every knob's type and range, then
    its family's reader."""
    family = family_of(hf.get("model_type"))
    return family.config(check_config(hf, where))


LAYER_NUMBER = re.compile(r"\.(?:h|layers?|blocks?)\.(\d+)\.")      # a tensor of layer N (every family's naming)


def read_weights(store: TensorStore | TensorDict, cfg: ModelConfig, dtype, holder: str = "the checkpoint",
                 fix: str | None = None) -> Weights:
    """The family's weights from STORE, once every tensor STORE holds was read or is in the family's
    IGNORED table; else one error naming the others (they would be dropped without a word, and a
    checkpoint of another family under this model_type would give wrong numbers)."""
    family = family_of(cfg.family)
    weights = family.weights(store, cfg, dtype)
    left = unread(store.names(), store.read, family.IGNORED)
    numbers = [int(m.group(1)) for m in map(LAYER_NUMBER.search, left) if m]
    if left and fix is None and len(numbers) == len(left) and min(numbers) >= cfg.n_layers:
        raise QkvError(f"config.json says {cfg.n_layers} layer{'s' if cfg.n_layers > 1 else ''} but {holder} holds "
                       f"layers up to {max(numbers)} ({left[0]!r}, …): its later layers would not run; use the config.json "
                       "that came with it")
    if left:
        fix = fix or (f"it is probably not a {cfg.family} checkpoint but another family (mislabelled model_type), "
                      f"or config.json is not its own: use the config.json that came with it "
                      f"(qkv runs {', '.join(sorted(FAMILIES))})")
        raise unread_error(left, holder, f"{cfg.family} model", fix)
    return weights


def weights_from_tensors(tensors: dict[str, np.ndarray], cfg: ModelConfig) -> Weights:
    """Weights whose arrays are the dict's own arrays or views of them (no copies), read by the
    family's table from checkpoint names (`tensors(weights, cfg)` gives such a dict).

    An in-place update of a tensor in the dict (an optimiser step) is seen by the Weights.
    Every tensor must have one float dtype, the one the Weights will have, and be read (or IGNORED).
    """
    kinds = {t.dtype for t in tensors.values()}
    if len(kinds) != 1 or not np.issubdtype(next(iter(kinds)), np.floating):
        raise QkvError(f"the tensors have dtypes {sorted(map(str, kinds))}; give them all one float type")
    return read_weights(TensorDict(tensors), cfg, next(iter(kinds)).type, holder="the dict of tensors",
                        fix="leave those out, or give the config of the model they belong to")
