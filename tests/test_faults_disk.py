"""A full disk and two writers of one file (issues: caption.py and `davir.data import` ended in a raw OSError
traceback, leaving half a JSONL line; two writers of one strip shared its temporary file). ENOSPC is injected
where a real full disk raises it: in the write calls, after part of the data went to disk. Required: exit 2
with `error: <path>: no space left on device …`, nothing half-written, and a rerun (space freed) that ends as
an uninterrupted run. The caption.py cases train a tiny model, so they carry the `faults` marker."""

from __future__ import annotations

import errno
import io
import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from davir.io import append_jsonl, write_text_atomic
from davir.viz.folder_report import strip_name, write_strip
from tests.test_caption import error_line, pair_folder, rows_of, run, trained  # noqa: F401  (trained: the fixture)

NO_SPACE = "no space left on device (free some disk space)"


def enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write(2) raises it: no file named


def full_disk_for_os_write(monkeypatch, name_ends: str, *, whole_writes: int) -> None:
    """os.write to a file whose name ends with `name_ends`: `whole_writes` go through, the next one writes half
    its data (the disk fills), every later one raises ENOSPC."""
    real_write, calls = os.write, []

    def write(fd, data):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if name.endswith(name_ends):
            calls.append(len(data))
            if len(calls) == whole_writes + 1 and len(data) > 1:
                return real_write(fd, bytes(data)[: len(data) // 2])
            if len(calls) > whole_writes:
                raise enospc()
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


class _FillingFile(io.FileIO):
    """A file on a disk with room for 100 more bytes."""

    room = 100

    def write(self, data) -> int:
        if self.room <= 0:
            raise enospc()
        written = super().write(bytes(data)[: self.room])
        self.room -= written
        return written

    def fileno(self) -> int:  # PIL then writes through write() (with a descriptor it writes in C, out of reach)
        raise io.UnsupportedOperation("fileno")


def filling_open(real_open, *name_parts: str):
    """An `open` whose temporary files (`….tmp`) with `name_parts` in their name fill the disk; others as usual."""

    def open_(file, mode="r", *args, **kwargs):
        name = Path(file).name
        if name.endswith(".tmp") and all(part in name for part in name_parts) and "w" in mode:
            raw = _FillingFile(file, "w+" if "+" in mode else "w")
            buffered = io.BufferedRandom(raw) if "+" in mode else io.BufferedWriter(raw)
            return buffered if "b" in mode else io.TextIOWrapper(buffered, encoding=kwargs.get("encoding"))
        return real_open(file, mode, *args, **kwargs)

    return open_


def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def caption_argv(trained: Path, pairs: Path, out: Path) -> list:
    return [
        "--checkpoint",
        trained / "runs" / "tiny",
        "--pairs",
        pairs,
        "--out",
        out,
        "--batch-size",
        "2",
        "--workers",
        "0",
        "--quiet",
    ]


@pytest.mark.faults
def test_caption_on_a_full_disk_stops_cleanly_keeps_whole_lines_and_resumes(trained, tmp_path, capsys, monkeypatch):
    pairs = pair_folder(tmp_path / "pairs", trained / "data", 5)
    out = tmp_path / "out" / "captions.jsonl"
    with monkeypatch.context() as patch:
        full_disk_for_os_write(patch, "captions.jsonl", whole_writes=1)  # the second batch fills the disk
        status, _, err = run(caption_argv(trained, pairs, out), capsys)
    assert status == 2 and "Traceback" not in err
    assert error_line(err) == f"error: {out}: {NO_SPACE}"
    assert out.read_text().endswith("\n") and [r["id"] for r in rows_of(out)] == ["p00", "p01"]  # no half line
    assert temporaries(tmp_path) == [] and not out.with_name("captions.jsonl.lock").exists()

    status, _, err = run(caption_argv(trained, pairs, out), capsys)  # space freed: the rerun resumes
    assert status == 0 and "skipping 2 pair(s) already captioned" in err
    fresh = tmp_path / "fresh.jsonl"
    assert run(caption_argv(trained, pairs, fresh), capsys)[0] == 0
    assert out.read_text() == fresh.read_text()


@pytest.mark.faults
def test_a_full_disk_while_writing_a_strip_leaves_no_part_of_it(trained, tmp_path, capsys, monkeypatch):
    import PIL.Image

    pairs = pair_folder(tmp_path / "pairs", trained / "data", 4)
    out = tmp_path / "out" / "captions.jsonl"
    strips = tmp_path / "out" / "report_files" / "strips"
    with monkeypatch.context() as patch:  # the third strip (first of the second batch) fills the disk
        patch.setattr(PIL.Image, "builtins", SimpleNamespace(open=filling_open(open, strip_name(2))))
        status, _, err = run(caption_argv(trained, pairs, out), capsys)
    assert status == 2 and "Traceback" not in err
    assert error_line(err) == f"error: {strips / strip_name(2)}: {NO_SPACE}"
    assert sorted(p.name for p in strips.iterdir()) == [strip_name(0), strip_name(1)]  # whole strips only
    assert [r["id"] for r in rows_of(out)] == ["p00", "p01"] and temporaries(tmp_path) == []

    assert run(caption_argv(trained, pairs, out), capsys)[0] == 0
    assert sorted(p.name for p in strips.iterdir()) == [strip_name(i) for i in range(4)]
    for strip in strips.iterdir():
        with Image.open(strip) as image:
            image.load()  # a whole JPEG


def test_import_on_a_full_disk_exits_2_and_leaves_no_manifest(tmp_path, capsys, monkeypatch):
    import davir.io
    from davir.cli.data import main as data_main

    for side in ("before", "after"):
        (tmp_path / "pairs" / side).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 6), (i * 40, 9, 9) if side == "before" else (9, i * 40, 9)).save(
                tmp_path / "pairs" / side / f"p{i}.png"
            )
    out = tmp_path / "imported"
    monkeypatch.setattr(davir.io, "open", filling_open(open), raising=False)  # every atomic write
    status = data_main(["import", str(tmp_path / "pairs"), "--out", str(out), "--allow-uncaptioned"])
    err = capsys.readouterr().err
    assert status == 2 and err.splitlines() == [f"error: {out / 'report.json'}: {NO_SPACE}"]
    assert not (out / "pairs.jsonl").exists() and not (out / "report.json").exists() and temporaries(tmp_path) == []
    monkeypatch.undo()
    assert data_main(["import", str(tmp_path / "pairs"), "--out", str(out), "--allow-uncaptioned"]) == 0
    assert len((out / "pairs.jsonl").read_text().splitlines()) == 3


