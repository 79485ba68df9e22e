"""The settings of a lightweight change captioner: the common ones here, each method's own next to its model.

`LightweightConfig` holds what the five methods share (front-end, decoder, sizes, init switches); each method's
settings class adds its own fields (`ScorerSettings` in scorer.py, `DirlSettings` in dirl.py, `RddSettings` in
rdd.py, `CheerSettings` in cheer.py; subtraction has none) and is registered with its captioner (registry.py),
together with the method's per-dataset paper rows and printed switch values (each method's own module).

    LightweightConfig(method="rdd", hidden=64, rdd_objects=8)   # -> RddSettings
    ScorerSettings(cv_weight=0.3)
    LightweightConfig(method="scorer", rdd_objects=8)           # ValueError: rdd_objects is a setting of rdd …

Choice fields are `Literal[...]`, checked when built from Python as davir.config checks them from YAML.
Defaults are the paper sizes (hidden 512, word embedding 300, 8 heads, 2 decoder layers), the CLEVR-Change
loss weights of each paper and, for every switch, the paper's printed version (paper_values.py lists them;
docs/paper_departures.md says which config departs and why); where the paper is silent the released code's
value [C], else a gap filler [D]. `paper_settings(method, dataset)` gives the per-dataset values the papers (or
the released code) report (the method's registered `PAPER_ROWS`), to be applied with `**`. Tags in comments follow
docs/methods/README.md: [P] paper, [C] official code, [D] our default.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Literal

from davir.models.lightweight.registry import METHODS, get_method

DEFAULT_METHOD = "scorer"
# Every flat config written before the per-method settings holds these (one key of each method's own) and
# `method`: the other methods' keys it carries were never read, and are dropped when it is loaded.
PRE_SPLIT_MARKERS = ("cv_weight", "dirl_weight", "rdd_objects", "cheer_entities")
# Keys added after models were first saved, with the value every model saved before them was built with. A saved
# dump states every key its code had: one that lacks only these loads with these values, not today's defaults.
ADDED_KEYS: dict[str, Any] = {"rdd_fusion": "linear", "cheer_fusion_relu": True, "decoder_gate_sigmoid": True}


@dataclass
class LightweightConfig:
    """The settings every lightweight method shares; a method's settings class extends them.

    `feat_dim` is the number of channels entering the 1×1 projection, as in the reference configs:
    1024 for ResNet-101 layer3 features, 1026 when `coord_channels` appends the two coordinate maps
    (then the incoming feature maps must have 1024 channels).

    `reference_quirks=True` switches every method to the exact behaviour of the released code where it
    departs from the paper (SCORER: GELU "FFN" decoder layer without attention output projections,
    padded-length sentence mean in CBR, frozen CBR parameters; DIRL: CCR on padded means with averaged
    logits). The default follows the papers; every [D] is a switch a config turns on (docs/paper_departures.md).
    """

    # What the method's module declares about it (the trainer and the captioner read these, never the name).
    method: ClassVar[str] = ""  # set by registry.register_method
    default_positions: ClassVar[str] = "sinusoidal"  # decoder positions when `positions` is None
    default_caption_loss: ClassVar[str] = "token_mean"  # caption loss when `caption_loss` is None
    uses_entities: ClassVar[bool] = False  # batches carry each pair's retrieved entities (CHEER)
    uses_attributes: ClassVar[bool] = False  # training batches carry the captions' noun/verb segments (RDD's ACR)
    uses_text_tower: ClassVar[bool] = False  # a frozen open_clip text tower embeds text (TextTowerSettings)

    # Front-end (§0.3-0.4)
    feat_dim: int = 1024
    coord_channels: bool = False
    grid_size: int = 14
    feature_pool: int = 1  # 1: the whole grid [P]; >1 [D] demo size: average-pool the grid before the projection
    hidden: int = 512
    heads: int = 8
    dropout: float = 0.1  # [C]
    encoder_layers: int = 2  # SCORER / DIRL / CHEER encoder depth (RDD's is rdd_distill_steps; subtraction has none)
    # True [D]: SCORER/DIRL/CHEER cross-view attentions start with W_K = W_Q and W_V (W_O) = I: the first attention
    # is the content similarity of the two views, the first reconstruction of an unchanged token is the token
    # itself (attention.tie_query_key). False: the papers' random init.
    matching_init: bool = False
    # True [D]: SCORER's Eq. 7 / CHEER's Eq. 12 / RDD's Eq. 5 (rdd_fusion=linear) fusion Linear([X_bef; X_aft])
    # starts as X_aft − X_bef ([−I, I], bias 0), so the decoder reads a difference from step 0. False: random init.
    difference_init: bool = False
    # Front-end: "paper" = raw features, PyTorch's default projection init and N(0, 1) position tables, as the
    # references; "scaled" [D] standardises the features per channel (train-split statistics) and starts the
    # projection at N(0, 1/fan_in) and the position tables at N(0, 0.1²).
    frontend_init: Literal["scaled", "paper"] = "paper"
    # Decoder init std: None = 0.02·√(512/hidden) [D], which is the reference's 0.02 [C] at the paper's width 512
    # and keeps that relative scale at any other; a number sets it (0.02 = the reference's at any width).
    decoder_init_std: float | None = None
    # Decoder (§0.5, §7.2)
    vocab_size: int = 76
    max_len: int = 24  # decoder positions: <START> + words + <END> (CLEVR-Change 24, CLEVR-DC 40)
    word_emb: int = 300
    layers: int = 2
    ffn_dim: int = 2048
    positions: Literal["sinusoidal", "learned"] | None = None  # None: the method's own ("learned" for RDD)
    caption_loss: Literal["token_mean", "sentence_mean"] | None = None  # None: "sentence_mean" for RDD (Eq. 15)
    reference_quirks: bool = False

    def __new__(cls, *args, method: str | None = None, **values):
        """`LightweightConfig(method=NAME, ...)` is NAME's settings class (the one its registration bound)."""
        if cls is LightweightConfig:
            cls = get_method(method or DEFAULT_METHOD).settings
        return object.__new__(cls)

    @classmethod
    def bind_method(cls, name: str) -> None:
        """Called by `register_method`: these are the settings of `name`; their __init__ then takes `method=` (this
        name only) and refuses a key of another method in one line (a TypeError of the dataclass otherwise)."""
        cls.method = name
        if not getattr(cls.__init__, "checks_keys", False):
            cls.__init__ = _checked_init(cls.__init__)

    def __post_init__(self) -> None:
        for name, choices in _choices(type(self)).items():
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {list(choices)}, got {getattr(self, name)!r}")
        if self.hidden % self.heads or self.hidden % 2:
            raise ValueError(f"hidden={self.hidden} must be even and divisible by heads={self.heads}")
        if self.coord_channels and self.feat_dim <= 2:
            raise ValueError("with coord_channels, feat_dim counts the 2 coordinate channels (e.g. 1026)")
        if self.decoder_init_std is not None and not self.decoder_init_std > 0:
            raise ValueError(f"decoder_init_std must be a positive number or null, got {self.decoder_init_std!r}")
        if self.max_len < 2 or self.vocab_size < 5:
            raise ValueError("max_len must be >= 2 and vocab_size >= 5 (4 special tokens + a word)")

    def __getattr__(self, name: str) -> Any:  # only for names the settings lack: say whose they are
        owners = owners_of(name)
        raise AttributeError(
            f"{type(self).__name__} has no {name!r}" + (f" (a setting of {', '.join(owners)})" if owners else "")
        )

    # Resolved switches (None = the method's own choice)
    @property
    def resolved_positions(self) -> str:
        return self.positions or self.default_positions

    @property
    def resolved_caption_loss(self) -> str:
        return self.caption_loss or self.default_caption_loss

    @property
    def backbone_channels(self) -> int:
        """Channels of the incoming feature maps (without the coordinate channels)."""
        return self.feat_dim - 2 if self.coord_channels else self.feat_dim

    @property
    def entities_per_pair(self) -> int:
        """Retrieved entities each pair's batch row carries (0: the method reads none)."""
        return 0

    @property
    def attaches_text_tower(self) -> bool:
        """Whether the captioner is built with the text tower attached (`text_tower=`, RDD's learned prompts)."""
        return False

    def to_dict(self) -> dict:
        """The flat saved form: `method` and every field of the method's settings."""
        return {"method": self.method, **asdict(self)}

    @classmethod
    def from_dict(cls, values: dict, *, drop_foreign_keys: bool = False) -> LightweightConfig:
        """The settings a saved flat dict describes (`to_dict`'s, or the one dict of every method's keys that
        earlier versions saved: those other methods' keys are dropped, as that code never read them)."""
        values = dict(values)
        method = values.pop("method", cls.method or DEFAULT_METHOD)
        settings = get_method(method).settings
        unknown = sorted(key for key in values if not owners_of(key))
        if unknown:
            raise ValueError(f"unknown LightweightConfig field(s): {', '.join(unknown)}")
        foreign = [key for key in values if key not in field_names(settings)]
        if foreign and not (drop_foreign_keys or is_pre_split(values)):
            raise ValueError(
                f"{foreign_keys_message(method, foreign)}; a {method} model never read them. To convert "
                "the file, load it with load_lightweight_model(path, drop_foreign_keys=True) and save it "
                "again with save_lightweight_model"
            )
        values = with_added_keys(settings, values, saved=True)
        return settings(**{key: value for key, value in values.items() if key in field_names(settings)})


