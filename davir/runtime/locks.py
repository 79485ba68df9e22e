"""One writer per output: a lock file beside it, held while a command writes (docs/errors.md, "Locks").

    with output_lock(out, what=f"--out {out}", wait=args.wait_lock):
        ...                                   # write `out`; the lock file goes on exit, also on an exception

The lock is `OUT.lock` (`OUT.JOB.lock` for one job or shard of a shared cache, so shards of one cache run at
once), created with O_CREAT|O_EXCL and holding JSON: pid, host, since, the command, and a token that tells
the holder's own lock from a successor's. A second writer is refused (`LockHeld`, a DataError: exit 2) with
the holder named, or waits for it (`wait=True`, `--wait-lock`). A lock whose process is gone (same host, pid
not running, or running but started later: a reused pid) is taken over with a note on stderr; a lock of
another host is never presumed dead. Takeovers go through `LOCK.takeover` (also O_EXCL), so two processes
finding one stale lock cannot both take it. A leaf module beside davir.errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from davir.errors import DataError

POLL_SECONDS = 2.0
UNREADABLE_GRACE_SECONDS = 1.0  # a lock file just created is empty until its holder writes it
STALE_TAKEOVER_SECONDS = 60.0  # a takeover guard older than this belongs to a process that died in it


class LockHeld(DataError):
    """The output is locked by another live (or unknown) process."""


def lock_path(target: str | Path, job: str | None = None) -> Path:
    """`TARGET.lock`, or `TARGET.JOB.lock`: beside the output, so clearing a run folder keeps it."""
    target = Path(os.path.abspath(target))
    return target.with_name(f"{target.name}.{job}.lock" if job else f"{target.name}.lock")


def shard_job(job: str, num_shards: int = 1, shard_index: int = 0) -> str:
    """The lock name of one job's shard of a cache: shards of one cache are separate writers."""
    return job if num_shards == 1 else f"{job}.shard-{shard_index}-of-{num_shards}"


def _process_start(pid: int) -> str | None:
    """The start time of `pid` in clock ticks since boot (Linux), which tells a reused pid apart; None elsewhere."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def _running(holder: dict) -> bool:
    """Whether the process holding the lock on this host still runs (a zombie has ended)."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    start = _process_start(pid)
    return state != "Z" and (holder.get("started") is None or start is None or start == holder["started"])


def _read(path: Path) -> dict | None:
    """The holder recorded in `path`; None when the file is gone; {} while it cannot be read (being written)."""
    deadline = time.monotonic() + UNREADABLE_GRACE_SECONDS
    while True:
        try:
            holder = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(holder, dict):
                return holder
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return {}
        time.sleep(0.05)


def _describe(holder: dict) -> str:
    if not holder:
        return "a process that left no readable record"
    command = f", `{holder['command']}`" if holder.get("command") else ""
    return f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('since')}{command}"


def _create(path: Path, record: dict) -> bool:
    """Create the lock file holding `record`; False when it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, json.dumps(record).encode("utf-8"))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return True


def _take_over(path: Path, stale: dict, record: dict) -> bool:
    """Replace the stale lock `stale` by ours, under the takeover guard; False when another process got there."""
    guard = path.with_name(path.name + ".takeover")
    with contextlib.suppress(FileNotFoundError):
        if time.time() - guard.stat().st_mtime > STALE_TAKEOVER_SECONDS:
            guard.unlink()
    if not _create(guard, record):
        return False
    try:
        if _read(path) != stale:  # taken over (or released and taken) since we read it
            return False
        path.unlink(missing_ok=True)
        return _create(path, record)
    finally:
        guard.unlink(missing_ok=True)


def acquire(path: Path, *, what: str, wait: bool = False, poll: float | None = None) -> dict:
    """Create the lock file `path` for this process, or wait (`wait`, every `poll` s), or raise `LockHeld`;
    returns our record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300]
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "started": _process_start(os.getpid()),
        "command": command,
        "token": secrets.token_hex(8),
    }
    told = False
    while True:
        if _create(path, record):
            return record
        holder = _read(path)
        if holder is None:
            continue  # released between our try and the read
        if holder and holder.get("host") == record["host"] and not _running(holder):
            if _take_over(path, holder, record):
                print(
                    f"note: {what}: took over the lock file {path} of {_describe(holder)}, which no longer runs",
                    file=sys.stderr,
                )
                return record
            time.sleep(0.05)  # another process is taking it over: see who got it
            continue
        if not wait:
            raise LockHeld(
                f"{what} is in use by another run ({_describe(holder)}; lock file {path}): wait for it "
                "to finish, pass --wait-lock to wait for it, or delete the lock file if that run is gone"
            )
        if not told:
            print(f"waiting for {what}: locked by {_describe(holder)} ({path})", file=sys.stderr, flush=True)
            told = True
        time.sleep(POLL_SECONDS if poll is None else poll)


def release(path: Path, record: dict) -> None:
    """Remove the lock file when it is still ours (never a successor's; never from a forked worker)."""
    holder = _read(path)
    if holder and holder.get("token") == record["token"] and os.getpid() == record["pid"]:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def output_lock(
    target: str | Path,
    *,
    what: str,
    job: str | None = None,
    wait: bool = False,
    poll: float | None = None,
    enabled: bool = True,
) -> Iterator[Path | None]:
    """Hold the lock of `target` (see the module docstring) for the block; `enabled=False` holds nothing (the
    other processes of one accelerate job, whose main process holds it)."""
    if not enabled:
        yield None
        return
    path = lock_path(target, job)
    record = acquire(path, what=what, wait=wait, poll=poll)
    try:
        yield path
    finally:
        release(path, record)
