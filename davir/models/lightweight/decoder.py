"""The shared caption decoder (2-layer post-LN Transformer) and greedy / beam decoding.

Word input (§1.4, §2.2c [C]): ``Embedding(V, 300, padding_idx=0)`` + position encoding (sinusoidal,
SCORER/DIRL; learned, RDD) → ``Linear(300 → 512)`` → LayerNorm → Dropout (SCORER's code: Dropout, then
LayerNorm). Three layer kinds:

* ``standard`` (DIRL Eqs. 8-11, RDD, the default elsewhere): causal self-attention, cross-attention to
  the difference tokens, FFN 512→2048→512, each with residual + LN.
* ``scorer`` (SCORER code, `reference_quirks`): attention without output projections,
  ``G = GELU(Linear(H2))``, ``H3 = LN(Dropout(Linear(G)) + G)`` — the last residual is G, not H2.
* ``gated`` (CHEER Eqs. 13-17): cross-attention to the entity features and to the visual difference in
  parallel, mixed by the weights α, β (Linear outputs as printed; σ of them with ``sigmoid_gates`` [D]), then
  an FFN sublayer [D].

Every forward returns the logits, the final hidden states (SCORER's CBR reads them) and each layer's
post-self-attention and post-cross-attention states (DIRL's CCR reads them).
Decoding (§0.5 [C]): the <UNK> logit is suppressed, a sequence stops at <END>; greedy and beam search
return the word ids with <END> and everything after it replaced by <NULL> = 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from davir.models.lightweight.attention import (
    CrossAttentionBlock,
    FeedForwardBlock,
    ScorerAttention,
    SelfAttentionBlock,
    _causal_mask,
)
from davir.text.vocab import END_ID, PAD_ID, START_ID, UNK_ID

LAYER_KINDS = ("standard", "scorer", "gated")


def sinusoidal_table(length: int, dim: int) -> torch.Tensor:
    """Transformer sine/cosine position table (L, dim): even channels sin, odd channels cos [C]."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * -(math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)[:, : dim // 2]
    return table


class WordInput(nn.Module):
    """Word embedding (300) + position encoding → Linear → LN → Dropout, giving (B, T, D)."""

    def __init__(
        self,
        vocab_size: int,
        word_dim: int,
        hidden: int,
        max_len: int,
        positions: str,
        dropout: float,
        dropout_before_norm: bool = False,
    ):
        super().__init__()
        self.max_len = max_len
        self.dropout_before_norm = dropout_before_norm  # SCORER code: Linear → Dropout → LN [C]
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=PAD_ID)
        if positions == "sinusoidal":
            self.register_buffer("sinusoid", sinusoidal_table(max_len, word_dim), persistent=False)
            self.position = None
        elif positions == "learned":
            self.position = nn.Embedding(max_len, word_dim)
        else:
            raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {positions!r}")
        self.fc = nn.Linear(word_dim, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.max_len:
            raise ValueError(f"caption input has {length} positions, more than the decoder's max_len={self.max_len}")
        x = self.embed(tokens)
        if self.position is None:
            x = x + self.sinusoid[:length].to(x.dtype)
        else:
            x = x + self.position(torch.arange(length, device=tokens.device))
        if self.dropout_before_norm:
            return self.norm(self.dropout(self.fc(x)))
        return self.dropout(self.norm(self.fc(x)))


class StandardDecoderLayer(nn.Module):
    """Post-LN decoder layer: ``LN(H + MHSA)``, ``LN(· + MHCA(·, X_diff))``, ``LN(· + FFN)`` (DIRL Eqs. 8-10)."""

    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float):
        super().__init__()
        self.self_attention = SelfAttentionBlock(dim, heads, dropout)
        self.cross_attention = CrossAttentionBlock(dim, heads, dropout)
        self.ffn = FeedForwardBlock(dim, ffn_dim, dropout)

    def forward(self, h, memory, text_memory, pad_mask):
        self_state = self.self_attention(h, causal=True, key_padding_mask=pad_mask)
        cross_state = self.cross_attention(self_state, memory)
        return self.ffn(cross_state), self_state, cross_state


