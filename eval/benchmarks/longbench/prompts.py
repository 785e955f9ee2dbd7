"""LongBench's tasks as the official repository defines them: names, categories, prompt templates, answer lengths
and metrics.

The templates and lengths are those of ``LongBench/config/dataset2prompt.json`` and ``dataset2maxlen.json``
(THUDM/LongBench), character for character, typos included; the metric per task is the one of the official
``eval.py``. `split_prompt` cuts a prompt after its context for the two protocols; `expand_tasks` resolves the
``en``/``zh``/``all`` aliases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TASKS_EN: tuple[str, ...] = (
    "narrativeqa",
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "musique",
    "gov_report",
    "qmsum",
    "multi_news",
    "trec",
    "triviaqa",
    "samsum",
    "passage_count",
    "passage_retrieval_en",
    "lcc",
    "repobench-p",
)
"""The 16 English (and code) tasks the paper averages, in the authors' order."""

TASKS_ZH: tuple[str, ...] = ("multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh")
"""The Chinese tasks (optional)."""

TASKS: tuple[str, ...] = TASKS_EN + TASKS_ZH

TASKS_E: tuple[str, ...] = (
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "gov_report",
    "multi_news",
    "trec",
    "triviaqa",
    "samsum",
    "passage_count",
    "passage_retrieval_en",
    "lcc",
    "repobench-p",
)
"""LongBench-E's 13 tasks (official ``pred.py --e``)."""

NO_CHAT_TASKS: frozenset[str] = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})
"""Tasks official LongBench runs without a chat template, even on chat models."""

CATEGORIES: dict[str, tuple[str, ...]] = {
    "single_doc_qa": ("narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh"),
    "multi_doc_qa": ("hotpotqa", "2wikimqa", "musique", "dureader"),
    "summarization": ("gov_report", "qmsum", "multi_news", "vcsum"),
    "few_shot": ("trec", "triviaqa", "samsum", "lsht"),
    "synthetic": ("passage_count", "passage_retrieval_en", "passage_retrieval_zh"),
    "code": ("lcc", "repobench-p"),
}
"""LongBench's task categories (README leaderboard columns)."""

_TASK_ALIASES = {"en": TASKS_EN, "zh": TASKS_ZH, "all": TASKS}


@dataclass(frozen=True)
class TaskSpec:
    """One LongBench task: official prompt template, generation length and metric."""

    prompt: str
    max_new_tokens: int
    metric: str


_MULTI_DOC_QA_PROMPT = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nThe following are given passages.\n{context}\n\n"
    "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nQuestion: {input}\nAnswer:"
)
"""The one prompt official LongBench gives its three multi-document QA tasks (hotpotqa, 2wikimqa, musique)."""

