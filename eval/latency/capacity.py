"""The capacity benchmark (``mode: capacity``): how many prompts a budget lets one device decode at once, and at
what total speed.

For each context, policy and budget (the full cache; fractions of the context; token budgets) one prompt is
prefilled and evicted (timed: the time to first token), its evicted cache becomes a row of the static decoder
that batched decoding uses (`restkv.decoding.rows`, `restkv.decoding.static_decoder.StaticDecoder`), and the
number of rows is grown
(1, 2, 4, ... then bisected) until memory runs out. At the largest batch that fits, every row holds that
prompt's cache (the same bytes and work as as many distinct prompts of that length) and the step runs
``warmup`` then ``repeats`` windows of ``decode_tokens`` steps, recorded as a CUDA graph on CUDA: total
decode tokens per second, peak memory, and the ratio to the bandwidth bound of that batch (every weight and
every row's filled key/value bytes read once per step).

Out of memory is the device's own on CUDA: each tried batch allocates its buffers and runs a step, while a
block the size of the prefill's own peak is held (the next prompt's prefill runs beside the decoding rows).
A CPU has no out-of-memory a search can meet safely, so there it is *simulated*: ``memory_cap_mib`` is a
byte budget and a batch fits when weights + rows x row bytes + the prefill's headroom (the prompt's full
key/value bytes) fit in it (an accounting, stated as such in the record). ``memory_cap_mib`` on CUDA adds
the same accounting to the real limit (a smaller GPU's). On a CPU denormal floats are flushed to zero: the
tiny random-weight model's activations reach them, and a CPU's denormal path made a step up to 100x slower
depending on the cache (measured), which no GPU does. The flag holds for the calling thread only, so CPU
presets run one thread (``threads: 1``; with more, the other threads' work may take the slow path).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from restkv.decoding.rows import row_bytes
from restkv.decoding.static_decoder import StaticDecoder, capacity, round_up, static_form
from restkv.devices import model_devices, synchronize
from restkv.eval.harness.config_tree import configured_policy
from restkv.eval.latency.bounds import GB, measure_bandwidth
from restkv.eval.latency.jobs import build_model
from restkv.eval.latency.modeling import cache_token_bytes, parameter_bytes_read
from restkv.eval.latency.settings import Settings
from restkv.eval.latency.timing import compressor_for, prefill, prompt_ids

FULL = "full"
SIMULATED = (
    "simulated: a batch fits when weights + rows x static row bytes + the prefill's headroom (the prompt's full "
    "key/value bytes) <= memory_cap_mib; peak memory is that accounting, not a measurement"
)
MEASURED = (
    "CUDA: each tried batch allocated and stepped while a block of the prefill's measured peak was held; peak "
    "memory is torch.cuda.max_memory_allocated over the timed decode (weights included)"
)


class OutOfMemory(Exception):
    """A batch does not fit (the device's own out-of-memory, or the simulated budget's)."""


@dataclass(frozen=True)
class Budget:
    """One budget of the sweep: its label and the tokens kept per layer (None: the full cache)."""

    label: str
    tokens: int | None


def budgets_for(context: int, specs: list[Any]) -> list[Budget]:
    """The sweep's budgets at ``context``: ``full``, fractions in (0, 1) of the context, token counts below it."""
    out = []
    for spec in specs:
        if spec == FULL:
            out.append(Budget(FULL, None))
        elif isinstance(spec, float) and 0 < spec < 1:
            out.append(Budget(f"{spec * 100:g}%", max(1, round(context * spec))))
        elif isinstance(spec, int) and not isinstance(spec, bool) and spec > 0:
            if spec < context:
                out.append(Budget(str(spec), spec))
        else:
            raise ValueError(
                f"latency.capacity_budgets: {spec!r} is not allowed; use full, a fraction in (0, 1) or tokens > 0"
            )
    return out


