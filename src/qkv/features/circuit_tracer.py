"""circuit-tracer's transcoders: a folder with config.yaml and one file per layer (or a cross-layer transcoder).

    config.yaml           model_kind        "transcoder_set" (per-layer) or "cross_layer_transcoder"
                          model_name        the model they were trained on
                          feature_input_hook, feature_output_hook
                                            TransformerLens hook names without "blocks.L.": "ln2.hook_normalized" or
                                            "mlp.hook_in" (qkv's ffn_in), "hook_mlp_out" or "mlp.hook_out" (ffn_out),
                                            "hook_resid_mid" (resid_mid: the stream before the FFN's norm)
                          activation, k     "topk" with k, "relu"; absent: JumpReLU if the files hold a threshold
                          transcoders       optional: one file per layer, in layer order (older configs: a list of
                                            {id, layer, filepath}); absent: layer_0.safetensors, layer_1…
    layer_L.safetensors   W_enc (d_sae, d_model)   — nn.Linear's layout: qkv's W_enc TRANSPOSED
                          b_enc (d_sae,), W_dec (d_sae, d_model), b_dec (d_model,)   — as qkv's
                          activation_function.threshold (d_sae,)   JumpReLU's θ
                          W_skip (d_model, d_model)   added as x·W_skipᵀ — qkv's W_skip TRANSPOSED
                          (a params.npz here is Gemma Scope's: `features.gemmascope`)

circuit-tracer's SingleLayerTranscoder: pre = x·W_encᵀ + b_enc (F.linear), z = act(pre), out = z·W_dec + b_dec
(+ x·W_skipᵀ). Its JumpReLU is pre ⊙ [pre > θ], qkv's own. Its TopK keeps the k largest pre-activations WITHOUT a
ReLU; qkv's ReLUs them, so the two agree whenever each token's k-th largest pre-activation is positive (a trained
transcoder with d_sae ≫ k: practically always) and differ only on tokens where fewer than k latents are positive.

The cross-layer transcoder (CLT: "Circuit Tracing", Ameisen et al. 2025): layer l's features read that layer's
input and write to the FFN output of EVERY layer l' ≥ l:

    W_enc_l.safetensors   W_enc_l (d_sae, d_model) (transposed, as above), b_enc_l (d_sae,), b_dec_l (d_model,),
                          threshold_l (d_sae,) for JumpReLU
    W_dec_l.safetensors   W_dec_l (d_sae, L − l, d_model): W_dec_l[:, l' − l] writes into layer l''s output

    ŷ_l' = b_dec_l' + Σ_{l ≤ l'} z_l·W_dec_l[:, l' − l]

YAML is read with PyYAML's safe loader when it is installed (no aliases, no tags: plain data only) and refused in
one line otherwise; a config.json with the same keys is read everywhere. Paths in the config are local, relative to
its folder; an "hf://" address is refused (qkv does not download: fetch the files and list them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import FileBatch, open_regular
from ..runtime.io_json import MAX_DEPTH, Fields, depth, read_json
from ..checkpoints.tensors import TensorStore, write_safetensors
from .sae import MAX_D_IN, MAX_LATENTS, SAE, SAEConfig
from .saelens import read_weights, site_of

YAML, JSON = "config.yaml", "config.json"
FIX = "give a circuit-tracer transcoder folder (config.yaml or config.json + layer_L.safetensors)"
THRESHOLD = "activation_function.threshold"
YAML_LIMIT = 1 << 20


# ── the config ───────────────────────────────────────────────────────────────────

def _parse_yaml(path: Path) -> dict:
    """PATH's YAML as plain data: PyYAML's safe loader, aliases refused, at most YAML_LIMIT bytes."""
    try:
        import yaml
    except ImportError:
        raise QkvError(f"{path} is YAML and PyYAML is not installed; install pyyaml, or write the same keys to "
                       f"{path.parent / JSON}") from None
    try:
        with open_regular(path, YAML_LIMIT) as f:
            text = f.read(YAML_LIMIT + 1).decode("utf-8")
        if any(isinstance(e, yaml.AliasEvent) for e in yaml.parse(text)):
            raise QkvError(f"{path} uses YAML aliases (*name), which qkv does not read; write the values out")
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise QkvError(f"{path} cannot be read as YAML ({str(e).splitlines()[0] if str(e) else e}); {FIX}") from None
    if not isinstance(data, dict):
        raise QkvError(f"{path} is not a mapping of keys; {FIX}")
    if depth(data) > MAX_DEPTH:
        raise QkvError(f"{path} is nested too deeply; {FIX}")
    return data


def read_config(directory: Path) -> Fields:
    """DIRECTORY's config.yaml (or config.json) as Fields."""
    if (directory / YAML).is_file():
        return Fields(_parse_yaml(directory / YAML), str(directory / YAML), FIX)
    if (directory / JSON).is_file():
        return Fields(read_json(directory / JSON, fix=FIX), str(directory / JSON), FIX)
    raise QkvError(f"{directory} has no {YAML} or {JSON}; {FIX}")


