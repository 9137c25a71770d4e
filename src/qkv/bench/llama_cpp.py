"""llama.cpp beside qkv: its Python binding, run by another interpreter in a child process.

llama-cpp-python is not a dependency of qkv (it compiles llama.cpp from source); a benchmark
run names a Python that has it (`--llama-python`). The child loads the GGUF as it is (its
quantised weights), feeds the same prompt ids, decodes greedily and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError

# Runs in the child: argv[1] is a JSON job. Greedy = top_k 1; `generate` never stops at EOS. llm.reset()
# before every call: llama-cpp-python otherwise keeps the last prompt's K/V and skips its evaluation.
CHILD = r"""
import json, os, statistics, sys, time
import llama_cpp
job = json.loads(sys.argv[1])
threads = job["threads"]
llm = llama_cpp.Llama(model_path=job["gguf"], n_ctx=job["n_ctx"], n_threads=threads, n_threads_batch=threads,
                      n_batch=512, verbose=False)

def decode(n):
    llm.reset()
    out, stamps = [], [time.perf_counter()]
    for tok in llm.generate(job["ids"], top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        stamps.append(time.perf_counter())
        out.append(int(tok))
        if len(out) == n:
            return out, stamps

def prefill(ids):
    llm.reset()
    llm.eval(ids)

tokens, _ = decode(job["new_tokens"])
times, firsts, steps, step_totals = [], [], [], []
for _ in range(job["repeats"]):
    _, stamps = decode(job["new_tokens"])
    times.append(stamps[-1] - stamps[0])
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    steps += gaps[1:]
    step_totals.append(sum(gaps[1:]))
    _, stamps = decode(1)
    firsts.append(stamps[-1] - stamps[0])
pre = {}
for n, ids in job["prefill"].items():
    prefill(ids)
    ts = []
    for _ in range(job["repeats"]):
        time.sleep(0.3)
        t = time.perf_counter(); prefill(ids); ts.append(time.perf_counter() - t)
    pre[n] = statistics.median(ts)
print(json.dumps({"version": getattr(llama_cpp, "__version__", "?"), "tokens": tokens,
                  "decode_s": statistics.median(times), "first_s": statistics.median(firsts), "prefill_s": pre,
                  "step_s": steps, "steps_total_s": step_totals, "threads": threads}))
"""

def gguf_weights(gguf: Path) -> tuple[str, int]:
    """("Q4_1 + Q8_0 + F32", bytes): the tensor types of a GGUF file, most bytes first, and their bytes."""
    from ..checkpoints.gguf_reader import open_reader

    by_type: dict[str, int] = {}
    for t in open_reader(gguf).tensors:
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return " + ".join(sorted(by_type, key=by_type.get, reverse=True)), sum(by_type.values())


def run_llama_cpp(python: str, gguf: Path | None, ids: np.ndarray, new_tokens: int,
                  prefill: dict[int, np.ndarray], repeats: int, timeout: float = 900) -> dict:
    """Time llama.cpp on the GGUF with `python` (which must import llama_cpp): decode after `ids`
    and prefill of each prompt in `prefill` (n → (n,) ids); a plain dict of results (decode_s, first_s:
    medians of whole calls; step_s: every timed step after the first token; steps_total_s: each round's sum)."""
    if gguf is None:
        raise QkvError("--llama-python compares llama.cpp on the GGUF file itself; give --model smollm2 or a .gguf")
    if not Path(python).is_file():
        raise QkvError(f"--llama-python {python} is not a file; give the python of an environment with "
                       "llama-cpp-python installed")
    longest = max((len(p) for p in prefill.values()), default=0)
    job = {"gguf": str(gguf), "ids": [int(i) for i in ids], "new_tokens": new_tokens, "repeats": repeats,
           "threads": os.cpu_count() or 1, "n_ctx": max(longest, len(ids) + new_tokens) + 8,
           "prefill": {str(n): [int(i) for i in p] for n, p in prefill.items()}}
    try:
        done = subprocess.run([python, "-c", CHILD, json.dumps(job)], capture_output=True, text=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"llama.cpp did not run: {e}"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return {"error": f"llama.cpp failed: {last}"}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["weights"], result["weight_bytes"] = gguf_weights(gguf)      # as stored in the file, read per step
    return result
