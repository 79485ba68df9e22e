"""RDD + ACR (R. Li, L. Li et al., AAAI 2025) — docs/methods/rdd.md. No code is public; [D] choices are marked.

Encoder as the paper writes it: no LayerNorm anywhere, residuals only around Eq. 8's FFN and Eq. 9's fusion:
* GDE (Eqs. 2-5): ``F_diff = F_aft − F_bef``; each image queries the difference,
  ``F^_x = MHCA(F_x, F_diff, F_diff)`` (shared weights, Eqs. 3-4 as printed; a residual is the [D]
  ``rdd_gde_residual``); ``F_c = [F^_bef; F^_aft]`` (Eq. 5, ``rdd_fusion="concat"``). The paper does not say
  along which axis it concatenates: the token axis keeps the width D it gives every feature (512) and adds no
  layer it does not print, so F_c holds 2·H·W tokens [gap]. ``rdd_fusion="linear"`` [D] is the first spec's
  channel concatenation + ``ReLU(Linear(2D→D))`` (as SCORER's Eq. 7 and DIRL's Eq. 7), H·W tokens.
* Object distilling (Eqs. 6-8): K_o = 32 learnable vectors, N shared-weight blocks
  ``F_c ← MHSA(F_c)``, ``O^ = MHCA(O, F_c)``, ``O = FFN(O^) + O^``.
* Action distilling: K_a learnable vectors, the same block structure (own weights) over the distilled
  objects ("concrete to abstract").
* Multi-scale fusion (Eq. 9): tokens ``X = [F_c; O; A]``, ``X ← X + MHSA(X)``, ``X ← X + FFN(X)``; the
  decoder (learned positions) attends over F_c's part of them (the paper's ``F~_diff ∈ R^{HW×C}``; 2·H·W
  tokens with the printed concatenation), or over all with ``rdd_decoder_tokens="all"``.

The spec we started from suggested a residual + LayerNorm around every attention ("post-LN"). On the demo that encoder
never named the changed object (object accuracy 0.02, docs/experiments/lightweight_demo.md): GDE's residual hands the
fusion Linear both images' whole content, which it must learn to cancel, and a LayerNorm over the fused
tokens lifts every unchanged (≈ 0) difference token to the norm of the changed one; it is gone. Two [D]s
remain as switches. ``rdd_gde_residual``: without a residual (the paper's) a GDE token holds only an
attention-weighted mean of the differences, at the start the same mean everywhere; ``"difference"`` carries
the difference token itself; ``"image"`` is the usual transformer residual ``F^_x = F_x + MHCA(F_x, F_diff)``.
``rdd_fusion="linear"`` with ``difference_init`` starts Eq. 5's Linear as ``F^_aft − F^_bef``. The demo uses
both (``"image"``: a difference alone loses what a recoloured object is; demo, 3 seeds: object accuracy 0.84
vs 0.67 with ``"difference"``); docs/paper_departures.md lists what each was measured against.

ACR (Eqs. 10-13, training only): the mean object / action vector is contrasted (cosine, τ) with the
caption's noun / verb "attribute-guided tokens": CLIP text features of the caption's noun and verb
segments, through a 3-layer FC adapter. Two text paths:

* precomputed frozen CLIP text features, ``attributes={"noun_features": (B, d), "verb_features": (B, d)}``
  (the paper's "No Init" / "Fixed Prompt" rows, cacheable offline);
* learnable prompts (the paper's default): 4 CoOp context vectors per kind replace the placeholder
  tokens after <SOT> and go through a frozen open_clip text tower attached with `attach_text_tower`;
  ``attributes={"noun_ids": (B, L), "verb_ids": (B, L)}`` are that tower's token ids of
  ``"X X X X <segments>."`` (see `prompt_texts`). The tower is not part of the state dict.

Caption loss: the length-normalised sentence mean of Eq. 15. Total: ``L = L_XE + λ_1 L_N2O + λ_2 L_V2A``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from davir.models.lightweight.attention import init_as_difference
from davir.models.lightweight.base import Encoded, LightweightCaptioner
from davir.models.lightweight.config import TextTowerSettings
from davir.models.lightweight.decoder import DecoderOutput
from davir.models.lightweight.inputs import MethodInputs
from davir.models.lightweight.losses import info_nce, similarity
from davir.models.lightweight.paper_values import DECODER_INIT_STD, DIFFERENCE_INIT, Switch
from davir.models.lightweight.registry import register_method

PROMPT_PLACEHOLDER = "X"


@dataclass
class RddSettings(TextTowerSettings):
    """RDD+ACR (§3): L = L_XE + λ_1 L_N2O + λ_2 L_V2A; learned decoder positions and the sentence-mean XE [P]."""

    default_positions: ClassVar[str] = "learned"
    default_caption_loss: ClassVar[str] = "sentence_mean"  # Eq. 15
    uses_attributes: ClassVar[bool] = True
    default_text_model: ClassVar[str] = "ViT-B-32"  # RDD's CLIP variant is unstated [D]

    rdd_objects: int = 32
    rdd_actions: int = 5
    rdd_distill_steps: int = 2  # N shared-weight distilling blocks: unreported, a gap filler [D]
    # GDE residual: "none" = Eqs. 3-4 as printed; [D] "difference" F^_x = F_diff + MHCA(F_x, F_diff), "image"
    # F^_x = F_x + MHCA(F_x, F_diff)
    rdd_gde_residual: Literal["difference", "image", "none"] = "none"
    # Eq. 5: "concat" F_c = [F^_bef; F^_aft] as printed (token axis, width D); [D] "linear" ReLU(Linear(2D→D)) of
    # the channel concatenation (with difference_init it starts as F^_aft − F^_bef)
    rdd_fusion: Literal["concat", "linear"] = "concat"
    # the decoder reads the fused F_c tokens (RDD: F~_diff ∈ R^{HW×C}) or [D] "all" (with the distilled vectors)
    rdd_decoder_tokens: Literal["global", "all"] = "global"
    n2o_weight: float = 0.1  # λ_1: unreported, a gap filler [D]
    v2a_weight: float = 0.1  # λ_2: unreported, a gap filler [D]
    acr_temperature: float = 0.07  # τ: unreported, a gap filler [D] (CLIP's)
    # True [D]: identical texts in a batch are not each other's negatives; False: the plain InfoNCE of Eqs. 11-13
    acr_mask_duplicates: bool = False
    acr_text_dim: int = 512  # CLIP text embedding size (ViT-B text tower) [D]
    acr_prompt_tokens: int = 4  # learnable CoOp context tokens [P]
    acr_token_width: int = 512  # CLIP token-embedding width the context vectors live in
    # ACR's text path: CoOp prompts through the tower (the paper's default), or fixed precomputed text features
    # (the paper's "Fixed Prompt" row; much cheaper on a CPU)
    acr_prompts: Literal["learned", "fixed"] = "learned"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.difference_init and self.rdd_fusion == "concat":
            raise ValueError(
                "difference_init starts Eq. 5's fusion Linear, which rdd_fusion='concat' (the printed "
                "concatenation) does not have: set rdd_fusion='linear' with it, or difference_init=false"
            )

    @property
    def attaches_text_tower(self) -> bool:
        return self.acr_prompts == "learned"

    def text_tower_sizes(self, width: int, out_dim: int) -> dict[str, int]:
        return {"acr_text_dim": out_dim, "acr_token_width": width}


# Per-dataset values (docs/methods/rdd.md).
PAPER_ROWS = {
    "clevr_change": {"vocab_size": 76, "max_len": 24, "rdd_actions": 5, "batch_size": 128, "lr": 2e-4},
    "levir_cc": {"rdd_actions": 10, "batch_size": 64, "lr": 1e-4},
    "spot_the_diff": {"rdd_actions": 10, "batch_size": 32, "lr": 2e-4},
}
# The printed values it reads beside paper_values.EVERY_METHOD.
SWITCHES = (
    DIFFERENCE_INIT,
    DECODER_INIT_STD,
    Switch("lightweight.rdd_gde_residual", "none", "[D]"),
    Switch("lightweight.rdd_fusion", "concat", "[D]"),
    Switch("lightweight.rdd_decoder_tokens", "global", "[D]"),
    Switch("lightweight.acr_mask_duplicates", False, "[D]"),
    Switch("lightweight.acr_prompts", "learned", "[D]"),
)


def global_difference(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """RDD Eq. 2: the global difference ``F_diff = F_aft − F_bef`` (sign [D]; it only enters via W^K, W^V)."""
    return after - before


def regional_token(vectors: torch.Tensor) -> torch.Tensor:
    """RDD Eq. 10: ``F_o = (1/k) Σ F_o^N`` — the mean of the k distilled vectors (B, k, D) → (B, D)."""
    return vectors.mean(dim=1)


def attribute_contrastive_loss(
    text: torch.Tensor, regional: torch.Tensor, temperature: float, *, mask_duplicates: bool = False
) -> torch.Tensor:
    """RDD Eqs. 11-13: ``L_L2C = ½ (L_lc + L_cl)``, in-batch InfoNCE on cosine similarity / τ.

    ``mask_duplicates`` [D]: pairs whose texts are the same (identical attribute tokens, e.g. the no-change
    captions' "no change", ~half of a CLEVR batch) are left out as negatives; the paper's version (False)
    pushes the regional features of all those pairs apart from each other's identical text.
    """
    ignore = None
    if mask_duplicates:
        with torch.no_grad():
            ignore = similarity(text, text, "cosine") > 1 - 1e-5
    return info_nce(similarity(text, regional, "cosine"), temperature=temperature, symmetric=True, ignore=ignore)


def prompt_texts(segments: list[str], prompt_tokens: int = 4) -> list[str]:
    """CoOp-style prompt strings ``"X X X X <segments>."`` whose X tokens the context vectors replace.

    Tokenise them with the attached tower's own tokenizer (e.g. ``open_clip.get_tokenizer(name)``);
    "X" is a single token in CLIP's BPE, so the placeholders sit at positions 1..prompt_tokens.
    """
    prefix = " ".join([PROMPT_PLACEHOLDER] * prompt_tokens)
    return [f"{prefix} {segment.strip()}." for segment in segments]


def attention(layer: nn.MultiheadAttention, query: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """``MHA(query, context, context)`` — no residual, no LayerNorm (RDD's MHCA/MHSA as the paper writes them)."""
    return layer(query, context, context, need_weights=False)[0]


def feed_forward(dim: int, hidden: int, dropout: float) -> nn.Sequential:
    """``Linear(D→hidden) → ReLU → Dropout → Linear(hidden→D)`` (the FFN of Eqs. 8 and 9)."""
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, dim))


