"""Accuracy and fidelity of the policies at several budgets, in one command, one table.

    python scripts/compare_policies.py                # 8 policies on the micro suite: about 6 min on 2 CPU cores
    python scripts/compare_policies.py --all          # every policy of configs/policy/ and the quantization table
    python scripts/compare_policies.py --model llama-3.1-8b-instruct --bench ruler --lengths 8192 --samples 20

For each policy and budget it runs the accuracy benchmark (``--bench``: the micro suite or RULER)
and the fidelity benchmark (KL to the full cache and greedy agreement on the same prompts) through the normal
runner, so every run lands in its usual results folder and a rerun resumes. Prints accuracy,
agreement and KL tables (policies x budgets) and saves a plot of accuracy against budget. Then
``--quant-policy`` (ReST-KV) with its kept tokens stored quantized at each of ``--quant-bits``
(``quantization=kivi``, HQQ; 16 = unquantized): accuracy, KL to the full cache and the cache's bytes (with
``--all`` or ``--quant``). Before each run it prints where it is among all of them, with the time left.

The runs are a sweep of ordinary runs; the tables, intervals, figure and answer lengths are the report's
(`restkv.eval.report.compare`), and ``--all``'s policy list is derived from ``configs/policy/`` there.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose, initialize_config_dir

from restkv.eval.harness.run_folder import run_folder
from restkv.eval.harness.runner import RunSettings, run_benchmark
from restkv.eval.report.collect import folder_scores, format_grid
from restkv.eval.report.compare import answer_length, comparable_policies, interval_grid, intervals_text, plot_accuracy
from restkv.eval.report.uncertainty import Interval, paired_difference
from restkv.eval.run import CONFIGS

DEFAULT_POLICIES = ["full", "streamingllm", "h2o", "snapkv", "pyramidkv", "adakv", "criticalkv", "restkv"]
"""The default comparison (the README's table): one policy of each family."""
QUANT_BITS = ["16", "8", "4", "2"]
"""The quantization table's rows: 16 is the model's own bfloat16 cache, the others ``quantization=kivi``."""
DEFAULT_TASKS = {
    # micro-llama's full cache solves these at 2048 tokens (its model card): needles in an essay
    # (one key; four keys, one asked; one key's four values) and the passkey in repeated noise
    "micro": ["micro_single_2", "micro_multikey_1", "micro_multivalue", "passkey"],
    "ruler": ["niah_single_1", "niah_single_2", "niah_multikey_1"],
}
DEFAULT_SAMPLES = {"micro": 5, "ruler": 10}  # 20-30 prompts per cell


@dataclass
class Progress:
    """Where the comparison is among all its runs, and about how long is left (from the runs that did work)."""

    total: int
    done: int = 0
    started: float = field(default_factory=time.monotonic)

    def announce(self, what: str) -> None:
        elapsed = time.monotonic() - self.started
        left = f", about {_minutes(elapsed / self.done * (self.total - self.done))} left" if self.done else ""
        print(f"\ncompare: run {self.done + 1}/{self.total}: {what} ({_minutes(elapsed)} so far{left})", flush=True)
        self.done += 1


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


PROGRESS = Progress(total=0)


def run(bench: str, policy: str, budget: str, args: argparse.Namespace, extra: tuple[str, ...] = ()) -> dict:
    tasks = "[" + ",".join(args.tasks) + "]"
    lengths = "[" + ",".join(str(n) for n in args.lengths) + "]"
    source = "bench.source." if bench == "fidelity" else "bench."
    overrides = [f"bench@bench.source={args.bench}"] if bench == "fidelity" else []
    overrides += [
        f"model={args.model}",
        f"policy={policy}",
        f"budget={budget}",
        f"bench={bench}",
        f"out_dir={args.out}",
        f"{source}tasks={tasks}",
        f"{source}lengths={lengths}",
        f"{source}samples={args.samples}",
        f"{source}seed={args.seed}",
        f"protocol={args.protocol}",
    ]
    if bench == "fidelity":
        overrides.append(f"evaluation.tokens={args.fidelity_tokens}")
    overrides += extra
    PROGRESS.announce(f"{policy} @ {budget} on {bench}" + (f" ({', '.join(extra)})" if extra else ""))
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    kinds = ("bench.", "bench@", "evaluation.", "protocol=", "quantization", "compression.")
    hashed = [o for o in overrides if o.startswith(kinds)]
    summary = run_benchmark(cfg, RunSettings(bench, args.model, policy, overrides=hashed, out_dir=Path(args.out)))
    summary["folder"] = run_folder(Path(args.out), bench, args.model, policy, str(budget), hashed)
    return summary


def print_intervals(policies: list[str], budgets: list[str], scores: dict[tuple[str, str], dict[str, float]]) -> None:
    """Accuracy with 95 % bootstrap intervals, and ReST-KV minus each other policy, paired on the same prompts."""
    print(intervals_text(policies, budgets, scores))


def argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments before anything runs (an unknown policy, kvpress missing, a quantization
    group that cannot divide the model's key/value rows), or None."""
    from restkv.interop import KVPressMissing, require_kvpress
    from restkv.registry import policy_names, preset_names

    known = set(policy_names()) | set(preset_names())
    unknown = [p for p in args.policies if p not in known]
    if unknown:
        return f"--policies: unknown {', '.join(unknown)}; known: {', '.join(sorted(known))}"
    if "kvpress" in args.policies:
        try:
            require_kvpress()
        except KVPressMissing as error:
            return f"--policies kvpress: {error}"
    if args.no_quant and args.quant_group_size != 64:
        return f"--quant-group-size {args.quant_group_size} applies to the quantization table: add --quant (or --all)"
    if not args.no_quant:
        from omegaconf import OmegaConf
        from transformers import AutoConfig

        from restkv.eval.harness.config_tree import config_file
        from restkv.eval.models.loading import resolve

        path = str(OmegaConf.load(config_file("model", args.model, "model")).path)
        config = AutoConfig.from_pretrained(resolve(path))
        width = config.num_key_value_heads * getattr(
            config, "head_dim", config.hidden_size // config.num_attention_heads
        )
        if args.quant_group_size < 1 or width % args.quant_group_size:
            return (
                f"--quant-group-size {args.quant_group_size} must divide the model's key/value row ({width} = kv "
                "heads x head_dim); e.g. 32 or 64, or --no-quant"
            )
    return None


def parse_arguments() -> argparse.Namespace:
    """The command line, checked (`argument_problem`) and completed with the bench's defaults."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="micro-llama")
    parser.add_argument(
        "--policies", nargs="+", default=None, help="default: DEFAULT_POLICIES (--all: every one of configs/policy/)"
    )
    parser.add_argument("--all", action="store_true", help="every policy and the quantization table")
    parser.add_argument("--quant", action="store_true", help="add the quantization table")
    parser.add_argument("--budgets", nargs="+", default=["64", "128", "256"])
    parser.add_argument("--bench", default="micro", choices=sorted(DEFAULT_TASKS), help="the accuracy benchmark")
    parser.add_argument("--tasks", nargs="+", default=None, help="default: the bench's entry in DEFAULT_TASKS")
    parser.add_argument("--lengths", nargs="+", type=int, default=[2048])
    parser.add_argument("--samples", type=int, default=None, help="per task and length (default: DEFAULT_SAMPLES)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--protocol", default="query_aware")
    parser.add_argument("--fidelity-tokens", type=int, default=8)
    parser.add_argument("--no-fidelity", action="store_true")
    parser.add_argument("--out", default="results")
    parser.add_argument("--quant-policy", default="restkv", help="the policy of the quantization table")
    parser.add_argument("--quant-bits", nargs="+", default=QUANT_BITS, help="its rows; 16 = unquantized")
    parser.add_argument("--quant-group-size", type=int, default=64, help="must divide kv heads x head_dim")
    parser.add_argument("--no-quant", action="store_true", help="skip the quantization table (even with --all)")
    parser.add_argument("--phases", action="store_true", help="add decode-time eviction next to prefill-only")
    parser.add_argument("--phase-policies", nargs="+", default=["snapkv", "restkv", "rkv"], help="its rows")
    parser.add_argument("--phase-interval", type=int, default=8, help="compression.decode_interval of its runs")
    parser.add_argument("--turns", action="store_true", help="add several questions per compressed context")
    parser.add_argument("--turn-policies", nargs="+", default=["full", "snapkv", "restkv", "rkv"], help="its rows")
    parser.add_argument("--turn-tasks", nargs="+", default=["micro_multikey_1"], help="tasks whose samples have turns")
    parser.add_argument("--turn-samples", type=int, default=20, help="prompts per turn task")
    args = parser.parse_args()
    args.policies = args.policies or (comparable_policies() if args.all else DEFAULT_POLICIES)
    args.no_quant = args.no_quant or not (args.all or args.quant)
    problem = argument_problem(args)
    if problem:
        parser.error(problem)
    args.tasks = args.tasks or DEFAULT_TASKS[args.bench]
    args.samples = DEFAULT_SAMPLES[args.bench] if args.samples is None else args.samples
    return args


def main() -> None:
    args = parse_arguments()
    PROGRESS.total = planned_runs(args)

    accuracy: dict[tuple[str, str], float] = {}
    agreement: dict[tuple[str, str], float] = {}
    kl: dict[tuple[str, str], float] = {}
    cache: dict[tuple[str, str], float] = {}
    scores: dict[tuple[str, str], dict[str, float]] = {}
    for policy in args.policies:
        for budget in args.budgets:
            if policy == "full" and budget != args.budgets[0]:
                accuracy[(policy, budget)] = accuracy[(policy, args.budgets[0])]
                scores[(policy, budget)] = scores[(policy, args.budgets[0])]
                continue
            summary = run(args.bench, policy, budget, args)
            accuracy[(policy, budget)] = summary["average"]
            scores[(policy, budget)] = folder_scores(summary["folder"])
            head_tokens = summary.get("cache", {}).get("head_tokens_mean")
            if head_tokens is not None:
                cache[(policy, budget)] = head_tokens
            if not args.no_fidelity and policy != "full":
                summary = run("fidelity", policy, budget, args)
                agreement[(policy, budget)] = summary["average"]
                kl[(policy, budget)] = summary["kl_average"]

    lengths = "/".join(map(str, args.lengths))
    title = f"{args.model}, {args.bench} {lengths} tokens, {len(args.tasks)} tasks x {args.samples}"
    print(f"\naccuracy (%) - {title}")
    print(format_grid(args.policies, args.budgets, accuracy))
    print_intervals(args.policies, args.budgets, scores)
    print_fidelity_and_cache(args, agreement, kl, cache)
    figure = Path(args.out) / "compare" / f"{args.model}-accuracy.png"
    plot_accuracy(accuracy, args.budgets, args.policies, figure, title)
    print(f"\nplot: {figure}")
    if not args.no_quant:
        quantization_table(args, title)
    if args.phases:
        phase_table(args, title)
    if args.turns:
        turns_table(args)


def planned_runs(args: argparse.Namespace) -> int:
    """How many runs the comparison makes (the full cache once; fidelity for every evicting cell)."""
    evicting = len([p for p in args.policies if p != "full"])
    accuracy = evicting * len(args.budgets) + ("full" in args.policies)
    fidelity = 0 if args.no_fidelity else evicting * len(args.budgets)
    quantized = 0 if args.no_quant else len(args.quant_bits) * len(args.budgets) * (1 if args.no_fidelity else 2)
    phases = 2 * len(args.phase_policies) * len(args.budgets) if args.phases else 0
    turns = len(args.turn_policies) * len(args.budgets) if args.turns else 0
    return accuracy + fidelity + quantized + phases + turns


def print_fidelity_and_cache(args: argparse.Namespace, agreement: dict, kl: dict, cache: dict) -> None:
    """The fidelity tables (agreement, KL) and the cache sizes, where they were measured."""
    if agreement:
        evicting = [p for p in args.policies if p != "full"]
        print(f"\nfidelity: greedy agreement with the full cache (%), first {args.fidelity_tokens} tokens")
        print(format_grid(evicting, args.budgets, agreement))
        print("\nfidelity: KL(full || evicted) over the reference answer (nats per token)")
        print(format_grid(evicting, args.budgets, kl, digits=4))
    if cache:
        print("\ncache after eviction: tokens kept x key/value heads, summed over layers (mean per prompt)")
        print(format_grid(args.policies, args.budgets, cache, digits=0))


def quantization_table(args: argparse.Namespace, title: str) -> None:
    """``--quant-policy`` at every budget with its cache quantized to each of ``--quant-bits``."""
    accuracy: dict[tuple[str, str], float] = {}
    kl: dict[tuple[str, str], float] = {}
    stored: dict[tuple[str, str], float] = {}
    rows = [f"{bits}-bit" for bits in args.quant_bits]
    for bits, row in zip(args.quant_bits, rows, strict=True):
        group = () if args.quant_group_size == 64 else (f"quantization.group_size={args.quant_group_size}",)
        quantized = ("quantization=kivi", f"quantization.nbits={bits}", *group)
        extra = () if bits == "16" else quantized
        for budget in args.budgets:
            summary = run(args.bench, args.quant_policy, budget, args, extra)
            accuracy[(row, budget)] = summary["average"]
            stored[(row, budget)] = summary["cache"]["logical_bytes_mean"] / 1024
            if not args.no_fidelity:
                kl[(row, budget)] = run("fidelity", args.quant_policy, budget, args, extra)["kl_average"]
    print(f"\n{args.quant_policy} with a quantized cache (quantization=kivi, HQQ): accuracy (%) - {title}")
    print(format_grid(rows, args.budgets, accuracy))
    if kl:
        print("\nKL(full || evicted and quantized) over the reference answer (nats per token)")
        print(format_grid(rows, args.budgets, kl, digits=4))
    print("\ncache after eviction: KiB stored (quantized part, scales and full-precision residual), mean per prompt")
    print(format_grid(rows, args.budgets, stored, digits=1))


def phase_table(args: argparse.Namespace, title: str) -> None:
    """Each of ``--phase-policies`` evicting during decoding (``compression.phase=decode``, each budget as the
    decode budget) next to the same policy evicting at the end of the prompt, paired on the same prompts."""
    accuracy: dict[tuple[str, str], float] = {}
    lengths: dict[tuple[str, str], float] = {}
    paired: dict[tuple[str, str], Interval] = {}
    for policy in args.phase_policies:
        for budget in args.budgets:
            decode = (
                "compression.phase=decode",
                f"compression.decode_budget={budget}",
                f"compression.decode_interval={args.phase_interval}",
            )
            runs = {
                "prefill": run(args.bench, policy, budget, args),
                "decode": run(args.bench, policy, budget, args, decode),
            }
            for phase, summary in runs.items():
                accuracy[(f"{policy} {phase}", budget)] = summary["average"]
                lengths[(f"{policy} {phase}", budget)] = answer_length(summary["folder"])
            scores = {phase: folder_scores(summary["folder"]) for phase, summary in runs.items()}
            paired[(policy, budget)] = paired_difference(scores["decode"], scores["prefill"])
    rows = [f"{p} {phase}" for p in args.phase_policies for phase in ("prefill", "decode")]
    print(f"\neviction during decoding (interval {args.phase_interval}) or at the prompt's end: accuracy (%) - {title}")
    print(format_grid(rows, args.budgets, accuracy))
    print("\ndecode-time minus prefill-only (points), paired bootstrap over the same prompts (95 %)")
    print(interval_grid(args.phase_policies, args.budgets, paired))
    print("\nmean answer length (generated tokens)")
    print(format_grid(rows, args.budgets, lengths, digits=1))


def turns_table(args: argparse.Namespace) -> None:
    """Each of ``--turn-policies`` answering several questions about one compressed context
    (``evaluation=multi_turn``, answers kept in the cache): accuracy over the turns, per turn, and paired
    differences from ReST-KV on the same prompts."""
    turn_args = argparse.Namespace(
        **{**vars(args), "tasks": args.turn_tasks, "samples": args.turn_samples, "protocol": "query_agnostic"}
    )  # the context alone is compressed: multi-turn runs record the protocol they use
    accuracy: dict[tuple[str, str], float] = {}
    curves: dict[tuple[str, str], list[float]] = {}
    scores: dict[tuple[str, str], dict[str, float]] = {}
    for policy in args.turn_policies:
        for budget in args.budgets:
            summary = run(args.bench, policy, budget, turn_args, ("evaluation=multi_turn",))
            accuracy[(policy, budget)] = summary["average"]
            curves[(policy, budget)] = summary.get("turn_scores", [])
            scores[(policy, budget)] = folder_scores(summary["folder"])
    title = f"{', '.join(args.turn_tasks)}, {args.turn_samples} prompts, {args.lengths[0]} tokens"
    print(f"\nseveral questions per compressed context (evaluation=multi_turn): accuracy over the turns (%) - {title}")
    print(format_grid(args.turn_policies, args.budgets, accuracy))
    print("\naccuracy per turn (%): turn 1 is the sample's own question; every turn reads one compressed cache")
    for (policy, budget), curve in curves.items():
        print(f"{policy:>14} @ {budget:>5}: " + "  ".join(f"{value:5.1f}" for value in curve))
    print_intervals(args.turn_policies, args.budgets, scores)


if __name__ == "__main__":
    main()
