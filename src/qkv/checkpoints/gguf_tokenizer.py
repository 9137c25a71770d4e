"""A GGUF file's tokenizer, rebuilt as a `tokenizers` tokenizer.json.

GGUF keeps a byte-level BPE tokenizer as arrays (`tokenizer.ggml.tokens`, `.merges`,
`.token_type`) and names its pre-tokenizer (`tokenizer.ggml.pre`) after llama.cpp's list.
We follow llama.cpp, whose behaviour is the model's own tokenizer (src/llama-vocab.cpp): each
name stands for a list of regexes applied one after another, every piece one regex leaves split
again by the next, matches and the text between them both kept (a `tokenizers` Sequence of
Split(isolated)), then GPT-2's byte-to-letter map (ByteLevel without its own regex) and BPE over the
file's merges. PRE_TOKENIZERS holds that list per name as data, with what else llama.cpp sets per name
that changes ids: `ignore_merges` (a piece that is itself a token is taken whole) and whether a BOS is
added when the file does not say (`tokenizer.ggml.add_bos_token`). llama.cpp's regexes are used as it
writes them (its `(?:'[sS]|…)` for the models' `(?i:'s|…)`); where it names characters by range (the
DeepSeek and BLOOM lists) the ranges are written as code points. tests/test_gguf_pretokenizers.py
checks every name against llama.cpp's own ids. (llama.cpp's "no default BOS id" for chatglm and glm4
needs nothing here: qkv adds a BOS only when the file names its id.) Transformers' GGUF converter knows
fewer names and falls back to the plain GPT-2 regex (for `smollm` it differs on whitespace before
digits). Control and user-defined tokens (`<|im_start|>`, …) are special: matched whole, never split.

A BERT file's WordPiece vocabulary (`tokenizer.ggml.model` "bert": nomic-bert) is written by llama.cpp's
converter in "phantom space" form — a word-initial piece as ▁piece, a continuation as the bare piece, [SPECIAL]s as
they are — and read back as WordPiece's piece / ##piece, normalised and split as the model's own BERT tokenizer
(lowercase, accents stripped, punctuation split off: llama.cpp's WPM splits alike; accented text is not checked
against it), wrapped in [CLS] … [SEP] when the file adds them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.errors import QkvError
from .gguf_reader import field_list


def _chars(*ranges: tuple[int, int] | int) -> str:
    """A regex character-class body from code points and (first, last) ranges, written as \\x{…}."""
    out = []
    for r in ranges:
        lo, hi = (r, r) if isinstance(r, int) else r
        out.append(f"\\x{{{lo:X}}}" if lo == hi else f"\\x{{{lo:X}}}-\\x{{{hi:X}}}")
    return "".join(out)


@dataclass(frozen=True)
class Pre:
    """One llama.cpp pre-tokenizer: REGEXES applied in turn (each splits every piece the last left, the
    matches isolated); IGNORE_MERGES: a piece that is a token is taken whole before any merge; ADD_BOS:
    whether a BOS is added when the file has no tokenizer.ggml.add_bos_token."""
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False


_S = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"       # contractions, either case
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = _S + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _S + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (_S + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
           r"|\s+")
_SEED_CODER = _S + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
# llama.cpp's "upper" and "lower" letters: a letter other than a–z / A–Z (any non-ASCII letter is both)
_CASED = r"((?=[\p{L}])([^a-z]))"
_LOWER = r"((?=[\p{L}])([^A-Z]))"
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED}*{_LOWER}+{_S}?|[^\r\n\p{{L}}\p{{N}}]?{_CASED}+{_LOWER}*{_S}?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_CASED}+{_LOWER}*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek LLM's cased letters (its tokenizer's list of ranges), its punctuation, its CJK and Hangul.
_DEEPSEEK_LETTERS = _chars(
    (0x41, 0x5A), (0x61, 0x7A), 0xB5, (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF), (0x1C4, 0x293),
    (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), 0x37F, 0x386, (0x388, 0x38A), 0x38C,
    (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481), (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5),
    (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77),
    (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D), (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57),
    0x1F59, 0x1F5B, 0x1F5D, (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), 0x1FBE, (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC),
    0x2102, 0x2107, (0x210A, 0x2113), 0x2115, (0x2119, 0x211D), 0x2124, 0x2126, 0x2128, (0x212A, 0x212D),
    (0x212F, 0x2134), 0x2139, (0x213C, 0x213F), (0x2145, 0x2149), 0x214E, (0x2183, 0x2184), (0x2C00, 0x2C7B),
    (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F),
    (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2),
    (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943))
_DEEPSEEK_PUNCT = _chars((0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E), (0x2018, 0x201F),
                         (0x3000, 0x3002))
_DEEPSEEK_CJK = _chars((0x4E00, 0x9FA5), (0x800, 0x4E00), (0xAC00, 0xD7FF))      # (sic: ࠀ-一)
_DEEPSEEK3_CJK = _chars((0x4E00, 0x9FA5), (0x3040, 0x309F), (0x30A0, 0x30FF))    # CJK, hiragana, katakana
_BLOOM = " ?[^(\\s|.,!?" + _chars(0x2026, 0x3002, 0xFF0C, 0x3001, 0x964, 0x6D4, 0x60C) + ")]+"

_P_GPT2 = Pre((_GPT2,))
_P_LLAMA3 = Pre((_LLAMA3,), ignore_merges=True, add_bos=True)
_P_DIGITS_GPT2 = Pre((r"\p{N}", _GPT2))
_P_QWEN2 = Pre((_QWEN2,))
_P_DEEPSEEK3 = Pre((r"\p{N}{1,3}", f"[{_DEEPSEEK3_CJK}]+",
                    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"))
_P_BLOOM = Pre((_BLOOM,))

# name (tokenizer.ggml.pre) → llama.cpp's pre-tokenizer; the models each name comes from
# (convert_hf_to_gguf.py's get_vocab_base_pre) after it.
PRE_TOKENIZERS: dict[str, Pre] = {
    # a file without a name, and llama.cpp's fallback
    "default": Pre((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    # GPT-2's regex: GPT-2, Phi-2, MPT and the GPT-NeoX tokenizer (Pythia, Mamba), OLMo 1 / OLMoE, EXAONE 4.0,
    # Granite Docling, Trillion, Mellum, A.X 4.0, GigaChat
    "gpt-2": _P_GPT2, "phi-2": _P_GPT2, "mpt": _P_GPT2, "olmo": _P_GPT2, "exaone4": _P_GPT2,
    "granite-docling": _P_GPT2, "trillion": _P_GPT2, "mellum": _P_GPT2, "a.x-4.0": _P_GPT2, "gigachat": _P_GPT2,
    # every digit alone, then GPT-2's: SmolLM, StarCoder2, Refact, Command-R, Minerva
    "smollm": _P_DIGITS_GPT2, "starcoder": _P_DIGITS_GPT2, "refact": _P_DIGITS_GPT2, "command-r": _P_DIGITS_GPT2,
    "minerva-7b": _P_DIGITS_GPT2,
    # Llama 3's: Llama 3.x, Falcon 3, Falcon-H1, Pixtral, Mi:dm 2.0 (ignore_merges, BOS by default)
    "llama3": _P_LLAMA3, "llama-v3": _P_LLAMA3, "llama-bpe": _P_LLAMA3, "falcon3": _P_LLAMA3,
    "falcon-h1": _P_LLAMA3, "pixtral": _P_LLAMA3, "midm-2.0": _P_LLAMA3,
    # Llama 3's regex without its ignore_merges: DBRX, Smaug, ChatGLM / glm-4-9b-chat; GLM-4-0414 and GLM-4.5
    # (glm4) with it but no BOS by default, as the llama.cpp of llama-cpp-python 0.3.36 reads them
    "dbrx": Pre((_LLAMA3,)), "smaug-bpe": Pre((_LLAMA3,)), "chatglm-bpe": Pre((_LLAMA3,)),
    "glm4": Pre((_LLAMA3,), ignore_merges=True),
    # Qwen2's (digits alone): Qwen1.5–3, Qwen3-Next, the R1 distills, StableLM 2, Megrez, F2LLM-v2
    "qwen2": _P_QWEN2, "deepseek-r1-qwen": _P_QWEN2, "stablelm2": _P_QWEN2, "megrez": _P_QWEN2,
    "f2llmv2": _P_QWEN2,
    "qwen35": Pre((_QWEN35,)),                                              # Qwen3.5 (combining marks)
    "seed-coder": Pre((_SEED_CODER,)),                                      # Seed-Coder, Seed-OSS
    "gpt-4o": Pre((_GPT4O,)), "llama4": Pre((_GPT4O,)), "kanana2": Pre((_GPT4O,)),  # gpt-oss; Llama 4; Kanana-2
    "tekken": Pre((_TEKKEN,), ignore_merges=True, add_bos=True),            # Mistral Nemo
    "deepseek-llm": Pre(("[\\r\\n]", f"\\s?[{_DEEPSEEK_LETTERS}]+", f"\\s?[{_DEEPSEEK_PUNCT}]+", "\\s+$",
                         f"[{_DEEPSEEK_CJK}]+", r"\p{N}+")),                  # DeepSeek LLM, DeepSeek-V2
    "deepseek-coder": Pre(("[\\r\\n]", r"\s?\p{L}+", r"\s?\p{P}+", f"[{_DEEPSEEK_CJK}]+", r"\p{N}")),
    "deepseek-v3": _P_DEEPSEEK3, "hunyuan-dense": _P_DEEPSEEK3,             # DeepSeek-V3 / R1; Hunyuan dense
    "joyai-llm": _P_DEEPSEEK3,                                              # JoyAI-LLM-Flash
    "falcon": Pre((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),     # Falcon (7B, 40B)
    "bloom": _P_BLOOM, "poro-chat": _P_BLOOM, "gpt3-finnish": _P_BLOOM,     # BLOOM and its kin
    "viking": Pre((_BLOOM, r"\p{N}")),                                      # Viking
}
# Older spellings read as llama.cpp's names.
ALIASES = {"gpt2": "gpt-2"}

_CONTROL, _USER_DEFINED = 3, 4                      # llama.cpp token types that are matched whole


def _pre(name: str) -> Pre:
    """llama.cpp's pre-tokenizer called NAME (tokenizer.ggml.pre), or one line naming those qkv reads."""
    spec = PRE_TOKENIZERS.get(ALIASES.get(name, name))
    if spec is None:
        raise QkvError(f"GGUF pre-tokenizer {name!r} is not supported; qkv reads "
                       f"{', '.join(sorted(PRE_TOKENIZERS))}")
    return spec


