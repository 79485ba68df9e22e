"""The grid-feature cache written by `python -m preprocess features` and read by the lightweight methods.

    FeatureCache("cache/features").get(image_path)      # the stored (1024, 14, 14) tensor, by path or key

The chunk and index layout: docs/preprocessing.md, "Cache layouts".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from davir.errors import DataError
from davir.io import atomic_path, read_json, write_json_atomic

FEATURE_SHAPE = (1024, 14, 14)
FEATURE_TENSOR = "features"
KEYS_METADATA = "keys"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"  # written once a run into the cache has finished: the folder is a feature cache
UNFINISHED_MANIFEST = "manifest.incomplete.json"  # the settings of a first run that has not finished (yet)


def not_a_cache(root: str | Path, *, what: str, command: str) -> DataError | None:
    """Why `root` cannot be read as a feature cache (None when it can): no folder or no manifest.json, or a
    first extraction that stopped (a bad image, a kill) and left only manifest.incomplete.json. `what` names
    the cache in the message (`data.features=CACHE`); `command` is the extraction to run."""
    root = Path(root)
    if (root / MANIFEST).is_file():
        return None
    if (root / UNFINISHED_MANIFEST).is_file():
        return DataError(
            f"{what}: its feature extraction has not finished ({root / UNFINISHED_MANIFEST}: the run stopped before "
            f"every image was stored); rerun `{command}` to resume it"
        )
    return DataError(f"{what} is not a feature cache (no {MANIFEST}); run `{command}` first")


def image_key(path: str | Path, dataset_root: str | Path) -> str:
    """Cache key of an image: its path relative to the dataset root (POSIX), else its real absolute path.

    Relative paths count from the current folder, like the reader's paths when `--root` is relative.
    Lexical first (no file-system calls: a split lists ~10^5 paths), symlinks resolved only if needed.
    """
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(dataset_root))
    if relative.startswith(os.pardir):
        real = os.path.realpath(path)
        relative = os.path.relpath(real, os.path.realpath(dataset_root))
        if relative.startswith(os.pardir):
            return Path(real).as_posix()
    return Path(relative).as_posix()


def _read_chunk_keys(path: Path) -> list[str]:
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if KEYS_METADATA not in metadata:
        raise DataError(f"feature chunk {path} has no {KEYS_METADATA!r} metadata; not written by preprocess features")
    return json.loads(metadata[KEYS_METADATA])


def scan_index(cache: Path) -> dict[str, tuple[str, int]]:
    """key → (chunk file name, row) for every complete chunk in `cache` (index.json + unlisted chunks)."""
    folder = cache / "features"
    on_disk = sorted(p.name for p in folder.glob("*.safetensors")) if folder.is_dir() else []
    entries: dict[str, tuple[str, int]] = {}
    listed: set[str] = set()
    index_path = cache / "index.json"
    if index_path.is_file():
        index = read_json(index_path)
        listed = set(index.get("chunks", [])) & set(on_disk)
        entries = {k: (v[0], int(v[1])) for k, v in index.get("entries", {}).items() if v[0] in listed}
    for name in on_disk:
        if name not in listed:
            for row, key in enumerate(_read_chunk_keys(folder / name)):
                entries[key] = (name, row)
    return entries


def write_index(cache: Path) -> dict[str, tuple[str, int]]:
    entries = scan_index(cache)
    chunks = sorted({name for name, _ in entries.values()})
    write_json_atomic(
        cache / "index.json", {"chunks": chunks, "entries": {k: list(v) for k, v in entries.items()}}, indent=None
    )
    return entries


def next_chunk_number(cache: Path, prefix: str) -> int:
    numbers = [int(p.stem.rsplit("-", 1)[1]) for p in (cache / "features").glob(f"{prefix}-*.safetensors")]
    return max(numbers, default=-1) + 1


def write_chunk(path: Path, features: torch.Tensor, keys: list[str]) -> None:
    """One fp16 chunk file, written to a temporary name and renamed (never half a file under `path`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file({FEATURE_TENSOR: features.contiguous()}, str(tmp), metadata={KEYS_METADATA: json.dumps(keys)})
        os.chmod(tmp, 0o644)  # safetensors creates 0600 files; caches are shared read-only data


class FeatureCache:
    """Read features written by `preprocess features`: ``FeatureCache(cache).get(image_path) → (1024, 14, 14)``.

    `image_path` is a path under the dataset root recorded in the manifest (or `dataset_root`, if the
    dataset moved), or a key. Tensors come back as `dtype` (float32 by default; fp16 is what is stored).
    Chunk files are memory-mapped lazily, per process (safe in DataLoader workers).
    """

    def __init__(self, root: str | Path, *, dataset_root: str | Path | None = None, dtype: torch.dtype = torch.float32):
        self.root = Path(root)
        problem = not_a_cache(
            self.root, what=str(self.root), command=f"python -m preprocess features --out {self.root} …"
        )
        if problem is not None:
            raise problem
        self.manifest = read_json(self.root / MANIFEST)
        self.dataset_root = Path(dataset_root or self.manifest["dataset_root"])
        self.dtype = dtype
        self._entries: dict[str, tuple[str, int]] | None = None
        self._handles: dict[str, object] = {}
        self._pid = os.getpid()

    @property
    def entries(self) -> dict[str, tuple[str, int]]:
        if self._entries is None:
            self._entries = scan_index(self.root)
        return self._entries

    def key(self, image_path: str | Path) -> str:
        """The cache key of a path under the dataset root; a string that is already a key is returned as is."""
        if isinstance(image_path, str) and image_path in self.entries:
            return image_path
        return image_key(image_path, self.dataset_root)

    def __contains__(self, image_path: str | Path) -> bool:
        return self.key(image_path) in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def _handle(self, name: str):
        if os.getpid() != self._pid:  # forked worker: do not share the parent's open files
            self._handles, self._pid = {}, os.getpid()
        if name not in self._handles:
            self._handles[name] = safe_open(str(self.root / "features" / name), framework="pt")
        return self._handles[name]

    def chunk_rows(self, name: str):
        """The lazily read (N, 1024, 14, 14) tensor of one chunk file: slice it to read rows."""
        return self._handle(name).get_slice(FEATURE_TENSOR)

    def get(self, image_path: str | Path) -> torch.Tensor:
        key = self.key(image_path)
        if key not in self.entries:
            raise DataError(
                f"image {image_path} (key {key!r}) has no features in {self.root}; run "
                f"`python -m preprocess features --out {self.root} …` for its dataset split"
            )
        name, row = self.entries[key]
        return self.chunk_rows(name)[row : row + 1][0].to(self.dtype)
