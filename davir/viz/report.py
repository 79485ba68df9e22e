"""A self-contained HTML caption report: before/after thumbnails, change-mask and attention overlays.

Images are embedded as base64 PNG thumbnails so the report is one file a person can open or send.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from davir.io import write_text_atomic

THUMB = 224


@dataclass
class ReportRow:
    pair_id: str
    caption: str | None = None
    before: Image.Image | None = None
    after: Image.Image | None = None
    mask: np.ndarray | None = None  # (H, W) bool/float in the after image's frame
    attention_before: np.ndarray | None = None  # (h, w) attention map, any scale
    attention_after: np.ndarray | None = None
    entities: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # a pair that could not be captioned, and why


def _thumbnail(image: Image.Image) -> Image.Image:
    image = image.convert("RGB")
    scale = THUMB / max(image.size)
    return image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.BILINEAR)


def _png_data_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _heat_colors(values: np.ndarray) -> np.ndarray:
    """Map [0, 1] to a dark-blue → red → yellow ramp (no matplotlib import on the report path)."""
    v = np.clip(values, 0.0, 1.0)[..., None]
    low, mid, high = np.array([20, 30, 120]), np.array([220, 40, 40]), np.array([255, 235, 60])
    return np.where(v < 0.5, low + (mid - low) * (v * 2), mid + (high - mid) * (v * 2 - 1)).astype(np.uint8)


def overlay_heatmap(image: Image.Image, heat: np.ndarray, alpha: float = 0.55) -> Image.Image:
    """Blend a (h, w) map, min-max scaled and upsampled to the image, over the image."""
    heat = np.asarray(heat, dtype=np.float32)
    span = float(heat.max() - heat.min())
    heat = (heat - heat.min()) / span if span > 0 else np.zeros_like(heat)
    heat_image = Image.fromarray((heat * 255).astype(np.uint8)).resize(image.size, Image.BILINEAR)
    colors = _heat_colors(np.asarray(heat_image, dtype=np.float32) / 255.0)
    return Image.blend(image.convert("RGB"), Image.fromarray(colors), alpha)


def overlay_mask(image: Image.Image, mask: np.ndarray, color=(255, 40, 40), alpha: float = 0.5) -> Image.Image:
    """Tint the mask's pixels; the mask is resized to the image with nearest neighbour."""
    mask_image = Image.fromarray((np.asarray(mask, dtype=np.float32) > 0.5).astype(np.uint8) * 255)
    inside = np.asarray(mask_image.resize(image.size, Image.NEAREST)) > 0
    base = np.asarray(image.convert("RGB"), dtype=np.float32)
    tinted = base.copy()
    tinted[inside] = base[inside] * (1 - alpha) + np.array(color, dtype=np.float32) * alpha
    return Image.fromarray(tinted.astype(np.uint8))


def _figure(image: Image.Image | None, label: str) -> str:
    if image is None:
        return f'<figure class="empty"><div class="none">—</div><figcaption>{html.escape(label)}</figcaption></figure>'
    return (
        f'<figure><img src="{_png_data_uri(_thumbnail(image))}" alt="{html.escape(label)}">'
        f"<figcaption>{html.escape(label)}</figcaption></figure>"
    )


# The columns of a pair's picture, in order, in every report and in the app: the images, the change mask on the
# after image, the model's attention (FAC) on each image. A picture without mask or attention has the first ones.
TILE_LABELS = ("before", "after", "change mask", "attention before", "attention after")


def _row_html(row: ReportRow) -> str:
    tiles = [_figure(row.before, TILE_LABELS[0]), _figure(row.after, TILE_LABELS[1])]
    if row.after is not None and row.mask is not None:
        tiles.append(_figure(overlay_mask(row.after, row.mask), TILE_LABELS[2]))
    if row.before is not None and row.attention_before is not None:
        tiles.append(_figure(overlay_heatmap(row.before, row.attention_before), TILE_LABELS[3]))
    if row.after is not None and row.attention_after is not None:
        tiles.append(_figure(overlay_heatmap(row.after, row.attention_after), TILE_LABELS[4]))
    parts = [
        f'<section class="pair{" failed" if row.error else ""}" id="{html.escape(row.pair_id)}">',
        f"<h2>{html.escape(row.pair_id)}</h2>",
    ]
    if row.caption is not None:  # the caption first: it is what the reader came for
        parts.append(f'<p class="caption">{html.escape(row.caption)}</p>')
    if row.error:
        parts.append(f'<p class="error">Not captioned: {html.escape(row.error)}</p>')
    parts += ['<div class="tiles">', *tiles, "</div>"]
    if row.entities:
        parts.append(
            '<p class="entities">Entities: '
            + ", ".join(f"<span>{html.escape(e)}</span>" for e in row.entities)
            + "</p>"
        )
    if row.references:
        parts.append(
            "<details><summary>references</summary><ul>"
            + "".join(f"<li>{html.escape(r)}</li>" for r in row.references)
            + "</ul></details>"
        )
    if row.scores:
        parts.append(
            '<p class="scores">' + " · ".join(f"{html.escape(k)} {v:.3f}" for k, v in row.scores.items()) + "</p>"
        )
    parts.append("</section>")
    return "\n".join(parts)


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f4f5f7;color:#1d2330}
header{background:#1d2330;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px}
header p{margin:6px 0 0;color:#c9cfdb;font-size:14px}
main{padding:18px 28px;display:grid;gap:16px}
.pair{background:#fff;border-radius:10px;padding:14px 18px;box-shadow:0 1px 3px rgba(0,0,0,.08)}
.pair h2{font-size:14px;margin:0 0 10px;color:#5a6478;font-weight:600}
.tiles{display:flex;gap:10px;flex-wrap:nowrap;overflow-x:auto}
figure{margin:0;text-align:center}figure img{display:block;height:150px;border-radius:6px}
figcaption{font-size:12px;color:#5a6478;margin-top:4px}
.none{width:200px;height:150px;display:flex;align-items:center;justify-content:center;background:#eceef2;border-radius:6px;color:#99a}
.caption{font-size:19px;margin:0 0 10px;font-weight:600}
.entities span{background:#e6efff;color:#1f4fb8;border-radius:10px;padding:2px 8px;margin-right:4px;font-size:13px}
.error{color:#a4161a;font-weight:600}.failed{border-left:4px solid #a4161a}
.scores,details{font-size:13px;color:#5a6478}
table.summary{border-collapse:collapse;margin-top:8px}table.summary td,table.summary th{padding:2px 10px;text-align:left}
.strip-labels{display:grid;font-size:12px;color:#5a6478;text-align:center;margin:2px 0 8px}
"""


def render_report(
    rows: list[ReportRow], *, title: str = "Change captions", summary: dict[str, str] | None = None
) -> str:
    failed = sum(1 for row in rows if row.error)
    subtitle = f"{len(rows)} pairs · {len(rows) - failed} captioned · {failed} not captioned"
    summary_html = ""
    if summary:
        summary_html = (
            '<table class="summary">'
            + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in summary.items())
            + "</table>"
        )
    body = "\n".join(_row_html(row) for row in rows)
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><header><h1>{html.escape(title)}</h1><p>{subtitle}</p>{summary_html}"
        f"</header><main>{body}</main></body></html>"
    )


def write_report(path: str | Path, rows: list[ReportRow], **kwargs) -> Path:
    path = Path(path)
    write_text_atomic(path, render_report(rows, **kwargs))
    return path
