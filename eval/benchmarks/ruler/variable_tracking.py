"""Variable tracking (``vt``): chains of assignments hidden among noise lines.

"VAR AAAAA = 12345", "VAR BBBBB = VAR AAAAA", ...; the model names every variable that ends up
holding the chain's value. RULER puts one complete solved example (about 500 tokens) before the task.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from restkv.eval.benchmarks.ruler.fitting import Build, Count, Draft, TooShort, fit_prompt, search_size, step_down
from restkv.eval.benchmarks.ruler.plan import Job, Plan
from restkv.eval.benchmarks.ruler.templates import FAMILIES, NOISE_SENTENCE, split_template


@dataclass(frozen=True)
class VariableTracking:
    """The vt task's settings."""

    num_chains: int = 1
    num_hops: int = 4
    icl_tokens: int = 500  # RULER fits its in-context example to 500 tokens
    family: str = "variable_tracking"

    def plan(self, job: Job) -> Plan:
        """Noise lines (official step 10, 5 below 4,096 tokens). The example gets 500 tokens; with
        ``fit=exact``, half the budget when that is smaller (so that vt fits under about 1k tokens)."""
        icl = self.icl_tokens if job.fit == "official" else min(self.icl_tokens, job.budget // 2)
        example = vt_example(self, job.seed, job.count, icl, job.fit)
        n_min = (self.num_hops + 1) * self.num_chains

        def builder(index: int, seed: str) -> tuple[Build, int]:
            return vt_builder(self, seed, example), n_min

        def probe_builder(index: int, seed: str) -> tuple[Build, int]:
            return vt_builder(self, seed, lambda rng: ""), n_min

        step = 5 if job.short else 10
        return Plan("noise", builder, n_max=4 * job.budget + 16, step=step, probe=step, probe_builder=probe_builder)


def _vt_chains(
    rng: random.Random, num_chains: int, num_hops: int, name_len: int, value: str | None
) -> tuple[list[list[str]], list[list[str]]]:
    total = (num_hops + 1) * num_chains
    names: list[str] = []
    while len(names) < total:
        name = "".join(rng.choices(string.ascii_uppercase, k=name_len))
        if name not in names:
            names.append(name)
    all_vars, chains = [], []
    for c in range(num_chains):
        chain_vars = names[c * (num_hops + 1) : (c + 1) * (num_hops + 1)]
        start = value if value is not None else str(rng.randint(10000, 99998))
        chain = [f"VAR {chain_vars[0]} = {start}"]
        chain.extend(f"VAR {chain_vars[j + 1]} = VAR {chain_vars[j]} " for j in range(num_hops))
        all_vars.append(chain_vars)
        chains.append(chain)
    return all_vars, chains


def _vt_render(chains: list[list[str]], rng: random.Random, n: int) -> tuple[str, list[float]]:
    lines = [NOISE_SENTENCE] * n
    depths: list[float] = []
    for chain in chains:
        positions = sorted(rng.sample(range(len(lines)), len(chain)))
        for j, (position, line) in enumerate(zip(positions, chain, strict=True)):
            lines.insert(position + j, line)
            depths.append(position / max(n, 1))
    return "\n".join(lines).replace(". \n", ".\n"), depths


def vt_example(
    cfg: VariableTracking, seed: str, count: Count, budget: int, fit: str = "exact"
) -> Callable[[random.Random], str]:
    """RULER's in-context example: a complete short vt prompt with its answer.

    Fitted once per generation run; each sample then re-draws the variable names and the value
    (RULER's ``randomize_icl``).
    """
    family = FAMILIES["variable_tracking"]
    head, tail = split_template(family.template)
    num_hops = min(10, cfg.num_hops)

    def render(n: int, names_rng: random.Random | None, layout_seed: str) -> str:
        value = "12345" if names_rng is None else str(names_rng.randint(10000, 99998))
        chain_rng = names_rng if names_rng is not None else random.Random(layout_seed + "-names")
        all_vars, chains = _vt_chains(chain_rng, cfg.num_chains, num_hops, 3, value)
        context, _ = _vt_render(chains, random.Random(layout_seed), n)
        fields = {"query": value, "num_v": num_hops + 1}
        prompt = head + context + tail.format(**fields) + family.answer_prefix.format(**fields)
        return prompt + " " + " ".join(all_vars[0]) + "\n"

    layout_seed = seed + "-icl"
    n_min = (num_hops + 1) * cfg.num_chains

    def build(n: int) -> Draft:
        return Draft(render(n, None, layout_seed), "", "", [])

    try:
        if fit == "official":  # the official generator sizes its example in steps of 5 noise lines
            per_unit = count(build(5).prompt) / 5
            start = search_size(build, count, budget, 5, per_unit, budget, 3.0)
            n_icl = step_down(lambda attempt: build, count, budget, start, 5, n_min, retries=0).n
        else:
            n_icl = fit_prompt(build, count, budget, n_min, 4 * budget + 16).n
    except TooShort:
        n_icl = n_min
    return lambda rng: render(n_icl, rng, layout_seed)


def vt_builder(cfg: VariableTracking, seed: str, example: Callable[[random.Random], str]) -> Build:
    """``build(n)`` for one sample: the in-context example, then the chains among ``n`` noise lines."""
    family = FAMILIES["variable_tracking"]
    head, tail = split_template(family.template)

    def build(n: int) -> Draft:
        rng = random.Random(seed)
        icl = example(rng)
        all_vars, chains = _vt_chains(rng, cfg.num_chains, cfg.num_hops, 5, None)
        value = chains[0][0].split("=")[-1].strip()
        context, depths = _vt_render(chains, rng, n)
        fields = {"query": value, "num_v": cfg.num_hops + 1}
        return Draft(
            context=(icl + "\n" if icl else "") + head + context,
            question=tail.format(**fields),
            answer_prefix=family.answer_prefix.format(**fields),
            references=list(all_vars[0]),
            depths=depths,
        )

    return build