def _pre_tokenizer(name: str):
    """NAME's regexes as a `tokenizers` Sequence of Split(isolated), then ByteLevel (bytes → letters only)."""
    from tokenizers import Regex, pre_tokenizers

    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _pre(name).regexes]
    return pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def build(reader, meta: dict) -> tuple[str, dict, int]:
    """(tokenizer.json text, tokenizer_config.json dict, vocabulary size) from GGUF metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind == "bert":
        return _word_piece(reader, meta)
    if kind == "llama":                                  # SentencePiece BPE with scores (Llama 2, Gemma, …)
        from . import gguf_spm
        return gguf_spm.build(reader, meta)
    if kind != "gpt2":
        raise QkvError(f"GGUF tokenizer model {kind!r} is not supported; qkv reads byte-level BPE ('gpt2'), "
                       "SentencePiece ('llama') and BERT's WordPiece ('bert') tokenizers")
    tokens = field_list(reader, "tokenizer.ggml.tokens")
    merges = field_list(reader, "tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise QkvError("the GGUF file has no tokenizer.ggml.tokens or .merges; it is not a complete model")
    types = field_list(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise QkvError("the GGUF tokenizer has token types for a different number of tokens; the file is damaged")
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = []
    for m in merges:
        left, sep, right = m.partition(" ")
        if not sep or left not in vocab or right not in vocab:
            raise QkvError(f"the GGUF merge {m!r} names tokens outside the vocabulary; the file is damaged")
        pairs.append((left, right))
    pre = meta.get("tokenizer.ggml.pre", "default")
    spec = _pre(pre)
    whole = {"ignore_merges": True} if spec.ignore_merges else {}      # (tokenizers ≥ 0.19)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False, **whole))
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types)
                if k in (_CONTROL, _USER_DEFINED)]
    tok.add_special_tokens(specials)

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    bos = token("bos")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", spec.add_bos))  # llama.cpp's default by name
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, vocab[bos])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    config = {"bos_token": bos, "eos_token": token("eos"), "pad_token": token("padding"),
              "unk_token": token("unknown"), "add_bos_token": add_bos,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    return tok.to_str(), {k: v for k, v in config.items() if v is not None}, len(tokens)


def _word_piece(reader, meta: dict) -> tuple[str, dict, int]:
    """A BERT file's tokenizer (see the module's docstring): (tokenizer.json text, tokenizer_config.json, size)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tokens = field_list(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise QkvError("the GGUF file has no tokenizer.ggml.tokens; it is not a complete model")
    types = field_list(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise QkvError("the GGUF tokenizer has token types for a different number of tokens; the file is damaged")

    def piece(t: str) -> str:                                        # phantom space → WordPiece's
        if t.startswith("[") and t.endswith("]"):
            return t
        return t[1:] if t.startswith("\u2581") else "##" + t
    pieces = [piece(t) for t in tokens]
    vocab = {t: i for i, t in enumerate(pieces)}

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return pieces[i] if isinstance(i, int) and 0 <= i < len(pieces) else None

    unk = token("unknown") or "[UNK]"
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk, continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in zip(pieces, types)
                            if k in (_CONTROL, _USER_DEFINED)])
    cls, sep = token("bos"), token("seperator")                      # (gguf's spelling)
    if meta.get("tokenizer.ggml.add_bos_token") and cls is not None and sep is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    config = {"cls_token": cls, "sep_token": sep, "pad_token": token("padding"), "unk_token": unk,
              "mask_token": token("mask"), "tokenizer_class": "PreTrainedTokenizerFast"}
    return tok.to_str(), {k: v for k, v in config.items() if v is not None}, len(tokens)
