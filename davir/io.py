"""Atomic file writes and strict JSON reading, used by every job that writes or reads files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from davir.errors import DataError


def temporary_path(path: Path, suffix: str = ".tmp") -> Path:
    """A temporary name beside `path`: `.NAME.<pid>.<random>.tmp`, so two processes or threads writing one
    output never share a temporary (the random part: threads share the pid). Cleanup globs `.NAME.*.tmp`."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}")


def remove_temporaries(folder: Path) -> int:
    """Remove the `.NAME.<pid>.<random>.tmp` files a killed writer left in `folder` (call it only while no other
    process writes there: under the output's lock, before any shard starts); returns how many went."""
    stale = list(Path(folder).glob(".*.tmp")) if Path(folder).is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def name_os_error(error: OSError, path: Path) -> OSError:
    """`error` naming `path` when it names no file (a failed write() of a full disk names none)."""
    if error.filename is None:
        error.filename = str(path)
    return error


def current_umask() -> int:
    """The process's umask (read from /proc where it can be: setting it to read it is not thread-safe)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give `path` (a file, or every file under a folder) the mode a plain `open` gives, where it has 0600.

    safetensors (0.8) writes through a temporary file created 0600, so weights saved by it, by
    `save_pretrained` or by `accelerator.save_state` could be read by their owner only, whatever the umask:
    a model made to be shared would not be readable by the other users of a machine."""
    path = Path(path)
    mode = 0o666 & ~current_umask()
    for file in [path] if path.is_file() else path.rglob("*") if path.is_dir() else []:
        if not file.is_symlink() and file.is_file() and file.stat().st_mode & 0o777 == 0o600 and mode != 0o600:
            os.chmod(file, mode)


@contextlib.contextmanager
def atomic_path(path: Path, *, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path to write `path` through; renamed onto `path` when the block succeeds, removed when
    anything fails (a full disk, a kill the command survives), so `path` is whole or as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path, suffix)
    try:
        yield tmp
        follow_umask(tmp)  # a safetensors write made it 0600
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(error, OSError):
            name_os_error(error, path)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a temporary file in the same folder and an atomic rename."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def write_json_atomic(path: Path, obj: Any, *, indent: int | None = 2) -> None:
    write_text_atomic(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def append_whole(path: Path, data: bytes) -> None:
    """Append `data` (whole lines) and fsync; on any failure (a full disk) cut the file back to its old end, so
    a failed append leaves none of `data` — a kill may still leave a cut last line, which readers repair."""
    if not data:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        end = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:  # write() may take part of the data when the disk fills; the next call then fails
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException as error:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)
            if isinstance(error, OSError):
                name_os_error(error, path)
            raise
    finally:
        os.close(fd)


def append_jsonl(path: Path, row: Any) -> None:
    """Append one JSON line and flush it to disk (a log that survives a kill up to its last line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    append_whole(path, (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))


def read_json(path: Path) -> Any:
    """Read JSON with a clear error naming the file (missing or malformed) instead of a traceback."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"annotation file is missing: {path}")
    try:
        with open(path, encoding="utf-8-sig") as handle:  # -sig: a Windows editor's byte order mark is no text
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}: malformed JSON at line {error.lineno} column {error.colno}: {error.msg}") from error
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error})") from error


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSON Lines file, streamed; a malformed line or non-UTF-8
    text is a DataError naming the file and the line. The caller checks that the file exists."""
    path = Path(path)
    with open(path, encoding="utf-8-sig") as handle:  # as read_json
        number = 0
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(f"{path}: malformed JSON on line {number}: {error.msg}") from error
                yield number, value
        except UnicodeDecodeError as error:
            raise DataError(f"{path}: not UTF-8 text after line {number} ({error})") from error


def read_jsonl(path: Path) -> list[Any]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"file is missing: {path}")
    return [value for _, value in iter_jsonl(path)]


def path_record(value: str | Path | None) -> str | None:
    """How a job records a file or folder it was given: absolute, links resolved. The same place given relative,
    absolute or through a symlink, from any folder, records the same text, so a rerun compares equal. A relative
    text recorded by an older version resolves against the current folder (where such a rerun usually starts)."""
    return None if value is None else str(Path(value).expanduser().resolve())


def same_place(old: Any, new: Any, old_base: str | Path | None = None) -> bool:
    """Whether two texts of a path setting name the same existing file or folder: `old` relative to `old_base`
    (the folder the run or job that recorded it started in; None: this folder), `new` relative to this folder;
    links resolved. So a rerun from another folder, or with a path given absolutely or through a symlink, is the
    same setting; texts that are not paths (or name nothing that exists) are never the same place."""
    if not (isinstance(old, str) and isinstance(new, str) and old and new):
        return False
    old_path, new_path = Path(old).expanduser(), Path(new).expanduser()
    if not old_path.is_absolute() and old_base is not None:
        old_path = Path(old_base) / old_path
    return old_path.exists() and new_path.exists() and old_path.resolve() == new_path.resolve()


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """The sha256 hex digest of a file, read in chunks (weights of several GB included)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()
