"""The evaluation loop behind ``eval/run.py``: build everything from a config, answer, score, save."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import restkv.eval.harness.config_tree  # noqa: F401  (the tree's typed nodes and resolvers, wherever the run composes)
from restkv import Budget, compress
from restkv.chunked_prefill import check_chunked_prefill, enable_chunked_prefill
from restkv.devices import pick_device
from restkv.eval.benchmarks.contract.reads import recording
from restkv.eval.benchmarks.contract.sample import Sample
from restkv.eval.evaluation import Evaluation, Session
from restkv.eval.evaluation.prompting import tokenize
from restkv.eval.harness.decode_plan import DecodePlan, plan_decode
from restkv.eval.harness.folder_state import mean_answer_length
from restkv.eval.harness.identity import claimed_folder, run_identity
from restkv.eval.harness.run_folder import (
    PredictionLog,
    RunLock,
    check_run_files,
    format_table,
    run_folder,
    summarize,
    write_metrics,
)
from restkv.eval.harness.settings import Settings, added_settings
from restkv.eval.harness.validate import check_config
from restkv.eval.models.fingerprint import input_digests, weights_fingerprint
from restkv.eval.models.loading import eos_token_ids, load_model, load_tokenizer, local_config, resolve
from restkv.eval.models.placement import check_device_map
from restkv.eval.models.spec import ModelSpec, check_attention_backend, check_model, model_spec
from restkv.fastpath import CHECKS, with_fallbacks
from restkv.interop.press_hooks import press_hooks, route_summary
from restkv.registry import policy_defaults, resolve_policy
from restkv.storage.pipeline import check_storage
from restkv.storage.quantize import Quantization


@dataclass
class RunSettings:
    """What names the run: config group choices and the overrides hashed into the folder name."""

    bench: str
    model: str
    policy: str
    overrides: list[str] = field(default_factory=list)
    out_dir: Path = Path("results")


class SkippedWork(RuntimeError):
    """The benchmark cannot run every requested task (``allow_skips=true`` runs the others)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run: its message says what is saved and how to go on (`restkv.eval.harness.errors`)."""


class EmptyRun(ValueError):
    """The run has no sample to evaluate."""


@dataclass
class Plan:
    """Everything a run needs, built and checked before anything is written."""

    spec: ModelSpec
    device: Any
    budget: Budget
    policy: Any
    benchmark: Any
    evaluation: Evaluation
    tokenizer: Any
    samples: list[Sample]
    skipped: dict[str, str]
    identity: dict[str, Any]
    folder: Path
    settings: Settings = field(default_factory=Settings)
    """The run-level settings, checked (`restkv.eval.harness.settings`): what the run reads after the plan."""
    quantization: Quantization = field(default_factory=Quantization)
    decode: DecodePlan = field(default_factory=DecodePlan)
    """How the run decodes (`restkv.eval.harness.decode_plan`): the path, prompts per step, decode-time eviction."""


def plan_run(cfg: DictConfig, settings: RunSettings) -> Plan:
    """Check every setting, build the parts and the samples; raise before any folder exists."""
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    run = check_config(values)
    quantization = quantization_of(values.get("quantization", {}))
    spec = model_spec(cfg.model)
    check_model(spec)
    device = pick_device(run.device)
    check_attention_backend(spec, device.type)
    check_device_map(spec.device_map, device)
    budget = Budget(run.budget)
    policy = instantiate(cfg.policy, _convert_="all")
    model_config = local_config(spec)
    check_storage(policy, run.layout, quantization, model_config)
    if model_config is not None:
        policy.check_model(model_config)
    policy.check_budget(budget)
    check_files = getattr(policy, "check_files", None)  # optional: per-model files a policy fetches (kvpress's)
    if check_files is not None:
        check_files(resolve(spec.path), model_config)
    benchmark = instantiate(cfg.bench, _convert_="all")
    if hasattr(benchmark, "check_data"):
        benchmark.check_data()  # task files missing where the hub cannot supply them: before the tokenizer loads
    evaluation: Evaluation = instantiate(cfg.evaluation, _convert_="all")
    decode = plan_decode(run, device, evaluation, quantization, policy)
    tokenizer = load_tokenizer(spec)
    with recording() as read:  # every data file the benchmark reads belongs to the run's identity
        samples = list(benchmark.load_samples(tokenizer))
    available = len(samples)
    if run.limit is not None:
        samples = samples[: run.limit]
    skipped = dict(getattr(benchmark, "skipped", {}))  # optional: see restkv.eval.benchmarks.contract.base.Benchmark
    if not samples:
        why = f"; skipped: {_listed(skipped)}" if skipped else " (check bench.tasks and the benchmark's data files)"
        raise EmptyRun(f"bench={settings.bench} gives no sample to run{why}")
    check_samples = getattr(evaluation, "check_samples", None)  # optional: what the strategy needs of each sample
    if check_samples is not None:
        check_samples(benchmark, samples)
    if skipped and not run.allow_skips:
        raise SkippedWork(
            f"bench={settings.bench} cannot run every task ({_listed(skipped)}). Nothing was run. Provide "
            f"the data, drop the task from bench.tasks, or pass allow_skips=true to run the other "
            f"{len(samples)} of {available} samples and record the skip in metrics.json"
        )
    folder = folder_of(settings, budget)
    identity = run_identity(values, weights_fingerprint(spec), input_digests([*read, *policy.input_files()]))
    parts = (spec, device, budget, policy, benchmark, evaluation, tokenizer, samples, skipped, identity, folder)
    chunk = run.compression.prefill_chunk
    if chunk is not None:  # the policy, the decode-time eviction and the model's config allow it
        check_chunked_prefill(policy, chunk, model_config, decode.eviction)
    return Plan(*parts, settings=run, quantization=quantization, decode=decode)


def folder_of(settings: RunSettings, budget: Budget) -> Path:
    """The folder a run writes to: named by ``out_dir``, bench, model, policy, budget and the other
    overrides' hash only (never by the launcher, the device or the logger)."""
    return run_folder(
        settings.out_dir, settings.bench, settings.model, settings.policy, str(budget), settings.overrides
    )


