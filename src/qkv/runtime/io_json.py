"""Reading a JSON file qkv is handed (a config, a store's metadata, an SAE's cfg.json): bounded, checked, one line.

    read_json(path, what=, fix=)     the JSON object in PATH, or one QkvError naming the file and the fix
    Fields(data, source, fix)        its values by key, each checked for type and range where it is read

Every JSON file that comes from outside the running process goes through `read_json`, so each of them is read the
same way: a regular file (a FIFO or a directory is refused before a byte is read, `io.open_regular`) of at most LIMIT
bytes, UTF-8, one JSON object nested at most MAX_DEPTH deep (Python's parser raises RecursionError near a thousand
levels, and code walking a deep value later would too). `Fields` then turns a wrong type, a missing key or a value
out of range into one line naming the file and the key ("meta.json: rows must be a whole number from 1 to 10^12, not
'12'; …"), instead of a KeyError or a TypeError deep in the caller.
"""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import Any

from .errors import QkvError
from .io import open_regular

MAX_DEPTH = 64                  # levels of nesting: no config or metadata qkv reads comes near it
LIMIT = 16 << 20                # bytes: a config or a store's metadata is a few KB; a tokenizer.json has its own reader
_MISSING = object()


def read_json(path: str | os.PathLike, *, what: str = "", fix: str = "restore or remake it",
              limit: int = LIMIT) -> dict:
    """The JSON object in PATH. WHAT names the file for the user ("the store's meta.json"; default its path), FIX
    says what to do; any fault is one QkvError: missing, not a regular file, larger than LIMIT bytes, not UTF-8, not
    JSON, not an object, nested deeper than MAX_DEPTH."""
    path = Path(path)
    name = what or str(path)
    try:
        with open_regular(path, limit) as f:
            raw = f.read(limit + 1)
    except FileNotFoundError:
        raise QkvError(f"{name} is missing; {fix}") from None
    except OSError as e:
        if e.errno == errno.EFBIG:
            raise QkvError(f"{name} is too large: {e.strerror}; {fix}") from None
        raise QkvError(f"{name} cannot be read ({e.strerror or e}); {fix}") from None
    if len(raw) > limit:                                # grown since it was measured
        raise QkvError(f"{name} has more than {limit:,} bytes; {fix}")
    return parse_json(raw, name, fix)


def parse_json(raw: bytes | str, name: str, fix: str) -> dict:
    """RAW (a file's bytes, or text) as one JSON object, checked as `read_json` says; NAME and FIX for its errors."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        found = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise QkvError(f"{name} is nested too deeply (more than {MAX_DEPTH} levels); {fix}") from None
    except UnicodeDecodeError:
        raise QkvError(f"{name} is not UTF-8 text; {fix}") from None
    except ValueError as e:
        raise QkvError(f"{name} is not valid JSON ({e}); {fix}") from None
    if not isinstance(found, dict):
        raise QkvError(f"{name} is not a JSON object (it holds {_kind(found)}); {fix}")
    if depth(found) > MAX_DEPTH:
        raise QkvError(f"{name} is nested too deeply (more than {MAX_DEPTH} levels); {fix}")
    return found


def _no_constant(word: str):
    raise ValueError(f"{word} is not a JSON number")


def depth(value: Any) -> int:
    """Levels of nesting of a parsed JSON value (a number is 0, [] and {} are 1), walked without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            level += 1
            deepest = max(deepest, level)
            stack.extend((v, level) for v in item if isinstance(v, (dict, list)))
    return deepest


def _kind(value: Any) -> str:
    """What a JSON value is, in words, with a short picture of it."""
    kinds = {dict: "an object", list: "a list", str: "text", bool: "true/false", type(None): "null"}
    word = kinds.get(type(value), "a number")
    shown = repr(value) if not isinstance(value, (dict, list)) else ""
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{word} {shown}".strip()


