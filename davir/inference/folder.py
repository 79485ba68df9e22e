"""Captioning a user's folder of pairs with any trained model: the library side of `caption.py` / `davir-caption`.

    summary = caption_folder("runs/demo", "my_pairs/", "captions.jsonl")          # a checkpoint, loaded here
    summary = caption_folder(captioner, [ChangePair(...), ...], "captions.jsonl")  # a ChangeCaptioner, records
    summary.status                                                                # 0 done, 1 some pairs failed

How the pairs stream, resume and shard: docs/recipes.md, "Evaluation and captioning".
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from davir.data.formats.folder import manifest_of, read_folder_pairs
from davir.data.formats.folder_table import FolderPairTable
from davir.data.records import ChangePair, SkippedRecord
from davir.errors import DataError, check_output_file, refuse_outputs_over_inputs
from davir.inference.caption_store import CaptionStore
from davir.inference.captioner import CaptionerOptions, ChangeCaptioner
from davir.io import remove_temporaries
from davir.runtime.locks import output_lock
from davir.runtime.orphans import DieWithParent


@dataclass
class CaptionSummary:
    """What `caption_folder` did. `status` is the command's exit status (docs/errors.md): 0 done, 1 done but some
    pairs failed (listed in the JSONL); `merged` is False for a shard whose rows another process merges."""

    status: int
    out: Path
    html: Path
    pairs: int = 0  # pairs of the input (with the readers' counted skips), or of this shard
    captioned: int = 0
    failed: int = 0  # not captioned, the readers' skips included
    skipped: int = 0  # of which the readers' documented, counted skips
    this_run: int = 0  # pairs captioned or tried by this run (the others were done before)
    retried: int = 0
    merged: bool = True


class _Pending:
    """Map-style dataset of the input indices to prepare (a range, or an array of them after a resume); a worker
    makes the pair's record (from a manifest's compact table) and prepares it, one pair per item."""

    def __init__(self, indices, pairs: Sequence[ChangePair], captioner, report_limit: int):
        self.indices, self.pairs, self.captioner, self.report_limit = indices, pairs, captioner, report_limit

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        index = self.indices[i]
        return self.captioner.prepare(self.pairs[index], index=index, keep_images=index < self.report_limit)


@contextlib.contextmanager
def _one_opencv_thread(active: bool):
    """OpenCV's thread count set to 1 in this process while DataLoader workers are forked from it.

    The workers inherit it (parallelism is across pairs), and it must be set before the fork: calling
    cv2.setNumThreads inside a forked worker can deadlock on a lock one of the parent's pool threads held at
    fork time (seen under pytest-xdist). The parent does no OpenCV work while the workers run."""
    if not active:
        yield
        return
    import cv2

    previous = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(previous)


def _shard_layout(num_shards: int | None, shard_index: int | None) -> tuple[int, int, object]:
    """(num_shards, shard_index, accelerate state or None): accelerate when launched by it, else the arguments."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torch.distributed.run (accelerate launch --multi_gpu, torchrun)
        import torch
        from accelerate import PartialState

        state = PartialState(cpu=not torch.cuda.is_available())  # gloo between CPU processes
        if state.num_processes > 1:
            if num_shards not in (None, 1):
                raise DataError(
                    "--num-shards is for schedulers without accelerate: under `accelerate launch` each "
                    "process is a shard already"
                )
            return state.num_processes, state.process_index, state
    num_shards = num_shards or 1
    if not 0 <= (shard_index or 0) < num_shards:
        raise DataError(f"--shard-index must be in 0..{num_shards - 1}, got {shard_index}")
    return num_shards, shard_index or 0, None


def _line(index: int, pair, result) -> str:
    row = {
        "id": pair.pair_id,
        "index": index,
        "before": str(pair.before),
        "after": str(pair.after),
        "caption": result.caption,
        "entities": [[e, round(s, 4)] for e, s in result.entities],
        "error": result.error,
    }
    if pair.captions:
        row["references"] = list(pair.captions)
    return json.dumps(row, ensure_ascii=False)


