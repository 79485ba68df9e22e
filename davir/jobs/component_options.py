"""The job options of registered preprocessing components (davir.preprocessing.components): each segmenter's or
retriever's own flags in its own argument group of `preprocess masks` / `preprocess entities`, and the typed
settings read back from the parsed options. An option of another component than the one in use is refused."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from davir.errors import DataError
from davir.io import path_record
from davir.preprocessing.components import ComponentRegistry


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_component_arguments(registry: ComponentRegistry, parser: argparse.ArgumentParser) -> None:
    """One argument group per component with its own flags (default None: "not given")."""
    for name in registry:
        entry = registry[name]
        if not entry.flags():
            continue
        group = parser.add_argument_group(f"{registry.kind} {name!r} (only with {registry.selector} {name})")
        for f, dest in entry.cli_fields():
            meta = f.metadata
            choices = meta["choices"]() if callable(meta["choices"]) else meta["choices"]
            kind = meta["type"] or (type(f.default) if f.default not in (None, dataclasses.MISSING) else str)
            kind = _bool if kind is bool else kind
            default = "" if f.default in (None, dataclasses.MISSING) else f" (default: {f.default})"
            group.add_argument(
                meta["flag"],
                dest=dest,
                type=kind,
                choices=choices,
                default=None,
                help=f"{meta['help']}{default}".strip(),
            )
        if entry.weights:
            group.add_argument(
                entry.weights.flag,
                dest=entry.weights.dest,
                default=None,
                help=f"local weights file ({entry.weights.what}); never downloaded",
            )


def check_component_options(registry: ComponentRegistry, name: str, args: argparse.Namespace) -> None:
    """A DataError when `args` gives an option of another component than `name`."""
    registry[name]
    for other in registry:
        if other == name:
            continue
        for flag, dest in registry[other].flags():
            if getattr(args, dest, None) is not None:
                raise DataError(
                    f"{flag} is an option of {registry.kind} {other!r}, but this run uses {registry.kind} "
                    f"{name!r} ({registry.selector} or the profile's): drop {flag}, or pass "
                    f"{registry.selector} {other}"
                )


def component_settings(registry: ComponentRegistry, name: str, args: argparse.Namespace) -> Any:
    """Typed settings of `name` from the parsed job options (its flags given, defaults otherwise)."""
    check_component_options(registry, name, args)
    entry = registry[name]
    values = {f.name: getattr(args, dest) for f, dest in entry.cli_fields() if getattr(args, dest, None) is not None}
    try:
        return entry.settings(**values)
    except (TypeError, ValueError) as error:
        raise DataError(f"{registry.kind} {name!r}: {error}") from error


def component_checkpoint(registry: ComponentRegistry, name: str, args: argparse.Namespace) -> str | None:
    """The weights file given for the component, as the job records it (`davir.io.path_record`)."""
    weights = registry[name].weights
    return None if weights is None else path_record(getattr(args, weights.dest, None))
