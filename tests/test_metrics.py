"""Hand-computed checks for every registered metric (restkv.eval.benchmarks.contract.metrics and
eval/benchmarks/*/metrics.py).

Every expected value is worked out in the comment next to it from the official definition
(LongBench eval.py/metrics.py, RULER constants.py, InfiniteBench compute_scores.py, the
rouge-score package for the NIAH and InfiniteBench summaries).
"""

from __future__ import annotations

import pytest

from restkv.eval.benchmarks.contract.metrics import metric_names, score
from restkv.eval.benchmarks.longbench.metrics import LONGBENCH_TASKS, longbench_postprocess

# rouge (the PyPI package LongBench uses) divides by (P + R + 1e-8): this is F for P = R = 1.
PYROUGE_PERFECT = 2.0 * (1.0 / (2.0 + 1e-8))  # 0.999999995
# ... and for P = R = 1/2: 2 * 0.25 / (1 + 1e-8).
PYROUGE_HALF = 2.0 * (0.25 / (1.0 + 1e-8))  # 0.499999995


def test_registry_has_exactly_the_agreed_names() -> None:
    assert set(metric_names()) == {
        "qa_f1",
        "qa_f1_zh",
        "rouge",
        "rouge_zh",
        "classification",
        "retrieval",
        "retrieval_zh",
        "count",
        "code_sim",
        "string_match_all",
        "string_match_part",
        "niah_rouge",
        "infbench_passkey",
        "infbench_number_string",
        "infbench_kv_retrieval",
        "infbench_longbook_sum_eng",
        "infbench_longbook_choice_eng",
        "infbench_longbook_qa_eng",
        "infbench_longbook_qa_chn",
        "infbench_longdialogue_qa_eng",
        "infbench_math_find",
        "infbench_math_calc",
        "infbench_code_run",
        "infbench_code_debug",
    }


# ----------------------------------------------------------------------------- score() errors


def test_unknown_metric_names_it_and_lists_valid_names_sorted() -> None:
    with pytest.raises(ValueError) as err:
        score("bleu", "x", ["x"])
    message = str(err.value)
    assert "'bleu'" in message
    # the full list, alphabetical: classification < code_sim < count < infbench_... < niah_rouge
    assert ", ".join(metric_names()) in message
    assert message.index("classification") < message.index("code_sim") < message.index("niah_rouge")


def test_missing_required_kwarg_is_named() -> None:
    with pytest.raises(TypeError, match="all_classes"):
        score("classification", "Location", ["Location"])
    # None (what LongBench stores for non-classification tasks) counts as missing too.
    with pytest.raises(TypeError, match="all_classes"):
        score("classification", "Location", ["Location"], all_classes=None)


def test_empty_reference_list_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one reference"):
        score("qa_f1", "x", [])


@pytest.mark.parametrize("metric", metric_names())
def test_empty_prediction_scores_zero(metric: str) -> None:
    # Non-empty, well-formed references for every metric; an empty answer must score 0 without
    # raising. Extra kwargs (all_classes) are ignored by metrics that do not use them.
    references = {
        "retrieval": ["Paragraph 3"],
        "retrieval_zh": ["段落3"],
        "count": ["3"],
        "infbench_passkey": ["12345"],
        "infbench_number_string": ["12345"],
        "infbench_math_find": ["42"],
        "infbench_math_calc": ["3", "5"],
        "infbench_code_run": ["-14"],
        "infbench_code_debug": ["repack_carchive", "B"],
        "infbench_longbook_choice_eng": ["Walking Georgie", "A"],
    }.get(metric, ["Location", "北京"])
    assert score(metric, "", references, all_classes=["Location", "Date"]) == 0.0


# ----------------------------------------------------------------------------- LongBench post-processing


def test_postprocess_keeps_first_line_for_few_shot_tasks() -> None:
    # leading "\n" dropped, then everything after the next "\n" dropped
    assert longbench_postprocess("trec", "\n\nLocation\nQuestion: where?") == "Location"
    assert longbench_postprocess("samsum", "Tom calls Ann.\nDialogue: ...") == "Tom calls Ann."
    # only "\n" is stripped first: " \nfoo" -> first line is the lone space
    assert longbench_postprocess("lsht", " \nfoo") == " "


