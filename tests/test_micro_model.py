"""The committed micro model: within its size limits, loadable as a Hugging Face folder, able to
retrieve, and telling eviction policies apart (the reason it exists)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from restkv import ReSTKV, compress
from restkv.baselines import FullCache, StreamingLLM
from restkv.eval.benchmarks import micro as micro_suite
from restkv.eval.benchmarks import ruler
from restkv.eval.benchmarks.ruler.metrics import ruler_string_match_all
from restkv.eval.evaluation.decoding import answer
from restkv.eval.evaluation.prompting import tokenize
from restkv.eval.run import CONFIGS
from restkv.policy import Policy

FOLDER = Path(__file__).resolve().parents[1] / "models" / "micro-llama"
LENGTH = 1024  # RULER context length of the retrieval checks (prompt + answer room)
SAMPLES = 6


@pytest.fixture(scope="module")
def micro() -> tuple:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(FOLDER)
    model = AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32, attn_implementation="sdpa").eval()
    return model, tokenizer


def test_folder_is_within_the_size_limits() -> None:
    files = [p for p in FOLDER.iterdir() if p.is_file()]
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= {p.name for p in files}
    assert sum(p.stat().st_size for p in files) <= 25 * 2**20
    assert max(p.stat().st_size for p in files) <= 16 * 2**20
    with safe_open(str(FOLDER / "model.safetensors"), "pt") as weights:
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}  # noqa: SIM118
        parameters = sum(_numel(weights, name) for name in weights.keys())  # noqa: SIM118
    assert dtypes <= {"BF16", "F16"}, dtypes
    assert parameters <= 20_000_000


def _numel(weights, name: str) -> int:
    count = 1
    for dim in weights.get_slice(name).get_shape():
        count *= dim
    return count


def test_config_is_a_llama_with_rope_and_gqa() -> None:
    config = json.loads((FOLDER / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["max_position_embeddings"] >= 4096


def test_micro_llama_is_the_default_model() -> None:
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        cfg = compose(config_name="config")
    assert cfg.model.name == "micro-llama" and cfg.model.path == "models/micro-llama"


def _accuracy(
    model, tokenizer, policy: Policy, budget: int, mid_only: bool = False, task: str = "niah_single_1"
) -> float:
    count = 4 * SAMPLES if mid_only else SAMPLES
    if task in micro_suite.TASK_CONFIGS:
        samples = micro_suite.generate(task, tokenizer, LENGTH, count, seed=3)
    else:  # RULER's prompts as the model was trained on them: keys from the bundled words, exact fit
        samples = ruler.generate(
            task, tokenizer, LENGTH, count, seed=3, fit="exact", words="bundled", sentences="rules"
        )
    if mid_only:
        samples = [s for s in samples if all(0.2 <= d <= 0.8 for d in s.meta["depths"])][:SAMPLES]
        assert len(samples) >= SAMPLES // 2
    scores = []
    for sample in samples:
        prompt = tokenize(sample, tokenizer, chat=False, max_context=LENGTH)
        with compress(model, policy, budget) as compressor:
            reply = answer(model, prompt, compressor, "query_aware", sample.max_new_tokens, {tokenizer.eos_token_id})
        text = tokenizer.decode(reply.tokens, skip_special_tokens=True)
        scores.append(ruler_string_match_all(text, sample.references))
    return sum(scores) / len(scores)


def test_full_cache_retrieves_a_needle_from_unseen_prompts(micro) -> None:
    assert _accuracy(*micro, FullCache(), LENGTH) >= 5 / 6


def test_streamingllm_loses_mid_context_needles_that_restkv_keeps(micro) -> None:
    """Retrieval, not recency: a needle in the middle is gone once only sinks and recent tokens are kept."""
    assert _accuracy(*micro, StreamingLLM(window=32, variant="sinks", sinks=4), 128, mid_only=True) <= 1 / 6
    assert _accuracy(*micro, ReSTKV(window=32), 128, mid_only=True) >= 4 / 6


def test_full_cache_matches_the_asked_key_among_distractors(micro) -> None:
    """Key matching, not "copy a value": four keys in the essay, one asked (chance: 1 in 4)."""
    assert _accuracy(*micro, FullCache(), LENGTH, task="micro_multikey_1") >= 5 / 6
    assert _accuracy(*micro, FullCache(), LENGTH, task="niah_multikey_1") >= 4 / 6
