"""Adding texts up: per-text results folded in text order, and the checkpoint of a corpus run.

Each text counts once (Clark et al. weight texts equally): the corpus mean of a statistic
is Σ_texts value / number of texts. Results may arrive in any order (several processes,
a Ray cluster); `Totals.offer` holds early ones back and folds strictly by text index, in
float64, so a run gives the same bits on one process, many processes or Ray, and a run
resumed from its checkpoint gives the same bits as one never interrupted.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io import open_regular, write_atomic


@dataclass
class TextResult:
    """One text's numbers: name → (L, H) float64 (a scalar for `uniform_entropy`)."""

    values: dict[str, np.ndarray]
    tokens: int
    windows: int


@dataclass
class Failure:
    """A text that could not be analysed, and why (the run goes on without it)."""

    index: int
    line: int
    error: str


@dataclass
class Totals:
    """Running sums over the texts folded so far (indices 0 .. next_index − 1)."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)   # texts behind each sum
    texts: int = 0
    tokens: int = 0
    windows: int = 0
    failures: list[Failure] = field(default_factory=list)
    next_index: int = 0
    _waiting: dict[int, TextResult | Failure] = field(default_factory=dict, repr=False)

    def offer(self, index: int, result: TextResult | Failure) -> int:
        """Take a result in any order; fold every result now in sequence. Returns how many were folded."""
        if index < self.next_index or index in self._waiting:
            raise ValueError(f"text {index} was already counted")
        self._waiting[index] = result
        folded = 0
        while self.next_index in self._waiting:
            self._fold(self._waiting.pop(self.next_index))
            self.next_index += 1
            folded += 1
        return folded

    def _fold(self, result: TextResult | Failure) -> None:
        if isinstance(result, Failure):
            self.failures.append(result)
            return
        for name, value in result.values.items():
            if name in self.sums:
                self.sums[name] = self.sums[name] + value
            else:
                self.sums[name] = np.array(value, dtype=np.float64)
            self.counts[name] = self.counts.get(name, 0) + 1
        self.texts += 1
        self.tokens += result.tokens
        self.windows += result.windows

    def mean(self, name: str) -> np.ndarray | None:
        """The mean over the texts that gave this number, or None if none did."""
        if not self.counts.get(name):
            return None
        return self.sums[name] / self.counts[name]

    # checkpoint ------------------------------------------------------------

    def save(self, path: str | Path, key: str) -> None:
        """Write the sums and counters to `path` (npz, atomically), tagged with the run's key."""
        path = Path(path)
        meta = {"key": key, "next_index": self.next_index, "texts": self.texts, "tokens": self.tokens,
                "windows": self.windows, "counts": self.counts,
                "failures": [[f.index, f.line, f.error] for f in self.failures]}
        arrays = {f"sum_{name}": value for name, value in self.sums.items()}
        try:
            write_atomic(path, lambda f: np.savez(f, meta=np.array(json.dumps(meta)), **arrays))
        except OSError as e:
            raise QkvError(f"cannot write the checkpoint {path}: {e.strerror}; choose a writable path") from None

    @classmethod
    def load(cls, path: str | Path, key: str) -> "Totals":
        """The totals saved in `path` by a run with the same key; a fresh start if there is no file."""
        path = Path(path)
        if not path.exists():
            return cls()
        try:
            with open_regular(path) as f, np.load(f, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                sums = {name[4:]: z[name] for name in z.files if name.startswith("sum_")}
                if not isinstance(meta, dict):
                    raise ValueError("its meta is not an object")
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else " ".join(str(e).split())[:120]
            raise QkvError(f"{path} is not a qkv heads checkpoint ({reason}); delete it or choose another "
                           "--checkpoint") from None
        if meta.get("key") != key:
            raise QkvError(f"the checkpoint {path} belongs to another run (other corpus, model or options); "
                           "delete it or choose another --checkpoint")
        return cls(sums=sums, counts=meta["counts"], texts=meta["texts"], tokens=meta["tokens"],
                   windows=meta["windows"], next_index=meta["next_index"],
                   failures=[Failure(*f) for f in meta["failures"]])