def test_postprocess_leaves_other_tasks_alone_and_rejects_unknown() -> None:
    assert longbench_postprocess("narrativeqa", "a\nb") == "a\nb"
    assert "triviaqa" in LONGBENCH_TASKS and len(LONGBENCH_TASKS) == 21
    with pytest.raises(ValueError, match="unknown LongBench task 'trek'"):
        longbench_postprocess("trek", "x")


# ----------------------------------------------------------------------------- qa_f1


@pytest.mark.parametrize(
    ("prediction", "references", "expected"),
    [
        # lower-case + drop ',' '!' + drop "The": "cat sat" vs "cat sat"
        ("The Cat, sat!", ["cat sat"], 1.0),
        # "big red dog" (3) vs "red dog" (2): overlap 2, P=2/3, R=1 -> 2*(2/3)/(5/3) = 0.8
        ("a big red dog", ["the red dog"], 0.8),
        # whitespace squeezed, case folded
        ("  NEW   york ", ["New York"], 1.0),
        # punctuation removed inside words: "wellknown" vs "well", "known" -> no overlap
        ("well-known", ["well known"], 0.0),
        # articles only as whole words: "theory" survives, "the" goes
        ("the theory", ["theory"], 1.0),
        # punctuation goes before articles: "the-end" -> "theend" (no article left) vs "end"
        ("the-end", ["end"], 0.0),
        # multiset overlap: "dog dog dog" vs "dog": overlap 1, P=1/3, R=1 -> (2/3)/(4/3) = 0.5
        ("dog dog dog", ["dog"], 0.5),
        # two references: "red" -> P=1/2,R=1 -> 2/3; "red dog barks" -> P=1,R=2/3 -> 0.8; max 0.8
        ("red dog", ["red", "red dog barks"], 0.8),
        # a prediction of only articles/punctuation normalises to nothing
        ("The, a an.", ["cat"], 0.0),
    ],
)
def test_qa_f1(prediction: str, references: list[str], expected: float) -> None:
    assert score("qa_f1", prediction, references) == pytest.approx(expected, abs=1e-12)


# ----------------------------------------------------------------------------- qa_f1_zh


@pytest.mark.parametrize(
    ("prediction", "references", "expected"),
    [
        # "。" is its own jieba token and normalises to "" (dropped): same tokens as the reference
        ("北京大学。", ["北京大学"], 1.0),
        # jieba: 猫 / ， / 狗 -> [猫, 狗] vs [狗]: P=1/2, R=1 -> 2/3
        ("猫，狗", ["狗"], 2 / 3),
        # Latin letters are lower-cased: [ai, 猫] vs [ai] -> 2/3
        ("AI，猫", ["ai"], 2 / 3),
        # disjoint characters
        ("猫", ["狗"], 0.0),
        # max over references: "狗" -> 2/3, "猫，狗" -> 1
        ("猫，狗", ["狗", "猫，狗"], 1.0),
    ],
)
def test_qa_f1_zh(prediction: str, references: list[str], expected: float) -> None:
    assert score("qa_f1_zh", prediction, references) == pytest.approx(expected, abs=1e-12)


# ----------------------------------------------------------------------------- rouge (LongBench)


@pytest.mark.parametrize(
    ("prediction", "references", "expected"),
    [
        # identical: P = R = 1 but F = 2/(2 + 1e-8)
        ("the cat sat on the mat", ["the cat sat on the mat"], PYROUGE_PERFECT),
        # case-sensitive: {The, cat} vs {the, cat}, LCS = [cat] -> P = R = 1/2
        ("The cat", ["the cat"], PYROUGE_HALF),
        # punctuation stays on the word: "cat," != "cat" -> LCS [dog] -> P = R = 1/2
        ("cat, dog", ["cat dog"], PYROUGE_HALF),
        # split on '.': LCS(cat dog, dog cat) = {dog}, LCS(cat dog, cat dog) = {cat, dog}; union 2
        # distinct words, prediction has 2 distinct words (repeats are free) -> P = R = 1
        ("dog cat. cat dog", ["cat dog"], PYROUGE_PERFECT),
        # only periods: no sentence at all -> the package raises, LongBench returns 0
        ("...", ["cat dog"], 0.0),
        # max over references
        ("cat dog", ["fish", "cat dog"], PYROUGE_PERFECT),
    ],
)
def test_rouge(prediction: str, references: list[str], expected: float) -> None:
    assert score("rouge", prediction, references) == pytest.approx(expected, abs=1e-12)


