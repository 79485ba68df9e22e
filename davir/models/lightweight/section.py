"""The `lightweight:` section of a train config: flat keys, resolved against the config's one `method:`.

A YAML names the method once, at the top (`method: scorer`), and lists under `lightweight:` only the keys it
changes: common ones (LightweightConfig) and the method's own (ScorerSettings, …), so an override stays
`lightweight.cv_weight=0.3`. `LightweightSection` takes every registered method's keys with their declared
types, so davir.config checks each value (Literal choices included); `resolve_lightweight` then builds the
method's settings. A key of another method is an error naming the method it belongs to and what the
configured method takes.

Configs written before the per-method settings (the config.yaml of every earlier run folder) hold every
method's keys, `lightweight.method`, and RDD/CHEER's text-tower keys under `data:`. They still load: the
other methods' keys are dropped, as that code never read them, and the `data:` keys move here.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass, make_dataclass
from typing import Any

from davir.models.lightweight.config import LightweightConfig, field_names, foreign_keys_message, is_pre_split
from davir.models.lightweight.registry import METHODS

# RDD/CHEER settings that earlier configs wrote under `data:` (DataConfig still reads them, TrainConfig moves them).
MOVED_DATA_KEYS = ("text_encoder", "text_encoder_model", "text_encoder_config", "acr_prompts")


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET = _Unset()  # a key the YAML does not give


@dataclass
class NoLightweightSettings:
    """`TrainConfig.lightweight` of a method without a lightweight model (davir): no keys; saved as `{}`."""


def _section_class() -> type:
    columns: dict[str, Any] = {"method": str}  # written by earlier versions; only accepted, see resolve_lightweight
    for spec in METHODS.values():
        hints = typing.get_type_hints(spec.settings)
        for f in fields(spec.settings):
            if columns.setdefault(f.name, hints[f.name]) != hints[f.name]:
                raise TypeError(f"lightweight key {f.name} has two types: {columns[f.name]} and {hints[f.name]}")
    return make_dataclass("LightweightSection", [(name, kind, field(default=UNSET)) for name, kind in columns.items()],
                          namespace={"__doc__": "Every lightweight method's keys as a YAML gives them (unset: not given)."})


LightweightSection = _section_class()  # importing config ran the package's __init__: every method is registered


def given_keys(section: Any) -> dict[str, Any]:
    """The keys a section (or a settings object, or a plain dict) states."""
    if section is None or isinstance(section, NoLightweightSettings):
        return {}
    if isinstance(section, LightweightConfig):
        return {"method": section.method, **asdict(section)}
    if isinstance(section, LightweightSection):
        return {f.name: getattr(section, f.name) for f in fields(section) if getattr(section, f.name) is not UNSET}
    if isinstance(section, dict) and not is_dataclass(section):
        return dict(section)
    raise TypeError(f"lightweight must be a mapping of settings, got {type(section).__name__}")


def resolve_lightweight(method: str, section: Any, moved: dict[str, Any] | None = None
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
            raise ValueError(f"{', '.join(named)}: method {method} has no lightweight model to set (lightweight "
                             f"methods: {', '.join(METHODS)}); delete {'it' if len(named) == 1 else 'them'}")
        return NoLightweightSettings()
    if stated not in (None, method) and not pre_split:
        raise ValueError(f"lightweight.method is {stated!r} but method is {method!r}: name the method once, in the "
                         "top-level `method:`, and delete lightweight.method")
    settings = METHODS[method].settings
    for key, value in moved.items():
        if key in given and given[key] != value:
            raise ValueError(f"data.{key}={value!r} and lightweight.{key}={given[key]!r} disagree: data.{key} is the "
                             f"earlier name of lightweight.{key}; keep only that one")
        if key in field_names(settings):
            given[key] = value
        elif not pre_split:
            raise ValueError(foreign_keys_message(method, [key], prefix="data."))
    foreign = [key for key in given if key not in field_names(settings)]
    if foreign and not pre_split:
        raise ValueError(foreign_keys_message(method, foreign, prefix="lightweight."))
    try:
        return settings(**{key: value for key, value in given.items() if key in field_names(settings)})
    except ValueError as error:  # a check of the settings (e.g. hidden % heads)
        raise ValueError(f"lightweight: {error}") from None
