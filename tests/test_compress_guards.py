"""`compress()` refuses what it cannot do correctly instead of returning wrong answers.

Two threads prefilling through one compressor would mix their captured queries and their records,
and NaN or inf in a layer's keys or values would make every eviction score NaN. The thread tests
force their interleaving with events held inside a module's forward, not with timing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from restkv import ReSTKV, compress
from restkv.baselines import FullCache, SnapKV
from restkv.policy import Policy

PROMPT = 96
WINDOW = 8
BUDGET = 40
WAIT_S = 30.0  # only reached if a test is broken; no test waits on time in normal runs
CONCURRENT = (
    r"a prefill started in thread '[^']+' while thread '[^']+' is in the middle of a prefill under the same "
    r"compressor; one compressor holds one prefill's captured queries and record at a time, so the two would mix "
    r"and give wrong outputs\. Give each thread its own copy of the model under its own compress\(\.\.\.\), or "
    r"serialise the calls \(hold a lock around each generate or forward\)"
)


def prompt(seed: int, length: int = PROMPT) -> torch.Tensor:
    return torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(seed))


class Outcome:
    """What one prefill produced: its logits, its cache's keys per layer and the compressor's record."""

    def __init__(self, logits: torch.Tensor, cache: DynamicCache, kept: list[int], indices: list[Any]) -> None:
        self.logits = logits
        self.keys = [layer.keys.clone() for layer in cache.layers]
        self.kept = kept
        self.indices = indices
        self.cache = cache

    def assert_same(self, other: Outcome) -> None:
        assert self.kept == other.kept
        assert all(torch.equal(a, b) for a, b in zip(self.indices, other.indices, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(self.keys, other.keys, strict=True))
        assert torch.equal(self.logits, other.logits)


def prefill(model: PreTrainedModel, compressor: Any, ids: torch.Tensor) -> Outcome:
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        logits = model(ids, cache=cache).logits
    return Outcome(logits, cache, list(compressor.record.kept), list(compressor.record.indices))


def decode_step(model: PreTrainedModel, cache: DynamicCache, position: int) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([[7]]), cache=cache, position_ids=torch.tensor([[position]])).logits


def alone(model: PreTrainedModel, policy: Policy, ids: torch.Tensor) -> Outcome:
    """The reference: one prefill under a fresh compressor, in this thread."""
    with compress(model, policy, BUDGET) as compressor:
        return prefill(model, compressor, ids)


class Hold:
    """Holds one given thread in ``module``'s forward pre-hook, the first time it gets there, until released."""

    def __init__(self, module: nn.Module) -> None:
        self.thread: threading.Thread | None = None
        self.reached = threading.Event()
        self.resume = threading.Event()
        self.handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module: nn.Module, args: tuple) -> None:
        if threading.current_thread() is self.thread and not self.reached.is_set():
            self.reached.set()
            assert self.resume.wait(WAIT_S), "the test never released the held thread"


