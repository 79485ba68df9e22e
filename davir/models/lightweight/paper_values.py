"""The switches whose value a method's paper prints (or, where it is silent, its released code uses), in one place.

`departures(config)` lists where a resolved training config leaves those values. The library defaults are
these values (tests/test_paper_configs.py checks it); a config that departs names the key on its own line
with a `# [D]` (ours) or `# [C]` (the released code's) tag and its reason, which the same test checks for
every shipped config. docs/paper_departures.md is the table of the departures, config by config, and the
measurement behind each. DAVIR's FAC switches live here too: one list for every method.

    departures(load_config(TrainConfig, "configs/dirl_demo.yaml"))
    # [Departure(path='lightweight.frontend_init', value='scaled', printed='paper', tag='[D]'), …]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from davir.models.lightweight.decoder import width_scaled_std

LIGHTWEIGHT = ("subtraction", "scorer", "dirl", "rdd", "cheer")
STEP_LR = "step_lr"  # the released code's StepLR (15 epochs, ×0.1), which train.py does not offer


@dataclass(frozen=True)
class Switch:
    """One setting: its dotted TrainConfig path, the methods that read it, the printed value, the tag of others.

    `printed` may be a function of the config (the method's own value); `read` gives the value a config
    resolves to when the key alone does not say it (None = "the method's own", a width-scaled default).
    `source` says where the reference value is from: [P] the paper, [C] the released code (paper silent)."""

    path: str
    methods: tuple[str, ...]
    printed: Any
    otherwise: str  # "[D]" or "[C]": the tag a config writes beside any other value
    source: str = "[P]"
    read: Callable[[Any], Any] | None = None

    def value(self, config) -> Any:
        if self.read is not None:
            return self.read(config)
        node = config
        for part in self.path.split("."):
            node = getattr(node, part)
        return node

    def reference(self, config) -> Any:
        return self.printed(config) if callable(self.printed) else self.printed


def _decoder_std(config) -> float:
    lw = config.lightweight
    return lw.decoder_init_std if lw.decoder_init_std is not None else width_scaled_std(lw.hidden)


SWITCHES: tuple[Switch, ...] = (
    # --- every lightweight method: front-end, initialisation, decoder, trainer ---------------------------
    Switch("lightweight.frontend_init", LIGHTWEIGHT, "paper", "[D]", "[C]"),
    Switch("lightweight.feature_pool", LIGHTWEIGHT, 1, "[D]"),
    Switch("lightweight.dropout", LIGHTWEIGHT, 0.1, "[D]", "[C]"),
    Switch("lightweight.matching_init", ("scorer", "dirl", "cheer"), False, "[D]", "[C]"),
    Switch("lightweight.difference_init", ("scorer", "rdd", "cheer"), False, "[D]", "[C]"),
    Switch("lightweight.decoder_init_std", ("subtraction", "scorer", "rdd", "cheer"), 0.02, "[D]", "[C]",
           read=_decoder_std),
    Switch("lightweight.positions", LIGHTWEIGHT, lambda c: c.lightweight.default_positions, "[D]", "[P]/[C]",
           read=lambda c: c.lightweight.resolved_positions),
    Switch("lightweight.caption_loss", LIGHTWEIGHT, lambda c: c.lightweight.default_caption_loss, "[D]", "[P]/[C]",
           read=lambda c: c.lightweight.resolved_caption_loss),
    Switch("lightweight.reference_quirks", ("scorer", "dirl"), False, "[C]"),
    Switch("optim.max_grad_norm", LIGHTWEIGHT, 0.0, "[D]", "[C]"),
    Switch("optim.warmup_ratio", LIGHTWEIGHT, 0.0, "[D]", "[C]"),
    Switch("optim.schedule", LIGHTWEIGHT, STEP_LR, "[D]", "[C]"),
    Switch("run.num_beams", LIGHTWEIGHT, 1, "[D]"),
    # --- SCORER+CBR ---------------------------------------------------------------------------------------
    Switch("lightweight.freeze_cbr_params", ("scorer",), False, "[C]", read=lambda c: c.lightweight.resolved_freeze_cbr),
    # --- DIRL+CCR -----------------------------------------------------------------------------------------
    Switch("lightweight.dirl_correlation", ("dirl",), "cosine", "[C]"),
    Switch("lightweight.ccr_mode", ("dirl",), "paper", "[C]", read=lambda c: c.lightweight.resolved_ccr_mode),
    Switch("lightweight.dirl_normalize_difference", ("dirl",), False, "[D]"),
    Switch("lightweight.dirl_pairs", ("dirl",), "all", "[D]"),
    # --- RDD+ACR ------------------------------------------------------------------------------------------
    Switch("lightweight.rdd_gde_residual", ("rdd",), "none", "[D]"),
    Switch("lightweight.rdd_fusion", ("rdd",), "concat", "[D]"),
    Switch("lightweight.rdd_decoder_tokens", ("rdd",), "global", "[D]"),
    Switch("lightweight.acr_mask_duplicates", ("rdd",), False, "[D]"),
    Switch("lightweight.acr_prompts", ("rdd",), "learned", "[D]"),
    # --- CHEER --------------------------------------------------------------------------------------------
    Switch("lightweight.enhance_temperature", ("cheer",), None, "[D]"),
    Switch("lightweight.gate_loss_on", ("cheer",), "logits", "[D]"),
    Switch("lightweight.cheer_fusion_relu", ("cheer",), False, "[D]"),
    Switch("lightweight.decoder_gate_sigmoid", ("cheer",), False, "[D]"),
    # Eq. 1's entity ranking with CLIP (davir.preprocessing.profiles: the image-level "paper" profile)
    Switch("data.preprocessing_profile", ("cheer",), "paper", "[D]"),
    # --- DAVIR (FAC, EPC, LoRA, App. B) ------------------------------------------------------------------
    Switch("model.fac.lambda_attn", ("davir",), 0.1, "[D]"),
    Switch("model.fac.loss_type", ("davir",), "kl", "[D]"),
    Switch("model.fac.attn_norm", ("davir",), "softmax", "[D]"),
    Switch("model.fac.mask_source", ("davir",), "after_only", "[D]"),
    Switch("model.fac.kl_direction", ("davir",), "attn_mask", "[D]"),
    Switch("model.epc.num_entities", ("davir",), 1, "[D]"),
    Switch("model.train_mode", ("davir",), "lora", "[D]"),
    Switch("model.extra_trainable", ("davir",), (), "[D]"),  # App. B: LoRA only, everything else frozen
    Switch("model.lora.vision_rank", ("davir",), 4, "[D]"),
    Switch("model.lora.qformer_rank", ("davir",), 4, "[D]"),
    Switch("model.lora.llm_rank", ("davir",), 8, "[D]"),
    Switch("data.preprocessing_profile", ("davir",), "paper", "[D]"),
)


@dataclass(frozen=True)
class Departure:
    path: str
    value: Any
    printed: Any
    tag: str

    @property
    def key(self) -> str:
        """The key as a YAML line names it (the last part of the path)."""
        return self.path.rsplit(".", 1)[-1]


def switches_of(method: str) -> tuple[Switch, ...]:
    return tuple(switch for switch in SWITCHES if method in switch.methods)


def departures(config) -> list[Departure]:
    """The switches of `config.method` whose resolved value is not the paper's (or its released code's)."""
    found = []
    for switch in switches_of(config.method):
        value, printed = switch.value(config), switch.reference(config)
        if value != printed:
            found.append(Departure(switch.path, value, printed, switch.otherwise))
    return found
