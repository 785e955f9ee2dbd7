"""The earlier RULER generator's prompts stay reachable byte for byte.

``fit="exact", words="bundled", sentences="rules"`` is what ``eval/benchmarks/ruler.py`` generated
before the package followed the official generator, and what the micro model was trained on. The
digests below were recorded from that module (commit 8ea6c3d) on the micro model's tokenizer: 4
samples per task at 1024 tokens, seed 0, every field of every sample.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from restkv.eval.benchmarks import ruler

TOKENIZER = Path(__file__).resolve().parents[1] / "models" / "micro-llama"
RECORDED = {
    "niah_single_1": "54570d2e45c43419",
    "niah_single_2": "7880323bc6f0433a",
    "niah_single_3": "fdb4f3139f6524bf",
    "niah_multikey_1": "4de1e6027964931d",
    "niah_multikey_2": "f34e4c986817e3e2",
    "niah_multikey_3": "676b7fd90442dbda",
    "niah_multivalue": "c3277fa0e9abc6dc",
    "niah_multiquery": "a24e1bcbb0835ef7",
    "vt": "1da803101b8f3be2",
    "cwe": "adeceb74fa656530",
    "fwe": "30ca2a01d2deb527",
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOKENIZER)


@pytest.mark.parametrize("task", sorted(RECORDED))
def test_earlier_generator_is_reproduced(tokenizer, task: str) -> None:
    samples = ruler.generate(task, tokenizer, 1024, 4, 0, fit="exact", words="bundled", sentences="rules")
    digest = hashlib.sha256(json.dumps([asdict(s) for s in samples], sort_keys=True).encode()).hexdigest()[:16]
    assert digest == RECORDED[task]
