"""The `lightweight:` section of a train config: flat keys, resolved against the config's one `method:`.

A YAML names the method once, at the top (`method: scorer`), and lists under `lightweight:` only the keys it
changes: common ones (LightweightConfig) and the method's own (ScorerSettings, …), so an override stays
`lightweight.cv_weight=0.3`. TrainConfig keeps the mapping as given; `resolve_lightweight` checks its keys
against the configured method's settings class and builds it through davir.config (each value of its declared
type, Literal choices included) — so a method registered at any time, a user's own, is checked the same way.
A key of another method is an error naming the method it belongs to and what the configured method takes.

Configs written before the per-method settings (the config.yaml of every earlier run folder) hold every
method's keys, `lightweight.method`, and RDD/CHEER's text-tower keys under `data:`. They still load: the
other methods' keys are dropped, as that code never read them, and the `data:` keys move here. A config.yaml
that states every key of its method but one added since (config.ADDED_KEYS) gets the value that code used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from davir.models.lightweight.config import (
    LightweightConfig,
    field_names,
    foreign_keys_message,
    is_pre_split,
    with_added_keys,
)
from davir.models.lightweight.registry import METHODS

# RDD/CHEER settings that earlier configs wrote under `data:` (DataConfig still reads them, TrainConfig moves them).
MOVED_DATA_KEYS = ("text_encoder", "text_encoder_model", "text_encoder_config", "acr_prompts")


@dataclass
class NoLightweightSettings:
    """`TrainConfig.lightweight` of a method without a lightweight model (davir): no keys; saved as `{}`."""


def given_keys(section: Any) -> dict[str, Any]:
    """The keys a section (or a settings object, or a plain dict) states."""
    if section is None or isinstance(section, NoLightweightSettings):
        return {}
    if isinstance(section, LightweightConfig):
        return {"method": section.method, **asdict(section)}
    if isinstance(section, dict) and not is_dataclass(section):
        return dict(section)
    raise TypeError(f"lightweight must be a mapping of settings, got {type(section).__name__}")


def resolve_lightweight(
    method: str, section: Any, moved: dict[str, Any] | None = None
) -> LightweightConfig | NoLightweightSettings:
    """The settings of `method` from `section`, plus the `moved` keys an older config gave under `data:`.

    Raises ValueError (one line) for a key of another method, a `lightweight.method` other than `method`, and
    any lightweight key when `method` has no lightweight model.
    """
    given, moved = given_keys(section), dict(moved or {})
    stated = given.pop("method", None)
    pre_split = stated is not None and is_pre_split(given)  # an earlier version's dump: other methods' keys unread
    if method not in METHODS:
        named = [f"lightweight.{key}" for key in given] + [f"data.{key}" for key in moved]
        if named and not pre_split:
            raise ValueError(
                f"{', '.join(named)}: method {method} has no lightweight model to set (lightweight "
                f"methods: {', '.join(METHODS)}); delete {'it' if len(named) == 1 else 'them'}"
            )
        return NoLightweightSettings()
    if stated not in (None, method) and not pre_split:
        raise ValueError(
            f"lightweight.method is {stated!r} but method is {method!r}: name the method once, in the "
            "top-level `method:`, and delete lightweight.method"
        )
    settings = METHODS[method].settings
    for key, value in moved.items():
        if key in given and given[key] != value:
            raise ValueError(
                f"data.{key}={value!r} and lightweight.{key}={given[key]!r} disagree: data.{key} is the "
                f"earlier name of lightweight.{key}; keep only that one"
            )
        if key in field_names(settings):
            given[key] = value
        elif not pre_split:
            raise ValueError(foreign_keys_message(method, [key], prefix="data."))
    foreign = [key for key in given if key not in field_names(settings)]
    if foreign and not pre_split:
        raise ValueError(foreign_keys_message(method, foreign, prefix="lightweight."))
    given = with_added_keys(settings, given)  # a run folder's config.yaml from before a key existed: its value then
    from davir.config import FieldError, from_dict

    try:  # each value checked against the method's own field types (Literal choices included)
        return from_dict(
            settings, {key: value for key, value in given.items() if key in field_names(settings)}, where="lightweight"
        )
    except FieldError as error:  # named from the config's top, as every other field's
        raise FieldError(f"lightweight.{error.key}", error.problem) from None
