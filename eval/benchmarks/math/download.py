"""Where the math benchmarks' files are on the Hugging Face hub, and how they become ``data/math/<task>.jsonl``.

Each task's records are written as the hub dataset holds them (parquet rows as JSON objects); AIME 2025 comes in
two halves (I and II) whose records gain an ``id`` (``I-1`` ... ``II-15``). ``scripts/download_data.py math``
fetches them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HUB_FILES: dict[str, list[tuple[str, str]]] = {
    "math500": [("HuggingFaceH4/MATH-500", "test.jsonl")],
    "aime24": [("HuggingFaceH4/aime_2024", "data/train-00000-of-00001.parquet")],
    "aime25": [("opencompass/AIME2025", "aime2025-I.jsonl"), ("opencompass/AIME2025", "aime2025-II.jsonl")],
    "gsm8k": [("openai/gsm8k", "main/test-00000-of-00001.parquet")],
}
"""Per task, the (hub dataset, file) pairs its records come from, in order."""


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines or parquet file."""
    if path.suffix == ".parquet":
        import pandas

        return [{k: _plain(v) for k, v in row.items()} for row in pandas.read_parquet(path).to_dict("records")]
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _plain(value: Any) -> Any:
    """A parquet cell as a JSON value (numpy scalars to Python numbers)."""
    return value.item() if hasattr(value, "item") else value


def task_records(task: str, files: list[Path]) -> list[dict[str, Any]]:
    """One task's records from its downloaded files (AIME 2025's halves numbered)."""
    if task != "aime25":
        return [record for path in files for record in read_records(path)]
    records = []
    for half, path in zip(("I", "II"), files, strict=True):
        records += [{**record, "id": f"{half}-{number}"} for number, record in enumerate(read_records(path), 1)]
    return records


def write_jsonl(records: list[dict[str, Any]], dest: Path) -> None:
    with open(dest, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
