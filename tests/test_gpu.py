"""On a CUDA GPU: the same decisions and decoding as on a CPU, flash-attention, bfloat16 on the golden
cases, fidelity memory, and smoke runs of ``eval/run.py`` and the latency benchmark.

Every test is marked ``gpu`` and skipped without CUDA (tests/conftest.py); ``scripts/gpu_check.sh``
runs them. ``RESTKV_GPU_TESTS_DEVICE=cpu`` runs their code on a CPU instead (a dry run of the tests
themselves; the CUDA-only checks skip). Tolerances are those of the dtype: float32 on CUDA and on a
CPU differ by summation order only, so decisions may swap only tokens tied to rounding at the cut-off.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ARCHITECTURES, tiny_model
from transformers import DynamicCache

from restkv import compress
from restkv.registry import get_policy
from restkv.stages.allocation import HeadSelection

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[1]
CUDA = torch.device(os.environ.get("RESTKV_GPU_TESTS_DEVICE", "cuda"))
POLICIES = ("restkv", "pyramidkv", "adakv")
GQA_MODES = ("mean", "max", "expand")
STEPS = 4


def positions(selection: object) -> list[set[int]]:
    """Kept positions per stored head (dense or head-wise), as sets."""
    if isinstance(selection, HeadSelection):
        return [set(part.tolist()) for part in selection.per_head()]
    assert isinstance(selection, torch.Tensor)
    return [set(row.tolist()) for row in selection[0]]


def overlap(a: list[set[int]], b: list[set[int]]) -> float:
    """Share of kept positions two runs agree on, over all heads."""
    return sum(len(x & y) for x, y in zip(a, b, strict=True)) / max(1, sum(len(x) for x in a))


@torch.no_grad()
def prefill_and_decode(model, policy: str, gqa: str, budget: int = 48, length: int = 300):
    """Kept positions of every layer and the logits of ``STEPS`` greedy decode steps."""
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(5))
    ids = ids.to(model.device)
    with compress(model, get_policy(policy, gqa=gqa), budget, decode_reserve=STEPS) as compressor:
        cache = DynamicCache(config=model.config)
        logits = [model(input_ids=ids, cache=cache, logits_to_keep=1).logits[0, -1].float()]
        for step in range(STEPS - 1):
            token = logits[-1].argmax().view(1, 1)
            position = torch.tensor([[length + step]], device=model.device)
            logits.append(model(input_ids=token, cache=cache, position_ids=position).logits[0, -1].float())
        kept = [positions(selection) for selection in compressor.record.indices]
    return kept, torch.stack(logits).cpu()


CASES = pytest.mark.parametrize(
    ("arch", "gqa", "policy"),
    [
        (arch, gqa, policy)
        for arch in sorted(ARCHITECTURES)
        for gqa in GQA_MODES
        for policy in POLICIES
        if not (policy == "adakv" and gqa == "expand")  # head-wise allocations select per key/value head
    ],
)
"""Architectures x GQA modes x policies (uniform, pyramid and head-wise budgets)."""


@CASES
def test_cuda_sdpa_decides_and_decodes_as_the_cpu(arch, gqa, policy):
    cpu_kept, cpu_logits = prefill_and_decode(tiny_model(arch), policy, gqa)
    gpu_kept, gpu_logits = prefill_and_decode(tiny_model(arch).to(CUDA), policy, gqa)
    for layer, (a, b) in enumerate(zip(cpu_kept, gpu_kept, strict=True)):
        assert overlap(a, b) >= 0.98, f"layer {layer}: CUDA keeps other tokens than the CPU"
    torch.testing.assert_close(gpu_logits, cpu_logits, rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="flash_attn is not installed")
@CASES
def test_flash_attention_2_decides_and_decodes_as_sdpa(arch, gqa, policy):
    sdpa_kept, sdpa_logits = prefill_and_decode(tiny_model(arch, torch.float16).to(CUDA), policy, gqa)
    flash = tiny_model(arch, torch.float16, attn="flash_attention_2").to(CUDA)
    flash_kept, flash_logits = prefill_and_decode(flash, policy, gqa)
    for layer, (a, b) in enumerate(zip(sdpa_kept, flash_kept, strict=True)):
        assert overlap(a, b) >= 0.95, f"layer {layer}: flash-attention keeps other tokens than sdpa"
    torch.testing.assert_close(flash_logits, sdpa_logits, rtol=2e-2, atol=2e-2)


def _fused_varlen(kernel: str) -> bool:
    from restkv.storage.varlen import flash_available, torch_varlen

    return CUDA.type == "cuda" and (torch_varlen() is not None if kernel == "torch" else flash_available())


@pytest.mark.parametrize("kernel", ["torch", "flash"])
@pytest.mark.parametrize("gqa", ["mean", "max"])
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_fused_varlen_kernels_decide_and_decode_as_the_reference(arch, gqa, kernel):
    """Head-wise caches read by PyTorch's varlen kernel (no extra package) or flash-attn's, against the reference
    path, in bfloat16: the same kept positions, logits within bfloat16 tolerance."""
    if not _fused_varlen(kernel):
        pytest.skip(
            f"varlen_kernel={kernel} cannot run here (CUDA and {'varlen_attn' if kernel == 'torch' else 'flash_attn'})"
        )
    model = tiny_model(arch, torch.bfloat16).to(CUDA)
    ids = torch.randint(0, model.config.vocab_size, (1, 300), generator=torch.Generator().manual_seed(5)).to(CUDA)
    runs = []
    for varlen_kernel in ("reference", kernel):
        policy = get_policy("adakv", gqa=gqa)
        with torch.no_grad(), compress(model, policy, 48, decode_reserve=STEPS, varlen_kernel=varlen_kernel) as c:
            cache = DynamicCache(config=model.config)
            logits = [model(input_ids=ids, cache=cache, logits_to_keep=1).logits[0, -1].float()]
            for step in range(STEPS - 1):
                token = logits[0].argmax().view(1, 1)  # the same tokens for both kernels
                position = torch.tensor([[300 + step]], device=CUDA)
                logits.append(model(input_ids=token, cache=cache, position_ids=position).logits[0, -1].float())
            runs.append(([positions(s) for s in c.record.indices], torch.stack(logits).cpu()))
    assert runs[0][0] == runs[1][0]
    torch.testing.assert_close(runs[1][1], runs[0][1], rtol=2e-2, atol=2e-2)


def test_golden_cases_on_cuda_in_float32_and_bfloat16():
    """float32 on CUDA reproduces the recorded decisions; bfloat16 inputs keep most of them (the share is printed)."""
    golden = pytest.importorskip("test_golden")
    from safetensors.torch import load_file

    tensors = load_file(golden.GOLDEN / "official_selection.safetensors", device=str(CUDA))
    shares = {}
    for case in golden.META["cases"]:
        policy, budget = golden.policy_for(case), golden.Budget(case["max_capacity_prompt"])
        inputs = golden.layer_inputs(case, tensors)
        theirs = tensors[f"{case['name']}.kept"]
        keep = policy.layer_keep(inputs.length, budget, 0, 1)
        scores = policy.score(inputs, keep) if case["has_scores"] else None
        golden.assert_same_selection(policy.select(inputs, budget).cpu(), theirs.cpu(), _cpu(scores), 0)
        low = golden.LayerInputs(
            queries=inputs.queries.bfloat16(),
            keys=inputs.keys.bfloat16(),
            values=inputs.values.bfloat16(),
            layer=0,
            num_layers=1,
            output_gram=inputs.output_gram,
        )
        shares[case["name"]] = overlap(positions(policy.select(low, budget)), positions(theirs))
    print(json.dumps({"bfloat16_kept_share": shares}, indent=1))
    assert sum(shares.values()) / len(shares) >= 0.9


def _cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.cpu()


def test_fidelity_keeps_gpu_memory_flat_over_many_samples():
    if CUDA.type != "cuda":
        pytest.skip("measures CUDA memory")
    from restkv.eval.benchmarks.contract.sample import Sample
    from restkv.eval.evaluation.base import Session
    from restkv.eval.evaluation.fidelity import Fidelity
    from restkv.eval.evaluation.prompting import PromptTokens

    class Tokenizer:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) % 128 for c in text]}

        def decode(self, ids, skip_special_tokens=True):
            return "x" * len(ids)

    model = tiny_model("llama").to(CUDA)
    scorer, allocated = Fidelity(tokens=4), []
    with compress(model, get_policy("snapkv"), 48) as compressor:
        session = Session(model, Tokenizer(), compressor, "query_aware", set())
        for index in range(40):
            prompt = PromptTokens(context=[(index * 7 + i) % 120 + 3 for i in range(200)], query=[5])
            sample = Sample(
                id=str(index),
                task="t",
                context="",
                question="",
                references=["a long reference answer"],
                max_new_tokens=4,
                metric="m",
            )
            scorer.evaluate(None, session, sample, prompt)
            torch.cuda.synchronize()
            allocated.append(torch.cuda.memory_allocated())
    assert allocated[-1] - allocated[4] < 4096, f"GPU memory grew by {allocated[-1] - allocated[4]} bytes"


def _run(command: list[str], tmp_path: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("device_map", ["null", "auto"])
def test_eval_run_on_cuda(tmp_path, device_map):
    if CUDA.type != "cuda" and device_map == "auto":
        pytest.skip("device_map=auto places the model on GPUs")
    overrides = [
        "model=tiny-random-llama",
        f"device={CUDA}",
        f"model.device_map={device_map}",
        "bench=ruler",
        "policy=restkv",
        "budget=64",
        "limit=2",
        "bench.tasks=[niah_single_1]",
        "bench.lengths=[512]",
        f"out_dir={tmp_path}",
    ]
    _run([sys.executable, "eval/run.py", *overrides], tmp_path)
    metrics = list(tmp_path.rglob("metrics.json"))
    assert len(metrics) == 1 and sum(json.loads(metrics[0].read_text())["samples"].values()) == 2


def test_latency_benchmark_on_cuda(tmp_path):
    overrides = ["latency=tiny", f"latency.device={CUDA}", f"latency.out_dir={tmp_path}", "latency.name=cuda-smoke"]
    _run([sys.executable, "-m", "restkv.eval.latency", *overrides], tmp_path)
    assert (tmp_path / "cuda-smoke.json").is_file()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_captured_decode_step_replays_the_eager_steps(arch):
    """The CUDA-graph step over a static-shape cache writes what eager decoding from the same token writes."""
    from restkv.decoding.static_layers import to_static
    from restkv.eval.latency.timing import decode_static, forward

    model = tiny_model(arch).to(CUDA)
    ids = torch.randint(0, 128, (1, 300), generator=torch.Generator().manual_seed(0)).to(CUDA)
    with compress(model, get_policy("snapkv"), 64), torch.no_grad():
        cache = DynamicCache(config=model.config)
        forward(model, ids, cache, 0)
        static = to_static(cache, 9)
        decode_static(model, static, 300, 1, 7)  # from token 1: 1 warm-up step, then the captured step replayed 7 times
        assert all(int(layer.length) == 64 + 8 for layer in static.layers)
        cache = DynamicCache(config=model.config)
        forward(model, ids, cache, 0)
        token = torch.ones((1, 1), dtype=torch.long, device=CUDA)
        for step in range(8):
            token = forward(model, token, cache, 300 + step).argmax().view(1, 1)
    for stored, eager in zip(static.layers, cache.layers, strict=True):  # the last layer sees every mask error
        torch.testing.assert_close(stored.keys[:, :, : 64 + 8], eager.keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(stored.values[:, :, : 64 + 8], eager.values, rtol=1e-4, atol=1e-4)


RECORDED_CASES = [("snapkv", "auto"), ("full", "auto"), ("adakv", "auto"), ("adakv", "masked")]
"""Dense compressed, the full cache, head-wise varlen and head-wise masked caches."""


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize(("policy", "layout"), RECORDED_CASES)
def test_the_recorded_decode_step_gives_the_eager_logits_and_tokens(arch, policy, layout):
    """``decode=graph`` (the step recorded once and replayed) against the eager loop, in float32: the same greedy
    tokens, and a replayed step's logits equal to the eager step's from the same cache."""
    from restkv.decoding.static_decoder import decode_static, static_form
    from restkv.eval.evaluation.decoding import answer
    from restkv.eval.evaluation.prompting import PromptTokens

    model = tiny_model(arch).to(CUDA)
    prompt = PromptTokens(context=[i * 7 % 120 + 3 for i in range(300)], query=[5, 9])
    path = "graph" if CUDA.type == "cuda" else "static"
    with compress(model, get_policy(policy, window=8), 64, layout=layout) as compressor:
        eager = answer(model, prompt, compressor, "query_aware", 16, set(), "eager")
        recorded = answer(model, prompt, compressor, "query_aware", 16, set(), path)
        assert recorded.decode_path == path and recorded.tokens == eager.tokens
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            ids = torch.tensor([prompt.context + prompt.query], device=CUDA)
            first = model(input_ids=ids, cache=cache, logits_to_keep=1).logits[0, -1]
            contents = static_form(cache)
            token = first.argmax().view(1, 1)
            position = torch.tensor([[len(ids[0])]], device=CUDA)
            expected = model(input_ids=token, cache=cache, position_ids=position).logits[0, -1].float()
            decoded = decode_static(model, contents, first, len(ids[0]), 2, set(), 1, record=path == "graph")
    assert decoded.forwards == 1
    from restkv.decoding.static_decoder import _DECODERS

    (decoder,) = [d for d in _DECODERS.values() if d.model() is model][-1:]
    torch.testing.assert_close(decoder.logits[0], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("policy", "layout"), RECORDED_CASES)
def test_batched_recorded_decoding_gives_the_answers_of_one_prompt_at_a_time(policy, layout):
    """``decode_batch``: rows of one recorded step, refilled as they finish; float32 tokens equal one at a time."""
    from restkv.eval.evaluation.base import Session
    from restkv.eval.evaluation.batched import batched_answers
    from restkv.eval.evaluation.decoding import answer
    from restkv.eval.evaluation.prompting import PromptTokens

    model = tiny_model("llama").to(CUDA)
    prompts = [
        PromptTokens(context=[(i * k) % 120 + 3 for i in range(150 + 30 * k)], query=[7, 9, k]) for k in range(7)
    ]
    lengths = [5, 12, 3, 20, 9, 16, 7]
    with compress(model, get_policy(policy, window=8), 64, layout=layout) as compressor:
        alone = [
            answer(model, p, compressor, "query_aware", n, set(), "eager").tokens
            for p, n in zip(prompts, lengths, strict=True)
        ]
        session = Session(model, None, compressor, "query_aware", set(), "auto" if CUDA.type == "cuda" else "static")
        work = [(index, p, n) for index, (p, n) in enumerate(zip(prompts, lengths, strict=True))]
        batched = [reply.tokens for _, reply, _ in batched_answers(session, work, 3, dict)]
    assert batched == alone