def quantization_of(node: dict[str, Any]) -> Quantization:
    """The ``quantization`` config group as a `Quantization` (unknown keys named)."""
    unknown = sorted(set(node) - set(Quantization.__dataclass_fields__))
    if unknown:
        allowed = ", ".join(Quantization.__dataclass_fields__)
        raise ValueError(f"quantization.{unknown[0]} is not a quantization setting; allowed: {allowed}")
    return Quantization(**node)


def _listed(skipped: dict[str, str]) -> str:
    return "; ".join(f"{task}: {reason.rstrip('.')}" for task, reason in skipped.items())


def cache_size(compressor: Any) -> dict[str, Any]:
    """The last prefill's cache after eviction, summed over layers: tokens x heads kept, their bytes, and
    the bytes allocated (the decode reserve included); empty when the compressor was paused."""
    sizes = compressor.record.size_summary() if compressor.active and compressor.record.sizes else None
    if sizes is None:
        return {}
    summary = {f"cache_{key}": sizes[key] for key in ("head_tokens", "logical_bytes", "allocated_bytes")}
    summary.update(compressor.record.extras())  # a scoring pass's extra forwards (KVzip), the kvpress route
    decoder = getattr(compressor, "decoder", None)
    if decoder is not None:  # cache size over time: mean tokens per layer after each decoding step that cut
        summary["decode_cache"] = [[e["step"], round(sum(e["tokens"]) / len(e["tokens"]), 1)] for e in decoder.sizes]
    return summary


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


def evaluate_missing(plan: Plan, log: PredictionLog, title: str) -> None:
    """Evaluate the samples not yet in ``log``, appending each record as it finishes."""
    todo = [s for s in plan.samples if not log.done(s.id)]
    if len(todo) < len(plan.samples):
        print(f"resuming {log.folder}: {len(plan.samples) - len(todo)} of {len(plan.samples)} samples already done")
    if not todo:
        return
    spec = plan.spec
    model = load_model(spec, plan.device)
    eos = eos_token_ids(model, plan.tokenizer)
    bar = tqdm(total=len(todo), desc=title, unit="sample", dynamic_ncols=True)
    with (
        bar,  # closed before any message about a stop is printed
        press_hooks(model, plan.policy, plan.budget),  # kvpress's own hooks, for presses on that route
        compress(
            model,
            plan.policy,
            plan.budget,
            layout=plan.settings.layout,
            quantization=plan.quantization,
            decode_eviction=plan.decode.eviction,
        ) as compressor,
    ):
        chunk = plan.settings.compression.prefill_chunk
        enable_chunked_prefill(compressor, chunk)
        chunked = {"prefill_chunk": chunk} if chunk else {}  # recorded with each sample that ran in chunks
        session = Session(model, plan.tokenizer, compressor, plan.settings.protocol, eos, plan.decode.path)
        for sample, prompt, outcome in outcomes(plan, session, todo, lambda: cache_size(compressor)):
            log.append(record_for(sample, prompt, {**outcome, **chunked}))
            bar.update(1)
            bar.set_postfix(score=f"{100 * outcome['score']:.0f}")