# Official LongBench/config/dataset2prompt.json and dataset2maxlen.json; metrics from eval.py.
TASK_SPECS: dict[str, TaskSpec] = {
    "narrativeqa": TaskSpec(
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
        "asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\n"
        "Story: {context}\n\n"
        "Now, answer the question based on the story asconcisely as you can, using a single phrase if possible. "
        "Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",
        128,
        "qa_f1",
    ),
    "qasper": TaskSpec(
        "You are given a scientific article and a question. Answer the question as concisely as you can, using a "
        "single phrase or sentence if possible. If the question cannot be answered based on the information in the "
        'article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or '
        '"unanswerable". Do not provide any explanation.\n\nArticle: {context}\n\n '
        "Answer the question based on the above article as concisely as you can, using a single phrase or sentence "
        "if possible. If the question cannot be answered based on the information in the article, write "
        '"unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not '
        "provide any explanation.\n\nQuestion: {input}\n\nAnswer:",
        128,
        "qa_f1",
    ),
    "multifieldqa_en": TaskSpec(
        "Read the following text and answer briefly.\n\n{context}\n\n"
        "Now, answer the following question based on the above text, only give me the answer and do not output "
        "any other words.\n\nQuestion: {input}\nAnswer:",
        64,
        "qa_f1",
    ),
    "multifieldqa_zh": TaskSpec(
        "阅读以下文字并用中文简短回答：\n\n{context}\n\n"
        "现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。\n\n问题：{input}\n回答：",
        64,
        "qa_f1_zh",
    ),
    "hotpotqa": TaskSpec(_MULTI_DOC_QA_PROMPT, 32, "qa_f1"),
    "2wikimqa": TaskSpec(_MULTI_DOC_QA_PROMPT, 32, "qa_f1"),
    "musique": TaskSpec(_MULTI_DOC_QA_PROMPT, 32, "qa_f1"),
    "dureader": TaskSpec(
        "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答：",
        128,
        "rouge_zh",
    ),
    "gov_report": TaskSpec(
        "You are given a report by a government agency. Write a one-page summary of the report.\n\n"
        "Report:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:",
        512,
        "rouge",
    ),
    "qmsum": TaskSpec(
        "You are given a meeting transcript and a query containing a question or instruction. Answer the query in "
        "one or more sentences.\n\nTranscript:\n{context}\n\n"
        "Now, answer the query based on the above meeting transcript in one or more sentences.\n\n"
        "Query: {input}\nAnswer:",
        512,
        "rouge",
    ),
    "multi_news": TaskSpec(
        "You are given several news passages. Write a one-page summary of all news. \n\n"
        "News:\n{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:",
        512,
        "rouge",
    ),
    "vcsum": TaskSpec(
        "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
        512,
        "rouge_zh",
    ),
    "trec": TaskSpec(
        "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",
        64,
        "classification",
    ),
    "triviaqa": TaskSpec(
        "Answer the question based on the given passage. Only give me the answer and do not output any other "
        "words. The following are some examples.\n\n{context}\n\n{input}",
        32,
        "qa_f1",
    ),
    "samsum": TaskSpec(
        "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
        128,
        "rouge",
    ),
    "lsht": TaskSpec(
        "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}",
        64,
        "classification",
    ),
    "passage_count": TaskSpec(
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully "
        "read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In "
        "other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\n"
        "Please enter the final count of unique paragraphs after removing duplicates. The output format should "
        "only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: ",
        32,
        "count",
    ),
    "passage_retrieval_en": TaskSpec(
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the "
        "abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\n"
        "Please enter the number of the paragraph that the abstract is from. The answer format must be like "
        '"Paragraph 1", "Paragraph 2", etc.\n\nThe answer is: ',
        32,
        "retrieval",
    ),
    "passage_retrieval_zh": TaskSpec(
        "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n"
        '下面是一个摘要\n\n{input}\n\n请输入摘要所属段落的编号。答案格式必须是"段落1"，"段落2"等格式\n\n答案是：',
        32,
        "retrieval_zh",
    ),
    "lcc": TaskSpec("Please complete the code given below. \n{context}Next line of code:\n", 64, "code_sim"),
    "repobench-p": TaskSpec(
        "Please complete the code given below. \n{context}{input}Next line of code:\n", 64, "code_sim"
    ),
}


def split_prompt(task: str, record: dict[str, Any]) -> tuple[str, str]:
    """The official prompt of ``record`` cut after its context: ``(head + context, rest)``."""
    head, tail = TASK_SPECS[task].prompt.split("{context}")
    return head.format(**record) + record["context"], tail.format(**record)


def expand_tasks(tasks: list[str] | tuple[str, ...], longbench_e: bool = False) -> list[str]:
    """Task names with the aliases ``en``/``zh``/``all`` expanded; raises ``ValueError`` for unknown ones."""
    valid = TASKS_E if longbench_e else TASKS
    label = "LongBench-E" if longbench_e else "LongBench"
    out: list[str] = []
    for name in tasks:
        if not longbench_e and name in _TASK_ALIASES:
            out.extend(_TASK_ALIASES[name])
        elif longbench_e and name in ("en", "all"):
            out.extend(TASKS_E)
        elif name in valid:
            out.append(name)
        else:
            aliases = "en, all" if longbench_e else "en, zh, all"
            raise ValueError(f"unknown {label} task {name!r}; valid tasks: {', '.join(valid)} (aliases: {aliases})")
    return list(dict.fromkeys(out))