class DistillingBlock(nn.Module):
    """One difference distilling block (RDD Eqs. 6-8), reused N times with the same weights."""

    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float):
        super().__init__()
        self.context_attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.query_attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.ffn = feed_forward(dim, ffn_dim, dropout)

    def forward(self, queries: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 6: ``F_c^i = MHSA(F_c^{i−1})``; Eq. 7: ``O^ = MHCA(O, F_c^i)``; Eq. 8: ``O = FFN(O^) + O^``."""
        context = attention(self.context_attention, context, context)
        attended = attention(self.query_attention, queries, context)
        return attended + self.ffn(attended), context


def distill(block: DistillingBlock, queries: torch.Tensor, context: torch.Tensor, steps: int) -> torch.Tensor:
    """Apply one shared-weight distilling block `steps` times; returns the distilled queries (B, K, D)."""
    for _ in range(steps):
        queries, context = block(queries, context)
    return queries


class TextTowerAdapter(nn.Module):
    """A frozen open_clip text tower that encodes token ids with learnable context vectors spliced in.

    Mirrors open_clip's ``CLIP.encode_text``: token embedding (context vectors at positions
    1..n_ctx) + positional embedding → transformer (causal mask) → ln_final → pooled at <EOT> →
    text projection. Works on a ``CLIP`` model or a ``TextTransformer`` (``CustomTextCLIP.text``).
    """

    def __init__(self, clip_model: nn.Module):
        super().__init__()
        tower = getattr(clip_model, "text", clip_model)
        for name in ("token_embedding", "positional_embedding", "transformer", "ln_final"):
            if not hasattr(tower, name):
                raise ValueError(
                    f"text tower {type(tower).__name__} has no {name!r}; expected an open_clip CLIP text tower"
                )
        if getattr(tower, "cls_emb", None) is not None:
            raise ValueError("text towers with a CLS embedding (CoCa) are not supported for prompt learning")
        self.token_embedding = tower.token_embedding
        self.positional_embedding = tower.positional_embedding
        self.transformer = tower.transformer
        self.ln_final = tower.ln_final
        self.text_projection = tower.text_projection
        self.pool_type = getattr(tower, "text_pool_type", getattr(tower, "pool_type", "argmax"))
        self.eos_id = getattr(tower, "text_eos_id", getattr(tower, "eos_id", None))
        mask = getattr(tower, "attn_mask", None)
        self.register_buffer("attn_mask", None if mask is None else mask.clone(), persistent=False)
        self.width = self.token_embedding.weight.shape[1]
        projection = self.text_projection
        if projection is None:
            self.output_dim = self.width
        elif isinstance(projection, nn.Linear):
            self.output_dim = projection.out_features
        else:
            self.output_dim = projection.shape[1]
        self.requires_grad_(False)

    def forward(self, token_ids: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """token_ids (B, L) with placeholders at 1..n_ctx; context (n_ctx, width) → text features (B, output_dim)."""
        n_ctx = context.shape[0]
        length = token_ids.shape[1]
        embedded = self.token_embedding(token_ids)
        x = torch.cat(
            [
                embedded[:, :1],
                context.to(embedded.dtype).unsqueeze(0).expand(token_ids.shape[0], -1, -1),
                embedded[:, 1 + n_ctx :],
            ],
            dim=1,
        )
        x = x + self.positional_embedding[:length].to(x.dtype)
        mask = None if self.attn_mask is None else self.attn_mask[:length, :length]
        x = self.ln_final(self.transformer(x, attn_mask=mask))
        if self.pool_type == "eos" and self.eos_id is not None:
            eot = (token_ids == self.eos_id).int().argmax(dim=-1)
        else:  # CLIP's <EOT> has the highest id
            eot = token_ids.argmax(dim=-1)
        pooled = x[torch.arange(x.shape[0], device=x.device), eot]
        if self.text_projection is None:
            return pooled
        if isinstance(self.text_projection, nn.Linear):
            return self.text_projection(pooled)
        return pooled @ self.text_projection


# --- what its training batches carry: the captions' noun / verb segments (§3.8) -----------------------------------
def rdd_segments(caption: str) -> tuple[str, str]:
    """RDD §3.8: the caption's noun segments and verb segments, each joined with "and"."""
    from davir.text.extractors import extract_attributes

    attributes = extract_attributes(caption)
    return " and ".join(attributes["nouns"]), " and ".join(attributes["verbs"])


