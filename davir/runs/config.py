"""The typed config of `train.py` (YAML + `key.sub=value` overrides; see davir/config.py).

Numeric fields with an obvious range are checked when the config is built (`__post_init__` ->
`davir.config.require`), so `optim.batch_size=0` is "optim.batch_size: must be ≥ 1, got 0" at load
time, not a traceback from the data loader (or, for `optim.max_steps=-3`, a run of 0 steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from davir.config import ConfigError, FieldError, plain, require
from davir.models.families import DEFAULT_FAMILY, FAMILIES
from davir.models.lightweight.section import MOVED_DATA_KEYS, resolve_lightweight
from davir.models.vlm.config import DavirModelConfig

# Package data, so an installed davir has it too; the repository's configs/demo.yaml is its copy for users and the
# Makefile (tests/test_install.py keeps the two equal).
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


@dataclass
class DataConfig:
    format: str = "clevr_change"
    root: str = "outputs/demo/data"
    train_split: str = "train"
    val_split: str = "val"
    masks: str | None = None  # MaskCache folder from `python -m preprocess masks` (FAC)
    # FAC's target: "cache" = the computed masks in data.masks (Eqs. 2-3, the paper); "ground_truth" = the dataset's
    # own change masks (a folder manifest's `mask` column or masks/NAME.png; the synthetic set's) when a user has
    # them. data.masks then only tells caption.py how to compute masks for new pairs (their entities, the report).
    fac_masks: Literal["cache", "ground_truth"] = "cache"
    entities: str | None = None  # EntityCache folder from `python -m preprocess entities` (EPC)
    features: str | None = None  # FeatureCache folder from `python -m preprocess features` (lightweight)
    # Lightweight runs hold the features of their train/val images in memory, pooled to the token grid, when
    # that takes at most this many GB (float32); larger sets are read from the cache at every step. 0: never.
    preload_features_gb: float = 4.0
    # The caches record the dataset root they were built from and must match data.root; when the dataset
    # has moved since, name its old root here to accept them (docs/errors.md).
    moved_from: str | None = None
    # Moved to lightweight.* (CHEER/RDD settings): read here only from configs of earlier versions, whose every
    # config.yaml has them; TrainConfig moves them (null in configs written since).
    text_encoder: str | None = None
    text_encoder_model: str | None = None
    text_encoder_config: str | None = None
    acr_prompts: Literal["learned", "fixed"] | None = None
    # The preprocessing profile the caches must come from (davir.preprocessing.profiles: paper, toolkit); None = no
    # check. A cache of another profile is refused unless allow_profile_mismatch is set.
    preprocessing_profile: Literal["paper", "toolkit"] | None = None
    allow_profile_mismatch: bool = False
    # sample: one reference caption per pair per epoch (an epoch = one pass over the pairs, as FINER-MLLM and the
    # usual step counts); expand: one example per reference sentence (an epoch = 2-5x more steps).
    caption_mode: Literal["sample", "expand"] = "sample"
    max_train_pairs: int | None = None  # a prefix of the split, for quick runs
    # DataLoader workers; auto: 4 on a GPU (at most cores - 1), 0 on a CPU (bench/README.md, train_loop.py)
    num_workers: int | Literal["auto"] = "auto"
    size_policy: Literal["resize_before_to_after", "error"] = "resize_before_to_after"

    def __post_init__(self) -> None:
        require("max_train_pairs", self.max_train_pairs, at_least=1)
        if self.num_workers != "auto":
            require("num_workers", self.num_workers, at_least=0)
        require("preload_features_gb", self.preload_features_gb, at_least=0)


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.05
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    batch_size: int = 16
    gradient_accumulation_steps: int = 1
    epochs: int = 20
    max_steps: int | None = None  # overrides epochs when set
    schedule: Literal["cosine", "linear", "constant_with_warmup", "constant"] = "cosine"
    warmup_ratio: float = 0.01
    max_grad_norm: float = 1.0  # 0: no clipping

    def __post_init__(self) -> None:
        require("lr", self.lr, above=0)
        require("weight_decay", self.weight_decay, at_least=0)
        if len(self.betas) != 2:
            raise FieldError("betas", f"must be two numbers [beta1, beta2], got {self.betas}")
        for k, beta in enumerate(self.betas):
            require(f"betas[{k}]", beta, at_least=0, below=1)
        require("batch_size", self.batch_size, at_least=1)
        require("gradient_accumulation_steps", self.gradient_accumulation_steps, at_least=1)
        require("epochs", self.epochs, at_least=1)
        require("max_steps", self.max_steps, at_least=1)
        require("warmup_ratio", self.warmup_ratio, at_least=0, at_most=1)
        require("max_grad_norm", self.max_grad_norm, at_least=0)


# run.trackers: the experiment trackers a training logs to (davir/training/trackers.py: where each one writes)
TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow")


def resolve_trackers(names: list[str], tensorboard: bool | None = None) -> list[str]:
    """`run.trackers` checked (a FieldError listing the valid names), repeats dropped, with the deprecated
    `run.tensorboard` applied: None leaves the list, False removes "tensorboard", True adds it."""
    resolved: list[str] = []
    for index, name in enumerate(names):
        if name not in TRACKERS:
            raise FieldError("trackers", f"unknown tracker {name!r} (item {index}); valid: {', '.join(TRACKERS)} "
                                         "(or [] for none)")
        if name not in resolved:
            resolved.append(name)
    if tensorboard is False and "tensorboard" in resolved:
        resolved.remove("tensorboard")
    elif tensorboard is True and "tensorboard" not in resolved:
        resolved.insert(0, "tensorboard")
    return resolved


@dataclass
class RunConfig:
    output_dir: str = "runs/demo"
    overwrite: bool = False
    seed: int = 0
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    log_every: int = 10
    eval_every: int = 0  # steps between validations (0: only at the end)
    save_every: int = 0  # steps between `save_state` checkpoints (0: only at the end)
    keep_checkpoints: int = 2
    # Experiment trackers, any of TRACKERS above (tensorboard, wandb, trackio, mlflow); [] = none.
    # Each writes under RUN/logs/ and offline unless its own environment variable says otherwise (README, "Tracking").
    trackers: list[str] = field(default_factory=lambda: ["tensorboard"])
    # Deprecated alias, kept for the configs and sweeps that set it: null (the default) leaves run.trackers as it is;
    # false removes "tensorboard" from run.trackers, true adds it — whatever run.trackers lists, so
    # `run.tensorboard=false` always means no TensorBoard. The value given is kept (config.yaml records it).
    tensorboard: bool | None = None
    val_max_pairs: int = 64  # pairs captioned for val metrics / model selection
    val_show: int = 4  # captions printed, and sent to the trackers as a table with their images, at each validation
    best_metric: str = "CIDEr"
    max_new_tokens: int = 30
    num_beams: int = 1

    def __post_init__(self) -> None:
        require("seed", self.seed, at_least=0, below=2**32)  # numpy's seed range
        require("log_every", self.log_every, at_least=1)
        require("val_max_pairs", self.val_max_pairs, at_least=1)
        for name in ("eval_every", "save_every", "keep_checkpoints", "val_show"):  # 0: never / keep all / none
            require(name, getattr(self, name), at_least=0)
        require("max_new_tokens", self.max_new_tokens, at_least=1)
        require("num_beams", self.num_beams, at_least=1)
        self.trackers = resolve_trackers(self.trackers, self.tensorboard)


@dataclass
class TrainConfig:
    # a method with a registered task (davir.training.tasks): davir, subtraction, scorer, dirl, rdd, cheer, …
    method: str = "davir"
    data: DataConfig = field(default_factory=DataConfig)
    model: DavirModelConfig = field(default_factory=DavirModelConfig)
    # A lightweight method's settings: YAML gives only the keys it changes, flat, the common ones and the method's
    # own (davir.models.lightweight.section); built into the method's settings class (ScorerSettings, …), or
    # NoLightweightSettings for davir. A key of another method is an error.
    lightweight: dict[str, Any] = field(default_factory=dict)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    # A user's own modules, imported before anything else of the config is read: they register entries (a model
    # family, …) without editing the package. The run records them, so evaluate.py and caption.py import them too.
    imports: list[str] = field(default_factory=list)

    @staticmethod
    def prepare(data: dict, *, where: str) -> None:
        """Import the modules of ``imports:`` (``davir.config.from_dict`` calls this before building the fields)."""
        from davir.registry import import_modules

        modules = data.get("imports") or []
        if not isinstance(modules, list):
            raise ConfigError(f"{where}: imports must be a list of module names, got {plain(modules)!r}")
        import_modules([str(plain(module)) for module in modules], key=f"{where}: imports")

    @staticmethod
    def resolve_variants(data: dict, final: dict, *, where: str) -> dict:
        """``model.for_family``: per-family model settings a config keeps beside its own (configs/demo.yaml: the
        tiny pretrained folder of each family). The entry of the family in force (``final``: the YAML with the
        command line applied) updates the ``model`` block; keys the command line gives still win."""
        model = data.get("model") if isinstance(data.get("model"), dict) else None
        if model is None or "for_family" not in model:
            return data
        table = model["for_family"]
        final_model = final.get("model") if isinstance(final.get("model"), dict) else {}
        family = plain(final_model.get("family", model.get("family", DEFAULT_FAMILY)))
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            raise ConfigError(f"{where}: model.for_family must map family names to mappings of model settings")
        unknown = sorted(set(map(str, map(plain, table))) - set(FAMILIES.names()))
        if unknown:
            raise ConfigError(f"{where}: model.for_family names {unknown}, not model families "
                              f"{list(FAMILIES.names())}")
        resolved = {key: value for key, value in model.items() if key != "for_family"}
        resolved.update(next((entry for name, entry in table.items() if plain(name) == family), {}))
        return {**data, "model": resolved}

    def __post_init__(self) -> None:
        moved = {key: getattr(self.data, key) for key in MOVED_DATA_KEYS if getattr(self.data, key) is not None}
        for key in moved:
            setattr(self.data, key, None)
        self.lightweight = resolve_lightweight(self.method, self.lightweight, moved)
