"""Every kvpress press either runs as ``policy=kvpress`` or is refused with its reason; the generated table.

The catalogue, the refusals and the table need no kvpress; the coverage of the installed kvpress and the
wrapped presses' decisions (ours equal kvpress's own hooks on the micro model) skip without it (CI runs them
with kvpress 0.5.5 on transformers 5.2).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from restkv import compress
from restkv.interop import compression_ratio
from restkv.interop.kvpress_policy import HEADWISE, OWN_SELECTION, SUPPORTED, WRAPPERS, KVPressPolicy
from restkv.interop.positions import policy_positions, press_positions
from restkv.interop.press_catalogue import FILE_SCORERS, REFUSED
from restkv.interop.press_hooks import HOOKED
from restkv.stages.allocation import HeadSelection

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "models" / "micro-llama"
sys.path.insert(0, str(ROOT / "scripts"))

import kvpress_table  # noqa: E402


def needs_kvpress():
    return pytest.importorskip("kvpress", reason="kvpress is not installed (it needs transformers < 5.3)")


def test_the_docs_table_is_the_catalogue() -> None:
    assert kvpress_table.main(["--check"]) == 0, "run python scripts/kvpress_table.py"


def test_the_catalogue_names_each_press_once() -> None:
    groups = [set(SUPPORTED), set(WRAPPERS), set(OWN_SELECTION), set(HOOKED), set(FILE_SCORERS), set(REFUSED)]
    assert sum(len(g) for g in groups) == len(set().union(*groups)) == 46


def test_the_catalogue_is_the_installed_kvpress() -> None:
    kvpress = needs_kvpress()
    installed = {name for name in kvpress.__all__ if name.endswith("Press")}
    runnable = set(SUPPORTED) | set(WRAPPERS) | set(OWN_SELECTION) | set(HOOKED) | set(FILE_SCORERS)
    assert installed == runnable | set(REFUSED)


@pytest.mark.parametrize("press", sorted(REFUSED))
def test_every_other_press_is_refused_with_its_reason(press: str) -> None:
    with pytest.raises(ValueError, match=rf"kvpress's {press} is not supported because") as refused:
        KVPressPolicy(press=press)
    assert REFUSED[press] in str(refused.value)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"press": "AdaKVPress"}, "policy.inner must name one of"),
        ({"press": "SnapKVPress", "inner": "KnormPress"}, "only the wrappers"),
        ({"press": "ChunkPress", "inner": "AdaKVPress"}, "wraps a scorer press, one of"),
        ({"press": "BlockPress", "inner": "SnapKVPress", "chunk_length": 8}, "does not take chunk_length"),
        ({"press": "PyramidKVPress", "schedule": "pyramid"}, "sets its own per-layer budgets"),
    ],
)
def test_wrapper_settings_are_checked(knobs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVPressPolicy(**knobs)


@pytest.fixture(scope="module")
def micro():
    needs_kvpress()
    model = AutoModelForCausalLM.from_pretrained(MICRO, dtype=torch.float32, attn_implementation="sdpa").eval()
    return model, torch.randint(20, 1000, (1, 700), generator=torch.Generator().manual_seed(0))


def kvpress_masks(model, press, ids) -> list[list[set[int]]]:
    """Per layer and head, the positions kvpress's own hooks leave visible (its head mask)."""
    kept = []
    with torch.no_grad(), press(model):
        model.model(input_ids=ids, past_key_values=DynamicCache())
        for layer in model.model.layers:
            _, head, position = layer.self_attn.__dict__.pop("masked_key_indices")  # left on the module: take it off
            heads = model.config.num_key_value_heads
            kept.append([set(range(ids.shape[1])) - set(position[head == h].tolist()) for h in range(heads)])
    return kept


CASES = [(name, "SnapKVPress") for name in WRAPPERS] + [("CriticalKVPress", "KnormPress"), ("PyramidKVPress", None)]


@pytest.mark.parametrize(("name", "inner"), CASES)
def test_a_wrapped_press_keeps_what_kvpress_keeps(micro, name: str, inner: str | None) -> None:
    kvpress = needs_kvpress()
    model, ids = micro
    settings = {"window_size": 32} if "SnapKVPress" in (name, inner) or name == "PyramidKVPress" else {}
    ratio = compression_ratio(128, ids.shape[1])
    if inner is None:
        theirs = getattr(kvpress, name)(compression_ratio=ratio, **settings)
    else:
        theirs = getattr(kvpress, name)(press=getattr(kvpress, inner)(compression_ratio=ratio, **settings))
    ours = KVPressPolicy(press=name, inner=inner, **settings)
    if name in HEADWISE:
        with torch.no_grad(), compress(model, ours, 128) as compressor:
            model.model(input_ids=ids, past_key_values=DynamicCache())
        mine = [[set(p.tolist()) for p in s.per_head()] for s in compressor.record.indices]
        assert all(isinstance(s, HeadSelection) for s in compressor.record.indices)
        assert mine == kvpress_masks(model, theirs, ids)
        return
    native = press_positions(model, theirs, ids)
    mine = policy_positions(model, ours, 128, ids)
    assert all(torch.equal(a, b) for a, b in zip(native, mine, strict=True)), name