def test_a_failed_append_leaves_the_log_as_it_was(tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    append_jsonl(log, {"step": 1})
    before = log.read_bytes()
    with monkeypatch.context() as patch:
        full_disk_for_os_write(patch, "log.jsonl", whole_writes=0)
        with pytest.raises(OSError) as caught:
            append_jsonl(log, {"step": 2, "loss": "x" * 1000})
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(log)
    assert log.read_bytes() == before


def test_an_os_error_without_errno_keeps_its_message_when_a_write_names_its_file(tmp_path):
    # Pillow's encoders raise OSError("encoder error -2") (no errno); atomic_path adds the file's name, and the
    # one line a user read was "error: …/0000014.jpg: [errno none] none"
    from davir.errors import describe_os_error
    from davir.io import atomic_path

    path = tmp_path / "strip.jpg"
    with pytest.raises(OSError) as raised, atomic_path(path):
        raise OSError("encoder error -2")
    assert describe_os_error(raised.value) == f"{path}: encoder error -2"
    assert not list(tmp_path.iterdir())


def test_two_writers_of_one_file_never_share_a_temporary(tmp_path):
    """Threads (one pid) writing the same strip and page at once: each through its own temporary."""
    image = Image.new("RGB", (96, 72), (10, 120, 30))
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        try:
            for i in range(30):
                write_strip(tmp_path / "report", 0, image, image)
                write_text_atomic(tmp_path / "page.html", json.dumps({"writer": seed, "i": i}) * 2000)
        except BaseException as error:  # noqa: BLE001  (collected and asserted below)
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert temporaries(tmp_path) == []
    with Image.open(tmp_path / "report" / "strips" / strip_name(0)) as strip:
        strip.load()
    page = (tmp_path / "page.html").read_text()
    assert page == page[: len(page) // 2] * 2  # one writer's whole text
