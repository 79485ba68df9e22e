"""One writer per output (issue: two caption.py runs with one --out both captioned everything): the lock file
beside the output, the refusal that names the holder, --wait-lock, the takeover of a dead holder's lock, and
real processes racing for one lock."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from davir.cli import caption as caption_script
from davir.cli import train as train_script
from davir.runtime.locks import LockHeld, lock_path, output_lock

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

# A caption.py-like writer: takes the lock of argv[1] as caption.py does, says so, holds it until argv[2] exists.
HOLDER = """
import sys, time
from pathlib import Path
from davir.runtime.locks import output_lock
with output_lock(sys.argv[1], what="--out " + sys.argv[1]):
    print("holding", flush=True)
    while not Path(sys.argv[2]).exists():
        time.sleep(0.02)
"""


class Holder:
    """A real process holding the lock of `target` until `release()`."""

    def __init__(self, target: Path, tmp_path: Path):
        self.release_file = tmp_path / f"release-{time.monotonic_ns()}"
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(target), str(self.release_file)],
            cwd=REPO,
            env=ENV,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout.readline().strip() == "holding"

    def release(self) -> None:
        self.release_file.touch()
        assert self.process.wait(timeout=30) == 0


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_second_caption_run_on_one_out_is_refused_naming_the_first(tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    holder = Holder(out, tmp_path)
    try:
        # The lock is taken before the model is loaded: this checkpoint is never read.
        status = caption_script.main(
            ["--checkpoint", str(tmp_path / "no_run"), "--pairs", str(tmp_path), "--out", str(out), "--quiet"]
        )
        err = capsys.readouterr().err
        assert status == 2 and len(err.splitlines()) == 1, err
        assert err.startswith(
            f"error: --out {out} is in use by another run (pid {holder.process.pid} on host "
            f"{socket.gethostname()} since "
        )
        assert f"lock file {out}.lock" in err and "--wait-lock" in err
        record = json.loads((tmp_path / "captions.jsonl.lock").read_text())
        assert record["pid"] == holder.process.pid and record["host"] == socket.gethostname()
    finally:
        holder.release()
    assert not (tmp_path / "captions.jsonl.lock").exists()  # the holder removed it on exit


def test_train_refuses_a_locked_run_folder_and_masks_lock_per_shard(tmp_path, capsys):
    from davir.jobs import masks as masks_job

    run = tmp_path / "runs" / "demo"
    holder = Holder(run, tmp_path)
    try:
        status = train_script.main([f"run.output_dir={run}"])
        err = capsys.readouterr().err
        assert status == 2 and f"error: run folder {run} is in use by another run (pid {holder.process.pid}" in err
        assert not run.exists()  # refused before anything was written
    finally:
        holder.release()

    cache = tmp_path / "cache"
    with output_lock(cache, what="mask cache", job="masks.shard-0-of-2"):
        # The other shard of the same cache runs at once (it fails later, on the missing dataset) ...
        argv = [
            "--format",
            "clevr_change",
            "--root",
            str(tmp_path / "no_data"),
            "--split",
            "test",
            "--out",
            str(cache),
            "--num-shards",
            "2",
            "--shard-index",
        ]
        assert masks_job.main(argv + ["1"]) == 2
        assert "in use by another run" not in capsys.readouterr().err
        # ... while the same shard is refused (this process holds it: a live holder).
        assert masks_job.main(argv + ["0"]) == 2
        assert f"error: mask cache {cache} is in use by another run (pid {os.getpid()}" in capsys.readouterr().err


def test_the_lock_goes_on_an_exception_and_a_dead_holders_lock_is_taken_over(tmp_path, capsys):
    target = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        with output_lock(target, what="--out"):
            assert lock_path(target).is_file()
            raise RuntimeError("a bug mid-run")
    assert not lock_path(target).exists()

    # A SIGKILLed run leaves its lock: same host, its pid no longer runs.
    stale = {"pid": dead_pid(), "host": socket.gethostname(), "since": "2020-01-01T00:00:00", "command": "caption.py"}
    lock_path(target).write_text(json.dumps(stale))
    with output_lock(target, what=f"--out {target}") as held:
        assert json.loads(held.read_text())["pid"] == os.getpid()
    err = capsys.readouterr().err
    assert f"note: --out {target}: took over the lock file {target}.lock of pid {stale['pid']} on host" in err
    assert not lock_path(target).exists()

    # A live pid that started after the lock was written is a reused pid: stale too.
    lock_path(target).write_text(json.dumps({**stale, "pid": os.getppid(), "started": "1"}))
    with output_lock(target, what="--out"):
        pass
    # Another host's lock is never presumed dead.
    lock_path(target).write_text(json.dumps({**stale, "host": "elsewhere.example"}))
    with pytest.raises(LockHeld, match=f"pid {stale['pid']} on host elsewhere.example since 2020-01-01T00:00:00"):
        with output_lock(target, what="--out"):
            pass


def test_wait_lock_waits_for_the_holder_then_proceeds(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("davir.runtime.locks.POLL_SECONDS", 0.05)
    out = tmp_path / "captions.jsonl"
    holder = Holder(out, tmp_path)
    result = {}

    def caption():
        result["status"] = caption_script.main(
            [
                "--checkpoint",
                str(tmp_path / "no_run"),
                "--pairs",
                str(tmp_path),
                "--out",
                str(out),
                "--quiet",
                "--wait-lock",
            ]
        )

    waiter = threading.Thread(target=caption)
    waiter.start()
    time.sleep(1.0)
    assert waiter.is_alive() and "status" not in result  # still waiting for the holder
    holder.release()
    waiter.join(timeout=60)
    err = capsys.readouterr().err
    assert f"waiting for --out {out}: locked by pid {holder.process.pid}" in err
    # It went on past the lock, to the next problem of this call: no pairs in the folder.
    assert result["status"] == 2 and "in use by another run" not in err and "found no image pairs" in err
    assert not lock_path(out).exists()


RACER = """
import json, os, sys, time
from pathlib import Path
from davir.runtime.locks import LockHeld, output_lock
target, start, log, wait = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "wait"
while not start.exists():
    time.sleep(0.001)
