"""DAVIR FAC equations (Eqs. 6, 7, 12) and the caption cross-entropy against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from davir.models.losses import (
    FacConfig,
    attention_ce,
    attention_kl,
    attention_mse,
    caption_cross_entropy,
    change_mask_target,
    davir_total_loss,
    fac_attention_loss,
    select_mask_targets,
    spatial_distribution,
)

# 1-D Gaussian, 3 taps, σ = 1 patch: weights ∝ (e^-1/2, 1, e^-1/2).
W_CENTRE = 1.0 / (1.0 + 2.0 * math.exp(-0.5))  # 0.451863
W_SIDE = math.exp(-0.5) / (1.0 + 2.0 * math.exp(-0.5))  # 0.274069


def _kl(p: list[float], q: list[float]) -> float:
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)


def _softmax(xs: list[float]) -> list[float]:
    exps = [math.exp(x) for x in xs]
    return [e / sum(exps) for e in exps]


# -------------------------------------------------------------------------------------------------- Eq. 6
def test_eq6_average_pool_without_blur():
    mask = torch.zeros(1, 8, 8)
    mask[0, 2:4, 2:4] = 1.0  # patch (1, 1) fully covered
    mask[0, 7, 7] = 1.0  # 1 of the 4 pixels of patch (3, 3)
    target = change_mask_target(mask, (4, 4), kernel_size=1)
    expected = torch.zeros(1, 4, 4)
    expected[0, 1, 1] = 1.0
    expected[0, 3, 3] = 0.25
    torch.testing.assert_close(target, expected)


def test_eq6_blur_of_one_patch_with_reflect_border():
    mask = torch.zeros(1, 8, 8)
    mask[0, 2:4, 2:4] = 1.0  # pooled: a single 1 at patch (1, 1) of a 4×4 grid
    target = change_mask_target(mask, (4, 4), kernel_size=3, sigma=1.0)
    # Separable blur of the row [0, 1, 0, 0] with reflect padding: position 0 sees x[1] on both sides.
    profile = [2 * W_SIDE, W_CENTRE, W_SIDE, 0.0]
    expected = torch.tensor([[a * b for b in profile] for a in profile]).unsqueeze(0)
    torch.testing.assert_close(target, expected, rtol=0, atol=1e-6)
    assert target.min() >= 0 and target.max() <= 1


def test_eq6_two_by_two_grid_and_empty_mask():
    mask = torch.zeros(2, 4, 4)
    mask[0, :2, :2] = 1.0  # pooled [[1, 0], [0, 0]]
    target = change_mask_target(mask, (2, 2), kernel_size=3, sigma=1.0)
    expected = torch.tensor([[W_CENTRE**2, 2 * W_CENTRE * W_SIDE], [2 * W_CENTRE * W_SIDE, 4 * W_SIDE**2]])
    torch.testing.assert_close(target[0], expected, rtol=0, atol=1e-6)
    assert torch.equal(target[1], torch.zeros(2, 2))  # an empty mask stays empty


# -------------------------------------------------------------------------------------------------- Eq. 7
ATTN = torch.tensor([[[0.4, 0.2], [0.2, 0.1]]])  # [CLS]→patch row, sums to 0.9 (the rest went to [CLS])
TARGET = torch.tensor([[[0.5, 0.25], [0.25, 0.0]]])
P_ATTN_SUM = [0.4 / 0.9, 0.2 / 0.9, 0.2 / 0.9, 0.1 / 0.9]
P_MASK_SUM = [v / 1.04 for v in (0.51, 0.26, 0.26, 0.01)]  # (M^ + 0.01) / Σ(M^ + 0.01)


def test_spatial_distribution_sum_and_softmax():
    torch.testing.assert_close(spatial_distribution(ATTN, norm="sum"), torch.tensor([P_ATTN_SUM]))
    torch.testing.assert_close(spatial_distribution(TARGET, norm="sum", eps=0.01), torch.tensor([P_MASK_SUM]))
    softmax = torch.tensor([_softmax([0.4, 0.2, 0.2, 0.1])])
    torch.testing.assert_close(spatial_distribution(ATTN, norm="softmax"), softmax)


def test_eq7_kl_sum_norm_as_written():
    value = attention_kl(ATTN, TARGET, norm="sum", direction="attn_mask", eps=0.01)
    assert value.shape == (1,)
    assert value.item() == pytest.approx(_kl(P_ATTN_SUM, P_MASK_SUM), rel=1e-5)
    assert value.item() == pytest.approx(0.175842, abs=1e-5)


def test_eq7_kl_reverse_direction_differs():
    forward = attention_kl(ATTN, TARGET, norm="sum", direction="attn_mask", eps=0.01).item()
    reverse = attention_kl(ATTN, TARGET, norm="sum", direction="mask_attn", eps=0.01).item()
    assert reverse == pytest.approx(_kl(P_MASK_SUM, P_ATTN_SUM), rel=1e-5)
    assert reverse == pytest.approx(0.083598, abs=1e-5)
    assert abs(forward - reverse) > 0.05


def test_eq7_kl_softmax_norm_is_nearly_flat():
    p_attn = _softmax([0.4, 0.2, 0.2, 0.1])
    p_mask = _softmax([0.5, 0.25, 0.25, 0.0])
    value = attention_kl(ATTN, TARGET, norm="softmax", direction="attn_mask").item()
    assert value == pytest.approx(_kl(p_attn, p_mask), abs=1e-6)
    # The literal softmax leaves both nearly uniform: the KL is ~20× smaller than with the sum norm.
    assert value < attention_kl(ATTN, TARGET, norm="sum", eps=0.01).item() / 20


def test_eq7_kl_is_zero_when_attention_matches_the_mask():
    target = torch.tensor([[[0.6, 0.2], [0.1, 0.1]]])
    attention = target * 0.8  # same shape of distribution, 20% of the mass on [CLS]
    assert attention_kl(attention, target, norm="sum", eps=1e-9).item() == pytest.approx(0.0, abs=1e-6)
    # Eq. 7's softmax (the default) is not scale-invariant: the same shape at 0.8x its values is a different σ
    assert attention_kl(attention, target).item() > 1e-4


def test_table6_mse_and_ce_variants():
    n = 4
    mse = attention_mse(ATTN, TARGET, norm="sum", eps=0.01).item()
    assert mse == pytest.approx(sum((n * a - n * m) ** 2 for a, m in zip(P_ATTN_SUM, P_MASK_SUM)) / n, rel=1e-5)
    ce = attention_ce(ATTN, TARGET, norm="sum", eps=0.01).item()
    assert ce == pytest.approx(-sum(m * math.log(a) for a, m in zip(P_ATTN_SUM, P_MASK_SUM)), rel=1e-5)
    entropy = -sum(m * math.log(m) for m in P_MASK_SUM)
    assert ce == pytest.approx(_kl(P_MASK_SUM, P_ATTN_SUM) + entropy, rel=1e-5)


def test_eq7_summed_over_images_and_averaged_over_pairs_with_a_mask():
    attention_before = torch.tensor([[[0.4, 0.2], [0.2, 0.1]], [[0.3, 0.3], [0.2, 0.1]], [[0.2, 0.2], [0.2, 0.3]]])
    attention_after = torch.tensor([[[0.1, 0.2], [0.3, 0.3]], [[0.25, 0.25], [0.2, 0.2]], [[0.5, 0.1], [0.1, 0.2]]])
    mask_before = torch.zeros(3, 4, 4)
    mask_after = torch.zeros(3, 4, 4)
    mask_before[0, :2, :2] = 1.0  # pair 0: both masks
    mask_after[0, 2:, 2:] = 1.0
    mask_after[1, :2, 2:] = 1.0  # pair 1: after mask only ("add")
    mask_before[2, :2, :2] = 1.0  # pair 2: has masks but is flagged invalid
    mask_after[2, :2, :2] = 1.0
    valid = torch.tensor([True, True, False])
    config = FacConfig(eps=1e-6, blur_kernel_size=3, blur_sigma=1.0, mask_source="per_image")

    result = fac_attention_loss(attention_before, attention_after, mask_before, mask_after, valid, config)

    def term(attention, mask):
        return attention_kl(attention[None], change_mask_target(mask[None], (2, 2)), eps=1e-6).item()

    expected = (
        term(attention_before[0], mask_before[0])
        + term(attention_after[0], mask_after[0])
        + term(attention_after[1], mask_after[1])
    ) / 2  # two pairs contribute; pair 1's empty before-mask and pair 2 contribute nothing
    assert result.num_pairs == 2
    assert result.loss.item() == pytest.approx(expected, rel=1e-5)


def test_eq7_union_and_after_only_mask_sources():
    before = torch.zeros(1, 4, 4)
    after = torch.zeros(1, 4, 4)
    before[0, 0, 0] = 1.0
    after[0, 3, 3] = 1.0
    union_b, union_a = select_mask_targets(before, after, "union")
    assert torch.equal(union_b, union_a) and union_b.sum().item() == 2.0
    after_b, after_a = select_mask_targets(before, after, "after_only")
    assert after_b is after and after_a is after
    per_b, per_a = select_mask_targets(before, after, "per_image")
    assert per_b is before and per_a is after
    with pytest.raises(ValueError, match="needs masks_after"):
        select_mask_targets(before, None, "after_only")


def test_empty_masks_give_a_zero_term_that_keeps_the_graph():
    attention = torch.full((2, 2, 2), 0.2, requires_grad=True)
    result = fac_attention_loss(attention, attention, torch.zeros(2, 8, 8), torch.zeros(2, 8, 8))
    assert result.num_pairs == 0
    assert result.loss.item() == 0.0
    result.loss.backward()
    assert torch.equal(attention.grad, torch.zeros(2, 2, 2))


def test_fac_loss_moves_attention_into_the_mask():
    logits = torch.zeros(1, 4, 4, requires_grad=True)
    mask = torch.zeros(1, 16, 16)
    mask[0, :4, :4] = 1.0  # patch (0, 0)
    attention = logits.flatten(1).softmax(-1).reshape(1, 4, 4)
    fac_attention_loss(attention, attention, mask, mask).loss.backward()
    # Descending the gradient raises the logit of the masked patch more than any other.
    assert torch.argmin(logits.grad.flatten()).item() == 0


def test_fac_defaults_are_eq7_as_written():
    """σ = softmax and the one after-image mask for both maps; the toolkit's sum / per-image are [D]s a config sets."""
    config = FacConfig()
    assert (config.attn_norm, config.mask_source, config.loss_type, config.kl_direction, config.lambda_attn) == (
        "softmax",
        "after_only",
        "kl",
        "attn_mask",
        0.1,
    )
    before, after = torch.zeros(1, 4, 4), torch.zeros(1, 4, 4)
    before[0, 0, 0], after[0, 3, 3] = 1.0, 1.0
    attention = torch.rand(1, 2, 2, generator=torch.Generator().manual_seed(0))
    default = fac_attention_loss(attention, attention, before, after).loss
    assert float(default) == float(fac_attention_loss(attention, attention, after, after).loss)  # the after mask only
    toolkit = FacConfig(attn_norm="sum", mask_source="per_image")
    assert float(fac_attention_loss(attention, attention, before, after, config=toolkit).loss) > 5 * float(
        default
    )  # 7.8x


def test_bad_fac_settings_are_rejected():
    with pytest.raises(ValueError, match="loss_type"):
        FacConfig(loss_type="l1")
    with pytest.raises(ValueError, match="odd"):
        FacConfig(blur_kernel_size=4)
    with pytest.raises(ValueError, match=r"\(B, H, W\)"):
        change_mask_target(torch.zeros(4, 4), (2, 2))


# ------------------------------------------------------------------------------------------- Eq. 12 and L_caption
def test_eq12_total_loss():
    total = davir_total_loss(torch.tensor(2.0), torch.tensor(3.0), 0.1)
    assert total.item() == pytest.approx(2.3)
    assert davir_total_loss(torch.tensor(2.0), torch.tensor(3.0), 0.0).item() == pytest.approx(2.0)


def test_caption_cross_entropy_shifts_and_ignores_masked_positions():
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [5.0, -5.0]]])
    labels = torch.tensor([[-100, 0, 1]])
    # Position 0 predicts label 0 with p = 1/2; position 1 predicts label 1 with p = 1/(3 + 1) = 1/4.
    expected = (math.log(2.0) + math.log(4.0)) / 2
    assert caption_cross_entropy(logits, labels).item() == pytest.approx(expected, rel=1e-6)
