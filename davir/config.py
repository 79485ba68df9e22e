"""Typed configs: dataclasses loaded from YAML, with `key.sub=value` overrides from the command line.

    config = load_config(TrainConfig, "configs/demo.yaml", ["optim.lr=1e-4", "model.fac.lambda_attn=0.5"])

Unknown keys and values of the wrong type are errors naming the key and the file, never ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override that does not fit the typed config."""


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, where)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(f"{where}: {value!r} fits none of {annotation}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for {annotation.__name__}, got {value!r}")
        return from_dict(annotation, value, where=where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item_type = args[0] if args else Any
        items = [_coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads "1e-4" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if annotation is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def from_dict(cls: type[T], data: dict, *, where: str = "config") -> T:
    """Build dataclass `cls` from a (nested) mapping, rejecting unknown keys."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(names)}")
    kwargs = {key: _coerce(value, hints[key], f"{where}.{key}") for key, value in data.items()}
    return cls(**kwargs)


def to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


def apply_overrides(data: dict, overrides: list[str], *, where: str = "command line") -> dict:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a nested mapping, returning a copy."""
    import copy

    data = copy.deepcopy(data)
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"{where}: override {override!r} is not of the form key.sub=value")
        key, raw = override.split("=", 1)
        value = yaml.safe_load(raw) if raw != "" else ""
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{where}: {key!r} goes through a value that is not a mapping")
        node[parts[-1]] = value
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Defaults of `cls`, updated by the YAML file at `path`, updated by the overrides."""
    data: dict = {}
    where = "defaults"
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: malformed YAML: {error}") from error
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data, where = loaded, str(path)
    data = apply_overrides(data, overrides or [])
    return from_dict(cls, data, where=where)


def save_config(config: Any, path: str | Path) -> None:
    from davir.io import write_text_atomic

    write_text_atomic(Path(path), yaml.safe_dump(to_dict(config), sort_keys=False))
