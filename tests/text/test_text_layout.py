"""The layout of texts kept around their segments: lines, blank lines, indentation, the
whitespace between sentences; n-best lists of paragraphs; clean segments."""

from __future__ import annotations

import math
import random

import pytest

from qkv._errors import SettingError
from qkv.text import clean, plan_texts, read_document


def _shout(segments):
    return [s.upper() for s in segments]


def test_every_line_is_a_paragraph_and_its_layout_is_kept():
    text = "  I am home. He is calm.\n\n\tGo now!  \r\nBye."
    plan = plan_texts([text], source="en", target="fr")
    assert plan.segments == ("I am home.", "He is calm.", "Go now!", "Bye.")
    assert plan.join(_shout(plan.segments)) == [text.upper()]


def test_split_none_keeps_one_line_one_segment():
    plan = plan_texts(["I am home. He is calm.", "  Go.  "], split="none")
    assert plan.segments == ("I am home. He is calm.", "Go.")
    assert plan.join(["A", "B"]) == ["A", "  B  "]


def test_random_layouts_come_back_exactly():
    """Fresh random texts of sentences, blank lines, indentation and spaces: translating
    each segment by itself (the identity) gives every text back, character for character."""
    rng = random.Random(39)
    words = ["home", "calm", "go", "3.50", "the", "«oui»", "(so)", "we're"]
    for _ in range(200):
        lines = []
        for _ in range(rng.randint(1, 6)):
            sentences = [
                " ".join(
                    [rng.choice(["Home", "Calm", "We"]), *rng.choices(words, k=rng.randint(0, 4))]
                )
                + rng.choice([".", "!", "?"])
                for _ in range(rng.randint(0, 3))
            ]
            line = rng.choice(["", " ", "\t", "    "]) + rng.choice([" ", "  "]).join(sentences)
            lines.append(line + rng.choice(["", " ", "\r"]))
        text = "\n".join(lines)
        plan = plan_texts([text], source="en", target="fr")
        assert plan.join(list(plan.segments)) == [text]
        assert all(s == s.strip() and "\n" not in s for s in plan.segments)


def test_segments_of_many_texts_are_one_list_each_distinct_once():
    texts = [f"Line {i}. Same." for i in range(50)]
    plan = plan_texts(texts, source="en", target="de")
    assert len(plan.segments) == 51  # 50 distinct first sentences, "Same." once
    assert plan.join(_shout(plan.segments)) == [t.upper() for t in texts]


def test_spaces_between_sentences_follow_the_target_language():
    zh = plan_texts(["我是学生。你好！"], source="zh", target="en")
    assert zh.segments == ("我是学生。", "你好！")
    assert zh.join(["I am a student.", "Hello!"]) == ["I am a student. Hello!"]
    to_zh = plan_texts(["I am home. He is calm."], source="en", target="zh")
    assert to_zh.join(["我在家。", "他很平静。"]) == ["我在家。他很平静。"]


def test_translations_are_cleaned():
    plan = plan_texts(["Hi. ***. Bye."], source="en", target="fr")
    assert plan.segments == ("Hi.", "***.", "Bye.")
    assert plan.join(["  salut  .   ", "***.", "au  revoir ."]) == ["salut . ***. au revoir ."]
    assert clean(" a \t b  ") == "a b" and clean("x\ny") == "x\ny"


def test_n_best_lists_of_a_paragraph_join_its_sentences_ranks():
    plan = plan_texts(["Go. Now.", "Bye."], source="en", target="fr")
    hyps = [[("a1", -1.0), ("a2", -2.0)], [("b1", -0.5), ("b2", -math.inf)], [("c1", -3.0)]]
    got = plan.join_hypotheses(hyps)
    assert got[0] == [("a1 b1", -1.5), ("a2 b1", -2.5)]
    assert got[1] == [("c1", -3.0), ("", -math.inf)]


def test_labels_name_the_text_and_the_sentence():
    plan = plan_texts(["Go. Now.", "Bye.", "Now."], source="en")
    assert plan.labels() == ["1 (sentence 1)", "1 (sentence 2), 3", "2"]


def test_bad_arguments_are_named():
    with pytest.raises(SettingError, match=r"^split: expected one of sentences, none, got 'x'"):
        plan_texts(["a"], split="x")
    with pytest.raises(SettingError, match=r"^target: expected an ISO 639-1"):
        plan_texts(["a"], target="French!")
    with pytest.raises(TypeError, match="texts: expected a sequence of str"):
        plan_texts("a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="translations: expected one per segment"):
        plan_texts(["Go. Now."]).join(["x"])


def test_a_text_file_round_trips_with_its_byte_order_mark_and_line_ends():
    data = "\ufeffI am home. He is calm.\r\n\r\n  Go.\r\n".encode()
    doc = read_document(data, "txt", source="en", target="fr")
    assert doc.render(list(doc.segments)) == data
    assert doc.render(_shout(doc.segments)) == data.decode("utf-8").upper().encode()
    with pytest.raises(SettingError, match=r"^file: expected UTF-8 text"):
        read_document(b"\xff\xfe", "txt")