class AttributeInputs(MethodInputs):
    """ACR's inputs: the noun / verb segments of each training caption (`rdd_segments`) joined with "and", through
    the frozen text tower with the learnable prompt tokens (`acr_prompts: learned`, the paper's default: token
    ids, the tower runs inside the model) or as fixed precomputed text features (`fixed`, the paper's "Fixed
    Prompt" row; much cheaper on a CPU). Generation reads none."""

    def prepare(self, settings: RddSettings) -> RddSettings:
        self.settings = settings
        self.segments: dict[str, tuple[str, str]] = {}
        self.text_features: dict[str, torch.Tensor] = {}
        return settings

    def model_inputs(self, batch, device, *, pair="semantic") -> dict[str, Any]:
        if pair == "generate":
            return {}
        key = "no_change_caption" if pair == "distractor" else "caption"
        return {"attributes": self.attributes(batch[key], device)}

    def attributes(self, captions: list[str], device) -> dict[str, torch.Tensor]:
        """RDD ACR inputs of a batch of captions: token ids (learned prompts) or frozen text features (fixed)."""
        encoder = self.context.text_encoder
        for caption in captions:
            if caption not in self.segments:
                self.segments[caption] = rdd_segments(caption)
        nouns = [self.segments[c][0] for c in captions]
        verbs = [self.segments[c][1] for c in captions]
        if self.settings.attaches_text_tower:
            prompts = self.settings.acr_prompt_tokens
            return {
                "noun_ids": encoder.token_ids(prompt_texts(nouns, prompts)).to(device),
                "verb_ids": encoder.token_ids(prompt_texts(verbs, prompts)).to(device),
            }
        texts = [f"{segment}." for segment in nouns + verbs]
        todo = sorted({t for t in texts if t not in self.text_features})
        if todo:
            self.text_features.update(zip(todo, encoder.encode(todo)))
        features = torch.stack([self.text_features[t] for t in texts]).to(device)
        return {"noun_features": features[: len(nouns)], "verb_features": features[len(nouns) :]}