class Fields:
    """The values of one JSON object by key, each checked where it is read.

        meta = Fields(read_json(path, what="meta.json"), "meta.json", fix="remake the store")
        rows = meta.integer("rows", 1, 10**12)
        kind = meta.text("dtype", choices=("float32", "float16"))
        shards = [meta.sub(f"shards[{i}]", s) for i, s in enumerate(meta.array("shards", max_len=10**6))]

    A missing key without a default, a value of another type (a bool is not a number here), a number out of
    [lo, hi], a non-integral number where a whole one is wanted, text outside CHOICES: one QkvError naming SOURCE,
    the key and FIX.
    """

    def __init__(self, data: dict, source: str, fix: str = "restore or remake it"):
        if not isinstance(data, dict):
            raise QkvError(f"{source} is not a JSON object (it holds {_kind(data)}); {fix}")
        self.data, self.source, self.fix = data, source, fix

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def _get(self, key: str, default: Any) -> tuple[bool, Any]:
        """(True, the value) when KEY holds one (null counts as absent), (False, DEFAULT) when it has a default."""
        if key in self.data and self.data[key] is not None:
            return True, self.data[key]
        if default is _MISSING:
            raise QkvError(f"{self.source} has no {key}; {self.fix}")
        return False, default

    def _wrong(self, key: str, wanted: str, found: Any) -> QkvError:
        return QkvError(f"{self.source}: {key} must be {wanted}, not {_kind(found)}; {self.fix}")

    def integer(self, key: str, lo: int, hi: int, default: Any = _MISSING) -> int:
        """A whole number in [lo, hi] (an integral float like 64.0 counts; 64.7 does not)."""
        found, value = self._get(key, default)
        if not found:
            return value
        wanted = f"a whole number from {lo:,} to {hi:,}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._wrong(key, wanted, value)
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise self._wrong(key, wanted, value)
        if not lo <= value <= hi:
            raise self._wrong(key, wanted, value)
        return int(value)

    def number(self, key: str, lo: float, hi: float, default: Any = _MISSING) -> float:
        """A finite number in [lo, hi]."""
        found, value = self._get(key, default)
        if not found:
            return value
        wanted = f"a number from {lo:g} to {hi:g}"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise self._wrong(key, wanted, value)
        return float(value)

    def text(self, key: str, default: Any = _MISSING, *, choices: tuple[str, ...] | None = None,
             max_len: int = 4096) -> str:
        """Text of at most MAX_LEN characters, one of CHOICES when given."""
        found, value = self._get(key, default)
        if not found:
            return value
        if choices is not None:
            if not isinstance(value, str) or value not in choices:
                raise self._wrong(key, "one of " + ", ".join(map(repr, choices)), value)
        elif not isinstance(value, str) or len(value) > max_len:
            raise self._wrong(key, f"text of at most {max_len:,} characters", value)
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> bool:
        """true or false."""
        found, value = self._get(key, default)
        if found and not isinstance(value, bool):
            raise self._wrong(key, "true or false", value)
        return value

    def array(self, key: str, default: Any = _MISSING, *, max_len: int = 1 << 20) -> list:
        """A list of at most MAX_LEN items (check the items with `sub` or by hand)."""
        found, value = self._get(key, default)
        if not found:
            return value
        if not isinstance(value, list) or len(value) > max_len:
            raise self._wrong(key, f"a list of at most {max_len:,} items", value)
        return value

    def object(self, key: str, default: Any = _MISSING) -> "Fields":
        """A nested object, as Fields of its own (its keys named KEY.name in errors)."""
        return self.sub(key, self._get(key, default)[1])

    def sub(self, name: str, value: Any) -> "Fields":
        """VALUE (an item of a list, a nested object) as Fields, named SOURCE: NAME in errors."""
        if not isinstance(value, dict):
            raise self._wrong(name, "an object", value)
        return Fields(value, f"{self.source}: {name}", self.fix)
