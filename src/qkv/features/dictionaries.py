"""Any dictionary as the field stores it: which layout a path is in, every layer's transcoder, and whether it fits.

    load_dictionary(path)        one SAE or transcoder, whatever its layout (below), as qkv's SAE
    load_transcoders(path)       layer → transcoder, from a folder of per-layer transcoders in any of these layouts
    check_fits(model, d)         None, or one QkvError: d's widths, layer or hook point do not fit MODEL

Layouts, told apart by their files (never by a name's spelling alone):

    SAELens            DIR/cfg.json + DIR/sae_weights.safetensors          `features.saelens`
    sparsify           DIR/cfg.json + DIR/sae.safetensors                  `features.sparsify`
    Gemma Scope        params.npz / params.safetensors (or DIR holding one) `features.gemmascope`
    circuit-tracer     DIR/config.yaml|json + layer_L.safetensors           `features.circuit_tracer`
                       (one layer: give the file DIR/layer_L.safetensors)
    qkv's transcoders  DIR/layer_NN/ each in SAELens's layout (`qkv transcoders train`)
    per-layer folders  DIR/<anything naming layer L>/ in any one-file layout above (sparsify's layers.L.mlp,
                       Gemma Scope's layer_L/…/params.npz with one file per layer)

A cross-layer transcoder (DIR/W_enc_0.safetensors …) is not one dictionary per layer: `circuit_tracer.load_clt`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Union

from ..runtime.errors import QkvError
from .circuit_tracer import CrossLayerTranscoder, is_circuit_tracer, load_circuit_tracer, load_layer, read_config
from .gemmascope import NPZ, SAFETENSORS, load_gemma_scope
from .sae import SAE
from .saelens import CFG_FILE, WEIGHTS_FILE, load_saelens
from .sparsify import is_sparsify, load_sparsify

if TYPE_CHECKING:
    from ..models.model import Model

FIX = ("give a dictionary folder in SAELens's layout (cfg.json + sae_weights.safetensors), sparsify's (cfg.json + "
       "sae.safetensors), Gemma Scope's params.npz, or circuit-tracer's (config.yaml + layer_L.safetensors)")
SITES = ("resid", "attn_out", "ffn_out", "ffn_in", "resid_mid")     # the points qkv's dictionaries may read
FFN_INPUTS = ("ffn_in", "resid_mid")          # what a transcoder of an FFN may read
Dictionary = Union[SAE, Mapping[int, SAE], CrossLayerTranscoder]
_LAYER_DIR = re.compile(r"(?:^|[._-])(?:layer|layers|h|blocks)[._-]?(\d{1,6})(?:$|[._-])")


def layout(path: Path) -> str:
    """Which layout PATH is in: "saelens", "sparsify", "gemmascope", "circuit_tracer", "clt", "layers", or one
    QkvError saying what it found."""
    if path.is_file():
        if path.suffix == ".npz" or path.name == SAFETENSORS:
            return "gemmascope"
        if re.fullmatch(r"layer_\d{1,6}\.safetensors", path.name) and is_circuit_tracer(path.parent):
            return "circuit_tracer"
        raise QkvError(f"{path} is a file qkv cannot place in a layout; {FIX}")
    if not path.is_dir():
        raise QkvError(f"{path} is not a directory (nor a dictionary's file); {FIX}")
    if (path / CFG_FILE).is_file() and (path / WEIGHTS_FILE).is_file():
        return "saelens"
    if is_sparsify(path):
        return "sparsify"
    if (path / NPZ).is_file() or (path / SAFETENSORS).is_file():
        return "gemmascope"
    if (path / "W_enc_0.safetensors").is_file():
        return "clt"
    if is_circuit_tracer(path):
        return "circuit_tracer"
    if layer_dirs(path):
        return "layers"
    if (path / CFG_FILE).is_file() or list(path.glob("*.pt")) or list(path.glob("*.bin")):
        return "saelens"                                  # its reader names what is missing (or the pickle)
    raise QkvError(f"{path} holds no dictionary qkv knows; {FIX}")


def load_dictionary(path: str | Path, **where) -> SAE:
    """The one SAE or transcoder at PATH, its layout detected (`layout`). WHERE (layer=, site=, transcoder=,
    model=) tells Gemma Scope's files where they read, which they do not say themselves."""
    path = Path(path)
    kind = layout(path)
    if kind == "saelens":
        return load_saelens(path)
    if kind == "sparsify":
        return load_sparsify(path, model=where.get("model"))
    if kind == "gemmascope":
        return load_gemma_scope(path, **where)
    if kind == "circuit_tracer" and path.is_file():
        layer = int(re.fullmatch(r"layer_(\d+)\.safetensors", path.name).group(1))
        return load_layer(path, layer, read_config(path.parent))
    if kind == "clt":
        raise QkvError(f"{path} is a cross-layer transcoder: its features write to every later layer, so it is not "
                       "one dictionary; read it with features.circuit_tracer.load_clt")
    raise QkvError(f"{path} holds one transcoder per layer; give one layer's folder or file (e.g. "
                   f"{path / 'layer_00'}), or read them all with load_transcoders")


def layer_dirs(path: Path) -> dict[int, Path]:
    """Layer → sub-folder of PATH whose name names one layer (layer_03, layers.3.mlp, h.3), when there is one."""
    out: dict[int, Path] = {}
    for sub in sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink()):
        m = _LAYER_DIR.search(sub.name)
        if m is None:
            continue
        layer = int(m.group(1))
        if layer in out:
            raise QkvError(f"{path} has two folders for layer {layer} ({out[layer].name}, {sub.name}); keep one")
        out[layer] = sub
    return out


