"""A prefill that should evict and did not raises, on every transformers release.

On transformers 5.2 the suite once ran with every eviction silently skipped (``record.kept == []``,
the full cache kept): the hooks did not find the cache. Whatever the cause, a prompt longer than
the budget, prefilled from an empty cache under compression, must leave every layer evicted or
raise. These tests break the integration on purpose (a hook that never fires, attention that
bypasses the attention interface, a layer skipped, no cache at all) and expect the error; the
others check that nothing else raises it.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import DynamicCache

from restkv import ReSTKV, compress
from restkv.baselines import FullCache, SnapKV
from restkv.cache import CACHE_KEYWORDS
from restkv.integrate import KVCompressor

PROMPT = 96
WINDOW = 8
BUDGET = 40
NOT_EVICTED = "compress\\(\\) did not evict a prefill it should have"


def prompt(length: int = PROMPT, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(seed))


def expected_message(model_class: str, what: str) -> str:
    return (
        f"{NOT_EVICTED}: {model_class} on transformers {transformers.__version__.replace('.', '[.]')} prefilled "
        f"{PROMPT} tokens from an empty cache under SnapKV with budget {BUDGET} \\({BUDGET} tokens per layer "
        f"expected\\), but {what}"
    )


@pytest.fixture
def hooks_never_fire(monkeypatch):
    """The eviction hook on the attention modules does nothing, as if transformers never called it."""
    monkeypatch.setattr(KVCompressor, "_after_attention", lambda self, module, args, kwargs, output: None)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_prefill_whose_eviction_hook_never_fires_raises(arch, make_model, hooks_never_fire) -> None:
    model = make_model(arch)
    cache = DynamicCache(config=model.config)
    model_class = type(model).__name__
    with (
        torch.no_grad(),
        compress(model, SnapKV(window=WINDOW), BUDGET),
        pytest.raises(RuntimeError, match=expected_message(model_class, "none of its 2 attention layers was evicted")),
    ):
        model(prompt(), cache=cache)


def test_generate_whose_eviction_hook_never_fires_raises(make_model, hooks_never_fire) -> None:
    model = make_model()
    with compress(model, SnapKV(window=WINDOW), BUDGET), pytest.raises(RuntimeError, match=NOT_EVICTED):
        model.generate(prompt(), max_new_tokens=2, do_sample=False)


def test_attention_that_bypasses_the_attention_interface_raises(make_model, monkeypatch) -> None:
    """A release whose attention does not go through AttentionInterface: no query is ever captured."""
    model = make_model()
    monkeypatch.setattr(KVCompressor, "_capture", lambda self, module, query, softcap=None: None)
    with (
        torch.no_grad(),
        compress(model, SnapKV(window=WINDOW), BUDGET),
        pytest.raises(RuntimeError, match="none of its 2 attention layers was evicted") as error,
    ):
        model(prompt(), cache=DynamicCache(config=model.config))
    message = str(error.value)
    assert "AttentionInterface" in message and "restkv supports transformers>=5.2,<6" in message


def test_a_layer_left_unevicted_raises_naming_it(make_model, monkeypatch) -> None:
    model = make_model()
    evict_layer = KVCompressor._evict_layer

    def skip_layer_1(self, module, kwargs):
        if module.layer_idx != 1:
            evict_layer(self, module, kwargs)

    monkeypatch.setattr(KVCompressor, "_evict_layer", skip_layer_1)
    with (
        torch.no_grad(),
        compress(model, SnapKV(window=WINDOW), BUDGET),
        pytest.raises(RuntimeError, match=r"but layers 1 of 2 were not evicted \(layers \[0\] were\)"),
    ):
        model(prompt(), cache=DynamicCache(config=model.config))


def test_the_cache_under_a_name_the_hook_does_not_read_raises(make_model) -> None:
    """The 5.2 failure itself: the cache the model used is not under the name the hook reads.

    There the hook read ``cache=`` (the caller's, unused) while the model filled its own
    ``past_key_values``; here the hook is pointed at the name this release does not use.
    """
    model = make_model()
    with torch.no_grad(), compress(model, SnapKV(window=WINDOW), BUDGET) as compressor:
        used = compressor._cache_keyword
        compressor._cache_keyword = next(name for name in CACHE_KEYWORDS if name != used)
        with pytest.raises(TypeError, match=f"the cache passed as {used}= reached LlamaAttention unused"):
            model(prompt(), cache=DynamicCache(config=model.config))


def test_the_base_model_called_directly_is_checked(make_model, hooks_never_fire) -> None:
    model = make_model()
    with torch.no_grad(), compress(model, SnapKV(window=WINDOW), BUDGET):
        with pytest.raises(RuntimeError, match=NOT_EVICTED):
            model.model(input_ids=prompt(), cache=DynamicCache(config=model.config))
        with pytest.raises(RuntimeError, match=NOT_EVICTED):
            model.model(inputs_embeds=model.model.embed_tokens(prompt()))


def test_a_prefill_without_a_cache_raises(make_model) -> None:
    model = make_model()
    with (
        torch.no_grad(),
        compress(model, SnapKV(window=WINDOW), BUDGET),
        pytest.raises(RuntimeError, match=r"or the forward ran without a cache \(use_cache=False\)"),
    ):
        model(prompt(), use_cache=False)


def test_a_forward_that_fails_keeps_its_own_error(make_model, monkeypatch) -> None:
    model = make_model()

    def broken(self, module, kwargs):
        raise ValueError("the layer's own error")

    monkeypatch.setattr(KVCompressor, "_evict_layer", broken)
    with (
        torch.no_grad(),
        compress(model, SnapKV(window=WINDOW), BUDGET),
        pytest.raises(ValueError, match="the layer's own error"),
    ):
        model(prompt(), cache=DynamicCache(config=model.config))


def test_after_the_error_the_compressor_evicts_again(make_model, monkeypatch) -> None:
    model = make_model()
    with torch.no_grad(), compress(model, SnapKV(window=WINDOW), BUDGET) as compressor:
        with monkeypatch.context() as patch:
            patch.setattr(compressor, "_evict_layer", lambda module, kwargs: None)
            with pytest.raises(RuntimeError, match=NOT_EVICTED):
                model(prompt(), cache=DynamicCache(config=model.config))
        cache = DynamicCache(config=model.config)
        model(prompt(), cache=cache)
    assert compressor.record.kept == [BUDGET, BUDGET]
    assert cache.get_seq_length() == BUDGET


@pytest.mark.parametrize(
    ("policy", "budget", "length"),
    [
        (SnapKV(window=WINDOW), PROMPT, PROMPT),  # budget = prompt: nothing to evict
        (SnapKV(window=WINDOW), BUDGET, BUDGET - 1),  # a prompt shorter than the budget
        (FullCache(window=WINDOW), BUDGET, PROMPT),  # the full-cache reference never evicts
    ],
    ids=["budget-equals-prompt", "short-prompt", "full-cache"],
)
def test_no_error_where_nothing_is_to_be_evicted(policy, budget, length, make_model, hooks_never_fire) -> None:
    model = make_model()
    with torch.no_grad(), compress(model, policy, budget):
        model(prompt(length), cache=DynamicCache(config=model.config))


def test_no_error_for_decoding_appending_or_paused_forwards(make_model) -> None:
    model = make_model()
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), compress(model, ReSTKV(window=WINDOW), BUDGET) as compressor:
        model(prompt(), cache=cache)
        assert compressor.record.kept == [BUDGET, BUDGET]
        with pytest.MonkeyPatch.context() as patch:  # from here on nothing could be evicted: none must be expected
            patch.setattr(compressor, "_evict_layer", lambda module, kwargs: None)
            model(prompt(1), cache=cache, position_ids=torch.tensor([[PROMPT]]))  # a decode step
            positions = torch.arange(PROMPT + 1, PROMPT + 11)[None]
            model(prompt(10, seed=2), cache=cache, position_ids=positions)  # a question appended
            with compressor.paused():
                model(prompt(), cache=DynamicCache(config=model.config))
    assert cache.get_seq_length() == BUDGET + 11


def test_the_check_can_fail_with_the_real_hooks_removed(make_model) -> None:
    """With every eviction hook removed after entering, the prefill is a no-op and must be refused."""
    model = make_model()
    with torch.no_grad(), compress(model, SnapKV(window=WINDOW), BUDGET):
        for layer in model.model.layers:
            layer.self_attn._forward_hooks.clear()
        with pytest.raises(RuntimeError, match=NOT_EVICTED):
            model(prompt(), cache=DynamicCache(config=model.config))
