"""SIGTERM and Ctrl-C (issue: a SIGTERMed caption.py left its DataLoader worker running): every long command
ends like a kill it survives — its workers gone, whole lines only, no traceback, one `stopped by …` line, exit
143 (SIGTERM) or 130 (SIGINT) — and the rerun finishes with the output of an uninterrupted run.

The commands are started as real processes and signalled once they have written their first result; Ctrl-C is
sent as a terminal does, to the whole process group (workers included)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.test_faults import ENV, REPO, data, no_temporaries, tiny_caption_run, tree  # noqa: F401  (data: the fixture)


def _alive(pid: int) -> bool:
    """A process that still runs (a zombie waiting for its reaper has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _children(pid: int) -> list[int]:
    """Every live descendant of `pid`, from /proc (psutil is not a dependency)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [child for child, ppid in parents.items() if ppid == parent and _alive(child)]
        found += kids
        frontier += kids
    return found


def stop_while_working(
    argv: list[str], started, signum: int, tmp_path: Path, *, whole_group: bool = False, timeout: float = 180
) -> tuple[int, str, list[int]]:
    """Start the command, wait until `started()`, send `signum` (to the process, or as Ctrl-C does to its whole
    group); returns (exit status, stderr, the descendants it had when signalled). Fails when the command ended
    before the signal, since then nothing was tested."""
    stderr_path = tmp_path / f"stderr-{time.monotonic_ns()}.txt"
    with open(stderr_path, "w") as stderr:  # a file, not a pipe: a chatty command never blocks on a full pipe
        process = subprocess.Popen(
            [sys.executable, *argv], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout
        while not started() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process.poll() is None, f"the command ended before the signal: {stderr_path.read_text()[-2000:]}"
        descendants = _children(process.pid)
        if whole_group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        status = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return status, stderr_path.read_text(), descendants


def assert_stopped_cleanly(
    status: int, stderr: str, descendants: list[int], signum: int, *, rerun: str = "rerun the same command to resume"
) -> None:
    assert status == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1] == f"stopped by {signal.Signals(signum).name}; {rerun}"
    assert sum("stopped by" in line for line in lines) == 1
    deadline = time.monotonic() + 5  # an orphan is reparented, not killed: a leftover worker shows up here
    while any(_alive(pid) for pid in descendants) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in descendants if _alive(pid)] == [], "worker processes outlived the stopped command"


def assert_whole_lines(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    # empty is whole: a stop during the first line's write leaves no line, never a part of one
    assert text == "" or text.endswith("\n"), f"{path} ends in a cut line"
    for line in text.splitlines():
        json.loads(line)


# ---- every long command is covered --------------------------------------------------------------------------

# Every command's `main` (davir/cli, davir/jobs) stops on a signal with one line, except these, with why.
STOPS_ITS_OWN_WAY = {
    "davir/cli/app.py": "a server: Ctrl-C and SIGTERM close it (its own KeyboardInterrupt handler, exit 0)",
    "davir/cli/preprocess.py": "hands the work to a davir/jobs main, which is decorated",
}
LONG_COMMAND_MAINS = sorted(
    str(path.relative_to(REPO))
    for folder in ("davir/cli", "davir/jobs")
    for path in (REPO / folder).glob("*.py")
    if "\ndef main(" in path.read_text(encoding="utf-8") and str(path.relative_to(REPO)) not in STOPS_ITS_OWN_WAY
)


def test_every_long_command_main_stops_on_signals():
    """Read from the source (importing every command would start torch): each `main` is decorated."""
    import ast

    def decorated(path: str) -> bool:
        tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
        main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
        return any(
            isinstance(d, ast.Call) and getattr(d.func, "id", None) == "stop_on_signals" for d in main.decorator_list
        )

    assert {"davir/cli/caption.py", "davir/cli/export.py", "davir/cli/screenshots.py", "davir/jobs/masks.py"} <= set(
        LONG_COMMAND_MAINS
    )  # found from the source: a new command is checked without being listed
    assert [path for path in LONG_COMMAND_MAINS if not decorated(path)] == []


def test_a_stopped_main_returns_the_status_with_one_line_and_restores_the_handlers(capsys):
    from davir.runtime.signals import stop_on_signals

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    reached = []

    @stop_on_signals()
    def inner() -> int:
        os.kill(os.getpid(), signal.SIGINT)
        reached.append("after the signal")  # never: the signal ends the work here
        return 0

    @stop_on_signals(rerun="rerun it")
    def outer() -> int:
        try:
            return inner()  # nested (the sweep calls train's main): the outer main reports
        finally:
            reached.append("outer finally")

    assert outer() == 130
    assert reached == ["outer finally"]
    assert capsys.readouterr().err == "stopped by SIGINT; rerun it\n"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_held_stop_signals_arrive_after_the_block(capsys):
    """stop_signals_held (the moves that put a saved checkpoint in place, davir.pretrain_tiny.save_checkpoint): a
    Ctrl-C during the block ends the command once the block is done, never between two of its moves."""
    from davir.runtime.signals import stop_on_signals, stop_signals_held

    reached = []

    @stop_on_signals(rerun="rerun it")
    def main() -> int:
        with stop_signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # time for the signal to reach a thread and its handler to run
            reached.append("the rest of the block")
        reached.append("after the block")  # never: the held signal arrives as the block ends
        return 0

    # Another thread that takes signals, as torch's and pytest-xdist's do: the kernel hands a process-directed
    # signal to it when the main thread blocks the signal, so a blocked mask held nothing (the stop came at once).
    done = threading.Event()

    def idle() -> None:
        while not done.is_set():
            time.sleep(0.01)

    other = threading.Thread(target=idle, daemon=True)
    other.start()
    time.sleep(0.05)
    try:
        assert main() == 130 and reached == ["the rest of the block"]
    finally:
        done.set()
    assert capsys.readouterr().err == "stopped by SIGINT; rerun it\n"


# ---- real commands, signalled while they work ----------------------------------------------------------------


@pytest.fixture(scope="module")
def captioning(data, tmp_path_factory, one_torch_thread):
    """A 1-step checkpoint, a pairs.csv of 16 pairs and an uninterrupted run's JSONL (as in tests/test_faults.py)."""
    from davir.cli import caption as caption_cli

    folder = tmp_path_factory.mktemp("captioning")
    _, pairs = tiny_caption_run(data, folder, pairs=16)

    def argv(out: Path, workers: int) -> list[str]:
        return [
            "--checkpoint",
            str(folder / "run"),
            "--pairs",
            str(pairs),
            "--out",
            str(out),
            "--batch-size",
            "2",
            "--workers",
            str(workers),
            "--quiet",
        ]

    reference = folder / "reference" / "c.jsonl"
    assert caption_cli.main(argv(reference, 0)) == 0
    return argv, reference


@pytest.mark.faults
@pytest.mark.slow  # fresh caption.py processes stopped and resumed: 30 s of CPU
def test_caption_stopped_by_sigterm_ends_its_worker_and_resumes_byte_identical(captioning, tmp_path):
    from davir.cli import caption as caption_cli

    argv, reference = captioning
    out = tmp_path / "c.jsonl"
    status, stderr, descendants = stop_while_working(
        ["caption.py", *argv(out, 1)], lambda: out.is_file() and out.stat().st_size > 0, signal.SIGTERM, tmp_path
    )
    assert descendants, "no DataLoader worker was running: nothing was tested"
    assert_stopped_cleanly(status, stderr, descendants, signal.SIGTERM)
    assert_whole_lines(out)
    assert len(out.read_text().splitlines()) < 16
    assert caption_cli.main(argv(out, 0)) == 0  # the rerun, in this process (a worker fork of pytest is not needed)
    assert out.read_bytes() == reference.read_bytes()
    no_temporaries(tmp_path)


@pytest.mark.faults
@pytest.mark.slow  # a fresh train.py stopped and resumed beside the in-process runs: 20 s of CPU
@pytest.mark.usefixtures("one_torch_thread")  # the in-process runs compute as the 1-thread command does (ENV)
def test_training_stopped_by_sigterm_resumes_loss_for_loss(data, tmp_path, losses_of):
    from davir.cli import train as train_cli

    def overrides(out: Path, workers: int) -> list[str]:
        return [
            f"data.root={data}",
            "data.masks=null",
            "data.entities=null",
            f"data.num_workers={workers}",
            "model.fac.lambda_attn=0",
            "model.epc.use_entities=false",
            "model.preset_overrides={vision_layers: 1, qformer_layers: 1, text_layers: 1}",
            "optim.batch_size=2",
            "optim.max_steps=3",
            "run.log_every=1",
            "run.save_every=1",
            "run.eval_every=0",
            "run.val_max_pairs=2",
            "run.tensorboard=false",
            f"run.output_dir={out}",
        ]

    assert train_cli.main(overrides(tmp_path / "reference", 0)) == 0
    out = tmp_path / "stopped"
    status, stderr, descendants = stop_while_working(  # one loader worker, so there is a child to end
        ["train.py", *overrides(out, 1)],
        (out / "checkpoints" / "step_1" / "COMPLETE").is_file,
        signal.SIGTERM,
        tmp_path,
    )
    assert descendants, "no DataLoader worker was running: nothing was tested"
    assert_stopped_cleanly(
        status,
        stderr,
        descendants,
        signal.SIGTERM,
        rerun="rerun with --resume to continue from the last complete checkpoint",
    )
    assert_whole_lines(out / "train_log.jsonl")
    assert train_cli.main([*overrides(out, 0), "--resume"]) == 0  # data.num_workers may differ on resume
    want, got = losses_of(tmp_path / "reference"), losses_of(out)
    assert sorted(got) == sorted(want) == [1, 2, 3]
    assert [got[s] for s in sorted(got)] == pytest.approx([want[s] for s in sorted(want)], rel=1e-5, abs=1e-6)


@pytest.mark.faults
@pytest.mark.parametrize(
    "signum, whole_group", [(signal.SIGTERM, False), (signal.SIGINT, True)], ids=["sigterm", "ctrl-c"]
)
def test_masks_stopped_ends_its_pool_and_resumes_byte_identical(data, tmp_path, signum, whole_group):
    from davir.jobs import masks as masks_job

    argv = lambda out, workers: [
        "--format",
        "clevr_change",
        "--root",
        str(data),
        "--split",
        "test",
        "--out",  # noqa: E731
        str(out),
        "--no-progress",
        "--workers",
        str(workers),
    ]
    assert masks_job.main(argv(tmp_path / "reference", 1)) == 0
    out = tmp_path / "stopped"
    status, stderr, descendants = stop_while_working(
        ["-m", "preprocess", "masks", *argv(out, 2)],
        lambda: any((out / "masks").glob("*.json")),
        signum,
        tmp_path,
        whole_group=whole_group,
    )
    assert descendants, "no pool worker was running: nothing was tested"
    assert_stopped_cleanly(status, stderr, descendants, signum)
    # a pool worker ended mid-pair leaves a temporary as a kill does; the rerun removes it
    assert masks_job.main(argv(out, 1)) == 0
    no_temporaries(out)
    assert tree(out / "masks") == tree(tmp_path / "reference" / "masks")


def test_the_resource_sharer_thread_traceback_of_a_stopped_worker_is_not_printed(capsys):
    """A SIGTERM to the process group ends the DataLoader workers first; multiprocessing's resource-sharer thread
    then prints a connection traceback through sys.excepthook. A stoppable main hides exactly that one."""
    import multiprocessing.resource_sharer as sharer

    from davir.runtime.signals import stop_on_signals

    def raise_in(filename: str, error: BaseException):
        code = compile("raise error", filename, "exec")
        try:
            exec(code, {"error": error})
        except BaseException as caught:  # noqa: BLE001 - the traceback is what is tested
            return type(caught), caught, caught.__traceback__

    from_sharer = raise_in(sharer.__file__, ConnectionResetError("reset by peer"))
    elsewhere = raise_in("/somewhere/else.py", ConnectionResetError("a real one"))

    @stop_on_signals()
    def main() -> int:
        sys.excepthook(*from_sharer)
        sys.excepthook(*elsewhere)
        return 0

    hook = sys.excepthook
    assert main() == 0 and sys.excepthook is hook
    err = capsys.readouterr().err
    assert "reset by peer" not in err and "a real one" in err


def test_a_dataloader_worker_killed_by_the_stop_signal_is_a_stop_not_a_traceback(capsys):
    """A SIGTERM to the process group ends the DataLoader workers too; torch's SIGCHLD handler can then raise
    "DataLoader worker … is killed by signal: Terminated." in the main thread before the main's own SIGTERM is
    handled. That is the same stop: exit 143 with the one-line hint. Any other RuntimeError goes through."""
    from davir.runtime.signals import stop_on_signals

    @stop_on_signals()
    def stopped() -> int:
        raise RuntimeError(f"DataLoader worker (pid 28996) is killed by signal: {signal.strsignal(signal.SIGTERM)}. ")

    @stop_on_signals()
    def broken() -> int:
        raise RuntimeError(f"DataLoader worker (pid 28996) is killed by signal: {signal.strsignal(signal.SIGSEGV)}. ")

    assert stopped() == 143
    assert capsys.readouterr().err.strip() == "stopped by SIGTERM; rerun the same command to resume"
    with pytest.raises(RuntimeError, match="Segmentation fault"):
        broken()
