"""Tokens as a reader sees them: byte-level BPE spells " capital" as "Ġcapital" and a newline as "Ċ",
SentencePiece as "▁capital"; every view shows the text instead, whitespace made visible ("␣capital", "↵"),
and a token that is part of a character as its bytes (⟨EC 84:서⟩). The analysis keeps the spelled tokens.
"""

from __future__ import annotations

import re
import unicodedata




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