def is_circuit_tracer(directory: Path) -> bool:
    """True when DIRECTORY looks like circuit-tracer's: a config naming feature_input_hook."""
    for name in (YAML, JSON):
        path = directory / name
        if path.is_file() and path.stat().st_size <= YAML_LIMIT and b"feature_input_hook" in path.read_bytes():
            return True
    return False


def hooks(cfg: Fields) -> tuple[str, str]:
    """(site, site_out) in qkv's names from feature_input_hook / feature_output_hook (one line if unknown)."""
    sites = []
    for key in ("feature_input_hook", "feature_output_hook"):
        hook = cfg.text(key)
        site = site_of(f"blocks.0.{hook}")[1]
        if site is None:
            raise QkvError(f"{cfg.source}: {key} {hook!r} is not a point qkv reads; give ln2.hook_normalized or "
                           "mlp.hook_in (the FFN's input), hook_resid_mid, or hook_mlp_out / mlp.hook_out (its output)")
        sites.append(site)
    if sites[1] != "ffn_out":
        raise QkvError(f"{cfg.source}: these transcoders write {cfg.text('feature_output_hook')!r}; qkv's replace "
                       "the FFN's output (hook_mlp_out)")
    return sites[0], sites[1]


def layer_files(cfg: Fields, directory: Path) -> dict[int, Path]:
    """Layer → its file: the config's list (paths relative to DIRECTORY) or layer_L.safetensors in DIRECTORY."""
    if "transcoders" not in cfg:
        found = {}
        for path in directory.glob("layer_*.safetensors"):
            m = re.fullmatch(r"layer_(\d{1,6})\.safetensors", path.name)
            if m:
                found[int(m.group(1))] = path
        if not found:
            raise QkvError(f"{directory} has no layer_L.safetensors and its config lists no transcoders; {FIX}")
        return found
    out = {}
    for i, item in enumerate(cfg.array("transcoders", max_len=4096)):
        if isinstance(item, dict):                                 # older configs: {id, layer, filepath}
            entry = cfg.sub(f"transcoders[{i}]", item)
            layer, where = entry.integer("layer", 0, 4095), entry.text("filepath")
        elif isinstance(item, str):
            layer, where = i, item
        else:
            raise QkvError(f"{cfg.source}: transcoders[{i}] must be a path or {{layer, filepath}}; {FIX}")
        if "://" in where:
            raise QkvError(f"{cfg.source}: transcoders[{i}] is {where!r}, an address; qkv does not download: fetch "
                           "the files and list their local paths (relative to the config's folder)")
        if layer in out:
            raise QkvError(f"{cfg.source}: layer {layer} has two transcoders; give one file per layer")
        out[layer] = directory / where
    return out


# ── one layer ────────────────────────────────────────────────────────────────────

def load_layer(path: Path, layer: int, cfg: Fields) -> SAE:
    """One layer's transcoder from PATH (circuit-tracer's safetensors, or Gemma Scope's params.npz) as qkv's SAE."""
    site, site_out = hooks(cfg)
    model = cfg.text("model_name", None)
    if path.suffix == ".npz":
        from .gemmascope import load_gemma_scope

        return load_gemma_scope(path, layer=layer, site=site, transcoder=True, model=model)
    if not path.is_file():
        raise QkvError(f"{path} is missing (named by {cfg.source}); {FIX}")
    store = TensorStore(path)
    enc, bias = store.shape("W_enc"), store.shape("b_dec")
    if enc is None or len(enc) != 2 or bias is None or len(bias) != 1:
        raise QkvError(f"{path} has no 2-D W_enc or no 1-D b_dec; {FIX}")
    (n, d), (o,) = enc, bias                                                    # W_enc (d_sae, d_model), b_dec (d_out,)
    if not (1 <= d <= MAX_D_IN and 1 <= n <= MAX_LATENTS and 1 <= o <= MAX_D_IN):
        raise QkvError(f"{path}: W_enc {enc} or b_dec {bias} is out of range; {FIX}")
    required = {"W_enc": (n, d), "b_enc": (n,), "W_dec": (n, o), "b_dec": (o,)}
    activation = cfg.text("activation", None, choices=("topk", "relu", "jump_relu", "jumprelu"))
    if activation in ("jump_relu", "jumprelu") or (activation is None and store.has(THRESHOLD)):
        required[THRESHOLD] = (n,)
    k = cfg.integer("k", 1, n) if activation == "topk" else None
    params = read_weights(path, required, {"W_skip": (o, d)}, FIX, f"W_enc's shape {(n, d)}",
                          ignore=("k",))                      # circuit-tracer's integer k: the config's is used
    params["W_enc"] = np.ascontiguousarray(params["W_enc"].T)                   # (d, n)
    if "W_skip" in params:
        params["W_skip"] = np.ascontiguousarray(params["W_skip"].T)             # (d, o)
    if THRESHOLD in params:
        params["threshold"] = params.pop(THRESHOLD)
    arch = "topk" if activation == "topk" else "jumprelu" if "threshold" in params else "relu"
    config = SAEConfig(d_in=d, d_sae=n, k=k, apply_b_dec_to_input=False, model=model, layer=layer, site=site,
                       architecture=arch, d_out=o, site_out=site_out)
    return SAE(config, params)


