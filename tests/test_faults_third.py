"""Issue 49 (faults, third pass), the app's, captioning's and preprocessing's cases: damaged merged weights and
pickles (§8), a device the machine lacks (§9), an unwritable leaderboard output (§10), the app on the network
(§13), DataLoader workers outliving a SIGKILLed caption.py (§16), uploads left behind (§17), a resumed masks
manifest's counts (§18). Each is a command as a user runs it: one line and exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gradio  # noqa: F401 - before any app here sets GRADIO_TEMP_DIR: gradio keeps a few folders read at import
import pytest
from PIL import Image

from tests.test_faults import ENV, REPO
from tests.test_faults_signals import _alive, _children

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY_BLIP = REPO / "assets" / "tiny_instructblip"


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    """A tiny DAVIR model (random LoRA over the tiny InstructBLIP) exported with --merge, and 24 small pairs."""
    from davir.cli import export as export_script
    from davir.models.vlm.build import build_davir_model
    from davir.models.vlm.config import DavirModelConfig
    from davir.models.vlm.epc import EpcConfig

    work = tmp_path_factory.mktemp("merged")
    config = DavirModelConfig(family="instructblip", pretrained=str(TINY_BLIP), epc=EpcConfig(use_entities=False))
    build_davir_model(config).eval().save_pretrained(work / "model")
    assert export_script.main(["--checkpoint", str(work / "model"), "--out", str(work / "merged"), "--merge"]) == 0
    for side in ("before", "after"):
        (work / "pairs" / side).mkdir(parents=True)
    for i in range(24):
        before = Image.new("RGB", (64, 48), (200, 20 + 8 * i, 20))
        after = before.copy()
        after.paste((20, 200, 20), (4 + i, 8, 24 + i, 28))
        before.save(work / "pairs" / "before" / f"p{i:02d}.png")
        after.save(work / "pairs" / "after" / f"p{i:02d}.png")
    return work


def damaged_copy(merged: Path, folder: Path, kind: str) -> tuple[Path, Path]:
    """A copy of the merged export whose weights are cut in half, or a pickled .bin holding more than tensors;
    returns (the folder, the damaged file)."""
    import datetime

    import torch

    shutil.copytree(merged / "merged", folder)
    weights = folder / "model.safetensors"
    if kind == "truncated":
        with open(weights, "r+b") as handle:
            handle.truncate(weights.stat().st_size // 2)
        return folder, weights
    weights.unlink()
    torch.save({"weight": torch.zeros(2), "when": datetime.date(2020, 1, 1)}, folder / "pytorch_model.bin")
    return folder, folder / "pytorch_model.bin"


# ---- §8 damaged weights: caption.py, davir-app and the compare tab -----------------------------------------------


@pytest.mark.parametrize("kind", ["truncated", "pickle"])
def test_damaged_merged_weights_are_one_line_naming_the_file(merged, tmp_path, kind, capsys):
    from davir.cli import app as app_script
    from davir.cli import caption as caption_script

    folder, damaged = damaged_copy(merged, tmp_path / "export", kind)
    status = caption_script.main(
        [
            "--checkpoint",
            str(folder),
            "--pairs",
            str(merged / "pairs"),
            "--out",
            str(tmp_path / "c.jsonl"),
            "--workers",
            "0",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert status == 2 and len(error_lines(err)) == 1, err[-2000:]
    line = error_lines(err)[0]
    assert line.startswith(f"error: {damaged}: ") and "Traceback" not in err
    assert "weights_only" not in err  # torch's advice to unpickle anyway is not passed on
    assert ("truncated" in line) if kind == "truncated" else ("refused: a pickle" in line)
    assert (
        app_script.main(["--checkpoint", str(folder), "--port", str(free_port()), "--device", "cpu"], block=False) == 2
    )
    assert error_lines(capsys.readouterr().err) == [line]


@pytest.fixture(scope="module")
def app(merged):
    """davir-app on the merged export, with a login, on 127.0.0.1; yields (url, demo)."""
    from davir.cli import app as app_script

    demo, url = app_script.main(
        ["--checkpoint", str(merged / "merged"), "--port", str(free_port()), "--device", "cpu", "--auth", "ann:s3cret"],
        block=False,
    )
    yield url, demo
    demo.close()


@pytest.fixture(scope="module")
def client(app, tmp_path_factory):
    from gradio_client import Client

    # the client's downloads in a folder of the test (by default it takes GRADIO_TEMP_DIR: the app's own here)
    return Client(app[0], auth=("ann", "s3cret"), verbose=False, download_files=str(tmp_path_factory.mktemp("dl")))


def test_the_compare_tab_names_a_damaged_model_b_without_a_traceback(merged, app, client, tmp_path, capfd):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    folder, damaged = damaged_copy(merged, tmp_path / "export", "truncated")
    before, after = (merged / "pairs" / side / "p00.png" for side in ("before", "after"))
    with pytest.raises(AppError) as raised:
        client.predict(
            handle_file(str(before)), handle_file(str(after)), str(merged / "merged"), str(folder), api_name="/compare"
        )
    assert str(raised.value).startswith(f"model B: {damaged}: cannot load the model weights (SafetensorError")
    assert "Traceback" not in capfd.readouterr().err


# ---- §9 a device the machine lacks ------------------------------------------------------------------------------


def test_app_device_the_machine_lacks_is_one_line(merged, monkeypatch, capsys):
    import torch

    from davir.cli import app as app_script

    argv = ["--checkpoint", str(merged / "merged"), "--port", str(free_port())]
    assert app_script.main([*argv, "--device", "tpu"], block=False) == 2
    assert error_lines(capsys.readouterr().err) == [
        "error: --device tpu: not a device name; use cpu, cuda or cuda:N (a GPU index)"
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA, wherever this runs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert app_script.main([*argv, "--device", "cuda"], block=False) == 2
    assert error_lines(capsys.readouterr().err) == [
        "error: --device cuda: this machine has no CUDA GPU that torch can use; use --device cpu"
    ]
    from davir.errors import DataError
    from davir.inference import ChangeCaptioner
    from davir.inference.captioner import check_device

    with pytest.raises(DataError, match="^--device tpu: not a device name"):  # the Python API checks it too
        ChangeCaptioner.from_pretrained(merged / "merged", device="tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(DataError, match=r"^--device cuda:3: this machine has 2 CUDA GPU\(s\), cuda:0 to cuda:1$"):
        check_device("cuda:3")
    assert check_device("cuda:1") == torch.device("cuda", 1) and check_device("cpu") == torch.device("cpu")


# ---- §10 the leaderboard's --out ------------------------------------------------------------------------------------


def test_leaderboard_out_that_cannot_be_written_is_one_line(tmp_path, make_read_only, capsys):
    from davir.cli.compare import main

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder\n")
    assert main(["--leaderboard", "levir_cc", "--out", str(blocker / "table.md")]) == 2
    assert error_lines(capsys.readouterr().err) == [
        f"error: --out {blocker / 'table.md'} cannot be written: {blocker} is a file, not a folder"
    ]
    (tmp_path / "locked").mkdir()
    make_read_only(tmp_path / "locked")
    assert main(["--leaderboard", "levir_cc", "--out", str(tmp_path / "locked" / "table.md")]) == 2
    err = capsys.readouterr().err
    assert (
        error_lines(err)
        == [
            f"error: --out {tmp_path / 'locked' / 'table.md'} is not writable: permission "
            f"denied in {tmp_path / 'locked'}"
        ]
        and "Traceback" not in err
    )


# ---- §13 the app on the network ---------------------------------------------------------------------------------


def test_app_beyond_loopback_warns_and_passes_auth(monkeypatch, capsys, tmp_path):
    """What `davir-app` hands to the server, without listening anywhere (start is replaced)."""
    from davir.app import serve
    from davir.cli import app as app_script

    started = []
    monkeypatch.setattr(serve, "start", lambda checkpoint, **kwargs: started.append(kwargs) or ("demo", "url"))
    monkeypatch.delenv(app_script.AUTH_VARIABLE, raising=False)
    run = str(tmp_path)
    assert app_script.main(["--checkpoint", run, "--host", "0.0.0.0"], block=False) == ("demo", "url")
    err = capsys.readouterr().err
    assert err.startswith(
        "warning: --host 0.0.0.0 serves the page to the network, to anyone who can reach port "
        "7860; pass --auth USER:PASSWORD to ask for a login: its browse and compare tabs open "
        "any file and folder this account can read"
    )
    assert started[-1]["host"] == "0.0.0.0" and started[-1]["auth"] is None
    assert app_script.main(["--checkpoint", run, "--host", "0.0.0.0", "--auth", "ann:pa:ss"], block=False)
    assert "to whoever logs in with --auth:" in capsys.readouterr().err and started[-1]["auth"] == ("ann", "pa:ss")
    monkeypatch.setenv(app_script.AUTH_VARIABLE, "bob:pw")  # kept out of the process list
    assert app_script.main(["--checkpoint", run, "--host", "::1"], block=False)
    assert capsys.readouterr().err == "" and started[-1]["auth"] == ("bob", "pw")  # loopback: no warning
    assert app_script.main(["--checkpoint", run], block=False) and started[-1]["host"] == "127.0.0.1"
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit) as raised:
        app_script.main(["--checkpoint", run, "--auth", "nopassword"], block=False)
    assert raised.value.code == 2 and "expected USER:PASSWORD" in capsys.readouterr().err


def test_app_with_auth_refuses_a_request_without_the_login(app, client, merged):
    import urllib.error
    import urllib.request

    from gradio_client import handle_file

    url, _ = app
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url.rstrip("/") + "/config", timeout=30)
    assert refused.value.code == 401
    before, after = (merged / "pairs" / side / "p01.png" for side in ("before", "after"))
    caption, *_ = client.predict(handle_file(str(before)), handle_file(str(after)), api_name="/caption")
    assert caption  # with the login, the page captions


# ---- §17 uploads go with the app ----------------------------------------------------------------------------------


def test_the_apps_uploads_are_in_a_folder_of_its_own_removed_when_it_closes(app, client, merged):
    from gradio_client import handle_file

    url, demo = app
    folder = demo.upload_folder
    assert folder.name.startswith("davir-app-") and os.environ["GRADIO_TEMP_DIR"] == str(folder)
    before, after = (merged / "pairs" / side / "p02.png" for side in ("before", "after"))
    client.predict(handle_file(str(before)), handle_file(str(after)), api_name="/caption")
    assert {p.name for p in folder.rglob("*.png")} >= {"p02.png"}  # the uploads, and the overlays shown
    previous = os.environ.get("GRADIO_TEMP_DIR")
    demo.close()  # the last test of this module's app
    assert not folder.exists() and os.environ.get("GRADIO_TEMP_DIR") != str(folder)
    assert previous == str(folder)


@pytest.mark.faults
@pytest.mark.slow  # a fresh davir-app serving a caption, twice: one to two minutes of CPU
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_davir_app_stopped_leaves_no_upload_behind(merged, tmp_path, signum):
    """The command as a user runs it, GRADIO_TEMP_DIR pointed at an empty folder: after a caption and a stop,
    the folder is empty again (a SIGKILLed app's folder is removed by the next start)."""
    from gradio_client import Client, handle_file

    temp = tmp_path / "gradio"
    temp.mkdir()
    port = free_port()
    log = tmp_path / "app.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "davir.cli.app",
                "--checkpoint",
                str(merged / "merged"),
                "--port",
                str(port),
                "--device",
                "cpu",
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**ENV, "GRADIO_TEMP_DIR": str(temp)},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while "davir-app: http" not in log.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert process.poll() is None, log.read_text()[-3000:]
        before, after = (merged / "pairs" / side / "p03.png" for side in ("before", "after"))
        Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=str(tmp_path)).predict(
            handle_file(str(before)), handle_file(str(after)), api_name="/caption"
        )
        assert any(p.name == "p03.png" for p in temp.rglob("*"))  # uploaded into the run's folder
        process.send_signal(signum)
        assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert list(temp.iterdir()) == [], log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()