def test_rouge_reproduces_the_recursion_limit_failure() -> None:
    # "b a a ... a" (n a's) vs "b c": distinct words {b, a} / {b, c}, LCS {b}: P = R = 1/2.
    # rouge's recursive backtrack walks back over the n a's, then one step up, then the match,
    # then the base case: n + 3 calls. Under LongBench's eval.py on CPython 3.8-3.10 the budget
    # is 990 calls, so n = 987 still scores and n = 988 hits RecursionError (-> 0).
    assert score("rouge", "b " + " ".join(["a"] * 987), ["b c"]) == pytest.approx(PYROUGE_HALF, abs=1e-12)
    assert score("rouge", "b " + " ".join(["a"] * 988), ["b c"]) == 0.0


# ----------------------------------------------------------------------------- rouge_zh


@pytest.mark.parametrize(
    ("prediction", "references", "expected"),
    [
        # identical jieba words
        ("我爱北京", ["我爱北京"], PYROUGE_PERFECT),
        # words 猫 / ， / 狗 (punctuation kept, unlike qa_f1_zh) vs 狗: R = 1, P = 1/3
        # F = 2 * (1/3) / (4/3 + 1e-8) ~= 0.5
        ("猫，狗", ["狗"], 2 * (1 / 3) / (4 / 3 + 1e-8)),
        ("猫", ["狗"], 0.0),
    ],
)
def test_rouge_zh(prediction: str, references: list[str], expected: float) -> None:
    assert score("rouge_zh", prediction, references) == pytest.approx(expected, abs=1e-12)


def test_rouge_zh_recursion_budget_is_one_call_smaller() -> None:
    # Same shape as the English test; the Chinese wrapper adds one stack frame, so 986 a's
    # (989 calls) still score and 987 a's (990 calls) fail.
    assert score("rouge_zh", "b " + " ".join(["a"] * 986), ["b c"]) == pytest.approx(PYROUGE_HALF, abs=1e-12)
    assert score("rouge_zh", "b " + " ".join(["a"] * 987), ["b c"]) == 0.0


# ----------------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    ("prediction", "reference", "classes", "expected"),
    [
        # one class named, the right one
        ("Location", "Location", ["Location", "Date", "Description"], 1.0),
        # two classes named, one right -> 1/2
        ("Location or Date", "Location", ["Location", "Date", "Description"], 0.5),
        # wrong class
        ("Date", "Location", ["Location", "Date", "Description"], 0.0),
        # matching is case-sensitive: nothing found
        ("location", "Location", ["Location", "Date"], 0.0),
        # "Cit" is a strict substring of the reference "City" and is discarded -> [City] -> 1
        ("City", "City", ["Cit", "City", "Country"], 1.0),
        # official quirk: matches [Cit, Ci, City]; removing "Cit" while iterating skips "Ci",
        # which stays -> [Ci, City] -> 1/2 (a clean implementation would give 1)
        ("City", "City", ["Cit", "Ci", "City"], 0.5),
    ],
)
def test_classification(prediction: str, reference: str, classes: list[str], expected: float) -> None:
    assert score("classification", prediction, [reference], all_classes=classes) == expected


# ----------------------------------------------------------------------------- retrieval / count


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("Paragraph 3", 1.0),  # numbers [3]
        ("Paragraph 3 (of 30)", 0.5),  # numbers [3, 30], one right
        ("Paragraph 13", 0.0),  # "13" != "3": whole numbers, not substrings
        ("The first one", 0.0),  # no number at all
    ],
)
def test_retrieval(prediction: str, expected: float) -> None:
    assert score("retrieval", prediction, ["Paragraph 3"]) == expected


