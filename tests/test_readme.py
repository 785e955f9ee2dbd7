"""The README's code examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_three_line_api(make_model) -> None:
    model = make_model()
    inputs = {"input_ids": torch.randint(0, 128, (1, 200))}
    namespace = {"model": model, "inputs": inputs}
    exec(python_blocks()[0], namespace)
    assert namespace["output"].shape[1] > 200


def test_new_policy_example(make_model, monkeypatch) -> None:
    from restkv import compress, get_policy, registry

    # the example registers "keynorm": in a copy of the registry, so later tests see the real one
    monkeypatch.setattr(registry, "_POLICIES", dict(registry._POLICIES))
    namespace: dict = {}
    exec(python_blocks()[1], namespace)
    policy = get_policy("keynorm", window=8)
    model = make_model()
    with compress(model, policy, budget=40) as compressor:
        model.generate(torch.randint(0, 128, (1, 100)), max_new_tokens=2, do_sample=False)
    assert compressor.record.kept == [40, 40]
