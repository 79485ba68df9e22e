"""The run's records as they go into an export: without the training machine's absolute paths.

A run records where things were on the machine it trained on (run_info.json's `cwd` and command line, the
config's paths as typed, metrics.json's checkpoint and sources). An export is meant to be handed on, so each
absolute path becomes relative to the training folder when it lies inside it (`/home/alice/work/runs/demo/best`
→ `runs/demo/best`, which is what the run itself resolves it against) and its last name otherwise
(`/home/alice/data/clevr` → `clevr`); `cwd` is dropped. Strings that merely contain a path (`--out=/x/y`) are
rewritten the same way.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

# An absolute POSIX path inside a string: a `/` not following a name, `:` (URLs) or another `/`, up to a space,
# a quote or a bracket.
_ABSOLUTE = re.compile(r"(?<![\w.~:/\\-])/[^\s\"'`,;()\[\]{}<>|=]+")
DROPPED_KEYS = ("cwd",)


def _bases(folders) -> list[PurePosixPath]:
    bases = []
    for folder in folders:
        if folder is None:
            continue
        for form in (os.path.normpath(str(folder)), os.path.realpath(str(folder))):
            if form != os.sep and PurePosixPath(form) not in bases:
                bases.append(PurePosixPath(form))
    return sorted(bases, key=lambda base: -len(base.parts))  # the deepest base first


def relative(path: str, bases: list[PurePosixPath]) -> str:
    """`path` (absolute) relative to the first base holding it, else its last name."""
    pure = PurePosixPath(os.path.normpath(path))
    for base in bases:
        if pure == base:
            return "."
        if base in pure.parents:
            return str(pure.relative_to(base))
    return pure.name or "."


def scrub_text(text: str, bases: list[PurePosixPath]) -> str:
    if text.startswith("/") and os.path.isabs(text) and "\n" not in text:
        return relative(text, bases)  # a whole path, spaces and all
    return _ABSOLUTE.sub(lambda found: relative(found.group(0), bases), text)


def scrub(value: Any, bases: list[PurePosixPath]) -> Any:
    """`value` (JSON/YAML data) with every absolute path made relative to `bases` (or its last name) and the
    keys of DROPPED_KEYS removed."""
    if isinstance(value, dict):
        return {key: scrub(item, bases) for key, item in value.items() if key not in DROPPED_KEYS}
    if isinstance(value, (list, tuple)):
        return [scrub(item, bases) for item in value]
    if isinstance(value, str):
        return scrub_text(value, bases)
    return value


def training_bases(run_info: dict, run_dir: Path | None) -> list[PurePosixPath]:
    """The folders a run's paths are made relative to: the training folder (`cwd`), else the run's parent."""
    cwd = run_info.get("cwd") if isinstance(run_info.get("cwd"), str) else None
    return _bases([cwd, run_dir.parent if run_dir is not None and cwd is None else None])
