"""Text ⇄ token ids: a thin wrapper over the `tokenizers` library (tokenizer.json), and chat
messages → text → ids through the checkpoint's own chat template (tokenizer_config.json).

    [{"role": "user", "content": "Hi"}] ─chat template (Jinja, sandboxed)─▶ "<|im_start|>user\\nHi<|im_end|>\\n…"
                                        ─tokenizer─▶ ids

The template is a Jinja program shipped with the checkpoint, so it is untrusted: it runs in
Jinja's immutable sandbox (no `__class__`, no attributes of Python internals, no changing the
messages), with the same settings and helpers as transformers' `apply_chat_template`.

Tokens as a reader sees them (`Tokenizer.labels`, `visible`, `shorten`): byte-level BPE (GPT-2,
SmolLM2, Qwen2, Llama 3) spells " capital" as "Ġcapital" and a newline as "Ċ"; SentencePiece spells
" capital" as "▁capital". Every view shows the text instead, whitespace made visible: "␣capital", "↵".
The analysis keeps reading the tokens as spelled ([CLS], "Ġ," …).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from ..runtime.errors import QkvError
from ..runtime.io_json import read_json
from ..core.labels import label, labels_of
from .chat_template import one_line, render_chat_template, rust_panics_hidden

# The special tokens a template may read by name (transformers passes its special_tokens_map).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer:
    """Encodes text to ids and tokens exactly as the checkpoint's tokenizer.json says.

    chat_template and special_tokens come from tokenizer_config.json (see `from_directory`);
    without a template, `apply_chat_template` says so.
    """

    def __init__(self, path: str | Path, chat_template: str | None = None,
                 special_tokens: dict[str, str] | None = None, padding_side: str | None = None):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = path if isinstance(path, HFTokenizer) else HFTokenizer.from_file(str(path))
        except Exception as e:  # the library raises plain Exceptions for bad JSON
            raise QkvError(f"cannot read tokenizer {path}: {e}; replace it with a valid tokenizer.json") from None
        # A batch pads as transformers' tokenizer(texts, padding=True) does: tokenizer_config.json's pad_token and
        # padding_side, else tokenizer.json's own padding section, else on the right.
        padding = self._tok.padding or {}
        self.special_tokens = dict(special_tokens or {})
        if "pad_token" not in self.special_tokens and padding.get("pad_token"):
            self.special_tokens["pad_token"] = padding["pad_token"]
        self.padding_side = padding_side or padding.get("direction") or "right"
        # Checkpoints often ship fixed padding/truncation (MiniLM pads to 128): qkv sees
        # exactly the tokens of the text, and says so when a text is too long.
        self._tok.no_padding()
        self._tok.no_truncation()
        self.chat_template = chat_template

    @classmethod
    def from_directory(cls, directory: str | Path) -> "Tokenizer":
        """tokenizer.json of a checkpoint directory, with the chat template and special tokens of
        its tokenizer_config.json (and chat_template.jinja, which newer transformers write) if present."""
        directory = Path(directory)
        template, specials = read_tokenizer_config(directory)
        return cls(directory / "tokenizer.json", chat_template=template, special_tokens=specials,
                   padding_side=read_padding_side(directory))

    @classmethod
    def from_json(cls, text: str, special_tokens: dict[str, str] | None = None) -> "Tokenizer":
        """A tokenizer from tokenizer.json TEXT (one a family builds from its own files: ESM's vocab.txt)."""
        from tokenizers import Tokenizer as HFTokenizer

        try:
            tok = HFTokenizer.from_str(text)
        except Exception as e:  # the library raises plain Exceptions for bad JSON
            raise QkvError(f"cannot build the tokenizer: {e}; replace the checkpoint's tokenizer files") from None
        return cls(tok, special_tokens=special_tokens)

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text (what `Model.save` writes)."""
        return self._tok.to_str()

    @property
    def unk_id(self) -> int | None:
        """The id of the unknown token, what a word the vocabulary lacks becomes; None when the
        tokenizer has none (byte-level BPE spells everything)."""
        tok = getattr(self._tok.model, "unk_token", None)
        return None if not tok else self._tok.token_to_id(tok)

    def encode(self, text: str | Sequence[str], add_special_tokens: bool = True
               ) -> tuple[np.ndarray, list[str]] | tuple[np.ndarray, np.ndarray]:
        """ids (n,) and tokens as the tokenizer spells them, special tokens included; a list of texts →
        (ids (B, n), attention mask (B, n)), padded as transformers' tokenizer(texts, padding=True) (`pad`).

        add_special_tokens=False leaves out what the tokenizer adds around a text ([CLS], BOS).
        """
        if not isinstance(text, str):
            return self.pad([self.encode(t, add_special_tokens)[0] for t in check_texts(text)])
        enc = self._encode(check_text(text), add_special_tokens)
        return np.asarray(enc.ids, dtype=np.int64), list(enc.tokens)

    @property
    def pad_token_id(self) -> int | None:
        """The id of the pad token (tokenizer_config.json's pad_token, else tokenizer.json's padding); None
        without one, or when the vocabulary lacks it."""
        pad = self.special_tokens.get("pad_token")
        return None if pad is None else self.token_to_id(pad)

    def pad(self, rows: Sequence[np.ndarray], pad_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ids (n_b,) → ids (B, n) and attention mask (B, n) (1 = token, 0 = pad), n the longest row,
        padded with PAD_ID (default: the pad token's) on `padding_side` ("right", or "left" as decoders'
        tokenizer_config.json often say, so that every row's last token is its last column)."""
        pad_id = self.pad_token_id if pad_id is None else pad_id
        if pad_id is None:
            raise QkvError("this tokenizer has no pad token, so a list of texts cannot be padded into a batch; set "
                           "pad_token in tokenizer_config.json (e.g. to the eos token), or encode one text at a time")
        n = max(len(r) for r in rows)
        ids = np.full((len(rows), n), pad_id, dtype=np.int64)                # (B, n)
        mask = np.zeros((len(rows), n), dtype=np.int64)                       # (B, n)
        for b, row in enumerate(rows):
            at = slice(n - len(row), n) if self.padding_side == "left" else slice(0, len(row))
            ids[b, at], mask[b, at] = row, 1
        return ids, mask

    def _encode(self, text: str, add_special_tokens: bool = True):
        """The library's encoding of TEXT; its panics (a pre-tokenizer regex that backtracks without end,
        e.g. `(a+)+$`, ends in Oniguruma's retry limit) as one QkvError, not a pyo3 PanicException and
        the report Rust writes to stderr (`rust_panics_hidden`)."""
        try:
            with rust_panics_hidden():
                return self._tok.encode(text, add_special_tokens=add_special_tokens)
        except BaseException as e:                      # PanicException derives from BaseException
            if type(e).__name__ != "PanicException":
                raise
            raise QkvError(f"the tokenizer failed on this text ({one_line(e)[:160]}); its tokenizer.json is "
                           "broken (e.g. a pre-tokenizer regex that backtracks without end): replace it") from None

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Each token's characters TEXT[a:b] (n,), as `encode` gives the tokens (special tokens: (0, 0));
        a token's span may take in the space before it."""
        return [tuple(o) for o in self._encode(check_text(text)).offsets]

    def unknown_words(self, text: str) -> list[str]:
        """The pieces of TEXT that became the unknown token (each as the text spells it), in order;
        [] when every piece is in the vocabulary or the tokenizer has no unknown token."""
        unk = self.unk_id
        if unk is None:
            return []
        enc = self._encode(check_text(text), add_special_tokens=False)
        return [text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets) if i == unk]

    def known_words(self, like: str, most: int = 12) -> tuple[int, list[str]]:
        """(how many, up to MOST examples of) the vocabulary's entries written in the same kind of
        characters as LIKE (non-ASCII letters, e.g. Hangul, or plain ASCII), specials left out."""
        foreign = any(ord(c) > 127 for c in like)
        specials = set(self.special_tokens.values())
        words = sorted(t for t in self._tok.get_vocab() if t not in specials and not t.startswith("<")
                       and any(ord(c) > 127 for c in t) == foreign)
        return len(words), words[:most]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str:
        return self._tok.id_to_token(int(i)) or f"<{int(i)}>"

    def label(self, token_id: int) -> str:
        """One token as a reader sees it ("ĠParis" → "␣Paris", "Ċ" → "↵"): `label` in its `spelling`."""
        return label(self.id_to_token(token_id), self.spelling)

    def labels(self, ids) -> list[str]:
        """The tokens of a text as a reader sees them, each read with its neighbours (`labels_of`)."""
        return labels_of([self.id_to_token(i) for i in ids], self.spelling)

    @functools.cached_property
    def spelling(self) -> str:
        """How the vocabulary spells text: "byte-level" (GPT-2's Ġ = space), "sentencepiece" (▁ = space)
        or "plain" (WordPiece: "##ing"), from the tokenizer's decoder."""
        decoder = self._tok.decoder
        state = json.loads(decoder.__getstate__()) if decoder is not None else {}
        parts = [state, *state.get("decoders", [])]
        if any(d.get("type") == "ByteLevel" for d in parts):
            return "byte-level"
        if any(d.get("type") == "Metaspace" or "▁" in json.dumps(d.get("pattern"), ensure_ascii=False)
               for d in parts):
            return "sentencepiece"
        return "plain"

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    @property
    def eos_token_id(self) -> int | None:
        """The id of tokenizer_config.json's eos_token: for chat models, the end of a turn."""
        eos = self.special_tokens.get("eos_token")
        return None if eos is None else self.token_to_id(eos)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = False,
                            tokenize: bool = True) -> list[int] | str:
        """Messages → the text the model was trained on (tokenize=False) or its ids, as
        transformers' `apply_chat_template`.

        messages: [{"role": "system" | "user" | "assistant", "content": str}, ...];
        add_generation_prompt: end with the header of the assistant's turn, so that what the
        model writes next is its reply (False by default, as transformers: the conversation as it is).
        """
        if self.chat_template is None:
            raise QkvError("this tokenizer has no chat template (no chat_template in tokenizer_config.json); "
                           "use a chat model, e.g. --model smollm2, or continue plain text with generate")
        text = render_chat_template(self.chat_template, check_messages(messages), add_generation_prompt,
                                    self.special_tokens)
        if not text:
            raise QkvError("the chat template wrote nothing for these messages; fix chat_template in "
                           "tokenizer_config.json")
        if not tokenize:
            return text
        # The template writes the special tokens itself (BOS included): add nothing around it.
        return self._encode(text, add_special_tokens=False).ids


