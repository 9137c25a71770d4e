"""SAELens's file layout: DIR/cfg.json + DIR/sae_weights.safetensors, read and written, for SAEs and transcoders.

    sae_weights.safetensors   W_enc (d_in, d_sae), b_enc (d_sae,), W_dec (d_sae, d_out), b_dec (d_out,), float32;
                              threshold (d_sae,) for JumpReLU; W_skip (d_out, d_in) for a skip transcoder
    cfg.json                  architecture, d_in, d_sae (d_out for a transcoder), k for TopK, hook_name, ...

SAELens computes as qkv does, rows as vectors: hidden_pre = (x − b_dec)·W_enc + b_enc, then the activation,
x̂ = z·W_dec + b_dec. So W_enc, b_enc, W_dec, b_dec and threshold are qkv's own, name for name, no transpose. The
one transpose: SAELens's SkipTranscoder keeps W_skip as (d_out, d_in) and adds x·W_skipᵀ; qkv's W_skip is
(d_in, d_out) and adds x·W_skip.

Architectures (cfg.json's "architecture" as SAELens 6.18 registers them) → qkv's:

    "topk"                    TopK, k per token (activation_fn "topk" + {"k": k} in SAELens 5's flat cfg)
    "jumprelu"                JumpReLU, z = ReLU(pre) ⊙ [pre > θ] (Gemma Scope's; qkv's z = pre ⊙ [pre > θ] is the
                              same once θ ≥ 0, so a negative θ is read as 0 — the same function, exactly)
    "standard"                ReLU
    "batchtopk", "matryoshka_batchtopk"
                              SAELens saves both for inference AS "jumprelu" (θ = the learned global threshold for
                              every latent: BatchTopKTrainingSAE.process_state_dict_for_saving_inference), which
                              reads as above. A training checkpoint's cfg.json still says batchtopk: with its
                              topk_threshold buffer it is read as that JumpReLU; without one, as TopK with k (the
                              batch's average, rounded) per token — Matryoshka's nested widths need nothing at
                              inference, so it is the same box.
    "transcoder"              a ReLU transcoder (d_out, hook_name_out; apply_b_dec_to_input false)
    "jumprelu_transcoder"     a JumpReLU transcoder (Gemma Scope's transcoders as SAELens loads them)
    "skip_transcoder"         a ReLU transcoder with W_skip
    "topk_transcoder", "topk_skip_transcoder", "jumprelu_skip_transcoder"
                              qkv's names, the same fields, for what SAELens 6.18 has no class for (it cannot load
                              them; qkv and these readers can)

What we write is the flat cfg.json of SAELens 5 (`SAEConfig.to_dict`: every field its `from_dict` needs). SAELens 6
reads that layout too: a cfg.json without a `sae_lens_version` goes through its `handle_pre_6_0_config`, which
turns activation_fn "topk" + k into its TopKSAE and moves hook_name / hook_name_out into its metadata (so a
transcoder's d_out and hook_name_out survive). We read both: that layout (and its older names hook_point,
activation_fn) and SAELens 6's (k at the top, model_name, hook_name, hook_name_out under "metadata").

Reading trusts neither file: cfg.json goes through runtime.io_json (bounded, at most 64 levels deep) and each key
it uses is typed and ranged (`Fields`: d_in 64.7 or hook_name 5 is one line naming the file and the key); the
weights must have the shapes cfg.json's d_in, d_sae and d_out imply, be floats (safetensors: never a pickle) and
finite.

Hook names (TransformerLens's, which SAELens uses) ↔ qkv's sites:
    blocks.L.hook_resid_pre   "resid" at layer L (the residual stream entering block L; qkv's hook "L.residual")
    blocks.L.hook_resid_post  "resid" at layer L+1 (what leaves block L enters block L+1)
    blocks.L.hook_attn_out    "attn_out" at layer L        blocks.L.hook_mlp_out   "ffn_out" at layer L
    blocks.L.ln2.hook_normalized, blocks.L.mlp.hook_in
                              "ffn_in" at layer L: what the FFN reads, after its norm (a transcoder's input;
                              the second is circuit-tracer's name for the same point; mlp.hook_out is its
                              name for hook_mlp_out)
    blocks.L.hook_resid_mid   "resid_mid" at layer L: the stream between attention and the FFN, before the
                              FFN's norm (what circuit-tracer's cross-layer transcoders read by default)
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
from .sae import MAX_D_IN, MAX_LATENTS, SAE, SAEConfig

CFG_FILE, WEIGHTS_FILE = "cfg.json", "sae_weights.safetensors"
FIX = f"give an SAE directory written by qkv or SAELens ({CFG_FILE} + {WEIGHTS_FILE})"
SITES = {"resid": "hook_resid_pre", "attn_out": "hook_attn_out", "ffn_out": "hook_mlp_out",
         "ffn_in": "ln2.hook_normalized", "resid_mid": "hook_resid_mid"}
_POINT_SITE = {"hook_resid_pre": "resid", "hook_attn_out": "attn_out", "hook_mlp_out": "ffn_out",
               "ln2.hook_normalized": "ffn_in", "mlp.hook_in": "ffn_in", "mlp.hook_out": "ffn_out",
               "hook_resid_mid": "resid_mid", "hook_resid_post": "resid"}
_HOOK = re.compile(r"^blocks\.(\d{1,6})\.(" + "|".join(re.escape(p) for p in _POINT_SITE) + ")$")
SAE_ARCHITECTURES = {"topk": "topk", "jumprelu": "jumprelu", "standard": "relu"}    # SAELens's → qkv's
_TRANSCODER = re.compile(r"^(topk_|jumprelu_)?(skip_)?transcoder$")                 # SAELens's and qkv's names
TRAINING = ("batchtopk", "matryoshka_batchtopk")                                     # saved for inference as jumprelu
KNOWN = (*SAE_ARCHITECTURES, *TRAINING, "transcoder", "skip_transcoder", "jumprelu_transcoder",
         "topk_transcoder", "topk_skip_transcoder", "jumprelu_skip_transcoder")


def hook_name(layer: int, site: str) -> str:
    """qkv's (layer, site) → TransformerLens's hook name: (15, "resid") → "blocks.15.hook_resid_pre",
    (3, "ffn_in") → "blocks.3.ln2.hook_normalized"."""
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
    return layer, _POINT_SITE[point]


def architecture_name(cfg: SAEConfig, skip: bool = False) -> str:
    """The cfg.json "architecture" SAELens gives this box: topk / jumprelu / standard for an SAE; transcoder,
    jumprelu_transcoder, skip_transcoder (and qkv's topk_transcoder, …_skip_transcoder) for a transcoder."""
    if not cfg.transcoder:
        return {v: k for k, v in SAE_ARCHITECTURES.items()}[cfg.architecture]
    prefix = {"relu": "", "topk": "topk_", "jumprelu": "jumprelu_"}[cfg.architecture]
    return f"{prefix}{'skip_' if skip else ''}transcoder"


def saelens_cfg(cfg: SAEConfig, *, context_size: int = 0, dataset_path: str = "", prepend_bos: bool = False,
                skip: bool = False) -> dict:
    """cfg.json as SAELens 5's SAEConfig.to_dict writes it (readable by SAELens 5 and 6), with a transcoder's
    d_out and hook_name_out (SAELens 6's TranscoderConfig field and metadata key)."""
    name = hook_name(cfg.layer, cfg.site) if cfg.layer is not None and cfg.site is not None else ""
    arch = architecture_name(cfg, skip)
    out = {
        "architecture": arch, "d_in": cfg.d_in, "d_sae": cfg.d_sae, "dtype": "float32", "device": "cpu",
        "model_name": cfg.model or "", "hook_name": name, "hook_layer": cfg.layer if cfg.layer is not None else 0,
        "hook_head_index": None, "activation_fn_str": "topk" if cfg.architecture == "topk" else "relu",
        "activation_fn_kwargs": {"k": cfg.k} if cfg.architecture == "topk" else {},
        "apply_b_dec_to_input": cfg.apply_b_dec_to_input, "finetuning_scaling_factor": False,
        "sae_lens_training_version": None, "prepend_bos": prepend_bos, "dataset_path": dataset_path,
        "dataset_trust_remote_code": False, "context_size": context_size, "normalize_activations": "none",
        "neuronpedia_id": None, "model_from_pretrained_kwargs": {}, "seqpos_slice": [None],
    }
    if cfg.transcoder:
        site_out = cfg.site_out or "ffn_out"
        out.update(d_out=cfg.width_out, hook_name_out=hook_name(cfg.layer, site_out) if cfg.layer is not None else "",
                   hook_head_index_out=None)
        if cfg.architecture == "topk":                  # SAELens 5's "topk" activation would make it a TopKSAE
            del out["activation_fn_str"], out["activation_fn_kwargs"]
            out["k"] = cfg.k
    return out


def saelens_tensors(sae: SAE) -> dict[str, np.ndarray]:
    """SAE's arrays under SAELens's names and shapes, float32 (W_skip transposed to SAELens's (d_out, d_in))."""
    tensors = {name: np.ascontiguousarray(arr, dtype=np.float32) for name, arr in sae.params.items()}
    if "W_skip" in tensors:
        tensors["W_skip"] = np.ascontiguousarray(tensors["W_skip"].T)                 # (d_out, d_in)
    return tensors


def write_saelens(batch: FileBatch, sae: SAE, **cfg_fields) -> None:
    """cfg.json and sae_weights.safetensors into BATCH's directory (renamed into place with the batch)."""
    tensors = saelens_tensors(sae)
    batch.write(WEIGHTS_FILE, lambda f: write_safetensors(f, tensors, {"format": "pt"}))
    cfg = saelens_cfg(sae.config, skip="W_skip" in sae.params, **cfg_fields)
    batch.write_text(CFG_FILE, json.dumps(cfg, indent=1))


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


class Plan:
    """What a cfg.json says, before the weights are read: qkv's config and how to read the tensors."""

    def __init__(self, config: SAEConfig, rescale: bool, skip: bool, batch_threshold: bool):
        self.config = config
        self.rescale = rescale                   # rescale_acts_by_decoder_norm: fold ‖W_dec‖ in after reading
        self.skip = skip                         # a skip transcoder: W_skip (d_out, d_in) is required
        self.batch_threshold = batch_threshold   # a BatchTopK training checkpoint: θ from its topk_threshold


def _architecture(cfg: Fields) -> tuple[str, str]:
    """(SAELens's architecture name, activation_fn) from cfg.json, the older spellings folded in."""
    fn = cfg.text("activation_fn_str", None) or cfg.text("activation_fn", None)
    arch = cfg.text("architecture", None)
    if arch is None:                             # SAELens 5 before "architecture": the activation says it
        arch = "topk" if fn == "topk" else "standard"
    if arch == "standard" and fn == "topk":      # SAELens 5 wrote TopK as standard + activation_fn "topk"
        arch = "topk"
    if arch not in KNOWN:
        raise QkvError(f"{cfg.source} describes a {arch!r} dictionary, which qkv does not read; give one of "
                       f"{', '.join(KNOWN)}")
    if fn not in (None, "relu", "topk", "jumprelu"):
        raise QkvError(f"{cfg.source}: activation_fn {fn!r} is not one qkv computes; give a ReLU, TopK or JumpReLU "
                       "dictionary")
    return arch, fn or "relu"


def _check_inputs(cfg: Fields) -> None:
    """Refuse what qkv does not compute: normalised or reshaped inputs."""
    norm = cfg.data.get("normalize_activations")
    if norm in (None, False):
        norm = "none"
    elif not isinstance(norm, str):
        cfg.text("normalize_activations")                                   # raises: it must be text
    if norm not in ("none", "expected_average_only_in"):
        raise QkvError(f"{cfg.source} normalises its inputs ({norm!r}), which qkv does not; give an SAE with "
                       "normalize_activations \"none\"")
    reshape = cfg.text("reshape_activations", "none")
    if reshape != "none":
        raise QkvError(f"{cfg.source} reshapes its inputs ({reshape!r}); qkv reads SAEs of one vector per token")


def _meta_text(cfg: Fields, meta: Fields, *keys: str) -> str | None:
    """The first of KEYS found in SAELens 6's metadata or at the top (SAELens 5), as text."""
    for key in keys:
        for where in (meta, cfg):
            if key in where and where.data[key] is not None:
                return where.text(key)
    return None


def _site(cfg: Fields, name: str | None) -> tuple[int | None, str | None]:
    """`site_of` a hook name cfg.json gives; one line when it names a point qkv's dictionaries do not read (an
    empty or absent name: (None, None), for the caller to give)."""
    layer, site = site_of(name)
    if name and site is None:
        raise QkvError(f"{cfg.source} reads {name!r}, a hook point qkv's dictionaries do not read; give one on "
                       "blocks.L.hook_resid_pre/post, hook_attn_out, hook_mlp_out, ln2.hook_normalized, mlp.hook_in "
                       "or hook_resid_mid")
    return layer, site


def plan_from_saelens(cfg: Fields | dict, where: str = "cfg.json") -> Plan:
    """What a cfg.json of SAELens 5 or 6 describes, every key read typed and ranged (one line naming WHERE
    and the key when it is not)."""
    if not isinstance(cfg, Fields):
        cfg = Fields(cfg, where, FIX)
    meta = cfg.object("metadata", {})
    arch, fn = _architecture(cfg)
    _check_inputs(cfg)
    kwargs = cfg.object("activation_fn_kwargs", {})
    d_in = cfg.integer("d_in", 1, MAX_D_IN)
    d_sae = cfg.integer("d_sae", 1, MAX_LATENTS)
    m = _TRANSCODER.match(arch)
    if arch in TRAINING:                          # TopK per token, or JumpReLU if the weights hold topk_threshold
        kind = "topk"
        k = max(1, min(d_sae, round(cfg.number("k", 0, d_sae) if "k" in cfg else kwargs.number("k", 0, d_sae))))
    else:
        kind = SAE_ARCHITECTURES[arch] if m is None else {"topk_": "topk", "jumprelu_": "jumprelu"}.get(m.group(1),
                                                                                                       "relu")
        k = (cfg.integer("k", 1, d_sae) if "k" in cfg else kwargs.integer("k", 1, d_sae)) if kind == "topk" else None
    layer, site = _site(cfg, _meta_text(cfg, meta, "hook_name", "hook_point"))
    d_out, site_out = None, None
    if m is not None:
        d_out = cfg.integer("d_out", 1, MAX_D_IN)
        layer_out, site_out = _site(cfg, _meta_text(cfg, meta, "hook_name_out"))
        if layer_out is not None and layer is not None and layer_out != layer:
            raise QkvError(f"{cfg.source}: it reads layer {layer} and writes layer {layer_out}; qkv reads transcoders "
                           "that write the FFN output of the layer they read (one cross-layer decoder: see "
                           "features.circuit_tracer)")
        site_out = site_out or "ffn_out"
    config = SAEConfig(d_in=d_in, d_sae=d_sae, k=k, apply_b_dec_to_input=cfg.boolean("apply_b_dec_to_input", m is None),
                       model=_meta_text(cfg, meta, "model_name") or None, layer=layer, site=site,
                       architecture=kind, d_out=d_out, site_out=site_out)
    return Plan(config.check(), cfg.boolean("rescale_acts_by_decoder_norm", False),
                m is not None and m.group(2) is not None, arch in TRAINING)


def config_from_saelens(cfg: Fields | dict, where: str = "cfg.json") -> tuple[SAEConfig, bool]:
    """(qkv's SAEConfig, rescale_acts_by_decoder_norm) from a cfg.json of SAELens 5 or 6."""
    plan = plan_from_saelens(cfg, where)
    return plan.config, plan.rescale


def _tensor_shapes(plan: Plan) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(required, optional) tensors of the file, SAELens's names and shapes (W_skip as SAELens keeps it)."""
    cfg = plan.config
    required = cfg.shapes()
    optional = {"scaling_factor": (cfg.d_sae,)}
    if plan.skip:
        required["W_skip"] = (cfg.width_out, cfg.d_in)                       # SAELens: (d_out, d_in)
    if plan.batch_threshold:
        optional["topk_threshold"] = ()
    return required, optional


def fold_decoder_norm(params: dict[str, np.ndarray], where: str) -> None:
    """rescale_acts_by_decoder_norm folded in, in place, as SAELens folds it: b_enc·‖w_j‖, W_enc's columns
    ·‖w_j‖, W_dec's rows /‖w_j‖ — the same box with unit-norm decoder rows."""
    norms = np.linalg.norm(params["W_dec"], axis=1)                       # (d_sae,)
    if not (np.isfinite(norms).all() and (norms > 0).all()):
        raise QkvError(f"{where}: a row of W_dec is 0 (or overflows), so rescale_acts_by_decoder_norm cannot be "
                       f"folded; {FIX}")
    params["b_enc"] *= norms
    params["W_enc"] *= norms[None, :]
    params["W_dec"] /= norms[:, None]


def read_weights(path: Path, required: dict[str, tuple[int, ...]], optional: dict[str, tuple[int, ...]],
                 fix: str = FIX, shapes_from: str = CFG_FILE, ignore: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The tensors of safetensors file PATH by name, float32 owned copies: every REQUIRED one with its shape,
    the OPTIONAL ones present with theirs, nothing else (but IGNORE, left unread); floats and finite, or one line
    naming PATH."""
    store = TensorStore(path)
    extra = sorted(set(store.names()) - set(required) - set(optional) - set(ignore))
    if extra:
        raise QkvError(f"{path} holds {', '.join(extra[:3])} besides {', '.join(required)}: not a dictionary "
                       f"qkv reads; {fix}")
    for name, shape in {**optional, **required}.items():
        found = store.shape(name)
        if found is None and name in required:
            raise QkvError(f"{path} has no tensor {name}; {fix}")
        if found is not None and found != shape:
            raise QkvError(f"{path}: {name} has shape {found}, but {shapes_from} implies {shape}; the weights and "
                           f"{shapes_from.split(' (')[0]} disagree: {fix}")
    try:
        return {name: np.array(store.get(name, shape, np.float32)) for name, shape in {**required, **optional}.items()
                if store.has(name)}
    except QkvError as e:                                                 # not floats, not finite, truncated
        raise QkvError(f"{path}: {e}") from None


def clamp_threshold(params: dict[str, np.ndarray]) -> None:
    """θ ← max(θ, 0), in place: SAELens and Gemma Scope compute ReLU(pre)·[pre > θ], qkv pre·[pre > θ]; with
    θ ≥ 0 these agree, and max(θ, 0) makes them agree for every θ (a negative θ lets only pre > 0 through)."""
    if "threshold" in params:
        np.maximum(params["threshold"], 0, out=params["threshold"])


def load_saelens(directory: str | Path) -> SAE:
    """The SAE or transcoder in DIRECTORY (cfg.json + sae_weights.safetensors, SAELens 5 or 6), float32.

    A file saved with rescale_acts_by_decoder_norm (SAELens's topk training option, usually folded before
    saving) is folded here the way SAELens folds it (`fold_decoder_norm`)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise QkvError(f"{directory} is not a directory; {FIX}")
    plan = plan_from_saelens(read_cfg(directory))
    path = directory / WEIGHTS_FILE
    if not path.is_file():
        pickled = [p.name for p in directory.glob("sae_weights.*") if p.suffix in (".pt", ".pth", ".bin", ".pkl")]
        why = f" ({pickled[0]} is a pickle, which qkv never loads)" if pickled else ""
        raise QkvError(f"{directory} has no {WEIGHTS_FILE}{why}; {FIX}")
    required, optional = _tensor_shapes(plan)
    if plan.batch_threshold and TensorStore(path).shape("topk_threshold") == (1,):
        optional["topk_threshold"] = (1,)                  # a scalar saved as one number (torch writes shape ())
    c = plan.config
    sizes = f"d_in {c.d_in}, d_sae {c.d_sae}" + (f", d_out {c.d_out}" if c.transcoder else "")
    params = read_weights(path, required, optional, shapes_from=f"{CFG_FILE} ({sizes})")
    scale = params.pop("scaling_factor", None)
    if scale is not None and not np.all(scale == 1):
        raise QkvError(f"{path} has a finetuning scaling_factor other than 1, which qkv does not apply")
    config = plan.config
    if "topk_threshold" in params:                                        # BatchTopK as SAELens saves it to use
        config.architecture, config.k = "jumprelu", None
        params["threshold"] = np.full(config.d_sae, params.pop("topk_threshold").reshape(()), np.float32)
    if plan.skip:
        params["W_skip"] = np.ascontiguousarray(params["W_skip"].T)        # (d_in, d_out)
    if plan.rescale:
        fold_decoder_norm(params, str(path))
    clamp_threshold(params)
    return SAE(config, params)
