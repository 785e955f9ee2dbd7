"""HeadKV head files: the retrieval probe, the file format, the micro model's shipped file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from restkv import compress
from restkv.baselines import HeadKV
from restkv.eval.probes.retrieval_heads import (
    Probe,
    RetrievalProbe,
    build_probes,
    layer_windows,
    probe_scores,
    retrieval_scores,
    write_head_scores,
)
from restkv.stages.allocation import load_head_scores

REPO = Path(__file__).resolve().parents[1]
MICRO = REPO / "models" / "micro-llama"


@pytest.mark.parametrize(("arch", "sliding_window"), [("llama", None), ("mistral", 16), ("qwen3", None)])
def test_probe_argmax_equals_the_attention_argmax(make_model, arch: str, sliding_window: int | None) -> None:
    """The probe's per-head peaks (sdpa model, through the integration) equal those of an eager twin's own
    attention weights: GQA (4 query heads on 2 key/value heads), Qwen3's normalised queries, Mistral's window."""
    model = make_model(arch, attn="sdpa")
    twin = make_model(arch, attn="eager")  # same seed: the same weights, attention computed by transformers
    for m in (model, twin):
        m.config.sliding_window = sliding_window
    assert model.config.num_attention_heads == 4 and model.config.num_key_value_heads == 2
    ids = torch.randint(0, 128, (1, 60), generator=torch.Generator().manual_seed(0))
    rows = list(range(30, 59))
    observer = RetrievalProbe(window=1, rows=rows, sliding_windows=layer_windows(model))
    assert layer_windows(model) == ({} if sliding_window is None else dict.fromkeys(range(2), sliding_window))
    with torch.no_grad():
        with compress(model, observer, budget=60) as compressor:
            model(ids, cache=DynamicCache())  # full layers, as probe_scores passes
        attentions = twin(ids, output_attentions=True).attentions  # per layer [1, h, L, L]
    assert compressor.record.kept == [60, 60]  # the probe keeps everything
    assert sorted(observer.argmax) == [0, 1]
    for layer, weights in enumerate(attentions):
        assert torch.equal(observer.argmax[layer], weights[0, :, rows].argmax(-1))
    if sliding_window is not None:  # every peak inside the window (without the mask, some are not)
        assert (observer.argmax[0] > torch.tensor(rows) - sliding_window).all()


def test_a_copying_head_scores_one(make_model) -> None:
    """Scores count copy events: with every head's peak forced on the needle token, every head scores 1."""
    model = make_model("llama")
    probe = Probe(ids=[5, 6, 7, 8, 9, 10, 11, 3, 7, 8, 9], needle_start=2, needle_length=3, answer_start=8)
    scores = probe_scores(model, probe)
    assert scores.shape == (model.config.num_hidden_layers, model.config.num_attention_heads)
    assert ((scores >= 0) & (scores <= 1)).all()
    original = RetrievalProbe.select

    def copy_everywhere(self, inputs, budget):  # the ideal retrieval head: row r peaks on needle token r
        original(self, inputs, budget)
        targets = torch.tensor([2, 3, 4])  # needle positions of the answer tokens 7, 8, 9
        self.argmax[inputs.layer] = targets.expand(inputs.num_heads, -1).clone()

    RetrievalProbe.select = copy_everywhere
    try:
        assert torch.equal(probe_scores(model, probe), torch.ones_like(scores))
    finally:
        RetrievalProbe.select = original


