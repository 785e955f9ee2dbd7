"""The latency benchmark's scoring mode at tiny sizes: the record, its ratios, the variants' calls, the formula."""

from __future__ import annotations

import ast
import json
import statistics
from pathlib import Path

import pytest
import torch

from restkv import scoring
from restkv.eval.latency.cli import run
from restkv.eval.latency.scoring_mode import (
    LayerShape,
    authors_scores,
    authors_select,
    decision,
    random_layer,
    variants,
)
from restkv.eval.latency.settings import Settings
from restkv.restkv import ReSTKV

SCORING_FIELDS = {
    "context",
    "budget",
    "variant",
    "policy",
    "seconds_median",
    "seconds_min",
    "seconds",
    "call_seconds",
    "peak_memory_bytes",
    "peak_memory_delta_bytes",
    "peak_memory_delta_bytes_rounds",
}
WINDOW = 8


def scoring_settings(tmp_path: Path, **changes) -> Settings:
    values = {
        "name": "scoring-test",
        "mode": "scoring",
        "shape": "tiny-llama",
        "device": "cpu",
        "contexts": [96],
        "budgets": [40],
        "policies": ["snapkv", "restkv"],
        "policy_knobs": {"snapkv": {"window": WINDOW}, "restkv": {"window": WINDOW}},
        "warmup": 0,
        "repeats": 2,
        "scoring_calls": 2,
        "scoring_authors": True,
        "out_dir": str(tmp_path),
        "progress": False,
    }
    values.update(changes)
    return Settings(**values)


def test_scoring_mode_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = run(scoring_settings(tmp_path), "test")
    saved = json.loads((tmp_path / "scoring-test.json").read_text())
    assert saved == json.loads(json.dumps(record))
    assert saved["model"]["layer"] == {"heads": 4, "kv_heads": 2, "head_dim": 16, "hidden": 64}
    assert [e["variant"] for e in saved["scoring"]] == ["snapkv", "restkv", "restkv+gram", "authors"]
    assert {v: d["window"] for v, d in saved["variants"].items()} == dict.fromkeys(saved["variants"], WINDOW)
    entries = {e["variant"]: e for e in saved["scoring"]}
    for entry in saved["scoring"]:
        assert set(entry) >= SCORING_FIELDS, SCORING_FIELDS - set(entry)
        assert len(entry["seconds"]) == 2 and all(len(calls) == 2 for calls in entry["call_seconds"])
        assert entry["seconds"] == pytest.approx([statistics.median(c) for c in entry["call_seconds"]], rel=1e-5)
        assert entry["seconds_median"] == pytest.approx(statistics.median(entry["seconds"]), rel=1e-5)
        assert entry["seconds_min"] == min(entry["seconds"])
        assert entry["peak_memory_bytes"] > entry["peak_memory_delta_bytes"] > 0
    assert saved["memory_method"] and any("fresh process" in note for note in saved["notes"])

    rows = {r["variant"]: r for r in saved["ratios"]["scoring"]}
    assert set(rows) == {"restkv", "restkv+gram", "authors"}  # SnapKV is the reference, not a row
    for variant, row in rows.items():
        expected = round(entries[variant]["seconds_median"] / entries["snapkv"]["seconds_median"], 4)
        assert row["time_vs_snapkv"] == expected
        assert row["time_vs_snapkv_min"] == round(entries[variant]["seconds_min"] / entries["snapkv"]["seconds_min"], 4)
        memory = entries[variant]["peak_memory_bytes"] / entries["snapkv"]["peak_memory_bytes"]
        assert row["peak_memory_vs_snapkv"] == round(memory, 4)
        assert ("time_vs_authors" in row) == (variant != "authors")  # ours against the authors' formulation
    assert rows["restkv"]["time_vs_authors"] == round(
        entries["restkv"]["seconds_median"] / entries["authors"]["seconds_median"], 4
    )

    printed = capsys.readouterr().out
    assert "scoring ratios:" in printed and "4 query heads, 2 key/value heads" in printed
    assert f"restkv: time {rows['restkv']['time_vs_snapkv']:.3f}x SnapKV's" in printed
    assert f"{rows['restkv']['time_vs_authors']:.3f}x the authors' formulation's" in printed
    assert {p.name for p in tmp_path.glob("*.png")} == {"scoring-test-latency.png", "scoring-test-memory.png"}


def test_variants_follow_the_settings(tmp_path: Path) -> None:
    assert variants(scoring_settings(tmp_path, scoring_gram_every_call=False, scoring_authors=False)) == [
        ("snapkv", "snapkv"),
        ("restkv", "restkv"),
    ]
    assert variants(scoring_settings(tmp_path))[-2:] == [("restkv+gram", "restkv"), ("authors", "restkv")]


@pytest.mark.parametrize(
    ("variant", "policy", "grams"), [("snapkv", "snapkv", 0), ("restkv", "restkv", 1), ("restkv+gram", "restkv", 3)]
)
def test_gram_cached_or_recomputed_every_call(
    tmp_path: Path, monkeypatch, variant: str, policy: str, grams: int
) -> None:
    computed = []
    original = scoring.output_gram
    monkeypatch.setattr(scoring, "output_gram", lambda *a: computed.append(1) or original(*a))
    job = {"kind": "scoring", "context": 96, "budget": 40, "variant": variant, "policy": policy}
    call = decision(scoring_settings(tmp_path), job, torch.device("cpu"))
    kept = [call() for _ in range(3)]
    assert len(computed) == grams  # cached: once, before the calls; +gram: in each of the 3 calls
    assert kept[0].shape == (1, 2, 40) and all(torch.equal(kept[0], k) for k in kept)


def test_authors_formulation_gives_the_same_scores(tmp_path: Path) -> None:
    settings = scoring_settings(tmp_path)
    shape = LayerShape(heads=4, kv_heads=2, head_dim=16, hidden=64)
    weight, inputs = random_layer(shape, 96, WINDOW, settings, torch.device("cpu"))
    attention = scoring.window_attention(inputs.queries, inputs.keys)
    row = scoring.aggregate(attention, "ema", 0.3)[..., : 96 - WINDOW]
    ours = scoring.reconstruction_after(row, inputs.values, scoring.output_gram(weight, shape.heads), tau=1.0)
    theirs = authors_scores(row, inputs.values, weight)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-6)
    assert authors_select(ReSTKV(window=WINDOW), inputs, weight, 40).shape == (1, 4, 40 - WINDOW)
    with pytest.raises(ValueError, match="authors"):
        authors_select(ReSTKV(window=WINDOW, order="before"), inputs, weight, 40)


def test_scoring_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="full cache evicts nothing"):
        scoring_settings(tmp_path, policies=["full", "snapkv"])
    with pytest.raises(ValueError, match=r"latency\.mode"):
        scoring_settings(tmp_path, mode="scores")
    with pytest.raises(ValueError, match="scoring_calls"):
        scoring_settings(tmp_path, scoring_calls=0)


def test_memory_module_depends_on_no_other_latency_module() -> None:
    """Dependencies point one way: the jobs and the scoring mode hand memory.py their work, not the reverse."""
    tree = ast.parse((Path(__file__).resolve().parents[1] / "eval/latency/memory.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("eval")}, imported
