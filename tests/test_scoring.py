"""The scoring stages against direct, slow definitions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from restkv import scoring, spatial


def test_ema_weights_equal_the_recursion() -> None:
    rows = torch.rand(2, 3, 7, 11)
    running = rows[..., 0, :]
    for t in range(1, 7):
        running = 0.3 * rows[..., t, :] + 0.7 * running
    torch.testing.assert_close(scoring.aggregate(rows, "ema", 0.3), running)
    backwards = rows[..., -1, :]
    for t in range(5, -1, -1):
        backwards = 0.3 * rows[..., t, :] + 0.7 * backwards
    torch.testing.assert_close(scoring.aggregate(rows, "inv_ema", 0.3), backwards)
    torch.testing.assert_close(scoring.aggregate(rows, "last", 0.3), rows[..., -1, :])
    torch.testing.assert_close(scoring.aggregate(rows, "mean", 0.3), rows.mean(-2))
    torch.testing.assert_close(scoring.aggregate(rows, "sum", 0.3), rows.sum(-2))


def test_unknown_temporal_name_lists_choices() -> None:
    with pytest.raises(ValueError, match="unknown temporal aggregation 'median'; allowed: sum, mean, ema"):
        scoring.aggregate(torch.rand(1, 1, 4, 5), "median", 0.3)


def test_window_attention_is_causal_inside_the_window_and_grouped() -> None:
    queries, keys = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 20, 8)
    attention = scoring.window_attention(queries, keys)
    assert attention.shape == (1, 4, 5, 20)
    torch.testing.assert_close(attention.sum(-1), torch.ones(1, 4, 5))
    for i in range(5):
        assert (attention[:, :, i, 15 + i + 1 :] == 0).all()
        assert (attention[:, :, i, : 15 + i + 1] > 0).all()
    repeated = keys.repeat_interleave(2, dim=1)
    direct = (queries @ repeated.transpose(-1, -2)) / math.sqrt(8)
    direct[..., 15:] += torch.full((5, 5), float("-inf")).triu(1)
    torch.testing.assert_close(attention, direct.softmax(-1))


def test_gram_norm_equals_projected_norm() -> None:
    heads, d, hidden = 4, 8, 32
    weight = torch.randn(hidden, heads * d)
    gram = scoring.output_gram(weight, heads)
    x = torch.randn(heads, 6, d)
    projected = torch.einsum("hnd,chd->hnc", x, weight.view(hidden, heads, d))
    quadratic = ((x @ gram) * x).sum(-1)
    torch.testing.assert_close(quadratic, projected.pow(2).sum(-1), rtol=1e-4, atol=1e-4)


def test_reconstruction_after_is_the_output_change_when_one_token_is_removed() -> None:
    torch.manual_seed(0)
    heads, past, d, hidden = 2, 9, 4, 12
    weight = torch.randn(hidden, heads * d)
    values = torch.randn(1, heads, past, d)
    attention = torch.rand(1, heads, past)
    attention = attention / attention.sum(-1, keepdim=True) * 0.8  # the window holds the rest
    scores = scoring.reconstruction_after(attention, values, scoring.output_gram(weight, heads), tau=1.0)
    per_head = weight.view(hidden, heads, d)
    for h in range(heads):
        a, v = attention[0, h], values[0, h]
        output = a @ v
        for j in range(past):
            rest = torch.cat([a[:j], a[j + 1 :]])
            renormalised = (rest @ torch.cat([v[:j], v[j + 1 :]])) / (1 - a[j])
            change = per_head[:, h] @ (renormalised - output)
            torch.testing.assert_close(scores[0, h, j], change.norm(), rtol=1e-4, atol=1e-6)


def test_saturated_attention_gives_finite_scores_and_ranks_first() -> None:
    values = torch.randn(1, 1, 6, 4)
    attention = torch.zeros(1, 1, 6)
    attention[0, 0, 2] = 1.0
    scores = scoring.reconstruction_after(attention, values, None, tau=1.0)
    assert torch.isfinite(scores).all()
    assert scores[0, 0].argmax() == 2
    assert scores[0, 0, 2] > 0


def test_reconstruction_before_matches_the_direct_definition() -> None:
    torch.manual_seed(1)
    heads, window, length, d, hidden = 2, 3, 10, 4, 8
    weight = torch.randn(hidden, heads * d)
    attention = scoring.window_attention(torch.randn(1, heads, window, d), torch.randn(1, heads, length, d))
    values = torch.randn(1, heads, length, d)
    got = scoring.reconstruction_before(attention, values, scoring.output_gram(weight, heads), 1.0, normalize=True)
    per_head = weight.view(hidden, heads, d)
    for h in range(heads):
        for t in range(window):
            output = attention[0, h, t] @ values[0, h]
            for j in range(length - window):
                a = attention[0, h, t, j]
                expected = a / (1 - a) * (per_head[:, h] @ (output - values[0, h, j])).norm()
                expected = expected / (per_head[:, h] @ output).norm()
                torch.testing.assert_close(got[0, h, t, j], expected, rtol=1e-4, atol=1e-7)


def reference_shifted_average(row: torch.Tensor, kernel: int, shift: int) -> torch.Tensor:
    padded = F.pad(row[None, None], (kernel // 2 - shift, kernel // 2 + shift), mode="replicate")
    return F.avg_pool1d(padded, kernel, stride=1)[0, 0]


@pytest.mark.parametrize(("kernel", "shift"), [(5, 0), (5, 1), (5, -2), (7, 3), (9, -4), (3, 1), (41, 20)])
def test_shifted_average_matches_pad_and_pool(kernel: int, shift: int) -> None:
    rows = torch.rand(2, 3, 30) * torch.logspace(-6, 2, 30)
    got = spatial.shifted_average(rows, torch.full((2, 3), kernel), torch.full((2, 3), shift))
    for b in range(2):
        for h in range(3):
            torch.testing.assert_close(
                got[b, h], reference_shifted_average(rows[b, h], kernel, shift), rtol=1e-5, atol=0
            )


def test_adaptive_kernel_follows_the_reference_formula() -> None:
    drift = torch.tensor([0.0, 1.5, -1.5, 4.2, -4.2, 12.0, -12.0, -4.0])
    kernel, shift = spatial.adaptive_kernel(drift, scale=2.0, min_kernel=5)
    assert kernel.tolist() == [5, 5, 5, 5, 5, 13, 13, 5]
    # floor(s/scale) for s > 0; floor(s/scale) + 1 otherwise (so exactly 0 gives 1, as in their code)
    assert shift.tolist() == [1, 0, 0, 2, -2, 6, -5, -1]


def test_drift_is_positive_when_early_queries_look_later() -> None:
    attention = torch.zeros(1, 1, 4, 20)
    attention[0, 0, :2, 15:18] = 1.0  # first half looks at 15..17
    attention[0, 0, 2:, 2:5] = 1.0  # second half looks at 2..4
    assert spatial.attention_drift(attention, 3).item() == pytest.approx(13.0)


def test_near_cancellation_is_recomputed_exactly() -> None:
    """Values equal to the head output (a dominant token and its duplicates) must not lose digits."""
    torch.manual_seed(2)
    heads, past, d, hidden = 2, 40, 8, 16
    weight = torch.randn(hidden, heads * d)
    values = torch.randn(1, 1, past, d)
    values[0, 0, 10:20] = values[0, 0, 3]  # duplicates of the dominant token
    attention = torch.full((1, heads, past), 1e-4)
    attention[:, :, 3] = 0.99
    scores = scoring.reconstruction_after(attention, values, scoring.output_gram(weight, heads), tau=1.0)
    a, v, w = attention.double(), values.double(), weight.double().view(hidden, heads, d)
    out = torch.einsum("bhp,bpd->bhd", a, v[:, 0])
    change = torch.einsum("chd,bhpd->bhpc", w, out[:, :, None] - v[:, 0][:, None]).norm(dim=-1)
    expected = (a / (1 - a) * change).float()
    torch.testing.assert_close(scores, expected, rtol=1e-4, atol=0)
