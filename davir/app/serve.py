"""Build the app over a loaded model and serve it: what `davir-app` runs, and what tests start in-process.

    demo, url = start("runs/demo", port=7860, block=False)   # returns once the page answers
    demo.close()                                            # also removes this run's upload folder

Telemetry, upload limits and the upload folder: docs/recipes.md, "Look at a model in a browser".
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from davir.inference.captioner import CaptionerOptions

UPLOADS_PREFIX = "davir-app-"
DELETE_CACHE = (3600, 86400)  # Gradio's delete_cache: every hour, files older than a day go (a long-running app)


def start(
    checkpoint: str,
    *,
    compare: str | None = None,
    captions: str | None = None,
    host: str = "127.0.0.1",
    port: int = 7860,
    options: CaptionerOptions | None = None,
    max_upload_mb: int = 100,
    block: bool = True,
    quiet: bool = False,
    auth: tuple[str, str] | None = None,
):
    """(the Gradio Blocks, its local URL); with `block` serve until interrupted (Ctrl-C) first. `auth`: the
    (user, password) the page asks for (Gradio's login)."""
    started = time.perf_counter()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # read when gradio is imported
    uploads, previous = _own_upload_folder()
    try:
        from davir.app.models import ModelShelf
        from davir.app.ui import build_app

        demo = build_app(
            ModelShelf(options),
            checkpoint=str(checkpoint),
            compare=compare,
            captions=captions,
            delete_cache=DELETE_CACHE,
        )
        demo.queue(default_concurrency_limit=2)
        demo.launch(
            server_name=host,
            server_port=port,
            prevent_thread_lock=True,
            quiet=True,
            show_error=True,
            max_file_size=f"{max_upload_mb}mb",
            ssr_mode=False,
            footer_links=["api"],
            auth=auth,
        )
    except BaseException:
        _remove_upload_folder(uploads, previous)
        raise
    close = demo.close

    def close_and_clean(*args, **kwargs) -> None:  # the uploads go with the server, however it is closed
        try:
            close(*args, **kwargs)
        finally:
            _remove_upload_folder(uploads, previous)

    demo.close = close_and_clean
    demo.upload_folder = uploads
    url = demo.local_url
    if not quiet:
        cpu = time.process_time()  # this process's CPU seconds since it started (imports and model load included)
        print(
            f"davir-app: {url} (model {checkpoint}; ready in {time.perf_counter() - started:.1f} s, "
            f"{cpu:.1f} s of CPU since the process started; Ctrl-C stops it)",
            flush=True,
        )
    if block:
        try:
            demo.block_thread()
        finally:
            demo.close()
    return demo, url


def _own_upload_folder() -> tuple[Path, str | None]:
    """A new folder for this run's uploads, made Gradio's (GRADIO_TEMP_DIR, read when it stores or checks a file);
    returns it and the variable's previous value. Folders of earlier runs whose process is gone are removed."""
    previous = os.environ.get("GRADIO_TEMP_DIR")
    parent = Path(previous or tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()  # the folder may be shared by machines: only this one's pids can be checked
    for stale in parent.glob(f"{UPLOADS_PREFIX}*@{host}-*"):
        pid = stale.name[len(UPLOADS_PREFIX) :].split("@", 1)[0]
        if pid.isdigit() and not _running(int(pid)) and stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{UPLOADS_PREFIX}{os.getpid()}@{host}-", dir=parent))
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    return folder, previous


def _remove_upload_folder(folder: Path, previous: str | None) -> None:
    if os.environ.get("GRADIO_TEMP_DIR") == str(folder):
        if previous is None:
            os.environ.pop("GRADIO_TEMP_DIR", None)
        else:
            os.environ["GRADIO_TEMP_DIR"] = previous
    shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
