"""Exceptions shared across the toolkit, and the output checks every command makes before its work
(a leaf module: it imports nothing from davir). The policy they serve is docs/errors.md."""

from __future__ import annotations

import errno
import importlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path


class DataError(ValueError):
    """Bad input: the message names the file and record and says what is wrong."""


# The optional packages, by the module each is imported as, and the extra of pyproject.toml that installs it.
EXTRAS = {"gradio": "app", "trl": "trl", "wandb": "trackers", "mlflow": "trackers", "trackio": "trackers"}


class MissingExtra(DataError, ModuleNotFoundError):
    """An optional package that is not installed; the message names the extra to install. A DataError for the
    commands (one line, status 2), a ModuleNotFoundError for code that imports davir's modules."""


class OutputError(DataError):
    """An output path the command cannot write: a file where a folder is needed (or the reverse), no permission."""


def _existing_ancestor(path: Path) -> Path:
    """`path` itself when it exists, else its nearest existing parent (a file there is reported by the caller)."""
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _can_write(folder: Path) -> bool:
    """Whether a file can be created in `folder`: a real probe, since os.access is wrong for root and ACLs."""
    try:
        handle, name = tempfile.mkstemp(prefix=".davir-write-probe-", dir=folder)
    except OSError:
        return False
    os.close(handle)
    os.unlink(name)
    return True


def _folder_problem(folder: Path) -> str | None:
    """Why `folder` cannot become a writable folder, or None; nothing is created."""
    if folder.exists() and not folder.is_dir():
        return f"{folder} is a file, not a folder"
    ancestor = _existing_ancestor(folder)
    if not ancestor.is_dir():
        return f"{ancestor} is a file, not a folder"
    if not _can_write(ancestor):
        return f"permission denied in {ancestor}"
    return None


def check_output_dir(path: str | Path, *, what: str = "output folder") -> Path:
    """Stop before any work when `path` cannot become a writable folder; nothing is created here."""
    path = Path(path)
    problem = _folder_problem(path)
    if problem is not None:
        verb = "is not writable" if problem.startswith("permission") else "cannot be used"
        raise OutputError(f"{what} {path} {verb}: {problem}")
    return path


def check_output_file(path: str | Path, *, what: str = "output file", example: str = "metrics.json") -> Path:
    """Stop before any work when a file cannot be (atomically re)written at `path`."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a folder; give a file path (e.g. {path / example})")
    problem = _folder_problem(path.parent)
    if problem is not None:
        verb = "is not writable" if problem.startswith("permission") else "cannot be written"
        raise OutputError(f"{what} {path} {verb}: {problem}")
    return path


def refuse_outputs_over_inputs(
    outputs: Mapping[str, str | Path | None], inputs: Mapping[str, str | Path | None], *, hint: str = ""
) -> None:
    """Stop before any work when an output would be written over a file the command reads: `outputs` maps a flag
    (`--out`) to the path it writes, `inputs` a description (`the --predictions file`, `the manifest being imported`)
    to the path read; None entries are left out. The paths are compared resolved, so the same file given relative,
    absolute or through a symlink is caught. One message for every command:
    `--out X is the --predictions file (Y), which it would replace; give another --out[, HINT]` (`(Y)` only when
    its text differs from X's)."""
    for flag, path in outputs.items():
        if path is None:
            continue
        path = Path(path)
        resolved = path.expanduser().resolve()
        for what, read in inputs.items():
            if read is None or Path(read).expanduser().resolve() != resolved:
                continue
            named = "" if Path(read) == path else f" ({read})"
            raise DataError(
                f"{flag} {path} is {what}{named}, which it would replace; give another {flag}"
                + (f", {hint}" if hint else "")
            )


def settings_differences(before, now, where: str = "") -> str:
    """`key: before -> now` for each recorded setting that differs, nested keys dotted (segmenter.sam_type: …): what a
    refusal to mix caches names."""
    if not isinstance(before, dict) or not isinstance(now, dict):
        return f"{where or 'settings'}: {before!r} -> {now!r}"
    return "; ".join(
        settings_differences(before.get(key), now.get(key), f"{where}.{key}" if where else str(key))
        for key in sorted(set(before) | set(now))
        if before.get(key) != now.get(key)
    )


def describe_os_error(error: OSError) -> str:
    """One line for an OSError a user can cause (permissions, a full disk, a file where a folder should be)."""
    # no errno (a library's OSError("encoder error -2")): its own message; str() would give "[Errno None] None:
    # 'FILE'" once a writer has named the file
    reason = (
        os.strerror(error.errno)
        if error.errno
        else error.strerror or " ".join(str(a) for a in error.args if a is not None) or str(error)
    )
    where = " -> ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    hint = {
        errno.EACCES: "check the folder's permissions",
        errno.EPERM: "check the folder's permissions",
        errno.EROFS: "the file system is read-only",
        errno.ENOSPC: "free some disk space",
        errno.ENOTDIR: "a path component is a file, not a folder",
        errno.EISDIR: "a folder is in the way of a file",
    }.get(error.errno)
    return (f"{where}: {reason.lower()}" if where else reason.lower()) + (f" ({hint})" if hint else "")


def install_hint(*modules: str) -> str:
    """What to pip install for `modules`: the extras of davir that bring them (a module of no extra by its name)."""
    extras = sorted({EXTRAS[name] for name in modules if name in EXTRAS})
    others = [name for name in modules if name not in EXTRAS]
    targets = ([f"'davir[{','.join(extras)}]'"] if extras else []) + others
    return "pip install " + " ".join(targets)


def import_optional(module: str, *, needed_by: str):
    """`module` imported, or a MissingExtra: "<needed_by> needs <module>: pip install 'davir[<extra>]'"."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        package, missing = module.split(".")[0], error.name or module
        what = (
            f"{needed_by} needs {package}"
            if missing.split(".")[0] == package
            else f"{needed_by} needs {package}, which cannot import {missing}"
        )  # a dependency of it is missing
        missing_extra = MissingExtra(f"{what}: {install_hint(package)}")
        missing_extra.name = package
        raise missing_extra from error
