"""Worker processes that end with the process that started them, even when it is SIGKILLed.

    DataLoader(dataset, num_workers=2, worker_init_fn=DieWithParent())

A SIGKILLed parent runs no cleanup, and a DataLoader worker blocked on its queues can outlive it by minutes
(issue 49 §16). On Linux the worker asks the kernel for SIGKILL when its parent goes (prctl PR_SET_PDEATHSIG);
elsewhere a daemon thread polls the parent's pid once a second.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h


class DieWithParent:
    """A picklable worker initialiser (any arguments are ignored: DataLoader passes the worker id). Made in the
    parent, so it knows the parent's pid and notices a parent that died before the worker started."""

    def __init__(self, poll_seconds: float = 1.0):
        self.parent, self.poll_seconds = os.getpid(), poll_seconds

    def __call__(self, *_) -> None:
        if not _death_signal(signal.SIGKILL):
            threading.Thread(target=self._watch, name="die-with-parent", daemon=True).start()
        if os.getppid() != self.parent:  # the parent was gone before the signal was asked for
            os._exit(1)

    def _watch(self) -> None:
        while os.getppid() == self.parent:
            time.sleep(self.poll_seconds)
        os._exit(1)


def _death_signal(signum: int) -> bool:
    """Ask Linux to send `signum` to this process when its parent ends; False where that is not available.
    (The kernel sends it when the parent *thread* that forked this process ends; davir's loaders are iterated
    by the thread that made them.)"""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
