"""The report of `caption.py` at any size: one JPEG strip per pair beside paginated HTML pages.

    write_strip(report_dir, index, before, after, mask=..., attention=(a_b, a_a))   # while captioning
    write_folder_report(html_path, jsonl_path, report_dir, ...)                     # at the end, from the JSONL

The index page lists the pairs that failed first (with the reason), then the captioned pairs themselves when
there are at most `PAGE_SIZE` of them, else links to pages of `PAGE_SIZE`; each pair shows its strip (before |
after | change mask | attention before | attention after, the columns labelled under it), the caption, the
entities and the reference captions when the input has them. A strip is a ~10 KB JPEG, so the report stays
≤ 20 KB a pair however many pairs there are (`--report-limit` bounds how many). The strip's JPEG comment names
its columns (`compose_strip`), so the page labels them without decoding it; `davir-app` shows the same strips.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from urllib.parse import quote

import numpy as np
from PIL import Image

from davir.io import atomic_path, write_text_atomic
from davir.viz.report import STYLE, TILE_LABELS, overlay_heatmap, overlay_mask

STRIP_HEIGHT = 112
STRIP_GAP = 4
PAGE_SIZE = 100
FAILED_LISTED = 1000
MAX_TILE_ASPECT = 4  # a tile is at most 4 times as wide as the strip is high


def report_files(html: Path) -> Path:
    """The folder of a report's strips and pages: REPORT_files/ beside REPORT.html."""
    return html.with_name(html.stem + "_files")


def strip_name(index: int) -> str:
    return f"{index:07d}.jpg"


def _tile_size(image_size: tuple[int, int], height: int) -> tuple[int, int]:
    """A tile `height` px high with the image's shape, or, for an image over MAX_TILE_ASPECT times as wide as
    high (a panorama, a 4000 x 2 scan line), MAX_TILE_ASPECT heights wide and lower: a strip of such tiles at
    full height would pass JPEG's 65,500 px limit and stop the run."""
    width, image_height = image_size
    if width <= MAX_TILE_ASPECT * image_height:
        return max(1, round(width * height / image_height)), height
    return MAX_TILE_ASPECT * height, max(1, round(image_height * MAX_TILE_ASPECT * height / width))