def outcomes(
    plan: Plan, session: Session, todo: list[Sample], snapshot: Callable[[], dict[str, Any]]
) -> Iterator[tuple[Sample, Any, dict[str, Any]]]:
    """Each sample's outcome, in order, with the cache it kept (``snapshot()`` after its prefill) and the batch it
    was decoded in: one at a time, or ``plan.decode.rows`` prompts per decode step."""
    spec = plan.spec
    prompts = ((s, tokenize(s, plan.tokenizer, spec.chat_template, spec.max_context)) for s in todo)
    if plan.decode.rows == 1:
        for sample, prompt in prompts:
            CHECKS.drain()  # what a fast path's check decides from here on is this sample's
            outcome = plan.evaluation.evaluate(plan.benchmark, session, sample, prompt)
            yield sample, prompt, with_fallbacks({**outcome, **snapshot(), "decode_batch": 1}, CHECKS.drain())
        return
    evaluate_many = plan.evaluation.evaluate_many  # type: ignore[attr-defined]
    yield from evaluate_many(plan.benchmark, session, list(prompts), plan.decode.rows, snapshot)


def cache_summary(records: list[dict[str, Any]], layout: str, quantization: Quantization) -> dict[str, Any]:
    """The layout, the quantization and the mean cache size per sample (records from before sizes were
    recorded lack them; a quantized cache's bytes are those it stores, scales and residual included)."""
    sized = [r for r in records if "cache_allocated_bytes" in r]
    means = {
        f"{key}_mean": round(sum(r[f"cache_{key}"] for r in sized) / len(sized))
        for key in ("head_tokens", "logical_bytes", "allocated_bytes")
        if sized
    }
    kept = {"layout": layout, "quantization": quantization.describe(), "samples_measured": len(sized), **means}
    return {**kept, **route_summary(records)}  # kvpress's hooks route, if it ran


def folder_records(plan: Plan, log: PredictionLog) -> list[dict[str, Any]]:
    """Every record the folder holds: the planned samples' in their order, then those a run without ``limit`` (or
    with a higher one) wrote. A folder holds one experiment, so ``metrics.json`` covers all of them: a rerun with a
    lower ``limit`` never shrinks it."""
    planned = [s.id for s in plan.samples]
    ordered = [log.records[key] for key in planned if key in log.records]
    known = set(planned)
    return ordered + [record for key, record in log.records.items() if key not in known]


def summary_of(plan: Plan, records: list[dict[str, Any]], folder: Path, settings: RunSettings):
    """``metrics.json``'s content: scores, what ran and what was skipped, benchmark and strategy extras."""
    task_order = list(dict.fromkeys([*(s.task for s in plan.samples), *(str(r["task"]) for r in records)]))
    summary = summarize(records, task_order)
    summary.update(
        bench=settings.bench,
        model=settings.model,
        policy=settings.policy,
        budget=str(plan.budget),
        protocol=plan.settings.protocol,
        ran={"tasks": task_order, "samples": len(records), "limit": plan.settings.limit},
        skipped=plan.skipped,
        cache=cache_summary(records, plan.settings.layout, plan.quantization),
        decode=decode_summary(records, plan.settings.decode, plan.decode.rows),
        answer_length=round(mean_answer_length(records), 3),  # mean generated tokens: the reports read it here
    )
    if plan.settings.compression.prefill_chunk:
        summary["prefill_chunk"] = plan.settings.compression.prefill_chunk
    extra = getattr(plan.benchmark, "report", None)  # optional: see restkv.eval.benchmarks.contract.base.Benchmark
    if extra is not None:
        summary.update(extra(records, folder))
    summary.update(plan.evaluation.report(records))
    return summary