@dataclass
class Fit:
    """What deciding whether ``rows`` fit needs: the model, a prompt's static contents and the memory limit."""

    model: PreTrainedModel
    contents: list[dict[str, Any]]
    max_steps: int
    weights: int
    row: int
    headroom: int
    cap_bytes: int | None

    def accounted(self, rows: int) -> int:
        return self.weights + rows * self.row + self.headroom

    def decoder(self, rows: int, record: bool, position: int) -> StaticDecoder:
        """A decoder of ``rows`` rows, each loaded with the prompt; `OutOfMemory` where they do not fit."""
        if self.cap_bytes is not None and self.accounted(rows) > self.cap_bytes:
            raise OutOfMemory(f"{rows} rows need {self.accounted(rows)} bytes > memory_cap {self.cap_bytes}")
        device = self.model.device
        held = None
        try:
            if device.type == "cuda" and self.headroom:
                held = torch.empty(self.headroom, dtype=torch.uint8, device=device)  # the next prompt's prefill
            decoder = StaticDecoder(self.model, self.contents, self.max_steps, [-1], record, rows)
            self.load(decoder, position)
            return decoder
        except torch.OutOfMemoryError as error:
            raise OutOfMemory(str(error).splitlines()[0]) from None
        finally:
            del held

    def load(self, decoder: StaticDecoder, position: int) -> None:
        first = torch.ones((), dtype=torch.long, device=self.model.device)
        for row in range(decoder.rows):
            decoder.load(self.contents, first, position, row)

    def fits(self, rows: int, position: int) -> bool:
        """Whether ``rows`` rows fit: the accounting where the memory is simulated, else allocated and stepped."""
        if self.model.device.type != "cuda":
            return self.cap_bytes is None or self.accounted(rows) <= self.cap_bytes
        decoder = None
        try:
            decoder = self.decoder(rows, False, position)
            with torch.no_grad():
                decoder.step()
            synchronize(self.model.device)
            return True
        except (OutOfMemory, torch.OutOfMemoryError):
            return False
        finally:
            decoder = None
            torch.cuda.empty_cache()


def largest_batch(fits: Callable[[int], bool], most: int) -> tuple[int, int]:
    """The largest ``rows <= most`` with ``fits(rows)`` (fits is monotone), grown by doubling then bisected;
    returns (rows, tries). 0 where one row does not fit."""
    tries, good, bad = 0, 0, None
    rows = 1
    while rows <= most:
        tries += 1
        if not fits(rows):
            bad = rows
            break
        good, rows = rows, rows * 2
    bad = bad if bad is not None else (most + 1 if good < most else None)
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        tries += 1
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return good, tries


def filled_bytes(contents: list[dict[str, Any]]) -> int:
    """One row's key/value bytes a step must read (the filled slots of every layer's heads)."""
    total = 0
    for c in contents:
        keys, values = c["keys"], c["values"]
        total += sum(c["lengths"]) * (keys.shape[-1] + values.shape[-1]) * keys.element_size()
    return total


def timed_decode(settings: Settings, fit: Fit, rows: int, position: int) -> dict[str, Any]:
    """Decode ``rows`` rows at once: the timed windows' seconds per step and the peak memory of the run."""
    model = fit.model
    device = model.device
    record = device.type == "cuda"
    devices = model_devices(model)
    if record:
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    with torch.no_grad():
        decoder = fit.decoder(rows, record, position)
        if record:
            decoder.capture()
        windows = []
        for window in range(settings.warmup + settings.repeats):
            fit.load(decoder, position)
            synchronize(*devices)
            start = time.perf_counter()
            for _ in range(settings.decode_tokens):
                decoder.advance()
            synchronize(*devices)
            if window >= settings.warmup:
                windows.append((time.perf_counter() - start) / settings.decode_tokens)
    peak = torch.cuda.max_memory_allocated(device) if record else fit.accounted(rows)
    return {"step_seconds": windows, "peak_memory_bytes": int(peak), "decode_path": "graph" if record else "static"}


