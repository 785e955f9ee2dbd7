"""The evaluation loop behind ``eval/run.py``: build everything from a config, answer, score, save."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from eval.evaluation import Evaluation, Session
from eval.generation import PROTOCOLS
from eval.models import ModelSpec, eos_token_ids, load_model, load_tokenizer, weights_fingerprint
from eval.prompting import tokenize
from eval.results import PredictionLog, format_table, run_folder, summarize, write_metrics
from eval.sample import Sample
from restkv import Budget, compress
from restkv.devices import pick_device

if not OmegaConf.has_resolver("range_list"):
    # ${range_list:start,stop,step} in configs, e.g. NIAH's 1000..32000 step 200 length grid
    OmegaConf.register_new_resolver(
        "range_list", lambda start, stop, step: list(range(int(start), int(stop), int(step)))
    )


@dataclass
class RunSettings:
    """What names the run: config group choices and the overrides hashed into the folder name."""

    bench: str
    model: str
    policy: str
    overrides: list[str] = field(default_factory=list)
    out_dir: Path = Path("results")


def model_spec(cfg: DictConfig) -> ModelSpec:
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    allowed = set(ModelSpec.__dataclass_fields__)
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ValueError(f"model config has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    return ModelSpec(**values)  # type: ignore[arg-type]


def prepare_folder(cfg: DictConfig, settings: RunSettings, budget: Budget, weights: str | None) -> Path:
    folder = run_folder(
        settings.out_dir, settings.bench, settings.model, settings.policy, str(budget), settings.overrides
    )
    folder.mkdir(parents=True, exist_ok=True)
    check_weights(folder, weights)
    resolved = OmegaConf.to_yaml(cfg, resolve=True)
    saved = folder / "config.yaml"
    if saved.exists() and saved.read_text() != resolved:
        print(
            f"warning: {saved} differs from this run's configuration; results are resumed regardless", file=sys.stderr
        )
    saved.write_text(resolved)
    return folder


WEIGHTS_FILE = "weights_fingerprint.txt"


def check_weights(folder: Path, fingerprint: str | None) -> None:
    """Refuse to resume a run folder whose predictions came from other weights of the same model."""
    if fingerprint is None:
        return
    saved = folder / WEIGHTS_FILE
    previous = saved.read_text().strip() if saved.exists() else fingerprint
    if previous != fingerprint:
        raise RuntimeError(
            f"{folder} holds predictions of other weights of this model (fingerprint {previous}, "
            f"now {fingerprint}): the model folder changed since. Move or delete that run folder, "
            "or pass out_dir=... to keep both"
        )
    saved.write_text(fingerprint + "\n")


def record_for(sample: Sample, prompt: Any, outcome: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": sample.id,
        "task": sample.task,
        "context_length": prompt.length,
        "truncated_tokens": prompt.truncated,
        **outcome,
        "kept_tokens": round(outcome["kept_tokens"], 2),
        "references": sample.references,
        "meta": sample.meta,
    }


def run_benchmark(cfg: DictConfig, settings: RunSettings) -> dict[str, Any]:
    """Evaluate every sample not yet in the run folder; write metrics; return the summary."""
    if cfg.protocol not in PROTOCOLS:
        raise ValueError(f"protocol={cfg.protocol!r} is not allowed; choose one of: {', '.join(PROTOCOLS)}")
    budget = Budget(cfg.budget)
    policy = instantiate(cfg.policy, _convert_="all")
    benchmark = instantiate(cfg.bench, _convert_="all")
    evaluation: Evaluation = instantiate(cfg.evaluation, _convert_="all")
    spec = model_spec(cfg.model)
    folder = prepare_folder(cfg, settings, budget, weights_fingerprint(spec))

    tokenizer = load_tokenizer(spec)
    samples = list(benchmark.load_samples(tokenizer))
    if cfg.limit is not None:
        samples = samples[: int(cfg.limit)]
    task_order = list(dict.fromkeys(s.task for s in samples))

    with PredictionLog(folder) as log:
        todo = [s for s in samples if not log.done(s.id)]
        if len(todo) < len(samples):
            print(f"resuming {folder}: {len(samples) - len(todo)} of {len(samples)} samples already done")
        if todo:
            model = load_model(spec, pick_device(cfg.device))
            eos = eos_token_ids(model, tokenizer)
            bar = tqdm(todo, desc=f"{settings.bench}/{settings.policy}@{budget}", unit="sample", dynamic_ncols=True)
            with compress(model, policy, budget) as compressor:
                session = Session(model, tokenizer, compressor, cfg.protocol, eos)
                for sample in bar:
                    prompt = tokenize(sample, tokenizer, spec.chat_template, spec.max_context)
                    outcome = evaluation.evaluate(benchmark, session, sample, prompt)
                    log.append(record_for(sample, prompt, outcome))
                    bar.set_postfix(score=f"{100 * outcome['score']:.0f}")
        records = [log.records[s.id] for s in samples if s.id in log.records]

    summary = summarize(records, task_order)
    summary.update(
        bench=settings.bench, model=settings.model, policy=settings.policy, budget=str(budget), protocol=cfg.protocol
    )
    extra = getattr(benchmark, "report", None)  # optional: see eval.benchmarks.base.Benchmark
    if extra is not None:
        summary.update(extra(records, folder))
    summary.update(evaluation.report(records))
    write_metrics(folder, summary)
    print(format_table(summary, title=f"{settings.bench} | {settings.model} | {settings.policy} | budget {budget}"))
    print(f"results: {folder}")
    return summary
