"""Build the app over a loaded model and serve it: what `davir-app` runs, and what tests start in-process.

    demo, url = start("runs/demo", port=7860, block=False)   # returns once the page answers
    demo.close()

The model is loaded before the server starts, so the first caption costs no load. Gradio's telemetry and
server-side rendering are off (the machine may have no network and no Node); uploads larger than
`max_upload_mb` are refused by Gradio before they are stored.
"""

from __future__ import annotations

import os
import time

from davir.inference.captioner import CaptionerOptions


def start(checkpoint: str, *, compare: str | None = None, captions: str | None = None, host: str = "127.0.0.1",
          port: int = 7860, options: CaptionerOptions | None = None, max_upload_mb: int = 100,
          block: bool = True, quiet: bool = False, auth: tuple[str, str] | None = None):
    """(the Gradio Blocks, its local URL); with `block` serve until interrupted (Ctrl-C) first. `auth`: the
    (user, password) the page asks for (Gradio's login)."""
    started = time.perf_counter()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # read when gradio is imported
    from davir.app.models import ModelShelf
    from davir.app.ui import build_app

    demo = build_app(ModelShelf(options), checkpoint=str(checkpoint), compare=compare, captions=captions)
    demo.queue(default_concurrency_limit=2)
    demo.launch(server_name=host, server_port=port, prevent_thread_lock=True, quiet=True, show_error=True,
                max_file_size=f"{max_upload_mb}mb", ssr_mode=False, footer_links=["api"], auth=auth)
    url = demo.local_url
    if not quiet:
        cpu = time.process_time()  # this process's CPU seconds since it started (imports and model load included)
        print(f"davir-app: {url} (model {checkpoint}; ready in {time.perf_counter() - started:.1f} s, "
              f"{cpu:.1f} s of CPU since the process started; Ctrl-C stops it)", flush=True)
    if block:
        try:
            demo.block_thread()
        finally:
            demo.close()
    return demo, url
