"""Our policies against kvpress's presses of the same name, on the micro model: kept positions and scores.

    python scripts/crosscheck_kvpress.py > results/summaries/kvpress-crosscheck.txt   # needs kvpress

For each pair (ours, kvpress's) it compares, on a few micro-suite prompts, the positions each keeps
in every layer and key/value head: ours under our integration (`restkv.compress`), kvpress's by its
own hooks (``with press(model)``, its code unmodified; positions recovered from the kept keys), then
runs both on the micro suite through the normal runner (kvpress's press as ``policy=kvpress``,
checked here to keep what kvpress's hooks keep). Scores are on a 0-100 scale; every run lands in its
results folder, so a rerun resumes.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

from restkv import get_policy
from restkv.eval.benchmarks.micro.benchmark import MicroBenchmark
from restkv.eval.evaluation.prompting import tokenize
from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.run import CONFIGS
from restkv.interop import compression_ratio, require_kvpress
from restkv.interop.kvpress_policy import KVPressPolicy
from restkv.interop.positions import full_cache, policy_positions, press_positions

MODEL = Path(__file__).resolve().parents[1] / "models" / "micro-llama"
TASKS = ["micro_single_2", "micro_multikey_1", "micro_multivalue", "passkey"]  # compare_policies.py's set


@dataclass
class Pair:
    """One of our policies (None: we have none) and kvpress's press of the same name."""

    label: str
    ours: tuple[str, dict[str, Any]] | None
    press: str
    settings: dict[str, Any]
    how: str
    overrides: list[str] = field(default_factory=list)

    def press_overrides(self) -> list[str]:
        return ["policy=kvpress", f"policy.press={self.press}", *(f"policy.{k}={v}" for k, v in self.settings.items())]

    def our_overrides(self) -> list[str]:
        name, knobs = self.ours  # type: ignore[misc]
        return [f"policy={name}", *(f"policy.{k}={v}" for k, v in knobs.items())]


PAIRS = [
    Pair("SnapKV, window 32", ("snapkv", {}), "SnapKVPress", {"window_size": 32}, "same definition"),
    Pair("SnapKV, defaults", ("snapkv", {}), "SnapKVPress", {}, "kvpress's window is 64 tokens, ours 32"),
    Pair("StreamingLLM", ("streamingllm", {}), "StreamingLLMPress", {"n_sink": 4}, "same: 4 sinks + most recent"),
    Pair(
        "random, seed 0",
        ("random", {"seed": 0}),
        "RandomPress",
        {"seed": 0},
        "ours: the window kept, a draw per layer; kvpress: any position, one draw for every layer",
    ),
    Pair("ReST-KV", ("restkv", {}), "ReSTKVPress", {}, "our scores inside kvpress's hooks (restkv.interop)"),
    Pair("KNorm", None, "KnormPress", {}, "no KNorm policy of ours"),
    Pair("TOVA", None, "TOVAPress", {}, "no TOVA policy of ours"),
]


def prompts(tokenizer, count: int, seed: int, length: int) -> list[torch.Tensor]:
    """``count`` micro-suite prompts (question included, as ``query_aware`` compresses them)."""
    bench = MicroBenchmark(tasks=TASKS, lengths=[length], samples=1, seed=seed)
    found = []
    for sample in bench.load_samples(tokenizer)[:count]:
        prompt = tokenize(sample, tokenizer, False, 4096)
        found.append(torch.tensor([prompt.context + prompt.query]))
    return found


def press_of(pair: Pair, budget: int, length: int) -> Any:
    ratio = compression_ratio(budget, length)
    if pair.press == "ReSTKVPress":
        from restkv.interop import ReSTKVPress

        return ReSTKVPress(compression_ratio=ratio)
    return getattr(require_kvpress(), pair.press)(compression_ratio=ratio, **pair.settings)


def agreement(a: list[torch.Tensor], b: list[torch.Tensor], budget: int) -> tuple[int, int, float, int]:
    """(identical selections, selections, mean overlap fraction, most positions differing in one)."""
    same = total = worst = 0
    overlap = 0.0
    for x, y in zip(a, b, strict=True):
        for row_x, row_y in zip(x, y, strict=True):
            shared = len(set(row_x.tolist()) & set(row_y.tolist()))
            same, total = same + int(shared == budget), total + 1
            overlap, worst = overlap + shared / budget, max(worst, budget - shared)
    return same, total, overlap / max(total, 1), worst


def compare_positions(model, ids_list: list[torch.Tensor], budget: int) -> dict[str, dict[str, Any]]:
    """Per pair: ours vs kvpress's hooks, and policy=kvpress vs kvpress's hooks."""
    rows: dict[str, dict[str, Any]] = {}
    for pair in PAIRS:
        ours, adapter = [], []
        for ids in ids_list:
            full = full_cache(model, ids)
            native = press_positions(model, press_of(pair, budget, ids.shape[1]), ids, full)
            if pair.ours is not None:
                mine = policy_positions(model, get_policy(pair.ours[0], **pair.ours[1]), budget, ids)
                ours.append(agreement(mine, native, budget))
            if pair.press != "ReSTKVPress":
                wrapped = policy_positions(model, KVPressPolicy(press=pair.press, **pair.settings), budget, ids)
                adapter.append(agreement(wrapped, native, budget))
        rows[pair.label] = {"ours": _sum(ours), "adapter": _sum(adapter)}
    return rows