def measure_case(
    model: PreTrainedModel, settings: Settings, ids: torch.Tensor, policy: str, budget: Budget, bandwidth: float
) -> dict[str, Any]:
    """One (context, policy, budget): time to first token, the largest batch, its throughput and bound."""
    context = ids.shape[1]
    device = model.device
    steps = round_up(settings.decode_tokens + 1, 8)
    entry: dict[str, Any] = {"context": context, "policy": policy, "budget": budget.label, "tokens": budget.tokens}
    with compressor_for(model, configured_policy(policy, settings.policy_knobs), budget.tokens, steps) as compressor:
        seconds = []
        for _ in range(settings.repeats):
            if device.type == "cuda":
                synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                before = torch.cuda.memory_allocated(device)
            run, cache = prefill(model, ids, compressor)
            seconds.append(run.seconds)
            eviction = run.eviction_seconds
            prefill_peak = torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else None
        contents = static_form(cache)
        del cache
        headroom = context * cache_token_bytes(model.config, model.dtype) if prefill_peak is None else prefill_peak
        cap = None if settings.memory_cap_mib is None else settings.memory_cap_mib * 2**20
        fit = Fit(model, contents, steps, parameter_bytes_read(model), row_bytes(contents, steps), headroom, cap)
        rows, tries = largest_batch(lambda n: fit.fits(n, context), settings.capacity_max_batch)
        kept = statistics.fmean(statistics.fmean(c["lengths"]) for c in contents)
        entry.update(
            ttft_seconds=statistics.median(seconds),
            ttft_seconds_all=seconds,
            eviction_seconds=eviction,
            kept_tokens_mean=round(kept, 2),
            row_bytes=fit.row,
            row_kv_bytes=filled_bytes(contents),
            capacity_slots=max(capacity(c, steps) for c in contents),
            prefill_headroom_bytes=int(headroom),
            batch=rows,
            batch_tries=tries,
            batch_capped=rows == settings.capacity_max_batch,
        )
        if rows == 0:
            return {**entry, "tokens_per_second": 0.0, "note": "one row does not fit"}
        decoded = timed_decode(settings, fit, rows, context)
    step = statistics.median(decoded["step_seconds"])
    per_step = fit.weights + rows * (entry["row_kv_bytes"] + settings.decode_tokens / 2 * _token_bytes(contents))
    bound = per_step / (bandwidth * GB)
    return {
        **entry,
        **decoded,
        "seconds_per_step": step,
        "tokens_per_second": rows / step,
        "bytes_read_per_step": int(per_step),
        "bound_tokens_per_second": rows / bound,
        "ratio_to_bound": bound / step,
    }


def _token_bytes(contents: list[dict[str, Any]]) -> int:
    """Bytes one decoded token adds to a row (every layer's stored heads)."""
    return sum(
        c["keys"].shape[1] * (c["keys"].shape[-1] + c["values"].shape[-1]) * c["keys"].element_size() for c in contents
    )


def run(settings: Settings, tick: Callable[[], object] = lambda: None) -> dict[str, Any]:
    """Every context x policy x budget of the preset (the full cache once per context); the raw entries."""
    if settings.resolved_device().type != "cuda" and settings.memory_cap_mib is None:
        raise ValueError(
            "latency.memory_cap_mib=null: on a CPU the capacity search needs a simulated byte budget "
            "(memory_cap_mib, e.g. 64); a real out-of-memory is only met on CUDA"
        )
    if settings.resolved_device().type == "cpu":
        torch.set_flush_denormal(True)  # random weights reach denormal floats, a CPU's slow path (100x, measured)
    model = build_model(settings)
    device = model.device
    bandwidth = measure_bandwidth(device, settings.bandwidth_mib, settings.bandwidth_repeats)
    rate = bandwidth[f"{settings.bound_bandwidth}_gbps"]
    entries = []
    for context in settings.contexts:
        ids = prompt_ids(model, context, settings.seed)
        for _ in range(settings.warmup):  # kernels chosen, allocator warmed: the first timed prefill is not the first
            with compressor_for(model, configured_policy(FULL, {}), None, 0) as compressor:
                prefill(model, ids, compressor)
        budgets = budgets_for(context, list(settings.capacity_budgets))
        cases = [(FULL, b) for b in budgets if b.tokens is None]
        cases += [(p, b) for p in settings.capacity_policies for b in budgets if b.tokens is not None]
        for policy, budget in cases:
            entries.append(measure_case(model, settings, ids, policy, budget, rate))
            tick()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return {
        "entries": entries,
        "bandwidth": bandwidth,
        "parameter_bytes_read": parameter_bytes_read(model),
        "memory": SIMULATED if device.type != "cuda" else MEASURED,
        "memory_cap_bytes": None if settings.memory_cap_mib is None else settings.memory_cap_mib * 2**20,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
