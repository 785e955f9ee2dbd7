"""SQuAD 2.0 dev and HotpotQA dev (distractor) read as RULER's qa_1 and qa_2 read them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from restkv.eval.benchmarks.contract.reads import note
from restkv.eval.benchmarks.ruler.plan import RulerData
from restkv.eval.benchmarks.shared.records import DataFileError, Field, check_document
from restkv.eval.models.hub import hub_reachable
from restkv.eval.models.paths import project_root

DEFAULT_SQUAD_PATH = Path("data/ruler/squad.json")
DEFAULT_HOTPOTQA_PATH = Path("data/ruler/hotpotqa.json")
_HOW_TO_GET_QA = "run `python scripts/download_data.py ruler_qa`"


@dataclass(frozen=True)
class Question:
    """One answerable question: its answers, its gold documents and same-article documents."""

    query: str
    answers: list[str]
    gold: list[int]
    related: list[int]


@dataclass(frozen=True)
class QAData:
    """Questions and the document pool they draw distractors from."""

    questions: list[Question]
    docs: list[str]


def _squad_from_articles(articles: list[dict[str, Any]]) -> QAData:
    docs = sorted({p["context"] for a in articles for p in a["paragraphs"]})
    index = {d: i for i, d in enumerate(docs)}
    questions = []
    for article in articles:
        article_docs = [index[p["context"]] for p in article["paragraphs"]]
        for paragraph in article["paragraphs"]:
            doc = index[paragraph["context"]]
            for qa in paragraph["qas"]:
                if qa.get("is_impossible", False):
                    continue
                questions.append(
                    Question(
                        query=qa["question"],
                        answers=[a["text"] for a in qa["answers"]],
                        gold=[doc],
                        related=[d for d in article_docs if d != doc],
                    )
                )
    return QAData(questions, docs)


def _hotpot_from_records(records: list[dict[str, Any]]) -> QAData:
    def doc_text(title: str, sentences: list[str]) -> str:
        return f"{title}\n{''.join(sentences)}"

    docs = sorted({doc_text(t, s) for r in records for t, s in r["context"]})
    index = {d: i for i, d in enumerate(docs)}
    questions = [
        Question(
            query=r["question"],
            answers=[r["answer"]],
            gold=[index[doc_text(t, s)] for t, s in r["context"]],
            related=[],
        )
        for r in records
    ]
    return QAData(questions, docs)


def _hub_squad() -> QAData:
    import datasets

    rows = datasets.load_dataset("rajpurkar/squad_v2", split="validation")
    articles: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        paragraphs = articles.setdefault(row["title"], {})
        paragraph = paragraphs.setdefault(row["context"], {"context": row["context"], "qas": []})
        texts = list(row["answers"]["text"])
        paragraph["qas"].append(
            {"question": row["question"], "answers": [{"text": t} for t in texts], "is_impossible": not texts}
        )
    return _squad_from_articles([{"paragraphs": list(p.values())} for p in articles.values()])


def _hub_hotpotqa() -> QAData:
    import datasets

    rows = datasets.load_dataset("hotpotqa/hotpot_qa", "distractor", split="validation")
    records = [
        {
            "question": row["question"],
            "answer": row["answer"],
            "context": list(zip(row["context"]["title"], row["context"]["sentences"], strict=True)),
        }
        for row in rows
    ]
    return _hotpot_from_records(records)


_QA_CACHE: dict[tuple[str, str], QAData] = {}


def load_qa(dataset: str, data: RulerData | None = None) -> QAData:
    """Read SQuAD (``"squad"``) or HotpotQA (``"hotpotqa"``) as RULER does.

    Local official JSON first; then, if allowed and online, the hub; else FileNotFoundError.
    """
    data = data or RulerData()
    if dataset == "squad":
        given, default, reader, hub = data.squad, DEFAULT_SQUAD_PATH, _read_squad, _hub_squad
        official = "SQuAD 2.0 dev set (dev-v2.0.json)"
    elif dataset == "hotpotqa":
        given, default, reader, hub = data.hotpotqa, DEFAULT_HOTPOTQA_PATH, _read_hotpotqa, _hub_hotpotqa
        official = "HotpotQA dev distractor set (hotpot_dev_distractor_v1.json)"
    else:
        raise ValueError(f"unknown QA dataset {dataset!r}")
    path = Path(given) if given is not None else project_root() / default
    key = (dataset, str(path.resolve()))
    if path.is_file():
        note(path)  # on every call: the cache below must not hide the file from a run's identity
    if key in _QA_CACHE:
        return _QA_CACHE[key]
    if path.is_file():
        loaded = reader(path)
    else:
        loaded = None
        if data.hub and hub_reachable():
            try:
                loaded = hub()
            except Exception:
                loaded = None
        if loaded is None:
            raise FileNotFoundError(
                f"RULER {dataset} needs the {official} at {path}; it is missing. To obtain it, "
                f"{_HOW_TO_GET_QA} (or pass its location in RulerData)."
            )
    _QA_CACHE[key] = loaded
    return loaded


_TEXT = Field((str,), "text", nonempty=True)
_SQUAD_QUESTION = {"question": _TEXT, "answers": Field((list,), "a list of {text}", fields={"text": _TEXT})}
_SQUAD_PARAGRAPH = {"context": _TEXT, "qas": Field((list,), "a list of questions", fields=_SQUAD_QUESTION)}
SQUAD = {
    "data": Field(
        (list,),
        "a list of articles",
        nonempty=True,
        fields={"paragraphs": Field((list,), "a list of paragraphs", fields=_SQUAD_PARAGRAPH)},
    )
}
"""SQuAD 2.0's layout, as far as qa_1 reads it (checked by `restkv.eval.benchmarks.shared.records`)."""
_HOTPOT_RECORD = {"question": _TEXT, "answer": _TEXT, "context": Field((list,), "[title, sentences]s", items=(list,))}
HOTPOT = {"records": Field((list,), "a list of questions", nonempty=True, fields=_HOTPOT_RECORD)}
"""HotpotQA's layout (a list of records, checked as ``records``)."""


def _load_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as error:
            raise DataFileError(f"{path}:{error.lineno}: malformed JSON ({error.msg}, column {error.colno})") from None


def _read_squad(path: Path) -> QAData:
    document = _load_json(path)
    check_document(document, SQUAD, benchmark="RULER qa_1 (SQuAD)", where=str(path))
    return _squad_from_articles(document["data"])


def _read_hotpotqa(path: Path) -> QAData:
    records = _load_json(path)
    check_document({"records": records}, HOTPOT, benchmark="RULER qa_2 (HotpotQA)", where=str(path))
    return _hotpot_from_records(records)
