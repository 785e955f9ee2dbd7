"""Shared fixtures: tiny random-weight models of every supported architecture."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest
import torch
from transformers import (
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}


def tiny_model(
    arch: str = "llama", dtype: torch.dtype = torch.float32, attn: str = "sdpa", layers: int = 2, seed: int = 0
) -> PreTrainedModel:
    """A random-weight model with GQA (4 query heads, 2 key/value heads), built from a config."""
    config_cls, model_cls = ARCHITECTURES[arch]
    config = config_cls(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        sliding_window=None,
        tie_word_embeddings=False,
    )
    config._attn_implementation = attn
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype).eval()
    # Random init gives nearly uniform attention; sharper weights make policies disagree.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(8)
    return model


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests where CUDA is absent, saying how to run them.

    ``RESTKV_GPU_TESTS_DEVICE=cpu`` runs them on the CPU instead (tests/test_gpu.py: a dry run)."""
    if torch.cuda.is_available() or os.environ.get("RESTKV_GPU_TESTS_DEVICE") == "cpu":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: scripts/gpu_check.sh runs the gpu-marked tests on one")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def make_model():
    return tiny_model


@contextlib.contextmanager
def attention_reader():
    """As if a compressor's attention function were installed (it reads head-wise and static layers)."""
    from restkv.storage.layouts import reader_installed

    reader_installed(+1)
    try:
        yield
    finally:
        reader_installed(-1)


def pytest_report_header(config: pytest.Config) -> str:
    """Which golden fixtures the parity tests replay (the bundled subset unless RESTKV_GOLDEN is set)."""
    from golden_source import describe

    return describe()


@contextlib.contextmanager
def attention_function(name: str, function: Any):
    """``function`` registered as transformers' ``name`` attention inside the block, and afterwards whatever was
    registered before (another library's wrapper, such as kvpress's, or nothing): a test never drops it."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = ALL_ATTENTION_FUNCTIONS._local_mapping.get(name)
    ALL_ATTENTION_FUNCTIONS[name] = function
    try:
        yield
    finally:
        if before is None:
            ALL_ATTENTION_FUNCTIONS._local_mapping.pop(name, None)
        else:
            ALL_ATTENTION_FUNCTIONS[name] = before


def prefill_and_decode(
    model: Any, policy: Any, budget: int, ids: torch.Tensor, steps: int, during_prefill: Any = contextlib.nullcontext
) -> tuple[Any, Any, torch.Tensor, list[Any]]:
    """Prefill ``ids`` under ``policy`` (kvpress's hooks, for presses on that route, around our ``compress``), then
    decode ``steps`` greedy tokens at the positions after the prompt, as the runner does: the prefill's record, the
    cache, the last logits and each layer's kvpress mask right after the prefill. ``during_prefill``: a context
    entered around the prefill only."""
    from restkv import compress
    from restkv.interop.press_hooks import press_hooks
    from restkv.select import Budget

    length, cache = ids.shape[1], DynamicCache(config=model.config)
    with press_hooks(model, policy, Budget(budget)), compress(model, policy, budget=budget) as compressor:
        with torch.no_grad(), during_prefill():
            logits = model(input_ids=ids, cache=cache, position_ids=torch.arange(length)[None], use_cache=True).logits
        record, token = compressor.record, logits[:, -1:].argmax(-1)
        masks = [getattr(m.self_attn, "masked_key_indices", None) for m in model.model.layers]
        with torch.no_grad():
            for step in range(steps):
                logits = model(input_ids=token, cache=cache, position_ids=torch.tensor([[length + step]])).logits
                token = logits[:, -1:].argmax(-1)
    return record, cache, logits, masks
