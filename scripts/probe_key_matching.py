"""Does a model find the value of a named key among several? A short probe, no haystack.

Prompts list ``keys`` RULER word keys with 7-digit values, one per line, then name one key; the
model must generate its value (greedy, exact match). Three formats with more and more text
between a key and its value: ``key value`` (an induction head suffices), ``key: value``, and
RULER's needle sentence with RULER's question. It separates a model that matches keys from one that
copies *a* value (chance: 1 / keys). The micro model's card reports it for both training recipes.

    python scripts/probe_key_matching.py --model models/micro-llama
"""

from __future__ import annotations

import argparse
import random

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from restkv.eval.benchmarks import ruler
from restkv.microtrain.config import EXPORT_DIR

FORMATS: dict[str, tuple[str, str]] = {
    "key value": ("{k} {v}.", "{k}"),
    "key: value": ("{k}: {v}.", "{k}:"),
    "ruler needle": (
        ruler.NEEDLE_TEMPLATE.format(type_needle_v="numbers", key="{k}", value="{v}"),
        "What is the special magic number for {k} mentioned in the provided text? "
        "The special magic number for {k} mentioned in the provided text is",
    ),
}


def prompt(line: str, query: str, keys: int, seed: str) -> tuple[str, str]:
    """The prompt and the expected value of one probe."""
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < keys:
        key = ruler.random_value(rng, "words")
        if key not in names:
            names.append(key)
    values = [ruler.random_value(rng, "numbers") for _ in names]
    pick = rng.randrange(keys)
    lines = "\n".join(line.format(k=k, v=v) for k, v in zip(names, values, strict=True))
    return f"{lines}\n{query.format(k=names[pick])}", values[pick]


@torch.no_grad()
def main() -> None:
    """Probe every format at every number of keys and print the exact-match counts."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(EXPORT_DIR))
    parser.add_argument("--keys", default="2,4,8", help="comma-separated numbers of keys per prompt")
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    for name, (line, query) in FORMATS.items():
        for keys in (int(k) for k in args.keys.split(",")):
            hits = 0
            for i in range(args.samples):
                text, value = prompt(line, query, keys, f"probe/{keys}/{i}")
                ids = tokenizer(text, return_tensors="pt").input_ids
                gold = tokenizer(" " + value, add_special_tokens=False).input_ids
                out = model.generate(ids, max_new_tokens=len(gold), do_sample=False)
                hits += out[0, ids.shape[1] :].tolist() == gold
            print(f"{name:13s} keys={keys}: {hits}/{args.samples} exact (chance {1 / keys:.0%})", flush=True)


if __name__ == "__main__":
    main()
