"""Typed configs: dataclasses loaded from YAML, with `key.sub=value` overrides from the command line.

    config = load_config(TrainConfig, "configs/demo.yaml", ["optim.lr=1e-4", "model.fac.lambda_attn=0.5"])

Unknown keys and values of the wrong type are errors naming the key and the file, never ignored.

Values are read by the field's declared type, in YAML files and overrides alike: a plain (unquoted)
scalar keeps its text for a `str` or `Literal` field, so `run.mixed_precision=no` (Accelerate's word)
stays "no" instead of YAML 1.1's False, and `yes/no/on/off/true/false` are booleans only where the
field is a `bool`. Range checks (`require`, called from a dataclass's `__post_init__`) are errors
naming the key from the config's root: "optim.batch_size: must be ≥ 1, got 0".
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override that does not fit the typed config."""


class FieldError(ConfigError):
    """A value out of its field's range; `key` grows into the path from the config root as it propagates."""

    def __init__(self, key: str, problem: str):
        self.key, self.problem = key, problem
        super().__init__(f"{key}: {problem}")


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def require(
    name: str,
    value: float | None,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
) -> None:
    """Raise FieldError(name, ...) unless `value` lies in the range (None = the field is unset, allowed)."""
    if value is None:
        return
    low = (
        (f"≥ {_number(at_least)}", value >= at_least)
        if at_least is not None
        else (f"> {_number(above)}", value > above)
        if above is not None
        else None
    )
    high = (
        (f"≤ {_number(at_most)}", value <= at_most)
        if at_most is not None
        else (f"< {_number(below)}", value < below)
        if below is not None
        else None
    )
    if (low and not low[1]) or (high and not high[1]):
        if low and high:
            left = "[" if at_least is not None else "("
            right = "]" if at_most is not None else ")"
            lo, hi = (at_least if at_least is not None else above), (at_most if at_most is not None else below)
            rule = f"in {left}{_number(lo)}, {_number(hi)}{right}"
        else:
            rule = (low or high)[0]
        raise FieldError(name, f"must be {rule}, got {_number(value)}")


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A plain YAML scalar with its text kept, so the field's type decides what it means."""

    text: str
    value: Any


class _TextKeepingLoader(yaml.SafeLoader):
    """SafeLoader whose plain scalars come back as `Scalar(text, value)`."""


def _keep_text(constructor):
    def construct(loader, node):
        value = constructor(loader, node)
        return Scalar(node.value, value) if isinstance(node, yaml.ScalarNode) and node.style is None else value

    return construct


for _tag in ("null", "bool", "int", "float", "str", "timestamp"):
    _full = f"tag:yaml.org,2002:{_tag}"
    _TextKeepingLoader.add_constructor(_full, _keep_text(yaml.SafeLoader.yaml_constructors[_full]))


def plain(value: Any) -> Any:
    """`value` with every Scalar replaced by what YAML made of it (mapping keys included)."""
    if isinstance(value, Scalar):
        return value.value
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def load_yaml_text(text: str) -> Any:
    """Parse YAML keeping the text of plain scalars (mapping keys become plain values)."""
    loaded = yaml.load(text, Loader=_TextKeepingLoader)
    return _plain_keys(loaded)


def _plain_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {plain(k): _plain_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_keys(v) for v in value]
    return value


def _is_text_field(annotation: Any) -> bool:
    if annotation is str:
        return True
    return typing.get_origin(annotation) is typing.Literal and all(
        isinstance(a, str) for a in typing.get_args(annotation)
    )


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    shown = value.text if isinstance(value, Scalar) else value  # what the user wrote, for messages
    if isinstance(value, Scalar) and origin not in (typing.Union, types.UnionType):
        value = value.text if _is_text_field(annotation) else value.value
    if annotation is Any:
        return plain(value)
    if origin in (typing.Union, types.UnionType):
        if plain(value) is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, where)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(f"{where}: {shown!r} fits none of {annotation}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {shown!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for {annotation.__name__}, got {shown!r}")
        return from_dict(annotation, value, where=where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {shown!r}")
        item_type = args[0] if args else Any
        items = [_coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {shown!r}")
        return plain(dict(value))
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {shown!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads "1e-4" as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {shown!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {shown!r}")
    if annotation is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{where}: expected a string, got {shown!r}")
    return plain(value)


def _require_finite(key: str, value: Any) -> None:
    """inf, -inf and nan pass every range check written as a comparison (or none is written): refuse them here."""
    items = enumerate(value) if isinstance(value, (list, tuple)) else [(None, value)]
    for index, item in items:
        if isinstance(item, float) and not math.isfinite(item):
            raise FieldError(key if index is None else f"{key}[{index}]", f"must be a finite number, got {item}")


def from_dict(cls: type[T], data: dict, *, where: str = "config") -> T:
    """Build dataclass `cls` from a (nested) mapping, rejecting unknown keys."""
    prepare = getattr(cls, "prepare", None)  # a config class's step before its fields (TrainConfig: `imports:`)
    if prepare is not None:
        prepare(data, where=where)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(names)}")
    kwargs = {}
    for key, value in data.items():
        try:
            kwargs[key] = _coerce(value, hints[key], f"{where}.{key}")
        except FieldError as error:  # from a nested dataclass: prefix its path
            raise FieldError(f"{key}.{error.key}", error.problem) from None
        _require_finite(key, kwargs[key])
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as error:  # a __post_init__ check of a config class
        raise ConfigError(f"{where}: {error}") from None


def to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


def apply_overrides(data: dict, overrides: list[str], *, where: str = "command line") -> dict:
    """Apply `a.b.c=value` overrides to a nested mapping, returning a copy.

    The value is parsed as YAML with the text of plain scalars kept (`load_yaml_text`): the field's
    type decides, when the config is built, whether "no" is a word or a boolean.
    """
    import copy

    data = copy.deepcopy(data)
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"{where}: override {override!r} is not of the form key.sub=value")
        key, raw = override.split("=", 1)
        try:
            value = load_yaml_text(raw) if raw != "" else ""
        except yaml.YAMLError as error:
            raise ConfigError(f"{where}: override {override!r}: malformed value ({error})") from None
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
            loaded = load_yaml_text(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: malformed YAML: {error}") from error
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data, where = loaded, str(path)
    # A config class may resolve variants its YAML holds before the command line applies (TrainConfig: the
    # `model.for_family` table), so that keys given on the command line still win.
    resolve = getattr(cls, "resolve_variants", None)
    if resolve is not None:
        prepare = getattr(cls, "prepare", None)  # (the variants may name what `prepare` registers)
        if prepare is not None:
            prepare(apply_overrides(data, overrides or []), where=where)
        data = resolve(data, apply_overrides(data, overrides or []), where=where)
    data = apply_overrides(data, overrides or [])
    return from_dict(cls, data, where=where)


def save_config(config: Any, path: str | Path) -> None:
    from davir.io import write_text_atomic

    write_text_atomic(Path(path), yaml.safe_dump(to_dict(config), sort_keys=False))


def replace_fields(cls: type[T], options: T | None, overrides: dict[str, Any], *, what: str) -> T:
    """`options` (or `cls()`'s defaults) with `overrides` replaced: the `**overrides` of a typed entry point
    (`ChangeCaptioner.from_pretrained(path, num_beams=3)`); an unknown name is a TypeError listing the valid ones."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [name for name in overrides if name not in names]
    if unknown:
        raise TypeError(f"unknown {what} option(s) {', '.join(map(repr, unknown))}; valid: {', '.join(names)}")
    return dataclasses.replace(options or cls(), **overrides)
