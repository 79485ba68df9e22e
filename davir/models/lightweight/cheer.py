"""CHEER(S) (Y. Li, Y. Tu et al., 2025) — docs/methods/cheer.md. No code was obtainable; [D] choices are marked.

Inputs besides the grid features: the K = 3 retrieved change entities, as CLIP ViT-L/14 text embeddings
(B, K, 768) or as ids into a stored entity bank (B, K) — mapped to the model space by Linear + LN [D].

Representation enhancement (Eqs. 2-5): ``P = softmax_j(cos(F_target[i], F_source[j]))`` (Eq. 2; a learnable
temperature, ``softmax_j(cos / τ_e)``, is the [D] ``enhance_temperature``); CRE logits ``P^ = Linear(max_j P)``,
DRE ``P^ = Linear(1 − max_j P)``; output ``LN(σ(P^) ⊙ F_t + F_t)`` (Eq. 4).
HRD (Eqs. 6-12), per layer ℓ (modules shared by both images; the next layer reads the refined commonality):
``C_i = CRE(F_j → F_i)``, consistency ``MSE(P^_C, P^'_C)`` with ``DRE(E → F_i)`` (L_C, Eq. 7; other
comparisons are the [D] ``gate_loss_on``); ``C~_i = MHCA(C_i, C_j)`` with SCORER-style MTM contrast (L_I,
Eqs. 8-9). After the last layer [D]: ``D_i = DRE(F_i → F_i − C~_i)``, consistency with ``CRE(E → F_i − C~_i)``
(L_D, Eq. 11); ``F_diff = Linear([D_bef; D_aft])`` (Eq. 12; ``ReLU(Dropout(·))`` after it, as SCORER's Eq. 7,
is the [D] ``cheer_fusion_relu``).
Decoder: gated dual cross-attention over entities and F_diff (Eqs. 13-17; σ on α, β is the [D]
``decoder_gate_sigmoid``).
Total (Eq. 19): ``L = L_S + λ_v (L_C + L_D) + λ_m L_I`` with λ_v = 0.75, λ_m = 0.5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from davir.errors import DataError
from davir.models.lightweight.attention import init_as_difference, tie_query_key
from davir.models.lightweight.base import Encoded, LightweightCaptioner
from davir.models.lightweight.config import CLEVR_DC, TextTowerSettings
from davir.models.lightweight.inputs import MethodInputs
from davir.models.lightweight.losses import gate_consistency_loss, map_correlation_loss
from davir.models.lightweight.paper_values import DECODER_INIT_STD, DIFFERENCE_INIT, MATCHING_INIT, Switch
from davir.models.lightweight.registry import register_method
from davir.models.lightweight.scorer import ReconstructionLayer, cross_view_contrastive_loss


@dataclass
class CheerSettings(TextTowerSettings):
    """CHEER (§4): L = L_S + λ_v (L_C + L_D) + λ_m L_I."""

    uses_entities: ClassVar[bool] = True
    default_text_model: ClassVar[str] = "ViT-L-14"  # CLIP ViT-L/14 [BG]

    cheer_entities: int = 3  # K retrieved entities [P]
    entity_dim: int = 768  # CLIP ViT-L/14 text embedding [BG]
    entity_bank_size: int = 0  # >0: entities may be given as ids into a stored (M, entity_dim) bank
    gate_weight: float = 0.75  # λ_v [P]
    cheer_contrastive_weight: float = 0.5  # λ_m [P]
    # L_C / L_D (Eqs. 7, 11): "logits" = MSE of P^ = Linear(max_j P), before σ, as printed; [D] "gate": MSE of
    # σ(P^) (B,N,D); "map": MSE of max_j P (B,N); "correlation": 1 − Pearson correlation of the two match maps
    # over positions (not minimised by constant maps, as both MSEs are)
    gate_loss_on: Literal["logits", "gate", "map", "correlation"] = "logits"
    # Eq. 2: None = the printed softmax of the cosine similarities; a number [D] = a learnable τ_e starting there
    enhance_temperature: float | None = None
    # Eq. 12: False = F_diff = Linear([D_bef; D_aft]) as printed; True [D] = then Dropout and ReLU, as SCORER's Eq. 7
    cheer_fusion_relu: bool = False
    # Eqs. 14-15: False = α, β are the Linear outputs as printed; True [D] = σ(Linear), each gate in (0, 1)
    decoder_gate_sigmoid: bool = False
    # L_I's token matching: unprinted (Eq. 9 names a sim), a gap filler [D]: SCORER's released MTM [C]
    mtm_mode: Literal["summed_heads", "per_head_mean"] = "summed_heads"

    @property
    def entities_per_pair(self) -> int:
        return self.cheer_entities

    def text_tower_sizes(self, width: int, out_dim: int) -> dict[str, int]:
        return {"entity_dim": out_dim}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.enhance_temperature is not None and not self.enhance_temperature > 0:
            raise ValueError(f"enhance_temperature must be a positive number or null, got {self.enhance_temperature!r}")

    def with_entity_bank(self, size: int) -> CheerSettings:
        """These settings with a stored bank of `size` entity embeddings (batches then carry ids into it)."""
        return replace(self, entity_bank_size=size)


# Per-dataset values (docs/methods/cheer.md).
PAPER_ROWS = {
    "clevr_change": {"vocab_size": 76, "max_len": 24, "encoder_layers": 2, "batch_size": 128, "lr": 1e-3},
    "clevr_dc": {**CLEVR_DC, "encoder_layers": 1, "batch_size": 128, "lr": 1e-3},
    "spot_the_diff": {"encoder_layers": 2, "batch_size": 96, "lr": 5e-4},
}
# The printed values it reads beside paper_values.EVERY_METHOD.
SWITCHES = (
    MATCHING_INIT,
    DIFFERENCE_INIT,
    DECODER_INIT_STD,
    Switch("lightweight.enhance_temperature", None, "[D]"),
    Switch("lightweight.gate_loss_on", "logits", "[D]"),
    Switch("lightweight.cheer_fusion_relu", False, "[D]"),
    Switch("lightweight.decoder_gate_sigmoid", False, "[D]"),
    # Eq. 1's entity ranking with CLIP (davir.preprocessing.profiles: the image-level "paper" profile)
    Switch("data.preprocessing_profile", "paper", "[D]"),
)


def enhancement_probability(
    target: torch.Tensor, source: torch.Tensor, temperature: torch.Tensor | float = 1.0
) -> torch.Tensor:
    """CHEER Eq. 2: ``P(i, j) = softmax_j(cos(F_target[i], F_source[j]) / τ)`` — (B, N_t, N_s).

    τ = 1 is the printed softmax; another τ is the [D] temperature. The printed indices are garbled: the
    softmax runs over the source positions (a gap read from "the maximum similarity across all positions in
    the source", Eq. 3).
    """
    sim = F.normalize(target, dim=-1) @ F.normalize(source, dim=-1).transpose(1, 2)
    return (sim / temperature).softmax(dim=-1)


def gated_residual(
    target: torch.Tensor, gate_logits: torch.Tensor, norm: nn.LayerNorm
) -> tuple[torch.Tensor, torch.Tensor]:
    """CHEER Eq. 4: ``F'_target = LN(σ(P^) ⊙ F_target + F_target)``; also returns the gate σ(P^)."""
    gate = torch.sigmoid(gate_logits)
    return norm(gate * target + target), gate


@dataclass
class Enhanced:
    """What one CRE/DRE call gives: F'_target, the logits P^ (Eqs. 3, 5), the gate σ(P^) and the map (max_j P)."""

    features: torch.Tensor  # (B, N, D)
    logits: torch.Tensor  # (B, N, D)
    gate: torch.Tensor  # (B, N, D)
    score: torch.Tensor  # (B, N)


class EnhancementModule(nn.Module):
    """CRE (commonality, Eq. 3) or DRE (difference, Eq. 5): ``Module(source, target)`` → `Enhanced`.

    `temperature` None: Eq. 2's plain softmax, no parameter; a number: a learnable τ_e starting there [D].
    """

    def __init__(self, dim: int, kind: str, temperature: float | None = None):
        super().__init__()
        if kind not in ("commonality", "difference"):
            raise ValueError(f"kind must be 'commonality' or 'difference', got {kind!r}")
        self.kind = kind
        self.expand = nn.Linear(1, dim)  # "expanded to the same dimensions as F_target by a learnable linear layer"
        self.norm = nn.LayerNorm(dim)
        self.log_temperature = None if temperature is None else nn.Parameter(torch.tensor(math.log(temperature)))

    def match_map(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Eq. 3 (CRE): ``max_j P(i, j)``; Eq. 5 (DRE): ``1 − max_j P(i, j)`` — (B, N_t)."""
        temperature = 1.0 if self.log_temperature is None else self.log_temperature.exp()
        best = enhancement_probability(target, source, temperature).max(dim=-1).values
        return best if self.kind == "commonality" else 1.0 - best

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> Enhanced:
        score = self.match_map(source, target)
        logits = self.expand(score.unsqueeze(-1))
        enhanced, gate = gated_residual(target, logits, self.norm)
        return Enhanced(enhanced, logits, gate, score)


class HrdLayer(nn.Module):
    """The commonality half of one HRD layer: CRE + entity DRE (L_C) and the contrastive MHCA (L_I)."""

    def __init__(self, config: CheerSettings):
        super().__init__()
        dim = config.hidden
        self.commonality = EnhancementModule(dim, "commonality", config.enhance_temperature)
        self.entity_difference = EnhancementModule(dim, "difference", config.enhance_temperature)
        self.interaction = ReconstructionLayer(dim, config.heads, config.dropout, config.mtm_mode)


def consistency_loss(image_side: Enhanced, entity_side: Enhanced, on: str) -> torch.Tensor:
    """CHEER Eqs. 7 / 11 between the image-side and the entity-side enhancement of one target: ``logits`` is
    the printed ``MSE(P^, P^')`` (before σ); [D] ``gate`` the MSE after σ, ``map`` the MSE of the match maps,
    ``correlation`` 1 − their correlation."""
    if on == "logits":
        return gate_consistency_loss(image_side.logits, entity_side.logits)
    if on == "gate":
        return gate_consistency_loss(image_side.gate, entity_side.gate)
    if on == "map":
        return gate_consistency_loss(image_side.score, entity_side.score)
    return map_correlation_loss(image_side.score, entity_side.score)


def commonality_step(layer: HrdLayer, image: torch.Tensor, other: torch.Tensor, entities: torch.Tensor, on: str):
    """CHEER Eqs. 6-7 for one image: ``C_i = CRE(F_j, F_i)``, ``C'_i = DRE(E, F_i)``, L_C term ``MSE(P^_C, P^'_C)``."""
    common = layer.commonality(other, image)
    return common.features, consistency_loss(common, layer.entity_difference(entities, image), on)


def cross_image_interaction(
    layer: HrdLayer, common_before: torch.Tensor, common_after: torch.Tensor, need_similarity: bool
):
    """CHEER Eqs. 8-9: ``C~_bef = MHCA(C_bef, C_aft)``, ``C~_aft = MHCA(C_aft, C_bef)`` (both from the same
    inputs), with the SCORER-style MTM similarity matrices S^{b→a}, S^{a→b} for L_I when asked [D]."""
    refined_before, sim_ba = layer.interaction(common_before, common_after, need_similarity)
    refined_after, sim_ab = layer.interaction(common_after, common_before, need_similarity)
    return refined_before, refined_after, sim_ba, sim_ab


# --- what its batches carry: the retrieved entities, as ids into a bank of their text embeddings (§4.8) ----------
ENTITY_FILE = "entity_phrases.json"


@dataclass
class DistractorEntityField:
    """`entities_distractor`: the retrieved entities of the scene's distractor pair (CHEER scene batches)."""

    cache: Any  # an EntityCache
    top_k: int
    distractor_ids: dict[str, str]  # scene_id -> pair id of the distractor pair
    keys: tuple[str, ...] = ("entities_distractor",)

    def __call__(self, pair) -> dict[str, Any]:
        return {"entities_distractor": [e for e, _ in self.cache.get(self.distractor_ids[pair.scene_id])[: self.top_k]]}


class EntityInputs(MethodInputs):
    """The top-K retrieved entities of each pair from an entity cache (`data.entities`, `python -m preprocess
    entities … --top-k 3`); the cache's entity vocabulary, embedded with the frozen open_clip text tower, is the
    entity bank stored in the model, and the batches carry ids into it."""

    def prepare(self, settings: CheerSettings) -> CheerSettings:
        from davir.data.caches import EntityCache, check_cache_root, require_cached
        from davir.text.entity_vocabulary import EntityVocabulary

        context, data, top_k = self.context, self.context.data, settings.entities_per_pair
        self.top_k = top_k

        def command(split: str, out: str) -> str:  # CHEER's entities are of whole frames (§4.8): no masks
            return context.command.format(cmd="entities", split=split, out=out) + f" --image-level --top-k {top_k}"

        if data.entities is None:
            raise DataError(
                f"CHEER needs the top-{top_k} retrieved change entities of every pair (§4.8) but "
                f"data.entities is not set: run `{command(data.train_split, 'CACHE')}` (and for {data.val_split}), "
                "then set data.entities=CACHE"
            )
        vocab_path = Path(data.entities) / "vocab.json"
        if not vocab_path.is_file():
            raise DataError(
                f"{data.entities} has no entity vocabulary ({vocab_path}); "
                f"run `{command(data.train_split, data.entities)}`"
            )
        check_cache_root(data.entities, data.root, key="data.entities", moved_from=data.moved_from)
        # Only the lexicon here (expected profile None): entities read with other word lists are another bank.
        context.check_profiles(
            None,
            entities=data.entities,
            allow_mismatch=data.allow_profile_mismatch,
            warn=context.note,
            where="this config",
        )
        self.cache = EntityCache(data.entities)
        self.phrases = EntityVocabulary.load(vocab_path).phrases
        self.index = {phrase: i for i, phrase in enumerate(self.phrases)}
        for split, pairs in ((data.train_split, context.train_pairs), (data.val_split, context.val_pairs)):
            require_cached(
                pairs,
                self.cache.has,
                what=f"retrieved entities in {data.entities}",
                command=command(split, data.entities),
            )
            short = [p.pair_id for p in pairs if len(self.cache.get(p.pair_id)) < top_k]
            if short:
                raise DataError(
                    f"{len(short)} pairs of {split} have fewer than {top_k} entities in {data.entities} "
                    f"(e.g. {short[:3]}); rerun `preprocess entities` with --top-k {top_k} into a new --out"
                )
        if context.text_encoder is None:
            raise DataError("internal: the text tower must be loaded before the entity bank")
        context.note(
            f"CHEER entity bank: {len(self.phrases)} phrases of {vocab_path}, embedded by the "
            f"{context.text_encoder.model_name} text tower ({context.text_encoder.weights})"
        )
        return settings.with_entity_bank(len(self.phrases))

    def model_built(self, model: CheerCaptioner) -> None:
        bank = self.context.text_encoder.encode(self.phrases)
        model.set_entity_bank(bank.to(model.entity_bank.device))

    def fields(self, *, distractor_ids=None) -> list:
        from davir.data.dataset import EntityField

        own = [EntityField(self.cache, top_k=self.top_k)]
        return own if distractor_ids is None else [*own, DistractorEntityField(self.cache, self.top_k, distractor_ids)]

    def model_inputs(self, batch, device, *, pair="semantic") -> dict[str, Any]:
        key = "entities_distractor" if pair == "distractor" else "entities"
        return {"entities": self.entity_ids(batch[key], device)}

    def entity_ids(self, entities: list[list[str]], device) -> torch.Tensor:
        """(B, K) ids into the entity bank of the batch's retrieved phrases."""
        unknown = sorted({e for row in entities for e in row if e not in self.index})
        if unknown:
            raise DataError(
                f"retrieved entities {unknown[:3]} are not in the entity vocabulary the model was built with"
            )
        return torch.tensor([[self.index[e] for e in row] for row in entities], dtype=torch.long, device=device)

    def save(self, directory: Path) -> dict[str, Any]:
        from davir.io import write_json_atomic

        write_json_atomic(directory / ENTITY_FILE, self.phrases)
        return {"entity_phrases": ENTITY_FILE}


@register_method("cheer", CheerSettings, rows=PAPER_ROWS, switches=SWITCHES)
class CheerCaptioner(LightweightCaptioner):
    """CHEER: entity projection + HRD encoder + gated dual cross-attention decoder + L_C, L_D, L_I."""

    inputs = EntityInputs

    def __init__(self, config: CheerSettings):
        super().__init__(config)
        dim = config.hidden
        self.entity_projection = nn.Sequential(nn.Linear(config.entity_dim, dim), nn.LayerNorm(dim))
        if config.entity_bank_size > 0:
            self.register_buffer("entity_bank", torch.zeros(config.entity_bank_size, config.entity_dim))
        else:
            self.entity_bank = None
        self.hrd_layers = nn.ModuleList(HrdLayer(config) for _ in range(config.encoder_layers))
        if config.matching_init:
            for layer in self.hrd_layers:
                tie_query_key(layer.interaction.attention, identity_value=True)
        self.difference = EnhancementModule(dim, "difference", config.enhance_temperature)
        self.entity_commonality = EnhancementModule(dim, "commonality", config.enhance_temperature)
        after = [nn.Dropout(config.dropout), nn.ReLU()] if config.cheer_fusion_relu else []  # no parameters either way
        self.fuse = nn.Sequential(nn.Linear(2 * dim, dim), *after)
        if config.difference_init:
            init_as_difference(self.fuse[0])

    @classmethod
    def decoder_kind(cls, config: CheerSettings) -> str:
        return "gated"

    @classmethod
    def decoder_options(cls, config: CheerSettings) -> dict:
        return {"sigmoid_gates": config.decoder_gate_sigmoid}

    @torch.no_grad()
    def set_entity_bank(self, embeddings: torch.Tensor) -> None:
        """Store the (M, entity_dim) CLIP text embeddings of the entity vocabulary (saved in the state dict)."""
        if self.entity_bank is None or embeddings.shape != self.entity_bank.shape:
            raise ValueError(
                f"entity bank must be {tuple(self.entity_bank.shape) if self.entity_bank is not None else '(M, d)'} "
                f"(config entity_bank_size/entity_dim), got {tuple(embeddings.shape)}"
            )
        self.entity_bank.copy_(embeddings)

    def entity_features(self, entities) -> torch.Tensor:
        """(B, K) entity ids (into the bank) or (B, K, entity_dim) embeddings → (B, K, D)."""
        if entities is None:
            raise ValueError(
                "CHEER needs the retrieved change entities (`entities`: (B, K) ids or (B, K, d) embeddings)"
            )
        if not torch.is_floating_point(entities):
            if self.entity_bank is None:
                raise ValueError("entities given as ids but the model has no entity bank (config entity_bank_size)")
            entities = self.entity_bank[entities]
        if entities.dim() != 3 or entities.shape[-1] != self.config.entity_dim:
            raise ValueError(f"entity embeddings must be (B, K, {self.config.entity_dim}), got {tuple(entities.shape)}")
        return self.entity_projection(entities.to(self.entity_projection[0].weight.dtype))

    def difference_step(self, image: torch.Tensor, commonality: torch.Tensor, entities: torch.Tensor):
        """CHEER Eqs. 10-11 for one image: ``D_i = DRE(F_i, F_i − C~_i)``, ``D'_i = CRE(E, F_i − C~_i)``, L_D term."""
        residual = image - commonality
        enhanced = self.difference(image, residual)
        loss = consistency_loss(enhanced, self.entity_commonality(entities, residual), self.config.gate_loss_on)
        return enhanced.features, loss

    def difference_fusion(self, diff_before: torch.Tensor, diff_after: torch.Tensor) -> torch.Tensor:
        """CHEER Eq. 12: ``F_diff = Linear(Concat[D_bef ; D_aft])`` (+ Dropout, ReLU with ``cheer_fusion_relu`` [D])."""
        return self.fuse(torch.cat([diff_before, diff_after], dim=-1))

    def encode(self, tokens_before, tokens_after, *, entities=None, need_losses=True) -> Encoded:
        entity_tokens = self.entity_features(entities)
        on = self.config.gate_loss_on
        before, after = tokens_before, tokens_after
        commonality_losses = []
        sim_ba = sim_ab = None
        for index, layer in enumerate(self.hrd_layers):
            last = need_losses and index == len(self.hrd_layers) - 1
            common_before, loss_before = commonality_step(layer, before, after, entity_tokens, on)
            common_after, loss_after = commonality_step(layer, after, before, entity_tokens, on)
            commonality_losses.append(0.5 * (loss_before + loss_after))
            before, after, sim_ba, sim_ab = cross_image_interaction(layer, common_before, common_after, last)
        diff_before, loss_d_before = self.difference_step(tokens_before, before, entity_tokens)
        diff_after, loss_d_after = self.difference_step(tokens_after, after, entity_tokens)
        memory = self.difference_fusion(diff_before, diff_after)
        losses = {}
        if need_losses:
            losses = {
                "commonality_gate_loss": torch.stack(commonality_losses).mean(),
                "difference_gate_loss": 0.5 * (loss_d_before + loss_d_after),
                "contrastive_loss": cross_view_contrastive_loss(sim_ba, sim_ab),
            }
        return Encoded(memory, text_memory=entity_tokens, losses=losses)

    def loss_weights(self) -> dict[str, float]:
        return {
            "commonality_gate_loss": self.config.gate_weight,
            "difference_gate_loss": self.config.gate_weight,
            "contrastive_loss": self.config.cheer_contrastive_weight,
        }
