"""Work sizes by device: CPU bounds unchanged, GPU sizes from free memory, and the launch-count guard.

The guard counts the top-level operators one layer's eviction launches (the torch profiler runs on
a CPU) with the work sizes a GPU with 8 GiB free would use, at two prompt lengths: the count must
not grow with the length (each Python iteration over a chunk is a few kernel launches on a GPU).
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from restkv import compress
from restkv.baselines.h2o import accumulated_attention
from restkv.integrate import KVCompressor
from restkv.registry import get_policy
from restkv.scoring import SCORING_CHUNK, reconstruction_after
from restkv.worksizes import CPU_WORK_BYTES, GPU_MEMORY_SHARE, assume_free_memory, elements_at_once, rows_at_once

CPU = torch.device("cpu")
GPU_FREE = 8 << 30


def test_cpu_keeps_its_fixed_sizes():
    assert rows_at_once(100_000, 1 << 20, CPU, SCORING_CHUNK) == SCORING_CHUNK
    assert rows_at_once(100, 1, CPU, SCORING_CHUNK) == 100
    assert elements_at_once(CPU) == CPU_WORK_BYTES // 4


def test_gpu_sizes_follow_free_memory():
    with assume_free_memory(GPU_FREE):
        assert rows_at_once(10**9, 1000, CPU, 512) == int(GPU_FREE * GPU_MEMORY_SHARE) // 1000
        assert rows_at_once(5000, 1000, CPU, 512) == 5000  # one chunk covers the prompt
        assert rows_at_once(10**9, 10**12, CPU, 512) == 512  # never below the CPU size
        assert elements_at_once(CPU) == int(GPU_FREE * GPU_MEMORY_SHARE) // 4
    assert rows_at_once(5000, 1000, CPU, 512) == 512  # the assumption ends with the block


@pytest.mark.parametrize("free", [0, -1, 1.5, True])
def test_assumed_free_memory_must_be_a_positive_integer(free):
    with pytest.raises(ValueError, match=rf"free_bytes={free!r} must be a positive integer"), assume_free_memory(free):
        pass


def test_gpu_sized_chunks_give_the_same_scores():
    generator = torch.Generator().manual_seed(0)
    attention = torch.rand(1, 8, 3000, generator=generator).softmax(-1)
    values = torch.randn(1, 2, 3000, 16, generator=generator)
    gram = torch.randn(8, 16, 16, generator=generator)
    gram = gram @ gram.transpose(-1, -2)
    cpu = reconstruction_after(attention, values, gram, 1.0)
    assert torch.equal(cpu, reconstruction_after(attention, values, gram, 1.0, chunk=SCORING_CHUNK))
    with assume_free_memory(GPU_FREE):
        gpu = reconstruction_after(attention, values, gram, 1.0)
    torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-7)


def test_h2o_blocks_sized_for_a_gpu_give_the_same_sums():
    generator = torch.Generator().manual_seed(1)
    queries, keys = torch.randn(1, 4, 600, 16, generator=generator), torch.randn(1, 2, 600, 16, generator=generator)
    small = accumulated_attention(queries, keys, None, max_elements=4 * 600 * 7)  # 7 rows a block
    with assume_free_memory(GPU_FREE):
        whole = accumulated_attention(queries, keys, None, max_elements=4 * 600 * 7)  # one block
    torch.testing.assert_close(whole, small, rtol=1e-5, atol=1e-6)


def _eviction_operators(model, policy_name: str, length: int, free: int | None) -> int:
    """Top-level operators launched by the eviction of layer 0 of a ``length``-token prefill."""
    counts: list[int] = []
    original = KVCompressor._evict

    def profiled(self, module, *args):
        if module.layer_idx != 0:
            return original(self, module, *args)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            original(self, module, *args)
        counts.append(sum(1 for event in prof.events() if event.cpu_parent is None))

    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(length))
    KVCompressor._evict = profiled
    try:
        with compress(model, get_policy(policy_name), 64, layout="auto"), torch.no_grad():
            if free is None:
                model(ids)
            else:
                with assume_free_memory(free):
                    model(ids)
    finally:
        KVCompressor._evict = original
    assert len(counts) == 1
    return counts[0]


@pytest.mark.parametrize("policy", ["restkv", "snapkv", "pyramidkv", "adakv", "criticalkv", "think", "dropkv"])
def test_eviction_launches_do_not_grow_with_the_prompt_at_gpu_sizes(make_model, policy):
    model = make_model("llama")
    short, long = (_eviction_operators(model, policy, length, GPU_FREE) for length in (600, 2400))
    assert long == short, f"{policy}: {short} operators at 600 tokens, {long} at 2400"


def test_the_guard_can_fail_cpu_sizes_grow_with_the_prompt(make_model):
    model = make_model("llama")
    short, long = (_eviction_operators(model, "restkv", length, None) for length in (600, 2400))
    assert long > short