def _sum(parts: list[tuple[int, int, float, int]]) -> tuple[int, int, float, int] | None:
    if not parts:
        return None
    same, total = sum(p[0] for p in parts), sum(p[1] for p in parts)
    return same, total, sum(p[2] * p[1] for p in parts) / total, max(p[3] for p in parts)


def score(args: argparse.Namespace, protocol: str, policy: list[str]) -> float:
    overrides = [
        "bench=micro",
        f"budget={args.budget}",
        f"bench.tasks=[{','.join(TASKS)}]",
        f"bench.lengths=[{args.length}]",
        f"bench.samples={args.samples}",
        f"bench.seed={args.seed}",
        f"protocol={protocol}",
        f"out_dir={args.out}",
        *policy,
    ]
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    name = policy[0].split("=", 1)[1]
    hashed = [o for o in overrides if o.startswith(("bench.", "protocol=", "policy."))]
    with contextlib.redirect_stdout(sys.stderr):  # the runner's tables: stdout is the report
        summary = run_benchmark(cfg, RunSettings("micro", "micro-llama", name, hashed, Path(args.out)))
    return float(summary["average"])


def scores(args: argparse.Namespace) -> dict[tuple[str, str], float]:
    """(what, protocol) -> micro-suite average: full, then each pair's ours and kvpress's."""
    found = {}
    for protocol in args.protocols:
        found[("full", protocol)] = score(args, protocol, ["policy=full"])
        for pair in PAIRS:
            if pair.ours is not None:
                found[(f"ours:{pair.label}", protocol)] = score(args, protocol, pair.our_overrides())
            if pair.press != "ReSTKVPress":
                found[(f"kvpress:{pair.label}", protocol)] = score(args, protocol, pair.press_overrides())
    return found


def _cell(result: tuple[int, int, float, int] | None) -> str:
    if result is None:
        return "-"
    same, total, overlap, worst = result
    return f"{same}/{total} same, {100 * overlap:.1f}% kept by both, <= {worst} differ"


def _points(found: dict, key: str, protocol: str) -> str:
    return f"{found[(key, protocol)]:.1f}" if (key, protocol) in found else "-"


def report(args, positions: dict, found: dict, seconds: float) -> str:
    """The table: positions (ours vs kvpress, policy=kvpress vs kvpress) and scores per protocol."""
    lines = [
        f"# python scripts/crosscheck_kvpress.py (kvpress {version('kvpress')}, transformers "
        f"{version('transformers')}; {seconds / 60:.1f} min on {torch.get_num_threads()} CPU threads)",
        f"# micro-llama, budget {args.budget} tokens per layer (window included), compression_ratio = 1 - budget / "
        "prompt length to the last bit",
        f"# positions: {args.prompts} micro-suite prompts of {args.length} tokens x 4 layers x 2 key/value heads; "
        f"scores: micro suite {len(TASKS)} tasks x {args.samples} prompts, seed {args.seed}",
        "",
        "kept positions per layer and key/value head",
        f"{'pair':20} {'ours vs kvpress hooks':48} {'policy=kvpress vs kvpress hooks':48} definitions",
    ]
    for pair in PAIRS:
        row = positions[pair.label]
        lines.append(f"{pair.label:20} {_cell(row['ours']):48} {_cell(row['adapter']):48} {pair.how}")
    lines += ["", "micro-suite average (%), ours | kvpress's press (run as policy=kvpress)"]
    header = "".join(f"{p:>26}" for p in args.protocols)
    lines.append(f"{'pair':20}{header}")
    lines.append(f"{'full cache':20}" + "".join(f"{_points(found, 'full', p):>26}" for p in args.protocols))
    for pair in PAIRS:
        cells = [
            f"{_points(found, 'ours:' + pair.label, p):>6} | {_points(found, 'kvpress:' + pair.label, p):<6}"
            for p in args.protocols
        ]
        lines.append(f"{pair.label:20}" + "".join(f"{c:>26}" for c in cells))
    lines += [
        "",
        "same: selections (prompt x layer x key/value head) keeping the same set; kept by both: mean share of the",
        "budget both keep; differ: most positions one keeps and the other does not, in one selection. kvpress's",
        "presses score under policy=kvpress as under their own hooks (same positions, second column); ReSTKVPress",
        "keeps our positions, so its scores are ours. One prompt is 5 points of a task, 1.25 of an average.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--prompts", type=int, default=4, help="prompts for the positions (one per task)")
    parser.add_argument("--samples", type=int, default=5, help="prompts per task for the scores")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--protocols", nargs="+", default=["query_aware", "query_agnostic"])
    parser.add_argument("--out", default="results")
    parser.add_argument("--no-scores", action="store_true", help="positions only")
    args = parser.parse_args()
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="sdpa").eval()
    positions = compare_positions(model, prompts(tokenizer, args.prompts, args.seed, args.length), args.budget)
    found = {} if args.no_scores else scores(args)
    print(report(args, positions, found, time.perf_counter() - start))


if __name__ == "__main__":
    main()
