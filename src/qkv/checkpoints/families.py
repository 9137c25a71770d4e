"""The families qkv runs, by config.json's model_type: one module each, found here by itself (every module of this
folder but MACHINERY that declares MODEL_TYPES is registered: a new family is one new file, listed nowhere).

A family module holds everything qkv knows of the family, as data where it can be:

    MODEL_TYPES                          the config.json model_types it reads ("llama", "mistral", …)
    config(hf) -> ModelConfig            config.json → the knobs
    hf_config(cfg) -> dict               the knobs → config.json (reads back as cfg)
    ROWS                                 its tensor table (table.Row: our name ↔ the checkpoint's, how stored),
    weights(store, cfg, dtype) -> Weights   read by it: tensors by checkpoint name → the guide's names
    tensors(weights, cfg) -> dict           and written back by it: transformers' full names
    IGNORED                              the tensors a checkpoint may hold that `weights` never reads
    GGUF                                 llama.cpp's architectures of the family (table.Arch), if any
    ABOUT                                its rows of the README's table of families (table.About: the model_types,
                                         the models, what they bring, what they run as), gathered by `about`

(The encoder–decoders' two stacks are tables too, bart.stack_rows and t5.stack_rows; their shared embedding
table and head, and Whisper's convolutions, are a few lines of code of their own.)

Here they meet: `config_of` picks the family of a config.json, `read_weights` reads a checkpoint strictly
(every tensor read or IGNORED: an mBART checkpoint labelled BART is refused, not run with its extra layer
norms dropped), `weights_from_tensors` builds Weights that are views of a dict of tensors (what training
updates in place).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import numpy as np

from ..core.config import ModelConfig
from ..runtime.errors import QkvError
from ..core.weights import Weights
from .common import check_config, unread, unread_error
from .table import KINDS, About, Arch
from .tensors import TensorDict, TensorStore

# The modules of this folder that are not families: every other module is one, found here by its name
# (a new family is a new file, listed nowhere).
MACHINERY = {"common", "control_vector", "families", "gguf", "gguf_archs", "gguf_cache", "gguf_reader", "gguf_stored",
             "gguf_spm", "gguf_tokenizer", "save", "table", "tensors"}

FAMILIES: dict[str, ModuleType] = {}            # config.json model_type → its module
GGUF_ARCHS: dict[str, Arch] = {}                # llama.cpp's general.architecture → its table


def register(module: ModuleType) -> None:
    """Make MODULE's families loadable, savable and initialisable: every model_type of its MODEL_TYPES, and
    its llama.cpp architectures (GGUF, if it has any). A model_type or an architecture another module
    already reads is a bug (two tables for one name), refused with a traceback."""
    for kind in module.MODEL_TYPES:
        assert FAMILIES.get(kind, module) is module, f"model_type {kind} is read by two modules"
        FAMILIES[kind] = module
    for name, arch in getattr(module, "GGUF", {}).items():
        assert GGUF_ARCHS.get(name, arch) is arch, f"GGUF architecture {name} is read by two modules"
        GGUF_ARCHS[name] = arch


def discover(folder: Path, package: str) -> list[ModuleType]:
    """Register every family module in FOLDER (the modules of PACKAGE there, but MACHINERY), in name order: those
    that declare MODEL_TYPES. How this folder's families are found; a plug-in folder's would be the same call."""
    found = []
    for info in sorted(pkgutil.iter_modules([str(folder)]), key=lambda m: m.name):
        if info.name in MACHINERY or info.ispkg:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        if hasattr(module, "MODEL_TYPES"):
            register(module)
            found.append(module)
    return found


discover(Path(__file__).parent, __package__)


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


class FamilyRow(NamedTuple):
    """One row of the README's table of families: a module's About, and the llama.cpp architectures that load as
    one of its model_types (read from the GGUF tables, never typed twice: an arch's family, or its `also`)."""
    about: About
    gguf: tuple[str, ...]
    module: str                          # the family module that declares it ("llama")


def about() -> list[FamilyRow]:
    """Every row of every family module's ABOUT, by kind (KINDS' order: decoders first) then model_type: the
    README's table of families, and `qkv models --families`."""
    rows = []
    for module in dict.fromkeys(FAMILIES.values()):
        for row in getattr(module, "ABOUT", ()):
            gguf = tuple(sorted((name for name, arch in GGUF_ARCHS.items() if arch.family in row.types),
                                key=lambda name: row.types.index(GGUF_ARCHS[name].family)))   # in the row's order
            gguf += tuple(sorted(name for name, arch in GGUF_ARCHS.items()                  # an arch that may load
                                 if name not in gguf and set(arch.also) & set(row.types)))  # as it (olmo2: olmo3)
            rows.append(FamilyRow(row, gguf, module.__name__.rsplit(".", 1)[1]))
    kinds = list(KINDS)
    return sorted(rows, key=lambda r: (kinds.index(r.about.kind), r.about.types[0]))