class ScorerDecoderLayer(nn.Module):
    """SCORER's released decoder layer [C]: no attention output projection; GELU block with residual G."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.self_attention = ScorerAttention(dim, heads, dropout)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.cross_attention = ScorerAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.intermediate = nn.Linear(dim, dim)
        self.output = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)
        self.norm3 = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, h, memory, text_memory, pad_mask):
        mask = _causal_mask(h.shape[1], h.device).unsqueeze(0)
        if pad_mask is not None:
            mask = mask | pad_mask.unsqueeze(1)
        attended, _, _ = self.self_attention(h, h, mask)
        self_state = self.norm1(h + attended)
        attended, _, _ = self.cross_attention(self_state, memory)
        cross_state = self.norm2(self_state + attended)
        gated = F.gelu(self.intermediate(cross_state))
        return self.norm3(self.dropout(self.output(gated)) + gated), self_state, cross_state


class GatedDecoderLayer(nn.Module):
    """CHEER's gated dual cross-attention layer (Eqs. 13-17) + FFN sublayer [D].

    ``H' = LN(H + MHSA(H))``; ``H^T = MHCA(H', E)``; ``H^V = MHCA(H', F_diff)``;
    ``α = Linear[H'; H^T]`` (Eq. 14); ``β = Linear[H'; H^V]`` (Eq. 15) — each passed through σ when
    ``sigmoid_gates`` [D]; ``H^F = α ⊙ H^T + β ⊙ H^V`` (Eq. 16); ``H_n = LN(H^F + H')`` (Eq. 17); then
    ``LN(H_n + FFN(H_n))``.
    """

    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float, sigmoid_gates: bool = False):
        super().__init__()
        self.sigmoid_gates = sigmoid_gates
        self.self_attention = SelfAttentionBlock(dim, heads, dropout)
        self.text_attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.visual_attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.alpha = nn.Linear(2 * dim, dim)
        self.beta = nn.Linear(2 * dim, dim)
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(dim)
        self.ffn = FeedForwardBlock(dim, ffn_dim, dropout)

    def forward(self, h, memory, text_memory, pad_mask):
        if text_memory is None:
            raise ValueError("the gated decoder needs the entity features (text_memory)")
        self_state = self.self_attention(h, causal=True, key_padding_mask=pad_mask)
        return self.ffn(self.gated_fusion(self_state, memory, text_memory)), self_state, None

    def gated_fusion(self, self_state: torch.Tensor, memory: torch.Tensor, text_memory: torch.Tensor) -> torch.Tensor:
        """CHEER Eqs. 14-17: weights α, β from [H'; H^T] and [H'; H^V], ``H_n = LN(α⊙H^T + β⊙H^V + H')``."""
        text, _ = self.text_attention(self_state, text_memory, text_memory, need_weights=False)
        visual, _ = self.visual_attention(self_state, memory, memory, need_weights=False)
        alpha = self.alpha(torch.cat([self_state, text], dim=-1))
        beta = self.beta(torch.cat([self_state, visual], dim=-1))
        if self.sigmoid_gates:
            alpha, beta = torch.sigmoid(alpha), torch.sigmoid(beta)
        return self.norm(self.dropout(alpha * text + beta * visual) + self_state)


@dataclass
class DecoderOutput:
    logits: torch.Tensor  # (B, T, V)
    hidden: torch.Tensor  # (B, T, D) final hidden states
    self_states: list[torch.Tensor] = field(default_factory=list)  # per layer, post-self-attention LN
    cross_states: list[torch.Tensor | None] = field(default_factory=list)  # per layer, post-cross-attention LN


class CaptionDecoder(nn.Module):
    """Word input + N decoder layers + ``Linear(D → V)`` (with bias, no weight tying)."""

    def __init__(
        self,
        vocab_size: int,
        *,
        hidden: int = 512,
        word_dim: int = 300,
        heads: int = 8,
        layers: int = 2,
        ffn_dim: int = 2048,
        max_len: int = 24,
        dropout: float = 0.1,
        positions: str = "sinusoidal",
        layer_kind: str = "standard",
        sigmoid_gates: bool = False,
    ):
        super().__init__()
        if layer_kind not in LAYER_KINDS:
            raise ValueError(f"layer_kind must be one of {LAYER_KINDS}, got {layer_kind!r}")
        self.layer_kind = layer_kind
        self.max_len = max_len
        self.vocab_size = vocab_size
        self.words = WordInput(
            vocab_size, word_dim, hidden, max_len, positions, dropout, dropout_before_norm=layer_kind == "scorer"
        )
        if layer_kind == "standard":
            stack = [StandardDecoderLayer(hidden, heads, ffn_dim, dropout) for _ in range(layers)]
        elif layer_kind == "scorer":
            stack = [ScorerDecoderLayer(hidden, heads, dropout) for _ in range(layers)]
        else:
            stack = [GatedDecoderLayer(hidden, heads, ffn_dim, dropout, sigmoid_gates) for _ in range(layers)]
        self.layers = nn.ModuleList(stack)
        self.logit = nn.Linear(hidden, vocab_size)

    def forward(
        self, tokens: torch.Tensor, memory: torch.Tensor, text_memory: torch.Tensor | None = None
    ) -> DecoderOutput:
        """tokens (B, T) starting with <START>, padded with <NULL>; memory (B, N, D); text_memory (B, K, D)."""
        pad_mask = tokens == PAD_ID
        h = self.words(tokens)
        self_states, cross_states = [], []
        for layer in self.layers:
            h, self_state, cross_state = layer(h, memory, text_memory, pad_mask)
            self_states.append(self_state)
            cross_states.append(cross_state)
        return DecoderOutput(self.logit(h), h, self_states, cross_states)

    def next_token_log_probs(
        self, tokens: torch.Tensor, memory: torch.Tensor, text_memory: torch.Tensor | None = None
    ) -> torch.Tensor:
        """log p(next word | tokens) (B, V) with the <UNK> logit suppressed (−1e10 [C])."""
        logits = self.forward(tokens, memory, text_memory).logits[:, -1].float()
        logits[:, UNK_ID] = -1e10
        return logits.log_softmax(dim=-1)


def width_scaled_std(hidden: int, paper_std: float = 0.02, paper_hidden: int = 512) -> float:
    """[D] N(0, 0.02) is the reference's init at width 512; at width D the same *relative* scale is
    0.02·√(512/D) (0.057 at the demo's 64), so attention logits do not start ~8× flatter than the paper's."""
    return paper_std * math.sqrt(paper_hidden / hidden)


def init_weights(module: nn.Module, style: str, std: float = 0.02) -> None:
    """Initialise Linear/Embedding/attention weights of `module` in place.

    ``normal`` (SCORER decoder [C]): N(0, std²) weights (std 0.02 in the reference), zero biases, LN γ=1 β=0.
    ``xavier`` (DIRL [C]): Xavier-uniform on every parameter with more than one dimension.
    """
    if style == "xavier":
        for parameter in module.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)
        return
    if style != "normal":
        raise ValueError(f"init style must be 'normal' or 'xavier', got {style!r}")
    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            nn.init.normal_(sub.weight, mean=0.0, std=std)
            if isinstance(sub, nn.Linear) and sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.MultiheadAttention):
            if sub.in_proj_weight is not None:
                nn.init.normal_(sub.in_proj_weight, mean=0.0, std=std)
            if sub.in_proj_bias is not None:
                nn.init.zeros_(sub.in_proj_bias)
        elif isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)


