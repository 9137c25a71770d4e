"""Text ⇄ token ids: a thin wrapper over the `tokenizers` library (tokenizer.json)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import QkvError


class Tokenizer:
    """Encodes text to ids and tokens exactly as the checkpoint's tokenizer.json says."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # the library raises plain Exceptions for bad JSON
            raise QkvError(f"cannot read tokenizer {path}: {e}; replace it with a valid tokenizer.json") from None
        # Checkpoints often ship fixed padding/truncation (MiniLM pads to 128): qkv sees
        # exactly the tokens of the text, and says so when a text is too long.
        self._tok.no_padding()
        self._tok.no_truncation()

    def encode(self, text: str) -> tuple[np.ndarray, list[str]]:
        """ids (n,) and tokens as the tokenizer spells them, special tokens included."""
        enc = self._tok.encode(text)
        return np.asarray(enc.ids, dtype=np.int64), list(enc.tokens)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str:
        return self._tok.id_to_token(int(i)) or f"<{int(i)}>"

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()
