"""Fast paths checked once per signature, with a fallback that says so (`restkv.fastpath`).

On CUDA, ``decode=auto`` records the decode step, the ``auto`` varlen kernel is a fused one and ReST-KV's
distances take the direct path. Here the CUDA-only pieces are replaced by fakes that fail or disagree
(the capture, the fused kernel, the direct scores) and the device lists are widened to the CPU: the run
must fall back to the eager path, say why once, record the reason per sample and in ``metrics.json``,
and predict what the eager path predicts. Settings that name the fast path keep failing loudly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_runner import config, read_lines, settings

import restkv.decoding.static_decoder as graphs
import restkv.scoring as scoring
import restkv.storage.varlen as varlen
from restkv import compress
from restkv.eval.evaluation.base import Session
from restkv.eval.evaluation.batched import batched_answers
from restkv.eval.evaluation.decoding import answer, check_decode
from restkv.eval.evaluation.prompting import PromptTokens
from restkv.eval.harness.run_folder import TIMING_FIELDS
from restkv.eval.harness.runner import run_benchmark
from restkv.fastpath import CHECKS
from restkv.registry import get_policy

PROMPT = PromptTokens(context=[i * 7 % 120 + 3 for i in range(220)], query=[7, 9, 11, 13])
PROMPTS = [PromptTokens(context=[(i * k) % 120 + 3 for i in range(150 + 30 * k)], query=[7, 9, k]) for k in range(1, 6)]


@pytest.fixture(autouse=True)
def fresh_checks():
    """Every test starts with no verdicts and no kept decoders (they are per process)."""
    CHECKS.clear()
    graphs._DECODERS.clear()
    yield
    CHECKS.clear()
    graphs._DECODERS.clear()


class Calls:
    count = 0


def failing_capture(calls: Calls):
    def capture(self) -> None:
        calls.count += 1
        raise RuntimeError("operation not permitted when stream is capturing (fake capture)")

    return capture


class _DisagreeingGraph:
    """A recording that replays a step whose written token is off by one (the next input is the true one)."""

    def __init__(self, decoder: graphs.StaticDecoder, vocab: int) -> None:
        self.decoder, self.vocab = decoder, vocab

    def replay(self) -> None:
        d = self.decoder
        d.step()
        at = (d.index - 1).clamp(max=d.width - 1)[:, None]
        d.generated.scatter_(1, at, (d.generated.gather(1, at) + 1) % self.vocab)


def disagreeing_capture(calls: Calls):
    def capture(self) -> None:
        calls.count += 1
        self.graph = _DisagreeingGraph(self, self.logits.shape[1])

    return capture


class _Replaying:
    """A recording that replays exactly the recorded step (what a good CUDA graph does)."""

    def __init__(self, decoder: graphs.StaticDecoder) -> None:
        self.decoder = decoder

    def replay(self) -> None:
        self.decoder.step()


def agreeing_capture(calls: Calls):
    def capture(self) -> None:
        calls.count += 1
        self.graph = _Replaying(self)

    return capture


def gpu_like(monkeypatch, capture) -> None:
    """The CPU counts as a device whose decode step is recorded, through ``capture``."""
    monkeypatch.setattr(graphs, "RECORDING_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(graphs.StaticDecoder, "capture", capture)


def decoded(model, decode: str, prompt: PromptTokens = PROMPT, policy: str = "snapkv", **kwargs):
    with compress(model, get_policy(policy, window=8), 64, **kwargs) as compressor:
        return answer(model, prompt, compressor, "query_agnostic", 12, set(), decode)


@pytest.mark.parametrize("fake", [failing_capture, disagreeing_capture])
def test_a_failing_or_disagreeing_recording_falls_back_once_and_says_why(make_model, monkeypatch, capsys, fake):
    model = make_model("llama")
    eager = decoded(model, "eager")
    calls = Calls()
    gpu_like(monkeypatch, fake(calls))
    first = decoded(model, "auto")
    assert first.decode_path == "eager" and first.tokens == eager.tokens
    (message,) = CHECKS.drain()
    why = "RuntimeError: operation not permitted" if fake is failing_capture else "tokens differ from the eager loop's"
    assert message.startswith("decode graph -> eager: ") and why in message
    assert capsys.readouterr().err.count("fast path checked and refused") == 1
    again = decoded(model, "auto")  # the same signature: eager at once, no second recording, no second line
    assert again.decode_path == "eager" and again.tokens == eager.tokens and calls.count == 1
    assert CHECKS.drain() == [message] and capsys.readouterr().err == ""


def test_an_agreeing_recording_is_checked_once_and_kept(make_model, monkeypatch, capsys):
    model = make_model("llama")
    eager = decoded(model, "eager")
    calls = Calls()
    gpu_like(monkeypatch, agreeing_capture(calls))
    for _ in range(2):
        reply = decoded(model, "auto")
        assert reply.decode_path == "graph" and reply.tokens == eager.tokens
    assert calls.count == 1 and CHECKS.drain() == [] and "refused" not in capsys.readouterr().err
    (verdict,) = CHECKS.verdicts.values()
    assert verdict.ok and verdict.kind == "decode"


def test_explicit_decode_graph_still_refuses(make_model, monkeypatch):
    model = make_model("llama")
    with pytest.raises(ValueError, match="decode=graph records the decode step as a CUDA graph"):
        check_decode("graph", torch.device("cpu"))  # on a CPU as it is
    gpu_like(monkeypatch, failing_capture(Calls()))
    with pytest.raises(RuntimeError, match="fake capture"):
        decoded(model, "graph")
    assert CHECKS.verdicts == {} and CHECKS.drain() == []


def _fused(monkeypatch, function) -> None:
    """The CPU's float32 counts as a fused kernel's device and dtype, ``function`` as PyTorch's varlen_attn."""
    monkeypatch.setattr(varlen, "FUSED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(varlen, "FUSED_DTYPES", (torch.float16, torch.bfloat16, torch.float32))
    monkeypatch.setattr(varlen, "torch_varlen", lambda: function)


def _zeros(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, is_causal=False):
    return torch.zeros_like(q)


def _raises(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, is_causal=False):
    raise RuntimeError("no kernel image is available for execution on the device (fake)")


@pytest.mark.parametrize(("kernel", "why"), [(_zeros, "outputs differ"), (_raises, "no kernel image")])
def test_a_disagreeing_or_failing_varlen_kernel_falls_back_to_the_reference(make_model, monkeypatch, kernel, why):
    model = make_model("llama")
    reference = decoded(model, "eager", policy="adakv", varlen_kernel="reference")
    _fused(monkeypatch, kernel)
    reply = decoded(model, "eager", policy="adakv")
    assert reply.tokens == reference.tokens
    messages = CHECKS.drain()
    assert messages and all(m.startswith("varlen torch -> reference: ") and why in m for m in messages)
    with pytest.raises(RuntimeError, match="no kernel image"):  # named explicitly: no fallback
        _fused(monkeypatch, _raises)
        decoded(model, "eager", policy="adakv", varlen_kernel="torch")


def test_a_good_fused_kernel_passes_its_check(make_model, monkeypatch):
    model = make_model("llama")
    reference = decoded(model, "eager", policy="adakv", varlen_kernel="reference")

    def faithful(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, is_causal=False):  # the contract, computed plainly
        out = torch.empty_like(q)
        for s in range(len(cu_k) - 1):
            qs, ks, vs = q[cu_q[s] : cu_q[s + 1]], k[cu_k[s] : cu_k[s + 1], 0], v[cu_k[s] : cu_k[s + 1], 0]
            scores = torch.einsum("qgd,nd->gqn", qs, ks) * scale
            n, m = ks.shape[0], qs.shape[0]
            scores = scores.masked_fill(~torch.ones(m, n, dtype=torch.bool).tril(n - m), float("-inf"))
            out[cu_q[s] : cu_q[s + 1]] = torch.einsum("gqn,nd->qgd", scores.softmax(-1), vs)
        return out

    _fused(monkeypatch, faithful)
    assert decoded(model, "eager", policy="adakv").tokens == reference.tokens
    assert CHECKS.drain() == [] and CHECKS.verdicts and all(v.ok for v in CHECKS.verdicts.values())


def test_disagreeing_direct_scores_fall_back_to_the_expansion(make_model, monkeypatch):
    model = make_model("llama")
    expanded = decoded(model, "eager", policy="restkv")
    monkeypatch.setattr(scoring, "DIRECT_DEVICES", ("cuda", "cpu"))
    real = decoded(model, "eager", policy="restkv")  # the real direct path agrees within the check's tolerance
    assert real.tokens == expanded.tokens and CHECKS.drain() == []
    CHECKS.clear()
    monkeypatch.setattr(scoring, "reconstruction_direct", lambda a, v, g, tau, chunk=None: a.flip(-1))
    faked = decoded(model, "eager", policy="restkv")
    assert faked.tokens == expanded.tokens and faked.kept_tokens == expanded.kept_tokens
    (message,) = CHECKS.drain()
    assert message.startswith("scoring direct -> expanded: outputs differ")
    monkeypatch.setattr(scoring, "reconstruction_direct", lambda *args, **kwargs: 1 / 0)
    with scoring.scoring_path("direct"), pytest.raises(ZeroDivisionError):  # named explicitly: no fallback
        decoded(model, "eager", policy="restkv")


LENGTHS = [5, 12, 3, 9, 7]


def eager_answers(model) -> list[list[int]]:
    with compress(model, get_policy("snapkv", window=8), 64) as compressor:
        return [
            answer(model, p, compressor, "query_aware", n, set(), "eager").tokens
            for p, n in zip(PROMPTS, LENGTHS, strict=True)
        ]


def test_batched_rows_fall_back_with_the_reason_in_each_answer(make_model, monkeypatch):
    model = make_model("llama")
    eager = eager_answers(model)
    gpu_like(monkeypatch, disagreeing_capture(Calls()))
    work = [(i, p, n) for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS, strict=True))]
    with compress(model, get_policy("snapkv", window=8), 64) as compressor:
        session = Session(model, None, compressor, "query_aware", set(), "auto")
        replies = list(batched_answers(session, work, 3, dict))
    assert [key for key, _, _ in replies] == list(range(5))
    assert [reply.tokens for _, reply, _ in replies] == eager
    for _, reply, extras in replies:
        assert reply.decode_path == "eager" and extras["fallbacks"][0].startswith("decode graph -> eager: tokens")