@dataclass
class TextTowerSettings(LightweightConfig):
    """The frozen open_clip text tower of a method that embeds text (CHEER's entities, RDD's ACR attributes)."""

    uses_text_tower: ClassVar[bool] = True
    default_text_model: ClassVar[str] = ""  # the open_clip model when text_encoder_model is unset

    text_encoder: str | None = None  # local open_clip checkpoint; unset: a seeded random-init tower (stated in the log)
    text_encoder_model: str | None = None  # open_clip model name (unset: default_text_model)
    text_encoder_config: str | None = None  # JSON open_clip model config to register (custom or tiny towers)

    @property
    def text_model(self) -> str:
        return self.text_encoder_model or self.default_text_model

    # Each method declares `text_tower_sizes(width, out_dim) -> {field: size}`: the fields a tower of this token
    # width and output dim fixes (RDD's ACR sizes, CHEER's entity_dim); checked when the class is made.
    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if not callable(getattr(cls, "text_tower_sizes", None)):
            raise TypeError(f"{cls.__name__} embeds text: define text_tower_sizes(width, out_dim) -> {{field: size}}")


def _checked_init(init):
    @functools.wraps(init)
    def __init__(self, *args, method: str | None = None, **values):
        cls = type(self)
        if method is not None and method != cls.method:
            raise ValueError(f"{cls.__name__} are the settings of {cls.method}, not of {method!r}")
        foreign = [key for key in values if key not in field_names(cls)]
        if foreign:
            raise ValueError(foreign_keys_message(cls.method, foreign))
        init(self, *args, **values)

    __init__.checks_keys = True
    return __init__