def caption_folder(
    captioner: ChangeCaptioner | str | Path,
    pairs: str | Path | Sequence[ChangePair],
    out: str | Path | None = None,
    *,
    html: str | Path | None = None,
    report_limit: int = 1000,
    overwrite: bool = False,
    wait_lock: bool = False,
    batch_size: int = 32,
    workers: int | None = None,
    num_shards: int | None = None,
    shard_index: int = 0,
    progress: bool = True,
    options: CaptionerOptions | None = None,
) -> CaptionSummary:
    """Caption every pair into the JSONL `out` and an HTML report (`html`, default report.html beside `out`).

    `captioner`: a ChangeCaptioner, or a run/model folder loaded here with `options` (after the outputs are
    checked, on the shard's device). `pairs`: a folder of pairs or a pairs.csv/.jsonl manifest (`out` defaults
    to captions.jsonl beside it), or ChangePair records. See the module docstring for resuming and sharding.
    """
    if not isinstance(captioner, ChangeCaptioner):
        (options or CaptionerOptions()).check_paths()
    listed = not isinstance(pairs, (str, Path))
    if out is None:
        if listed:
            raise DataError("caption_folder: give `out` (the JSONL to write) when the pairs are records")
        out = (Path(pairs) if Path(pairs).is_dir() else Path(pairs).parent) / "captions.jsonl"
    out = Path(out)
    html_path = Path(html or out.with_name("report.html"))
    check_output_file(out, what="--out", example="captions.jsonl")
    check_output_file(html_path, what="--html", example="report.html")
    _check_html_spares_out(out, html_path)
    if not listed:
        _check_outputs_spare_manifest(Path(pairs), {"--out": out, "--html": html_path})
    num_shards, shard_index, state = _shard_layout(num_shards, shard_index)
    # A shard locks its own share; `part-` keeps the lock apart from the store's `.shard-*` files, which go.
    job = None if num_shards == 1 else f"part-{shard_index:05d}-of-{num_shards:05d}"
    with output_lock(
        out, what=f"--out {out}" + (f" (shard {shard_index + 1}/{num_shards})" if job else ""), job=job, wait=wait_lock
    ):
        if not overwrite:  # a resume with another report: refused before the pairs are read and the model loads
            from davir.viz.folder_report import report_files

            store = CaptionStore(out, {}, num_shards=num_shards, html=html_path, report_dir=report_files(html_path))
            store.check_report()
        if listed:
            records, skipped = pairs if isinstance(pairs, FolderPairTable) else list(pairs), []
        else:  # a manifest's pairs stay a compact table: each record is made when its pair is prepared
            index = read_folder_pairs(pairs)
            records, skipped = index.pairs, index.skipped
        if not isinstance(captioner, ChangeCaptioner):
            device = None if state is None or state.device.type == "cpu" else state.device
            captioner = ChangeCaptioner.from_pretrained(captioner, options, **({"device": device} if device else {}))
        source = f"{len(records)} records" if listed else str(pairs)
        name = "records" if listed else Path(pairs).name
        return _caption_locked(
            captioner,
            records,
            skipped,
            source,
            name,
            out,
            html_path,
            num_shards,
            shard_index,
            state,
            report_limit=report_limit,
            overwrite=overwrite,
            batch_size=batch_size,
            workers=workers,
            progress=progress,
        )


def _check_html_spares_out(out: Path, html: Path) -> None:
    """The report written over the JSONL or one of its companions (OUT.manifest.json, OUT.lock, OUT.shard-*) would
    lose the captions or the record of how they were made: refused whatever the flags."""
    refuse_outputs_over_inputs({"--html": html}, {"the --out file": out})
    out_resolved, html_resolved = out.resolve(), html.resolve()
    if html_resolved.parent == out_resolved.parent and html_resolved.name.startswith(out_resolved.name + "."):
        raise DataError(
            f"--html {html} would be written over --out {out} or its {out.name}.* files; give another --html"
        )


def _check_outputs_spare_manifest(pairs: Path, outputs: dict[str, Path]) -> None:
    """An output on the manifest being read would replace the user's list of pairs (`--overwrite` clears `--out`):
    refused whatever the flags."""
    refuse_outputs_over_inputs(outputs, {"the manifest of the pairs being captioned": manifest_of(pairs)})


