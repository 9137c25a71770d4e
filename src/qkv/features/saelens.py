"""SAELens's file layout: DIR/cfg.json + DIR/sae_weights.safetensors, read and written.

    sae_weights.safetensors   W_enc (d_in, d_sae), b_enc (d_sae,), W_dec (d_sae, d_in), b_dec (d_in,), float32
    cfg.json                  architecture "topk", d_in, d_sae, the activation function and k, hook_name, ...

SAELens computes as qkv does, rows as vectors: hidden_pre = (x − b_dec)·W_enc + b_enc, then TopK (torch.topk,
ReLU on the kept values), x̂ = z·W_dec + b_dec. So the four arrays are qkv's own, name for name, no transpose.

What we write is the flat cfg.json of SAELens 5 (`SAEConfig.to_dict`: every field its `from_dict` needs,
activation_fn_str "topk" with activation_fn_kwargs {"k": k}). SAELens 6 reads that layout too: a cfg.json
without a `sae_lens_version` goes through its `handle_pre_6_0_config`, which turns activation_fn "topk" + k
into its TopKSAE. We read both: that layout (and its older names hook_point, activation_fn) and SAELens 6's
(k at the top, model_name and hook_name under "metadata").

Reading trusts neither file: cfg.json goes through runtime.io_json (bounded, at most 64 levels deep) and each key
it uses is typed and ranged (`Fields`: d_in 64.7 or hook_name 5 is one line naming the file and the key); the
weights must have the shapes cfg.json's d_in and d_sae imply, be floats (safetensors: never a pickle) and finite.

Hook names (TransformerLens's, which SAELens uses) ↔ qkv's sites:
    blocks.L.hook_resid_pre   "resid" at layer L (the residual stream entering block L; qkv's hook "L.residual")
    blocks.L.hook_resid_post  "resid" at layer L+1 (what leaves block L enters block L+1)
    blocks.L.hook_attn_out    "attn_out" at layer L        blocks.L.hook_mlp_out   "ffn_out" at layer L
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..checkpoints.tensors import TensorStore, write_safetensors
from ..runtime.errors import QkvError
from ..runtime.io import FileBatch
from ..runtime.io_json import Fields, read_json
from .sae import MAX_D_IN, MAX_LATENTS, NAMES, SAE, SAEConfig

CFG_FILE, WEIGHTS_FILE = "cfg.json", "sae_weights.safetensors"
FIX = f"give an SAE directory written by qkv or SAELens ({CFG_FILE} + {WEIGHTS_FILE})"
SITES = {"resid": "hook_resid_pre", "attn_out": "hook_attn_out", "ffn_out": "hook_mlp_out"}
_HOOK = re.compile(r"^blocks\.(\d+)\.(hook_resid_pre|hook_resid_post|hook_attn_out|hook_mlp_out)$")


def hook_name(layer: int, site: str) -> str:
    """qkv's (layer, site) → TransformerLens's hook name: (15, "resid") → "blocks.15.hook_resid_pre"."""
    if site not in SITES:
        raise QkvError(f"unknown site {site!r}; give one of {', '.join(SITES)}")
    return f"blocks.{layer}.{SITES[site]}"


def site_of(name: str | None) -> tuple[int | None, str | None]:
    """A hook name → (layer, site) as qkv hooks them (the inverse of `hook_name`); (None, None) if unknown."""
    m = _HOOK.match(name or "")
    if m is None:
        return None, None
    layer, point = int(m.group(1)), m.group(2)
    if point == "hook_resid_post":
        return layer + 1, "resid"
    return layer, {v: k for k, v in SITES.items()}[point]


def saelens_cfg(cfg: SAEConfig, *, context_size: int = 0, dataset_path: str = "", prepend_bos: bool = False) -> dict:
    """cfg.json as SAELens 5's SAEConfig.to_dict writes it (readable by SAELens 5 and 6)."""
    name = hook_name(cfg.layer, cfg.site) if cfg.layer is not None and cfg.site is not None else ""
    return {
        "architecture": "topk", "d_in": cfg.d_in, "d_sae": cfg.d_sae, "dtype": "float32", "device": "cpu",
        "model_name": cfg.model or "", "hook_name": name, "hook_layer": cfg.layer if cfg.layer is not None else 0,
        "hook_head_index": None, "activation_fn_str": "topk", "activation_fn_kwargs": {"k": cfg.k},
        "apply_b_dec_to_input": cfg.apply_b_dec_to_input, "finetuning_scaling_factor": False,
        "sae_lens_training_version": None, "prepend_bos": prepend_bos, "dataset_path": dataset_path,
        "dataset_trust_remote_code": False, "context_size": context_size, "normalize_activations": "none",
        "neuronpedia_id": None, "model_from_pretrained_kwargs": {}, "seqpos_slice": [None],
    }


def write_saelens(batch: FileBatch, sae: SAE, **cfg_fields) -> None:
    """cfg.json and sae_weights.safetensors into BATCH's directory (renamed into place with the batch)."""
    tensors = {name: np.ascontiguousarray(sae.params[name], dtype=np.float32) for name in NAMES}
    batch.write(WEIGHTS_FILE, lambda f: write_safetensors(f, tensors, {"format": "pt"}))
    batch.write_text(CFG_FILE, json.dumps(saelens_cfg(sae.config, **cfg_fields), indent=1))


def save_saelens(sae: SAE, directory: str | Path, **cfg_fields) -> Path:
    """DIRECTORY/cfg.json + DIRECTORY/sae_weights.safetensors, both or neither. Returns DIRECTORY."""
    with FileBatch(directory) as batch:
        write_saelens(batch, sae, **cfg_fields)
    return Path(directory)


