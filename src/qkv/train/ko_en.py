"""The guide's translation example (guide: self-cross) as data: simple Korean sentences, their English, and which words align.

"나는 학교에 간다" → "I go to school": when the decoder writes "I" its cross-attention should look at
"나는" (guide: self-cross). This grammar makes every sentence of that kind it can, with its translation
and word alignment, so that a model qkv trains can be checked on held-out sentences and its
cross-attention scored against the alignment.

    Korean (subject–object–verb)            English (subject–verb–object)
    나는 학교에 간다                          I go to school
    그녀는 공원에서 책을 읽었어요               she read a book in the park
    학생들은 빵을 먹을 것입니다                 the students will eat bread

Subjects take the topic particle 은/는, objects 을/를, places 에 (where to) or 에서 (where at),
chosen by whether the word ends in a consonant (받침). Verbs come in three tenses (present, past,
future: "-ㄹ 것이다", two words) and three levels of politeness (plain 한다, polite 해요, formal
합니다), which English does not mark: nine Korean sentences share one English one. Korean words
are the space-separated eojeol (word + particle), English words are words; the alignment names,
for each English word, the Korean word it translates.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from ..runtime.errors import QkvError


@dataclass(frozen=True)
class Pair:
    """One sentence pair: ko and en as space-separated words; align[i] = the Korean word of en word i."""

    ko: str
    en: str
    align: tuple[int, ...]


def has_final_consonant(word: str) -> bool:
    """Whether a Hangul word ends in a consonant (받침): picks 은/는, 을/를."""
    code = ord(word[-1]) - 0xAC00
    return 0 <= code < 11172 and code % 28 != 0


def topic(word: str) -> str:
    return word + ("은" if has_final_consonant(word) else "는")


def objective(word: str) -> str:
    return word + ("을" if has_final_consonant(word) else "를")


# subject: Korean, English, English person for the verb ("3" takes -s)
SUBJECTS = [("나", "I", "1"), ("너", "you", "2"), ("그", "he", "3"), ("그녀", "she", "3"), ("우리", "we", "1"),
            ("그들", "they", "1"), ("학생", "the student", "3"), ("학생들", "the students", "1"),
            ("선생님", "the teacher", "3"), ("아이", "the child", "3"), ("친구", "my friend", "3"),
            ("고양이", "the cat", "3"), ("개", "the dog", "3")]
# places: Korean, English after 에 (to …), English after 에서 (at …)
PLACES = [("학교", "to school", "at school"), ("집", "home", "at home"), ("시장", "to the market", "at the market"),
          ("공원", "to the park", "in the park"), ("도서관", "to the library", "at the library")]
OBJECTS = {"사과": "an apple", "빵": "bread", "밥": "rice", "물": "water", "우유": "milk", "커피": "coffee",
           "책": "a book", "편지": "a letter", "신문": "the newspaper", "영화": "a movie", "꽃": "flowers",
           "음악": "music"}

# verb: kind, objects it takes, English (base, 3rd person, past), Korean forms (plain present, past stem,
# future adnominal, polite present, formal present): 가다 → 간다, 갔, 갈, 가요, 갑니다.
VERBS = [
    ("motion", (), ("go", "goes", "went"), ("간다", "갔", "갈", "가요", "갑니다")),
    ("motion", (), ("come", "comes", "came"), ("온다", "왔", "올", "와요", "옵니다")),
    ("object", ("사과", "빵", "밥"), ("eat", "eats", "ate"), ("먹는다", "먹었", "먹을", "먹어요", "먹습니다")),
    ("object", ("물", "우유", "커피"), ("drink", "drinks", "drank"), ("마신다", "마셨", "마실", "마셔요", "마십니다")),
    ("object", ("책", "편지", "신문"), ("read", "reads", "read"), ("읽는다", "읽었", "읽을", "읽어요", "읽습니다")),
    ("object", ("영화", "꽃"), ("see", "sees", "saw"), ("본다", "봤", "볼", "봐요", "봅니다")),
    ("object", ("사과", "빵", "책", "꽃", "우유"), ("buy", "buys", "bought"), ("산다", "샀", "살", "사요", "삽니다")),
    ("object", ("빵", "밥", "편지"), ("make", "makes", "made"), ("만든다", "만들었", "만들", "만들어요", "만듭니다")),
    ("object", ("음악", "영화", "꽃", "커피"), ("like", "likes", "liked"),
     ("좋아한다", "좋아했", "좋아할", "좋아해요", "좋아합니다")),
    ("place", (), ("study", "studies", "studied"), ("공부한다", "공부했", "공부할", "공부해요", "공부합니다")),
    ("place", (), ("work", "works", "worked"), ("일한다", "일했", "일할", "일해요", "일합니다")),
    ("place", (), ("play", "plays", "played"), ("논다", "놀았", "놀", "놀아요", "놉니다")),
    ("place", (), ("sleep", "sleeps", "slept"), ("잔다", "잤", "잘", "자요", "잡니다")),
]
TENSES = ("present", "past", "future")
POLITENESS = ("plain", "polite", "formal")


def korean_verb(forms: tuple[str, ...], tense: str, politeness: str) -> list[str]:
    """The verb's Korean words: one, or two for the future (갈 것이다 / 갈 거예요 / 갈 것입니다)."""
    plain, past, adnominal, polite, formal = forms
    level = POLITENESS.index(politeness)
    if tense == "present":
        return [(plain, polite, formal)[level]]
    if tense == "past":
        return [past + ("다", "어요", "습니다")[level]]
    return [adnominal, ("것이다", "거예요", "것입니다")[level]]


