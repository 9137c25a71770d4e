"""A GGUF file's tokenizer, rebuilt as a `tokenizers` tokenizer.json.

GGUF keeps a byte-level BPE tokenizer as arrays (`tokenizer.ggml.tokens`, `.merges`,
`.token_type`) and names its pre-tokenizer (`tokenizer.ggml.pre`) after llama.cpp's list.
We follow llama.cpp, whose behaviour is the model's own tokenizer: for `smollm` every digit
is split off first, then the GPT-2 byte-level regex applies (transformers' GGUF converter
does not know `smollm` and uses the plain GPT-2 regex, which differs on whitespace before
digits). Control and user-defined tokens (`<|im_start|>`, …) are special: matched whole,
never split. A BERT file's WordPiece vocabulary (`tokenizer.ggml.model` "bert": nomic-bert) is written by llama.cpp's
converter in "phantom space" form — a word-initial piece as ▁piece, a continuation as the bare piece, [SPECIAL]s as
they are — and read back as WordPiece's piece / ##piece, normalised and split as the model's own BERT tokenizer
(lowercase, accents stripped, punctuation split off: llama.cpp's WPM splits alike; accented text is not checked
against it), wrapped in [CLS] … [SEP] when the file adds them.
"""

from __future__ import annotations

from ..runtime.errors import QkvError

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp) for the names we support.
_GPT2 = None                                       # the ByteLevel pre-tokenizer's own GPT-2 regex
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# phi-2 (Phi-2), olmo and mpt (the GPT-NeoX tokenizer: Pythia, OLMo 1) are llama.cpp's GPT-2 regex too.
PRE_TOKENIZERS = {"default": _GPT2, "gpt2": _GPT2, "gpt-2": _GPT2, "phi-2": _GPT2, "olmo": _GPT2, "mpt": _GPT2,
                  "smollm": "digits+gpt2",
                  "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "qwen2": _QWEN2}
# llama.cpp lets these take a piece that is itself a token whole, before any merge
# (`ignore_merges`, as Llama 3's tokenizer.json says too).
IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe"}

_CONTROL, _USER_DEFINED = 3, 4                      # llama.cpp token types that are matched whole


def _array(reader, key: str) -> list | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return list(field.contents())
    except (ValueError, IndexError, TypeError, UnicodeDecodeError):
        raise QkvError(f"the GGUF field {key} cannot be read; the file is damaged") from None


def _pre_tokenizer(name: str):
    from tokenizers import Regex, pre_tokenizers

    if name not in PRE_TOKENIZERS:
        raise QkvError(f"GGUF pre-tokenizer {name!r} is not supported; qkv reads "
                       f"{', '.join(sorted(PRE_TOKENIZERS))}")
    regex = PRE_TOKENIZERS[name]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex is None or regex == "digits+gpt2")
    if regex is None:
        return byte_level
    if regex == "digits+gpt2":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"), byte_level])


def build(reader, meta: dict) -> tuple[str, dict, int]:
    """(tokenizer.json text, tokenizer_config.json dict, vocabulary size) from GGUF metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind == "bert":
        return _word_piece(reader, meta)
    if kind != "gpt2":
        raise QkvError(f"GGUF tokenizer model {kind!r} is not supported; qkv reads byte-level BPE ('gpt2') "
                       "and BERT's WordPiece ('bert') tokenizers")
    tokens = _array(reader, "tokenizer.ggml.tokens")
    merges = _array(reader, "tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise QkvError("the GGUF file has no tokenizer.ggml.tokens or .merges; it is not a complete model")
    types = _array(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
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
    whole = {"ignore_merges": True} if pre in IGNORE_MERGES else {}     # (tokenizers ≥ 0.19)
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
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, vocab[bos])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    config = {"bos_token": bos, "eos_token": token("eos"), "pad_token": token("padding"),
              "unk_token": token("unknown"), "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token")),
              "tokenizer_class": "PreTrainedTokenizerFast"}
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    return tok.to_str(), {k: v for k, v in config.items() if v is not None}, len(tokens)


def _word_piece(reader, meta: dict) -> tuple[str, dict, int]:
    """A BERT file's tokenizer (see the module's docstring): (tokenizer.json text, tokenizer_config.json, size)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tokens = _array(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise QkvError("the GGUF file has no tokenizer.ggml.tokens; it is not a complete model")
    types = _array(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
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
