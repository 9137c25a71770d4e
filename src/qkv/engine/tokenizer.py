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

import contextlib
import functools
import json
import math
import os
import sys
import threading
import re
import unicodedata
from datetime import datetime
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import QkvError
from .io_json import read_json

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
            self._tok = HFTokenizer.from_file(str(path))
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
        the report Rust writes to stderr (`_rust_panics_hidden`)."""
        try:
            with _rust_panics_hidden():
                return self._tok.encode(text, add_special_tokens=add_special_tokens)
        except BaseException as e:                      # PanicException derives from BaseException
            if type(e).__name__ != "PanicException":
                raise
            raise QkvError(f"the tokenizer failed on this text ({_one_line(e)[:160]}); its tokenizer.json is "
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


# ── tokens as a reader sees them ────────────────────────────────────────────────

def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character → byte: printable bytes stand for themselves, the
    others (space, newline, control bytes, ...) for the characters from U+0100 on ("Ġ" = space)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


BYTE_OF = _byte_alphabet()
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")           # SentencePiece's byte fallback, "<0x0A>"


def token_bytes(token: str, style: str) -> bytes | None:
    """The bytes a vocabulary entry stands for ("Ġì" → b" \\xec", "<0xEC>" → b"\\xec", "▁Paris" → b" Paris"),
    or None when it is not text of that style (a special token such as "<|im_start|>", a plain vocabulary)."""
    if style == "byte-level":
        if any(ch not in BYTE_OF for ch in token):
            return None
        return bytes(BYTE_OF[ch] for ch in token)
    if style == "sentencepiece":
        byte = _BYTE_TOKEN.fullmatch(token)
        return bytes([int(byte.group(1), 16)]) if byte else token.replace("▁", " ").encode("utf-8")
    return None


def readable(token: str, style: str) -> str:
    """The text a vocabulary entry stands for (whitespace not yet made visible); the entry as
    spelled when it is a piece of a character or not text of that style.

    style: "byte-level" (Ġ = space), "sentencepiece" (▁ = space, <0xNN> = a byte) or "plain".
    """
    raw = token_bytes(token, style)
    if raw is None:
        return token
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return token


def _char_length(raw: bytes, at: int) -> int:
    """Bytes of the UTF-8 character that starts at RAW[at] (1 to 4), or 0 when none starts there (a
    continuation byte, a byte UTF-8 never uses, or a character cut short)."""
    lead = raw[at]
    n = 1 if lead < 0x80 else 2 if 0xC2 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if 0xF0 <= lead < 0xF5 else 0
    if n == 0 or at + n > len(raw):
        return 0
    try:
        raw[at:at + n].decode("utf-8")
    except UnicodeDecodeError:
        return 0
    return n


def _context_labels(pieces: list[bytes]) -> list[str]:
    """Labels of tokens that are consecutive bytes of one text (PIECES, each a token's bytes): the characters
    wholly inside a token as themselves, whitespace visible; a piece of a character that spans tokens as its
    bytes and the character: "⟨EC 84:서⟩" (bytes no character claims: "⟨FF⟩")."""
    raw = b"".join(pieces)
    owner: list[tuple[int, int]] = []                 # for each byte: (start, length) of its character
    at = 0
    while at < len(raw):
        n = _char_length(raw, at)
        owner.extend([(at, n)] * n if n else [(at, 0)])
        at += n or 1
    labels, start = [], 0
    for piece in pieces:
        end, parts, text = start + len(piece), [], ""
        at = start
        while at < end:
            c0, n = owner[at]
            if n and c0 >= start and c0 + n <= end:                   # a whole character
                text += raw[c0:c0 + n].decode("utf-8")
                at = c0 + n
                continue
            stop = min(end, c0 + n)
            while not n and stop < end and not owner[stop][1]:           # a run of bytes no character claims
                stop += 1
            if text:
                parts.append(visible(text))
                text = ""
            hexes = " ".join(f"{b:02X}" for b in raw[at:stop])
            char = visible(raw[c0:c0 + n].decode("utf-8")) if n else ""
            parts.append(f"⟨{hexes}:{char}⟩" if char else f"⟨{hexes}⟩")
            at = stop
        if text or not parts:
            parts.append(visible(text))
        labels.append("".join(parts))
        start = end
    return labels


def labels_of(tokens: list[str], spelling: str) -> list[str]:
    """Each token of a sequence as a reader sees it, reading its neighbours: text tokens as their text
    (`label`), and a token that holds a piece of a character (byte-level BPE cuts Korean, Japanese and emoji
    into bytes) as that piece's bytes with the whole character it belongs to, "⟨EC 84:서⟩", instead of the
    vocabulary's byte glyphs ("ì", "Ħ"). Special tokens stay as spelled and break the text in two."""
    if spelling == "plain":
        return list(tokens)
    out: list[str] = []
    run: list[bytes] = []                            # the bytes of the text tokens since the last special one
    for token in [*tokens, None]:
        raw = None if token is None else token_bytes(token, spelling)
        if raw is not None:
            run.append(raw)
            continue
        out.extend(_context_labels(run))
        run = []
        if token is not None:
            out.append(visible(token))
    return out


INVISIBLE = ("Zs", "Zl", "Zp", "Cf")         # Unicode categories a reader cannot see (or tell apart)


def visible(text: str) -> str:
    """Text with its whitespace made visible: ' ' → ␣, newline → ↵, tab → ⇥, no-break space → ⍽, other
    control characters as \\xNN, every other invisible character (spaces of other widths, zero-width and
    direction marks, line separators: Unicode's Z* and Cf) as \\uNNNN; the empty string as ∅."""
    if text == "":
        return "∅"
    out = []
    for ch in text:
        if ch == " ":
            out.append("␣")
        elif ch == "\n":
            out.append("↵")
        elif ch == "\t":
            out.append("⇥")
        elif ch == "\xa0":
            out.append("⍽")
        elif ord(ch) < 32 or 127 <= ord(ch) < 160:
            out.append(f"\\x{ord(ch):02x}")
        elif unicodedata.category(ch) in INVISIBLE:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def label(token: str, spelling: str) -> str:
    """A token as a reader sees it: the text it stands for, whitespace visible ("Ġcapital" → "␣capital",
    "Ċ" → "↵", "▁Paris" → "␣Paris"). Plain tokens (WordPiece's "##ing", a hand-made trace's) and special
    tokens ("<|im_start|>", whose characters all stand for themselves) stay as spelled; a piece of a
    character, read alone, is its bytes ("⟨EC 84⟩": `labels_of` names the character from the neighbours)."""
    return token if spelling == "plain" else labels_of([token], spelling)[0]


def shorten(text: str, width: int) -> str:
    """A label cut to WIDTH characters, "…" marking the cut (the one truncation of every view)."""
    return text if len(text) <= width else text[: width - 1] + "…"


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


# A chat template is code from a checkpoint: its render is bounded in time and size, not only in what it may touch.
TEMPLATE_SECONDS = 2.0          # a real template renders a conversation in milliseconds
TEMPLATE_CHARS = 1_000_000      # what a render may write (and any string or list it builds): ~250k tokens
POWER_DIGITS = 4096             # x ** y only while the result stays this small (a big power is one C call)
WIDE_FORMAT = re.compile(r"%[-#0 +]*[0-9]{7}|\.[0-9]{7}")   # a %-format width or precision of millions


class TemplateTooBig(Exception):
    """A render that built or wrote more than TEMPLATE_CHARS."""


class TemplateTimeout(BaseException):
    """Raised inside a render that ran past TEMPLATE_SECONDS (BaseException: the template's own code cannot
    catch it, nor can Jinja's `except Exception`)."""


class _Deadline:
    """Interrupts the calling thread with TemplateTimeout after SECONDS, at its next Python instruction
    (CPython's PyThreadState_SetAsyncExc; a template's loops are Python code). Used as a context manager;
    an interruption that has not landed by the time the block ends is withdrawn."""

    def __init__(self, seconds: float):
        self.seconds, self.thread = seconds, threading.get_ident()
        self.lock, self.active, self.sent = threading.Lock(), False, False
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        import ctypes

        with self.lock:
            if self.active:
                self.sent = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread), ctypes.py_object(TemplateTimeout))

    def __enter__(self) -> "_Deadline":
        self.active = True
        self.timer.start()
        return self

    def __exit__(self, kind, value, tb) -> bool:
        import ctypes

        with self.lock:
            self.active = False
            if self.sent and kind is not TemplateTimeout:      # sent but not raised yet: withdraw it
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread), None)
        self.timer.cancel()
        return False