def read_cfg(directory: Path) -> Fields:
    """DIR/cfg.json as Fields (read by `io_json.read_json`: bounded, not too deep), or a QkvError that says
    what to give."""
    path = directory / CFG_FILE
    if not path.exists():
        raise QkvError(f"{directory} has no {CFG_FILE}; {FIX}")
    return Fields(read_json(path, fix=FIX), str(path), FIX)


def config_from_saelens(cfg: Fields | dict, where: str = "cfg.json") -> tuple[SAEConfig, bool]:
    """(qkv's SAEConfig, rescale_acts_by_decoder_norm) from a cfg.json of SAELens 5 or 6, every key read
    typed and ranged (one line naming WHERE and the key when it is not)."""
    if not isinstance(cfg, Fields):
        cfg = Fields(cfg, where, FIX)
    where = cfg.source
    meta = cfg.object("metadata", {})
    fn = cfg.text("activation_fn_str", None) or cfg.text("activation_fn", None)
    arch = cfg.text("architecture", None)
    if not (arch == "topk" or fn == "topk"):
        raise QkvError(f"{where} describes a {arch or fn or 'ReLU'} SAE; qkv reads TopK SAEs "
                       "(architecture \"topk\", or activation_fn \"topk\" with activation_fn_kwargs {\"k\": …})")
    kwargs = cfg.object("activation_fn_kwargs", {})
    d_in = cfg.integer("d_in", 1, MAX_D_IN)
    d_sae = cfg.integer("d_sae", 1, MAX_LATENTS)
    k = cfg.integer("k", 1, d_sae) if "k" in cfg else kwargs.integer("k", 1, d_sae)
    norm = cfg.data.get("normalize_activations")
    if norm in (None, False):
        norm = "none"
    elif not isinstance(norm, str):
        cfg.text("normalize_activations")                                   # raises: it must be text
    if norm not in ("none", "expected_average_only_in"):
        raise QkvError(f"{where} normalises its inputs ({norm!r}), which qkv does not; give an SAE with "
                       "normalize_activations \"none\"")
    reshape = cfg.text("reshape_activations", "none")
    if reshape != "none":
        raise QkvError(f"{where} reshapes its inputs ({reshape!r}); qkv reads SAEs of one vector per token")
    name = meta.text("hook_name", None) if "hook_name" in meta else (
        cfg.text("hook_name", None) if "hook_name" in cfg else cfg.text("hook_point", None))
    layer, site = site_of(name)
    model = meta.text("model_name", None) if "model_name" in meta else cfg.text("model_name", None)
    config = SAEConfig(d_in=d_in, d_sae=d_sae, k=k, apply_b_dec_to_input=cfg.boolean("apply_b_dec_to_input", True),
                       model=model or None, layer=layer, site=site)
    return config.check(), cfg.boolean("rescale_acts_by_decoder_norm", False)


def load_saelens(directory: str | Path) -> SAE:
    """The SAE in DIRECTORY (cfg.json + sae_weights.safetensors, SAELens 5 or 6), float32.

    A file saved with rescale_acts_by_decoder_norm (SAELens's topk training option, usually folded before
    saving) is folded here the way SAELens folds it: b_enc·‖w_j‖, W_enc's columns ·‖w_j‖, W_dec's rows
    /‖w_j‖ — the same SAE with unit-norm decoder rows."""
    directory = Path(directory)
    if not directory.is_dir():
        raise QkvError(f"{directory} is not a directory; {FIX}")
    config, rescale = config_from_saelens(read_cfg(directory))
    path = directory / WEIGHTS_FILE
    if not path.is_file():
        pickled = [p.name for p in directory.glob("sae_weights.*") if p.suffix in (".pt", ".pth", ".bin", ".pkl")]
        why = f" ({pickled[0]} is a pickle, which qkv never loads)" if pickled else ""
        raise QkvError(f"{directory} has no {WEIGHTS_FILE}{why}; {FIX}")
    store = TensorStore(path)
    extra = sorted(set(store.names()) - set(NAMES) - {"scaling_factor"})
    if extra:
        raise QkvError(f"{path} holds {', '.join(extra[:3])} besides {', '.join(NAMES)}: not a TopK SAE qkv reads")
    shapes = config.shapes()
    shapes["scaling_factor"] = (config.d_sae,)
    for name, shape in shapes.items():
        found = store.shape(name)
        if found is None and name != "scaling_factor":
            raise QkvError(f"{path} has no tensor {name}; {FIX}")
        if found is not None and found != shape:
            sizes = f"d_in {config.d_in}, d_sae {config.d_sae}"
            raise QkvError(f"{path}: {name} has shape {found}, but {CFG_FILE} ({sizes}) implies {shape}; "
                           f"the weights and {CFG_FILE} disagree: {FIX}")
    try:
        params = {name: np.array(store.get(name, shapes[name], np.float32)) for name in NAMES}   # owned copies
        scale = store.get("scaling_factor", shapes["scaling_factor"]) if store.has("scaling_factor") else None
    except QkvError as e:                                                 # not floats, not finite, truncated
        raise QkvError(f"{path}: {e}") from None
    if scale is not None and not np.all(scale == 1):
        raise QkvError(f"{path} has a finetuning scaling_factor other than 1, which qkv does not apply")
    if rescale:
        norms = np.linalg.norm(params["W_dec"], axis=1)                   # (d_sae,)
        if not (np.isfinite(norms).all() and (norms > 0).all()):
            raise QkvError(f"{path}: a row of W_dec is 0 (or overflows), so rescale_acts_by_decoder_norm cannot be "
                           f"folded; {FIX}")
        params["b_enc"] *= norms
        params["W_enc"] *= norms[None, :]
        params["W_dec"] /= norms[:, None]
    return SAE(config, params)