def decode_summary(records: list[dict[str, Any]], setting: str, batch: int | str) -> dict[str, Any]:
    """The ``decode`` setting and how many samples each path decoded, how many samples each fast path's fallback
    (`restkv.fastpath`) affected, by its message, the batch setting and how many samples each batch size decoded
    (a resumed run may mix machines)."""
    paths = Counter(r["decode_path"] for r in records if "decode_path" in r)
    sizes = Counter(r["decode_batch"] for r in records if "decode_batch" in r)
    fallbacks = Counter(message for r in records for message in r.get("fallbacks", []))
    return {
        "setting": setting,
        "paths": dict(sorted(paths.items())),
        "fallbacks": dict(sorted(fallbacks.items())),
        "batch": {"setting": batch, "sizes": {str(k): v for k, v in sorted(sizes.items())}},
    }


ADDED_SETTINGS = {**added_settings(), "quantization": asdict(Quantization())}
"""Top-level settings added after run folders existed, at the value that reproduces what ran before them: the
run-level settings' (declared with them, `restkv.eval.harness.settings`) and the ``quantization`` group's."""


def added_defaults(policy: str, identity: dict[str, Any]) -> dict[tuple, Any]:
    """What an identity written by an earlier restkv may lack and still be this run: every knob of the
    policy at its default, the top-level settings added since, and the data files' hashes (taken to be the
    files read now; see `restkv.eval.harness.identity`)."""
    try:
        knobs = policy_defaults(policy)
        knobs.update(getattr(resolve_policy(policy)[0], "knobs_before_they_existed", {}))
    except ValueError:
        knobs = {}
    defaults: dict[tuple, Any] = {("config", "policy", k): v for k, v in knobs.items()}
    for key, value in ADDED_SETTINGS.items():  # the setting whole (folders from before it), then each of its leaves
        defaults[("config", key)] = value  # (folders from before a leaf was added: compression.decode_schedule)
        if isinstance(value, dict):
            defaults.update({("config", key, leaf): v for leaf, v in value.items()})
    defaults[("inputs",)] = identity["inputs"]
    return defaults


def note_unhashed_inputs(folder: Path) -> None:
    """Say so when a folder's identity predates data-file hashing (its data is assumed to be today's)."""
    saved = folder / "identity.json"
    try:
        unhashed = saved.is_file() and "inputs" not in json.loads(saved.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # unreadable: claimed_folder says so
    if unhashed:
        print(f"note: {saved} predates data-file hashing: the data files read now are taken to be the ones it read")


def run_benchmark(
    cfg: DictConfig, settings: RunSettings, on_finished: Callable[[Path, dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Evaluate every sample not yet in the run folder; write metrics; return the summary (``metrics.json``'s
    content, plus ``folder``: the run folder).

    ``on_finished(folder, summary)`` runs once ``metrics.json`` is written, while the folder is still
    locked (``restkv.eval.harness.tracking``: a tracker copying the finished run)."""
    plan = plan_run(cfg, settings)
    on_change = plan.settings.on_change
    defaults = added_defaults(settings.policy, plan.identity)
    note_unhashed_inputs(plan.folder)
    notes = plan.spec.notes_for(settings.bench)  # what this model's scores on this benchmark mean
    for text in notes:
        print(f"note: {text}")
    check_run_files(plan.folder)
    with claimed_folder(plan.folder, plan.identity, on_change, RunLock, defaults) as folder:
        check_run_files(folder)
        (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        with PredictionLog(folder) as log:
            try:
                evaluate_missing(plan, log, f"{settings.bench}/{settings.policy}@{plan.budget}")
            except KeyboardInterrupt:
                saved = sum(log.done(sample.id) for sample in plan.samples)
                raise Interrupted(
                    f"stopped: {saved} of {len(plan.samples)} samples are saved in {folder}; run the same command "
                    "again to resume"
                ) from None
            records = folder_records(plan, log)
        summary = summary_of(plan, records, folder, settings)
        if notes:
            summary["notes"] = notes
        write_metrics(folder, summary)
        if on_finished is not None:
            on_finished(folder, summary)
    title = f"{settings.bench} | {settings.model} | {settings.policy} | budget {plan.budget}"
    print(format_table(summary, title=title))
    print(f"results: {folder}")
    if len(records) > len(plan.samples):
        print(
            f"note: limit={plan.settings.limit} ran the first {len(plan.samples)} samples; metrics.json covers all "
            f"{len(records)} samples this folder holds"
        )
    if plan.skipped:
        print(f"note: skipped {_listed(plan.skipped)} (allowed by allow_skips=true; recorded in metrics.json)")
    for text in notes:
        print(f"note: {text}")
    return {**summary, "folder": str(folder)}  # what metrics.json holds, and where it is
