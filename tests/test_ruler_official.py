"""The RULER generator's defaults follow the official generator: wonderwords, the step-down fit, punkt."""

from __future__ import annotations

import re

import pytest
from _tokenizer import tokenizer_fixture  # noqa: F401

from restkv.eval.benchmarks import ruler
from restkv.eval.benchmarks.ruler import Draft, RulerBenchmark, generate, haystacks, step_down, vocabulary

KEY = re.compile(r"One of the special magic numbers for (.+?) is: \d+\.")


def _split(key: str, words) -> tuple[str, str] | None:
    """The (adjective, noun) of ``words`` that make ``key`` (words may hold hyphens themselves)."""
    for at in [i for i, c in enumerate(key) if c == "-"]:
        if key[:at] in words.adjectives and key[at + 1 :] in words.nouns:
            return key[:at], key[at + 1 :]
    return None


def test_keys_come_from_wonderwords_by_default(tokenizer) -> None:
    official, bundled = vocabulary("wonderwords"), vocabulary("bundled")
    assert len(official.adjectives) > 900 and len(official.nouns) > 6000  # the wonderwords lists, not ours
    keys = [k for s in generate("niah_multikey_2", tokenizer, 2048, 3, seed=0) for k in KEY.findall(s.context)]
    assert len(keys) > 100
    assert all(_split(k, official) for k in keys)
    assert sum(_split(k, bundled) is None for k in keys) > len(keys) // 2  # most could not come from ours
    samples = generate("niah_multikey_2", tokenizer, 2048, 3, seed=0, words="bundled")
    assert all(_split(k, bundled) for s in samples for k in KEY.findall(s.context))


def test_cwe_words_come_from_the_wonderwords_pool(tokenizer) -> None:
    pool, bundled = set(vocabulary("wonderwords").common), set(vocabulary("bundled").common)
    (sample,) = generate("cwe", tokenizer, 2048, 1, seed=0)
    listing = sample.context.rsplit("Memorize the ones that appear most often.\n", 1)[1]
    words = set(re.findall(r"\d+\. (.+?)(?= \d+\. |$)", listing))
    assert len(words) > 50 and words <= pool
    assert len(words - bundled) > len(words) // 2


def test_step_down_drops_whole_steps_and_redraws() -> None:
    """A sample whose content is longer than the probe's overflows at the searched size and drops a step."""
    calls: list[tuple[int, int]] = []

    def builds(attempt: int):
        def build(n: int) -> Draft:
            calls.append((attempt, n))
            return Draft("x" * (10 * n + (400 if attempt == 0 else 0)), "", "", [])

        return build

    fit = step_down(builds, len, 1000, start=95, step=25, n_min=0)
    assert calls == [(0, 95), (1, 70)]  # 950+400 overflows; the next attempt re-draws 25 units shorter
    assert fit.n == 70 and fit.tokens == 700
    # at the smallest size it stays and re-draws; where nothing ever fits it says so
    with pytest.raises(ruler.TooShort):
        step_down(lambda attempt: lambda n: Draft("x" * 5000, "", "", []), len, 1000, 30, 25, 0, retries=3)


def test_official_fit_follows_the_step_rule(tokenizer) -> None:
    """Essay haystacks: every sample starts at the searched size and drops 500 words per overflow."""
    samples = generate("niah_single_2", tokenizer, 2048, 20, seed=0)
    units = [s.meta["haystack_units"] for s in samples]
    start = max(units)
    assert all((start - n) % 500 == 0 for n in units)
    assert min(units) < start  # some samples overflowed and dropped a step: far below the budget
    short = [s for s in samples if s.meta["haystack_units"] < start]
    assert all(s.meta["prompt_tokens"] < 0.6 * s.meta["max_prompt_tokens"] for s in short)
    exact = generate("niah_single_2", tokenizer, 2048, 20, seed=0, fit="exact")
    assert all(s.meta["prompt_tokens"] >= s.meta["max_prompt_tokens"] - 8 for s in exact)


