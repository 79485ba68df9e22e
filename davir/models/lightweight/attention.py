"""Attention primitives of the lightweight family and token-wise matching (TM / MTM).

* `ScorerAttention`: the SCORER-code multi-head attention — Q/K/V projections with bias, dropout on the
  probabilities, heads concatenated, **no output projection** — that also exposes its projected Q and K
  for multi-head token-wise matching.
* `token_wise_matching` (SCORER Eqs. 2-3) for one pair of token sets, `batch_token_matching` for the
  B×B matrix over a batch, `MultiHeadTokenMatching` with its own W_Q, W_K and learnable logit scale.
* `CrossAttentionBlock`, `SelfAttentionBlock`, `FeedForwardBlock`: post-LN residual blocks around
  `nn.MultiheadAttention` (DIRL's `CrossTransformer`, RDD's and CHEER's MHSA/MHCA).
"""

from __future__ import annotations

import math

import torch
from torch import nn

MTM_MODES = ("summed_heads", "per_head_mean")
# Learnable logit scales s are clamped to s <= ln 100 after each optimiser step [C].
MAX_LOG_SCALE = math.log(100.0)
# Elements of one (chunk, B, Nq, Nk) similarity block; bounds the memory of the batch matching.
_MATCH_BLOCK_ELEMENTS = 1 << 27


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, N, D) → (B, heads, N, D/heads)."""
    batch, tokens, dim = x.shape
    return x.view(batch, tokens, heads, dim // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, heads, N, d) → (B, N, heads·d)."""
    batch, heads, tokens, dim = x.shape
    return x.transpose(1, 2).reshape(batch, tokens, heads * dim)


def token_wise_matching(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Token-wise matching TM(q, k) of one pair of token sets — SCORER Eqs. 2-3 (ICCV 2023).

    ``e_lm = q_l · k_m``; ``TM = ½ [ (1/N_q) Σ_l max_m e_lm + (1/N_k) Σ_m max_l e_lm ]``.
    query (N_q, d), key (N_k, d) → scalar.
    """
    scores = query @ key.transpose(-1, -2)
    return 0.5 * (scores.max(dim=-1).values.mean(dim=-1) + scores.max(dim=-2).values.mean(dim=-1))


def _batch_tm_single(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """TM between every query set and every key set: (B, Nq, d), (B, Nk, d) → (B, B), chunked over queries."""
    batch, n_query, _ = query.shape
    n_key = key.shape[1]
    chunk = max(1, _MATCH_BLOCK_ELEMENTS // max(1, batch * n_query * n_key))
    rows = []
    for start in range(0, batch, chunk):
        scores = torch.einsum("ald,bmd->ablm", query[start : start + chunk], key)  # (chunk, B, Nq, Nk)
        t2v = scores.max(dim=-1).values.mean(dim=-1)
        v2t = scores.max(dim=-2).values.mean(dim=-1)
        rows.append(0.5 * (t2v + v2t))
    return torch.cat(rows, dim=0)


def batch_token_matching(query: torch.Tensor, key: torch.Tensor, mode: str = "summed_heads") -> torch.Tensor:
    """Multi-head token-wise matching (MTM) for all pairs of a batch — SCORER Eqs. 2-3.

    query (B, H, Nq, d), key (B, H, Nk, d) → S (B, B) with ``S[a, b] = MTM(query_a, key_b)``.

    * ``summed_heads`` [C]: ``e_ab(l, m) = Σ_h q^h_a[l] · k^h_b[m]`` (the code's einsum "ahld,bhmd->ablm"),
      i.e. the full dot product of the concatenated heads, then TM pooling.
    * ``per_head_mean`` (paper reading): TM inside every head subspace, averaged over heads.
    """
    if mode == "summed_heads":
        return _batch_tm_single(merge_heads(query), merge_heads(key))
    if mode == "per_head_mean":
        return torch.stack([_batch_tm_single(query[:, h], key[:, h]) for h in range(query.shape[1])]).mean(0)
    raise ValueError(f"mtm mode must be one of {MTM_MODES}, got {mode!r}")


class LogitScale(nn.Module):
    """Learnable logit scale exp(s), s initialised to 1 (so exp(s) = e), clamped at ln 100 [C]."""

    def __init__(self, init: float = 1.0):
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(float(init)))

    def forward(self) -> torch.Tensor:
        return self.log_scale.exp()

    @torch.no_grad()
    def clamp_(self) -> None:
        self.log_scale.clamp_(max=MAX_LOG_SCALE)


class MultiHeadTokenMatching(nn.Module):
    """MTM with its own W_Q, W_K (Linear D→D with bias) and logit scale: (B,Nq,D), (B,Nk,D) → exp(s)·S (B,B)."""

    def __init__(self, dim: int, heads: int, mode: str = "summed_heads"):
        super().__init__()
        self.heads, self.mode = heads, mode
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.logit_scale = LogitScale()

    def forward(self, query_tokens: torch.Tensor, key_tokens: torch.Tensor) -> torch.Tensor:
        query = split_heads(self.query(query_tokens), self.heads)
        key = split_heads(self.key(key_tokens), self.heads)
        return self.logit_scale() * batch_token_matching(query, key, self.mode)


class ScorerAttention(nn.Module):
    """Multi-head attention as in the SCORER code: no output projection; returns context, Q and K heads.

    ``A = softmax(Q Kᵀ / √d_h)`` per head with dropout on A, ``U = A · (X_k W_V)`` heads concatenated
    (SCORER Eq. 5). `mask` (B, Nq, Nk) or (Nq, Nk) is boolean, True where attention is not allowed.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.1):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, query_tokens: torch.Tensor, key_tokens: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        query = split_heads(self.query(query_tokens), self.heads)
        key = split_heads(self.key(key_tokens), self.heads)
        value = split_heads(self.value(key_tokens), self.heads)
        scores = query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(-3) if mask.dim() == 3 else mask, float("-inf"))
        probs = self.dropout(scores.softmax(dim=-1))
        return merge_heads(probs @ value), query, key


