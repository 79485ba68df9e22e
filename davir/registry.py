"""The one registry idiom of the toolkit: name → entry, registered where the entry is defined.

    FAMILIES = Registry("model family", error=ValueError, lazy={"qwen2_5_vl": "davir.models.families.qwen2_5_vl"})
    FAMILIES.register("toy", ToyFamily())            # a call …
    @METHODS.register("scorer")                      # … or a decorator
    class ScorerCaptioner: ...
    FAMILIES["qwen2_5_vl"]                           # imports its module on first use (lazy entries)

A lazy entry names the module that registers it, so listing the names imports nothing heavy.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from davir.errors import DataError

T = TypeVar("T")
_UNSET: Any = object()


class Registry(Generic[T]):
    """Named entries of one kind; unknown names raise `error` listing the choices."""

    def __init__(self, kind: str, *, error: type[Exception] = DataError, lazy: Mapping[str, str] | None = None):
        self.kind, self.error = kind, error
        self._entries: dict[str, T] = {}
        self._lazy: dict[str, str] = dict(lazy or {})

    # -- registering ---------------------------------------------------------------------------------
    def register(self, name: str, entry: T = _UNSET, *, replace: bool = False) -> Any:
        """Register `entry` under `name`, or, without `entry`, return a decorator that registers what it decorates.

        Registering a second, different entry under a taken name is an error unless `replace=True` (tests and a
        user's module overriding a built-in); registering the same object again is a no-op (module reloads)."""
        if entry is _UNSET:

            def decorate(obj: T) -> T:
                self.register(name, obj, replace=replace)
                return obj

            return decorate
        known = self._entries.get(name, _UNSET)
        if known is not _UNSET and known is not entry and not replace:
            raise ValueError(f"{self.kind} {name!r} is registered twice ({_label(known)}, {_label(entry)})")
        self._entries[name] = entry
        return entry

    def register_lazy(self, name: str, module: str) -> None:
        """`name` is registered by importing `module` (imported the first time the entry is asked for)."""
        self._lazy[name] = module

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)
        self._lazy.pop(name, None)

    # dict-style replacement and removal, so a test's `monkeypatch.setitem(REGISTRY, name, entry)` undoes itself
    def __setitem__(self, name: str, entry: T) -> None:
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        self.unregister(name)

    # -- reading -------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> T:
        if name not in self._entries and name in self._lazy:
            importlib.import_module(self._lazy[name])
        if name not in self._entries:
            if name in self._lazy:
                raise ImportError(f"{self._lazy[name]} did not register {self.kind} {name!r}")
            raise self.error(f"unknown {self.kind} {name!r}; choose from {', '.join(self.names()) or '(none)'}")
        return self._entries[name]

    def get(self, name: str, default: Any = None) -> T | Any:
        return self[name] if name in self else default

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy

    def names(self) -> tuple[str, ...]:
        """Every name, in registration order (lazy names first, as declared), importing nothing."""
        return tuple(dict.fromkeys([*self._lazy, *self._entries]))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) of every entry, importing the lazy ones."""
        return [(name, self[name]) for name in self.names()]

    def check(self, name: str, *, key: str | None = None) -> str:
        """`name` if registered, else `error` naming `key` (a config key or flag) and the choices."""
        if name not in self:
            where = f"{key}={name!r}" if key else f"{self.kind} {name!r}"
            raise self.error(f"{where} is not a registered {self.kind}; choose from {', '.join(self.names())}")
        return name

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self.names())})"


def _label(entry: Any) -> str:
    return getattr(entry, "__qualname__", None) or type(entry).__qualname__


def import_modules(modules: list[str] | tuple[str, ...], *, key: str) -> None:
    """Import a user's own modules that register entries (a config's `imports:`), each named on failure."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise DataError(f"{key}: cannot import {module!r} ({error}); is it on PYTHONPATH?") from error
