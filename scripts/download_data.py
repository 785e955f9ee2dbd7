"""Fetch the evaluation datasets into ``data/``, saying per dataset what it got and what it could not.

    python scripts/download_data.py all
    python scripts/download_data.py longbench longbench_e infinitebench
    python scripts/download_data.py ruler_qa paul_graham --data-dir /big/disk/data

Datasets are declared by the benchmark packages, each in its ``sources`` module (the folders the benchmark
configs read by default), and found there (`restkv.eval.benchmarks.shared.fetching.declared_datasets`):

* ``infinitebench`` (`restkv.eval.benchmarks.infinitebench.sources`): the 12 ``<task>.jsonl`` of the hub dataset
  ``xinrongzhang2022/InfiniteBench``;
* ``longbench`` / ``longbench_e`` (`restkv.eval.benchmarks.longbench.sources`): the official ``data.zip`` of
  ``THUDM/LongBench``'s 21 v1 / 13 LongBench-E files, into ``data/LongBench/``;
* ``math`` (`restkv.eval.benchmarks.math.sources`): MATH-500, AIME 2024/2025 and GSM8K into ``data/math/``;
* ``paul_graham`` (`restkv.eval.benchmarks.niah.sources`): the Needle-in-a-Haystack repository's essays;
* ``ruler_qa`` / ``ruler_words`` (`restkv.eval.benchmarks.ruler.sources`): SQuAD 2.0 and HotpotQA dev sets,
  RULER's ``english_words.json``, into ``data/ruler/``;
* ``scbench`` (`restkv.eval.benchmarks.scbench.sources`): SCBench's tasks into ``data/scbench/``.

Each source is tried in turn, after a quick reachability check of its host, so an offline machine fails at once.
Files already present are kept (``--force`` fetches again). Every file is written to a temporary name beside its
destination, checked (JSON parses, archive members exist) and only then renamed into place, so an interrupted or
failed download never leaves a half-written file.
Hub downloads go through ``huggingface_hub`` (honours ``HF_ENDPOINT``, ``HF_TOKEN`` and the hub cache).

Prints ``<name>: ok: <path>`` or ``could not get <name>: <reason>; to get it manually: <steps>`` per dataset;
the exit status is 1 if anything requested could not be fetched.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from restkv.eval.benchmarks.shared.fetching import Network, declared_datasets, http_get, hub_get, reachable

REPO = Path(__file__).resolve().parents[1]

__all__ = ["http_get", "hub_get", "main", "network", "reachable"]


def network() -> Network:
    """The network calls of this run, looked up on this module when made (the tests replace them here)."""
    module = sys.modules[__name__]
    return Network(
        reachable=lambda host, port: module.reachable(host, port),
        http_get=lambda url, dest: module.http_get(url, dest),
        hub_get=lambda repo, name: module.hub_get(repo, name),
    )


def main(argv: list[str] | None = None) -> int:
    datasets = declared_datasets()
    parser = argparse.ArgumentParser(
        description="Fetch evaluation datasets into data/.", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "names", nargs="+", choices=[*datasets, "all"], metavar="NAME", help=f"{', '.join(datasets)} or all"
    )
    parser.add_argument("--data-dir", type=Path, default=REPO / "data", help="root folder (default: <repo>/data)")
    parser.add_argument("--force", action="store_true", help="fetch again even when the files are present")
    args = parser.parse_args(argv)
    names = list(datasets) if "all" in args.names else list(dict.fromkeys(args.names))
    net = network()
    outcomes = []
    for name in names:
        print(f"{name}: fetching...", flush=True)
        outcome = datasets[name].get(args.data_dir, args.force, net)
        print(outcome.line(), flush=True)
        outcomes.append(outcome)
    failed = [o.name for o in outcomes if not o.ok]
    if failed:
        print(f"not fetched: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
