"""HeadKV head files: the retrieval probe, the file format, the micro model's shipped file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from baselines import HeadKV
from eval.retrieval_heads import Probe, RetrievalProbe, build_probes, probe_scores, retrieval_scores, write_head_scores
from restkv import compress
from restkv.allocation import load_head_scores

REPO = Path(__file__).resolve().parents[1]
MICRO = REPO / "models" / "micro-llama"


def test_probe_argmax_equals_the_attention_argmax(make_model) -> None:
    """The probe's per-head peaks equal those of the model's own eager attention weights."""
    model = make_model("llama", attn="eager")
    ids = torch.randint(0, 128, (1, 60), generator=torch.Generator().manual_seed(0))
    rows = list(range(40, 59))
    observer = RetrievalProbe(window=1, rows=rows)
    with torch.no_grad():
        with compress(model, observer, budget=60):
            model(ids, cache=DynamicCache(config=model.config))
        attentions = model(ids, output_attentions=True).attentions  # per layer [1, h, L, L]
    for layer, weights in enumerate(attentions):
        assert torch.equal(observer.argmax[layer], weights[0, :, rows].argmax(-1))


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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lengths", "0"], "probe length 0 is not allowed"),
        (["--depths", "1.5"], "depth 1.5 is not allowed"),
        (["--samples", "0"], "samples=0 is not allowed"),
    ],
)
def test_bad_values_are_refused_by_name(args: list[str], message: str, tmp_path: Path, capsys) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("compute_head_scores", REPO / "scripts" / "compute_head_scores.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    code = script.main(["--model", str(MICRO), "--out", str(tmp_path / "h.json"), *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "h.json").exists()
