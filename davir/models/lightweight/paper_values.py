"""The switches whose value a method's paper prints (or, where it is silent, its released code uses).

`departures(config)` lists where a resolved training config leaves those values. The library defaults are
these values (tests/test_paper_configs.py checks it); a config that departs names the key on its own line
with a `# [D]` (ours) or `# [C]` (the released code's) tag and its reason, which the same test checks for
every shipped config. docs/paper_departures.md is the table of the departures, config by config, and the
measurement behind each. Each lightweight method lists its own switches in its module (`SWITCHES`, registered
with it); the ones every lightweight method reads, and DAVIR's FAC switches, live here.

    departures(load_config(TrainConfig, "configs/dirl_demo.yaml"))
    # [Departure(path='lightweight.frontend_init', value='scaled', printed='paper', tag='[D]'), …]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from davir.models.lightweight.decoder import width_scaled_std
from davir.models.lightweight.registry import METHODS

STEP_LR = "step_lr"  # the released code's StepLR (15 epochs, ×0.1), which train.py does not offer


@dataclass(frozen=True)
class Switch:
    """One setting: its dotted TrainConfig path, the printed value, the tag of others, the methods that read it.

    `printed` may be a function of the config (the method's own value); `read` gives the value a config
    resolves to when the key alone does not say it (None = "the method's own", a width-scaled default).
    `source` says where the reference value is from: [P] the paper, [C] the released code (paper silent).
    A method's own switches leave `methods` empty: its registration (`register_method(switches=…)`) fills it."""

    path: str
    printed: Any
    otherwise: str  # "[D]" or "[C]": the tag a config writes beside any other value
    source: str = "[P]"
    read: Callable[[Any], Any] | None = None
    methods: tuple[str, ...] = ()

    def value(self, config) -> Any:
        if self.read is not None:
            return self.read(config)
        node = config
        for part in self.path.split("."):
            node = getattr(node, part)
        return node

    def reference(self, config) -> Any:
        return self.printed(config) if callable(self.printed) else self.printed

    def owned_by(self, *methods: str) -> Switch:
        return replace(self, methods=methods)


def _decoder_std(config) -> float:
    lw = config.lightweight
    return lw.decoder_init_std if lw.decoder_init_std is not None else width_scaled_std(lw.hidden)


# --- every lightweight method (a user's too): front-end, decoder, trainer ------------------------------
EVERY_METHOD: tuple[Switch, ...] = (
    Switch("lightweight.frontend_init", "paper", "[D]", "[C]"),
    Switch("lightweight.feature_pool", 1, "[D]"),
    Switch("lightweight.dropout", 0.1, "[D]", "[C]"),
    Switch(
        "lightweight.positions",
        lambda c: c.lightweight.default_positions,
        "[D]",
        "[P]/[C]",
        read=lambda c: c.lightweight.resolved_positions,
    ),
    Switch(
        "lightweight.caption_loss",
        lambda c: c.lightweight.default_caption_loss,
        "[D]",
        "[P]/[C]",
        read=lambda c: c.lightweight.resolved_caption_loss,
    ),
    Switch("optim.max_grad_norm", 0.0, "[D]", "[C]"),
    Switch("optim.warmup_ratio", 0.0, "[D]", "[C]"),
    Switch("optim.schedule", STEP_LR, "[D]", "[C]"),
    Switch("run.num_beams", 1, "[D]"),
)
# --- common settings that only some methods read: each names these in its own SWITCHES --------------------
MATCHING_INIT = Switch("lightweight.matching_init", False, "[D]", "[C]")
DIFFERENCE_INIT = Switch("lightweight.difference_init", False, "[D]", "[C]")
DECODER_INIT_STD = Switch("lightweight.decoder_init_std", 0.02, "[D]", "[C]", read=_decoder_std)
REFERENCE_QUIRKS = Switch("lightweight.reference_quirks", False, "[C]")
# --- DAVIR (FAC, EPC, LoRA, App. B) ------------------------------------------------------------------------
DAVIR: tuple[Switch, ...] = tuple(
    switch.owned_by("davir")
    for switch in (
        Switch("model.fac.lambda_attn", 0.1, "[D]"),
        Switch("model.fac.loss_type", "kl", "[D]"),
        Switch("model.fac.attn_norm", "softmax", "[D]"),
        Switch("model.fac.mask_source", "after_only", "[D]"),
        Switch("model.fac.kl_direction", "attn_mask", "[D]"),
        Switch("model.epc.num_entities", 1, "[D]"),
        Switch("model.train_mode", "lora", "[D]"),
        Switch("model.extra_trainable", (), "[D]"),  # App. B: LoRA only, everything else frozen
        Switch("model.lora.vision_rank", 4, "[D]"),
        Switch("model.lora.qformer_rank", 4, "[D]"),
        Switch("model.lora.llm_rank", 8, "[D]"),
        Switch("data.preprocessing_profile", "paper", "[D]"),
    )
)


def __getattr__(name: str):
    if name == "SWITCHES":  # every switch: the shared ones, each registered method's own, DAVIR's
        return (
            *(switch.owned_by(*METHODS) for switch in EVERY_METHOD),
            *(switch for _, spec in METHODS.items() for switch in spec.switches),
            *DAVIR,
        )
    if name == "LIGHTWEIGHT":
        return METHODS.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    if method in METHODS:
        return (*EVERY_METHOD, *METHODS[method].switches)
    return tuple(switch for switch in DAVIR if method in switch.methods)


def departures(config) -> list[Departure]:
    """The switches of `config.method` whose resolved value is not the paper's (or its released code's)."""
    found = []
    for switch in switches_of(config.method):
        value, printed = switch.value(config), switch.reference(config)
        if value != printed:
            found.append(Departure(switch.path, value, printed, switch.otherwise))
    return found
