"""Where ``scripts/download_data.py`` gets RULER's data: ``ruler_qa`` and ``ruler_words``.

* ``ruler_qa``: SQuAD 2.0 dev (``dev-v2.0.json``) and HotpotQA dev distractor (``hotpot_dev_distractor_v1.json``)
  from their official sites (HotpotQA falls back to the hub copy RULER's own download script uses), as
  ``data/ruler/squad.json`` and ``data/ruler/hotpotqa.json``.
* ``ruler_words``: RULER's ``english_words.json`` (the official pool for common-words prompts longer than the
  ``wonderwords`` lists), as ``data/ruler/english_words.json``.
"""

from __future__ import annotations

from pathlib import Path

from restkv.eval.benchmarks.shared.fetching import Dataset, Network, Outcome, Wanted, check_json, get_files, rel
from restkv.eval.benchmarks.shared.fetching import url_source as url

SQUAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json"
# RULER's large word pool for long common-words prompts (a Git LFS object, hence the media host)
RULER_WORDS_URL = (
    "https://media.githubusercontent.com/media/NVIDIA/RULER/main/scripts/data/synthetic/json/english_words.json"
)
HOTPOTQA_URLS = (
    "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
    "https://huggingface.co/datasets/namlh2004/hotpotqa/resolve/7e54db4656209750ff487f6fdf8e39a66dba136b/"
    "hotpot_dev_distractor_v1.json",
)


def _is_squad(data: object) -> bool:
    return isinstance(data, dict) and isinstance(data.get("data"), list)


def _is_hotpotqa(data: object) -> bool:
    return isinstance(data, list) and bool(data) and "question" in data[0]


def _is_word_pool(data: object) -> bool:
    return isinstance(data, dict) and bool(data) and all(isinstance(w, str) for w in data.values())


def get_ruler_qa(root: Path, force: bool, net: Network) -> Outcome:
    folder = root / "ruler"
    wanted = [
        Wanted(
            "squad.json",
            [url(SQUAD_URL)],
            check_json(_is_squad, "SQuAD JSON"),
            f"download {SQUAD_URL} as {rel(folder / 'squad.json')}",
        ),
        Wanted(
            "hotpotqa.json",
            [url(u) for u in HOTPOTQA_URLS],
            check_json(_is_hotpotqa, "HotpotQA JSON"),
            f"download {HOTPOTQA_URLS[0]} as {rel(folder / 'hotpotqa.json')}",
        ),
    ]
    return get_files("ruler_qa", folder, wanted, force, net)


def get_ruler_words(root: Path, force: bool, net: Network) -> Outcome:
    folder = root / "ruler"
    check = check_json(_is_word_pool, "RULER english_words.json")
    manual = f"download {RULER_WORDS_URL} as {rel(folder / 'english_words.json')}"
    wanted = [Wanted("english_words.json", [url(RULER_WORDS_URL)], check, manual)]
    return get_files("ruler_words", folder, wanted, force, net)


SOURCES = (Dataset("ruler_qa", get_ruler_qa), Dataset("ruler_words", get_ruler_words))