def compose_strip(
    before: Image.Image,
    after: Image.Image,
    *,
    mask: np.ndarray | None = None,
    attention: tuple | None = None,
    height: int = STRIP_HEIGHT,
) -> tuple[Image.Image, list[str]]:
    """(strip, its column labels): before | after | mask on after | attention on before | attention on after,
    `height` px high, tiles of one width `STRIP_GAP` px apart; the mask and attention tiles only when given."""
    size = _tile_size(after.size, height)
    small_before, small_after = before.resize(size, Image.BILINEAR), after.resize(size, Image.BILINEAR)
    tiles, labels = [small_before, small_after], list(TILE_LABELS[:2])
    if mask is not None:
        tiles.append(overlay_mask(small_after, mask))
        labels.append(TILE_LABELS[2])
    if attention is not None and attention[0] is not None:
        tiles += [overlay_heatmap(small_before, attention[0]), overlay_heatmap(small_after, attention[1])]
        labels += TILE_LABELS[3:]
    strip = Image.new("RGB", (sum(t.width for t in tiles) + STRIP_GAP * (len(tiles) - 1), height), (255, 255, 255))
    x = 0
    for tile in tiles:
        strip.paste(tile, (x, (height - tile.height) // 2))
        x += tile.width + STRIP_GAP
    return strip, labels


def write_strip(
    report_dir: Path,
    index: int,
    before: Image.Image,
    after: Image.Image,
    *,
    mask: np.ndarray | None = None,
    attention: tuple | None = None,
) -> Path:
    """The pair's `compose_strip`, STRIP_HEIGHT px high, as report_dir/strips/NNNNNNN.jpg; its JPEG comment
    names the columns (`strip_labels`)."""
    strip, labels = compose_strip(before, after, mask=mask, attention=attention)
    path = Path(report_dir) / "strips" / strip_name(index)
    with atomic_path(path) as tmp:  # a full disk or a kill leaves the old strip or none, never half a JPEG
        strip.save(tmp, format="JPEG", quality=80, optimize=True, comment=" | ".join(labels).encode())
    return path


def strip_labels(path: Path) -> tuple[list[str], int] | None:
    """(column labels, width in px) of a strip `write_strip` wrote, from its header alone; None for a strip
    written before strips named their columns (or not readable)."""
    try:
        with Image.open(path) as image:
            comment, width = image.info.get("comment"), image.width
    except (OSError, ValueError, SyntaxError):
        return None
    if not comment:
        return None
    labels = (comment.decode("utf-8", "replace") if isinstance(comment, bytes) else str(comment)).split(" | ")
    return (labels, width) if labels and set(labels) <= set(TILE_LABELS) else None


def _rows(jsonl: Path):
    with open(jsonl, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def _strip_html(src: str, path: Path | None) -> str:
    """The strip and, under it, its columns' labels on a grid of the tiles' widths (gaps as wide as the strip's)."""
    found = strip_labels(path) if path is not None else None
    labels = found[0] if found else list(TILE_LABELS)
    parts = [
        f'<figure class="strip"><img class="strip" loading="lazy" src="{html.escape(src)}" '
        f'alt="{html.escape(", ".join(labels))}">'
    ]
    if found:
        width = found[1]
        gap = 100.0 * STRIP_GAP / width if width else 0.0
        parts.append(
            f'<figcaption class="strip-labels" style="max-width:{width}px;column-gap:{gap:.3f}%;'
            f'grid-template-columns:repeat({len(labels)},1fr)">'
            + "".join(f"<span>{html.escape(label)}</span>" for label in labels)
            + "</figcaption>"
        )
    parts.append("</figure>")
    return "".join(parts)


def _pair_html(row: dict, strip: str | None, strip_path: Path | None = None) -> str:
    parts = [
        f'<section class="pair{" failed" if row.get("error") else ""}" id="{html.escape(str(row["id"]))}">',
        f"<h2>{html.escape(str(row['id']))}</h2>",
    ]
    if row.get("caption") is not None:
        parts.append(f'<p class="caption">{html.escape(row["caption"])}</p>')
    if row.get("error"):
        parts.append(f'<p class="error">Not captioned: {html.escape(row["error"])}</p>')
    if strip:
        parts.append(_strip_html(strip, strip_path))
    if row.get("entities"):
        parts.append(
            '<p class="entities">Entities: '
            + ", ".join(f"<span>{html.escape(e)} {s:.2f}</span>" for e, s in row["entities"])
            + "</p>"
        )
    if row.get("references"):
        parts.append(
            "<details open><summary>references</summary><ul>"
            + "".join(f"<li>{html.escape(r)}</li>" for r in row["references"])
            + "</ul></details>"
        )
    parts.append("</section>")
    return "\n".join(parts)


def _page(title: str, header: str, body: str) -> str:
    style = STYLE + (
        "figure.strip{text-align:left;margin:0 0 4px}"
        "img.strip{display:block;height:auto;max-width:100%;border-radius:6px}nav a{margin-right:8px}"
    )
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body><header><h1>{html.escape(title)}</h1>{header}</header>"
        f"<main>{body}</main></body></html>"
    )


def write_folder_report(
    html_path: Path, jsonl: Path, report_dir: Path, *, title: str, summary: dict, limit: int
) -> Path:
    """Index page (+ pages of `PAGE_SIZE` pairs when more are shown), streamed from the JSONL (memory independent
    of its length). At most `PAGE_SIZE` captioned pairs are shown on the index page itself."""
    html_path, report_dir = Path(html_path), Path(report_dir)
    relative = quote(report_dir.name)  # a URL: a '#' or '?' of the report's name would cut it
    total = failed = 0
    failed_html: list[str] = []
    for row in _rows(jsonl):
        total += 1
        if row.get("error"):
            failed += 1
            if len(failed_html) < FAILED_LISTED:
                failed_html.append(f"<li><b>{html.escape(str(row['id']))}</b>: {html.escape(row['error'])}</li>")
    inline = min(total - failed, limit) <= PAGE_SIZE  # one page's worth: on the index, no click through
    pages, page_rows = [], []

    def flush() -> None:
        number = len(pages) + 1
        name = f"page-{number:04d}.html"
        nav = f'<p><a href="../{html.escape(quote(html_path.name))}">index</a> · page {number}</p>'
        write_text_atomic(report_dir / name, _page(f"{title} — page {number}", nav, "\n".join(page_rows)))
        pages.append(name)
        page_rows.clear()

    shown = 0
    for row in _rows(jsonl):
        if row.get("error") or shown >= limit:
            continue
        strip = report_dir / "strips" / strip_name(row["index"]) if row.get("index") is not None else None
        if strip is not None and strip.is_file():
            src = f"{relative}/strips/{strip.name}" if inline else f"strips/{strip.name}"
            page_rows.append(_pair_html(row, src, strip))
        else:
            page_rows.append(_pair_html(row, None))
        shown += 1
        if not inline and len(page_rows) == PAGE_SIZE:
            flush()
    if page_rows and not inline:
        flush()
    for stale in report_dir.glob("page-*.html") if report_dir.is_dir() else ():  # an earlier, longer report's
        if stale.name not in pages:
            stale.unlink(missing_ok=True)
    subtitle = f"<p>{total} pairs · {total - failed} captioned · {failed} not captioned · {shown} shown</p>"
    table = (
        '<table class="summary">'
        + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in summary.items())
        + "</table>"
    )
    body = []
    if failed:
        more = f"<p>… and {failed - len(failed_html)} more (see the JSONL)</p>" if failed > len(failed_html) else ""
        body.append(
            f'<section class="pair failed"><h2>Not captioned ({failed})</h2><ul>{"".join(failed_html)}</ul>'
            f"{more}</section>"
        )
    if pages:
        links = " ".join(
            f'<a href="{html.escape(relative)}/{p}">{i * PAGE_SIZE + 1}–{min((i + 1) * PAGE_SIZE, shown)}</a>'
            for i, p in enumerate(pages)
        )
        body.append(f'<section class="pair"><h2>Captioned pairs</h2><nav>{links}</nav></section>')
    else:
        body.extend(page_rows)
    write_text_atomic(html_path, _page(title, subtitle + table, "\n".join(body)))
    return html_path