@register_method("rdd", RddSettings, rows=PAPER_ROWS, switches=SWITCHES)
class RddCaptioner(LightweightCaptioner):
    """RDD encoder (GDE → object → action distilling → fusion) + learned-position decoder + ACR."""

    inputs = AttributeInputs

    def __init__(self, config: RddSettings, text_tower: nn.Module | None = None):
        super().__init__(config)
        dim, heads, dropout = config.hidden, config.heads, config.dropout
        self.gde_attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.gde_fuse = nn.Sequential(nn.Linear(2 * dim, dim), nn.ReLU()) if config.rdd_fusion == "linear" else None
        if config.difference_init:  # the settings refuse it without the Linear
            init_as_difference(self.gde_fuse[0])
        self.object_queries = nn.Parameter(torch.randn(config.rdd_objects, dim) * 0.02)
        self.action_queries = nn.Parameter(torch.randn(config.rdd_actions, dim) * 0.02)
        self.object_block = DistillingBlock(dim, heads, config.ffn_dim, dropout)
        self.action_block = DistillingBlock(dim, heads, config.ffn_dim, dropout)
        self.fusion_attention = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.fusion_ffn = feed_forward(dim, config.ffn_dim, dropout)
        # ACR text side: CoOp context vectors (nouns, verbs) and the 3-layer FC adapter [P].
        self.noun_context = nn.Parameter(torch.randn(config.acr_prompt_tokens, config.acr_token_width) * 0.02)
        self.verb_context = nn.Parameter(torch.randn(config.acr_prompt_tokens, config.acr_token_width) * 0.02)
        self.adapter = nn.Sequential(
            nn.Linear(config.acr_text_dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim)
        )
        self.text_tower: TextTowerAdapter | None = None
        self.register_state_dict_post_hook(_drop_text_tower_keys)
        self.register_load_state_dict_post_hook(_ignore_missing_text_tower)
        self.register_load_state_dict_pre_hook(_refuse_post_ln_checkpoints)
        if text_tower is not None:
            self.attach_text_tower(text_tower)

    def attach_text_tower(self, clip_model: nn.Module) -> None:
        """Attach a frozen open_clip text tower for the learnable-prompt path (excluded from state_dict)."""
        tower = TextTowerAdapter(clip_model)
        if tower.width != self.config.acr_token_width or tower.output_dim != self.config.acr_text_dim:
            raise ValueError(
                f"text tower has token width {tower.width} and output {tower.output_dim}; the config expects "
                f"acr_token_width={self.config.acr_token_width}, acr_text_dim={self.config.acr_text_dim}"
            )
        self.text_tower = tower.to(self.noun_context.device).eval()

    def train(self, mode: bool = True):
        super().train(mode)
        if self.text_tower is not None:
            self.text_tower.eval()  # frozen: never in training mode
        return self

    def gde(self, before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """RDD Eqs. 2-5: ``F^_x = R_x + MHCA(F_x, F_diff, F_diff)`` (shared), ``F_c = [F^_bef; F^_aft]``.

        R_x = 0 as printed (``rdd_gde_residual="none"``); [D] the difference token (``"difference"``) or the
        image's own token F_x (``"image"``). F_c: (B, 2·H·W, D) with the printed concatenation
        (``rdd_fusion="concat"``), (B, H·W, D) with [D] ``ReLU(Linear([F^_bef; F^_aft]))`` (``"linear"``).
        """
        difference = global_difference(before, after)
        residual = {"difference": (difference, difference), "image": (before, after), "none": (0, 0)}
        residual_before, residual_after = residual[self.config.rdd_gde_residual]
        enriched = (
            residual_before + attention(self.gde_attention, before, difference),
            residual_after + attention(self.gde_attention, after, difference),
        )
        if self.gde_fuse is None:
            return torch.cat(enriched, dim=1)
        return self.gde_fuse(torch.cat(enriched, dim=-1))

    def fuse(self, global_tokens: torch.Tensor, objects: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """RDD Eq. 9 (multi-scale fusion): ``X = [F_c; O; A]``, ``X ← X + MHSA(X)``, ``X ← X + FFN(X)``.

        Returns F_c's tokens (the paper's ``F~_diff ∈ R^{HW×C}``; 2·H·W with the printed concatenation), or
        all of them with ``rdd_decoder_tokens="all"``.
        """
        tokens = torch.cat([global_tokens, objects, actions], dim=1)
        tokens = tokens + attention(self.fusion_attention, tokens, tokens)
        tokens = tokens + self.fusion_ffn(tokens)
        return tokens[:, : global_tokens.shape[1]] if self.config.rdd_decoder_tokens == "global" else tokens

    def encode(self, tokens_before, tokens_after, *, entities=None, need_losses=True) -> Encoded:
        batch, steps = tokens_before.shape[0], self.config.rdd_distill_steps
        global_tokens = self.gde(tokens_before, tokens_after)
        objects = distill(self.object_block, self.object_queries.expand(batch, -1, -1), global_tokens, steps)
        actions = distill(self.action_block, self.action_queries.expand(batch, -1, -1), objects, steps)
        return Encoded(self.fuse(global_tokens, objects, actions), saved={"objects": objects, "actions": actions})

    def attribute_tokens(self, attributes: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Attribute-guided tokens F_noun, F_verb (B, D): CLIP text features → 3-layer FC adapter."""
        if "noun_ids" in attributes:
            if self.text_tower is None:
                raise ValueError("attributes carry token ids but no text tower is attached (attach_text_tower)")
            noun = self.text_tower(attributes["noun_ids"], self.noun_context)
            verb = self.text_tower(attributes["verb_ids"], self.verb_context)
        elif "noun_features" in attributes:
            noun, verb = attributes["noun_features"], attributes["verb_features"]
        else:
            raise ValueError("attributes must hold noun_ids/verb_ids or noun_features/verb_features")
        return self.adapter(noun.to(self.noun_context.dtype)), self.adapter(verb.to(self.noun_context.dtype))

    def decoder_losses(self, encoded: Encoded, decoded: DecoderOutput, captions_in, attributes=None):
        if attributes is None:
            if self.training and (self.config.n2o_weight or self.config.v2a_weight):
                raise ValueError("RDD training needs `attributes` (noun/verb segments) for ACR, or n2o/v2a weights 0")
            return {}
        noun, verb = self.attribute_tokens(attributes)
        tau, masked = self.config.acr_temperature, self.config.acr_mask_duplicates
        return {
            "n2o_loss": attribute_contrastive_loss(
                noun, regional_token(encoded.saved["objects"]), tau, mask_duplicates=masked
            ),
            "v2a_loss": attribute_contrastive_loss(
                verb, regional_token(encoded.saved["actions"]), tau, mask_duplicates=masked
            ),
        }

    def loss_weights(self) -> dict[str, float]:
        return {"n2o_loss": self.config.n2o_weight, "v2a_loss": self.config.v2a_weight}


def _drop_text_tower_keys(module, state_dict, prefix, local_metadata) -> None:
    """The frozen CLIP tower is loaded from its own file, never saved with the captioner."""
    for key in [k for k in state_dict if k.startswith(prefix + "text_tower.")]:
        del state_dict[key]


def _ignore_missing_text_tower(module, incompatible_keys) -> None:
    for key in [k for k in incompatible_keys.missing_keys if ".text_tower." in f".{k}"]:
        incompatible_keys.missing_keys.remove(key)


def _refuse_post_ln_checkpoints(module, state_dict, prefix, *args) -> None:
    """RDD checkpoints of the earlier post-LN encoder have LayerNorms this encoder does not: say so plainly."""
    if prefix + "gde_attention.norm.weight" in state_dict:
        raise ValueError(
            "this RDD checkpoint was trained with the earlier post-LN encoder (residual + LayerNorm around every "
            "attention), which no longer exists: it never named the changed object (docs/experiments/lightweight_demo.md). "
            "Retrain it with train.py."
        )