def english_verb(english: tuple[str, str, str], person: str, tense: str) -> list[str]:
    base, third, past = english
    if tense == "present":
        return [third if person == "3" else base]
    return [past] if tense == "past" else ["will", base]


def _pair(subject, verb, tense: str, politeness: str, obj: str | None, place, place_kind: str | None) -> Pair:
    """Build one sentence: Korean S (Place) (O) V, English S V (O) (Place), and the alignment."""
    s_ko, s_en, person = subject
    kind, _, english, forms = verb
    ko: list[str] = [topic(s_ko)]
    en: list[tuple[str, int]] = [(w, 0) for w in s_en.split()]        # (English word, its Korean word)
    place_at = None
    if place is not None:
        place_at = len(ko)
        ko.append(place[0] + ("에" if place_kind == "to" else "에서"))
    obj_at = None
    if obj is not None:
        obj_at = len(ko)
        ko.append(objective(obj))
    verb_ko = korean_verb(forms, tense, politeness)
    v0 = len(ko)
    ko.extend(verb_ko)
    verb_en = english_verb(english, person, tense)
    if len(verb_en) == 2:                                           # will ↔ 것이다, go ↔ 갈
        en += [("will", v0 + 1), (verb_en[1], v0)]
    else:
        en.append((verb_en[0], v0))
    if obj is not None:
        en += [(w, obj_at) for w in OBJECTS[obj].split()]
    if place is not None:
        en += [(w, place_at) for w in (place[1] if place_kind == "to" else place[2]).split()]
    return Pair(" ".join(ko), " ".join(w for w, _ in en), tuple(i for _, i in en))


def all_pairs() -> list[Pair]:
    """Every sentence the grammar makes, in a fixed order."""
    pairs = []
    for subject, verb, tense, politeness in product(SUBJECTS, VERBS, TENSES, POLITENESS):
        kind, objects = verb[0], verb[1]
        if kind == "motion":
            pairs += [_pair(subject, verb, tense, politeness, None, p, "to") for p in PLACES]
        elif kind == "place":
            pairs += [_pair(subject, verb, tense, politeness, None, p, "at") for p in PLACES]
        else:
            for obj in objects:
                pairs.append(_pair(subject, verb, tense, politeness, obj, None, None))
                pairs += [_pair(subject, verb, tense, politeness, obj, p, "at") for p in PLACES]
    return pairs


def split_pairs(seed: int = 0, held_out: float = 0.05) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out) sentence pairs, disjoint, shuffled by seed: the model never sees a held-out Korean sentence."""
    if not 0 < held_out < 1:
        raise QkvError(f"held_out={held_out} must be a fraction between 0 and 1")
    pairs = all_pairs()
    order = np.random.default_rng(seed).permutation(len(pairs))
    k = max(1, int(round(len(pairs) * held_out)))
    return [pairs[i] for i in order[k:]], [pairs[i] for i in order[:k]]


SPECIALS = ("<pad>", "</s>", "<unk>")       # Marian's: pad 0 (also the decoder's start), end of sentence 1


def word_tokenizer(pairs: list[Pair]):
    """A word-level `tokenizers.Tokenizer` over both languages' words (one vocabulary, as Marian shares
    its embeddings): split on spaces, </s> appended to every text, decoded by joining with spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    words = sorted({w for p in pairs for w in p.ko.split() + p.en.split()})
    vocab = {t: i for i, t in enumerate(SPECIALS + tuple(words))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIALS))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
    tok.decoder = decoders.WordPiece(prefix="##")                    # words joined by spaces, specials dropped
    return tok
