"""Where ``scripts/download_data.py scbench`` gets SCBench: the hub's own JSON-lines copies, one per task."""

from __future__ import annotations

from pathlib import Path

from restkv.eval.benchmarks.scbench.benchmark import TASKS
from restkv.eval.benchmarks.shared.fetching import Dataset, Network, Outcome, get_hub_jsonl, read_records

HUB_REPO = "microsoft/SCBench"


def get_scbench(root: Path, force: bool, net: Network) -> Outcome:
    files = {f"scbench_{task}": [(HUB_REPO, f"data/scbench_{task}.jsonl")] for task in TASKS}
    return get_hub_jsonl("scbench", root / "scbench", force, net, files, lambda _, paths: read_records(paths[0]))


SOURCES = (Dataset("scbench", get_scbench),)
"""``scbench``: SCBench's tasks (``microsoft/SCBench``, ``data/scbench_<task>.jsonl``) into ``data/scbench/``."""
