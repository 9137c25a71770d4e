"""The Korean→English grammar (qkv.train.ko_en): the guide's sentence, particles, conjugations, alignments, splits."""

from __future__ import annotations

import pytest

from qkv.runtime.errors import QkvError
from qkv.train import ko_en


def test_the_guides_sentence():
    pair = next(p for p in ko_en.all_pairs() if p.ko == "나는 학교에 간다")
    assert pair.en == "I go to school"
    assert pair.align == (0, 2, 1, 1)                        # I↔나는, go↔간다, to school↔학교에


@pytest.mark.parametrize("word, topic, obj", [("나", "나는", "나를"), ("책", "책은", "책을"), ("선생님", "선생님은", "선생님을"),
                                              ("사과", "사과는", "사과를")])
def test_particles_follow_the_final_consonant(word, topic, obj):
    assert ko_en.topic(word) == topic and ko_en.objective(word) == obj


@pytest.mark.parametrize("tense, politeness, words", [
    ("present", "plain", ["먹는다"]), ("present", "polite", ["먹어요"]), ("present", "formal", ["먹습니다"]),
    ("past", "plain", ["먹었다"]), ("past", "polite", ["먹었어요"]), ("past", "formal", ["먹었습니다"]),
    ("future", "plain", ["먹을", "것이다"]), ("future", "polite", ["먹을", "거예요"]), ("future", "formal", ["먹을", "것입니다"]),
])
def test_conjugation(tense, politeness, words):
    eat = next(v for v in ko_en.VERBS if v[2][0] == "eat")
    assert ko_en.korean_verb(eat[3], tense, politeness) == words


def test_every_pair_is_consistent():
    pairs = ko_en.all_pairs()
    assert len(pairs) == len({p.ko for p in pairs}) > 10_000     # every Korean sentence once
    for p in pairs:
        ko, en = p.ko.split(), p.en.split()
        assert len(p.align) == len(en) and all(0 <= i < len(ko) for i in p.align)
        assert set(p.align) == set(range(len(ko)))                # every Korean word translated
    # English does not mark politeness: three Korean sentences per English one (six for "I read …", present and past)
    english = {}
    for p in pairs:
        english.setdefault(p.en, set()).add(p.ko)
    assert all(len(v) == 3 or (len(v) == 6 and " read " in f" {en} ") for en, v in english.items())


def test_word_order_crosses():
    """Korean puts the verb last, English right after the subject: the alignment is not monotone."""
    p = next(p for p in ko_en.all_pairs() if p.ko == "그녀는 공원에서 책을 읽었어요")
    assert p.en == "she read a book in the park"
    assert p.align == (0, 3, 2, 2, 1, 1, 1)


def test_split_is_disjoint_and_deterministic():
    train, held = ko_en.split_pairs(seed=3, held_out=0.05)
    assert not {p.ko for p in train} & {p.ko for p in held}
    assert len(held) == round(len(ko_en.all_pairs()) * 0.05)
    assert ko_en.split_pairs(seed=3)[1] == held and ko_en.split_pairs(seed=4)[1] != held
    with pytest.raises(QkvError, match="fraction"):
        ko_en.split_pairs(held_out=1.5)


def test_word_tokenizer_round_trips_both_languages():
    pairs = ko_en.all_pairs()
    tok = ko_en.word_tokenizer(pairs)
    for p in pairs[::997]:
        for text in (p.ko, p.en):
            enc = tok.encode(text)
            assert enc.tokens[-1] == "</s>" and "<unk>" not in enc.tokens
            assert tok.decode(enc.ids) == text
    assert tok.token_to_id("<pad>") == 0 and tok.token_to_id("</s>") == 1