def _caption_locked(
    captioner: ChangeCaptioner,
    pairs: Sequence[ChangePair],
    skipped_records: list[SkippedRecord],
    source: str,
    name: str,
    out: Path,
    html_path: Path,
    num_shards: int,
    shard_index: int,
    state,
    *,
    report_limit: int,
    overwrite: bool,
    batch_size: int,
    workers: int | None,
    progress: bool,
) -> CaptionSummary:
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from davir.viz.folder_report import report_files, write_folder_report, write_strip

    report_dir = report_files(html_path)
    main_process = shard_index == 0
    store = CaptionStore(
        out, captioner.settings(), num_shards=num_shards, shard_index=shard_index, html=html_path, report_dir=report_dir
    )
    if main_process or state is None:
        whole_job = state is not None or num_shards == 1
        store.prepare(overwrite=overwrite, source=source, whole_job=whole_job)
        if whole_job:  # no other writer yet: a killed run's half-written strips go (their pairs get them again)
            remove_temporaries(report_dir / "strips")
    if state is not None:
        state.wait_for_everyone()
    done, failed_before = store.earlier_rows()

    share, extra = divmod(len(pairs), num_shards)
    start = shard_index * share + min(shard_index, extra)
    mine = range(start, start + share + (shard_index < extra))
    # indices, never a list of records: a manifest's pair is made from its table when a worker prepares it
    pair_id = pairs.pair_id if isinstance(pairs, FolderPairTable) else lambda i: pairs[i].pair_id
    pending = array("q", (i for i in mine if pair_id(i) not in done)) if done else mine
    retried = sum(pair_id(i) in failed_before for i in pending) if failed_before else 0
    shard_note = f" (shard {shard_index + 1}/{num_shards})" if num_shards > 1 else ""
    if len(pending) < len(mine):
        print(f"skipping {len(mine) - len(pending)} pair(s) already captioned in {out}{shard_note}", file=sys.stderr)
    if retried:
        print(f"retrying {retried} pair(s) that failed in an earlier run{shard_note}", file=sys.stderr)

    workers = workers if workers is not None else min(4, max(0, (os.cpu_count() or 1) - 1))
    loader = DataLoader(
        _Pending(pending, pairs, captioner, report_limit),
        batch_size=batch_size,
        num_workers=workers,
        collate_fn=list,
        prefetch_factor=2 if workers else None,
        worker_init_fn=DieWithParent() if workers else None,
    )  # a SIGKILLed run leaves no worker
    counts = {"captioned": 0, "failed": 0}
    started = time.perf_counter()
    with (
        _one_opencv_thread(workers > 0),
        tqdm(total=len(pending), desc="caption", disable=not main_process or not progress) as bar,
    ):
        for batch in loader:
            kept = [p for p in batch if p.before is not None]
            results = captioner.generate(batch, attention=bool(kept))
            for p, r in zip(batch, results):  # strips before lines: a pair with a line has its strip after a kill
                counts["failed" if r.error else "captioned"] += 1
                if p.before is not None and r.error is None:
                    write_strip(
                        report_dir,
                        p.index,
                        p.before,
                        p.after,
                        mask=p.mask,
                        attention=(r.attention_before, r.attention_after),
                    )
            store.append(_line(p.index, p.pair, r) for p, r in zip(batch, results))
            bar.update(len(batch))
    seconds = time.perf_counter() - started

    all_done = store.finish_shard()
    if state is not None:
        state.wait_for_everyone()
        all_done = main_process
    if not all_done:
        print(
            f"shard {shard_index + 1}/{num_shards}: {counts['captioned']} captioned, {counts['failed']} not, in "
            f"{store.path}; "
            + ("the main process merges" if state is not None else "the last shard to finish merges them")
            + f" into {out}",
            file=sys.stderr,
        )
        if state is not None:
            # Stay until the main process has merged and written the report, and leave its exit status to it:
            # torch's launcher SIGTERMs every process once one exits nonzero, which stopped the main one mid-merge.
            state.wait_for_everyone()
        # docs/errors.md: 1 = done, some pairs failed (listed in the JSONL); under accelerate: the main process's
        return CaptionSummary(
            1 if counts["failed"] and state is None else 0,
            out,
            html_path,
            pairs=len(mine),
            captioned=counts["captioned"],
            failed=counts["failed"],
            this_run=len(pending),
            retried=retried,
            merged=False,
        )
    skipped_lines = [
        json.dumps({"id": s.record, "index": None, "caption": None, "entities": [], "error": f"skipped: {s.reason}"})
        for s in skipped_records
    ]
    totals = {"pairs": len(pairs) + len(skipped_records)}
    store.merge(skipped_lines, totals)
    failed = skipped = 0
    with open(out, encoding="utf-8") as handle:
        for line in handle:
            error = json.loads(line).get("error")
            failed += error is not None
            skipped += error is not None and error.startswith("skipped: ")  # a reader's documented, counted skip
    write_folder_report(
        html_path,
        out,
        report_dir,
        title=f"Change captions — {name}",
        summary={"checkpoint": str(captioner.run.model_dir), "pairs": source, "captions": str(out)},
        limit=report_limit,
    )
    rate = f" ({len(pending) / seconds:.1f} pairs/s)" if pending and seconds > 0 else ""
    print(
        f"captioned {totals['pairs'] - failed} pair(s), {failed} not captioned; {len(pending)} this run"
        f"{f' ({retried} retried)' if retried else ''}{rate}; "
        f"{out}; report {html_path}"
    )
    if failed:
        with open(out, encoding="utf-8") as handle:
            notes = list(itertools.islice((row for row in map(json.loads, handle) if row.get("error")), 5))
        for row in notes:
            print(f"note: {row['id']}: {row['error']}", file=sys.stderr)
    if state is not None:
        state.wait_for_everyone()  # the other processes wait for the merge and the report (above)
    # docs/errors.md: 1 = done, but some pairs failed; they are listed
    return CaptionSummary(
        1 if failed > skipped else 0,
        out,
        html_path,
        pairs=totals["pairs"],
        captioned=totals["pairs"] - failed,
        failed=failed,
        skipped=skipped,
        this_run=len(pending),
        retried=retried,
    )
