"""A headless Chromium driven over its DevTools protocol (CDP): how the tests and the screenshots use the app.

    with Chromium() as browser:                       # Debian's `chromium` (or $CHROMIUM), a fresh profile
        browser.open("http://127.0.0.1:7860")
        browser.upload("#before input[type=file]", "before.png")
        browser.click("#caption-button")
        caption = browser.wait_for("document.querySelector('#caption textarea').value")

No browser download and no driver binary: docs/recipes.md, "Look at a model in a browser".
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

EXECUTABLES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str | None:
    """$CHROMIUM, else the first Chromium on PATH, else None."""
    configured = os.environ.get("CHROMIUM")
    if configured:
        return shutil.which(configured) or (configured if Path(configured).is_file() else None)
    return next((found for found in map(shutil.which, EXECUTABLES) if found), None)


class BrowserError(RuntimeError):
    pass


class Chromium:
    """One headless Chromium with one page; `open`, `evaluate`, `wait_for`, `upload`, `click`, `screenshot`."""

    def __init__(
        self, executable: str | None = None, *, width: int = 1280, height: int = 900, start_timeout: float = 30.0
    ):
        from websockets.sync.client import connect

        executable = executable or chromium_path()
        if executable is None:
            raise BrowserError("no Chromium found (apt-get install chromium, or set CHROMIUM=/path/to/chrome)")
        self.profile = Path(tempfile.mkdtemp(prefix="davir-chromium-"))
        self.log = open(self.profile / "chromium.log", "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [
                executable,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--mute-audio",
                "--hide-scrollbars",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self._ids = itertools.count(1)
        self._connection = contextlib.ExitStack()
        try:
            port = self._devtools_port(start_timeout)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
                targets = json.load(response)
            page = next(t for t in targets if t.get("type") == "page")
            self.socket = self._connection.enter_context(
                connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=start_timeout)
            )
            self.send("Page.enable")
            self.send("Runtime.enable")
            self.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
        except BaseException:
            self.close()
            raise

    def _devtools_port(self, timeout: float) -> int:
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrowserError(f"Chromium exited ({self.process.returncode}): {self._log_tail()}")
            if marker.is_file():
                lines = marker.read_text().split()
                if lines and lines[0].isdigit():
                    return int(lines[0])
            time.sleep(0.05)
        raise BrowserError(f"Chromium did not open its DevTools port in {timeout:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        self.log.flush()
        return (self.profile / "chromium.log").read_text(errors="replace")[-2000:]

    # ------------------------------------------------------------------------------------------ protocol
    def send(self, method: str, params: dict | None = None, timeout: float = 60.0) -> dict:
        """One CDP command; its result (events arriving meanwhile are dropped)."""
        message_id = next(self._ids)
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no answer in {timeout:.0f} s")
            message = json.loads(self.socket.recv(timeout=left))
            if message.get("id") == message_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error'].get('message')}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, interval: float = 0.1):
        """Poll a JavaScript expression until it is neither null, false, "" nor 0; its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except BrowserError:
                value = None
            if value not in (None, False, "", 0):  # an element comes back as {}: found
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"waited {timeout:.0f} s for: {expression}")
            time.sleep(interval)

    # ------------------------------------------------------------------------------------------ actions
    def open(self, url: str, timeout: float = 30.0) -> None:
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'", timeout)

    def upload(self, selector: str, path: str | Path) -> None:
        """Give a file input (a CSS selector) a file, as a user picking it does (input and change events)."""
        root = self.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
        node = self.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        if not node:
            raise BrowserError(f"no element matches {selector}")
        self.send("DOM.setFileInputFiles", {"nodeId": node, "files": [str(Path(path).resolve())]})

    def click(self, selector: str) -> None:
        if not self.evaluate(f"(e => e ? (e.click(), true) : false)(document.querySelector({json.dumps(selector)}))"):
            raise BrowserError(f"no element matches {selector}")

    def click_text(self, selector: str, text: str) -> None:
        """Click the first element matching `selector` whose text starts with `text` (a tab's button)."""
        script = (
            f"(e => e ? (e.click(), true) : false)([...document.querySelectorAll({json.dumps(selector)})]"
            f".find(e => e.textContent.trim().startsWith({json.dumps(text)})))"
        )
        if not self.evaluate(script):
            raise BrowserError(f"no {selector} reads {text!r}")

    def screenshot(self, path: str | Path, *, full_page: bool = True) -> Path:
        """A PNG of the page (the whole page's height when `full_page`)."""
        params: dict = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params.update(
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
            )
        data = base64.b64decode(self.send("Page.captureScreenshot", params)["data"])
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    # ------------------------------------------------------------------------------------------ lifetime
    def close(self) -> None:
        try:
            self._connection.close()
        except Exception:  # noqa: BLE001 - closing a browser that is already gone
            pass
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
