"""The report of `caption.py` at any size: one JPEG strip per pair beside paginated HTML pages.

    write_strip(report_dir, index, before, after, mask=..., attention=(a_b, a_a))   # while captioning
    write_folder_report(html_path, jsonl_path, report_dir, ...)                     # at the end, from the JSONL

The index page lists the pairs that failed first (with the reason), then links to pages of
`PAGE_SIZE` captioned pairs; each pair shows its strip (before | after | change mask | attention), the
caption, the entities and the reference captions when the input has them. A strip is a ~10 KB JPEG, so
the report stays ≤ 20 KB a pair however many pairs there are (`--report-limit` bounds how many).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
from PIL import Image

from davir.io import atomic_path, write_text_atomic
from davir.viz.report import STYLE, overlay_heatmap, overlay_mask

STRIP_HEIGHT = 112
PAGE_SIZE = 100
FAILED_LISTED = 1000


def strip_name(index: int) -> str:
    return f"{index:07d}.jpg"


def write_strip(report_dir: Path, index: int, before: Image.Image, after: Image.Image, *,
                mask: np.ndarray | None = None, attention: tuple | None = None) -> Path:
    """before | after | mask on after | attention on before | attention on after, STRIP_HEIGHT px high."""
    scale = STRIP_HEIGHT / after.height
    size = (max(1, round(after.width * scale)), STRIP_HEIGHT)
    small_before, small_after = before.resize(size, Image.BILINEAR), after.resize(size, Image.BILINEAR)
    tiles = [small_before, small_after]
    if mask is not None:
        tiles.append(overlay_mask(small_after, mask))
    if attention is not None and attention[0] is not None:
        tiles += [overlay_heatmap(small_before, attention[0]), overlay_heatmap(small_after, attention[1])]
    gap = 4
    strip = Image.new("RGB", (sum(t.width for t in tiles) + gap * (len(tiles) - 1), STRIP_HEIGHT), (255, 255, 255))
    x = 0
    for tile in tiles:
        strip.paste(tile, (x, 0))
        x += tile.width + gap
    path = Path(report_dir) / "strips" / strip_name(index)
    with atomic_path(path) as tmp:  # a full disk or a kill leaves the old strip or none, never half a JPEG
        strip.save(tmp, format="JPEG", quality=80, optimize=True)
    return path


def _rows(jsonl: Path):
    with open(jsonl, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def _pair_html(row: dict, strip: str | None) -> str:
    parts = [f'<section class="pair{" failed" if row.get("error") else ""}" id="{html.escape(str(row["id"]))}">',
             f"<h2>{html.escape(str(row['id']))}</h2>"]
    if row.get("caption") is not None:
        parts.append(f'<p class="caption">{html.escape(row["caption"])}</p>')
    if row.get("error"):
        parts.append(f'<p class="error">Not captioned: {html.escape(row["error"])}</p>')
    if strip:
        parts.append(f'<img class="strip" loading="lazy" src="{html.escape(strip)}" alt="before, after, change mask, '
                     f'attention">')
    if row.get("entities"):
        parts.append('<p class="entities">Entities: ' + ", ".join(
            f"<span>{html.escape(e)} {s:.2f}</span>" for e, s in row["entities"]) + "</p>")
    if row.get("references"):
        parts.append("<details open><summary>references</summary><ul>" +
                     "".join(f"<li>{html.escape(r)}</li>" for r in row["references"]) + "</ul></details>")
    parts.append("</section>")
    return "\n".join(parts)


def _page(title: str, header: str, body: str) -> str:
    style = STYLE + "img.strip{display:block;max-width:100%;border-radius:6px;margin-bottom:8px}nav a{margin-right:8px}"
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body><header><h1>{html.escape(title)}</h1>{header}</header>"
            f"<main>{body}</main></body></html>")


def write_folder_report(html_path: Path, jsonl: Path, report_dir: Path, *, title: str, summary: dict,
                        limit: int) -> Path:
    """Index page + pages of `PAGE_SIZE` pairs, streamed from the JSONL (memory independent of its length)."""
    html_path, report_dir = Path(html_path), Path(report_dir)
    relative = report_dir.name
    total = failed = 0
    failed_html: list[str] = []
    for row in _rows(jsonl):
        total += 1
        if row.get("error"):
            failed += 1
            if len(failed_html) < FAILED_LISTED:
                failed_html.append(f'<li><b>{html.escape(str(row["id"]))}</b>: {html.escape(row["error"])}</li>')
    pages, page_rows = [], []

    def flush() -> None:
        number = len(pages) + 1
        name = f"page-{number:04d}.html"
        nav = f'<p><a href="../{html.escape(html_path.name)}">index</a> · page {number}</p>'
        write_text_atomic(report_dir / name, _page(f"{title} — page {number}", nav, "\n".join(page_rows)))
        pages.append(name)
        page_rows.clear()

    shown = 0
    for row in _rows(jsonl):
        if row.get("error") or shown >= limit:
            continue
        strip = report_dir / "strips" / strip_name(row["index"]) if row.get("index") is not None else None
        page_rows.append(_pair_html(row, f"strips/{strip.name}" if strip and strip.is_file() else None))
        shown += 1
        if len(page_rows) == PAGE_SIZE:
            flush()
    if page_rows:
        flush()
    subtitle = f"<p>{total} pairs · {total - failed} captioned · {failed} not captioned · {shown} shown</p>"
    table = '<table class="summary">' + "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in summary.items()) + "</table>"
    body = []
    if failed:
        more = f"<p>… and {failed - len(failed_html)} more (see the JSONL)</p>" if failed > len(failed_html) else ""
        body.append(f'<section class="pair failed"><h2>Not captioned ({failed})</h2><ul>{"".join(failed_html)}</ul>'
                    f"{more}</section>")
    if pages:
        links = " ".join(f'<a href="{relative}/{p}">{i * PAGE_SIZE + 1}–{min((i + 1) * PAGE_SIZE, shown)}</a>'
                         for i, p in enumerate(pages))
        body.append(f'<section class="pair"><h2>Captioned pairs</h2><nav>{links}</nav></section>')
    write_text_atomic(html_path, _page(title, subtitle + table, "\n".join(body)))
    return html_path
