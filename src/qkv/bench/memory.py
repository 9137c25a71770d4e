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
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from . import markdown as md
from .common import machine_facts
from ..runtime.errors import QkvError

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
print(json.dumps({{"seconds": took, "base": base, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "held": rss()}}))
"""


def _child(imports: str, load: str, timeout: float = 1800) -> dict:
    code = _CHILD.format(imports=imports, rss=_RSS, load=load)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise QkvError(f"a load in the memory benchmark failed: {last[:200]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    """{"rows": [{"who", "how", "seconds", "peak", "held"}], "file_bytes", "source", "machine"}."""
    path, size, is_gguf = _file_size(source)
    q = "import qkv, numba\nfrom qkv.runtime import stored_kernels"
    rows = []
    for how in ("stored", "float32"):
        log(f"qkv.load({source!r}, dtype={how!r})")
        _child(q, f"qkv.load({source!r}, dtype={how!r})")             # the first: caches, kernels compiled
        rows.append({"who": "qkv", "how": how, **_child(q, f"qkv.load({source!r}, dtype={how!r})")})
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
    return {"rows": rows, "file_bytes": size, "source": source, "gguf": is_gguf, "machine": machine_facts()}


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
        f"Machine: {md.cpu(result['machine'])}.",
        md.reproduce(command))
