"""SIGTERM and Ctrl-C end a long command like a kill it survives (docs/errors.md, "Long jobs and kills").

Each command's `main` is decorated with `stop_on_signals`: while it runs, SIGINT and SIGTERM raise `Stopped` in
the main thread. It is a BaseException, so the per-pair `except Exception` catches let it through; unwinding
runs the `finally`/`with` blocks on the way (a pool is terminated, a file closed after its last whole line,
an atomic write removes its temporary), the DataLoader iterators the frames held are shut down (their
workers end), and `main` returns 130 (SIGINT) or 143 (SIGTERM) after one line on stderr instead of a
traceback. A leaf module: it imports nothing from davir.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
RESUME = "rerun the same command to resume"
START_AGAIN = "rerun the same command to start it again"

# The process whose main installed the handlers; None when none did. Forked workers inherit the handler but
# not this identity, which is how the handler tells them apart.
_installed_in_pid: int | None = None


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived; raised in the main thread and turned into the exit status by `stop_on_signals`."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def _raise_stopped(signum: int, frame) -> None:
    if os.getpid() != _installed_in_pid:
        # A forked worker (DataLoader, multiprocessing pool): its parent stops it. Ctrl-C reaches the whole
        # process group, so it is ignored here (no worker traceback); SIGTERM (Pool.terminate, a timed-out
        # DataLoader shutdown) ends it as it would by default.
        if signum == signal.SIGTERM:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        return
    raise Stopped(signum)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait while the block runs (a few renames that must all happen), then arrive as usual;
    off the main thread (where Python cannot set handlers) the block runs as it is. The hold is a handler that
    notes the signal, not a blocked signal mask: a process-directed signal goes to any thread that does not block
    it (torch's, the test runner's), and Python then runs the handler in the main thread all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(signum, handler)
        if arrived:
            signal.raise_signal(arrived[0])  # delivered now, to the handler the block found


def ignore_interrupts() -> None:
    """For the initializer of a spawned worker pool: Ctrl-C reaches the whole process group, and the parent
    (which gets `Stopped`) terminates its workers; without this each worker would print a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_on_signals(rerun: str = RESUME) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a command's `main`: SIGINT/SIGTERM → `Stopped` → "stopped by SIGTERM; <rerun>" and 128 + signum.

    A decorated main called from another (the sweep calls train's and evaluate's mains) lets `Stopped` through
    to the outer one, whose hint is the right one for its user. Off the main thread (where Python cannot set
    handlers) the main runs as it is."""

    def decorate(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def stoppable_main(*args, **kwargs) -> int:
            if _installed_in_pid == os.getpid() or threading.current_thread() is not threading.main_thread():
                return main(*args, **kwargs)
            return _run_stoppable(main, args, kwargs, rerun)

        stoppable_main.stops_on_signals = True  # tests/test_faults_signals.py checks every command has it
        return stoppable_main

    return decorate


def _from_resource_sharer(tb) -> bool:
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(os.path.join("multiprocessing", "resource_sharer.py")):
            return True
        tb = tb.tb_next
    return False


def _worker_stop_signal(error: RuntimeError) -> int | None:
    """The stop signal a DataLoader worker died of, from torch's "DataLoader worker (pid N) is killed by signal:
    Terminated." — a SIGTERM/SIGINT to the process group can reach the main thread as this error (torch's
    SIGCHLD handler) before it arrives as `Stopped`; either way the job was stopped, not broken."""
    message = str(error)
    if "DataLoader worker" not in message or "is killed by signal:" not in message:
        return None
    name = message.split("is killed by signal:", 1)[1].strip().rstrip(".").strip()
    return next((int(signum) for signum in STOP_SIGNALS if signal.strsignal(signum) == name), None)


def _quiet_resource_sharer(hook: Callable) -> Callable:
    """sys.excepthook without the traceback multiprocessing's resource-sharer thread prints when a DataLoader
    worker it was handing a tensor to ends mid-handshake (a SIGTERM to the process group ends the workers
    first). The main thread reports that stop, or the DataLoader's own error names the dead worker."""

    def excepthook(kind, value, tb) -> None:
        if issubclass(kind, (OSError, EOFError)) and _from_resource_sharer(tb):
            return
        hook(kind, value, tb)

    return excepthook


def _run_stoppable(main: Callable[..., int], args: tuple, kwargs: dict, rerun: str) -> int:
    global _installed_in_pid
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    previous_hook = sys.excepthook
    sys.excepthook = _quiet_resource_sharer(previous_hook)
    _installed_in_pid = os.getpid()
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_stopped)
    try:
        try:
            return main(*args, **kwargs)
        except Stopped as stop:
            signum = stop.signum
        except RuntimeError as error:
            signum = _worker_stop_signal(error)
            if signum is None:
                raise
        # The traceback is gone now. A second signal while the workers end is one stop, not a traceback.
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        gc.collect()  # DataLoader iterators in reference cycles: their __del__ shuts the workers down now
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        print(f"stopped by {signal.Signals(signum).name}; {rerun}", file=sys.stderr, flush=True)
        return 128 + signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        sys.excepthook = previous_hook
        _installed_in_pid = None
