"""The head-statistics benchmark: texts per second of `qkv heads` over a corpus, three ways.

    1,000 synthetic English sentences (deterministic) ─▶ a temporary corpus file
    the default model (all-MiniLM-L6-v2), float32, one BLAS thread per worker:
      one process     analyse(..., workers=1)                 this process
      local cores     analyse(..., workers=cores)             spawned processes (start-up included)
      Ray             ray.init(num_cpus=cores), then analyse(..., backend="ray")
                      (start-up reported apart: a cluster is started once and reused)
    every run must give the same JSON, bit for bit, or the benchmark fails.

Needs no torch. Ray is optional: without it that row says so.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import numpy as np

from . import markdown as md
from .common import machine_facts

SENTENCES = 1000
COMMAND = "qkv bench heads --out docs/benchmarks.md"

_SUBJECTS = ["The cat", "A small dog", "My neighbour", "The old fisherman", "Our teacher", "The committee",
             "A curious child", "The engineer", "Her brother", "The new manager", "A tired student", "The pilot"]
_VERBS = ["saw", "liked", "built", "painted", "found", "ignored", "described", "carried", "repaired", "sold",
          "borrowed", "remembered"]
_OBJECTS = ["the red car", "a quiet house", "the long report", "an old bridge", "the blue box",
            "a strange letter", "the broken clock", "a map of the city", "the last train", "a bag of apples"]
_TAILS = ["", " yesterday", " in the morning", " after the storm", " near the river", " before dinner"]
_CLAUSES = ["and then went home", "because it was late", "although nobody asked", "while the radio played",
            "so the others laughed", "but nothing changed"]


def synthetic_corpus(n: int = SENTENCES, seed: int = 0) -> list[str]:
    """n English sentences from a small grammar, the same for a given seed on every machine."""
    rng = np.random.default_rng(seed)

    def pick(words):
        return words[int(rng.integers(len(words)))]

    texts = []
    for _ in range(n):
        s = f"{pick(_SUBJECTS)} {pick(_VERBS)} {pick(_OBJECTS)}{pick(_TAILS)}"
        if rng.random() < 0.5:
            s += f", {pick(_CLAUSES)}"
        if rng.random() < 0.3:
            s += f". {pick(_SUBJECTS)} {pick(_VERBS)} it too"
        texts.append(s + ".")
    return texts


def measure(sentences: int = SENTENCES, workers: int | None = None, ray: bool = True) -> dict:
    """Time the three backends on the synthetic corpus; a plain dict of results."""
    from ..analysis import analyse, open_corpus
    from ..runtime.threads import cores as local_cores

    cores = workers or local_cores()
    rows = []
    with tempfile.TemporaryDirectory(prefix="qkv-bench-heads-") as tmp:
        path = Path(tmp) / "corpus.txt"
        path.write_text("\n".join(synthetic_corpus(sentences)) + "\n")
        corpus = open_corpus(path)

        def timed(name, n_workers, **kw):
            start = time.perf_counter()
            report = analyse("minilm", corpus, workers=n_workers, **kw)
            seconds = time.perf_counter() - start
            rows.append({"backend": name, "workers": n_workers, "seconds": seconds,
                         "texts_per_s": report.texts / seconds})
            return report.to_json()

        reference = timed("one process", 1)
        results = {"local cores": timed("local cores", cores)}
        ray_note = None
        if ray:
            try:
                import ray as ray_module
            except ImportError:
                ray_module = None
                ray_note = "not installed (pip install 'qkv[ray]')"
            if ray_module is not None:
                start = time.perf_counter()
                ray_module.init(num_cpus=cores, include_dashboard=False, log_to_driver=False,
                                logging_level=logging.WARNING)
                ray_start = time.perf_counter() - start
                try:
                    results["ray"] = timed("ray", cores, backend="ray")
                    rows[-1]["startup_s"] = ray_start
                finally:
                    ray_module.shutdown()
        for name, result in results.items():
            if result != reference:
                raise RuntimeError(f"the {name} run differs from the one-process run: a backend is wrong, "
                                   "the timing would be meaningless")
        tokens = reference["tokens"]
    base = rows[0]["seconds"]
    for r in rows:
        r["speedup"] = base / r["seconds"]
    return {"sentences": sentences, "tokens": tokens, "cores": cores, "rows": rows, "ray_note": ray_note,
            "machine": machine_facts()}


def markdown(result: dict, command: str = COMMAND) -> str:
    """The "Head statistics over a corpus" section of docs/benchmarks.md."""
    mach = result["machine"]
    rows = [[r["backend"], str(r["workers"]), f"{r['seconds']:.1f}", f"{r['texts_per_s']:.0f}", f"{r['speedup']:.2f}×"]
            for r in result["rows"]]
    return md.join("## Head statistics over a corpus",
                   f"`qkv heads` over {result['sentences']:,} synthetic English sentences ({result['tokens']:,} "
                   "tokens with [CLS] and [SEP]) on the default model (all-MiniLM-L6-v2, float32): every statistic, "
                   "the detectors and the roles. Each worker computes with one BLAS thread. All runs give the same "
                   "JSON, bit for bit (checked by the benchmark).",
                   md.table(["backend", "workers", "seconds", "texts / s", "vs one process"], rows, "lrrrr"),
                   ["Seconds are wall time of the whole run, including spawning worker processes and loading "
                    "the model in each.", *_ray_note(result)],
                   f"Machine: {mach['cpu']}, {mach['cores']} cores; Python {mach['python']}; NumPy "
                   f"{mach['numpy']} with {mach['blas'].get('internal_api')} {mach['blas'].get('version') or ''}.",
                   md.reproduce(command))


def _ray_note(result: dict) -> list[str]:
    ray_row = next((r for r in result["rows"] if r["backend"] == "ray"), None)
    if ray_row is not None:
        return [f"Ray's own start-up (`ray.init`, {ray_row['startup_s']:.1f} s) is not included: a cluster "
                "is started once and serves many runs."]
    return [f"Ray: {result['ray_note']}."] if result["ray_note"] else []
