import numpy as np
from PIL import Image

from davir.viz.report import ReportRow, overlay_heatmap, overlay_mask, render_report, write_report


def test_overlays_touch_only_the_right_pixels():
    image = Image.new("RGB", (4, 4), (100, 100, 100))
    mask = np.zeros((4, 4), bool)
    mask[0, 0] = True
    tinted = np.asarray(overlay_mask(image, mask, color=(200, 0, 0), alpha=0.5))
    assert tuple(tinted[0, 0]) == (150, 50, 50) and tuple(tinted[3, 3]) == (100, 100, 100)
    heat = overlay_heatmap(image, np.array([[0.0, 1.0], [0.0, 0.0]]))
    assert heat.size == (4, 4)
    # the hot corner is redder than the cold one
    assert np.asarray(heat)[0, 3, 0] > np.asarray(heat)[3, 0, 0]


def test_report_lists_every_pair_and_failures(tmp_path):
    image = Image.new("RGB", (32, 24), (10, 120, 200))
    rows = [
        ReportRow(
            "p1",
            caption="the red <cube> moved",
            before=image,
            after=image,
            mask=np.ones((24, 32), bool),
            attention_before=np.eye(4),
            attention_after=np.eye(4),
            entities=["red cube"],
        ),
        ReportRow("p2", error="before image is corrupt: x.png"),
    ]
    path = write_report(tmp_path / "r.html", rows, summary={"checkpoint": "runs/demo/best"})
    text = path.read_text()
    assert 'id="p1"' in text and 'id="p2"' in text
    assert "the red &lt;cube&gt; moved" in text  # escaped, never raw HTML
    assert "Not captioned: before image is corrupt" in text
    assert text.count("data:image/png;base64,") == 5  # before, after, mask, two attention overlays
    assert "2 pairs · 1 captioned · 1 not captioned" in render_report(rows)