class FakePunkt:
    """Sentences end at every word that ends with "!" (nothing a rule-based splitter would do)."""

    def span_tokenize(self, text: str):
        start = 0
        for match in re.finditer(r"! ", text):
            yield start, match.start() + 1
            start = match.end()
        yield start, len(text)


def test_punkt_when_installed_rules_otherwise(monkeypatch) -> None:
    monkeypatch.setattr(haystacks, "_punkt", lambda: None)
    assert haystacks.resolve_splitter("auto") == "rules"
    with pytest.raises(RuntimeError, match="punkt_tab"):
        haystacks.resolve_splitter("punkt")
    with pytest.raises(ValueError, match="allowed: auto, punkt, rules"):
        haystacks.resolve_splitter("spacy")
    monkeypatch.setattr(haystacks, "_punkt", lambda: FakePunkt())
    assert haystacks.resolve_splitter("auto") == "punkt"
    text = "One two! Three. Four five! Six."
    assert ruler.parse_essay(text, "punkt").ends == (1, 4, 5)
    assert ruler.parse_essay(text, "rules").ends == (1, 2, 4, 5)


def test_metrics_say_which_generator_ran(tokenizer, monkeypatch) -> None:
    monkeypatch.setattr(haystacks, "_punkt", lambda: None)
    bench = RulerBenchmark(tasks=["niah_single_1"], lengths=[1024], samples=1)
    bench.load_samples(tokenizer)
    generated = bench.report([], None)["source"]["generated"]  # type: ignore[arg-type]
    assert generated.pop("wonderwords").startswith("3.")  # the lists' release is recorded
    assert generated == {"fit": "official", "words": "wonderwords", "sentences": "rules"}


def test_frequent_words_start_where_the_official_ramp_stops(tokenizer) -> None:
    """fwe's size: from budget // 6 up in steps of budget // 32 while under the budget, then one step back."""
    budget = 2048 - 50
    step = budget // 32
    build = ruler.fwe_builder(ruler.TASK_CONFIGS["fwe"], "ruler/fwe/0/search", budget)
    n = budget // 6
    while len(tokenizer(build(n).prompt, add_special_tokens=False)["input_ids"]) < budget:
        n += step
    start = n - step
    units = [s.meta["haystack_units"] for s in generate("fwe", tokenizer, 2048, 10, seed=0)]
    assert all(u <= start and (start - u) % step == 0 for u in units)
    assert start in units


def test_official_join_keeps_empty_pieces() -> None:
    """A needle at depth 0 follows a space, as the official generator joins its pieces."""

    class AtDepthZero:
        def sample(self, population, k):
            return [0] * k

    essay = ruler.parse_essay("First one. Second one. Third one.")
    official, _ = ruler.essay_with_needles(essay, 6, ["NEEDLE."], AtDepthZero(), official=True)  # type: ignore[arg-type]
    compact, _ = ruler.essay_with_needles(essay, 6, ["NEEDLE."], AtDepthZero())  # type: ignore[arg-type]
    assert official == " NEEDLE. First one. Second one. Third one."
    assert compact == "NEEDLE. First one. Second one. Third one."


def test_too_short_says_whether_exact_filling_would_fit(tokenizer) -> None:
    with pytest.raises(ValueError, match=r"never drops below 500 haystack units: bench\.fit=exact fits"):
        generate("niah_single_2", tokenizer, 600, 1, seed=0)
    with pytest.raises(ValueError, match=r"bench\.fit=exact does not fit either"):
        generate("cwe", tokenizer, 512, 1, seed=0)


def test_only_frequent_words_keep_their_content_when_stepping_down(tokenizer) -> None:
    """The official generator re-draws an overflowing sample, except fwe, which keeps its vocabulary."""
    job = ruler.Job(
        task="fwe",
        context_length=2048,
        budget=1998,
        seed="s",
        count=ruler.TokenCounter(tokenizer),
        data=ruler.RulerData(),
        words=vocabulary("wonderwords"),
        sentences="rules",
        fit="official",
    )
    assert ruler.TASK_CONFIGS["fwe"].plan(job).redraw is False
    assert all(ruler.TASK_CONFIGS[t].plan(job).redraw for t in ("niah_single_1", "vt", "cwe"))