def _sized(x) -> int | None:
    return len(x) if isinstance(x, (str, list, tuple)) else None


_STDERR_LOCK = threading.Lock()


@contextlib.contextmanager
def _rust_panics_hidden():
    """While inside, file descriptor 2 goes to a temporary file; on leaving, what was written there returns to
    stderr except a Rust panic's report (`thread '…' panicked at …`, its message, its notes and backtrace),
    which the caller turns into one line. Serialised by a lock: other threads' writes wait or pass through."""
    import tempfile

    with _STDERR_LOCK:
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                sink.seek(0)
                text = sink.read().decode("utf-8", "replace")
                if "panicked at" in text:                           # the report runs to the end
                    text = text[:text.find("thread '")] if "thread '" in text else ""
                if text:
                    sys.stderr.write(text)


def _environment():
    """Jinja as transformers sets it up for chat templates: the immutable sandbox, blocks that
    leave no stray newlines, {% break %}/{% continue %}, and its helpers; with * + ** % and ~ bounded
    (`'x' * 10**8`, a string doubled in a loop, `10 ** 10**8`, `'%0999999999d' % 1` would each be one
    long C call, beyond the deadline's reach)."""
    import jinja2
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generator(CodeGenerator):
        def visit_Concat(self, node, frame):             # a ~ b ~ c: joined by Sandbox.bounded_join
            self.write("environment.bounded_join((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "+", "**", "%"])
        code_generator_class = Generator

        @staticmethod
        def bounded_join(parts) -> str:
            parts = [str(p) for p in parts]
            if sum(map(len, parts)) > TEMPLATE_CHARS:
                raise TemplateTooBig
            return "".join(parts)

        def call_binop(self, context, operator, left, right):
            a, b = _sized(left), _sized(right)
            if operator == "*" and (a is not None or b is not None):
                times = right if a is not None else left
                if isinstance(times, int) and (a if a is not None else b) * max(0, times) > TEMPLATE_CHARS:
                    raise TemplateTooBig
            elif operator == "+" and a is not None and b is not None and a + b > TEMPLATE_CHARS:
                raise TemplateTooBig
            elif operator == "%" and isinstance(left, str) and WIDE_FORMAT.search(left):
                raise TemplateTooBig                   # a width or precision of millions
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
                    and right * math.log10(abs(left)) > POWER_DIGITS:
                raise TemplateTooBig
            return super().call_binop(context, operator, left, right)

    class Undefined(jinja2.Undefined):
        """An undefined name is empty and false, as usual; but what the sandbox refused
        (`''.__class__`) fails as soon as it is used at all, where Jinja would print ''."""

        def _refused(self) -> bool:
            return self._undefined_exception is jinja2.exceptions.SecurityError

        def __str__(self):
            return self._fail_with_undefined_error() if self._refused() else super().__str__()

        def __bool__(self):
            return self._fail_with_undefined_error() if self._refused() else super().__bool__()

        def __iter__(self):
            return self._fail_with_undefined_error() if self._refused() else super().__iter__()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, undefined=Undefined, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson                      # Jinja's own escapes HTML characters
    center, fmt = env.filters["center"], env.filters["format"]       # one C call each: bounded before it

    def bounded_center(value, width=80):
        if isinstance(width, int) and width > TEMPLATE_CHARS:
            raise TemplateTooBig
        return center(value, width)

    def bounded_format(value, *args, **kwargs):
        if isinstance(value, str) and WIDE_FORMAT.search(value):
            raise TemplateTooBig
        return fmt(value, *args, **kwargs)

    indent = env.filters["indent"]

    def bounded_indent(value, width=4, *args, **kwargs):
        lines = str(value).count("\n") + 1
        if (len(width) if isinstance(width, str) else width if isinstance(width, int) else 0) * lines > TEMPLATE_CHARS:
            raise TemplateTooBig
        return indent(value, width, *args, **kwargs)

    env.filters.update(center=bounded_center, format=bounded_format, indent=bounded_indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    """The compiled template (a conversation renders the same one every turn)."""
    return _environment().from_string(template)


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def render_chat_template(template: str, messages: list[dict[str, str]], add_generation_prompt: bool,
                         special_tokens: dict[str, str]) -> str:
    """The template's text for these messages. Its mistakes (bad syntax, a refusal through
    raise_exception, an unsafe attribute) are one QkvError, never a traceback or an escape."""
    import jinja2

    try:
        compiled = _compiled(template)
    except jinja2.TemplateSyntaxError as e:
        raise QkvError(f"the chat template is not valid Jinja (line {e.lineno}: {_one_line(e)}); "
                       "fix chat_template in tokenizer_config.json") from None
    too_big = QkvError(f"the chat template wrote or built more than {TEMPLATE_CHARS:,} characters; "
                       "use a trusted chat template")
    try:
        parts, size = [], 0
        with _Deadline(TEMPLATE_SECONDS):
            for part in compiled.generate(messages=messages, add_generation_prompt=bool(add_generation_prompt),
                                          tools=None, documents=None, **special_tokens):
                size += len(part)
                if size > TEMPLATE_CHARS:
                    raise too_big
                parts.append(part)
        return "".join(parts)
    except TemplateTimeout:
        raise QkvError(f"the chat template ran for more than {TEMPLATE_SECONDS:g} s (a loop without end?); "
                       "use a trusted chat template") from None
    except (TemplateTooBig, MemoryError):
        raise too_big from None
    except QkvError:
        raise
    except jinja2.exceptions.SecurityError as e:
        raise QkvError(f"the chat template tried something unsafe and was stopped ({_one_line(e)}); "
                       "use a trusted chat template") from None
    except jinja2.TemplateError as e:
        if not isinstance(e, jinja2.UndefinedError):      # the template's raise_exception(...)
            raise QkvError(f"the chat template refused these messages: {_one_line(e)}") from None
        raise QkvError(f"the chat template failed ({_one_line(e)}); fix chat_template in tokenizer_config.json") \
            from None
    except Exception as e:                              # the template's own bug, e.g. 'a' + 1
        raise QkvError(f"the chat template failed ({type(e).__name__}: {_one_line(e)}); "
                       "fix chat_template in tokenizer_config.json") from None
