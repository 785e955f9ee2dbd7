"""Bootstrap intervals and paired comparisons on constructed per-sample scores with a known answer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from restkv.eval.report.collect import folder_scores, load_runs, sample_scores
from restkv.eval.report.uncertainty import bootstrap_interval, paired_difference


def test_the_interval_covers_the_mean_and_shrinks_with_samples():
    rng = np.random.default_rng(3)
    small = bootstrap_interval(rng.binomial(1, 0.4, 50).tolist())
    large = bootstrap_interval(rng.binomial(1, 0.4, 5000).tolist())
    assert small.low < small.mean < small.high and small.samples == 50
    assert large.low < 40 < large.high  # the true rate, in points
    assert large.high - large.low < (small.high - small.low) / 5
    # a binomial mean's 95 % half-width is about 1.96 sqrt(p(1-p)/n): 1.36 points at n=5000
    assert (large.high - large.low) / 2 == pytest.approx(1.96 * 100 * (0.24 / 5000) ** 0.5, rel=0.15)


def test_a_paired_difference_finds_a_known_gap_that_separate_intervals_hide():
    """Prompts differ a lot in difficulty, shared by both policies; B is A minus 3 points plus small noise."""
    rng = np.random.default_rng(7)
    difficulty = rng.uniform(0, 1, 400)
    a = {f"s{i}": float(x) for i, x in enumerate(difficulty)}
    b = {key: value - 0.03 + float(rng.normal(0, 0.01)) for key, value in a.items()}
    paired = paired_difference(a, b)
    assert paired.mean == pytest.approx(3.0, abs=0.2)
    assert paired.low > 2.5 and paired.high < 3.5 and paired.samples == 400  # the gap is resolved
    one, other = bootstrap_interval(list(a.values())), bootstrap_interval(list(b.values()))
    assert one.low < other.high  # unpaired, the two intervals overlap: the gap would look like noise


def test_paired_difference_uses_shared_ids_only_and_refuses_none():
    assert paired_difference({"x": 1.0, "y": 0.0}, {"x": 0.0, "z": 1.0}).samples == 1
    with pytest.raises(ValueError, match="share no sample id"):
        paired_difference({"x": 1.0}, {"y": 1.0})


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: bootstrap_interval([]), "no scores to bootstrap"),
        (lambda: bootstrap_interval([0.5, float("nan")]), "scores must be finite"),
        (lambda: bootstrap_interval([0.5], resamples=0), "resamples=0 must be an integer >= 1"),
        (lambda: bootstrap_interval([0.5], level=1.0), r"level=1.0 must be in \(0, 1\)"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_sample_scores_read_a_run_folder(tmp_path):
    folder = tmp_path / "ruler" / "m" / "snapkv" / "budget64"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"average": 50.0, "tasks": {}}))
    lines = [{"id": "a", "task": "t", "score": 1.0}, {"id": "b", "task": "t", "score": 0.0}]
    (folder / "predictions.jsonl").write_text("\n".join(json.dumps(line) for line in [*lines, lines[0]]) + "\n")
    (run,) = load_runs(tmp_path)
    assert sample_scores(run) == {"a": 1.0, "b": 0.0}  # an identical repeat (a sample redone) counts once
    changed = [*lines, {**lines[0], "score": 0.5}]
    (folder / "predictions.jsonl").write_text("\n".join(json.dumps(line) for line in changed) + "\n")
    with pytest.raises(ValueError, match=r"sample 'a' has two different results, at lines 1 and 3"):
        folder_scores(folder)