# --- the keys of each method -----------------------------------------------------------------------------
@functools.cache
def field_names(settings: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(settings))


@functools.cache
def _choices(settings: type) -> dict[str, tuple]:
    """The allowed values of each Literal (or optional Literal) field."""
    hints = typing.get_type_hints(settings)
    choices = {}
    for f in fields(settings):
        options = [hints[f.name]]
        if typing.get_origin(options[0]) in (typing.Union, types.UnionType):
            options = list(typing.get_args(options[0]))
        allowed = [
            value for option in options if typing.get_origin(option) is Literal for value in typing.get_args(option)
        ]
        if allowed:
            choices[f.name] = tuple(allowed) + ((None,) if type(None) in options else ())
    return choices


def common_keys() -> frozenset[str]:
    return field_names(LightweightConfig)


def keys_of(method: str) -> frozenset[str]:
    """Every key `method` takes: the common ones and its own."""
    return field_names(get_method(method).settings)


def own_keys(method: str) -> tuple[str, ...]:
    """The keys `method` adds to the common ones, in declaration order."""
    return tuple(f.name for f in fields(get_method(method).settings) if f.name not in common_keys())


def owners_of(key: str) -> tuple[str, ...]:
    """The methods that take `key` (all of them for a common key; none for an unknown one)."""
    return tuple(name for name, spec in METHODS.items() if key in field_names(spec.settings))


def foreign_keys_message(method: str, keys, *, prefix: str = "") -> str:
    """One line: whose keys these are, and what `method` takes."""
    parts = [
        f"{prefix}{key} is a setting of {', '.join(owners_of(key))}, not of {method}"
        if owners_of(key)
        else f"{prefix}{key} is not a setting of any lightweight method"
        for key in keys
    ]
    own = own_keys(method)
    takes = f"its own: {', '.join(own)}" if own else "none of its own"
    return f"{'; '.join(parts)} ({method} takes the common keys and {takes})"


def with_added_keys(settings: type, values: dict, *, saved: bool = False) -> dict:
    """`values` with the ADDED_KEYS they lack at the value the code before them used, when they are a saved dump:
    `saved` (a model file's config), or stating every other key of `settings` (a run folder's config.yaml). A
    hand-written config is left as it is: today's defaults apply."""
    missing = (field_names(settings) & set(ADDED_KEYS)) - set(values)
    if not missing or not (saved or field_names(settings) - set(values) <= set(ADDED_KEYS)):
        return values
    return {**values, **{key: ADDED_KEYS[key] for key in missing}}


def is_pre_split(values: dict) -> bool:
    """Whether a flat dict is one written before the per-method settings (every method's keys)."""
    return all(key in values for key in PRE_SPLIT_MARKERS)


def __getattr__(name: str):
    if name == "METHOD_NAMES":  # the registry's names, for callers of the former constant
        return tuple(METHODS)
    if name == "PAPER_SETTINGS":  # method → dataset → values: every registered method's rows
        return {method: spec.rows for method, spec in METHODS.items() if spec.rows}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Per-dataset settings from the papers / released configs (docs/methods/, a page per method): each method's own
# `PAPER_ROWS`, registered with it; model fields are keys of the method's settings, "batch_size"/"lr" the trainer's.
# The benchmarks' shared sizes, which the rows spread:
CLEVR_CHANGE = {"vocab_size": 76, "max_len": 24, "coord_channels": True, "feat_dim": 1026}
CLEVR_DC = {"vocab_size": 87, "max_len": 40}
TRAINER_KEYS = ("batch_size", "lr")


def paper_settings(method: str, dataset: str) -> tuple[dict, dict]:
    """(model fields, trainer fields) the papers give for `method` on `dataset`; KeyError if none reported."""
    if method not in METHODS:
        raise KeyError(f"unknown lightweight method {method!r}; choose from {', '.join(METHODS)}")
    table = METHODS[method].rows
    if dataset not in table:
        raise KeyError(f"{method} reports no settings for {dataset!r}; known: {', '.join(sorted(table))}")
    values = table[dataset]
    model = {k: v for k, v in values.items() if k not in TRAINER_KEYS}
    trainer = {k: v for k, v in values.items() if k in TRAINER_KEYS}
    return model, trainer
