"""The JSONL of `caption.py`: appended in complete lines, resumable, shardable, merged in pair order.

    store = CaptionStore(out, settings, num_shards=2, shard_index=0)
    done = store.open(overwrite=False)      # ids already captioned (repairs a line cut by a kill)
    store.append(lines)                     # one write of whole lines per batch, then fsync
    store.finish(order)                     # mark this shard done; the last one merges into `out`

One process appends to `out` itself; shard I of N to `out.shard-I-of-N` beside it. `out.manifest.json`
records the settings the captions were made with: a rerun reuses lines only when they are equal.
Every line carries the pair's `index` in the input, so the shards merge in order without sorting in
memory (heapq.merge over the files).
"""

from __future__ import annotations

import heapq
import json
import os
import time
from pathlib import Path
from typing import Iterable, Iterator

from davir.data.records import DataError
from davir.io import read_json, write_json_atomic


def _index_key(line: str) -> float:
    index = json.loads(line).get("index")
    return float("inf") if index is None else index


def read_complete_lines(path: Path, *, repair: bool) -> Iterator[str]:
    """The complete JSON lines of `path`; with `repair`, a last line cut by a kill is truncated away first."""
    if not path.is_file():
        return iter(())
    if repair:
        with open(path, "rb+") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            if size:
                handle.seek(max(0, size - 1))
                if handle.read(1) != b"\n":  # find the last newline and cut after it
                    block, position = 1 << 16, size
                    while position > 0:
                        start = max(0, position - block)
                        handle.seek(start)
                        chunk = handle.read(position - start)
                        cut = chunk.rfind(b"\n")
                        if cut >= 0:
                            handle.truncate(start + cut + 1)
                            break
                        position = start
                    else:
                        handle.truncate(0)
    return _lines(path)


def _is_sorted(path: Path) -> bool:
    last = float("-inf")
    for line in _lines(path):
        key = _index_key(line)
        if key < last:
            return False
        last = key
    return True


def _lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.endswith("\n") and line.strip():
                yield line


class CaptionStore:
    def __init__(self, out: Path, settings: dict, *, num_shards: int = 1, shard_index: int = 0):
        self.out = Path(out)
        self.settings = settings
        self.num_shards, self.shard_index = num_shards, shard_index
        self.manifest = self.out.with_name(self.out.name + ".manifest.json")
        self.path = self.out if num_shards == 1 else self.shard_path(shard_index)

    def shard_path(self, index: int) -> Path:
        return self.out.with_name(f"{self.out.name}.shard-{index:05d}-of-{self.num_shards:05d}")

    def leftovers(self) -> list[Path]:
        """Shard files of this or an earlier (killed, differently sharded) run."""
        return sorted(p for p in self.out.parent.glob(self.out.name + ".shard-*") if not p.name.endswith(".done"))

    def prepare(self, *, overwrite: bool, source: str, whole_job: bool = True) -> None:
        """Check or (re)start the manifest; --overwrite clears old outputs.

        `whole_job`: one process prepares for every shard (a single process, or accelerate's main process before
        the others start), so --overwrite may clear every shard file. Shards started independently by a scheduler
        (`--num-shards/--shard-index`) run this each: --overwrite then clears the merged output, this shard's file
        and files of another shard count, never a sibling shard's file that may be in the middle of its work."""
        if overwrite:
            own = {self.path, self.path.with_name(self.path.name + ".done")}
            of_this_job = f"-of-{self.num_shards:05d}"
            for path in [self.out, *self.out.parent.glob(self.out.name + ".shard-*")]:
                if whole_job or path in own or of_this_job not in path.name:
                    path.unlink(missing_ok=True)
            if whole_job:
                self.manifest.unlink(missing_ok=True)
            elif self.manifest.is_file() and read_json(self.manifest).get("settings") != self.settings:
                self.manifest.unlink(missing_ok=True)  # the siblings of this job write the same settings
        if self.manifest.is_file():
            recorded = read_json(self.manifest).get("settings")
            if recorded != self.settings:
                changed = sorted(k for k in set(recorded or {}) | set(self.settings)
                                 if (recorded or {}).get(k) != self.settings.get(k))
                raise DataError(f"{self.out} holds captions made with other settings ({', '.join(changed)} differ, "
                                f"see {self.manifest}): pass --overwrite to start again, or another --out")
        elif self.out.exists() or self.leftovers():
            raise DataError(f"{self.out} exists but has no manifest ({self.manifest.name}) saying how it was made: "
                            "pass --overwrite to replace it, or another --out")
        write_json_atomic(self.manifest, {"settings": self.settings, "pairs": source, "status": "running",
                                          "started": time.strftime("%Y-%m-%dT%H:%M:%S")})

    def done_ids(self) -> set[str]:
        """Ids with a line in the output or in any shard file (each repaired of a cut last line)."""
        done: set[str] = set()
        for path in [self.out, *self.leftovers()]:
            for line in read_complete_lines(path, repair=path == self.path or path == self.out):
                done.add(json.loads(line)["id"])
        return done

    def append(self, lines: Iterable[str]) -> None:
        data = "".join(line if line.endswith("\n") else line + "\n" for line in lines).encode("utf-8")
        if not data:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)  # whole lines in one write: a kill leaves none or all of the batch (or a cut tail)
            os.fsync(fd)
        finally:
            os.close(fd)

    def finish_shard(self) -> bool:
        """Mark this shard done; True when every shard of the job is (then someone must merge)."""
        if self.num_shards == 1:
            return True
        self.shard_path(self.shard_index).with_name(self.shard_path(self.shard_index).name + ".done").touch()
        return all(self.shard_path(i).with_name(self.shard_path(i).name + ".done").exists()
                   for i in range(self.num_shards))

    def merge(self, extra_lines: Iterable[str], counts: dict) -> None:
        """Merge the output and every shard file in `index` order (one line per id) into `out`, atomically."""
        sources = [p for p in [self.out, *self.leftovers()] if p.is_file()]
        tmp = self.out.with_name(f".{self.out.name}.merge.tmp")
        seen: set[str] = set()
        if all(_is_sorted(p) for p in sources):
            ordered = heapq.merge(*(_lines(p) for p in sources), key=_index_key)
        else:  # pairs added to the input between runs: sort in memory (rare)
            ordered = iter(sorted((line for p in sources for line in _lines(p)), key=_index_key))
        with open(tmp, "w", encoding="utf-8") as handle:
            for line in ordered:
                pair_id = json.loads(line)["id"]
                if pair_id not in seen:
                    seen.add(pair_id)
                    handle.write(line)
            for line in extra_lines:
                if json.loads(line)["id"] not in seen:
                    handle.write(line if line.endswith("\n") else line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.out)
        for path in self.out.parent.glob(self.out.name + ".shard-*"):
            path.unlink(missing_ok=True)
        manifest = read_json(self.manifest) if self.manifest.is_file() else {"settings": self.settings}
        manifest.update(status="complete", counts=counts, finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
        write_json_atomic(self.manifest, manifest)