def test_batched_rows_that_pass_the_check_decode_together(make_model, monkeypatch):
    model = make_model("llama")
    eager = eager_answers(model)
    calls = Calls()
    gpu_like(monkeypatch, agreeing_capture(calls))
    work = [(i, p, n) for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS, strict=True))]
    with compress(model, get_policy("snapkv", window=8), 64) as compressor:
        session = Session(model, None, compressor, "query_aware", set(), "auto")
        replies = list(batched_answers(session, work, 3, dict))
    assert [reply.tokens for _, reply, _ in replies] == eager
    assert all(reply.decode_path == "graph" and "fallbacks" not in extras for _, reply, extras in replies)
    assert {extras["decode_batch"] for _, _, extras in replies} == {3}


def _run(tmp_path: Path, decode: str) -> tuple[list[dict], dict]:
    cfg = config(tmp_path, "budget=64", "policy.window=8", f"decode={decode}")
    run_benchmark(cfg, settings(tmp_path, "snapkv"))
    folder = tmp_path / "fake" / "tiny-random-llama" / "snapkv" / "budget64"
    return read_lines(folder), json.loads((folder / "metrics.json").read_text())


def test_a_run_records_the_fallback_and_predicts_as_the_eager_run(tmp_path, monkeypatch):
    eager, _ = _run(tmp_path / "eager", "eager")
    gpu_like(monkeypatch, failing_capture(Calls()))
    checked, metrics = _run(tmp_path / "auto", "auto")
    assert [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in checked] == [
        {k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in eager
    ]
    assert all(r["decode_path"] == "eager" and len(r["fallbacks"]) == 1 for r in checked)
    (message,) = {r["fallbacks"][0] for r in checked}
    assert "fake capture" in message
    assert metrics["decode"]["paths"] == {"eager": 6} and metrics["decode"]["fallbacks"] == {message: 6}


def test_answers_that_part_at_a_near_tie_of_the_eager_loop_agree():
    from restkv.eval.evaluation.decoding import relative_margin, token_disagreement

    assert token_disagreement([1, 2, 3], [1, 2, 3]) is None
    assert token_disagreement([1, 2, 9, 4], [1, 2, 3, 5], [0.5, 0.5, 0.01, 0.5], tie=0.02) is None  # a near tie
    why = token_disagreement([1, 2, 9, 4], [1, 2, 3, 5], [0.5, 0.5, 0.3, 0.5], tie=0.02)
    assert why == "tokens differ from the eager loop's from answer token 2 on (4 vs 4 tokens)"
    assert token_disagreement([1, 2], [1, 2, 3], [0.5, 0.5, 0.5], tie=0.02).startswith("tokens differ")
    assert float(relative_margin(torch.tensor([0.0, 10.0, 9.5]))) == pytest.approx(0.05)


GPU_CASES = [("snapkv", "auto"), ("restkv", "auto"), ("full", "auto"), ("adakv", "auto"), ("adakv", "masked")]


@pytest.mark.gpu
@pytest.mark.parametrize(("policy", "layout"), GPU_CASES)
def test_on_a_gpu_every_layout_keeps_its_fast_path(policy, layout):
    """On CUDA (bfloat16: the fused kernels' dtype) ``decode=auto`` records the step, and every check (the decode
    step, the varlen kernel, the direct distances) passes: no fallback. ``RESTKV_GPU_TESTS_DEVICE=cpu``: the
    eager path, nothing to check."""
    import os

    from conftest import tiny_model

    device = torch.device(os.environ.get("RESTKV_GPU_TESTS_DEVICE", "cuda"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = tiny_model("llama", dtype=dtype).to(device)
    with compress(model, get_policy(policy, window=8), 64, layout=layout) as compressor:
        reply = answer(model, PROMPT, compressor, "query_agnostic", 24, set(), "auto")
    assert CHECKS.drain() == [] and all(v.ok for v in CHECKS.verdicts.values())
    assert reply.decode_path == ("graph" if device.type == "cuda" else "eager")
