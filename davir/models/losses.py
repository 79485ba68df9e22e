"""Training losses, one function per paper equation, grouped by paper.

Sections:
* Shared: the caption cross-entropy every captioner uses.
* DAVIR (Fine-grained Attention Control, §3.2 and §3.4): Eqs. 6, 7 and 12, plus the MSE / CE variants of
  the attention loss compared in its Table 6.

Other papers' losses (SCORER+CBR, DIRL+CCR, RDD+ACR, CHEER) get their own sections.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------------------------------
# Shared
# ---------------------------------------------------------------------------------------------------------------------

IGNORE_INDEX = -100


def caption_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """L_caption (DAVIR Eq. 12): next-token cross-entropy averaged over the caption tokens of the batch.

    ``logits`` (B, L, V) are the LM outputs at every input position, ``labels`` (B, L) the token to predict
    at each position *itself* (the usual HF convention); the shift by one happens here. Positions labelled
    ``ignore_index`` (visual tokens, prompt, padding) do not count. Computed in float32.
    """
    if logits.shape[:2] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree on (B, L)")
    shift_logits = logits[:, :-1].float()
    shift_labels = labels[:, 1:]
    return F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1), ignore_index=ignore_index
    )


# ---------------------------------------------------------------------------------------------------------------------
# DAVIR: Fine-grained Attention Control (FAC), §3.2, and the joint objective, §3.4
# ---------------------------------------------------------------------------------------------------------------------

ATTN_NORMS = ("sum", "softmax")
KL_DIRECTIONS = ("attn_mask", "mask_attn")
FAC_LOSS_TYPES = ("kl", "mse", "ce")
MASK_SOURCES = ("per_image", "union", "after_only")


@dataclass
class FacConfig:
    """Settings of FAC and its weight in the joint loss; the defaults are Eq. 7 as written (paper silent unless
    marked [P]; every [D] is a switch a config turns on, docs/paper_departures.md).

    * ``lambda_attn``: λ of Eq. 12 [P: 0.1, Table 7]; 0 turns FAC off.
    * ``loss_type``: ``kl`` [P, Eq. 7]; ``mse`` and ``ce`` are the Table 6 alternatives.
    * ``attn_norm``: how maps become distributions over patches. ``softmax`` (the default) is σ of Eq. 7 as
      written; but attention probabilities and the soft mask both lie in [0, 1], and a softmax of values in
      [0, 1] is within a factor e of uniform, so both distributions are nearly flat and the gradient is weak.
      ``sum`` [D] renormalises instead: P_A = A / ΣA, P_M = (M^ + eps) / Σ(M^ + eps). Its KL is ~1000x the
      softmax one for the same maps (10.5 vs 0.010 nats at the start of the demo), so λ means something else
      in each: docs/experiments/results.md, "What λ means". The demo uses ``sum``.
    * ``kl_direction``: ``attn_mask`` = KL(P_A ‖ P_M) as written (mode-seeking: attention moves inside the
      mask); ``mask_attn`` [D] = KL(P_M ‖ P_A) (mass-covering).
    * ``blur_kernel_size``/``blur_sigma``: the Gaussian of Eq. 6, in patch units (3×3, σ = 1).
    * ``mask_source``: which mask supervises which image. ``after_only`` (the default): both maps against the
      after-image mask (Eq. 7 as written: one M, from I_t); [D] ``per_image``: the before map against the
      before-image mask, the after map against the after-image mask (a removed object is only in the before
      image's mask; the demo uses it); [D] ``union``: both against their union.
    """

    lambda_attn: float = 0.1
    loss_type: Literal["kl", "mse", "ce"] = "kl"
    attn_norm: Literal["sum", "softmax"] = "softmax"
    kl_direction: Literal["attn_mask", "mask_attn"] = "attn_mask"
    blur_kernel_size: int = 3
    blur_sigma: float = 1.0
    eps: float = 1e-6
    mask_source: Literal["per_image", "union", "after_only"] = "after_only"

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("loss_type", self.loss_type, FAC_LOSS_TYPES),
            ("attn_norm", self.attn_norm, ATTN_NORMS),
            ("kl_direction", self.kl_direction, KL_DIRECTIONS),
            ("mask_source", self.mask_source, MASK_SOURCES),
        ):
            if value not in allowed:
                raise ValueError(f"FAC {name}={value!r}; choose one of {allowed}")
        # `not (x >= 0)`, not `x < 0`: NaN compares False either way and would train on a NaN loss
        if not (math.isfinite(self.lambda_attn) and self.lambda_attn >= 0):
            raise ValueError(f"FAC lambda_attn must be a finite number >= 0, got {self.lambda_attn}")
        if self.blur_kernel_size < 1 or self.blur_kernel_size % 2 == 0:
            raise ValueError(f"FAC blur_kernel_size must be a positive odd number, got {self.blur_kernel_size}")
        if not all(math.isfinite(v) and v > 0 for v in (self.blur_sigma, self.eps)):
            raise ValueError(f"FAC blur_sigma and eps must be positive, got {self.blur_sigma} and {self.eps}")


def change_mask_target(
    mask: torch.Tensor, grid: tuple[int, int], *, kernel_size: int = 3, sigma: float = 1.0
) -> torch.Tensor:
    """Eq. 6: M^ = GaussianBlur(Downsample(M)), the soft change mask on the patch grid.

    ``mask`` (B, H, W) in [0, 1] at any resolution is average-pooled to ``grid`` = (Hp, Wp) (exact
    average pooling when H, W are multiples of Hp, Wp; adaptive pooling otherwise), then blurred with a
    ``kernel_size``² Gaussian of std ``sigma`` patches (torchvision, reflect padding at the border).
    Returns (B, Hp, Wp) in [0, 1]; an all-zero mask stays all zero.
    """
    if mask.dim() != 3:
        raise ValueError(f"change mask must be (B, H, W), got shape {tuple(mask.shape)}")
    pooled = F.adaptive_avg_pool2d(mask.float().unsqueeze(1), grid)
    if kernel_size > 1:
        from torchvision.transforms.v2.functional import gaussian_blur  # torchvision: ~1 s of imports, FAC only

        pooled = gaussian_blur(pooled, kernel_size=[kernel_size, kernel_size], sigma=[sigma, sigma])
    return pooled.squeeze(1)


def spatial_distribution(values: torch.Tensor, *, norm: str, eps: float = 0.0) -> torch.Tensor:
    """(B, Hp, Wp) map → (B, Hp·Wp) distribution: σ of Eq. 7 (``softmax``) or (x + eps) / Σ(x + eps) (``sum``)."""
    flat = values.float().flatten(1)
    if norm == "softmax":
        return flat.softmax(dim=-1)
    if norm == "sum":
        flat = flat + eps
        return flat / flat.sum(dim=-1, keepdim=True)
    raise ValueError(f"attn_norm={norm!r}; choose one of {ATTN_NORMS}")


def _safe_log(p: torch.Tensor) -> torch.Tensor:
    # Attention probabilities can underflow to exactly 0 in low precision; log(0) would give inf.
    return p.clamp_min(torch.finfo(p.dtype).tiny).log()


def attention_kl(
    attention: torch.Tensor,
    target: torch.Tensor,
    *,
    norm: str = "softmax",
    direction: str = "attn_mask",
    eps: float = 1e-6,
) -> torch.Tensor:
    """One term of Eq. 7, per sample: KL(σ(A) ‖ σ(M^)) (``direction='attn_mask'``, as written) or
    KL(σ(M^) ‖ σ(A)) (``'mask_attn'``). σ = ``spatial_distribution`` with ``norm``; the ``sum`` norm divides
    the attention by its sum and adds ``eps`` to the mask only. Returns (B,)."""
    p_attn = spatial_distribution(attention, norm=norm)
    p_mask = spatial_distribution(target, norm=norm, eps=eps)
    if direction == "attn_mask":
        first, second = p_attn, p_mask
    elif direction == "mask_attn":
        first, second = p_mask, p_attn
    else:
        raise ValueError(f"kl_direction={direction!r}; choose one of {KL_DIRECTIONS}")
    # F.kl_div(input=log Q, target=P) = Σ P (log P − log Q) = KL(P ‖ Q), with 0·log 0 = 0.
    return F.kl_div(_safe_log(second), first, reduction="none").sum(dim=-1)


def attention_mse(
    attention: torch.Tensor, target: torch.Tensor, *, norm: str = "softmax", eps: float = 1e-6
) -> torch.Tensor:
    """Table 6 "MSE" variant of Eq. 7, per sample: mean over the N patches of (N·P_A − N·P_M)².

    The distributions are scaled by N (mean 1) so the value does not shrink with the grid size. Returns (B,).
    """
    p_attn = spatial_distribution(attention, norm=norm)
    p_mask = spatial_distribution(target, norm=norm, eps=eps)
    n = p_attn.shape[-1]
    return ((n * p_attn - n * p_mask) ** 2).mean(dim=-1)


def attention_ce(
    attention: torch.Tensor, target: torch.Tensor, *, norm: str = "softmax", eps: float = 1e-6
) -> torch.Tensor:
    """Table 6 "CE" variant of Eq. 7, per sample: H(P_M, P_A) = −Σ P_M log P_A, the mask distribution as soft
    labels for the attention (= KL(P_M ‖ P_A) + H(P_M), so its gradient equals the ``mask_attn`` KL's).
    Returns (B,)."""
    p_attn = spatial_distribution(attention, norm=norm)
    p_mask = spatial_distribution(target, norm=norm, eps=eps)
    return -(p_mask * _safe_log(p_attn)).sum(dim=-1)


def select_mask_targets(
    mask_before: torch.Tensor | None, mask_after: torch.Tensor | None, source: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which change mask supervises the before map and which the after map (see ``FacConfig.mask_source``).

    ``per_image`` uses each image's own mask, falling back to the union when only one is given; ``union``
    takes the element-wise max of the two; ``after_only`` uses the after-image mask for both (Eq. 7 as written).
    """
    if mask_before is None and mask_after is None:
        raise ValueError("FAC needs at least one change mask (masks_before or masks_after)")
    if source not in MASK_SOURCES:
        raise ValueError(f"mask_source={source!r}; choose one of {MASK_SOURCES}")
    if source == "after_only":
        if mask_after is None:
            raise ValueError("mask_source='after_only' needs masks_after")
        return mask_after, mask_after
    if mask_before is None or mask_after is None:
        only = mask_after if mask_before is None else mask_before
        return only, only
    if mask_before.shape != mask_after.shape:
        raise ValueError(f"before/after masks differ in shape: {tuple(mask_before.shape)} vs {tuple(mask_after.shape)}")
    if source == "union":
        union = torch.maximum(mask_before, mask_after)
        return union, union
    return mask_before, mask_after


def _attention_term(attention: torch.Tensor, target: torch.Tensor, config: FacConfig) -> torch.Tensor:
    if config.loss_type == "kl":
        return attention_kl(attention, target, norm=config.attn_norm, direction=config.kl_direction, eps=config.eps)
    if config.loss_type == "mse":
        return attention_mse(attention, target, norm=config.attn_norm, eps=config.eps)
    return attention_ce(attention, target, norm=config.attn_norm, eps=config.eps)


@dataclass
class FacLoss:
    """Result of :func:`fac_attention_loss`: the loss and how many pairs contributed to it."""

    loss: torch.Tensor
    num_pairs: int


def fac_attention_loss(
    attention_before: torch.Tensor,
    attention_after: torch.Tensor,
    mask_before: torch.Tensor | None,
    mask_after: torch.Tensor | None,
    mask_valid: torch.Tensor | None = None,
    config: FacConfig | None = None,
) -> FacLoss:
    """Eq. 7: L_attn = D(A_bef, M^) + D(A_aft, M^), averaged over the pairs of the batch that have a mask.

    ``attention_*`` (B, Hp, Wp) are the [CLS]→patch maps (Eq. 5); ``mask_*`` (B, H, W) the pixel change masks,
    turned into soft patch targets by Eq. 6 (``change_mask_target``) after ``select_mask_targets``. D is KL
    (default), MSE or CE per ``config``. A term whose target mask is empty, or whose pair has
    ``mask_valid`` False, is left out: a uniform target would teach uniform attention. The sum of the
    remaining terms is divided by the number of pairs with at least one term; with none, the loss is 0
    (kept in the autograd graph so every parameter still receives a gradient, as DDP expects).
    """
    config = FacConfig() if config is None else config
    if attention_before.shape != attention_after.shape or attention_before.dim() != 3:
        raise ValueError(
            "attention maps must both be (B, Hp, Wp), "
            f"got {tuple(attention_before.shape)} and {tuple(attention_after.shape)}"
        )
    batch, grid = attention_before.shape[0], tuple(attention_before.shape[1:])
    target_before, target_after = select_mask_targets(mask_before, mask_after, config.mask_source)
    # Bool/uint8 masks are accepted; everything below works on float masks on the attention's device.
    target_before = target_before.to(device=attention_before.device, dtype=torch.float32)
    target_after = target_after.to(device=attention_before.device, dtype=torch.float32)
    for name, mask in (("before", target_before), ("after", target_after)):
        if mask.dim() != 3 or mask.shape[0] != batch:
            raise ValueError(f"{name} change masks must be (B={batch}, H, W), got {tuple(mask.shape)}")
    valid = torch.ones(batch, dtype=torch.bool, device=attention_before.device)
    if mask_valid is not None:
        if mask_valid.shape != (batch,):
            raise ValueError(f"mask_valid must be (B={batch},), got {tuple(mask_valid.shape)}")
        valid = valid & mask_valid.to(device=valid.device, dtype=torch.bool)
    valid_before = valid & (target_before.flatten(1).amax(dim=1) > 0).to(valid.device)
    valid_after = valid & (target_after.flatten(1).amax(dim=1) > 0).to(valid.device)
    num_pairs = int((valid_before | valid_after).sum())
    if num_pairs == 0:
        return FacLoss(loss=(attention_before.sum() + attention_after.sum()) * 0.0, num_pairs=0)

    total = attention_before.new_zeros((), dtype=torch.float32)
    for attention, target, keep in (
        (attention_before, target_before, valid_before),
        (attention_after, target_after, valid_after),
    ):
        if keep.any():
            soft = change_mask_target(target[keep], grid, kernel_size=config.blur_kernel_size, sigma=config.blur_sigma)
            total = total + _attention_term(attention[keep], soft, config).sum()
    return FacLoss(loss=total / num_pairs, num_pairs=num_pairs)


def davir_total_loss(caption_loss: torch.Tensor, attn_loss: torch.Tensor, lambda_attn: float = 0.1) -> torch.Tensor:
    """Eq. 12: L_total = L_caption + λ · L_attn (λ = 0.1, paper Table 7)."""
    return caption_loss + lambda_attn * attn_loss
