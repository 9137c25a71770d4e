"""Saving a model in Hugging Face layout, which `qkv.load` and transformers' from_pretrained both read.

    DIR/config.json            the family's hf_config: every knob, as transformers names it
    DIR/model.safetensors      the family's tensors: transformers' full names and shapes, metadata
                               {"format": "pt"} (transformers refuses a file without it)
    DIR/tokenizer.json         the model's tokenizer, if it has one
    DIR/tokenizer_config.json  its special tokens and chat template (what transformers' and qkv's
                               tokenizer loaders read besides tokenizer.json)
    DIR/preprocessor_config.json  an image model's (ViT's) image processing: size, rescale, mean, std

All files are written together through qkv.runtime.io.FileBatch: a save that fails or is interrupted
leaves the previous files (or nothing) in place, never half a model. The target must be a new or
empty directory, or one holding only these files (a previous save: it is overwritten); anything
else (a file, a link, a directory with other files) is refused, so a save never clobbers what it
did not write.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime.errors import QkvError
from ..runtime.io import FileBatch
from .families import family_of
from .tensors import write_safetensors

if TYPE_CHECKING:
    from ..writing.handles import Handle

FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "preprocessor_config.json")
# The temporary files of a save killed midway (qkv.runtime.io names them ".<final name>.<pid>.<random>.tmp").
_LEFTOVER = re.compile(r"\.(" + "|".join(re.escape(f) for f in FILES) + r")\.[^/]*\.tmp")


def check_target(directory: Path) -> None:
    """Refuse a target that is a link, a file, or a directory holding anything a save did not write."""
    if os.path.islink(directory):
        raise QkvError(f"{directory} is a symbolic link; give a new directory to save the model into")
    if directory.exists() and not directory.is_dir():
        raise QkvError(f"{directory} is a file; give a new directory to save the model into")
    if directory.is_dir():
        others = sorted(p.name for p in directory.iterdir()
                        if not (p.name in FILES or _LEFTOVER.fullmatch(p.name)) or p.is_dir())
        if others:
            shown = ", ".join(others[:3]) + (", …" if len(others) > 3 else "")
            raise QkvError(f"{directory} holds other files ({shown}); save into a new or empty directory")


def tokenizer_config(model: Handle) -> dict:
    """tokenizer_config.json: a fast tokenizer over tokenizer.json, its special tokens, its chat template."""
    tok = model.tokenizer
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model.config.max_positions,
              **tok.special_tokens}
    if tok.chat_template is not None:
        config["chat_template"] = tok.chat_template
    return config


def save(model: Handle, directory: str | os.PathLike) -> Path:
    """Write MODEL into DIRECTORY in Hugging Face layout (see the module docstring); returns it. llama.cpp's
    arithmetic (`arith="llama.cpp"`) is how qkv multiplies, not a knob of the checkpoint: the weights are written as
    they are, and the folder loads in exact arithmetic (give arith= again to load it so)."""
    directory = Path(directory)
    check_target(directory)
    cfg = model.config if model.config.arith == "exact" else model.config.with_(arith="exact")
    family = family_of(cfg.family)
    processing = getattr(model, "processing", None)                   # an image model (ViT): its labels and
    config = family.hf_config(cfg, model.labels) if processing is not None else family.hf_config(cfg)
    tensors = family.tensors(model.weights, cfg)
    config["dtype"] = str(model.dtype)                                  # transformers loads it in this dtype
    try:
        with FileBatch(directory) as batch:
            batch.write("model.safetensors", lambda f: write_safetensors(f, tensors, {"format": "pt"}))
            batch.write_text("config.json", json.dumps(config, indent=2) + "\n")
            if processing is not None:                               # how its images are processed
                batch.write_text("preprocessor_config.json", json.dumps(processing.to_dict(), indent=2) + "\n")
            if model.tokenizer is not None:
                batch.write_text("tokenizer.json", model.tokenizer.to_json())
                batch.write_text("tokenizer_config.json", json.dumps(tokenizer_config(model), indent=2) + "\n")
    except OSError as e:
        raise QkvError(f"cannot save the model into {directory}: {e.strerror or e}; "
                       "check the path and free space") from None
    if model.tokenizer is None:                              # a previous save's tokenizer is not this model's
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (directory / name).unlink(missing_ok=True)
    return directory
