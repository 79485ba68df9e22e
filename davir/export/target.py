"""Where an export is written, and the only folder `--overwrite` may replace.

The export is built in `.NAME.partial` beside `--out` and moved into place once complete. `--overwrite` replaces
only a folder `davir-export` wrote (it holds davir_export.json), never one that is, holds or lies inside the run
being exported, nor the current folder, a home folder or the root (or one holding them); an empty folder is
taken as it is. The partial folder carries a marker file from its first moment, so a stale one (a SIGKILLed
export) is removed only when it is ours.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from davir.errors import DataError, OutputError, check_output_dir
from davir.export.layout import EXPORT_FILE

PARTIAL_MARKER = ".davir-export-partial"


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _protected(out: Path) -> list[tuple[Path, str]]:
    """Folders `out` must neither be nor hold: the current folder, home folders and the root."""
    found = [(Path(os.path.abspath(os.sep)), "the root folder")]
    try:
        found.append((Path.home().resolve(), "your home folder"))
    except RuntimeError:  # no HOME and no passwd entry
        pass
    return found + [(Path.cwd().resolve(), "the current folder")]


def check_out(out: Path, sources: list[Path], overwrite: bool) -> None:
    """Stop before any work when `out` cannot take the export: it overlaps the exported run or model folder
    (`sources`), is or holds a protected folder, or exists and is not a folder this command wrote."""
    resolved = out.resolve()
    for folder, what in _protected(out):
        if _within(folder, resolved):
            relation = "is" if folder == resolved else "holds"
            raise DataError(
                f"--out {out} {relation} {what} ({folder}): give a new folder for the export, e.g. exports/NAME"
            )
    for source in sources:
        source = source.resolve()
        if _within(resolved, source) or _within(source, resolved):
            relation = "is" if resolved == source else "lies inside" if _within(resolved, source) else "holds"
            raise DataError(f"--out {out} {relation} the exported folder {source}: give an --out outside it")
    if os.path.lexists(out):
        if out.is_symlink():  # replacing it would replace the link, not the folder it leads to
            raise DataError(
                f"--out {out} is a symlink (to {os.path.realpath(out)}): give the folder it leads to, or another --out"
            )
        if not out.is_dir():
            raise DataError(f"--out {out} exists and is not a folder: give another --out")
        if any(out.iterdir()):
            if not overwrite:
                raise DataError(
                    f"--out {out} exists and is not empty: give another --out, or --overwrite to "
                    "replace an earlier export there"
                )
            if not (out / EXPORT_FILE).is_file():
                raise DataError(
                    f"--out {out} holds files davir-export did not write (no {EXPORT_FILE}); "
                    "--overwrite replaces only an earlier export: give another --out"
                )
    old = replaced_folder(out)
    if os.path.lexists(old):  # only a kill -9 mid-replacement leaves it: which of the two to keep is the user's call
        raise OutputError(
            f"{old} exists (an earlier export a killed davir-export set aside, or not ours): remove "
            f"it, or rename it back to {out.name} if {out} is missing"
        )
    check_output_dir(out.parent, what="the folder of --out")


def clear_partial(out: Path) -> Path:
    """The path of `.NAME.partial` beside `out`, cleared: a stale one is removed only when it holds the marker."""
    partial = out.parent / f".{out.name}.partial"
    if os.path.lexists(partial):
        if partial.is_symlink() or not (partial / PARTIAL_MARKER).is_file():
            raise OutputError(
                f"{partial} exists and was not left by davir-export (no {PARTIAL_MARKER}): move it "
                "away, or give another --out"
            )
        shutil.rmtree(partial)
    return partial


def make_partial(partial: Path) -> None:
    """Create the cleared partial folder with its marker; called inside the export's cleanup, so a stop between the
    two steps leaves nothing behind."""
    partial.mkdir(parents=True)
    (partial / PARTIAL_MARKER).touch()


def move_into_place(partial: Path, out: Path) -> None:
    """Rename the complete `partial` onto `out`, an earlier export there set aside first and removed after.
    A SIGINT/SIGTERM meanwhile waits until this is done (then stops the command as usual)."""
    (partial / PARTIAL_MARKER).unlink()
    old = replaced_folder(out)
    with _signals_deferred():
        if os.path.lexists(out) and any(out.iterdir()):
            out.rename(old)
        elif os.path.lexists(out):
            out.rmdir()
        partial.rename(out)
        if os.path.lexists(old):
            shutil.rmtree(old)


def replaced_folder(out: Path) -> Path:
    return out.parent / f".{out.name}.replaced"


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        signal.signal(signum, lambda received, frame: pending.append(received))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if pending:
            os.kill(os.getpid(), pending[0])