class Worker(threading.Thread):
    """Runs ``work`` and keeps its result or its exception."""

    def __init__(self, work: Callable[[], Any], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as error:  # reported by the test
            self.error = error

    def outcome(self) -> Any:
        self.join(WAIT_S)
        assert not self.is_alive(), "worker thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def held_module(model: PreTrainedModel, where: str) -> nn.Module:
    if where == "inside a layer":  # queries of layer 0 captured, its eviction not yet run
        return model.model.layers[0].self_attn.o_proj
    return model.model.layers[1]  # layer 0 evicted, layer 1 not started


# -- two threads, one compressor --------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["inside a layer", "between layers"])
def test_a_prefill_from_a_second_thread_mid_prefill_is_refused(where: str, make_model) -> None:
    model = make_model()
    policy = SnapKV(window=WINDOW)
    first, second = prompt(1), prompt(2)
    expected, expected_second = alone(model, policy, first), alone(model, policy, second)
    with compress(model, policy, BUDGET) as compressor:
        hold = Hold(held_module(model, where))
        worker = Worker(lambda: prefill(model, compressor, first), name="worker-a")
        hold.thread = worker
        worker.start()
        try:
            assert hold.reached.wait(WAIT_S)
            with pytest.raises(RuntimeError, match=CONCURRENT) as refused:
                prefill(model, compressor, second)
        finally:
            hold.resume.set()
        outcome = worker.outcome()
        hold.handle.remove()
        assert "thread 'MainThread' while thread 'worker-a'" in str(refused.value)
        outcome.assert_same(expected)  # the held prefill was not disturbed
        prefill(model, compressor, second).assert_same(expected_second)  # and nothing stale is left


def test_decoding_in_a_second_thread_mid_prefill_is_allowed_and_disturbs_nothing(make_model) -> None:
    model = make_model()
    policy = SnapKV(window=WINDOW)
    first, second = prompt(1), prompt(2)
    expected = alone(model, policy, first)
    reference = alone(model, policy, second)
    expected_step = decode_step(model, reference.cache, PROMPT)
    with compress(model, policy, BUDGET) as compressor:
        mine = prefill(model, compressor, second)
        hold = Hold(held_module(model, "inside a layer"))
        worker = Worker(lambda: prefill(model, compressor, first), name="worker-a")
        hold.thread = worker
        worker.start()
        try:
            assert hold.reached.wait(WAIT_S)
            step = decode_step(model, mine.cache, PROMPT)
        finally:
            hold.resume.set()
        worker.outcome().assert_same(expected)
        hold.handle.remove()
    assert torch.equal(step, expected_step)


def test_threads_one_after_the_other_share_a_compressor(make_model) -> None:
    model = make_model()
    policy = ReSTKV(window=WINDOW)
    prompts = [prompt(1), prompt(2), prompt(3)]
    expected = [alone(model, policy, ids) for ids in prompts]
    with compress(model, policy, BUDGET) as compressor:
        for index, (ids, reference) in enumerate(zip(prompts[:2], expected, strict=False)):
            worker = Worker(lambda ids=ids: prefill(model, compressor, ids), name=f"worker-{index}")
            worker.start()
            worker.outcome().assert_same(reference)
        prefill(model, compressor, prompts[2]).assert_same(expected[2])


def fail_in_layer_0(model: PreTrainedModel, error: BaseException) -> Any:
    """Raise ``error`` from layer 0's MLP: after layer 0's capture and eviction, before layer 1."""

    def hook(module: nn.Module, args: tuple) -> None:
        raise error

    return model.model.layers[0].mlp.register_forward_pre_hook(hook)


def test_an_exception_inside_a_prefill_does_not_keep_other_threads_out(make_model) -> None:
    model = make_model()
    policy = SnapKV(window=WINDOW)
    expected = alone(model, policy, prompt(2))
    with compress(model, policy, BUDGET) as compressor:
        handle = fail_in_layer_0(model, RuntimeError("stopped between layers"))
        with pytest.raises(RuntimeError, match="stopped between layers"):
            prefill(model, compressor, prompt(1))
        handle.remove()
        worker = Worker(lambda: prefill(model, compressor, prompt(2)), name="worker-b")
        worker.start()
        worker.outcome().assert_same(expected)


# -- non-finite keys or values -----------------------------------------------------------------------------


def poison(module: nn.Module, value: float, entries: int = 1) -> Any:
    """Make the first ``entries`` outputs of token 10 of ``module`` (a k_proj or v_proj) equal ``value``."""

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[0, 10, :entries] = value
        return output

    return module.register_forward_hook(hook)


def finite_message(names: str, layer: int, counts: str) -> str:
    return (
        rf"^non-finite {names} in layer {layer} \({counts} NaN or inf\): every eviction score would be NaN and the "
        r"kept positions arbitrary\. The model's activations overflowed or are NaN; in float16 this is usually an "
        r"overflow: run the model in bfloat16 or float32 \(e\.g\. model\.dtype=bfloat16\)$"
    )


def test_nan_in_keys_is_refused_with_the_layer_and_the_count(make_model) -> None:
    model = make_model()
    expected = alone(model, SnapKV(window=WINDOW), prompt(1))
    handle = poison(model.model.layers[1].self_attn.k_proj, float("nan"))
    with compress(model, SnapKV(window=WINDOW), BUDGET) as compressor:
        # rotary embeddings mix each key feature with its partner: one NaN projection makes 2 NaN keys
        with pytest.raises(ValueError, match=finite_message("keys", 1, "2 of 3072 key entries are")):
            prefill(model, compressor, prompt(1))
        handle.remove()
        prefill(model, compressor, prompt(1)).assert_same(expected)


# (layer, [(projection, value, entries)], policy, names, counts)
POISONED = {
    "inf-values": (0, [("v_proj", float("inf"), 3)], ReSTKV(window=WINDOW), "values", "3 of 3072 value entries are"),
    "keys-and-values": (
        0,
        [("k_proj", float("-inf"), 1), ("v_proj", float("nan"), 5)],
        SnapKV(window=WINDOW),
        "keys and values",
        "2 of 3072 key entries and 5 of 3072 value entries are",
    ),
}


@pytest.mark.parametrize("case", POISONED)
def test_inf_in_values_or_both_tensors_non_finite_are_named_with_their_counts(case: str, make_model) -> None:
    layer, poisons, policy, names, counts = POISONED[case]
    model = make_model()
    for projection, value, entries in poisons:
        poison(getattr(model.model.layers[layer].self_attn, projection), value, entries)
    message = finite_message(names, layer, counts)
    with compress(model, policy, BUDGET) as compressor, pytest.raises(ValueError, match=message):
        prefill(model, compressor, prompt(1))


# How a worker thread's prefill fails: an interrupt from layer 0's MLP, which skips torch's always_call hooks and
# ends the thread with the compressor held; or refused NaN keys in layer 0.
WORKER_FAILURES = {
    "interrupted": (
        lambda model: fail_in_layer_0(model, KeyboardInterrupt("stopped between layers")),
        KeyboardInterrupt,
        "stopped between layers",
    ),
    "non-finite": (
        lambda model: poison(model.model.layers[0].self_attn.k_proj, float("nan")),
        ValueError,
        "non-finite keys in layer 0",
    ),
}


@pytest.mark.parametrize("failure", WORKER_FAILURES)
def test_a_prefill_that_failed_in_another_thread_leaves_the_compressor_usable(failure: str, make_model) -> None:
    install, error, match = WORKER_FAILURES[failure]
    model = make_model()
    policy = SnapKV(window=WINDOW)
    expected = alone(model, policy, prompt(2))
    with compress(model, policy, BUDGET) as compressor:
        handle = install(model)
        worker = Worker(lambda: prefill(model, compressor, prompt(1)), name="worker-a")
        worker.start()
        with pytest.raises(error, match=match):
            worker.outcome()
        handle.remove()
        prefill(model, compressor, prompt(2)).assert_same(expected)


def test_the_full_cache_policy_is_not_checked(make_model) -> None:
    model = make_model()
    poison(model.model.layers[1].self_attn.k_proj, float("nan"))
    with compress(model, FullCache(window=WINDOW), BUDGET) as compressor:
        outcome = prefill(model, compressor, prompt(1))
    assert outcome.kept == [PROMPT, PROMPT]
    assert outcome.indices == [None, None]
    assert torch.isnan(outcome.keys[1]).sum() == 2


def test_an_attention_function_registered_over_ours_inside_a_block_survives_it(make_model) -> None:
    """Another library that wraps the registered attention function while a compress block is open (kvpress does,
    when it is first imported there) keeps its wrapper after the block; the next block still evicts, once."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = make_model()
    implementation = model.config._attn_implementation
    before = ALL_ATTENTION_FUNCTIONS._local_mapping.get(implementation)
    calls = []
    try:
        with compress(model, SnapKV(window=WINDOW), BUDGET):
            inner = ALL_ATTENTION_FUNCTIONS[implementation]

            def other_library(*args: Any, **kwargs: Any) -> Any:
                calls.append(1)
                return inner(*args, **kwargs)

            ALL_ATTENTION_FUNCTIONS[implementation] = other_library
        assert ALL_ATTENTION_FUNCTIONS[implementation] is other_library
        with compress(model, SnapKV(window=WINDOW), BUDGET) as compressor:
            outcome = prefill(model, compressor, prompt(3))
        assert calls and outcome.kept == [BUDGET] * len(outcome.kept)
        ALL_ATTENTION_FUNCTIONS._local_mapping.pop(implementation, None)
        if before is not None:
            ALL_ATTENTION_FUNCTIONS[implementation] = before
        with compress(model, SnapKV(window=WINDOW), BUDGET) as compressor:
            reference = prefill(model, compressor, prompt(3))
        outcome.assert_same(reference)  # the retired wrapper in the chain changed nothing
    finally:
        ALL_ATTENTION_FUNCTIONS._local_mapping.pop(implementation, None)
        if before is not None:
            ALL_ATTENTION_FUNCTIONS[implementation] = before
