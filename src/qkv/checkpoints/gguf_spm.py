"""A GGUF file's SentencePiece tokenizer (`tokenizer.ggml.model` "llama"), rebuilt as a `tokenizers` tokenizer.json.

Llama 2, Mistral 7B, Mixtral, Gemma, Phi-3, ERNIE 4.5, Jamba, … ship a SentencePiece BPE vocabulary; llama.cpp's
converter writes it as three arrays: `tokenizer.ggml.tokens` (▁ for a space), `.scores` (SentencePiece's: higher
merges first) and `.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte <0xXX>). We
tokenize as llama.cpp does (llama-vocab.cpp: llm_tokenizer_spm_session), which is the model's own runtime:

    1. control, user-defined and unknown tokens written in the text are matched whole first;
    2. each piece of text between them gets a space in front (`tokenizer.ggml.add_space_prefix`, default true;
       Gemma's files say false), and its spaces become ▁;
    3. its characters are merged pairwise, the pair whose join is the token of the highest score first (the
       leftmost of equal scores), while any adjacent join is a token;
    4. a piece that is not a token is written as its UTF-8 bytes, <0xXX> each;
    5. BOS in front (`add_bos_token`, default true), EOS behind (`add_eos_token`, default false).

`tokenizers`' BPE does 3 with merges ranked instead of scored: every split of a token into two tokens is a merge,
ranked by the token's score (as transformers' GGUF converter derives them; tokens of one score in the file's order).
The two agree but where two joins of equal score meet; so a file where two tokens of one score meet on a shared
piece the wrong way round (`_check_ties`), or whose special tokens overlap one another (llama.cpp matches the
longest first, `tokenizers` the leftmost), or which lacks the 256 byte tokens (llama.cpp then fails on a character
outside the vocabulary) is refused in one line rather than tokenized differently. What remains: one token's two
joins meeting as x|y|z with x+y = y+z (ab|a|ba), where llama.cpp takes the leftmost and `tokenizers` the pair
ranked first — never seen on the test vocabularies (against llama.cpp: every text of up to 7 characters of
` thean▁`, 30 000 random paragraphs; tests/test_gguf_spm.py checks every text of up to 5 against llama.cpp's loop
written out) — and, in a Phi-3 file, whitespace other than ASCII's after a special token (llama.cpp keeps it,
`tokenizers` drops it with the ASCII). A file's `tokenizer.ggml.merges`, if any, is not read: llama.cpp merges a
SentencePiece vocabulary by its scores.
"""

from __future__ import annotations

import math

from ..runtime.errors import QkvError
from .gguf_reader import field_list

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6     # llama.cpp's token types
SPACE = "\u2581"                                                           # ▁, SentencePiece's space
BYTES = [f"<0x{b:02X}>" for b in range(256)]                               # the byte fallback's tokens
# Tokens llama.cpp takes as control by their text whatever the file says (llama-vocab.cpp: end of turn and
# generation, fill-in-the-middle), and those it takes as user-defined (gpt-oss): all are matched whole.
BY_NAME = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
           "_<EOT>", "<|eom_id|>", "<|return|>", "<|call|>", "<end_of_utterance>", "<|fim_prefix|>", "<fim-prefix>",
           "<fim_prefix>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
           "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>",
           "▁<MID>", "<|code_middle|>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>",
           "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>", "<|channel|>", "<|message|>",
           "<|start|>", "<|constrain|>"}
# A Phi-3 file (general.name says so) strips the whitespace after its special tokens, but after these.
PHI3_KEEP_SPACE = {"<unk>", "<s>", "<|endoftext|>"}


def _flag(meta: dict, key: str, default: bool) -> bool:
    value = meta.get(f"tokenizer.ggml.{key}", default)
    if not isinstance(value, bool):
        raise QkvError(f"the GGUF field tokenizer.ggml.{key} is {value!r:.20}, not true or false; the file is damaged")
    return value


def vocabulary(reader) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, types) of the file, each checked: one entry per token, finite scores, known types, no token
    twice (llama.cpp stops on that), an empty token named [EMPTY_i] as llama.cpp names it."""
    tokens = field_list(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise QkvError("the GGUF file has no tokenizer.ggml.tokens; it is not a complete model")
    scores = field_list(reader, "tokenizer.ggml.scores")
    if scores is None:
        raise QkvError("the GGUF SentencePiece tokenizer has no tokenizer.ggml.scores (its merge order); "
                       "the file is damaged: convert the model again")
    types = field_list(reader, "tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if len(scores) != len(tokens) or len(types) != len(tokens):
        raise QkvError(f"the GGUF tokenizer has {len(tokens)} tokens but {len(scores)} scores and {len(types)} "
                       "token types; the file is damaged")
    if not all(isinstance(s, (int, float)) and math.isfinite(s) for s in scores):
        raise QkvError("the GGUF tokenizer.ggml.scores are not all finite numbers; the file is damaged")
    if not all(isinstance(k, int) and NORMAL <= k <= BYTE for k in types):
        bad = next(k for k in types if not (isinstance(k, int) and NORMAL <= k <= BYTE))
        raise QkvError(f"the GGUF tokenizer.ggml.token_type holds {bad!r:.20}, not a token type (1-6); the file "
                       "is damaged")
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    if len(set(tokens)) != len(tokens):
        raise QkvError("the GGUF tokenizer lists a token twice; the file is damaged")
    return tokens, [float(s) for s in scores], [int(k) for k in types]


def check_bytes(vocab: dict[str, int], types: list[int]) -> None:
    """The 256 byte tokens <0x00>…<0xFF>, each typed byte: what a character the vocabulary lacks becomes."""
    missing = [b for b in BYTES if b not in vocab]
    if missing:
        raise QkvError(f"the GGUF SentencePiece vocabulary has no byte token {missing[0]} (of {len(missing)} "
                       "missing); qkv reads only vocabularies with byte fallback, which llama.cpp needs for "
                       "characters outside the vocabulary")
    wrong = [b for b in BYTES if types[vocab[b]] != BYTE]
    if wrong:
        raise QkvError(f"the GGUF token {wrong[0]} is not typed byte (6) in tokenizer.ggml.token_type; the file is "
                       "damaged")


def merges(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best first: by the token's score, higher first (llama.cpp's
    order); tokens of one score in the file's order (checked by `_check_ties`); one token's splits the longer left
    part first (transformers' order)."""
    found = []                                            # (score, token's id, len(left), len(right), left, right)
    groups: dict[float, list[tuple[int, list[tuple[str, str]]]]] = {}
    for i, (token, score) in enumerate(zip(tokens, scores)):
        splits = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in vocab and token[k:] in vocab]
        if splits:
            groups.setdefault(score, []).append((i, splits))
            found += [(score, i, len(a), len(b), a, b) for a, b in splits]
    for group in groups.values():
        if len(group) > 1:
            _check_ties(group, tokens)
    found.sort(key=lambda m: (-m[0], m[1], -m[2], -m[3]))
    return [(a, b) for *_, a, b in found]