def test_retrieval_zh_and_bad_reference() -> None:
    # numbers [5, 15], gold 5 -> 1/2
    assert score("retrieval_zh", "答案是段落5，不是段落15", ["段落5"]) == 0.5
    with pytest.raises(ValueError, match="does not name a paragraph"):
        score("retrieval", "Paragraph 3", ["3"])


@pytest.mark.parametrize(
    ("prediction", "references", "expected"),
    [
        ("There are 7 unique paragraphs", ["7"], 1.0),
        ("7 or 8", ["7"], 0.5),
        ("07", ["7"], 0.0),  # compared as strings
        # ref "8": 1 of 3 numbers; ref "7": 2 of 3 -> max 2/3
        ("7 7 8", ["8", "7"], 2 / 3),
    ],
)
def test_count(prediction: str, references: list[str], expected: float) -> None:
    assert score("count", prediction, references) == pytest.approx(expected, abs=1e-12)


# ----------------------------------------------------------------------------- code_sim


@pytest.mark.parametrize(
    ("prediction", "references", "expected"),
    [
        # only the first line is compared
        ("x = foo(a, b)\nreturn x", ["x = foo(a, b)"], 1.0),
        # leading newlines, the ``` fence and the '#' comment line are skipped
        ("\n```python\n# set x\nx = 1\n```", ["x = 1"], 1.0),
        # difflib: longest block is "b" (a[0] with b[2]) and nothing fits around it -> M = 1,
        # ratio 2*1/6 = 33.3 -> 33. (A Levenshtein/Indel ratio would give LCS "ab": 67.)
        ("bab", ["acb"], 0.33),
        # one common char in 8+8: 100 * 2/16 = 12.5, rounded half-to-even -> 12
        ("a1234567", ["aBCDEFGH"], 0.12),
        # every line is a comment -> "" vs "" counts as equal in fuzzywuzzy -> 100
        ("# only a comment", [""], 1.0),
        # max over references
        ("bab", ["xyz", "bab"], 1.0),
    ],
)
def test_code_sim(prediction: str, references: list[str], expected: float) -> None:
    assert score("code_sim", prediction, references) == expected


# ----------------------------------------------------------------------------- RULER


def test_string_match_all_and_part() -> None:
    refs = ["apple", "Banana", "kiwi"]
    # "apple" and "banana" found case-insensitively, "kiwi" not
    assert score("string_match_all", "I like APPLE and banana", refs) == pytest.approx(2 / 3, abs=1e-12)
    assert score("string_match_part", "I like APPLE and banana", refs) == 1.0
    assert score("string_match_part", "I like pears", refs) == 0.0
    # substring, not word, matching
    assert score("string_match_all", "3125", ["12"]) == 1.0
    # RULER turns control characters into newlines first, so a tab in the answer breaks the match
    assert score("string_match_all", "a\tb", ["a\tb"]) == 0.0


# ----------------------------------------------------------------------------- NIAH


def test_niah_rouge() -> None:
    needle = "The best thing to do in San Francisco is eat a sandwich."
    # needle: 12 tokens, answer: eat / a / sandwich, all in the needle: P = 1, R = 3/12
    # F = 2 * 0.25 / 1.25 = 0.4
    assert score("niah_rouge", "Eat a sandwich.", [needle]) == pytest.approx(0.4, abs=1e-12)
    # Porter stemming: eating -> eat, sandwiches -> sandwich
    assert score("niah_rouge", "eat sandwich", ["eating sandwiches"]) == pytest.approx(1.0, abs=1e-12)
    # best of several needles
    assert score("niah_rouge", "eat sandwich", [needle, "eat sandwich"]) == pytest.approx(1.0, abs=1e-12)


