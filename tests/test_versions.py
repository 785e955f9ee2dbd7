"""The supported transformers range, and what differs inside it.

transformers 5.24 renamed the cache argument ``past_key_values`` to ``cache`` (models' and
attention modules' ``forward``, outputs' field). restkv reads the attention modules' name from
their signature and, on earlier releases, gives the supported model classes the ``cache=``
keyword and outputs ``.cache``, so the project's one spelling works from 5.2 to the newest 5.x.
CI runs these tests on both ends (``.ci/run``).
"""

from __future__ import annotations

import inspect
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from transformers import DynamicCache

from restkv import compress
from restkv.baselines import SnapKV
from restkv.cache import CACHE_KEYWORDS, CompressedLayer, support_cache_keyword
from restkv.integrate import SUPPORTED_MODELS, SUPPORTED_TRANSFORMERS

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
PROMPT = 96
WINDOW = 8
BUDGET = 40
NATIVE_CACHE_KEYWORD = "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters
"""Whether this release's models take ``cache=`` themselves (5.24 on)."""
needs_alias = pytest.mark.skipif(NATIVE_CACHE_KEYWORD, reason="this release's models take cache= themselves")


def prompt(length: int = PROMPT) -> torch.Tensor:
    return torch.randint(0, 128, (1, length), generator=torch.Generator().manual_seed(1))


def pinned() -> str:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (requirement,) = [r for r in project["dependencies"] if re.match(r"transformers\b", r)]
    return requirement.removeprefix("transformers").replace(" ", "")


def test_the_pin_is_the_supported_range_and_holds_the_installed_release() -> None:
    assert pinned() == SUPPORTED_TRANSFORMERS
    assert Version(transformers.__version__) in SpecifierSet(SUPPORTED_TRANSFORMERS)


def test_ci_tests_the_lowest_supported_release_and_the_readme_states_the_range() -> None:
    lowest = min(Version(s.version) for s in SpecifierSet(SUPPORTED_TRANSFORMERS) if s.operator == ">=")
    assert f'"transformers=={lowest}.*"' in (ROOT / ".ci" / "run").read_text()
    assert f"`transformers{SUPPORTED_TRANSFORMERS}`" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("arch", ARCHS)
def test_every_supported_class_takes_the_cache_under_a_known_name(arch, make_model) -> None:
    model = make_model(arch)
    assert type(model).__name__ in SUPPORTED_MODELS
    attention = type(model.model.layers[0].self_attn).forward
    assert any(name in inspect.signature(attention).parameters for name in CACHE_KEYWORDS)
    assert any(name in inspect.signature(type(model).forward).parameters for name in CACHE_KEYWORDS)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("keyword", CACHE_KEYWORDS)
def test_either_name_fills_and_evicts_the_callers_cache(arch, keyword, make_model) -> None:
    model = make_model(arch)
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), compress(model, SnapKV(window=WINDOW), BUDGET) as compressor, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # past_key_values is deprecated from 5.24 on
        out = model(prompt(), **{keyword: cache})
        step = model(prompt(1), position_ids=torch.tensor([[PROMPT]]), **{keyword: cache})
    assert compressor.record.kept == [BUDGET, BUDGET]
    assert out.cache is cache and step.cache is cache
    assert all(isinstance(layer, CompressedLayer) for layer in cache.layers)
    assert cache.get_seq_length() == BUDGET + 1


def test_cache_keyword_outside_compression_and_generate_outputs(make_model) -> None:
    """The full-cache runs (latency, references) pass ``cache=`` without a compressor."""
    model = make_model()
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt(), cache=cache)
    assert cache.get_seq_length() == PROMPT
    with compress(model, SnapKV(window=WINDOW), BUDGET):
        out = model.generate(prompt(), max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert [layer.get_seq_length() for layer in out.cache.layers] == [BUDGET + 2] * 2


@needs_alias
def test_the_alias_keeps_the_signature_is_installed_once_and_refuses_both_names(make_model) -> None:
    model = make_model()
    forward = type(model).forward
    assert "past_key_values" in inspect.signature(forward).parameters  # GenerationMixin reads the signature
    support_cache_keyword(SUPPORTED_MODELS)
    assert type(model).forward is forward
    cache = DynamicCache(config=model.config)
    with pytest.raises(TypeError, match=r"LlamaForCausalLM\.forward got both cache= and past_key_values="):
        model(prompt(), cache=cache, past_key_values=DynamicCache(config=model.config))


@needs_alias
def test_without_the_alias_the_swallowed_cache_is_refused(make_model, monkeypatch) -> None:
    """What 5.2 did before the alias: ``cache=`` went into ``**kwargs`` and the model filled its own cache."""
    model = make_model()
    for cls in (type(model), type(model.model)):
        monkeypatch.setattr(cls, "forward", cls.forward.__wrapped__)
    with (
        torch.no_grad(),
        compress(model, SnapKV(window=WINDOW), BUDGET),
        pytest.raises(TypeError, match="the cache passed as cache= reached LlamaAttention unused"),
    ):
        model(prompt(), cache=DynamicCache(config=model.config))
