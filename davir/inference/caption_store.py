"""The JSONL of `caption.py`: appended in complete lines, resumable, shardable, merged in pair order.

    store = CaptionStore(out, settings, num_shards=2, shard_index=0)
    store.prepare(overwrite=False, source=…)
    captioned, failed = store.earlier_rows()  # ids captioned / only failed before (repairs a cut last line)
    store.append(lines)                     # one write of whole lines per batch, then fsync (all or none)
    store.finish_shard(); store.merge(…)    # mark this shard done; the last one merges into `out`

The files and the merge rule: docs/recipes.md, "The JSONL of `caption.py`".
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from davir.errors import DataError
from davir.io import append_whole, atomic_path, path_record, read_json, write_json_atomic

MAX_RUNS_MERGED = 64  # more sorted runs than this (an input reordered many times): sort in memory instead
# Settings that are folders: recorded absolute (davir.io.path_record); a manifest of an older version may hold one
# as it was given, relative to the folder that run started in, which a resume from there still matches.
PATH_SETTINGS = ("model", "entities")


def _as_recorded_today(settings):
    if not isinstance(settings, dict):
        return settings
    return {k: path_record(v) if k in PATH_SETTINGS and isinstance(v, str) else v for k, v in settings.items()}


def _index_key(line: str) -> float:
    index = json.loads(line).get("index")
    return float("inf") if index is None else index


def cut_unfinished_line(path: Path) -> None:
    """Truncate the last line of `path` when a kill cut it short (no newline at the end), so that the next append
    starts a line of its own."""
    with open(path, "rb+") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        if not size:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        block, position = 1 << 16, size  # find the last newline and cut after it
        while position > 0:
            start = max(0, position - block)
            handle.seek(start)
            chunk = handle.read(position - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                handle.truncate(start + cut + 1)
                return
            position = start
        handle.truncate(0)


def _numbered(path: Path, start: int = 0, first: int = 0, stop: int | None = None) -> Iterator[tuple[int, int, str]]:
    """(byte offset, line number, line) of the complete lines of `path` from byte `start` (line `first`) to `stop`."""
    with open(path, "rb") as handle:
        handle.seek(start)
        offset, number = start, first
        for raw in handle:
            if stop is not None and offset >= stop:
                return
            if raw.endswith(b"\n") and raw.strip():
                yield offset, number, raw.decode("utf-8")
            offset, number = offset + len(raw), number + 1


def _sorted_runs(path: Path) -> list[tuple[int, int, int | None]]:
    """(start byte, start line, stop byte) of each stretch of `path` in `index` order: one for a file appended in
    order, one more per rerun that appended retried pairs after it."""
    runs, last, start = [], float("-inf"), (0, 0)
    for offset, number, line in _numbered(path):
        key = _index_key(line)
        if key < last:
            runs.append((*start, offset))
            start = (offset, number)
        last = key
    return runs + [(*start, None)]


def _keyed(path: Path, source: int, start: int, first: int, stop: int | None) -> Iterator[tuple]:
    """(index, (source, line number), line) of one sorted run of `path`."""
    for _, number, line in _numbered(path, start, first, stop):
        yield _index_key(line), (source, number), line


def _row_id(line: str) -> str:
    return json.loads(line)["id"]


def _id_and_captioned(line: str, path: Path | None = None, number: int = 0) -> tuple[str, bool]:
    """A row's id and whether it holds a caption (no error), from one parse of the line. With `path`: a line that
    is no row of caption.py's (the file edited by hand, or something else written over it) is a DataError naming
    the file and the line (1-based `number`)."""
    try:
        row = json.loads(line)
        return row["id"], row.get("error") is None
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        if path is None:
            raise
        raise DataError(
            f"{path}: line {number} is not a row caption.py writes ({type(error).__name__}: {error}); pass "
            "--overwrite to start again, or another --out"
        ) from error


class CaptionStore:
    def __init__(
        self,
        out: Path,
        settings: dict,
        *,
        num_shards: int = 1,
        shard_index: int = 0,
        html: Path | None = None,
        report_dir: Path | None = None,
    ):
        """`html`, `report_dir`: the report and the folder its pairs' strips are written to as they are captioned; a
        resume must write its report beside the same strips (`prepare`)."""
        self.out = Path(out)
        self.settings = settings
        self.html, self.report_dir = html, report_dir
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
            elif self.manifest.is_file() and self._differs_from_this_job():
                self.manifest.unlink(missing_ok=True)  # the siblings of this job write the same settings
        if self.manifest.is_file():
            changed = self.recorded_differences()
            if changed:
                raise DataError(
                    f"{self.out} holds captions made with other settings ({', '.join(changed)} differ, "
                    f"see {self.manifest}): pass --overwrite to start again, or another --out"
                )
            self.check_report()
        elif self.out.exists() or self.leftovers():
            raise DataError(
                f"{self.out} exists but has no manifest ({self.manifest.name}) saying how it was made: "
                "pass --overwrite to replace it, or another --out"
            )
        write_json_atomic(
            self.manifest,
            {**self.record(), "pairs": source, "status": "running", "started": time.strftime("%Y-%m-%dT%H:%M:%S")},
        )

    def _differs_from_this_job(self) -> bool:
        try:
            return bool(self.recorded_differences() or self.earlier_report())
        except DataError:  # no record at all: --overwrite replaces it
            return True

    def record(self) -> dict:
        """What the manifest records of this job: the settings, and where its report and strips go."""
        record: dict = {"settings": self.settings}
        if self.html is not None and self.report_dir is not None:
            record.update(html=os.path.abspath(self.html), report_files=path_record(self.report_dir))
        return record

    def check_report(self) -> None:
        """Refuse to resume captions whose strips are in another folder than this job's report's (see
        `earlier_report`), when there are captions to resume; needs no model, so caption_folder calls it before
        loading one (`prepare` calls it too)."""
        if not self.manifest.is_file():
            return
        earlier = self.earlier_report()
        if earlier and any(path.is_file() and path.stat().st_size for path in [self.out, *self.leftovers()]):
            old_html, old_files = earlier
            raise DataError(
                f"{self.out} was captioned with --html {old_html} (its pairs' pictures are in {old_files}); "
                f"resuming with --html {self.html} would leave those pairs without pictures: give --html "
                f"{old_html} to resume, or --overwrite to start again"
            )

    @classmethod
    def recorded_report_files(cls, out: Path) -> str | None:
        """The strips folder of the report the captions `out` were made with, as its manifest records it (None when
        it records none: no manifest, one that is unreadable, or one of a version before it did)."""
        store = cls(out, {})
        try:
            files = store.recorded().get("report_files") if store.manifest.is_file() else None
        except DataError:
            return None
        return files if isinstance(files, str) else None

    def earlier_report(self) -> tuple[str, str] | None:
        """(--html, strips folder) of the run that wrote the manifest when its strips are in another folder than this
        job's: the earlier pairs' strips would be missing from this job's report. None when they are in the same
        folder, or either side does not say (a manifest of a version before it recorded them)."""
        recorded = self.recorded()
        files = recorded.get("report_files")
        if not isinstance(files, str) or self.report_dir is None or files == path_record(self.report_dir):
            return None
        return str(recorded.get("html")), files

    def recorded(self) -> dict:
        """The manifest's record of how the captions were made; one that is no JSON object (edited by hand, or
        another file written over it) is a DataError naming it."""
        record = read_json(self.manifest)
        if not isinstance(record, dict):
            raise DataError(
                f"{self.manifest}: expected a JSON object (how {self.out.name} was made), got "
                f"{type(record).__name__}: pass --overwrite to start again, or another --out"
            )
        return record

    def recorded_differences(self) -> list[str]:
        """The settings keys in which the manifest's record differs from this job's, both sides normalised the same
        way (a path given another way is no difference)."""
        recorded = _as_recorded_today(self.recorded().get("settings"))
        recorded = recorded if isinstance(recorded, dict) else {}
        wanted = _as_recorded_today(self.settings)
        return sorted(k for k in set(recorded) | set(wanted) if recorded.get(k) != wanted.get(k))

    def earlier_rows(self) -> tuple[set[str], set[str]]:
        """(ids captioned, ids that only failed) in the output and every shard file (each repaired of a cut last
        line): a rerun skips the first and retries the second (the image may have been fixed since)."""
        captioned: set[str] = set()
        failed: set[str] = set()
        for path in [self.out, *self.leftovers()]:
            if not path.is_file():
                continue
            if path == self.path or path == self.out:
                cut_unfinished_line(path)
            try:
                for _, number, line in _numbered(path):
                    row_id, is_captioned = _id_and_captioned(line, path, number + 1)
                    (captioned if is_captioned else failed).add(row_id)
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{path}: not UTF-8 text as caption.py writes it ({error.reason} at byte {error.start} of a "
                    "line); pass --overwrite to start again, or another --out"
                ) from error
        return captioned, failed - captioned

    def append(self, lines: Iterable[str]) -> None:
        """Whole lines in one write: a kill leaves none or all of the batch (or a cut tail, repaired on rerun), a
        failed write (a full disk) none of it."""
        append_whole(self.path, "".join(line if line.endswith("\n") else line + "\n" for line in lines).encode("utf-8"))

    def finish_shard(self) -> bool:
        """Mark this shard done; True when every shard of the job is (then someone must merge)."""
        if self.num_shards == 1:
            return True
        self.shard_path(self.shard_index).with_name(self.shard_path(self.shard_index).name + ".done").touch()
        return all(
            self.shard_path(i).with_name(self.shard_path(i).name + ".done").exists() for i in range(self.num_shards)
        )

    def merge(self, extra_lines: Iterable[str], counts: dict) -> None:
        """Merge the output and every shard file in `index` order into `out`, atomically: one line per id, its
        captioned row over a failed one, else its last (a rerun's retry comes after the row it replaces)."""
        sources = [p for p in [self.out, *self.leftovers()] if p.is_file()]
        extra = [line if line.endswith("\n") else line + "\n" for line in extra_lines]
        best: dict[str, tuple[bool, tuple[int, int]]] = {}  # id -> (captioned, (source, line number)) of its row

        def consider(line: str, place: tuple[int, int]) -> None:
            row_id, is_captioned = _id_and_captioned(line)
            rank = (is_captioned, place)
            best[row_id] = max(best.get(row_id, rank), rank)

        for source, path in enumerate(sources):
            for _, number, line in _numbered(path):
                consider(line, (source, number))
        for number, line in enumerate(extra):
            consider(line, (len(sources), number))

        runs = [(p, i, *run) for i, p in enumerate(sources) for run in _sorted_runs(p)]
        streams = [_keyed(*run) for run in runs]
        streams.append((_index_key(line), (len(sources), n), line) for n, line in enumerate(extra))
        if len(runs) <= MAX_RUNS_MERGED:
            ordered = heapq.merge(*streams, key=lambda item: item[0])  # stable: ties keep the sources' order
        else:  # pairs reordered in the input between many runs: sort in memory (rare)
            ordered = iter(sorted(itertools.chain(*streams), key=lambda item: item[0]))
        with atomic_path(self.out) as tmp, open(tmp, "w", encoding="utf-8") as handle:
            for _, place, line in ordered:
                if best[_row_id(line)][1] == place:
                    handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        for path in self.out.parent.glob(self.out.name + ".shard-*"):
            path.unlink(missing_ok=True)
        manifest = self.recorded() if self.manifest.is_file() else self.record()
        manifest.update(status="complete", counts=counts, finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
        write_json_atomic(self.manifest, manifest)
