"""Scoring cost of ReST-KV against SnapKV on one Llama-3.1-8B-shaped layer.

Prints, for each context length, the time and peak memory of one layer's eviction decision
(scores + top-k) for both policies, and the ratios ReST-KV / SnapKV measured side by side in
this run. ReST-KV is measured twice: ``restkv`` as the integration runs it per prompt (the
per-head Gram matrices ``W_o^hT W_o^h`` depend only on the weights and are computed once per
layer and cached), and ``restkv+gram`` recomputing them in every call (their one-off cost).
Each measurement runs in a fresh subprocess so that peak memory (``ru_maxrss``) belongs to that
policy alone; the policies alternate over several rounds to spread machine noise.

    python scripts/bench_scoring.py                      # 8k and 16k tokens
    python scripts/bench_scoring.py --lengths 8192 --naive   # also the [heads, L, hidden] formula

``--naive`` adds the reference formulation that projects every value through ``W_o``
(a ``[heads, L, hidden]`` tensor), reimplemented here only to measure its cost.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, WINDOW = 32, 8, 128, 4096, 32


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def naive_select(inputs, weight: torch.Tensor, budget: int) -> torch.Tensor:
    """ReST-KV ``after`` scores via an explicit ``W_o^h v_j`` projection of every token (no smoothing)."""
    from restkv import scoring

    attention = scoring.window_attention(inputs.queries, inputs.keys)
    past = inputs.length - WINDOW
    a = scoring.aggregate(attention[..., :past], "ema", 0.3)[0]  # [h, P]
    values = inputs.values[0].repeat_interleave(HEADS // KV_HEADS, 0)[:, :past]  # [h, P, d]
    weight = weight.view(HIDDEN, HEADS, HEAD_DIM)
    projected = torch.einsum("hpd,chd->hpc", values, weight)  # [h, P, hidden]
    output = torch.einsum("hp,hpc->hc", a, projected)
    scores = a / (1 - a) * (output[:, None] - projected).norm(dim=-1)
    return scores.topk(budget - WINDOW, dim=-1).indices


def child(policy_name: str, length: int, budget: int, repeats: int) -> None:
    """Run inside the subprocess: measure one policy, print a JSON line."""
    from restkv import Budget, LayerInputs, get_policy
    from restkv.scoring import output_gram

    torch.manual_seed(0)
    weight = torch.randn(HIDDEN, HEADS * HEAD_DIM) / HIDDEN**0.5
    cached = output_gram(weight, HEADS)
    inputs = LayerInputs(
        queries=torch.randn(1, HEADS, WINDOW, HEAD_DIM),
        keys=torch.randn(1, KV_HEADS, length, HEAD_DIM),
        values=torch.randn(1, KV_HEADS, length, HEAD_DIM),
        layer=0,
        num_layers=1,
        output_gram=(lambda: output_gram(weight, HEADS)) if policy_name == "restkv+gram" else (lambda: cached),
    )
    if policy_name == "naive":
        run = lambda: naive_select(inputs, weight, budget)  # noqa: E731
    else:
        policy = get_policy(policy_name.removesuffix("+gram"), window=WINDOW)
        run = lambda: policy.select(inputs, Budget(budget))  # noqa: E731
    baseline = rss_mb()
    with torch.no_grad():
        start = time.perf_counter()
        run()
        first = time.perf_counter() - start
        peak = peak_mb()
        times = [first]
        for _ in range(repeats - 1):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": statistics.median(times), "peak_mb": peak, "inputs_mb": baseline}))


def measure(policy: str, length: int, budget: int, repeats: int) -> dict:
    command = [sys.executable, __file__, "--child", policy, str(length), str(budget), str(repeats)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--budget", type=int, default=1024, help="tokens kept per head, window included")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per policy")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per subprocess (median)")
    parser.add_argument("--naive", action="store_true", help="also measure the [heads, L, hidden] formulation")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        policy, length, budget, repeats = args.child
        child(policy, int(length), int(budget), int(repeats))
        return

    policies = ["snapkv", "restkv", "restkv+gram"] + (["naive"] if args.naive else [])
    print(
        f"layer: {HEADS} query heads, {KV_HEADS} kv heads, head_dim {HEAD_DIM}, hidden {HIDDEN}, "
        f"window {WINDOW}, budget {args.budget}, float32, {torch.get_num_threads()} threads"
    )
    print(f"{'tokens':>7} {'policy':>11} {'seconds':>8} {'peak MB':>8} {'above inputs MB':>16}")
    for length in args.lengths:
        results: dict[str, list[dict]] = {p: [] for p in policies}
        for _ in range(args.rounds):
            for policy in policies:
                results[policy].append(measure(policy, length, args.budget, args.repeats))
        summary = {}
        for policy, runs in results.items():
            seconds = min(r["seconds"] for r in runs)
            peak = min(r["peak_mb"] for r in runs)
            above = min(r["peak_mb"] - r["inputs_mb"] for r in runs)
            summary[policy] = (seconds, peak, above)
            print(f"{length:>7} {policy:>11} {seconds:>8.3f} {peak:>8.0f} {above:>16.0f}")
        base = summary["snapkv"]
        for policy in policies[1:]:
            s, p, a = summary[policy]
            print(
                f"{length:>7} {policy}/snapkv: time {s / base[0]:.2f}x, peak memory {p / base[1]:.2f}x "
                f"(above inputs {a / max(base[2], 1e-9):.2f}x)"
            )


if __name__ == "__main__":
    main()