# ── tokenizer_config.json ───────────────────────────────────────────────────────

def _token_text(value, key: str, path: Path) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": str, ...}."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise QkvError(f"{path}: {key} must be a string or {{\"content\": string}}, got {value!r}; "
                   "fix or remove it")


def _template_text(value, path: Path) -> str | None:
    """chat_template: one string, or transformers' list of {"name", "template"} (we use "default")."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                       and isinstance(t.get("template"), str) for t in value):
        named = {t["name"]: t["template"] for t in value}
        if "default" not in named:
            raise QkvError(f"{path}: chat_template names {', '.join(sorted(named))} but no 'default'; "
                           "name the chat template 'default'")
        return named["default"]
    raise QkvError(f"{path}: chat_template must be a string or a list of {{\"name\", \"template\"}} strings; "
                   "fix or remove it")


def read_padding_side(directory: Path) -> str | None:
    """tokenizer_config.json's padding_side ("left" or "right"); None when it says none."""
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return None
    side = read_json(path, fix="restore the checkpoint's tokenizer_config.json or remove it").get("padding_side")
    if side not in (None, "left", "right"):
        raise QkvError(f"{path}: padding_side is {side!r:.40}, not \"left\" or \"right\"; fix or remove it")
    return side


def read_tokenizer_config(directory: Path) -> tuple[str | None, dict[str, str]]:
    """(chat template, special tokens by name) of a checkpoint directory; (None, {}) without a config."""
    path = directory / "tokenizer_config.json"
    config = {}
    if path.is_file():                           # bounded and checked (size, UTF-8, an object, depth): io_json
        config = read_json(path, fix="restore the checkpoint's tokenizer_config.json or remove it")
    specials = {key: _token_text(config.get(key), key, path) for key in SPECIAL_TOKENS}
    template = _template_text(config.get("chat_template"), path)
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():                                  # transformers ≥ 4.49 saves the template here
        try:
            template = jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise QkvError(f"cannot read {jinja} ({e}); restore it or remove it") from None
    return template, {k: v for k, v in specials.items() if v is not None}