try:
    with output_lock(target, what="--out", wait=wait, poll=0.01):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"in {os.getpid()} {time.time()}\\n".encode())
        time.sleep(0.3)
        os.write(fd, f"out {os.getpid()} {time.time()}\\n".encode())
        os.close(fd)
except LockHeld:
    sys.exit(3)
"""


def race(tmp_path: Path, target: Path, *, n: int, wait: bool) -> tuple[list[int], list[str]]:
    start, log = tmp_path / f"start-{time.monotonic_ns()}", tmp_path / f"log-{time.monotonic_ns()}"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(target), str(start), str(log), "wait" if wait else "no"],
            cwd=REPO,
            env=ENV,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]
    time.sleep(1.5)  # every racer imported and polling for the start
    start.touch()
    return [racer.wait(timeout=120) for racer in racers], log.read_text().splitlines()


def test_concurrent_writers_never_hold_one_lock_together(tmp_path):
    target = tmp_path / "captions.jsonl"
    statuses, log = race(tmp_path, target, n=6, wait=False)
    assert sorted(statuses) == [0] + [3] * 5 and len(log) == 2  # exactly one got it, the others were refused

    # Six racers finding one stale lock: exactly one takes it over.
    lock_path(target).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname(), "since": "x"}))
    statuses, log = race(tmp_path, target, n=6, wait=False)
    assert sorted(statuses) == [0] + [3] * 5 and len(log) == 2

    # Waiting racers take turns: each holds it alone.
    statuses, log = race(tmp_path, target, n=4, wait=True)
    assert statuses == [0] * 4 and len(log) == 8
    events = [line.split() for line in log]
    assert all(events[i][0] == "in" and events[i + 1][:2] == ["out", events[i][1]] for i in range(0, 8, 2))
    assert not lock_path(target).exists()


# A long command's main, stopped by SIGTERM while it holds its lock (davir.runtime.signals turns it into exit 143).
STOPPED_HOLDER = """
import sys, time
from davir.runtime.locks import output_lock
from davir.runtime.signals import stop_on_signals

@stop_on_signals()
def main():
    with output_lock(sys.argv[1], what="--out " + sys.argv[1]):
        print("holding", flush=True)
        while True:
            time.sleep(0.02)

sys.exit(main())
"""


def test_the_lock_goes_when_the_command_is_stopped_by_sigterm(tmp_path):
    target = tmp_path / "captions.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-c", STOPPED_HOLDER, str(target)],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "holding" and lock_path(target).is_file()
    process.terminate()
    assert process.wait(timeout=30) == 143
    assert "stopped by SIGTERM" in process.stderr.read()
    assert not lock_path(target).exists()  # the rerun is not refused by the stopped run's lock