StepFunction = Callable[[torch.Tensor], torch.Tensor]


def _pad_results(sequences: list[list[int]], ended: list[bool], device) -> torch.Tensor:
    """(B, W) word ids, <NULL>-padded; W = max(len + 1 if ended else len) so <END>'s slot reads 0."""
    width = max((len(seq) + int(end) for seq, end in zip(sequences, ended)), default=0)
    out = torch.full((len(sequences), max(width, 1)), PAD_ID, dtype=torch.long, device=device)
    for row, seq in enumerate(sequences):
        if seq:
            out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long, device=device)
    return out


@torch.no_grad()
def greedy_decode(step: StepFunction, batch: int, max_len: int, device) -> torch.Tensor:
    """Greedy decoding [C] (`sample_max=1`): argmax word per step until every row has produced <END>.

    `step(tokens (B, t)) → log-probs (B, V)` of the next word. Returns (B, W) word ids.
    """
    tokens = torch.full((batch, 1), START_ID, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    sequences: list[list[int]] = [[] for _ in range(batch)]
    ended = [False] * batch
    for _ in range(max_len):
        next_words = step(tokens).argmax(dim=-1)
        next_words = next_words.masked_fill(finished, PAD_ID)
        for row, (word, done) in enumerate(zip(next_words.tolist(), finished.tolist())):
            if done:
                continue
            if word == END_ID:
                ended[row] = True
            else:
                sequences[row].append(word)
        finished |= next_words == END_ID
        if bool(finished.all()):
            break
        tokens = torch.cat([tokens, next_words.unsqueeze(1)], dim=1)
    return _pad_results(sequences, ended, device)


@torch.no_grad()
def beam_decode(step: StepFunction, batch: int, beam: int, max_len: int, device) -> torch.Tensor:
    """Beam search over summed log-probabilities (no length penalty); beam 1 equals greedy decoding.

    `step(tokens (B·beam, t)) → log-probs (B·beam, V)`; rows are ordered batch-major (row = b·beam + k).
    A hypothesis that emits <END> is finished; a batch item stops once its best finished score is at
    least its best open score (log-probabilities are ≤ 0, so open hypotheses can only get worse).
    """
    tokens = torch.full((batch * beam, 1), START_ID, dtype=torch.long, device=device)
    scores = torch.full((batch, beam), float("-inf"), device=device)
    scores[:, 0] = 0.0
    best_finished = torch.full((batch,), float("-inf"), device=device)
    finished_seqs: list[list[int] | None] = [None] * batch
    for position in range(max_len):
        log_probs = step(tokens).float()
        vocab = log_probs.shape[-1]
        candidates = (scores.unsqueeze(-1) + log_probs.view(batch, beam, vocab)).view(batch, beam * vocab)
        top_scores, top_index = candidates.topk(min(2 * beam, beam * vocab), dim=-1)
        source_beam, words = top_index // vocab, top_index % vocab
        history = tokens.view(batch, beam, -1)[:, :, 1:]
        is_end = words == END_ID
        end_scores = top_scores.masked_fill(~is_end, float("-inf"))
        best_end, best_end_at = end_scores.max(dim=-1)
        for row in torch.nonzero(best_end > best_finished).flatten().tolist():
            best_finished[row] = best_end[row]
            finished_seqs[row] = history[row, source_beam[row, best_end_at[row]]].tolist()
        open_scores, open_at = top_scores.masked_fill(is_end, float("-inf")).topk(beam, dim=-1)
        keep_beam = source_beam.gather(1, open_at)
        keep_words = words.gather(1, open_at)
        scores = open_scores
        kept = torch.gather(tokens.view(batch, beam, -1), 1, keep_beam.unsqueeze(-1).expand(-1, -1, tokens.shape[1]))
        tokens = torch.cat([kept, keep_words.unsqueeze(-1)], dim=-1).view(batch * beam, -1)
        if bool((best_finished >= scores[:, 0]).all()) or position == max_len - 1:
            break
    sequences, ended = [], []
    final_history = tokens.view(batch, beam, -1)[:, 0, 1:]
    for row in range(batch):
        if finished_seqs[row] is not None and best_finished[row] >= scores[row, 0]:
            sequences.append(finished_seqs[row])
            ended.append(True)
        else:
            sequences.append(final_history[row].tolist())
            ended.append(False)
    return _pad_results(sequences, ended, device)
