"""What loading a model costs: seconds and memory, qkv beside transformers.

Each load runs in a fresh child process (so its peak is its own): the libraries imported first (qkv and
numba; torch and transformers), then the resident memory read (the baseline), then the model loaded
and timed, then the peak resident memory (getrusage's ru_maxrss) and the memory still held read.

    peak − baseline    what the load needed at its worst
    held − baseline    what the loaded model keeps
    ÷ file             those over the size of the weights' file (the GGUF file; the safetensors shards)

qkv loads SOURCE as stored (GGUF: the file's blocks; a checkpoint: its 16-bit matrices), and as float32;
transformers loads the same file in its own default way (a GGUF file dequantised to float32; a 16-bit
checkpoint in its own dtype). The targets (issue 25): qkv's stored load holds ≤ 1.5× the GGUF file,
peaks ≤ 1.2× a bf16 checkpoint, and takes no longer than transformers.

The stored load then writes a first reply (REPLY_TOKENS greedy tokens after a prompt of PROMPT_TOKENS ids:
its products read every block, so the file's pages they need are resident), and the peak and held memory
are read again. What the first product costs whatever the model (numba's compiler loading qkv's kernels
for the kinds the model holds: tens of MB) is measured apart, in a child of its own that multiplies
tiny matrices of those kinds: the runtime. Issue 49's target: ≤ 1.5× the GGUF file above the runtime, at
peak and after the first reply (a 16-bit checkpoint: a peak ≤ 1.2× its files).

The children run with the choices this process measured (`runtime.tuning`, pinned by QKV_THREADS to the same
numbers): a child that measured them again itself (a cache measured while the machine was busy, and it is idle
now) would count the measurement's 100 MB of matrices in the model's peak.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from . import markdown as md
from .common import machine_facts
from ..runtime.errors import QkvError
from ..runtime.tuning import ENV, choices

COMMAND = "qkv bench memory --out docs/benchmarks.md"

_RSS = "int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) * 1024"
_CHILD = """
import json, resource, sys, time
{imports}
rss = lambda: {rss}
base = rss()
start = time.perf_counter()
model = {load}
took = time.perf_counter() - start
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out = {{"seconds": took, "base": base, "peak": peak(), "held": rss()}}
{after}
print(json.dumps(out))
"""
PROMPT_TOKENS, REPLY_TOKENS = 16, 20
_REPLY = f"""
import numpy as np
from qkv.runtime.stored import StoredMatrix, StoredTable
kinds = set()
def walk(obj, seen=set()):
    if id(obj) in seen or obj is None or isinstance(obj, (int, float, str, np.ndarray)):
        return
    seen.add(id(obj))
    if isinstance(obj, (StoredMatrix, StoredTable)):
        kinds.add(getattr(obj, "matrix", obj).kind)
    elif isinstance(obj, (list, tuple)):
        for x in obj: walk(x)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__: walk(getattr(obj, name))
