"""caption.py's paginated report: a short report on its index page, the strip's columns labelled."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from davir.app.browser import Chromium, chromium_path
from davir.viz.folder_report import PAGE_SIZE, compose_strip, strip_labels, write_folder_report, write_strip
from davir.viz.report import TILE_LABELS


def _report(tmp_path, captioned: int, failed: int = 0, *, mask=True, attention=True, limit=1000):
    """A JSONL as caption.py writes it, strips for the captioned pairs, and the report written from them."""
    image = Image.new("RGB", (32, 24), (10, 120, 200))
    report_dir = tmp_path / "report_files"
    rows = []
    for i in range(captioned + failed):
        if i < captioned:
            write_strip(
                report_dir,
                i,
                image,
                image,
                mask=np.ones((24, 32), bool) if mask else None,
                attention=(np.eye(4), np.eye(4)) if attention else None,
            )
            rows.append(
                {"id": f"p{i}", "index": i, "caption": f"caption {i}", "entities": [["red cube", 0.9]], "error": None}
            )
        else:
            rows.append(
                {"id": f"bad{i}", "index": i, "caption": None, "entities": [], "error": "image file is corrupt"}
            )
    jsonl = tmp_path / "captions.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = write_folder_report(tmp_path / "report.html", jsonl, report_dir, title="t", summary={}, limit=limit)
    return html.read_text(), report_dir


def test_a_short_report_shows_its_pairs_on_the_index_page(tmp_path):
    text, report_dir = _report(tmp_path, 3, failed=1)
    assert all(f'id="p{i}"' in text for i in range(3)) and "caption 2" in text
    assert "page-0001.html" not in text and not list(report_dir.glob("page-*.html"))
    assert text.index("image file is corrupt") < text.index('id="p0"')  # the failed pairs first
    assert 'src="report_files/strips/0000000.jpg"' in text  # relative to the index page
    assert "3 shown" in text


def test_exactly_one_page_of_pairs_is_still_on_the_index_page_and_one_more_pages(tmp_path):
    text, _ = _report(tmp_path / "a", PAGE_SIZE)
    assert "page-0001.html" not in text and text.count('<section class="pair"') == PAGE_SIZE
    text, report_dir = _report(tmp_path / "b", PAGE_SIZE + 1)
    assert "page-0001.html" in text and "page-0002.html" in text and 'id="p0"' not in text
    page = (report_dir / "page-0001.html").read_text()
    assert 'src="strips/0000000.jpg"' in page and page.count('<section class="pair"') == PAGE_SIZE


def test_a_report_shortened_by_its_limit_goes_on_the_index_and_drops_an_earlier_runs_pages(tmp_path):
    _report(tmp_path, PAGE_SIZE + 5)
    assert (tmp_path / "report_files" / "page-0002.html").is_file()
    text, report_dir = _report(tmp_path, PAGE_SIZE + 5, limit=10)  # the same output, rewritten with fewer shown
    assert "10 shown" in text and 'id="p9"' in text and 'id="p10"' not in text
    assert not list(report_dir.glob("page-*.html"))


def test_the_strip_columns_are_labelled_as_the_strip_holds_them(tmp_path):
    text, report_dir = _report(tmp_path, 1)
    labels = re.search(r'<figcaption class="strip-labels"[^>]*>(.*?)</figcaption>', text).group(1)
    assert re.findall(r"<span>(.*?)</span>", labels) == list(TILE_LABELS)
    assert "repeat(5,1fr)" in text
    assert strip_labels(report_dir / "strips" / "0000000.jpg") == (list(TILE_LABELS), 5 * 149 + 4 * 4)
    text, report_dir = _report(tmp_path / "plain", 1, mask=False, attention=False)  # a lightweight model's strip
    labels = re.search(r'<figcaption class="strip-labels"[^>]*>(.*?)</figcaption>', text).group(1)
    assert re.findall(r"<span>(.*?)</span>", labels) == ["before", "after"] and "repeat(2,1fr)" in text


def test_a_strip_written_before_strips_named_their_columns_has_no_label_row(tmp_path):
    text, report_dir = _report(tmp_path, 1)
    strip = report_dir / "strips" / "0000000.jpg"
    Image.fromarray(np.asarray(Image.open(strip))).save(strip, format="JPEG")  # no comment: an older run's strip
    assert strip_labels(strip) is None
    jsonl = tmp_path / "captions.jsonl"
    text = write_folder_report(tmp_path / "report.html", jsonl, report_dir, title="t", summary={}, limit=10).read_text()
    assert "strip-labels" not in text.split("</style>")[1] and 'src="report_files/strips/0000000.jpg"' in text


def test_compose_strip_is_the_written_strip(tmp_path):
    before, after = Image.new("RGB", (64, 48), (200, 0, 0)), Image.new("RGB", (64, 48), (0, 200, 0))
    strip, labels = compose_strip(before, after, mask=np.ones((48, 64), bool), height=48)
    assert labels == list(TILE_LABELS[:3]) and strip.size == (3 * 64 + 2 * 4, 48)
    assert strip.getpixel((10, 10)) == (200, 0, 0) and strip.getpixel((64 + 4 + 10, 10)) == (0, 200, 0)


def test_a_panorama_pair_gets_a_strip_a_jpeg_can_hold(tmp_path):
    # a 4000 x 2 photo's tile at the strip's height would be 224,000 px wide, past JPEG's 65,500: the tile is
    # shrunk to fit its shape instead, and the run goes on
    before, after = Image.new("RGB", (4000, 2), (200, 0, 0)), Image.new("RGB", (4000, 2), (0, 200, 0))
    path = write_strip(tmp_path, 0, before, after, mask=np.ones((2, 4000), bool), attention=(np.eye(4), np.eye(4)))
    with Image.open(path) as strip:
        assert strip.height == 112 and strip.width <= 5 * 4 * 112 + 4 * 4
        assert strip.getpixel((10, 0))[0] > 150  # the before tile, at the top of the strip
    labels, width = strip_labels(path)
    assert labels == list(TILE_LABELS) and width <= 5 * 4 * 112 + 4 * 4


def test_the_report_finds_its_strips_whatever_its_file_is_called(tmp_path):
    # the page's links are URLs: a '#' or '?' in the report's name must not cut them, a space or 'é' must not break them
    from urllib.parse import urljoin
    from urllib.request import url2pathname

    image = Image.new("RGB", (32, 24), (10, 120, 200))
    for name, pairs in (("run #2 é?.html", 3), ("100% done.html", PAGE_SIZE + 1)):
        folder = tmp_path / name.split(".")[0]
        html_path = folder / name
        report_dir = html_path.with_name(html_path.stem + "_files")
        for i in range(pairs):
            write_strip(report_dir, i, image, image)
        jsonl = folder / "captions.jsonl"
        jsonl.write_text(
            "".join(
                json.dumps({"id": f"p{i}", "index": i, "caption": "c", "entities": [], "error": None}) + "\n"
                for i in range(pairs)
            )
        )
        write_folder_report(html_path, jsonl, report_dir, title="t", summary={}, limit=1000)
        pages = [html_path, *sorted(report_dir.glob("page-*.html"))]
        for page in pages:
            links = re.findall(r'(?:src|href)="([^"]+)"', page.read_text())
            assert links
            for link in links:
                target = urljoin(page.as_uri(), link.replace("&amp;", "&")).split("#")[0]
                assert Path(url2pathname(target.removeprefix("file://"))).is_file(), (name, page.name, link)


@pytest.mark.skipif(
    chromium_path() is None,
    reason="no Chromium installed (make system-deps installs Debian's "
    "chromium); the report is tested in a real browser where it is",
)
def test_in_chromium_each_label_sits_under_its_column(tmp_path):
    _report(tmp_path, 2)
    script = """(() => {
        const img = document.querySelector('img.strip'), spans = [...document.querySelector('.strip-labels').children];
        if (!img.complete || !img.naturalWidth) return null;
        const box = img.getBoundingClientRect();
        return {left: box.left, width: box.width, natural: img.naturalWidth,
                centres: spans.map(s => { const r = s.getBoundingClientRect(); return r.left + r.width / 2; })};
    })()"""
    for width in (1280, 500):  # the strip at its own size, and shrunk to a narrow window
        with Chromium(width=width, height=800) as browser:
            browser.open((tmp_path / "report.html").as_uri())
            found = browser.wait_for(script, timeout=20)
        scale = found["width"] / found["natural"]
        tile = (found["natural"] - 4 * 4) / 5
        assert scale == pytest.approx(1.0) if width == 1280 else scale < 0.7  # the 761 px strip fits, or shrinks
        for i, centre in enumerate(found["centres"]):
            start = found["left"] + i * (tile + 4) * scale
            assert start < centre < start + tile * scale, (width, i)