# ----------------------------------------------------------------------------- InfiniteBench


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("The pass key is 71432.", 1.0),
        ("In 2024 the key is 71432", 0.0),  # the first digit run "2024" is the answer
        ("The key is 7143 2", 0.0),  # first run "7143"
    ],
)
def test_infbench_passkey(prediction: str, expected: float) -> None:
    assert score("infbench_passkey", prediction, ["71432"]) == expected


def test_infbench_number_string() -> None:
    assert score("infbench_number_string", "The sequence is 3000077442.", ["3000077442"]) == 1.0
    assert score("infbench_number_string", "sequence: 300007744", ["3000077442"]) == 0.0


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ('The value is: "c14cb8ba-002b".', 1.0),  # quotes, colon and period become spaces
        ("value c14cb8ba-002b-extra", 0.0),  # '-' is not a separator: a different word
        ("(c14cb8ba-002b)", 0.0),  # parentheses are not separators either
    ],
)
def test_infbench_kv_retrieval(prediction: str, expected: float) -> None:
    assert score("infbench_kv_retrieval", prediction, ["c14cb8ba-002b"]) == expected


def test_infbench_longbook_sum_eng() -> None:
    # rougeLsum: reference sentences "the cat sat" / "the dog ran" (m = 6), prediction "the cat
    # sat" (n = 3); first sentence gives 3 hits, the second's LCS "the" is already used up.
    # R = 3/6, P = 1 -> F = 2 * 0.5 / 1.5 = 2/3
    reference = "The cat sat.\nThe dog ran."
    assert score("infbench_longbook_sum_eng", "The cat sat.", [reference]) == pytest.approx(2 / 3, abs=1e-12)
    # sentences are the lines: each reference line finds its twin among the prediction lines,
    # so swapping the two lines still scores 1 (plain rougeL over the flat text would give 1/2)
    swapped = "The dog ran.\nThe cat sat."
    assert score("infbench_longbook_sum_eng", swapped, [reference]) == pytest.approx(1.0, abs=1e-12)
    # lower-cased, punctuation-free tokens; best of two references
    assert score("infbench_longbook_sum_eng", "THE CAT SAT!", [reference, "the cat sat"]) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("A. Walking Georgie", 1.0),  # starts with the right letter
        ("B. Hall Farm", 0.0),  # starts with a wrong letter
        ("Based on the text, the answer is A", 0.0),  # quirk: the leading "B" decides
        ("Walking Georgie", 1.0),  # equals the answer text
        ("The answer is: A", 1.0),  # after "answer is:" + one char: "A"
        ("I think the answer is Walking Georgie.", 1.0),  # after "answer is" + one char
        ("I pick option A", 1.0),  # fallback: first word that is a letter
        ("I pick option C", 0.0),
        ("My choice: AB", 0.0),  # quirk: "AB" is a substring of "ABCD", counts as the letter
    ],
)
def test_infbench_longbook_choice_eng(prediction: str, expected: float) -> None:
    assert score("infbench_longbook_choice_eng", prediction, ["Walking Georgie", "A"]) == expected


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("B. repack_carchive", 1.0),  # "<letter>." at the start
        ("B", 0.0),  # quirk: a bare letter matches no rule
        ("The answer is: B", 1.0),  # text after "answer is:" starts with the letter
        ("The answer is B", 0.0),  # quirk: no colon, no prefix found
        ("The buggy function is: repack_carchive", 1.0),  # after "is:" starts with the name
        ("The answer is: Because of C", 1.0),  # quirk: plain prefix test, "Because" starts with B
        ("Option B is wrong, answer: C", 0.0),  # "answer:" decides: C
        # the prefix list order wins over the position: "is:" (2nd in the list) is found before
        # "answer:" (3rd) is tried, so the answer read is "broken"
        ("Final answer: B because it is: broken", 0.0),
    ],
)
def test_infbench_code_debug(prediction: str, expected: float) -> None:
    assert score("infbench_code_debug", prediction, ["repack_carchive", "B"]) == expected


def test_infbench_code_debug_needs_name_and_letter() -> None:
    with pytest.raises(ValueError, match="function_name, option_letter"):
        score("infbench_code_debug", "B.", ["B"])