# ── chat templates ──────────────────────────────────────────────────────────────

def check_texts(texts) -> list[str]:
    """A batch of texts: a non-empty list (or tuple) of strings, each checked by `check_text`."""
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
        raise QkvError(f"give a text (str) or a non-empty list of texts, not {type(texts).__name__} "
                       f"{str(texts)[:40]!r}")
    return [check_text(t, f"text {i}") for i, t in enumerate(texts)]


def check_text(text: str, what: str = "the text") -> str:
    """Text that is not valid UTF-8 (a command line's bytes such as 0xff arrive as lone surrogates)
    → one clear error naming WHAT it is, not the tokenizer's TypeError."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            bad = text[e.start]
            byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"U+{ord(bad):04X}"
            raise QkvError(f"{what} is not valid UTF-8 ({byte} at character {e.start}); "
                           f"give {what} in UTF-8") from None
    return text


def check_messages(messages) -> list[dict[str, str]]:
    """A conversation must be a non-empty list of {"role": str, "content": str}; a copy of it."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise QkvError("messages must be a non-empty list of {\"role\": ..., \"content\": ...} dicts, "
                       f"got {messages!r:.80}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) != {"role", "content"} or not all(
                isinstance(m[k], str) for k in ("role", "content")):
            raise QkvError(f"message {i} must be {{\"role\": str, \"content\": str}} and nothing else, "
                           f"got {m!r:.80}")
        out.append({"role": check_text(m["role"]), "content": check_text(m["content"])})
    return out