def _check_ties(group: list[tuple[int, list[tuple[str, str]]]], tokens: list[str]) -> None:
    """Refuse tokens of one score whose joins can meet on a shared piece the wrong way round: x|y|z where x+y is
    a later token of the file than y+z. llama.cpp joins the left pair (equal scores, the leftmost first); the merge
    list, in the file's order, the right one. (The other way round both join the left pair.)"""
    last_ending: dict[str, int] = {}                      # a piece → the last token id with a split ending in it
    for i, splits in group:
        for _, right in splits:
            last_ending[right] = max(i, last_ending.get(right, -1))
    for i, splits in group:
        for left, _ in splits:
            j = last_ending.get(left, -1)
            if j > i:
                raise QkvError(f"the GGUF SentencePiece tokens {tokens[j]!r:.30} and {tokens[i]!r:.30} share a score "
                               "and a piece; llama.cpp merges such ties by position, which qkv's tokenizer cannot: "
                               "not supported")


def specials(tokens: list[str], types: list[int], name: str) -> list[tuple[str, bool]]:
    """The tokens matched whole in text, each with whether the whitespace after it is dropped: control,
    user-defined, unknown and llama.cpp's BY_NAME tokens (Phi-3's files strip the space after theirs)."""
    phi3 = "phi-3" in name.lower() or "phi3" in name.lower()
    found = [t for t, k in zip(tokens, types) if k in (CONTROL, USER_DEFINED, UNKNOWN) or t in BY_NAME]
    if phi3 and "</s>" in tokens and "</s>" not in found:
        found.append("</s>")
    _check_overlaps(found)
    return [(t, phi3 and t not in PHI3_KEEP_SPACE) for t in found]


def _check_overlaps(texts: list[str]) -> None:
    """Refuse special tokens where one's end is another's start ("ab", "bc"): llama.cpp matches the longer first
    anywhere, `tokenizers` the leftmost. Runs of one character ("  ", "   ") agree either way."""
    starts: dict[str, list[str]] = {}
    for u in texts:
        for i in range(1, len(u)):
            starts.setdefault(u[:i], []).append(u)
    for t in texts:
        for i in range(1, len(t)):
            for u in starts.get(t[i:], ()):
                if not (len(set(t)) == 1 and set(u) == set(t)):
                    raise QkvError(f"the GGUF special tokens {t!r:.30} and {u!r:.30} overlap; llama.cpp and qkv's "
                                   "tokenizer would split text holding both differently: not supported")


def build(reader, meta: dict) -> tuple[str, dict, int]:
    """(tokenizer.json text, tokenizer_config.json dict, vocabulary size) of a SentencePiece GGUF file."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    tokens, scores, types = vocabulary(reader)
    vocab = {t: i for i, t in enumerate(tokens)}
    check_bytes(vocab, types)

    def token(key: str, default: int | None) -> str | None:              # llama.cpp's defaults: unk 0, bos 1, eos 2
        i = meta.get(f"tokenizer.ggml.{key}_token_id", default)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    unk, bos, eos = token("unknown", 0), token("bos", 1), token("eos", 2)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges(tokens, scores, vocab), unk_token=unk, fuse_unk=False,
                               byte_fallback=True))
    prefix = _flag(meta, "add_space_prefix", True)
    escape = normalizers.Replace(" ", SPACE)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), escape]) if prefix else escape
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + [decoders.Strip(" ", 1, 0)] if prefix else steps)
    name = meta.get("general.name")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, rstrip=strip)
                            for t, strip in specials(tokens, types, name if isinstance(name, str) else "")])
    add_bos, add_eos = _flag(meta, "add_bos_token", True), _flag(meta, "add_eos_token", False)
    if (add_bos and bos is None) or (add_eos and eos is None):
        raise QkvError("the GGUF tokenizer adds a BOS or EOS token it does not have; the file is damaged")
    single = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos)
    pair = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos
                    + [f"{bos}:1"] * add_bos + ["$B:1"] + [f"{eos}:1"] * add_eos)
    used = {t: vocab[t] for t in (bos,) * add_bos + (eos,) * add_eos}
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(used.items()))
    config = {"bos_token": bos, "eos_token": eos, "unk_token": unk, "pad_token": token("padding", None),
              "add_bos_token": add_bos, "add_eos_token": add_eos, "tokenizer_class": "PreTrainedTokenizerFast"}
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    return tok.to_str(), {k: v for k, v in config.items() if v is not None}, len(tokens)
