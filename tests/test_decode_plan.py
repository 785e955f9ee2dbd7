"""How a run decodes is decided once (`restkv.eval.harness.decode_plan`): every rule of its table refuses what it
names, with a message saying what to use instead, and a combination that can act is planned."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from restkv.decoding.eviction import DecodeEviction
from restkv.eval.evaluation import Fidelity, Generate
from restkv.eval.harness import decode_plan
from restkv.eval.harness.decode_plan import RULES, DecodePlan, plan_decode
from restkv.eval.harness.settings import Settings
from restkv.registry import get_policy
from restkv.storage.quantize import Quantization

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
DECODE = {"compression": {"phase": "decode", "decode_budget": 64}}


def plan(values: dict[str, Any], device=CPU, evaluation=None, quantization=None, policy=None) -> DecodePlan:
    run = Settings.of(values)
    policy = policy or get_policy("snapkv", window=8)
    return plan_decode(run, device, evaluation or Generate(), quantization or Quantization(), policy)


REFUSED = {
    "the decode path runs on this device": (
        {"decode": "graph"},
        {},
        r"decode=graph records the decode step as a CUDA graph; this run's device is 'cpu'",
    ),
    "a decode schedule acts only with decode-time eviction": (
        {"compression": {"decode_schedule": "length"}},
        {},
        r"compression.decode_schedule='length' is set but compression.phase='prefill' evicts at the end",
    ),
    "a decode budget acts only with decode-time eviction": (
        {"compression": {"decode_budget": 64}},
        {},
        r"compression.decode_budget=64 is set but compression.phase",
    ),
    "decode-time eviction needs a decode budget": (
        {"compression": {"phase": "both"}},
        {},
        r"compression.phase='both' evicts during decoding and needs",
    ),
    "decode-time eviction cuts only what the policy and storage allow": (
        DECODE,
        {"policy": get_policy("snapkv", window=8, gqa="expand")},
        r"decode-time eviction with SnapKV: gqa",
    ),
    "decode-time eviction cannot shrink a preallocated cache": (
        {**DECODE, "decode": "static"},
        {},
        r"decode=static preallocates a cache that decode-time eviction cannot",
    ),
    "many prompts per step only where the run can batch": (
        {**DECODE, "decode_batch": 4},
        {},
        r"decode_batch=4 cannot batch this run: decode-time eviction decodes one prompt at a time; use decode_batch=1",
    ),
}


def test_every_rule_of_the_table_is_exercised_here() -> None:
    names = [rule.name for rule in RULES]
    assert len(set(names)) == len(names) and set(names) == set(REFUSED)


@pytest.mark.parametrize("name", list(REFUSED))
def test_each_rule_refuses_what_it_names(name: str) -> None:
    values, parts, message = REFUSED[name]
    with pytest.raises((ValueError, NotImplementedError), match=message):
        plan(values, **parts)


def test_a_plan_says_the_path_the_rows_and_the_eviction() -> None:
    assert plan({}) == DecodePlan("auto", 1, None)  # a CPU decodes one prompt a step unless asked
    assert plan({}, device=CUDA) == DecodePlan("auto", "auto", None)
    assert plan({"decode_batch": 3, "decode": "static"}) == DecodePlan("static", 3, None)
    assert plan({}, device=CUDA, evaluation=Fidelity()).rows == 1  # fidelity evaluates one prompt at a time
    assert plan({}, device=CUDA, quantization=Quantization(backend="hqq")).rows == 1
    evicting = plan(DECODE, device=CUDA)
    assert evicting == DecodePlan("eager", 1, DecodeEviction(64, 32, "decode", "interval"))


def test_each_rule_is_checked_once(monkeypatch) -> None:
    calls = []
    original = decode_plan.check_decode_eviction
    monkeypatch.setattr(decode_plan, "check_decode_eviction", lambda *a: calls.append(a) or original(*a))
    plan(DECODE)
    assert len(calls) == 1