def _one_file(sub: Path) -> Path:
    """SUB itself if it is a dictionary folder, else the one params.npz/params.safetensors beneath it."""
    try:
        layout(sub)
        return sub
    except QkvError:
        found = sorted(p for name in (NPZ, SAFETENSORS) for p in sub.rglob(name))
        if len(found) != 1:
            raise QkvError(f"{sub} holds {len(found) or 'no'} dictionaries; give a folder with one per layer "
                           f"(Gemma Scope: pick one width and L0 per layer)") from None
        return found[0]


def load_transcoders(path: str | Path) -> dict[int, SAE]:
    """Every layer's transcoder at PATH, layer → SAE: circuit-tracer's folder, or one sub-folder per layer in any
    one-dictionary layout (qkv's DIR/layer_NN/, sparsify's layers.L.mlp/, Gemma Scope's layer_L/…), or PATH itself
    when it is one transcoder that names its layer. Each must be a transcoder of an FFN (reading what the FFN reads,
    ffn_in or resid_mid, and writing its output), and one whose file names its layer must name the folder's. The
    one place transcoders are read: every command and the server call this."""
    found = dict(sorted(_transcoders(Path(path)).items()))
    for layer, sae in found.items():
        c = sae.config
        if c.site not in FFN_INPUTS or (c.site_out or "ffn_out") != "ffn_out":
            raise QkvError(f"layer {layer}'s transcoder reads {c.site!r} and writes {c.site_out!r}; give transcoders "
                           "that write a layer's FFN output (ffn_out) from its input (ffn_in or resid_mid)")
    return found


def _transcoders(path: Path) -> dict[int, SAE]:
    """load_transcoders before the FFN check: layer → transcoder, by layout."""
    kind = layout(path)
    if kind == "circuit_tracer" and path.is_dir():
        return load_circuit_tracer(path)
    if kind == "clt":
        raise QkvError(f"{path} is a cross-layer transcoder; read it with features.circuit_tracer.load_clt")
    if kind != "layers":                                  # one transcoder: its own layer
        sae = load_dictionary(path)
        if not sae.config.transcoder or sae.config.layer is None:
            raise QkvError(f"{path} is one {'SAE' if not sae.config.transcoder else 'transcoder of no named layer'}, "
                           "not a folder of per-layer transcoders; give the folder that holds layer_00/, layer_01/, …")
        return {sae.config.layer: sae}
    out = {}
    for layer, sub in sorted(layer_dirs(path).items()):
        sae = load_dictionary(_one_file(sub), layer=layer, transcoder=True)
        if not sae.config.transcoder:
            raise QkvError(f"{sub} is an SAE (it reads and writes {sae.config.site}), not a transcoder; give a folder "
                           "of transcoders")
        if sae.config.layer is None:
            sae.config.layer = layer
        elif sae.config.layer != layer:
            raise QkvError(f"{sub} is named for layer {layer} but its transcoder reads layer {sae.config.layer}; "
                           "rename the folder or fix its cfg.json")
        out[layer] = sae
    return out


# ── does it fit the model? ───────────────────────────────────────────────────────

def _fits(model: "Model", sae: SAE, what: str) -> None:
    """One dictionary against MODEL's width, layers and hook points."""
    cfg, mc = sae.config, model.config
    trained = f" (it was trained on {cfg.model})" if cfg.model else ""
    for name, width in (("reads", cfg.d_in), ("writes", cfg.width_out)):
        if width != mc.d_model:
            raise QkvError(f"{what} {name} {width}-wide vectors and {model.name}'s stream is {mc.d_model} wide; "
                           f"give the model it was trained on{trained}")
    if cfg.layer is None or cfg.site is None:
        raise QkvError(f"{what} does not say which layer and hook point it reads; give a dictionary whose config names "
                       "them (SAELens: hook_name)")
    last = mc.n_layers if cfg.site == "resid" else mc.n_layers - 1     # resid at L: what leaves the last block
    if not 0 <= cfg.layer <= last:
        raise QkvError(f"{what} reads layer {cfg.layer} and {model.name} has layers 0..{mc.n_layers - 1}; give the "
                       f"model it was trained on{trained}")
    for site in (cfg.site, cfg.site_out):
        if site is not None and site not in SITES:
            raise QkvError(f"{what} reads or writes {site!r}, not a hook point qkv reads; give one on "
                           f"{', '.join(SITES)}")
    if "ffn" in f"{cfg.site} {cfg.site_out}" and mc.d_ff == 0:
        raise QkvError(f"{what} reads or writes an FFN and {model.name} has none (attention-only)")
    if cfg.site == "resid_mid" and mc.parallel_residual:
        raise QkvError(f"{what} reads the stream between attention and the FFN, and {model.name}'s blocks run them in "
                       "parallel (no such stream); give a dictionary on the FFN's input (ffn_in)")


def check_fits(model: "Model", dictionary: Dictionary) -> None:
    """Raise one QkvError when DICTIONARY (an SAE, layer → transcoder, or a cross-layer transcoder) does not fit
    MODEL: a width other than d_model, a layer it lacks, a hook point qkv cannot read."""
    if isinstance(dictionary, SAE):
        _fits(model, dictionary, "the dictionary")
    elif isinstance(dictionary, CrossLayerTranscoder):
        mc = model.config
        if dictionary.d_model != mc.d_model or dictionary.n_layers != mc.n_layers:
            raise QkvError(f"the cross-layer transcoder has {dictionary.n_layers} layers of width {dictionary.d_model} "
                           f"and {model.name} {mc.n_layers} of width {mc.d_model}; give the model it was trained on")
    else:
        if not dictionary:
            raise QkvError("no transcoders to check; give a folder with one per layer")
        for layer, sae in dictionary.items():
            _fits(model, sae, f"the transcoder of layer {layer}")
