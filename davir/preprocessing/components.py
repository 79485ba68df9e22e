"""Registries of preprocessing components (segmenters, retrievers): name → builder of its own typed settings.

    SEGMENTERS.register("toy", ToySettings, ToySegmenter)              # one line beside the class
    segmenter = build_segmenter("toy", ToySettings(toy_grow=2))        # typed settings + local weights/device
    segmenter = SEGMENTERS.rebuild(name, recorded, where="mask cache C")  # what a cache recorded, rebuilt

What a component declares (settings, `option`, `compared`, weights): docs/preprocessing.md, "Component settings".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from davir.errors import DataError
from davir.io import path_record
from davir.registry import Registry

T = TypeVar("T")
DEVICE_KEY = "device"  # recorded by components that run on a device; never compared, never restored


def option(
    flag: str,
    help: str = "",
    *,
    choices: tuple | Callable[[], Any] | None = None,
    compared: bool = True,
    type: Callable | None = None,
) -> dict:
    """Field metadata of a settings dataclass: the job CLI flag that sets this field.

    `choices` may be a callable, evaluated when the parser is built (registries filled late, e.g. SAM types).
    """
    return {"flag": flag, "help": help, "choices": choices, "compared": compared, "type": type}


@dataclass(frozen=True)
class Weights:
    """The local weights file a component needs: recorded under `key` in its settings, given with `flag`."""

    key: str
    flag: str
    what: str = "the same weights file"

    @property
    def dest(self) -> str:
        return _dest(self.flag)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Component(Generic[T]):
    """One registered component: its settings type, its builder, its weights, and what else it declares."""

    kind: str
    name: str
    settings: type
    build: Callable[..., T]
    weights: Weights | None = None
    declared: dict = field(default_factory=dict)

    def cli_fields(self) -> list[tuple[dataclasses.Field, str]]:
        """(field, option dest) of the fields the jobs expose as flags."""
        return [(f, _dest(f.metadata["flag"])) for f in dataclasses.fields(self.settings) if "flag" in f.metadata]

    def flags(self) -> list[tuple[str, str]]:
        """(flag, dest) of every CLI option of this component, its weights flag included."""
        found = [(f.metadata["flag"], dest) for f, dest in self.cli_fields()]
        return found + ([(self.weights.flag, self.weights.dest)] if self.weights else [])

    def uncompared_keys(self) -> tuple[str, ...]:
        """Recorded keys that change speed or placement, not results (left out when a rerun is compared)."""
        keys = [f.name for f in dataclasses.fields(self.settings) if not f.metadata.get("compared", True)]
        return (DEVICE_KEY, *keys)

    def compared(self, settings: Any) -> dict:
        """The fields of `settings` that a cache is compared on, as a dict in field order."""
        skip = set(self.uncompared_keys())
        return {k: v for k, v in dataclasses.asdict(settings).items() if k not in skip}

    def as_recorded_today(self, recorded: dict) -> dict:
        """`recorded` as this version records it: the settings a record of an older version lacks, as that version
        ran them (the component's `older_records`, declared when registered: a setting added later whose default
        changed what the component does), and the weights path absolute (`davir.io.path_record`; an older version
        recorded it as given, and a relative one resolves against the current folder)."""
        today = {**self.declared.get("older_records", {}), **recorded}
        if self.weights is not None and today.get(self.weights.key) is not None:
            today[self.weights.key] = path_record(today[self.weights.key])
        return today

    def settings_from_record(self, recorded: dict) -> Any:
        """Typed settings from a recorded dict: the fields it holds (not null), defaults for the others."""
        recorded = self.as_recorded_today(recorded)
        values = {
            f.name: recorded[f.name]
            for f in dataclasses.fields(self.settings)
            if f.name != DEVICE_KEY and recorded.get(f.name) is not None
        }
        try:
            return self.settings(**values)
        except (TypeError, ValueError) as error:
            raise DataError(
                f"{self.kind} {self.name!r}: the recorded settings {recorded} do not fit: {error}"
            ) from error


class ComponentRegistry(Registry[Component[T]]):
    """name → Component for one kind ("segmenter", "retriever"), chosen on the CLI with `selector`."""

    def __init__(self, kind: str, selector: str):
        super().__init__(kind)
        self.selector = selector

    def register(
        self, name: str, settings: type, build: Callable[..., T], *, weights: Weights | None = None, **declared
    ) -> Component[T]:
        """Add a component (or replace one of that name). Its flags must not be another component's."""
        if not dataclasses.is_dataclass(settings):
            raise TypeError(f"{self.kind} {name!r}: settings must be a dataclass, got {settings!r}")
        entry = Component(self.kind, name, settings, build, weights, declared)
        taken = {flag: other.name for _, other in self.items() if other.name != name for flag, _ in other.flags()}
        clashes = [flag for flag, _ in entry.flags() if flag in taken]
        if clashes:
            raise ValueError(f"{self.kind} {name!r}: flag(s) {clashes} already belong to {taken[clashes[0]]!r}")
        return super().register(name, entry, replace=True)

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(super().names()))

    def build(
        self,
        name: str,
        settings: Any = None,
        *,
        checkpoint: str | Path | None = None,
        device: str | None = None,
        **fields_and_context,
    ) -> T:
        """The component `name` from its typed settings (default: the dataclass defaults; keyword fields
        of the settings may be given instead, e.g. `build("sam", sam_type="vit_b", checkpoint=…)`)."""
        entry = self[name]
        names = {f.name for f in dataclasses.fields(entry.settings)}
        given = {k: fields_and_context.pop(k) for k in list(fields_and_context) if k in names}
        if settings is None:
            settings = entry.settings(**given)
        elif given:
            settings = dataclasses.replace(settings, **given)
        return entry.build(settings, checkpoint=checkpoint, device=device, **fields_and_context)

    # -- rebuilding what a cache recorded ----------------------------------------------------------
    def rebuild(
        self,
        name: str,
        recorded: dict,
        *,
        where: str,
        checkpoint: str | Path | None = None,
        override_flag: str | None = None,
        device: str | None = None,
        **context,
    ) -> T:
        """The component a cache recorded (`recorded`: its settings), with a local weights file from the record
        unless `checkpoint` replaces it (a run moved to another machine); a missing file is a DataError naming
        `where`, the path and the flag that gives `checkpoint` (`override_flag`, default the job's flag)."""
        if name not in self:
            raise DataError(
                f"{where}: unknown {self.kind} {name!r} in its manifest; registered: "
                f"{', '.join(self)} (register it before building from this cache)"
            )
        entry = self[name]
        path = None
        if entry.weights:
            path = Path(checkpoint or recorded.get(entry.weights.key) or "")
            if not path.is_file():
                raise DataError(
                    f"{where} was made with {self.kind} {name!r} from {recorded.get(entry.weights.key)}, "
                    f"which is not found: pass {override_flag or entry.weights.flag} PATH "
                    f"({entry.weights.what})"
                )
        return entry.build(entry.settings_from_record(recorded), checkpoint=path, device=device, **context)