walk(model.weights)
ids = (np.arange({PROMPT_TOKENS}) % 100 + 1)[None]                    # (1, n) a prompt of ids
model.generate(ids, {REPLY_TOKENS}, stop_at_eos=False)
out.update(reply_peak=peak(), reply_held=rss(), kinds=sorted(kinds))
"""
_KERNELS = """
import numpy as np
from qkv.runtime.stored import KINDS, StoredMatrix
for kind in {kinds}:
    per, size = KINDS[kind]
    m = StoredMatrix(kind, np.zeros((8, 256 // per * size), np.uint8), 256)
    np.ones((1, 256), np.float32) @ m, np.ones((16, 256), np.float32) @ m, m.take([1, 2])
out.update(peak=peak(), held=rss())
"""


def _child(imports: str, load: str, timeout: float = 1800, after: str = "") -> dict:
    code = _CHILD.format(imports=imports, rss=_RSS, load=load, after=after)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, ENV: _pinned()})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise QkvError(f"a load in the memory benchmark failed: {last[:200]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pinned() -> str:
    """This machine's tuning choices (measured here once if need be) as QKV_THREADS pins them."""
    return ",".join(f"{name}:{value}" for name, value in choices().numbers().items())


def _file_size(source: str) -> tuple[Path, int, bool]:
    """(the file or directory holding SOURCE's weights, their bytes, whether it is GGUF)."""
    from ..checkpoints import gguf, resolve

    directory = resolve(source)
    path = gguf.source_of(directory)
    if path is not None:
        return path, path.stat().st_size, True
    files = list(directory.glob("*.safetensors"))
    return directory, sum(f.stat().st_size for f in files), False


def measure(source: str = "smollm2", with_transformers: bool = True, log=lambda m: None) -> dict:
    """{"rows": [{"who", "how", "seconds", "base", "peak", "held"} (qkv stored's also "reply_peak",
    "reply_held", "kinds")], "runtime": {"kinds", "bytes", "peak"}, "file_bytes", "source", "gguf", "machine"}:
    bytes of resident memory, each row's from one child process."""
    path, size, is_gguf = _file_size(source)
    q = "import qkv, numba\nfrom qkv.runtime import stored_kernels"
    rows = []
    for how in ("stored", "float32"):
        log(f"qkv.load({source!r}, dtype={how!r})")
        after = _REPLY if how == "stored" else ""
        _child(q, f"qkv.load({source!r}, dtype={how!r})", after=after)    # the first: caches, kernels compiled
        rows.append({"who": "qkv", "how": how, **_child(q, f"qkv.load({source!r}, dtype={how!r})", after=after)})
    kinds = rows[0].get("kinds", [])
    log(f"the runtime: qkv's kernels for {', '.join(kinds) or 'no stored kind'}")
    runtime = _child(q, "None", after=_KERNELS.format(kinds=kinds))
    runtime = {"kinds": kinds, "bytes": max(0, runtime["held"] - runtime["base"]),
               "peak": max(0, runtime["peak"] - runtime["base"])}
    if with_transformers:
        t = "import torch, transformers\nfrom transformers import AutoModelForCausalLM"
        if is_gguf:
            load = (f"AutoModelForCausalLM.from_pretrained({str(path.parent)!r}, gguf_file={path.name!r}, "
                    "dtype=torch.float32)")
            how = "GGUF dequantised to float32"
        else:
            load = f"AutoModelForCausalLM.from_pretrained({str(path)!r}, dtype='auto')"
            how = "its own dtype"
        log(f"transformers: {how}")
        _child(t, load)
        rows.append({"who": "transformers", "how": how, **_child(t, load)})
    return {"rows": rows, "runtime": runtime, "file_bytes": size, "source": source, "gguf": is_gguf,
            "machine": machine_facts()}


def markdown(result: dict, command: str = COMMAND) -> str:
    size = result["file_bytes"]
    mb = lambda b: f"{b / 1e6:,.0f}"
    rows = []
    for r in result["rows"]:
        peak, held = r["peak"] - r["base"], r["held"] - r["base"]
        rows.append([f"{r['who']} ({r['how']})", f"{r['seconds']:.2f}", mb(peak), f"{peak / size:.2f}×",
                     mb(held), f"{held / size:.2f}×"])
    stored = next(r for r in result["rows"] if r["who"] == "qkv" and r["how"] == "stored")
    held = (stored["held"] - stored["base"]) / size
    what = "GGUF file" if result["gguf"] else "safetensors files"
    return md.join(
        f"## Loading {result['source']}",
        f"Seconds and memory of one load, each in a fresh process, from the {what} ({mb(size)} MB): the libraries "
        "imported first and the resident memory read (the baseline), then the load timed, its peak resident "
        "memory (ru_maxrss) and what stays resident after it, both less the baseline and over the file's size. "
        "The second load of each is timed (the first writes qkv's cache and compiles its kernels).",
        md.table(["", "seconds", "peak MB", "÷ file", "held MB", "÷ file"], rows, "lrrrrr"),
        md.target("Target: a stored load holds ≤ 1.5× the file", -held, -1.5, f"{held:.2f}×") + ".",
        *_reply(result, stored),
        f"Machine: {md.cpu(result['machine'])}.",
        md.reproduce(command))


def _reply(result: dict, stored: dict) -> list:
    """The stored model after a first reply: its memory above the libraries, above the runtime (the libraries
    and qkv's kernels loaded), and issue 49's target."""
    if "reply_peak" not in stored or "runtime" not in result:
        return []
    size, runtime = result["file_bytes"], result["runtime"]["bytes"]
    mb = lambda b: f"{b / 1e6:,.0f}"
    load_peak, peak, held = (stored[k] - stored["base"] for k in ("peak", "reply_peak", "reply_held"))
    rows = []
    for what, less in (("above the libraries", 0), ("above the runtime (libraries and kernels)", runtime)):
        top, rest = max(load_peak, peak - less), held - less       # (the load itself runs no kernel)
        rows.append([what, mb(top), f"{top / size:.2f}×", mb(rest), f"{rest / size:.2f}×"])
    worst = max(load_peak, peak - runtime, held - runtime) / size
    kinds = ", ".join(result["runtime"]["kinds"]) or "none"
    if result["gguf"]:
        goal = md.target("Target (issue 49): ≤ 1.5× the file above the runtime, at peak and after the first reply",
                         -worst, -1.5, f"{worst:.2f}×") + "."
    else:
        top = max(load_peak, peak - runtime) / size
        goal = md.target("Target (issue 49): a peak ≤ 1.2× the files above the runtime", -top, -1.2, f"{top:.2f}×") + "."
    return [f"Then a first reply in the same process ({REPLY_TOKENS} greedy tokens after {PROMPT_TOKENS} prompt ids, "
            "stored weights): the peak of the whole process (the load's or the reply's) and what stays resident "
            "after the reply, in MB and over the file's size. The runtime is what loading qkv's compiled kernels "
            f"for the kinds the model holds ({kinds}) costs any model, measured apart (tiny matrices): "
            f"{mb(runtime)} MB.",
            md.table(["stored", "peak MB", "÷ file", "held MB", "÷ file"], rows, "lrrrr"), goal]