# ── a set of per-layer transcoders ───────────────────────────────────────────────

def load_circuit_tracer(directory: str | Path) -> dict[int, SAE]:
    """Every layer's transcoder in DIRECTORY (model_kind transcoder_set), layer → SAE."""
    directory = Path(directory)
    cfg = read_config(directory)
    kind = cfg.text("model_kind", "transcoder_set", choices=("transcoder_set", "cross_layer_transcoder"))
    if kind == "cross_layer_transcoder":
        raise QkvError(f"{cfg.source} describes a cross-layer transcoder; read it with load_clt "
                       "(features.circuit_tracer), not as per-layer transcoders")
    return {layer: load_layer(path, layer, cfg) for layer, path in sorted(layer_files(cfg, directory).items())}


def circuit_tracer_hook(site: str) -> str:
    """qkv's site → circuit-tracer's hook name (without "blocks.L.")."""
    names = {"ffn_in": "mlp.hook_in", "ffn_out": "mlp.hook_out", "resid_mid": "hook_resid_mid"}
    if site not in names:
        raise QkvError(f"circuit-tracer's transcoders read the FFN's input and write its output; this one reads {site!r}")
    return names[site]


def save_circuit_tracer(transcoders: dict[int, SAE], directory: str | Path) -> Path:
    """DIRECTORY/config.yaml + layer_L.safetensors for layers 0..L−1 (each as circuit-tracer saves it, W_enc and
    W_skip transposed). All transcoders must share one architecture, k and sites."""
    if not transcoders or sorted(transcoders) != list(range(len(transcoders))):
        raise QkvError("circuit-tracer needs a transcoder for every layer 0..L−1; give all of them")
    first = transcoders[0].config
    for layer, sae in transcoders.items():
        c = sae.config
        if not c.transcoder or c.apply_b_dec_to_input:
            raise QkvError(f"layer {layer} is an SAE, not a transcoder; circuit-tracer's layout holds transcoders")
        if (c.architecture, c.k, c.site, c.site_out) != (first.architecture, first.k, first.site, first.site_out):
            raise QkvError("circuit-tracer's config has one activation, k and pair of hooks for every layer; "
                           f"layer {layer} differs from layer 0")
    lines = ["model_kind: transcoder_set", f"model_name: {json.dumps(first.model or '')}",
             f"feature_input_hook: {json.dumps(circuit_tracer_hook(first.site or 'ffn_in'))}",
             f"feature_output_hook: {json.dumps(circuit_tracer_hook(first.site_out or 'ffn_out'))}"]
    if first.architecture in ("topk", "relu"):
        lines.append(f"activation: {first.architecture}")
    if first.architecture == "topk":
        lines.append(f"k: {first.k}")
    with FileBatch(directory) as batch:
        for layer, sae in transcoders.items():
            tensors = {"W_enc": sae.W_enc.T, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
            if "threshold" in sae.params:
                tensors[THRESHOLD] = sae.params["threshold"]
            if "W_skip" in sae.params:
                tensors["W_skip"] = sae.params["W_skip"].T
            tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
            batch.write(f"layer_{layer}.safetensors", lambda f, t=tensors: write_safetensors(f, t))
        batch.write_text(YAML, "\n".join(lines) + "\n")
    return Path(directory)


# ── the cross-layer transcoder ───────────────────────────────────────────────────

class CrossLayerTranscoder:
    """L encoders and L(L+1)/2 decoders (module docstring), in qkv's orientation: W_enc[l] (d_model, d_sae),
    W_dec[l] (d_sae, L − l, d_model)."""

    def __init__(self, W_enc: list[np.ndarray], b_enc: np.ndarray, W_dec: list[np.ndarray], b_dec: np.ndarray,
                 threshold: np.ndarray | None, *, site: str = "resid_mid", site_out: str = "ffn_out",
                 model: str | None = None):
        self.W_enc, self.b_enc, self.W_dec, self.b_dec, self.threshold = W_enc, b_enc, W_dec, b_dec, threshold
        self.n_layers, self.d_sae = b_enc.shape                    # (L, d_sae)
        self.d_model = b_dec.shape[1]
        self.site, self.site_out, self.model = site, site_out, model

    def encode(self, layer: int, x: np.ndarray) -> np.ndarray:
        """x (n, d_model) read at LAYER → z (n, d_sae): ReLU, or pre ⊙ [pre > θ] (circuit-tracer's JumpReLU)."""
        pre = x @ self.W_enc[layer] + self.b_enc[layer]            # (n, d_sae)
        if self.threshold is None:
            return np.maximum(pre, 0)
        return np.where(pre > self.threshold[layer], pre, 0).astype(pre.dtype, copy=False)

    def decode(self, zs: dict[int, np.ndarray], layer: int) -> np.ndarray:
        """ŷ at LAYER's FFN output (n, d_model) = b_dec[LAYER] + Σ_{l ≤ LAYER} zs[l]·W_dec[l][:, LAYER − l]."""
        out = np.broadcast_to(self.b_dec[layer], (next(iter(zs.values())).shape[0], self.d_model)).copy()
        for src, z in zs.items():
            if src <= layer:
                out += z @ self.W_dec[src][:, layer - src]             # (n, d_model)
        return out

    def forward(self, xs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Every layer's input (layer → (n, d_model)) → every layer's predicted FFN output."""
        zs = {layer: self.encode(layer, x) for layer, x in xs.items()}
        return {layer: self.decode(zs, layer) for layer in range(self.n_layers)}


def load_clt(directory: str | Path, *, model: str | None = None) -> CrossLayerTranscoder:
    """The cross-layer transcoder in DIRECTORY (W_enc_l / W_dec_l safetensors; a config, if present, gives the
    hooks and the model), every file's shapes checked against layer 0's."""
    directory = Path(directory)
    site, site_out = "resid_mid", "ffn_out"
    if (directory / YAML).is_file() or (directory / JSON).is_file():
        cfg = read_config(directory)
        site, site_out = hooks(cfg)
        model = cfg.text("model_name", None) or model
    layers = sorted(int(m.group(1)) for p in directory.glob("W_enc_*.safetensors")
                    if (m := re.fullmatch(r"W_enc_(\d{1,6})\.safetensors", p.name)))
    if not layers or layers != list(range(len(layers))):
        raise QkvError(f"{directory} has no W_enc_0.safetensors … W_enc_{{L−1}}.safetensors in order; give a "
                       "circuit-tracer cross-layer transcoder folder")
    L = len(layers)
    first = TensorStore(directory / "W_enc_0.safetensors").shape("W_enc_0")
    if first is None or len(first) != 2:
        raise QkvError(f"{directory / 'W_enc_0.safetensors'} has no 2-D W_enc_0; give a cross-layer transcoder folder")
    n, d = first
    has_threshold = TensorStore(directory / "W_enc_0.safetensors").has("threshold_0")
    W_enc, W_dec, b_enc, b_dec, thr = [], [], np.zeros((L, n), np.float32), np.zeros((L, d), np.float32), []
    for l in range(L):
        req = {f"W_enc_{l}": (n, d), f"b_enc_{l}": (n,), f"b_dec_{l}": (d,)}
        if has_threshold:
            req[f"threshold_{l}"] = (n,)
        enc = read_weights(directory / f"W_enc_{l}.safetensors", req, {}, "give a cross-layer transcoder folder",
                           "W_enc_0's shape")
        dec = read_weights(directory / f"W_dec_{l}.safetensors", {f"W_dec_{l}": (n, L - l, d)}, {},
                           "give a cross-layer transcoder folder", f"{L} layers and W_enc_0's shape")
        W_enc.append(np.ascontiguousarray(enc[f"W_enc_{l}"].T))                  # (d, n)
        b_enc[l], b_dec[l] = enc[f"b_enc_{l}"], enc[f"b_dec_{l}"]
        if has_threshold:
            thr.append(enc[f"threshold_{l}"])
        W_dec.append(dec[f"W_dec_{l}"])                                          # (n, L − l, d)
    return CrossLayerTranscoder(W_enc, b_enc, W_dec, b_dec, np.stack(thr) if has_threshold else None,
                                site=site, site_out=site_out, model=model)
