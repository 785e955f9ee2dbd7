"""Official RULER prompts next to ours: key cost, haystack size and fit to the length budget.

Why: ``restkv.eval.benchmarks.ruler`` re-implements RULER's sampling without sharing code with it, so
nothing but a side-by-side run shows whether its prompts have the shape of the official ones on a
given tokenizer. This script runs the official generator of an NVIDIA/RULER checkout
(``scripts/data/prepare.py``, as a subprocess in a virtual environment of its own; nothing of
RULER is imported or copied here) or reads files it made before (``--official-dir``, laid out
``<dir>/<length>/<task>/validation.jsonl``), runs our ``generate`` on the same tokenizer, and
prints one table per length with, official next to ours:

* ``tok/key``: mean tokens of a key as it stands in the prompt (with its leading space): the
  queried keys of ``niah_*``, the answers of ``vt`` (variable names), ``cwe`` and ``fwe`` (words);
* ``items``: haystack per prompt, mean [min-max]: noise lines (niah_single_1, vt), essay words,
  distractor needles (niah_multikey_2/3), distinct words of the list (cwe), coded words (fwe);
* prompt tokens over the budget (length minus RULER's tokens to generate): min, p10, median, max,
  and how many prompts fall under 60 % of it. A prompt is the input plus its answer prefix,
  tokenized with ``add_special_tokens=False`` by the one tokenizer, for both sides.

Both sides are measured on their text by the same code. Run from the repository root with the
project importable (installed, or ``PYTHONPATH=.``), e.g.::

    python scripts/compare_ruler_generators.py --ruler ../RULER --python ../ruler-venv/bin/python \
        --tokenizer models/micro-llama --lengths 1024 2048 --samples 20

Deterministic for a given command; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from restkv.eval.benchmarks import ruler
from restkv.eval.benchmarks.shared.haystack import load_haystack

NEEDLE = re.compile(r"One of the special magic \w+ for (.+?) is: (\S+?)\.")
QUERY = re.compile(r"for (.+) mentioned in the provided text\?\s*$")
VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
CWE_HEAD = "Memorize the ones that appear most often.\n"
FWE_HEAD = "Find the three most frequently appeared coded words. "
QUESTION = "\nQuestion:"
LABELS = {"noise": "noise lines", "needle": "distractors", "essay": "essay words", "variable_tracking": "noise lines"}
LABELS |= {"common_words_extraction": "distinct words", "freq_words_extraction": "coded words"}
PROBE = """import json, importlib.metadata as md, nltk.data, nltk.tokenize
out = {name: md.version(name) for name in ("wonderwords", "nltk", "transformers", "tokenizers")}
f = nltk.tokenize.sent_tokenize
out["sent_tokenize"] = f.__module__ + "." + f.__qualname__
try: out["punkt_tab"] = str(nltk.data.find("tokenizers/punkt_tab/english/"))
except LookupError: out["punkt_tab"] = "missing"
print(json.dumps(out))"""  # run by the official venv's python: versions, and whether punkt is real


@dataclass
class Prompt:
    text: str  # the prompt without its answer prefix
    prefix: str
    keys: list[str]
    length: int | None = None  # the official record's "length" (prompt tokens + tokens to generate)


def query_keys(text: str) -> list[str]:
    """The queried keys of a niah prompt ("for a, b, and c mentioned in the provided text?")."""
    match = QUERY.search(text)
    return re.split(r", and |, ", match.group(1)) if match else []


def numbered(listing: str) -> list[str]:
    """The entries of "1. w 2. x 3. y" (entries may hold spaces)."""
    return re.split(r"(?:^| )\d+\. ", listing.strip())[1:]


def noise_lines(text: str) -> int:
    return sum(line.strip() == ruler.NOISE_SENTENCE for line in text.split("\n"))


def items(task: str, text: str) -> tuple[int, int | None]:
    """Haystack units of one prompt, and for vt the noise lines of its in-context example."""
    cfg = ruler.TASK_CONFIGS[task]
    if isinstance(cfg, ruler.Niah):
        if cfg.type_haystack == "noise":
            return noise_lines(text), None
        if cfg.type_haystack == "needle":
            keys = set(query_keys(text))
            lines = [NEEDLE.fullmatch(line) for line in text.split("\n")]
            return sum(1 for m in lines if m and m.group(1) not in keys), None
        essay = " ".join(text.split("\n")[1:-1])
        return len(NEEDLE.sub(" ", essay).split()), None
    if isinstance(cfg, ruler.VariableTracking):
        icl, _, main = text.rpartition(VT_HEAD)
        return noise_lines(main), noise_lines(icl)
    if cfg.family == "common_words_extraction":
        return len(set(numbered(text.rpartition(CWE_HEAD)[2].rpartition(QUESTION)[0]))), None
    return len(text.partition(FWE_HEAD)[2].rpartition(QUESTION)[0].split()), None


def items_label(task: str) -> str:
    cfg = ruler.TASK_CONFIGS[task]
    return LABELS[cfg.type_haystack if isinstance(cfg, ruler.Niah) else cfg.family]


def run_official(args: argparse.Namespace, root: Path, length: int, task: str) -> None:
    """prepare.py for one task and length into ``root/<length>``; raises with its output if no file."""
    python = Path(args.python).absolute()  # not resolved: a venv's python is a symlink
    env = dict(os.environ, PATH=f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}")  # it calls `python`
    tokenizer = str(Path(args.tokenizer).absolute()) if Path(args.tokenizer).exists() else args.tokenizer
    cmd = [str(python), "prepare.py", "--benchmark", "synthetic", "--tokenizer_type", "hf"]
    cmd += ["--tokenizer_path", tokenizer, "--save_dir", str(root / str(length)), "--task", task]
    cmd += ["--num_samples", str(args.samples), "--max_seq_length", str(length), "--model_template_type", "base"]
    proc = subprocess.run(cmd, cwd=args.ruler / "scripts" / "data", env=env, capture_output=True, text=True)
    out = root / str(length) / task / "validation.jsonl"
    if proc.returncode or not out.is_file():  # prepare.py reports a failed generator and exits 0
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"official generator made no {out} (exit {proc.returncode}):\n{tail}")


def load_official(root: Path, length: int, task: str, samples: int) -> list[Prompt]:
    path = root / str(length) / task / "validation.jsonl"
    if not path.is_file():
        raise SystemExit(f"missing {path}: generate it, or leave out --official-dir to run the generator")
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(records) < samples:
        raise SystemExit(f"{path} has {len(records)} records, fewer than --samples {samples}")
    niah = isinstance(ruler.TASK_CONFIGS[task], ruler.Niah)
    keys = [query_keys(r["input"]) if niah else list(r["outputs"]) for r in records[:samples]]
    return [Prompt(r["input"], r["answer_prefix"], k, r["length"]) for r, k in zip(records, keys, strict=False)]


def run_ours(task: str, tokenizer: Any, length: int, args: argparse.Namespace, fit_ok: bool) -> list[Prompt]:
    kwargs = {"fit": args.fit} if args.fit and fit_ok else {}
    samples = ruler.generate(task, tokenizer, length, args.samples, args.seed, **kwargs)
    niah = isinstance(ruler.TASK_CONFIGS[task], ruler.Niah)
    prompts = []
    for s in samples:
        text = s.context + s.question
        keys = (list(s.meta["keys"]) if "keys" in s.meta else query_keys(text)) if niah else list(s.references)
        prompts.append(Prompt(text, s.answer_prefix, keys))
    return prompts


@dataclass
class Stats:
    tok_key: float = math.nan
    items: list[int] = field(default_factory=list)
    icl: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def measure(task: str, prompts: list[Prompt], tokenizer: Any) -> Stats:
    def count(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    keys = [" " + k for p in prompts for k in p.keys]
    counted = [items(task, p.text) for p in prompts]
    return Stats(
        tok_key=statistics.fmean(count(keys)) if keys else math.nan,
        items=[n for n, _ in counted],
        icl=[n for _, n in counted if n is not None],
        tokens=count([p.text + p.prefix for p in prompts]),
    )


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def items_cell(values: list[int]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    return f"{mean:.1f}" if min(values) == max(values) and mean < 100 else f"{mean:.0f} [{min(values)}-{max(values)}]"


def row(task: str, budget: int, stats: list[Stats]) -> list[str]:
    cells = [task, items_label(task), str(budget)]
    cells += [f"{s.tok_key:.2f}" if s.tokens else "-" for s in stats] + [items_cell(s.items) for s in stats]
    for q in (0.0, 0.1, 0.5, 1.0):
        cells += [f"{nearest_rank([t / budget for t in s.tokens], q):.3f}" if s.tokens else "-" for s in stats]
    return cells + [f"{sum(t < 0.6 * budget for t in s.tokens)}/{len(s.tokens)}" if s.tokens else "-" for s in stats]


def table(groups: list[tuple[str, list[str]]], rows: list[list[str]], left: int) -> list[str]:
    """Aligned columns under group labels; the first ``left`` columns are left-aligned."""
    heads = [h for _, hs in groups for h in hs]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    top, col = [], 0
    for label, hs in groups:
        span = list(range(col, col + len(hs)))
        col += len(hs)
        widths[span[-1]] += max(0, len(label) - sum(widths[i] + 2 for i in span) + 2)
        top.append(label.center(sum(widths[i] + 2 for i in span) - 2))

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in pairs).rstrip()

    return ["  ".join(top).rstrip(), line(heads), *(line(r) for r in rows)]


def compare(args: argparse.Namespace, root: Path, length: int, tokenizer: Any, fit_ok: bool) -> list[str]:
    """The table for one length, and notes below it."""
    rows, notes, matched, checked, over = [], [], 0, 0, [0, 0]
    for task in args.tasks:
        if not args.official_dir:
            print(f"[official] {task} @ {length}", file=sys.stderr)
            run_official(args, root, length, task)
        official = load_official(root, length, task, args.samples)
        print(f"[ours] {task} @ {length}", file=sys.stderr)
        ttg = ruler.max_new_tokens(task)
        budget = length - ttg
        stats = [measure(task, official, tokenizer), Stats()]
        try:
            stats[1] = measure(task, run_ours(task, tokenizer, length, args, fit_ok), tokenizer)
        except ValueError as error:  # ours refuses a task that cannot fit: keep the official side
            notes.append(f"ours failed on {task}: {error}")
        matched += sum(p.length == t + ttg for p, t in zip(official, stats[0].tokens, strict=True))
        checked += len(official)
        over = [o + sum(t > budget for t in s.tokens) for o, s in zip(over, stats, strict=True)]
        if stats[0].icl:
            notes.append(
                f"{task} in-context example, noise lines: official {items_cell(stats[0].icl)}, "
                f"ours {items_cell(stats[1].icl)}"
            )
        rows.append(row(task, budget, stats))
    pair = ["off", "ours"]
    groups = [("", ["task", "items", "budget"]), ("tok/key", pair), ("items per prompt", pair)]
    groups += [(f"{name} tokens/budget", pair) for name in ("min", "p10", "median", "max")]
    notes.append(f"official 'length' = re-tokenized prompt + tokens to generate: {matched}/{checked}")
    notes.append(f"prompts over budget: official {over[0]}, ours {over[1]}")
    title = f"== max_seq_length {length} (budget = length - tokens to generate) =="
    return ["", title, *table([*groups, ("< 60 %", pair)], rows, left=2), *(f"  {n}" for n in notes)]


def version(name: str) -> str:
    try:
        return f"{name} {importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{name} missing"


def git(folder: Path, *cmd: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *cmd], capture_output=True, text=True).stdout.strip()


def header(args: argparse.Namespace, fit_ok: bool) -> list[str]:
    lines = ["command: " + shlex.join([sys.executable, *sys.argv])]
    if args.ruler:
        lines.append(f"RULER checkout: {args.ruler}, commit {git(args.ruler, 'rev-parse', 'HEAD') or 'unknown'}")
        lines += [f"  local change: {s}" for s in git(args.ruler, "status", "--porcelain").split("\n") if s]
        folder = args.ruler / "scripts" / "data" / "synthetic" / "json"
        words = folder / "english_words.json"
        text = words.read_text(encoding="utf-8") if words.is_file() else ""
        kind = "Git LFS pointer" if text.startswith("version https://git-lfs") else None
        kind = kind or (f"{len(json.loads(text))} words" if text.strip() else "missing")
        lines.append(f"  english_words.json (cwe beyond the wonderwords pool): {kind}")
        essay = folder / "PaulGrahamEssays.json"
        if essay.is_file():
            same = json.loads(essay.read_text(encoding="utf-8"))["text"].split() == load_haystack(None).split()
            lines.append(f"  PaulGrahamEssays.json: {'same words as' if same else 'differs from'} our default haystack")
    if args.python:
        probe = subprocess.run([args.python, "-c", PROBE], capture_output=True, text=True)
        info = json.loads(probe.stdout) if probe.returncode == 0 else {"probe": probe.stderr.strip()[-200:]}
        split, punkt = info.pop("sent_tokenize", "unknown"), info.pop("punkt_tab", "missing")
        lines.append("official venv: " + ", ".join(f"{k} {v}" for k, v in info.items()))
        how = f"NLTK punkt, {punkt}" if punkt != "missing" else "NLTK punkt data missing: essay tasks fail"
        how = how if split == "nltk.tokenize.sent_tokenize" else f"SHIM: sent_tokenize is {split}, not NLTK punkt"
        lines.append(f"official essay sentences: {how}")
    where = Path(inspect.getfile(ruler)).parent
    commit = git(where, "rev-parse", "HEAD")
    state = (", uncommitted changes" if git(where, "status", "--porcelain", ".") else ", clean") if commit else ""
    lines.append(f"ours: {', '.join(map(version, ('wonderwords', 'transformers', 'tokenizers')))}")
    lines.append(f"ours: {inspect.getfile(ruler)}, commit {commit or 'unknown'}{state}")
    keywords = [str(p) for p in inspect.signature(ruler.generate).parameters.values() if p.kind == p.KEYWORD_ONLY]
    fit = f"fit={args.fit!r}" if args.fit and fit_ok else "no fit= (generator default)"
    if args.fit and not fit_ok:
        fit += f"; --fit {args.fit} ignored: this generate() has no fit= keyword"
    lines.append(f"ours: generate(seed={args.seed}, data=None), {fit}; keyword-only: {', '.join(keywords) or 'none'}")
    source = f"read from {args.official_dir}" if args.official_dir else "generated now (random_seed 42)"
    lines.append(f"official files: {source}; tokenizer {args.tokenizer}; {args.samples} samples per task")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ruler", type=Path, help="NVIDIA/RULER checkout (needed unless --official-dir)")
    parser.add_argument("--python", help="python of a venv where RULER's generator runs")
    parser.add_argument("--tokenizer", required=True, help="tokenizer folder or hub id (both sides)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--tasks", nargs="+", default=list(ruler.OFFLINE_TASKS), choices=ruler.OFFLINE_TASKS)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="our generator's seed")
    parser.add_argument("--official-dir", type=Path, help="reuse <dir>/<length>/<task>/validation.jsonl")
    parser.add_argument("--fit", choices=["official", "exact"], help="passed to our generate() if it takes fit=")
    args = parser.parse_args()
    if not args.official_dir and not (args.ruler and args.python):
        parser.error("give --ruler and --python to run the official generator, or --official-dir")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    fit_ok = "fit" in inspect.signature(ruler.generate).parameters
    print("\n".join(header(args, fit_ok)))
    with tempfile.TemporaryDirectory(prefix="ruler-official-") as tmp:
        for length in args.lengths:
            print("\n".join(compare(args, args.official_dir or Path(tmp), length, tokenizer, fit_ok)))


if __name__ == "__main__":
    main()