def test_head_file_has_every_layer_and_head(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(MICRO).eval()
    probes = build_probes(AutoTokenizer.from_pretrained(MICRO), [128], [0.2, 0.8], samples=2)
    assert len(probes) == 4 and all(len(p.ids) == 128 for p in probes)
    for p in probes:  # the answer is the needle
        assert p.answer == p.ids[p.needle_start : p.needle_start + p.needle_length]
    path = write_head_scores(tmp_path / "heads.json", retrieval_scores(model, probes, progress=False))
    raw = json.loads(path.read_text())
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    assert list(raw) == [f"{layer}-{head}" for layer in range(layers) for head in range(heads)]
    assert all(len(v) == 4 for v in raw.values())
    assert load_head_scores(path, layers, heads).shape == (layers, heads)


def test_the_micro_model_ships_its_head_file() -> None:
    config = json.loads((MICRO / "config.json").read_text())
    raw = json.loads((MICRO / "head_scores.json").read_text())
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    assert set(raw) == {f"{layer}-{head}" for layer in range(layers) for head in range(heads)}
    assert all(v and all(0 <= x <= 1 for x in v) for v in raw.values())
    importance = load_head_scores(MICRO / "head_scores.json", layers, heads)
    assert importance.sum() > 0, "no head copies: HeadKV's shares would be undefined"


def test_headkv_runs_on_the_micro_model_with_its_file() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MICRO).eval()
    policy = HeadKV(head_scores=str(MICRO / "head_scores.json"))
    ids = torch.randint(0, model.config.vocab_size, (1, 600), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), compress(model, policy, budget=128) as compressor:
        model(ids, cache=DynamicCache(config=model.config))
    kept = compressor.record.kept
    importance = load_head_scores(MICRO / "head_scores.json", len(kept), model.config.num_attention_heads)
    # the budget follows the file: the layer whose heads copy keeps the most, heads that never copy the least
    assert max(range(len(kept)), key=kept.__getitem__) == int(importance.sum(-1).argmax())
    assert min(kept) == 34  # budget - budget // 1.01 = 2 past tokens, plus the 32-token window


def test_require_correct_counts_only_tokens_the_model_predicts(make_model) -> None:
    """With ``require_correct`` a copy counts only where the top-1 prediction is the answer token."""
    model = make_model("llama")
    probe = Probe(ids=[5, 6, 7, 8, 9, 10, 11, 3, 7, 8, 9], needle_start=2, needle_length=3, answer_start=8)
    with torch.no_grad():
        predicted = model(torch.tensor([probe.ids])).logits[0, 7:10].argmax(-1)
    right = (predicted == torch.tensor(probe.answer)).float()
    original = RetrievalProbe.select

    def copy_everywhere(self, inputs, budget):
        original(self, inputs, budget)
        self.argmax[inputs.layer] = torch.tensor([2, 3, 4]).expand(inputs.num_heads, -1).clone()

    RetrievalProbe.select = copy_everywhere
    try:
        scores = probe_scores(model, probe, require_correct=True)
    finally:
        RetrievalProbe.select = original
    assert torch.allclose(scores, torch.full_like(scores, float(right.mean())))


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("compute_head_scores", REPO / "scripts" / "compute_head_scores.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lengths", "0"], "probe length 0 is not allowed; lengths are token counts >= 64"),
        (["--lengths", "1024", "99999"], "probe length 99999 is not allowed: the model has positions for 4096"),
        (["--depths", "1.5"], "depth 1.5 is not allowed; depths are fractions in [0, 1]"),
        (["--depths", "-0.1"], "depth -0.1 is not allowed"),
        (["--samples", "0"], "samples=0 is not allowed"),
        (["--device", "tpu"], "--device='tpu' is not a device"),
        (["--model", "models/no-such-model"], "--model='models/no-such-model' is not a folder"),
        (["--haystack", "/no/such/haystack"], "haystack source /no/such/haystack does not exist"),
    ],
)
def test_bad_values_are_refused_by_name(args: list[str], message: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """Each bad setting is named, with what is allowed, before any weights load and without writing a file."""
    script = _script()

    def no_loading(*_, **__):
        raise AssertionError("the weights were loaded before the settings were checked")

    monkeypatch.setattr(script, "load_model", no_loading)
    code = script.main(["--model", str(MICRO), "--out", str(tmp_path / "h.json"), *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "h.json").exists()


def test_the_script_writes_a_head_file(tmp_path: Path, capsys) -> None:
    """End to end on the micro model: the file, where it went and the top heads are printed."""
    out = tmp_path / "heads.json"
    code = _script().main(
        ["--model", str(MICRO), "--out", str(out), "--lengths", "128", "--depths", "0.5", "--samples", "2"]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert str(out) in printed and "top heads" in printed
    raw = json.loads(out.read_text())
    assert len(raw) == 24 and all(len(v) == 2 for v in raw.values())