def test_a_killed_apps_upload_folder_is_removed_by_the_next_start(tmp_path, monkeypatch):
    import socket

    from davir.app import serve

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    stale = tmp_path / f"davir-app-{int(dead.stdout)}@{host}-abc"
    kept = [
        tmp_path / f"davir-app-{os.getpid()}@{host}-live",
        tmp_path / f"davir-app-{int(dead.stdout)}@elsewhere-x",
        tmp_path / "someone-elses",
    ]
    for folder in [stale, *kept]:
        (folder / "upload").mkdir(parents=True)
    folder, previous = serve._own_upload_folder()
    assert not stale.exists() and all(k.is_dir() for k in kept) and folder.parent == tmp_path
    assert os.environ["GRADIO_TEMP_DIR"] == str(folder) and previous == str(tmp_path)
    serve._remove_upload_folder(folder, previous)
    assert not folder.exists() and os.environ["GRADIO_TEMP_DIR"] == str(tmp_path)


# ---- §16 DataLoader workers die with a SIGKILLed caption.py ----------------------------------------------------


@pytest.mark.faults
@pytest.mark.slow  # a fresh caption.py with DataLoader workers, SIGKILLed: 30 s of CPU
def test_caption_workers_end_with_a_sigkilled_parent(merged, tmp_path):
    out = tmp_path / "c.jsonl"
    process = subprocess.Popen(
        [
            sys.executable,
            "caption.py",
            "--checkpoint",
            str(merged / "merged"),
            "--pairs",
            str(merged / "pairs"),
            "--out",
            str(out),
            "--batch-size",
            "1",
            "--workers",
            "2",
            "--quiet",
        ],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while not (out.is_file() and out.stat().st_size) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.poll() is None, "caption.py ended before the kill: nothing was tested"
        workers += _children(process.pid)
        assert len(workers) >= 2, workers
        process.send_signal(signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 3  # the kernel ends them at once; torch's own check would take 5 s or more
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in workers if _alive(pid)] == [], "DataLoader workers outlived the killed caption.py"
    finally:  # what a failing run leaves (the orphaned workers included) goes
        for pid in {process.pid, *workers, *_children(process.pid)}:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.wait()


def test_die_with_parent_ends_a_worker_whose_parent_is_gone_before_it_starts(tmp_path):
    """The worker initialiser run by a process whose parent already ended: it exits at once."""
    marks = tmp_path / "marks.txt"
    code = (
        "import os, sys, time\n"
        "from davir.runtime.orphans import DieWithParent\n"
        "init = DieWithParent()\n"
        "if os.fork():\n    os._exit(0)\n"  # the parent leaves; the child was made with its pid
        "time.sleep(0.5)\n"
        f"open({str(marks)!r}, 'a').write('started\\n')\n"
        "init(0)\n"
        f"open({str(marks)!r}, 'a').write('still alive\\n')\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, timeout=60, check=True)
    deadline = time.monotonic() + 10
    while "started" not in (marks.read_text() if marks.is_file() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert marks.read_text() == "started\n"


# ---- §18 a resumed masks run's manifest counts the cache --------------------------------------------------------


def test_resumed_masks_manifest_counts_every_pair_of_the_cache(synthetic_set, tmp_path):
    from davir.jobs import masks as masks_job

    data = synthetic_set(16, 3, width=64, height=48, val_fraction=0.1, test_fraction=0.3)
    common = ["--format", "clevr_change", "--root", str(data), "--split", "train", "--workers", "1", "--no-progress"]
    assert masks_job.main([*common, "--out", str(tmp_path / "one")]) == 0
    assert masks_job.main([*common, "--out", str(tmp_path / "resumed"), "--limit", "4"]) == 0
    assert masks_job.main([*common, "--out", str(tmp_path / "resumed")]) == 0
    one, resumed = (
        json.loads((tmp_path / name / "manifest.json").read_text())["counts"] for name in ("one", "resumed")
    )
    assert resumed["reused"] == 4 and resumed["computed"] == one["pairs"] - 4 and one["reused"] == 0
    cache = {key: resumed[key] for key in ("pairs", "in_cache", "empty_masks", "clusters", "kept_after", "kept_before")}
    assert cache == {key: one[key] for key in cache} and one["clusters"] > 0
