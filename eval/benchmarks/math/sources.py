"""Where the math benchmarks' files are on the Hugging Face hub, and how they become ``data/math/<task>.jsonl``.

Each task's records are written as the hub dataset holds them (parquet rows as JSON objects); AIME 2025 comes in
two halves (I and II) whose records gain an ``id`` (``I-1`` ... ``II-15``). ``scripts/download_data.py math``
fetches them (`SOURCES`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from restkv.eval.benchmarks.shared.fetching import Dataset, Network, Outcome, get_hub_jsonl, read_records, write_jsonl

__all__ = ["HUB_FILES", "SOURCES", "read_records", "task_records", "write_jsonl"]

HUB_FILES: dict[str, list[tuple[str, str]]] = {
    "math500": [("HuggingFaceH4/MATH-500", "test.jsonl")],
    "aime24": [("HuggingFaceH4/aime_2024", "data/train-00000-of-00001.parquet")],
    "aime25": [("opencompass/AIME2025", "aime2025-I.jsonl"), ("opencompass/AIME2025", "aime2025-II.jsonl")],
    "gsm8k": [("openai/gsm8k", "main/test-00000-of-00001.parquet")],
}
"""Per task, the (hub dataset, file) pairs its records come from, in order."""


def task_records(task: str, files: list[Path]) -> list[dict[str, Any]]:
    """One task's records from its downloaded files (AIME 2025's halves numbered)."""
    if task != "aime25":
        return [record for path in files for record in read_records(path)]
    records = []
    for half, path in zip(("I", "II"), files, strict=True):
        records += [{**record, "id": f"{half}-{number}"} for number, record in enumerate(read_records(path), 1)]
    return records


def get_math(root: Path, force: bool, net: Network) -> Outcome:
    return get_hub_jsonl("math", root / "math", force, net, HUB_FILES, task_records)


SOURCES = (Dataset("math", get_math),)
"""``math``: MATH-500, AIME 2024/2025 and GSM8K test problems from their hub datasets, into ``data/math/``."""
