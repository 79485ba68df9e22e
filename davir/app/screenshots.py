"""The README's pictures of the app: one screenshot a tab, taken in headless Chromium (docs/images/app_*.png).

    python -m davir.cli.screenshots --checkpoint runs/demo --compare runs/lightweight_demo/dirl_ccr/seed0 \
        --captions outputs/demo/captions.jsonl --before B.png --after A.png --out docs/images

Starts the app on a free port, uploads the pair in the caption and compare tabs, opens the captions in the browse
tab (its word filter set by --word), and writes app_caption.png, app_browse.png and app_compare.png, each
reduced to a 256-colour palette (a page is mostly flat colour) to stay small.
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from pathlib import Path

from PIL import Image

from davir.io import atomic_path

IMAGES_LOADED = (
    "[...document.querySelectorAll('{0} img')].length > 0 && "
    "[...document.querySelectorAll('{0} img')].every(i => i.complete && i.naturalWidth > 0)"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _small_png(shot: Path, path: Path) -> Path:
    """`shot` reduced to a 256-colour palette, written atomically to `path` (a picture of the repository's docs
    is never left half written)."""
    with Image.open(shot) as image, atomic_path(path) as tmp:
        image.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(
            tmp, format="PNG", optimize=True
        )
    return path


def take(url: str, out: Path, before: Path, after: Path, *, word: str = "", width: int = 1280) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".screenshots.", dir=out))
    try:
        return [
            _small_png(shot, out / shot.name) for shot in _take(url, staging, before, after, word=word, width=width)
        ]
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _take(url: str, out: Path, before: Path, after: Path, *, word: str, width: int) -> list[Path]:
    from davir.app.browser import Chromium

    shots = []
    with Chromium(width=width, height=900) as browser:
        browser.open(url)
        browser.wait_for("!!document.querySelector('#before input[type=file]')")
        browser.upload("#before input[type=file]", before)
        browser.upload("#after input[type=file]", after)
        browser.wait_for(IMAGES_LOADED.format("#before") + " && " + IMAGES_LOADED.format("#after"))
        browser.click("#caption-button")
        browser.wait_for("document.querySelector('#caption textarea').value", timeout=120)
        browser.wait_for(IMAGES_LOADED.format("#attention-after") + " && " + IMAGES_LOADED.format("#mask-before"))
        shots.append(browser.screenshot(out / "app_caption.png"))

        browser.click_text("button[role=tab]", "Browse captions")
        if word:
            browser.evaluate(
                f"(e => {{ e.value = {json.dumps(word)}; e.dispatchEvent(new Event('input')); }})"
                "(document.querySelector('#word textarea, #word input'))"
            )
        browser.click("#browse-button")
        browser.wait_for(
            "(e => e && e.innerText.includes('match'))(document.querySelector('#browse-summary'))", timeout=60
        )
        browser.wait_for("document.querySelectorAll('#strips img').length > 0")
        # The gallery's images load lazily, when scrolled near: with 48 strips the middle ones never loaded
        browser.evaluate("document.querySelectorAll('#strips img').forEach(i => { i.loading = 'eager'; })")
        browser.wait_for(IMAGES_LOADED.format("#strips"))
        shots.append(browser.screenshot(out / "app_browse.png"))

        browser.click_text("button[role=tab]", "Compare two models")
        browser.wait_for("!!document.querySelector('#compare-before input[type=file]')")
        browser.upload("#compare-before input[type=file]", before)
        browser.upload("#compare-after input[type=file]", after)
        browser.wait_for(IMAGES_LOADED.format("#compare-before") + " && " + IMAGES_LOADED.format("#compare-after"))
        browser.click("#compare-button")
        browser.wait_for("document.querySelector('#caption-b textarea').value", timeout=120)
        browser.wait_for(IMAGES_LOADED.format("#strip-a") + " && " + IMAGES_LOADED.format("#strip-b"))
        shots.append(browser.screenshot(out / "app_compare.png"))
    return shots


def screenshots(
    checkpoint: str | Path,
    *,
    compare: str | Path,
    captions: str | Path,
    before: Path,
    after: Path,
    out: Path,
    word: str = "",
) -> list[Path]:
    """Start the app on a free port over `checkpoint` (B: `compare`, browse tab: `captions`), take the three
    pictures into `out`, stop the app; the paths written."""
    from davir.app.serve import start

    demo, url = start(checkpoint, compare=compare, captions=captions, port=_free_port(), block=False)
    try:
        return take(url, Path(out), Path(before), Path(after), word=word)
    finally:
        demo.close()