def test_infbench_longbook_qa_eng() -> None:
    # "stockings" vs "stockings" after dropping "The" and "."
    assert score("infbench_longbook_qa_eng", "The stockings.", ["stockings"]) == 1.0
    # [killed, in, world, war, 1] vs [fighting, in, world, war, 1]: overlap 4 -> P = R = 0.8
    assert score("infbench_longbook_qa_eng", "killed in world war 1", ["fighting in world war 1"]) == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("prediction", "references", "expected"),
    [
        # "。" removed -> [两, 个] equals the second reference
        ("两个。", ["2", "两个", "二"], 1.0),
        # characters [有, 两, 个, 人] vs [两, 个]: P = 1/2, R = 1 -> 2/3
        ("有两个人", ["两个"], 2 / 3),
        # whitespace deleted, letters lower-cased: [a, i] vs [a, i]
        ("A I", ["ai"], 1.0),
    ],
)
def test_infbench_longbook_qa_chn(prediction: str, references: list[str], expected: float) -> None:
    assert score("infbench_longbook_qa_chn", prediction, references) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("prediction", "references", "expected"),
    [
        ("Ace Rothstein", ["ACE", "ACE ROTHSTEIN"], 1.0),  # words upper-cased: ACE, ROTHSTEIN
        ("It's Ace.", ["ACE", "ACE ROTHSTEIN"], 1.0),  # "'" and "." are separators: IT, S, ACE
        ("Rothstein", ["ACE", "ACE ROTHSTEIN"], 0.0),  # only the first reference is checked
        ("Remo", ["Remo", "REMO"], 0.0),  # quirk: the reference is not upper-cased
    ],
)
def test_infbench_longdialogue_qa_eng(prediction: str, references: list[str], expected: float) -> None:
    assert score("infbench_longdialogue_qa_eng", prediction, references) == expected


@pytest.mark.parametrize(
    ("prediction", "reference", "expected"),
    [
        ("The answer is 42.", "42", 1.0),
        ("-42", "42", 1.0),  # the sign is not part of the number
        ("3.5 then 42", "42", 0.0),  # first number is the decimal 3.5 (official code crashes)
        ("42.0", "42", 0.0),  # int answer, decimal found: int("42.0") crashes officially; counted wrong
        ("The median is 49.5", "49.5", 1.0),  # float answer
        ("49", "49.5", 0.0),
        ("50", "50.0", 1.0),  # float answer compared as 50.0 == 50.0
        ("no idea", "42", 0.0),
    ],
)
def test_infbench_math_find(prediction: str, reference: str, expected: float) -> None:
    assert score("infbench_math_find", prediction, [reference]) == expected


def test_infbench_math_find_rejects_non_numeric_reference() -> None:
    with pytest.raises(ValueError, match="numeric reference"):
        score("infbench_math_find", "42", ["forty-two"])


@pytest.mark.parametrize(
    ("prediction", "references", "expected"),
    [
        ("[3, 7, 12]", ["3", "7", "12"], 1.0),
        ("3, 7, 13", ["3", "7", "12"], 2 / 3),  # third value wrong
        ("4, 7, 12", ["3", "7", "12"], 0.0),  # first value wrong: nothing counts after it
        ("3, 7", ["3", "7", "12"], 2 / 3),  # too short
        ("3 7 12 99", ["3", "7", "12"], 1.0),  # extra numbers ignored
        ("3, -1, 5", ["3", "-1", "5"], 1 / 3),  # "-1" reads as 1 != -1
    ],
)
def test_infbench_math_calc(prediction: str, references: list[str], expected: float) -> None:
    assert score("infbench_math_calc", prediction, references) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("prediction", "reference", "expected"),
    [
        ("The return value is -14.", "-14", 1.0),  # last word "-14" after '.' becomes a space
        ("-14, I think", "-14", 0.0),  # last word "think"
        ("`14`", "-14", 0.0),  # 14 != -14
        ("func(2) = 4", "4", 1.0),
    ],
)
def test_infbench_code_run(prediction: str, reference: str, expected: float) -> None:
    assert score("infbench_code_run", prediction, [reference]) == expected