@torch.no_grad()
def tie_query_key(attention: nn.Module, *, identity_value: bool = False) -> None:
    """[D] `matching_init`: set a cross-view attention's key projection to its query projection.

    Then ``q_i · k_j = (W x_i + b) · (W y_j + b)``, and as ``E[WᵀW] ∝ I`` the first attention ranks the other
    view's tokens by content similarity: a token of the before image attends to its unchanged counterpart in
    the after image, and what is left over is the change. With independent W_Q, W_K (the papers) the first
    attention is nearly uniform and this matching must be learnt first.

    ``identity_value`` also starts W_V (and an `nn.MultiheadAttention`'s output projection) at the identity
    with zero bias, so a block ``LN(x + attention(x, y))`` returns ``LN(x + y_match)``: for an unchanged token,
    whose counterpart equals it, that is ``LN(2x) = LN(x)`` — DIRL's shared part (Eq. 5) and SCORER's
    reconstruction (Eq. 6) start as "the unchanged content", which the papers' losses then refine.
    """
    if isinstance(attention, nn.MultiheadAttention):
        if not attention._qkv_same_embed_dim:
            raise ValueError("tie_query_key needs a MultiheadAttention with one packed in_proj_weight")
        dim = attention.embed_dim
        attention.in_proj_weight[dim : 2 * dim].copy_(attention.in_proj_weight[:dim])
        if attention.in_proj_bias is not None:
            attention.in_proj_bias[dim : 2 * dim].copy_(attention.in_proj_bias[:dim])
        if identity_value:
            attention.in_proj_weight[2 * dim :].copy_(torch.eye(dim))
            attention.out_proj.weight.copy_(torch.eye(dim))
            if attention.in_proj_bias is not None:
                attention.in_proj_bias[2 * dim :].zero_()
            if attention.out_proj.bias is not None:
                attention.out_proj.bias.zero_()
        return
    attention.key.weight.copy_(attention.query.weight)
    attention.key.bias.copy_(attention.query.bias)
    if identity_value:  # SCORER's attention has no output projection
        attention.value.weight.copy_(torch.eye(attention.value.weight.shape[0]))
        attention.value.bias.zero_()


@torch.no_grad()
def init_as_difference(linear: nn.Linear) -> None:
    """[D] `difference_init`: a Linear(2D → D) over ``[x_before; x_after]`` that starts as ``x_after − x_before``."""
    dim = linear.out_features
    if linear.in_features != 2 * dim:
        raise ValueError(f"difference_init needs a Linear(2D -> D), got {linear.in_features} -> {dim}")
    eye = torch.eye(dim, dtype=linear.weight.dtype)
    linear.weight.copy_(torch.cat([-eye, eye], dim=1))
    if linear.bias is not None:
        linear.bias.zero_()


def _causal_mask(length: int, device) -> torch.Tensor:
    """(T, T) boolean, True above the diagonal (future positions a token may not attend to)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).triu(1)


class CrossAttentionBlock(nn.Module):
    """``LN(x + Dropout(MHA(x, y, y)))`` — DIRL's `CrossTransformer` [C] and the generic post-LN MHCA."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.1):
        super().__init__()
        self.attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(dim)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, key_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        attended, _ = self.attention(x, memory, memory, key_padding_mask=key_padding_mask, need_weights=False)
        return self.norm(x + self.dropout(attended))


class SelfAttentionBlock(nn.Module):
    """``LN(x + Dropout(MHSA(x)))``, optionally causal and with a key padding mask (True = pad)."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.1):
        super().__init__()
        self.attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(dim)

    def forward(
        self, x: torch.Tensor, *, causal: bool = False, key_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        attn_mask = _causal_mask(x.shape[1], x.device) if causal else None
        if attn_mask is not None and key_padding_mask is not None:
            # One boolean mask (B·heads, T, T): mixing bool masks of two kinds is deprecated in torch.
            combined = attn_mask.unsqueeze(0) | key_padding_mask.unsqueeze(1)
            attn_mask = combined.repeat_interleave(self.attention.num_heads, dim=0)
            key_padding_mask = None
        attended, _ = self.attention(
            x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False
        )
        return self.norm(x + self.dropout(attended))


class FeedForwardBlock(nn.Module):
    """``LN(x + Dropout(W2 · Dropout(ReLU(W1 x))))`` — the standard post-LN FFN sublayer (512→2048→512)."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, dim), nn.Dropout(dropout)
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.net(x))
