"""Loss library of the lightweight family: caption XE, one in-batch InfoNCE, DIRL's cross-correlation, CHEER's gate MSE.

| loss                          | function                     | used as                                        |
|-------------------------------|------------------------------|------------------------------------------------|
| caption cross-entropy         | `caption_cross_entropy`      | every method (token mean; RDD Eq. 15 sentence mean) |
| in-batch InfoNCE              | `info_nce` (+ `similarity`,  | SCORER L_cv / L_cbr (MTM, learnable scale),    |
|                               | `masked_mean`)               | DIRL L_ccr (dot, τ=0.5), RDD L_N2O/L_V2A (cosine, τ), CHEER L_I |
| cross-correlation             | `cross_correlation_loss`     | DIRL L_dirl (Eqs. 3-4)                         |
| gate consistency              | `gate_consistency_loss`      | CHEER L_C, L_D (Eqs. 7, 11; MSE)               |
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from davir.text.vocab import IGNORE_INDEX, PAD_ID


def caption_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    reduction: str = "token_mean",
    ignore_ids: tuple[int, ...] = (IGNORE_INDEX, PAD_ID),
) -> torch.Tensor:
    """Caption loss L_cap = −Σ_t log p(w*_t | w*_<t) (SCORER Eq. 12, DIRL Eq. 15, CHEER Eq. 18, RDD Eq. 15).

    logits (B, T, V), targets (B, T); positions whose target is in `ignore_ids` (−1 padding, and <NULL>)
    do not count.

    * ``token_mean`` [C]: the mean over all counted tokens of the batch (`CrossEntropyLoss(ignore_index=-1)`).
    * ``sentence_mean`` (RDD Eq. 15): ``−(1/B) Σ_i (1/L_i) Σ_j log p``, each sentence's mean first;
      sentences with no counted token are left out of the batch mean.
    """
    valid = torch.ones_like(targets, dtype=torch.bool)
    for ignored in ignore_ids:
        valid &= targets != ignored
    if not bool(valid.any()):
        raise ValueError("caption targets have no token to score (all positions are padding)")
    token_loss = (
        F.cross_entropy(logits.float().flatten(0, 1), targets.clamp(min=0).flatten(), reduction="none").view_as(targets)
        * valid
    )
    if reduction == "token_mean":
        return token_loss.sum() / valid.sum()
    if reduction == "sentence_mean":
        lengths = valid.sum(dim=1)
        has_tokens = lengths > 0
        return (token_loss.sum(dim=1)[has_tokens] / lengths[has_tokens]).mean()
    raise ValueError(f"reduction must be 'token_mean' or 'sentence_mean', got {reduction!r}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None, dim: int = 1) -> torch.Tensor:
    """Mean of x over `dim`, counting only positions where mask (same leading shape, bool/0-1) is set."""
    if mask is None:
        return x.mean(dim=dim)
    weights = mask.to(x.dtype).unsqueeze(-1)
    return (x * weights).sum(dim=dim) / weights.sum(dim=dim).clamp(min=1.0)


def similarity(a: torch.Tensor, b: torch.Tensor, kind: str = "dot") -> torch.Tensor:
    """B×B similarity of two batches of vectors (B, D): ``dot`` = a·bᵀ, ``cosine`` = â·b̂ᵀ."""
    if kind == "dot":
        return a @ b.transpose(0, 1)
    if kind == "cosine":
        return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).transpose(0, 1)
    raise ValueError(f"similarity kind must be 'dot' or 'cosine', got {kind!r}")


def info_nce(
    sim: torch.Tensor, *, temperature: float = 1.0, symmetric: bool = True, ignore: torch.Tensor | None = None
) -> torch.Tensor:
    """In-batch InfoNCE on a similarity matrix whose diagonal holds the positives.

    ``CE_row(S) = −(1/B) Σ_a log softmax_b(S_ab / τ)[b = a]``; symmetric: ``½ [CE_row(S) + CE_row(Sᵀ)]``.
    This is SCORER Eq. 4 / Eq. 11 (S from MTM, τ folded into the learnable scale), DIRL Eqs. 12-14
    (dot product, τ = 0.5), RDD Eqs. 11-13 (cosine, τ) and CHEER Eq. 9. `ignore` (B, B) bool leaves
    those off-diagonal pairs out of both softmaxes.
    """
    if sim.dim() != 2 or sim.shape[0] != sim.shape[1]:
        raise ValueError(f"InfoNCE needs a square B×B similarity matrix, got shape {tuple(sim.shape)}")
    logits = sim.float() / temperature
    labels = torch.arange(logits.shape[0], device=logits.device)
    if ignore is not None:  # off-diagonal pairs that are no negatives (e.g. identical texts)
        off_diagonal = ~torch.eye(logits.shape[0], dtype=torch.bool, device=logits.device)
        logits = logits.masked_fill(ignore.to(logits.device) & off_diagonal, float("-inf"))
    row = F.cross_entropy(logits, labels)
    if not symmetric:
        return row
    return 0.5 * (row + F.cross_entropy(logits.transpose(0, 1), labels))


def cross_correlation_matrix(z_a: torch.Tensor, z_b: torch.Tensor, mode: str = "cosine") -> torch.Tensor:
    """Channel cross-correlation C (D×D) of paired samples z_a, z_b (N, D) — DIRL Eq. 3.

    * ``zscore`` [C]: each channel standardised over the N samples (mean 0, unbiased std 1), then
      ``C = Z_aᵀ Z_b / N`` (Barlow-Twins style).
    * ``cosine`` (Eq. 3 as printed): ``C_ij = Σ_n a_ni b_nj / (‖a_·i‖ ‖b_·j‖)``, no centring.
    """
    if z_a.shape != z_b.shape or z_a.dim() != 2:
        raise ValueError(
            f"cross-correlation needs two (N, D) tensors of one shape, got {tuple(z_a.shape)}, {tuple(z_b.shape)}"
        )
    z_a, z_b = z_a.float(), z_b.float()
    if mode == "zscore":
        z_a = (z_a - z_a.mean(0)) / z_a.std(0)
        z_b = (z_b - z_b.mean(0)) / z_b.std(0)
        return z_a.transpose(0, 1) @ z_b / z_a.shape[0]
    if mode == "cosine":
        return (z_a.transpose(0, 1) @ z_b) / (z_a.norm(dim=0).unsqueeze(1) * z_b.norm(dim=0).unsqueeze(0)).clamp(
            min=1e-12
        )
    raise ValueError(f"cross-correlation mode must be 'zscore' or 'cosine', got {mode!r}")


def cross_correlation_loss(
    z_a: torch.Tensor, z_b: torch.Tensor, *, alpha: float = 0.003, mode: str = "cosine"
) -> torch.Tensor:
    """DIRL Eq. 4: ``L_dirl = Σ_i (1 − C_ii)² + α Σ_i Σ_{j≠i} C_ij²`` with C from Eq. 3 (α = 0.003 [C])."""
    c = cross_correlation_matrix(z_a, z_b, mode)
    diagonal = torch.diagonal(c)
    on_diag = (1 - diagonal).pow(2).sum()
    off_diag = c.pow(2).sum() - diagonal.pow(2).sum()
    return on_diag + alpha * off_diag


def map_correlation_loss(score: torch.Tensor, reference: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """[D] CHEER L_C / L_D as agreement of *where*: ``1 − corr(m, m')`` over the N positions of each image,
    averaged over the batch, for two match maps (B, N). Unlike the MSE between gates, constant maps do not
    minimise it (a constant map has no correlation with anything: loss 1)."""
    if score.shape != reference.shape or score.dim() != 2:
        raise ValueError(
            f"maps must be two (B, N) tensors of one shape, got {tuple(score.shape)}, {tuple(reference.shape)}"
        )
    a = score.float() - score.float().mean(dim=1, keepdim=True)
    b = reference.float() - reference.float().mean(dim=1, keepdim=True)
    correlation = (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1) + eps)
    return (1.0 - correlation).mean()


def gate_consistency_loss(gate: torch.Tensor, reference_gate: torch.Tensor) -> torch.Tensor:
    """CHEER Eqs. 7 and 11: ``L = MSE(P^, P^')`` between two tensors of one shape (the gate logits P^ as printed,
    or what `cheer.consistency_loss` compares instead)."""
    if gate.shape != reference_gate.shape:
        raise ValueError(f"gates must have one shape, got {tuple(gate.shape)} and {tuple(reference_gate.shape)}")
    return F.mse_loss(gate.float(), reference_gate.float())
