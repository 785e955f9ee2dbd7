"""Gemma, Gemma 2, Gemma 3 and Phi-3 through the one integration layer, on tiny random-weight models.

Gemma 2 and 3 alternate sliding-window layers (kept whole: their cache holds their window only) with
full-attention layers (evicted); Gemma 2 soft-caps its attention logits, which the window scores apply
too; Phi-3 projects queries, keys and values through one fused matrix. The oracle is computed here from
scratch: each decoded token's logits from a full forward over prompt + decoded tokens in which, on evicted
layers, decoded rows see only the kept prompt positions (soft-capped as the model does), and sliding layers
run the model's own attention.
"""

from __future__ import annotations

import pytest
import torch
from conftest import attention_function
from transformers import (
    DynamicCache,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GemmaConfig,
    GemmaForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from restkv import compress, get_policy
from restkv.cache import CompressedLayer
from restkv.stages.allocation import HeadSelection
from restkv.storage.layouts import VarlenLayer

PROMPT, WINDOW, BUDGET, SLIDING, STEPS = 96, 8, 40, 16, 2
SHARED = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
LAYER_TYPES = ["sliding_attention", "full_attention"]


def family(name: str, attn: str = "eager", **extra) -> torch.nn.Module:
    """A 2-layer random model of ``name`` (GQA 4/2, head_dim 16), attention sharpened so policies disagree."""
    if name == "gemma":
        config = GemmaConfig(**SHARED, head_dim=16)
        cls = GemmaForCausalLM
    elif name == "gemma2":
        config = Gemma2Config(  # a soft-cap small enough to bite on these logits (the real one is 50)
            **SHARED,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=SLIDING,
            layer_types=LAYER_TYPES,
            attn_logit_softcapping=5.0,
        )
        cls = Gemma2ForCausalLM
    elif name == "gemma3":
        config = Gemma3TextConfig(
            **SHARED, head_dim=16, query_pre_attn_scalar=16, sliding_window=SLIDING, layer_types=LAYER_TYPES
        )
        cls = Gemma3ForCausalLM
    else:
        config = Phi3Config(**SHARED)
        cls = Phi3ForCausalLM
    for key, value in extra.items():
        setattr(config, key, value)
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = cls(config).float().eval()
    with torch.no_grad():
        for param_name, parameter in model.named_parameters():
            if param_name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(8)
            elif param_name.endswith("qkv_proj.weight"):  # Phi-3: queries and keys are the first rows
                parameter[: (4 + 2) * 16].mul_(8)
    return model


CASES = [
    ("gemma", "eager"),
    ("gemma", "sdpa"),
    ("gemma2", "eager"),
    ("gemma3", "eager"),
    ("gemma3", "sdpa"),
    ("phi3", "eager"),
    ("phi3", "sdpa"),
]
POLICIES = {
    "restkv": lambda: get_policy("restkv", window=WINDOW),
    "snapkv": lambda: get_policy("snapkv", window=WINDOW),
    "adakv": lambda: get_policy("adakv", window=WINDOW),
}


def kept_per_head(selection) -> list[torch.Tensor]:
    return selection.per_head() if isinstance(selection, HeadSelection) else list(selection[0])


def oracle(record, windowed: frozenset[int], original):
    """Attention from scratch on evicted layers (decoded rows see the kept prompt keys), the model's elsewhere."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
        if module.layer_idx in windowed:
            return original(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, softcap=softcap, **kwargs
            )
        heads, length = query.shape[1], key.shape[2]
        key = key.repeat_interleave(heads // key.shape[1], dim=1).float()
        value = value.repeat_interleave(heads // value.shape[1], dim=1).float()
        logits = (query.float() @ key.transpose(-1, -2)) * scaling
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        rows = torch.arange(query.shape[2]) + length - query.shape[2]
        allowed = (torch.arange(length)[None, :] <= rows[:, None]).expand(heads, -1, -1).clone()
        per_head = kept_per_head(record.indices[module.layer_idx])
        visible = torch.zeros(len(per_head), length, dtype=torch.bool)
        for head, positions in enumerate(per_head):
            visible[head, positions] = True
        visible[:, PROMPT:] = True
        allowed[:, rows >= PROMPT] &= visible.repeat_interleave(heads // len(per_head), dim=0)[:, None, :]
        weights = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
        return (weights @ value).to(query.dtype).transpose(1, 2).contiguous(), weights

    return attention


@pytest.mark.parametrize("policy_name", sorted(POLICIES))
@pytest.mark.parametrize(("name", "attn"), CASES)
def test_decoding_after_eviction_equals_the_oracle(name: str, attn: str, policy_name: str) -> None:
    model = family(name, attn)
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    cache = DynamicCache(config=model.config)
    tokens, logits = ids, []
    layout = "masked" if name == "gemma2" and policy_name == "adakv" else "auto"  # our varlen kernel has no soft-cap
    with torch.no_grad(), compress(model, POLICIES[policy_name](), BUDGET, layout=layout) as compressor:
        last = model(ids, cache=cache).logits[0, -1]
        for step in range(STEPS):
            token = last.argmax().view(1, 1)
            tokens = torch.cat([tokens, token], dim=1)
            last = model(token, cache=cache, position_ids=torch.tensor([[PROMPT + step]])).logits[0, -1]
            logits.append(last)
    record, windowed = compressor.record, compressor.windowed
    assert windowed == (frozenset({0}) if name in ("gemma2", "gemma3") else frozenset())
    for layer in range(2):
        stored = cache.layers[layer]
        if layer in windowed:  # left whole: the model's own sliding layer, holding its window only
            assert record.indices[layer] is None and type(stored).__name__ == "DynamicSlidingWindowLayer"
            assert stored.keys.shape[2] < SLIDING + STEPS
            continue
        assert record.indices[layer] is not None
        if policy_name == "adakv":
            assert isinstance(record.indices[layer], HeadSelection)
            assert abs(record.indices[layer].total - 2 * BUDGET) <= 2  # AdaKV's rounding
        else:
            assert isinstance(stored, CompressedLayer) and stored.keys.shape[2] == BUDGET + STEPS
        for positions in kept_per_head(record.indices[layer]):
            assert torch.equal(positions[-WINDOW:], torch.arange(PROMPT - WINDOW, PROMPT))
    original = ALL_ATTENTION_FUNCTIONS.get(attn) if attn != "eager" else None
    import sys

    eager = sys.modules[type(model).__module__].eager_attention_forward
    with attention_function(attn, oracle(record, windowed, original or eager)):
        for step in range(STEPS):
            with torch.no_grad():
                expected = model(tokens[:, : PROMPT + step + 1]).logits[0, -1]
            torch.testing.assert_close(logits[step], expected, rtol=1e-4, atol=1e-4)


def test_gemma2_window_scores_are_soft_capped() -> None:
    """The window attention a policy scores is the model's: soft-capped logits, as Gemma 2's eager attention."""
    model = family("gemma2", "eager")
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), compress(model, get_policy("snapkv", window=WINDOW), BUDGET) as capped:
        model(ids, cache=DynamicCache(config=model.config))
    model.config.attn_logit_softcapping = None
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = None
    with torch.no_grad(), compress(model, get_policy("snapkv", window=WINDOW), BUDGET) as plain:
        model(ids, cache=DynamicCache(config=model.config))
    assert not torch.equal(capped.record.indices[1], plain.record.indices[1])


def test_a_sliding_only_model_and_bidirectional_attention_are_refused() -> None:
    phi = family("phi3", "eager", sliding_window=SLIDING)
    with pytest.raises(ValueError, match="has nothing to evict"):
        compress(phi, get_policy("snapkv", window=WINDOW), BUDGET)
    with compress(phi, get_policy("full"), BUDGET):  # keeping everything is fine
        pass
    gemma3 = family("gemma3", "eager")
    for layer in gemma3.model.layers:
        layer.self_attn.is_causal = False
    with pytest.raises(ValueError, match="bidirectionally"):
        compress(gemma3, get_policy("snapkv", window=WINDOW), BUDGET)


def test_gemma2_under_sdpa_is_refused_where_transformers_allows_it() -> None:
    try:
        model = family("gemma2", "sdpa")
    except ValueError as refused:  # newer transformers refuse sdpa for Gemma 2 themselves
        assert "sdpa" in str(refused) or "scaled_dot_product" in str(refused)
        return
    with pytest.raises(ValueError, match="soft-caps its attention logits"):
        compress(model, get_policy("snapkv", window=WINDOW), BUDGET)


def test_a_varlen_cache_on_gemma3_holds_only_the_full_layers_heads() -> None:
    model = family("gemma3", "sdpa")
    ids = torch.randint(3, 128, (1, PROMPT), generator=torch.Generator().manual_seed(3))
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), compress(model, get_policy("adakv", window=WINDOW), BUDGET) as compressor:
        model(ids, cache=cache)
    assert isinstance(cache.layers[1], VarlenLayer) and not isinstance(cache.layers[0], VarlenLayer)
    assert compressor.record.head_lengths[0] is None
    assert abs(sum(compressor.record.head_lengths[1]) - 2 * BUDGET) <= 2  # AdaKV's rounding
